"""The admin plane's front door: who is asking (bearer admin token or session cookie with CSRF),
the session routes, and the routes beyond configuration: admins, admin API tokens, logs,
summaries, audit and status. Configuration routes go on to :class:`AdminRouter`.
"""

from __future__ import annotations

import hashlib
import json
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import msgspec

from meshfast import errors
from meshfast.admin import auth, logs, notifications, oidc, scope
from meshfast.admin import service as svc
from meshfast.admin.applications import ApplicationUpdate
from meshfast.admin.business_units import BusinessUnitBody
from meshfast.admin.changes import MAX_PAGE_SIZE, Lifecycle, RejectBody
from meshfast.admin.paths import PathTable
from meshfast.admin.routes import Actor, AdminRouter, Reply, Stream, governed
from meshfast.settings import OidcSettings
from meshfast.store import admin as admin_sql

Handler = Callable[..., Awaitable[Reply]]
# Shown once, never stored: a replayed create answers without them.
_SECRET_FIELDS = frozenset({"key", "token", "api_key"})
# A login body is an email and a password.
MAX_LOGIN_BODY_BYTES = 16 * 1024


def _keep_key(body: bytes) -> bytes:
    """A provider PUT without ``api_key`` keeps the sealed key (as an empty one does)."""
    try:
        fields = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return body  # the strict decode answers the 400 (a body nested too deep included)
    if isinstance(fields, dict) and "api_key" not in fields:
        fields["api_key"] = ""
        return msgspec.json.encode(fields)
    return body


def _query(query: str | None) -> dict[str, str]:
    return {k: v[-1] for k, v in urllib.parse.parse_qs(query or "", keep_blank_values=True).items()}


def _activate_at(query: str | None) -> str | None:
    """A DELETE's ``?activate_at=`` (when the removal goes live)."""
    return _query(query).get("activate_at") or None


def _page(value: str | None, field: str, high: int, default: int) -> int:
    if value is None or value == "":
        return default
    if not value.isdigit() or not 1 <= int(value) <= high:
        raise errors.InvalidRequest(f"{field} must be an integer from 1 to {high}")
    return int(value)


async def _list_changes(lifecycle: Lifecycle, actor: Actor, query: str | None) -> dict[str, Any]:
    """``GET /admin/changes?status=&page=&page_size=``: newest first; a unit's administrator
    sees its units' changes only."""
    raw = _query(query)
    unknown = set(raw) - {"status", "page", "page_size"}
    if unknown:
        raise errors.InvalidRequest(f"unknown query parameter {sorted(unknown)[0]!r}")
    return await lifecycle.list_changes(actor, raw.get("status") or None, _page(raw.get("page"), "page", 1_000_000, 1),
                                        _page(raw.get("page_size"), "page_size", MAX_PAGE_SIZE, 50))


async def _digested(work: Awaitable[dict[str, Any]]) -> Reply:
    """A change with its digest as the ETag (what an approver sends back in If-Match)."""
    change = await work
    return Reply(200, change, (("etag", f'"{change["digest"]}"'),))


