"""Admin-plane routes: thin handlers that authenticate, decode, call the service, encode."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import msgspec

from meshfast import errors, rules, tokens
from meshfast.admin import scope
from meshfast.admin import service as svc
from meshfast.admin.applications import ApplicationCreate, ApplicationService
from meshfast.admin.business_units import BusinessUnitBody, BusinessUnitService
from meshfast.admin.dlp import DlpService
from meshfast.admin.issuers import IssuerCreate, IssuerService
from meshfast.admin.paths import PathTable
from meshfast.admin.pilots import PilotService
from meshfast.admin.rules import RuleService, decode_body
from meshfast.admin.workflows import WorkflowCreate, WorkflowService
from meshfast.secrets import Secrets
from meshfast.store import admin as admin_sql

_json = msgspec.json.Encoder()

@dataclass(frozen=True, slots=True)
class Actor:
    """Who asks: ``name`` is what the audit log shows (``token:<name>`` or the admin's email);
    ``id`` is unique (``token:<uuid>`` or ``admin:<uuid>``; token names need not be), so what is
    kept per caller (idempotency keys) is never shared between two of them."""

    name: str
    is_super: bool
    id: str
    # The admin a credential answers to (None for the bootstrap token and tokens it made).
    owner_admin_id: str | None = None
    # A business-unit administrator's units (or a scoped token's); None: not scoped to units.
    # The one source of truth for scope (see meshfast.admin.scope).
    business_units: frozenset[str] | None = None

    @property
    def scoped(self) -> bool:
        return self.business_units is not None


@dataclass(slots=True)
class Reply:
    status: int
    body: Any
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class Stream:
    """A reply body sent in chunks as they are made (a CSV export), not encoded as JSON."""

    content_type: str
    chunks: AsyncGenerator[bytes, None]


Handler = Callable[..., Awaitable[Reply]]


async def governed(work: Awaitable[dict[str, Any]], status: int = 200, versioned: bool = False) -> Reply:
    """A control's write: 202 with ``{change_id, status: "pending"}`` when it waits for
    approval (API.md "Governed lifecycle"), else ``status`` (with the ETag of a versioned one)."""
    entity = await work
    if entity.get("status") == "pending" and "change_id" in entity:
        return Reply(202, entity)
    headers = (("etag", f'"{entity["version"]}"'),) if versioned else ()
    return Reply(status, entity, headers)


def _super(actor: Actor) -> Actor:
    """Only a platform administrator may trust an issuer (its tokens can name anyone)."""
    if not actor.is_super:
        raise errors.Forbidden("only a platform administrator may change token issuers")
    return actor


class AdminRouter:
    def __init__(self, pool: asyncpg.Pool, secrets: Secrets, service: svc.AdminService) -> None:
        self._pool = pool
        self._secrets = secrets
        self.service = service
        s = service
        # handler(actor, body, **params) (meshfast.admin.paths: the first route added wins).
        self._routes: PathTable[Handler] = PathTable()
        # Who may call which route, on which people, rules and models (meshfast.admin.scope).
        self.scope = scope.Guard(pool, service)
        add = self._add
        add("POST", r"/admin/users", lambda a, b: self._created(s.create_user(a.name, svc.decode(b, svc.UserCreate))))
        add("GET", r"/admin/users", lambda a, b: self._ok(self._users(a)))
        add("GET", r"/admin/users/(?P<id>[^/]+)", lambda a, b, id: self._versioned(self._user(a, id)))
        add("DELETE", r"/admin/users/(?P<id>[^/]+)", lambda a, b, id: self._ok(s.delete_user(a.name, id)))
        add("POST", r"/admin/users/(?P<id>[^/]+)/rotate-key", lambda a, b, id: self._ok(s.rotate_key(a.name, id)))
        add("POST", r"/admin/users/(?P<id>[^/]+)/revoke", lambda a, b, id: self._ok(s.revoke_user(a.name, id)))
        add("PUT", r"/admin/users/(?P<id>[^/]+)/expiry",
            lambda a, b, id: self._ok(s.set_user_expiry(a.name, id, svc.decode(b, svc.ExpiryBody))))
        add("PUT", r"/admin/users/(?P<id>[^/]+)/key/expiry",
            lambda a, b, id: self._ok(s.set_key_expiry(a.name, id, svc.decode(b, svc.ExpiryBody))))
        add("POST", r"/admin/users/(?P<id>[^/]+)/keys",
            lambda a, b, id: self._created(s.create_key(a.name, id, svc.decode(b, svc.KeyCreate))))
        add("GET", r"/admin/users/(?P<id>[^/]+)/keys", lambda a, b, id: self._ok(s.list_keys(id)))
        add("POST", r"/admin/keys/(?P<id>[^/]+)/rotate",
            lambda a, b, id: self._ok(s.rotate_key_by_id(a.name, id, svc.decode(b or b"{}", svc.KeyRotate))))
        add("DELETE", r"/admin/keys/(?P<id>[^/]+)", lambda a, b, id: self._ok(s.revoke_key(a.name, id)))
        add("GET", r"/admin/users/(?P<id>[^/]+)/policies", lambda a, b, id: self._ok(s.list_policies(id)))
        add("PUT", r"/admin/users/(?P<id>[^/]+)/policies/(?P<model>[^/]+)",
            lambda a, b, id, model: governed(s.put_policy(a, id, model, svc.decode(b, svc.PolicyBody))))
        add("POST", r"/admin/providers",
            lambda a, b: self._created(s.create_provider(a.name, svc.decode(b, svc.ProviderCreate))))
        add("GET", r"/admin/providers", lambda a, b: self._ok(s.list_providers()))
        add("GET", r"/admin/providers/(?P<id>[^/]+)", lambda a, b, id: self._versioned(s.get_provider(id)))
        add("DELETE", r"/admin/providers/(?P<id>[^/]+)", lambda a, b, id: self._ok(s.delete_provider(a.name, id)))
        add("POST", r"/admin/models",
            lambda a, b: self._created(s.create_model(a.name, svc.decode(b, svc.ModelCreate))))
        add("GET", r"/admin/models", lambda a, b: self._ok(s.list_models()))
        add("GET", r"/admin/models/(?P<id>[^/]+)", lambda a, b, id: self._versioned(s.get_model(id)))
        add("DELETE", r"/admin/models/(?P<id>[^/]+)", lambda a, b, id: self._ok(s.delete_model(a.name, id)))
        add("POST", r"/admin/models/(?P<id>[^/]+)/graduate",
            lambda a, b, id: self._versioned(s.graduate_model(a.name, id)))
        add("POST", r"/admin/models/(?P<id>[^/]+)/deployments",
            lambda a, b, id: self._created(s.create_deployment(a.name, id, svc.decode(b, svc.DeploymentCreate))))
        add("GET", r"/admin/models/(?P<id>[^/]+)/deployments", lambda a, b, id: self._ok(s.list_deployments(id)))
        add("DELETE", r"/admin/models/(?P<id>[^/]+)/deployments/(?P<deployment>[^/]+)",
            lambda a, b, id, deployment: self._ok(s.delete_deployment(a.name, id, deployment)))
        add("POST", r"/admin/access", lambda a, b: self._ok(s.grant(a.name, svc.decode(b, svc.AccessBody))))
        add("DELETE", r"/admin/access", lambda a, b: self._ok(s.revoke_grant(a.name, svc.decode(b, svc.AccessBody))))
        add("POST", r"/admin/kill-switch", self._kill_switch)
        self.issuers = i = IssuerService(pool, service._write)
        add("POST", r"/admin/issuers",
            lambda a, b: self._created(i.create(_super(a).name, svc.decode(b, IssuerCreate))))
        add("GET", r"/admin/issuers", lambda a, b: self._ok(i.list()))
        add("GET", r"/admin/issuers/(?P<id>[^/]+)", lambda a, b, id: self._ok(i.get(id)))
        add("DELETE", r"/admin/issuers/(?P<id>[^/]+)", lambda a, b, id: self._ok(i.delete(_super(a).name, id)))
        add("POST", r"/admin/session-token", self._session_token)
        self.applications = ap = ApplicationService(pool, secrets, service._write, svc.label)
        add("POST", r"/admin/applications",
            lambda a, b: self._created(ap.create(a.name, svc.decode(b, ApplicationCreate))))
        add("GET", r"/admin/applications", lambda a, b: self._ok(ap.list()))
        add("GET", r"/admin/applications/(?P<id>[^/]+)", lambda a, b, id: self._versioned(ap.get(id)))
        add("DELETE", r"/admin/applications/(?P<id>[^/]+)", lambda a, b, id: self._ok(ap.delete(a.name, id)))
        add("POST", r"/admin/applications/(?P<id>[^/]+)/keys",
            lambda a, b, id: self._created(s.create_key(a.name, id, svc.decode(b, svc.KeyCreate), "application")))
        add("GET", r"/admin/applications/(?P<id>[^/]+)/keys", lambda a, b, id: self._ok(s.list_keys(id, "application")))
        add("GET", r"/admin/applications/(?P<id>[^/]+)/policies",
            lambda a, b, id: self._ok(s.list_policies(id, "application")))
        add("PUT", r"/admin/applications/(?P<id>[^/]+)/policies/(?P<model>[^/]+)", lambda a, b, id, model: self._ok(
            s.put_policy(a, id, model, svc.decode(b, svc.PolicyBody), "application")))
        self.dlp = d = DlpService(pool, service._write)
        add("PUT", r"/admin/dlp/policies/(?P<name>[^/]+)",
            lambda a, b, name: self._ok(d.put(a.name, name, decode_body(b))))
        add("GET", r"/admin/dlp/policies", lambda a, b: self._ok(d.list()))
        add("DELETE", r"/admin/dlp/policies/(?P<name>[^/]+)", lambda a, b, name: self._ok(d.delete(a.name, name)))
        self.workflows = w = WorkflowService(pool, service._write)
        add("POST", r"/admin/workflows", lambda a, b: self._created(w.create(a.name, svc.decode(b, WorkflowCreate))))
        add("GET", r"/admin/workflows", lambda a, b: self._ok(w.list()))
        add("GET", r"/admin/workflows/(?P<id>[^/]+)", lambda a, b, id: self._ok(w.get(id)))
        add("DELETE", r"/admin/workflows/(?P<id>[^/]+)", lambda a, b, id: self._ok(w.delete(a.name, id)))
        # Pilots are controls (API.md "Governed lifecycle"); PUT and DELETE (?activate_at=) are
        # routed by the admin plane. A business-unit administrator lists its units' pilots only.
        self.pilots = pl = PilotService(pool, service.lifecycle)
        add("POST", r"/admin/pilots", lambda a, b: governed(pl.create(a, b), 201, versioned=True))
        add("GET", r"/admin/pilots", lambda a, b: self._ok(pl.list(a.business_units)))
        add("GET", r"/admin/pilots/(?P<id>[^/]+)", lambda a, b, id: self._versioned(pl.get(id)))
        self.rules = r = RuleService(service)
        add("POST", r"/admin/rules/dry-run", lambda a, b: self._ok(r.dry_run(b)))
        add("POST", r"/admin/rules", lambda a, b: governed(r.create(a, b), 201, versioned=True))
        add("GET", r"/admin/rules", lambda a, b: self._ok(self._rules(a)))
        add("GET", r"/admin/rules/(?P<id>[^/]+)", lambda a, b, id: self._versioned(r.get(id)))
        add("GET", r"/admin/enforcement", lambda a, b: self._ok(r.enforcement()))
        add("PUT", r"/admin/enforcement",
            lambda a, b: self._ok(r.set_enforcement(a.name, svc.decode(b, rules.EnforcementBody))))
        self.business_units = u = BusinessUnitService(pool, service)
        add("POST", r"/admin/business-units",
            lambda a, b: self._versioned(u.create(a, svc.decode(b, BusinessUnitBody)), status=201))
        add("GET", r"/admin/business-units", lambda a, b: self._ok(u.list(a)))
        add("GET", r"/admin/business-units/(?P<id>[^/]+)", lambda a, b, id: self._versioned(u.get(a, id)))

    async def _session_token(self, actor: Actor, body: bytes | None) -> Reply:
        """A short-lived data-plane token for the logged-in admin's own user (the user with the
        admin's email): developer tools call the data plane with it instead of a long-lived key."""
        if body and body.strip() not in (b"", b"{}"):
            raise errors.InvalidRequest("POST /admin/session-token takes no body")
        if not actor.id.startswith("admin:"):
            raise errors.Forbidden("a session token is for a logged-in admin (an admin token has no user)")
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(admin_sql.USER_BY_EMAIL, actor.name.lower())
        if row is None or row["status"] != "active":
            raise errors.UserNotFound("no active user has your email")
        token, expires = tokens.mint(self._secrets.master_key, str(row["id"]), row["email"])
        return Reply(201, {"token": token, "token_type": "Bearer", "expires_in": tokens.TOKEN_TTL_S,
                           "expires_at": expires, "user_id": str(row["id"]), "issuer": tokens.issuer_name()})

    async def _users(self, actor: Actor) -> list[dict[str, Any]]:
        users = await self.service.list_users()
        units = {u["id"]: u.get("business_unit") for u in users}
        return [scope.hide_manager(actor, u, units.get(u.get("manager_id")))
                for u in users if scope.in_scope(actor, u.get("business_unit"))]

    async def _user(self, actor: Actor, user_id: str) -> dict[str, Any]:
        user = await self.service.get_user(user_id)
        if actor.business_units is None or user.get("manager_id") is None:
            return user
        return scope.hide_manager(actor, user, await self.scope.unit_of(user["manager_id"]))

    async def _rules(self, actor: Actor) -> list[dict[str, Any]]:
        return [rule for rule in await self.rules.list() if scope.rule_in_scope(actor, rule)]

    def _add(self, method: str, pattern: str, handler: Handler) -> None:
        self._routes.add(method, pattern, handler)

    @staticmethod
    async def _ok(work: Awaitable[Any]) -> Reply:
        return Reply(200, await work)

    @staticmethod
    async def _created(work: Awaitable[Any]) -> Reply:
        return Reply(201, await work)

    @staticmethod
    async def _versioned(work: Awaitable[dict[str, Any]], status: int = 200) -> Reply:
        entity = await work
        return Reply(status, entity, (("etag", f'"{entity["version"]}"'),))

    async def _kill_switch(self, actor: Actor, body: bytes) -> Reply:
        if not actor.is_super:
            raise errors.Forbidden()
        return Reply(200, await self.service.set_kill_switch(actor.name, svc.decode(body, svc.KillSwitchBody)))

    async def dispatch(self, method: str, path: str, body: bytes, actor: Actor) -> Reply:
        """Routes a configuration request of ``actor``, authenticated by :mod:`meshfast.admin.plane`
        (on every request, from its headers: no cache outlives a revocation)."""
        row, params, matched_path = self._routes.lookup(method, path)
        if row is not None:
            await self.scope.check(actor, method, row.template, params, body)
            return await row.value(actor, body, **params)
        if matched_path:
            raise errors.MethodNotAllowed()
        raise errors.NotFound()

    @staticmethod
    def encode(reply: Reply) -> bytes:
        return _json.encode(reply.body)
