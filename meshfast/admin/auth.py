"""Admins, sessions, CSRF and admin API tokens (mesh-behaviour §3.1, API.md).

Passwords are argon2id (argon2-cffi, hashed off the event loop). Login is throttled per source
IP across the instance (burst 5, then 1/s: a GCRA bucket in the shared-memory segment, so every
worker draws on the same one) and answers 429 with ``Retry-After``. An account locks for 15 minutes
at its 5th failed attempt: each attempt is counted by one atomic UPDATE *before* its password is
checked, so concurrent guesses cannot all read a counter none of them has raised yet; at most 5
guesses are ever checked per lock. An unknown account still costs a dummy verify, so timing does
not tell accounts apart. A session is a random token stored as its SHA-256, valid 24 h, with a
CSRF token checked on every unsafe method. Sessions and admin tokens are looked up in PostgreSQL on
every request (no cache): logout, revocation, pause, delete and a password change take effect
from the next request on, on every worker and every instance sharing the database.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import asyncpg
import msgspec
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from msgspec import Meta

from meshfast import errors
from meshfast._core import ShmError
from meshfast.admin import scope
from meshfast.store import admin as admin_sql
from meshfast.store import business_units as units_sql
from meshfast.store import sql
from meshfast.validate import Email, Label, Name

log = logging.getLogger("meshfast.admin")

SESSION_TTL = dt.timedelta(hours=24)
LOCK_AFTER = 5
LOCK_FOR = dt.timedelta(minutes=15)
LOGIN_BURST = 5
LOGIN_PER_S = 1.0
MIN_PASSWORD = 8
SESSION_COOKIE = "mesh_session"
CSRF_COOKIE = "mesh_csrf"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# NOTE: source addresses map to this many throttle buckets (a keyed hash), so a flood from many
# addresses (an IPv6 range) holds at most this many of the segment's slots, which the data plane's
# counters share; two addresses meet in one bucket with odds 1/4096, and an outsider cannot choose to.
LOGIN_BUCKETS = 4096
# An IPv6 client usually holds a whole /64: it counts as one address.
IPV6_CLIENT_PREFIX = 64

_hasher = PasswordHasher()
# The password hash of an admin an OIDC issuer created (meshfast.admin.oidc): not an argon2 hash, so
# no password verifies against it; login checks the dummy hash instead, so the answer (and its
# time) is an unknown password's.
NO_PASSWORD = "!oidc-only"


@functools.cache
def dummy_hash() -> str:
    """Verified against when the account does not exist, so that answer takes as long as a real
    one. Made off the start's path (a worker warms it once ready): an Argon2 hash at import
    added ~150 ms to every start."""
    return _hasher.hash("meshfast-dummy-password")


# A passphrase: long enough for any password manager, short enough to hash in bounded time.
Password = Annotated[str, Meta(max_length=1024)]


class LoginBody(msgspec.Struct, forbid_unknown_fields=True):
    email: Email
    password: Password


class AdminCreate(msgspec.Struct, forbid_unknown_fields=True):
    email: Email
    password: Password
    is_super: bool = False


class PasswordChange(msgspec.Struct, forbid_unknown_fields=True):
    old_password: Password
    new_password: Password


class TokenCreate(msgspec.Struct, forbid_unknown_fields=True):
    name: Name
    is_super: bool = False
    # The business units the token is scoped to (None: the minting admin's scope, if any).
    business_units: Annotated[list[Label], Meta(max_length=256)] | None = None


# The sign-in errors live in the one table (meshfast.errors); named here as the admin plane uses them.
AccountLocked = errors.AccountLocked
AdminNotFound = errors.AdminNotFound
CannotModifyOwn = errors.CannotModifyOwn
CsrfFailed = errors.CsrfFailed
InvalidCredentials = errors.InvalidCredentials
TokenNotFound = errors.TokenNotFound
TooManyAttempts = errors.TooManyAttempts
WeakPassword = errors.WeakPassword


@dataclass(frozen=True, slots=True)
class Session:
    admin_id: str
    email: str
    is_super: bool
    csrf_hash: str
    session_hash: str
    # The business units the admin administers (empty: none), read with the session.
    units: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Bearer:
    """An admin token as a request presents it: who it is and the scope it carries."""

    name: str
    is_super: bool
    owner_admin_id: str | None
    token_id: str
    business_units: frozenset[str] | None


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


class AdminAuth:
    """``segment`` (the instance's shared memory) holds the login throttle's buckets;
    ``hash_token`` (keyed with the instance's pepper) hashes bearer tokens and picks an address's
    bucket. Without them (the CLI) there is no throttle and no bearer check."""

    def __init__(self, pool: asyncpg.Pool, segment: Any = None,
                 hash_token: Callable[[str], str] | None = None) -> None:
        self._pool = pool
        self._segment = segment
        self._hash_token = hash_token
        self._shm_full_logged_at = -math.inf

    # --- throttling -------------------------------------------------------------------------

    def throttle(self, ip: str) -> int:
        """Takes one login attempt from ``ip``'s bucket: 0 when admitted, else the whole seconds
        to wait (the 429's ``Retry-After``)."""
        if self._segment is None or self._hash_token is None:
            return 0
        try:
            wait_ns = self._segment.rate_acquire(self._throttle_key(ip), LOGIN_PER_S, LOGIN_BURST,
                                                 time.monotonic_ns())
        except ShmError:
            # NOTE: a full slot table is the data plane's outage already; admins must still be able
            # to log in to act on it, and the account lockout still bounds the guesses.
            now = time.monotonic()
            if now - self._shm_full_logged_at > 60:
                self._shm_full_logged_at = now
                log.warning("login throttle skipped: the shared-memory slot table is full")
            return 0
        return max(1, math.ceil(wait_ns / 1e9)) if wait_ns else 0

    def _throttle_key(self, ip: str) -> bytes:
        try:
            address = ipaddress.ip_address(ip)
            if address.version == 6 and address.ipv4_mapped is None:
                ip = str(ipaddress.ip_network(f"{address}/{IPV6_CLIENT_PREFIX}", strict=False))
            elif address.version == 6:
                ip = str(address.ipv4_mapped)
        except ValueError:
            pass  # not an address (e.g. "unknown"): its own bucket
        assert self._hash_token is not None
        bucket = int(self._hash_token("login-throttle\0" + ip)[:8], 16) % LOGIN_BUCKETS
        return hashlib.blake2b(b"meshfast.login-throttle\0" + bucket.to_bytes(4, "little"), digest_size=16).digest()

    # --- login ------------------------------------------------------------------------------

    async def login(self, ip: str, body: LoginBody) -> tuple[str, str, Session]:
        """Returns (session token, CSRF token, session). The caller has taken the attempt from the
        throttle (:meth:`throttle`) before reading the body."""
        email = body.email.strip().lower()
        async with self._pool.acquire() as conn:
            claimed = await conn.fetchrow(admin_sql.CLAIM_ATTEMPT, email, LOCK_AFTER, LOCK_FOR)
            if claimed is None:
                if await conn.fetchval(admin_sql.IS_LOCKED, email):
                    await _audit(conn, email, "login_failed", email, {"reason": "account_locked", "ip": ip})
                    raise AccountLocked()
                await _verify(await asyncio.to_thread(dummy_hash), body.password)
                await _audit(conn, email, "login_failed", email, {"reason": "unknown_account", "ip": ip})
                raise InvalidCredentials()
            stored = claimed["password_hash"]
            has_password = stored != NO_PASSWORD
            checked = stored if has_password else await asyncio.to_thread(dummy_hash)
            if not await _verify(checked, body.password) or not has_password:
                if not has_password:
                    reason = "no_password"
                elif claimed["failed_login_attempts"] >= LOCK_AFTER:
                    reason = "bad_password_now_locked"
                else:
                    reason = "bad_password"
                await _audit(conn, email, "login_failed", email, {"reason": reason, "ip": ip})
                raise InvalidCredentials()
            async with conn.transaction():
                is_super = await conn.fetchval(admin_sql.LOGIN_SUCCEEDED, claimed["id"])
                if is_super is None:  # paused or deleted while the password was checked
                    raise InvalidCredentials()
                token, csrf = await open_session(conn, claimed["id"])
                await _audit(conn, email, "login", email, {"ip": ip})
        session = Session(str(claimed["id"]), email, is_super, _sha256(csrf), _sha256(token))
        return token, csrf, session

    async def session(self, headers: Any, method: str) -> Session | None:
        """The session a request carries (None without a session cookie); raises 401 for an
        unknown, expired or logged-out session (looked up on every request: no cache may outlive a
        logout or a pause) and 403 when an unsafe method lacks the matching CSRF token."""
        jar = cookies(headers)
        token = jar.get(SESSION_COOKIE)
        if not token:
            return None
        digest = _sha256(token)
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(admin_sql.SESSION_BY_HASH, digest)
        if row is None:
            raise errors.Unauthorized()
        found = Session(str(row["id"]), row["email"], row["is_super"], row["csrf_hash"], digest,
                        tuple(row["units"] or ()))
        if method not in SAFE_METHODS:
            header = headers.get("x-csrf-token") or ""
            cookie = jar.get(CSRF_COOKIE) or ""
            if not header or not hmac.compare_digest(header, cookie) or \
                    not hmac.compare_digest(_sha256(header), found.csrf_hash):
                raise CsrfFailed()
        return found

    async def bearer(self, authorization: str) -> Bearer:
        """The bearer admin token (name, owner, scope), looked up on every request (no cache may
        outlive a revocation, a pause or a change of scope); 401 for anything else."""
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or self._hash_token is None:
            raise errors.Unauthorized()
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(admin_sql.TOKEN_BY_HASH, self._hash_token(token))
        if row is None:
            raise errors.Unauthorized()
        owner = row["owner_admin_id"]
        units = scope.token_units(row["is_super"], row["business_units"], row["owner_is_super"], row["owner_units"])
        return Bearer(f"token:{row['name']}", row["is_super"], None if owner is None else str(owner), str(row["id"]),
                      units)

    async def logout(self, session: Session) -> None:
        async with self._pool.acquire() as conn:
            await conn.execute(admin_sql.DELETE_SESSION, session.session_hash)
            await _audit(conn, session.email, "logout", session.email, {})

    async def change_password(self, session: Session, body: PasswordChange) -> dict[str, Any]:
        if len(body.new_password) < MIN_PASSWORD:
            raise WeakPassword()
        async with self._pool.acquire() as conn:
            current = await conn.fetchval(admin_sql.PASSWORD_HASH, session.admin_id)
            if current is None:
                raise errors.Unauthorized("invalid_session")
            if not await _verify(current, body.old_password):
                await _audit(conn, session.email, "change_password_failed", session.email, {})
                raise InvalidCredentials()
            new_hash = await asyncio.to_thread(_hasher.hash, body.new_password)
            async with conn.transaction():
                await conn.execute(admin_sql.SET_PASSWORD_HASH, session.admin_id, new_hash)
                await conn.execute(admin_sql.DELETE_OTHER_SESSIONS, session.admin_id, session.session_hash)
                await _audit(conn, session.email, "change_password", session.email, {})
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
                row = await conn.fetchrow(admin_sql.INSERT_ADMIN, email, password_hash, body.is_super, actor)
            except asyncpg.UniqueViolationError:
                raise errors.EmailExists() from None
            await _audit(conn, actor, "create_admin", email, {"is_super": body.is_super})
        return _admin(row)

    async def list_admins(self) -> list[dict[str, Any]]:
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(admin_sql.LIST_ADMINS)
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
                        row = await conn.fetchrow(admin_sql.DELETE_ADMIN, admin_id)
                    else:
                        row = await conn.fetchrow(admin_sql.SET_ADMIN_STATUS, admin_id, status)
                except asyncpg.DataError:
                    raise AdminNotFound() from None
                if row is None:
                    raise AdminNotFound()
                if status != "active":
                    await conn.execute(admin_sql.DELETE_ADMIN_SESSIONS, admin_id)
                action = {"paused": "pause_admin", "active": "resume_admin", None: "delete_admin"}[status]
                await _audit(conn, actor, action, row["email"], {})
        return {"status": "ok"}

    # --- admin API tokens -------------------------------------------------------------------

    async def create_token(self, actor: str, actor_is_super: bool, owner_admin_id: str | None, body: TokenCreate,
                           hash_token: Any, actor_units: frozenset[str] | None = None) -> dict[str, Any]:
        """``owner_admin_id``: the admin the new token answers to (the session's admin, or the
        minting token's owner; None under the bootstrap token's authority). ``business_units``
        scopes the token (400 for an unknown unit, or beside ``is_super``); a scoped minter
        (``actor_units``) makes tokens scoped to its units or some of them (all by default)."""
        name = body.name.strip()
        if not name or len(name) > 100 or name == "bootstrap":
            raise errors.InvalidRequest("name must be 1-100 characters and not 'bootstrap'")
        if body.is_super and not actor_is_super:
            raise errors.Forbidden()
        units = None if body.business_units is None else sorted({u.strip() for u in body.business_units})
        if units is not None and body.is_super:
            raise errors.InvalidRequest("a platform administrator's token is not scoped to business units")
        if units is not None and (not units or "" in units):
            raise errors.InvalidRequest("business_units names at least one business unit (leave it out for none)")
        if actor_units is not None:
            if units is None:
                units = sorted(actor_units)
            elif not set(units) <= actor_units:
                raise errors.Forbidden("business_units is outside your business units")
        token = "mesh_admin_" + new_token()
        async with self._pool.acquire() as conn:
            if units is not None:
                known = {r["name"] for r in await conn.fetch(units_sql.UNITS_BY_NAMES, units)}
                unknown = [u for u in units if u not in known]
                if unknown:
                    problems = [f"business_units: {u[:64]!r} names no business unit" for u in unknown]
                    raise errors.InvalidRequest("; ".join(problems), errors=problems)
            async with conn.transaction():
                row = await conn.fetchrow(
                    admin_sql.INSERT_TOKEN, name, hash_token(token), body.is_super, actor, owner_admin_id, units)
                await _audit(conn, actor, "create_admin_token", name,
                             {"is_super": body.is_super, "business_units": units},
                             units[0] if units is not None and len(units) == 1 else None)
        return {**_token(row), "token": token}

    async def list_tokens(self) -> list[dict[str, Any]]:
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(admin_sql.LIST_TOKENS)
        return [_token(r) for r in rows]

    async def revoke_token(self, actor: str, actor_is_super: bool, token_id: str,
                           may_revoke: Callable[[str, str | None], bool] | None = None) -> dict[str, Any]:
        """Revokes a token; a super admin's token only by a super admin, and only one that
        ``may_revoke(token id, owner admin id)`` allows when given (403 else)."""
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                try:
                    row = await conn.fetchrow(admin_sql.TOKEN_FOR_REVOKE, token_id)
                except asyncpg.DataError:
                    raise TokenNotFound() from None
                if row is None:
                    raise TokenNotFound()
                if row["is_super"] and not actor_is_super:
                    raise errors.Forbidden()
                owner = None if row["owner_admin_id"] is None else str(row["owner_admin_id"])
                if may_revoke is not None and not may_revoke(str(row["id"]), owner):
                    raise errors.Forbidden("not one of your tokens")
                await conn.execute(admin_sql.REVOKE_TOKEN, token_id)
                await _audit(conn, actor, "revoke_admin_token", row["name"], {})
        return {"status": "revoked"}

    async def sweep(self) -> int:
        """Deletes expired sessions (the leader's retention job)."""
        async with self._pool.acquire() as conn:
            result = await conn.execute(admin_sql.DELETE_EXPIRED_SESSIONS)
        return int(result.split()[-1])


async def open_session(conn: asyncpg.Connection, admin_id: Any) -> tuple[str, str]:
    """A new session of ``admin_id`` (password or OIDC login): its (session token, CSRF token),
    stored as their SHA-256, valid SESSION_TTL."""
    token, csrf = new_token(), new_token()
    await conn.execute(admin_sql.INSERT_SESSION, admin_id, _sha256(token), _sha256(csrf), SESSION_TTL)
    return token, csrf


async def _verify(password_hash: str, password: str) -> bool:
    def check() -> bool:
        try:
            return _hasher.verify(password_hash, password)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return False
    return await asyncio.to_thread(check)


async def _audit(conn: asyncpg.Connection, actor: str, action: str, target: str | None, detail: dict[str, Any],
                 business_unit: str | None = None) -> None:
    await conn.execute(sql.INSERT_UNIT_AUDIT, actor, action, target, json.dumps(detail), business_unit)


def _admin(row: asyncpg.Record) -> dict[str, Any]:
    return {"id": str(row["id"]), "email": row["email"], "status": row["status"], "is_super": row["is_super"],
            "created_by": row["created_by"], "created_at": row["created_at"].isoformat()}


def _token(row: asyncpg.Record) -> dict[str, Any]:
    out = {"id": str(row["id"]), "name": row["name"], "is_super": row["is_super"], "created_by": row["created_by"],
           "created_at": row["created_at"].isoformat(),
           "owner_admin_id": None if row["owner_admin_id"] is None else str(row["owner_admin_id"]),
           "business_units": None if row["business_units"] is None else list(row["business_units"])}
    if "revoked_at" in row.keys():
        out["revoked_at"] = row["revoked_at"].isoformat() if row["revoked_at"] else None
    return out