class AdminPlane:
    def __init__(self, pool: asyncpg.Pool, router: AdminRouter, hash_token: Callable[[str], str],
                 status: Callable[[], Awaitable[dict[str, Any]]], cookie_secure: bool = False,
                 segment: Any = None, max_body_bytes: int = 1024 * 1024,
                 notifier: notifications.NotificationsAdmin | None = None,
                 oidc_settings: OidcSettings | None = None) -> None:
        self._pool = pool
        self._max_body_bytes = max_body_bytes
        self.router = router
        self.auth = auth.AdminAuth(pool, segment, hash_token)
        self._hash_token = hash_token
        self._status = status
        self._secure = cookie_secure
        # handler(actor, session, query, body, headers, **params), and whether only a platform
        # administrator may call it (meshfast.admin.paths: the first route added wins).
        self._routes: PathTable[tuple[Handler, bool]] = PathTable()
        # Routes without credentials (beside /admin/login): handler(ip, query, headers, scheme).
        self._public: PathTable[Handler] = PathTable()
        self._oidc = None if oidc_settings is None else \
            oidc.OidcLogin(pool, oidc_settings, hash_token, self.auth, cookie_secure)
        add = self._add
        add("GET", r"/admin/oidc/login", self._oidc_login, public=True)
        # Whether single sign-on is offered (the dashboard's login form asks): 204, or 404 when
        # no issuer is configured; no attempt is stored and no login throttle token is spent.
        add("HEAD", r"/admin/oidc/login", self._oidc_offered, public=True)
        add("GET", r"/admin/oidc/callback", self._oidc_callback, public=True)
        add("GET", r"/admin/me", self._me)
        add("POST", r"/admin/logout", self._logout)
        add("POST", r"/admin/change-password", self._change_password)
        add("GET", r"/admin/admins", lambda a, s, q, b, h: self._ok(self.auth.list_admins()))
        add("POST", r"/admin/admins", self._create_admin)
        admin_id = r"/admin/admins/(?P<id>[^/]+)"
        add("POST", admin_id + "/pause", lambda a, s, q, b, h, id: self._admin_status(a, s, id, "paused"),
            super_only=True)
        add("POST", admin_id + "/resume", lambda a, s, q, b, h, id: self._admin_status(a, s, id, "active"),
            super_only=True)
        add("DELETE", r"/admin/admins/(?P<id>[^/]+)", lambda a, s, q, b, h, id: self._admin_status(a, s, id, None),
            super_only=True)
        add("GET", r"/admin/tokens", self._list_tokens)
        add("POST", r"/admin/tokens", self._create_token)
        add("DELETE", r"/admin/tokens/(?P<id>[^/]+)", lambda a, s, q, b, h, id: self._ok(
            self.auth.revoke_token(a.name, a.is_super, id,
                                   None if not a.scoped else lambda t, o, u: _owns(a, t, o, u))))
        # A business-unit administrator reads its units' rows and records only (scope=).
        add("GET", r"/admin/logs", lambda a, s, q, b, h: self._query(
            lambda c: logs.list_logs(c, logs.Query(q, scope=a.business_units))))
        add("GET", r"/admin/logs/summary", lambda a, s, q, b, h: self._query(
            lambda c: logs.summary(c, logs.Query(q, summary=True, scope=a.business_units))))
        add("GET", r"/admin/logs/export\.csv", lambda a, s, q, b, h: self._export(q, a.business_units))
        add("GET", r"/admin/logs/unused-tools",
            lambda a, s, q, b, h: self._query(lambda c: logs.unused_tools(c, logs.Query(q))))
        add("GET", r"/admin/audit", lambda a, s, q, b, h: self._query(lambda c: logs.audit(c, q, a.business_units)))
        add("GET", r"/admin/status", lambda a, s, q, b, h: self._ok(self._status()))
        self._notifications = notifier
        add("GET", r"/admin/notifications", lambda a, s, q, b, h: self._ok(self._notify().get()))
        add("PUT", r"/admin/notifications", lambda a, s, q, b, h: self._ok(
            self._notify().put(a.name, svc.decode(b, notifications.NotificationsBody))))
        add("GET", r"/admin/notifications/deliveries",
            lambda a, s, q, b, h: self._ok(self._notify().deliveries(q)))
        service = router.service
        add("PUT", r"/admin/providers/(?P<id>[^/]+)", lambda a, s, q, b, h, id: self._versioned(
            service.update_provider(a.name, id, svc.decode(_keep_key(b), svc.ProviderCreate), h.get("if-match"))))
        add("PUT", r"/admin/models/(?P<id>[^/]+)", lambda a, s, q, b, h, id: governed(
            service.update_model(a, id, svc.decode_model_update(b), h.get("if-match")), versioned=True))
        add("PUT", r"/admin/users/(?P<id>[^/]+)", lambda a, s, q, b, h, id: self._versioned(
            service.update_user(a.name, id, svc.decode(b, svc.UserUpdate), h.get("if-match"))))
        add("PUT", r"/admin/applications/(?P<id>[^/]+)", lambda a, s, q, b, h, id: self._versioned(
            router.applications.update(a.name, id, svc.decode(b, ApplicationUpdate), h.get("if-match"))))
        add("PUT", r"/admin/rules/(?P<id>[^/]+)", lambda a, s, q, b, h, id: governed(
            router.rules.update(a, id, b, h.get("if-match")), versioned=True))
        add("DELETE", r"/admin/rules/(?P<id>[^/]+)", lambda a, s, q, b, h, id: governed(
            router.rules.delete(a, id, _activate_at(q))))
        # The approval queue (API.md "Governed lifecycle").
        lifecycle = service.lifecycle
        add("GET", r"/admin/changes", lambda a, s, q, b, h: self._ok(_list_changes(lifecycle, a, q)))
        add("GET", r"/admin/changes/(?P<id>[^/]+)", lambda a, s, q, b, h, id: _digested(lifecycle.get_change(a, id)))
        add("POST", r"/admin/changes/(?P<id>[^/]+)/approve", lambda a, s, q, b, h, id: _digested(
            lifecycle.approve(a, id, h.get("if-match"))))
        add("POST", r"/admin/changes/(?P<id>[^/]+)/reject", lambda a, s, q, b, h, id: _digested(
            lifecycle.reject(a, id, svc.decode(b or b"{}", RejectBody).comment)))
        add("PUT", r"/admin/business-units/(?P<id>[^/]+)", lambda a, s, q, b, h, id: self._versioned(
            router.business_units.update(a, id, svc.decode(b, BusinessUnitBody), h.get("if-match"))))
        add("PUT", r"/admin/pilots/(?P<id>[^/]+)", lambda a, s, q, b, h, id: governed(
            router.pilots.update(a, id, b, h.get("if-match")), versioned=True))
        add("DELETE", r"/admin/pilots/(?P<id>[^/]+)", lambda a, s, q, b, h, id: governed(
            router.pilots.delete(a, id, _activate_at(q))))

    def _add(self, method: str, pattern: str, handler: Handler, super_only: bool = False,
             public: bool = False) -> None:
        if public:
            self._public.add(method, pattern, handler)
        else:
            self._routes.add(method, pattern, (handler, super_only))

    @staticmethod
    async def _ok(work: Awaitable[Any]) -> Reply:
        return Reply(200, await work)

    @staticmethod
    async def _versioned(work: Awaitable[dict[str, Any]]) -> Reply:
        entity = await work
        return Reply(200, entity, (("etag", f'"{entity["version"]}"'),))

    def _notify(self) -> notifications.NotificationsAdmin:
        if self._notifications is None:
            raise errors.NotFound()
        return self._notifications

    async def _query(self, work: Callable[[asyncpg.Connection], Awaitable[Any]]) -> Reply:
        async with self._pool.acquire() as conn:
            return Reply(200, await work(conn))

    async def _export(self, query: str | None, units: frozenset[str] | None) -> Reply:
        chunks = await logs.export_csv(self._pool, logs.Query(query, scope=units))
        return Reply(200, Stream("text/csv; charset=utf-8", chunks),
                     (("content-disposition", 'attachment; filename="meshfast-logs.csv"'),))

    # --- who is asking ----------------------------------------------------------------------

    async def actor(self, headers: Any, method: str) -> tuple[Actor, auth.Session | None]:
        """A bearer admin token, else a session cookie (with CSRF on unsafe methods); 401 else."""
        authorization = headers.get("authorization")
        if authorization:
            token = await self.auth.bearer(authorization)
            return Actor(name=token.name, is_super=token.is_super, id=f"token:{token.token_id}",
                         owner_admin_id=token.owner_admin_id, business_units=token.business_units), None
        session = await self.auth.session(headers, method)
        if session is None:
            raise errors.Unauthorized()
        return Actor(name=session.email, is_super=session.is_super, id=f"admin:{session.admin_id}",
                     owner_admin_id=session.admin_id,
                     business_units=scope.session_units(session.is_super, list(session.units),
                                                                   session.unit_admin)), session

    async def handle(self, method: str, path: str, query: str | None, headers: Any, ip: str,
                     read_body: Callable[[int], Awaitable[bytes]], scheme: str = "http") -> Reply:
        """Answers one admin request. The caller is authenticated from its headers before
        ``read_body(limit)`` reads anything, so a request without valid credentials costs no body
        read; a login (a route without credentials) reads at most ``MAX_LOGIN_BODY_BYTES``, the
        OIDC routes no body at all. ``scheme``: the request's (http or https)."""
        public, _, known = self._public.lookup(method, path)
        if known:
            if public is None:
                raise errors.MethodNotAllowed()
            return await public.value(ip, query, headers, scheme)
        if path.rstrip("/") == "/admin/login":
            if method != "POST":
                raise errors.MethodNotAllowed()
            retry_after_s = self.auth.throttle(ip)  # before the body: a throttled login costs no read
            if retry_after_s:
                return Reply(auth.TooManyAttempts.status, {"error": auth.TooManyAttempts.code},
                             (("retry-after", str(retry_after_s)),))
            return await self._login(ip, await read_body(MAX_LOGIN_BODY_BYTES))
        actor, session = await self.actor(headers, method)
        scope.begin()
        body = await read_body(self._max_body_bytes)
        row, params, matched = self._routes.lookup(method, path)
        if row is not None:
            handler, super_only = row.value
            if super_only and not actor.is_super:
                raise errors.Forbidden()
            await self.router.scope.check(actor, method, row.template, params, body)
            return await handler(actor, session, query, body, headers, **params)
        key = headers.get("idempotency-key")
        if method == "POST" and key:
            return await self._idempotent(actor, key, path, body,
                                          lambda: self.router.dispatch(method, path, body, actor))
        try:
            return await self.router.dispatch(method, path, body, actor)
        except errors.NotFound:
            # A path only this plane routes, asked with another method.
            if matched:
                raise errors.MethodNotAllowed() from None
            raise

    async def _idempotent(self, actor: Actor, key: str, path: str, body: bytes,
                          run: Callable[[], Awaitable[Reply]]) -> Reply:
        """The first request under ``key`` runs; its answer is kept (secrets redacted) and replayed
        to a retry with the same path and body; another request under the same key is refused."""
        if len(key) > 200:
            raise errors.InvalidRequest("Idempotency-Key is at most 200 characters")
        digest = hashlib.sha256(path.encode() + b"\0" + body).hexdigest()
        async with self._pool.acquire() as conn:
            claimed = await conn.fetchval(admin_sql.CLAIM_IDEMPOTENCY_KEY, actor.id, key, digest)
            if not claimed:
                row = await conn.fetchrow(admin_sql.IDEMPOTENCY_KEY, actor.id, key)
                if row is None or row["request_hash"] != digest:
                    raise errors.IdempotencyConflict()
                if row["status"] == 0:
                    raise errors.VersionConflict("the first request with this Idempotency-Key is still running")
                stored = json.loads(row["response"]) if isinstance(row["response"], str) else row["response"]
                return Reply(row["status"], stored, (("idempotent-replayed", "true"),))
        try:
            reply = await run()
        except BaseException:
            async with self._pool.acquire() as conn:
                await conn.execute(admin_sql.RELEASE_IDEMPOTENCY_KEY, actor.id, key)
            raise
        kept = {k: v for k, v in reply.body.items() if k not in _SECRET_FIELDS} if isinstance(reply.body, dict) \
            else reply.body
        async with self._pool.acquire() as conn:
            await conn.execute(admin_sql.KEEP_IDEMPOTENT_REPLY, actor.id, key, reply.status,
                               msgspec.json.encode(kept).decode())
        return reply

    # --- session routes ---------------------------------------------------------------------

    async def _login(self, ip: str, body: bytes) -> Reply:
        token, csrf, _ = await self.auth.login(ip, svc.decode(body, auth.LoginBody))
        max_age = int(auth.SESSION_TTL.total_seconds())
        return Reply(200, {"status": "ok", "csrf_token": csrf},
                     tuple(auth.set_cookies(token, csrf, self._secure, max_age)))

    def _oidc_or_404(self) -> oidc.OidcLogin:
        if self._oidc is None:
            raise errors.NotFound()  # no issuer configured: the routes do not exist
        return self._oidc

    async def _oidc_offered(self, ip: str, query: str | None, headers: Any, scheme: str) -> Reply:
        self._oidc_or_404()
        return Reply(204, None)

    async def _oidc_login(self, ip: str, query: str | None, headers: Any, scheme: str) -> Reply:
        return await self._oidc_or_404().begin(ip, headers.get("host"), scheme)

    async def _oidc_callback(self, ip: str, query: str | None, headers: Any, scheme: str) -> Reply:
        return await self._oidc_or_404().finish(ip, query, headers)

    @staticmethod
    async def _me(actor: Actor, session: auth.Session | None, query: str | None, body: bytes, headers: Any) -> Reply:
        me: dict[str, Any] = {"email": actor.name, "is_super_admin": actor.is_super, "session": session is not None}
        role = scope.role(actor)
        # NOTE: a plain admin's answer is the one it always was (no role: ``admin``, unscoped).
        if role != scope.ADMIN:
            me["role"] = role
            me["business_units"] = None if actor.business_units is None else sorted(actor.business_units)
        return Reply(200, me)

    async def _logout(self, actor: Actor, session: auth.Session | None, query: str | None, body: bytes,
                      headers: Any) -> Reply:
        if session is not None:
            await self.auth.logout(session)
        return Reply(200, {"status": "ok"}, tuple(auth.clear_cookies(self._secure)))

    async def _change_password(self, actor: Actor, session: auth.Session | None, query: str | None,
                               body: bytes, headers: Any) -> Reply:
        if session is None:
            raise errors.InvalidRequest("change the password from a session, not with a token")
        return Reply(200, await self.auth.change_password(session, svc.decode(body, auth.PasswordChange)))

    async def _create_admin(self, actor: Actor, session: auth.Session | None, query: str | None,
                            body: bytes, headers: Any) -> Reply:
        return Reply(201, await self.auth.create_admin(actor.name, actor.is_super, svc.decode(body, auth.AdminCreate)))

    async def _admin_status(self, actor: Actor, session: auth.Session | None, admin_id: str,
                            status: str | None) -> Reply:
        own = session.admin_id if session is not None else None
        return Reply(200, await self.auth.set_admin_status(actor.name, own, admin_id, status))

    async def _create_token(self, actor: Actor, session: auth.Session | None, query: str | None,
                            body: bytes, headers: Any) -> Reply:
        # The new token answers to the same admin as the credential that made it, and a scoped
        # credential makes tokens scoped within its own units.
        created = await self.auth.create_token(actor.name, actor.is_super, actor.owner_admin_id,
                                               svc.decode(body, auth.TokenCreate),
                                               self._hash_token, actor.business_units)
        return Reply(201, created)

    async def _list_tokens(self, actor: Actor, session: auth.Session | None, query: str | None, body: bytes,
                           headers: Any) -> Reply:
        tokens = await self.auth.list_tokens()
        if actor.scoped:
            tokens = [t for t in tokens if _owns(actor, t["id"], t["owner_admin_id"], t["business_units"])]
        return Reply(200, tokens)


def _owns(actor: Actor, token_id: str, owner_admin_id: str | None, units: list[str] | None) -> bool:
    """A scoped actor's own tokens: those answering to its admin, or (a token without an admin)
    the token itself; and of those only the ones that reach no further than the actor (a scoped
    token neither sees nor revokes its admin's broader tokens). A token without units of its own
    reaches as far as its admin: within a logged-in admin's scope, not a token's."""
    if actor.id == f"token:{token_id}":
        return True
    if actor.owner_admin_id is None or owner_admin_id != actor.owner_admin_id:
        return False
    reach = actor.business_units or frozenset()
    if units is None:
        return actor.id.startswith("admin:")
    return frozenset(units) <= reach
