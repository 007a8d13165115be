"""Admins, sessions, CSRF and admin API tokens (mesh-behaviour §3.1, API.md).

Passwords are argon2id (argon2-cffi, hashed off the event loop). Login is throttled per source
IP (burst 5, then 1/s; per worker) and an account locks for 15 minutes after 5 failed attempts;
an unknown account still costs a dummy verify, so timing does not tell accounts apart. A session
is a random token stored as its SHA-256, valid 24 h, with a CSRF token checked on every unsafe
method; sessions are cached in process for at most 5 s, and pausing, deleting or changing the
password of an admin drops the cache at once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
import msgspec
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from meshfast import errors
from meshfast._core import GLOBAL_INFLIGHT, counter_key

SESSION_TTL = dt.timedelta(hours=24)
SESSION_CACHE_S = 5.0
SESSION_CACHE_MAX = 4096
LOCK_AFTER = 5
LOCK_FOR = dt.timedelta(minutes=15)
LOGIN_BURST = 5
LOGIN_PER_S = 1.0
MIN_PASSWORD = 8
SESSION_COOKIE = "mesh_session"
CSRF_COOKIE = "mesh_csrf"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

_hasher = PasswordHasher()
# A process-wide counter in the shared-memory segment: bumped to drop every worker's cache.
_GENERATION_KEY = counter_key(GLOBAL_INFLIGHT, "meshfast.auth", "session-generation", 0)
# Verified against when the account does not exist, so that answer takes as long as a real one.
_DUMMY_HASH = _hasher.hash("meshfast-dummy-password")


class LoginBody(msgspec.Struct, forbid_unknown_fields=True):
    email: str
    password: str


class AdminCreate(msgspec.Struct, forbid_unknown_fields=True):
    email: str
    password: str
    is_super: bool = False


class PasswordChange(msgspec.Struct, forbid_unknown_fields=True):
    old_password: str
    new_password: str


class TokenCreate(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    is_super: bool = False


InvalidCredentials = errors._error("InvalidCredentials", 401, "invalid_credentials")
AccountLocked = errors._error("AccountLocked", 401, "account_locked")
WeakPassword = errors._error("WeakPassword", 400, "weak_password")
TooManyAttempts = errors._error("TooManyAttempts", 429, "too_many_attempts")
CsrfFailed = errors._error("CsrfFailed", 403, "csrf_failed")
AdminNotFound = errors._error("AdminNotFound", 404, "admin_not_found")
TokenNotFound = errors._error("TokenNotFound", 404, "token_not_found")
CannotModifyOwn = errors._error("CannotModifyOwn", 400, "cannot_modify_own_account")


@dataclass(frozen=True, slots=True)
class Session:
    admin_id: str
    email: str
    is_super: bool
    csrf_hash: str
    session_hash: str


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """32 random bytes, base64url without padding (43 characters)."""
    return secrets.token_urlsafe(32)


def cookies(headers: Any) -> dict[str, str]:
    """The request's cookies by name (last one wins)."""
    out: dict[str, str] = {}
    raw = headers.get("cookie") if headers is not None else None
    for part in (raw or "").split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name:
            out[name] = value
    return out


def set_cookies(session: str, csrf: str, secure: bool, max_age_s: int) -> list[tuple[str, str]]:
    same_site = "None" if secure else "Lax"
    flags = f"Path=/; Max-Age={max_age_s}; SameSite={same_site}" + ("; Secure" if secure else "")
    return [("set-cookie", f"{SESSION_COOKIE}={session}; HttpOnly; {flags}"),
            ("set-cookie", f"{CSRF_COOKIE}={csrf}; {flags}")]


def clear_cookies(secure: bool) -> list[tuple[str, str]]:
    return set_cookies("", "", secure, 0)


class _Bucket:
    __slots__ = ("tokens", "at")

    def __init__(self) -> None:
        self.tokens = float(LOGIN_BURST)
        self.at = time.monotonic()


class AdminAuth:
    """``segment`` (the instance's shared memory) carries a generation that every worker's
    session cache checks, so an explicit invalidation reaches all workers at once."""

    def __init__(self, pool: asyncpg.Pool, segment: Any = None) -> None:
        self._pool = pool
        self._segment = segment
        self._sessions: dict[str, tuple[float, int, Session]] = {}
        self._buckets: dict[str, _Bucket] = {}

    # --- throttling and caching -------------------------------------------------------------

    def _throttle(self, ip: str) -> None:
        now = time.monotonic()
        if len(self._buckets) > 10_000:
            self._buckets = {k: b for k, b in self._buckets.items() if now - b.at < 600}
        bucket = self._buckets.setdefault(ip, _Bucket())
        bucket.tokens = min(LOGIN_BURST, bucket.tokens + (now - bucket.at) * LOGIN_PER_S)
        bucket.at = now
        if bucket.tokens < 1:
            raise TooManyAttempts(retry_after_s=1)
        bucket.tokens -= 1

    def _generation(self) -> int:
        return self._segment.get(_GENERATION_KEY) if self._segment is not None else 0

    def invalidate_all(self) -> None:
        """Forget every cached session, in every worker (an admin was paused, deleted or changed
        password)."""
        self._sessions.clear()
        if self._segment is not None:
            self._segment.add(_GENERATION_KEY, 1)

    # --- login ------------------------------------------------------------------------------

    async def login(self, ip: str, body: LoginBody) -> tuple[str, str, Session]:
        """Returns (session token, CSRF token, session)."""
        self._throttle(ip)
        email = body.email.strip().lower()
        async with self._pool.acquire() as conn:
            admin = await conn.fetchrow(
                "SELECT id, email, password_hash, status, is_super, failed_login_attempts, locked_until "
                "FROM admins WHERE email = $1", email)
            if admin is None or admin["status"] != "active":
                await _verify(_DUMMY_HASH, body.password)
                await _audit(conn, email, "login_failed", email, {"reason": "unknown_account", "ip": ip})
                raise InvalidCredentials()
            now = dt.datetime.now(dt.UTC)
            if admin["locked_until"] is not None and admin["locked_until"] > now:
                await _audit(conn, email, "login_failed", email, {"reason": "account_locked", "ip": ip})
                raise AccountLocked()
            if not await _verify(admin["password_hash"], body.password):
                attempts = admin["failed_login_attempts"] + 1
                locked = now + LOCK_FOR if attempts >= LOCK_AFTER else None
                await conn.execute("UPDATE admins SET failed_login_attempts = $2, locked_until = $3 WHERE id = $1",
                                   admin["id"], attempts, locked)
                reason = "bad_password_now_locked" if locked else "bad_password"
                await _audit(conn, email, "login_failed", email, {"reason": reason, "ip": ip})
                raise InvalidCredentials()
            token, csrf = new_token(), new_token()
            async with conn.transaction():
                await conn.execute("UPDATE admins SET failed_login_attempts = 0, locked_until = NULL WHERE id = $1",
                                   admin["id"])
                await conn.execute(
                    "INSERT INTO admin_sessions (admin_id, token_hash, csrf_hash, expires_at) VALUES ($1, $2, $3, $4)",
                    admin["id"], _sha256(token), _sha256(csrf), now + SESSION_TTL)
                await _audit(conn, email, "login", email, {"ip": ip})
        session = Session(str(admin["id"]), email, admin["is_super"], _sha256(csrf), _sha256(token))
        return token, csrf, session

    async def session(self, headers: Any, method: str) -> Session | None:
        """The session a request carries (None without a session cookie); raises 401 for an
        unknown or expired session and 403 when an unsafe method lacks the matching CSRF token."""
        jar = cookies(headers)
        token = jar.get(SESSION_COOKIE)
        if not token:
            return None
        digest = _sha256(token)
        now = time.monotonic()
        generation = self._generation()
        cached = self._sessions.get(digest)
        if cached is not None and now - cached[0] < SESSION_CACHE_S and cached[1] == generation:
            found = cached[2]
        else:
            async with self._pool.acquire() as conn:
                row = await conn.fetchrow(
                    "SELECT a.id, a.email, a.is_super, s.csrf_hash FROM admin_sessions s JOIN admins a "
                    "ON a.id = s.admin_id WHERE s.token_hash = $1 AND s.expires_at > now() AND a.status = 'active'",
                    digest)
            if row is None:
                self._sessions.pop(digest, None)
                raise errors.Unauthorized()
            found = Session(str(row["id"]), row["email"], row["is_super"], row["csrf_hash"], digest)
            if len(self._sessions) >= SESSION_CACHE_MAX:
                self._sessions.clear()
            self._sessions[digest] = (now, generation, found)
        if method not in SAFE_METHODS:
            header = headers.get("x-csrf-token") or ""
            cookie = jar.get(CSRF_COOKIE) or ""
            if not header or not hmac.compare_digest(header, cookie) or \
                    not hmac.compare_digest(_sha256(header), found.csrf_hash):
                raise CsrfFailed()
        return found

    async def logout(self, session: Session) -> None:
        async with self._pool.acquire() as conn:
            await conn.execute("DELETE FROM admin_sessions WHERE token_hash = $1", session.session_hash)
            await _audit(conn, session.email, "logout", session.email, {})
        self._sessions.pop(session.session_hash, None)

    async def change_password(self, session: Session, body: PasswordChange) -> dict[str, Any]:
        if len(body.new_password) < MIN_PASSWORD:
            raise WeakPassword()
        async with self._pool.acquire() as conn:
            current = await conn.fetchval("SELECT password_hash FROM admins WHERE id = $1", session.admin_id)
            if current is None:
                raise errors.Unauthorized("invalid_session")
            if not await _verify(current, body.old_password):
                await _audit(conn, session.email, "change_password_failed", session.email, {})
                raise InvalidCredentials()
            new_hash = await asyncio.to_thread(_hasher.hash, body.new_password)
            async with conn.transaction():
                await conn.execute("UPDATE admins SET password_hash = $2 WHERE id = $1", session.admin_id, new_hash)
                await conn.execute("DELETE FROM admin_sessions WHERE admin_id = $1 AND token_hash <> $2",
                                   session.admin_id, session.session_hash)
                await _audit(conn, session.email, "change_password", session.email, {})
        self.invalidate_all()
        return {"status": "ok"}

    # --- admins -----------------------------------------------------------------------------

    async def create_admin(self, actor: str, actor_is_super: bool, body: AdminCreate) -> dict[str, Any]:
        email = body.email.strip().lower()
        if "@" not in email or len(email) > 320:
            raise errors.InvalidRequest("email must be an email address")
        if len(body.password) < MIN_PASSWORD:
            raise WeakPassword()
        if body.is_super and not actor_is_super:
            raise errors.Forbidden()
        password_hash = await asyncio.to_thread(_hasher.hash, body.password)
        async with self._pool.acquire() as conn:
            try:
                row = await conn.fetchrow(
                    "INSERT INTO admins (email, password_hash, is_super, created_by) VALUES ($1, $2, $3, $4) "
                    "RETURNING id, email, status, is_super, created_by, created_at",
                    email, password_hash, body.is_super, actor)
            except asyncpg.UniqueViolationError:
                raise errors.EmailExists() from None
            await _audit(conn, actor, "create_admin", email, {"is_super": body.is_super})
        return _admin(row)

    async def list_admins(self) -> list[dict[str, Any]]:
        async with self._pool.acquire() as conn:
            rows = await conn.fetch("SELECT id, email, status, is_super, created_by, created_at FROM admins "
                                    "ORDER BY created_at DESC")
        return [_admin(r) for r in rows]

    async def set_admin_status(self, actor: str, actor_admin_id: str | None, admin_id: str,
                               status: str | None) -> dict[str, Any]:
        """Pause (``paused``), resume (``active``) or delete (None) an admin; super admins only."""
        if actor_admin_id is not None and actor_admin_id == admin_id:
            raise CannotModifyOwn()
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                try:
                    if status is None:
                        row = await conn.fetchrow("DELETE FROM admins WHERE id = $1::uuid RETURNING email", admin_id)
                    else:
                        row = await conn.fetchrow("UPDATE admins SET status = $2 WHERE id = $1::uuid RETURNING email",
                                                  admin_id, status)
                except asyncpg.DataError:
                    raise AdminNotFound() from None
                if row is None:
                    raise AdminNotFound()
                if status != "active":
                    await conn.execute("DELETE FROM admin_sessions WHERE admin_id = $1::uuid", admin_id)
                action = {"paused": "pause_admin", "active": "resume_admin", None: "delete_admin"}[status]
                await _audit(conn, actor, action, row["email"], {})
        self.invalidate_all()
        return {"status": "ok"}

    # --- admin API tokens -------------------------------------------------------------------

    async def create_token(self, actor: str, actor_is_super: bool, body: TokenCreate,
                           hash_token: Any) -> dict[str, Any]:
        name = body.name.strip()
        if not name or len(name) > 100 or name == "bootstrap":
            raise errors.InvalidRequest("name must be 1-100 characters and not 'bootstrap'")
        if body.is_super and not actor_is_super:
            raise errors.Forbidden()
        token = "mesh_admin_" + new_token()
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(
                "INSERT INTO admin_tokens (name, token_hash, is_super, created_by) VALUES ($1, $2, $3, $4) "
                "RETURNING id, name, is_super, created_by, created_at", name, hash_token(token), body.is_super, actor)
            await _audit(conn, actor, "create_admin_token", name, {"is_super": body.is_super})
        return {**_token(row), "token": token}

    async def list_tokens(self) -> list[dict[str, Any]]:
        async with self._pool.acquire() as conn:
            rows = await conn.fetch("SELECT id, name, is_super, created_by, created_at, revoked_at FROM admin_tokens "
                                    "ORDER BY created_at DESC")
        return [_token(r) for r in rows]

    async def revoke_token(self, actor: str, token_id: str) -> dict[str, Any]:
        async with self._pool.acquire() as conn:
            try:
                row = await conn.fetchrow("UPDATE admin_tokens SET revoked_at = now() WHERE id = $1::uuid "
                                          "AND revoked_at IS NULL RETURNING name", token_id)
            except asyncpg.DataError:
                raise TokenNotFound() from None
            if row is None:
                raise TokenNotFound()
            await _audit(conn, actor, "revoke_admin_token", row["name"], {})
        return {"status": "revoked"}

    async def sweep(self) -> int:
        """Deletes expired sessions (the leader's retention job)."""
        async with self._pool.acquire() as conn:
            result = await conn.execute("DELETE FROM admin_sessions WHERE expires_at <= now()")
        return int(result.split()[-1])


async def _verify(password_hash: str, password: str) -> bool:
    def check() -> bool:
        try:
            return _hasher.verify(password_hash, password)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return False
    return await asyncio.to_thread(check)


async def _audit(conn: asyncpg.Connection, actor: str, action: str, target: str | None, detail: dict[str, Any]) -> None:
    await conn.execute("INSERT INTO admin_audit_log (actor, action, target, detail) VALUES ($1, $2, $3, $4::jsonb)",
                       actor, action, target, json.dumps(detail))


def _admin(row: asyncpg.Record) -> dict[str, Any]:
    return {"id": str(row["id"]), "email": row["email"], "status": row["status"], "is_super": row["is_super"],
            "created_by": row["created_by"], "created_at": row["created_at"].isoformat()}


def _token(row: asyncpg.Record) -> dict[str, Any]:
    out = {"id": str(row["id"]), "name": row["name"], "is_super": row["is_super"], "created_by": row["created_by"],
           "created_at": row["created_at"].isoformat()}
    if "revoked_at" in row.keys():
        out["revoked_at"] = row["revoked_at"].isoformat() if row["revoked_at"] else None
    return out
