"""Roles and business-unit scope on the admin plane: who may call which route, and on which
people, rules and models.

Three roles (``GET /admin/me`` answers which):

- ``platform``: an ``is_super`` admin or token. Never scoped; sees and changes everything.
- ``business_unit``: an admin listed in ``business_unit_admins`` for one or more units, or ever
  listed (``admins.unit_admin``; with no unit left it is scoped to none), and not ``is_super``; or
  an admin token whose ``business_units`` is set. :attr:`Actor.business_units`
  holds the units; it is the one source of truth for scope (the approval queue reads it too).
- ``admin``: anyone else, with the rights admins always had.

A scoped actor may call only the routes :data:`ROUTES` lists (403 ``forbidden`` elsewhere), and
on those only what concerns its units: people whose ``business_unit`` is one of them, rules whose
every entry names business units all in scope, logs and audit records kept with one of its units.
An entity outside the scope answers as an unknown one on a read (404, its route's own code: the
scope does not tell what exists elsewhere) and 403 ``forbidden`` on a write (the caller named it:
the refusal says why). A policy cap above the unit's lock (``daily_cap_lock_usd``; without one:
above the cap in force now, a policy's or the $20 default) is 403 ``above_platform_lock``.

Every audited write records the business unit it concerns (:func:`concerns`, read by the write
transaction), so a unit's administrators read their own units' records.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import uuid
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import asyncpg
import msgspec

from meshfast import errors, onboarding, rules
from meshfast.admin import rules as rule_admin
from meshfast.store import business_units as units_sql
from meshfast.store import onboarding as onboarding_sql
from meshfast.store import rules as rules_sql

if TYPE_CHECKING:  # the routes import this module
    from meshfast.admin.routes import Actor
    from meshfast.admin.service import AdminService

PLATFORM = "platform"
BUSINESS_UNIT = "business_unit"
ADMIN = "admin"
# A grant without a policy row has this daily cap (API.md).
DEFAULT_DAILY_CAP_USD = Decimal(20)



def _pilots() -> Any:
    """meshfast.admin.pilots, imported when first used (it imports the rules, which import this)."""
    from meshfast.admin import pilots

    return pilots

def role(actor: Actor) -> str:
    if actor.is_super:
        return PLATFORM
    return BUSINESS_UNIT if actor.business_units is not None else ADMIN


def session_units(is_super: bool, units: list[str] | None, unit_admin: bool = False) -> frozenset[str] | None:
    """A logged-in admin's scope: the units it administers, unless it is a platform admin. A
    business-unit administrator (``admins.unit_admin``, set when first listed for a unit) that
    administers no unit now is scoped to none (refused everywhere but its own session's routes),
    never unscoped."""
    if is_super:
        return None
    if not units and not unit_admin:
        return None
    return frozenset(units or ())


def token_units(is_super: bool, own: list[str] | None, owner_is_super: bool,
                owner_units: list[str] | None, owner_unit_admin: bool = False) -> frozenset[str] | None:
    """An admin token's scope: its own ``business_units`` when set, and never past its admin's
    units while that admin is a business-unit administrator (a unit administrator's token minted
    before it became one, or kept after it lost a unit or all of them, reaches no further than the
    admin now does)."""
    if is_super:
        return None
    owner = session_units(owner_is_super, owner_units, owner_unit_admin)
    if own is None:
        return owner
    return frozenset(own) if owner is None else frozenset(own) & owner


def in_scope(actor: Actor, unit: str | None) -> bool:
    return actor.business_units is None or (unit is not None and unit in actor.business_units)


def require_unit(actor: Actor, unit: str | None) -> None:
    """403 unless ``unit`` is in the actor's scope (an unscoped actor passes)."""
    if not in_scope(actor, unit):
        raise errors.Forbidden("outside your business units")


def require_platform(actor: Actor) -> None:
    if not actor.is_super:
        raise errors.Forbidden("only a platform administrator may do this")


def units_filter(scope: frozenset[str] | None, requested: str | None) -> list[str] | None:
    """The business units a read of logs or audit records keeps (None: all of them): the
    ``business_unit`` filter when given (403 when it is outside ``scope``), else the scope."""
    if requested is not None:
        requested = requested.strip()
        if scope is not None and requested not in scope:
            raise errors.Forbidden("business_unit is outside your business units")
        return [requested]
    return None if scope is None else sorted(scope)


def hide_manager(actor: Actor, user: dict[str, Any], manager_unit: str | None) -> dict[str, Any]:
    """A person as a scoped actor reads it: a manager outside its units keeps its id, not its
    email."""
    if actor.business_units is None or user.get("manager_id") is None or in_scope(actor, manager_unit):
        return user
    return {**user, "manager_email": None}


def rule_units(rule: Any) -> frozenset[str] | None:
    """The business units a rule's entries name, when every entry names some (a rule that reaches
    only into those units); None when an entry names none (it reaches everyone) or the rule has
    no readable entries."""
    if not isinstance(rule, dict):
        return None
    entries = rule.get("entries")
    if not isinstance(entries, list) or not entries:
        return None
    found: set[str] = set()
    for entry in entries:
        population = entry.get("population") if isinstance(entry, dict) else None
        named = population.get("business_units") if isinstance(population, dict) else None
        if not isinstance(named, list) or not named:
            return None
        for unit in named:
            if not isinstance(unit, str) or not unit.strip():
                return None
            found.add(unit.strip())
    return frozenset(found)


def rule_in_scope(actor: Actor, rule: Any) -> bool:
    if actor.business_units is None:
        return True
    units = rule_units(rule)
    return units is not None and units <= actor.business_units


def _single(units: frozenset[str] | None) -> str | None:
    """The unit an audit record names: one unit, or none (platform-wide or several)."""
    return next(iter(units)) if units is not None and len(units) == 1 else None


# --- the unit an audited write concerns ----------------------------------------------------------

_audit_unit: contextvars.ContextVar[str | None] = contextvars.ContextVar("meshfast_audit_unit", default=None)


def begin() -> None:
    """A request starts: no unit yet (each request is its own task; this makes it explicit)."""
    _audit_unit.set(None)
    _held.set(None)
    _cap_held.set(None)
    _seen_version.set(None)
    _standing_held.set(None)


def concerns(unit: str | None) -> None:
    """The write this request makes concerns ``unit`` (its audit record says so)."""
    _audit_unit.set(unit)


def audit_unit() -> str | None:
    return _audit_unit.get()


# The principal a scoped actor's write was checked against, and the units it may be in: the write's
# transaction checks it again under a row lock (:func:`recheck`), so a move out of the units
# between the check and the write cannot let the write through.
_held: contextvars.ContextVar[tuple[uuid.UUID, frozenset[str]] | None] = contextvars.ContextVar(
    "meshfast_scope_held", default=None)
# The version of the rule or model a scoped actor's write was checked against: its ``If-Match: *``
# means this version (:func:`pinned_if_match`), so a change between the check and the write's
# transaction makes the write 409 rather than pass on a row the check did not see.
_seen_version: contextvars.ContextVar[str | None] = contextvars.ContextVar("meshfast_scope_seen", default=None)
# A scoped actor's write that may not reactivate a person or put an expiry later: what it asks
# (the route's kind, the person, the expiry), checked again in the write's transaction before its
# work, under the person's row lock (:func:`precheck`).
_standing_held: contextvars.ContextVar[tuple[str, uuid.UUID, dt.datetime | None] | None] = contextvars.ContextVar(
    "meshfast_scope_standing", default=None)
# The cap a scoped actor's policy write sets and the unit whose lock it was checked against: the
# write's transaction reads the lock again, held to the commit (:func:`recheck`).
_cap_held: contextvars.ContextVar[tuple[str | None, Decimal] | None] = contextvars.ContextVar(
    "meshfast_scope_cap_held", default=None)


def _hold(actor: Actor, principal: uuid.UUID) -> None:
    if actor.business_units is not None:
        _held.set((principal, actor.business_units))


def pinned_if_match(actor: Actor, if_match: str) -> str:
    """``If-Match`` as a write compares it: a scoped actor's ``*`` is the version its scope check
    read (none read: the write finds the row changed or gone)."""
    if actor.business_units is None or if_match.strip() != "*":
        return if_match
    seen = _seen_version.get()
    return str(seen) if seen is not None else '"0"'


async def precheck(conn: asyncpg.Connection) -> None:
    """In a write's transaction, before its work: a scoped actor's key rotation or expiry is
    checked again against the person as it is now, locked to the commit (403 else)."""
    held = _standing_held.get()
    if held is None:
        return
    kind, principal, wanted = held
    row = await conn.fetchrow(units_sql.LOCK_USER_STANDING, principal)
    if row is not None:
        _refuse_standing(kind, row, wanted)


def _refuse_standing(kind: str, row: Mapping[str, Any], wanted: dt.datetime | None) -> None:
    """403 for what a unit administrator may not undo at once: reactivating a revoked person (a
    new key does), or an expiry, the person's or its key's, put later or cleared."""
    if kind == USER_ROTATE:
        if row["status"] != "active":
            raise errors.Forbidden("a business-unit administrator may not reactivate a revoked user")
        return
    current = row["expires_at"] if kind == USER_EXPIRY else row["key_expires_at"]
    if wanted is None or (current is not None and wanted > current):
        raise errors.Forbidden("a business-unit administrator may only bring an expiry forward")


async def recheck(conn: asyncpg.Connection) -> None:
    """In a write's transaction, after its work: the principal a scoped actor's write concerns is
    still in its units, and stays there until the commit (403 else, and the write rolls back); a
    cap it sets is still within its unit's lock, held to the commit (403 above_platform_lock)."""
    held = _held.get()
    if held is not None:
        principal, units = held
        row = await conn.fetchrow(units_sql.LOCK_PRINCIPAL_UNIT, principal)
        if row is not None and row["business_unit"] not in units:
            raise errors.Forbidden("the user is outside your business units")
    capped = _cap_held.get()
    if capped is not None:
        unit, cap = capped
        lock = await conn.fetchval(units_sql.LOCK_UNIT_LOCK, unit)
        if lock is not None and cap > lock:
            raise errors.AbovePlatformLock(f"the platform's lock on {unit} is ${lock} a day", lock_usd=float(lock))


# --- the route table -------------------------------------------------------------------------

# What a scoped actor may call, and the check each route's entity needs; a route not listed is
# 403 for a scoped actor. ``open``: nothing to check; ``filtered``: the handler answers only what
# is in scope; the others name the check in :meth:`Guard.check`. PLATFORM_ONLY routes need a
# platform administrator whoever asks. Keyed by method and path as the routers' tables spell it
# (meshfast.admin.paths: ``/admin/users/{id}``).
OPEN, FILTERED = "open", "filtered"
USER_READ, USER_WRITE, USER_CREATE, USER_UPDATE, POLICY, ACCESS = (
    "user_read", "user_write", "user_create", "user_update", "policy", "access")
MODEL_UNITS, RULE_READ, RULE_WRITE, RULE_DRAFT, KEY_WRITE = (
    "model_units", "rule_read", "rule_write", "rule_draft", "key_write")
USER_ROTATE, USER_EXPIRY, KEY_EXPIRY = "user_rotate", "user_expiry", "key_expiry"
# A pilot whose members are all in the actor's units (the stored one and the body).
PILOT = "pilot"

ROUTES: dict[tuple[str, str], str] = {
    ("GET", "/admin/me"): OPEN,
    ("POST", "/admin/logout"): OPEN,
    ("POST", "/admin/change-password"): OPEN,
    ("POST", "/admin/session-token"): OPEN,
    ("GET", "/admin/users"): FILTERED,
    ("POST", "/admin/users"): USER_CREATE,
    ("GET", "/admin/users/{id}"): USER_READ,
    ("PUT", "/admin/users/{id}"): USER_UPDATE,
    ("DELETE", "/admin/users/{id}"): USER_WRITE,
    # A new key reactivates a revoked person: a scoped actor rotates an active person's only.
    ("POST", "/admin/users/{id}/rotate-key"): USER_ROTATE,
    ("POST", "/admin/users/{id}/revoke"): USER_WRITE,
    # A scoped actor may bring an expiry forward, never put it later or clear it.
    ("PUT", "/admin/users/{id}/expiry"): USER_EXPIRY,
    ("PUT", "/admin/users/{id}/key/expiry"): KEY_EXPIRY,
    ("POST", "/admin/users/{id}/keys"): USER_WRITE,
    ("POST", "/admin/keys/{id}/rotate"): KEY_WRITE,
    ("DELETE", "/admin/keys/{id}"): KEY_WRITE,
    ("GET", "/admin/users/{id}/keys"): USER_READ,
    ("GET", "/admin/users/{id}/policies"): USER_READ,
    ("PUT", "/admin/users/{id}/policies/{model}"): POLICY,
    # NOTE: a grant relaxes access, within the unit's own people and under the unit's lock (a grant
    # without a policy has the $20 default cap); platform controls (rules, closures) still apply.
    ("POST", "/admin/access"): ACCESS,
    ("DELETE", "/admin/access"): ACCESS,
    ("GET", "/admin/models"): OPEN,
    ("GET", "/admin/models/{id}"): OPEN,
    ("GET", "/admin/models/{id}/deployments"): OPEN,
    ("PUT", "/admin/models/{id}"): MODEL_UNITS,
    ("GET", "/admin/logs"): FILTERED,
    ("GET", "/admin/logs/summary"): FILTERED,
    ("GET", "/admin/logs/export.csv"): FILTERED,
    ("GET", "/admin/audit"): FILTERED,
    ("GET", "/admin/rules"): FILTERED,
    ("POST", "/admin/rules"): RULE_WRITE,
    ("GET", "/admin/rules/{id}"): RULE_READ,
    ("PUT", "/admin/rules/{id}"): RULE_WRITE,
    ("DELETE", "/admin/rules/{id}"): RULE_WRITE,
    ("POST", "/admin/rules/dry-run"): RULE_DRAFT,
    ("GET", "/admin/enforcement"): OPEN,
    ("GET", "/admin/tokens"): FILTERED,
    ("POST", "/admin/tokens"): FILTERED,
    ("DELETE", "/admin/tokens/{id}"): FILTERED,
    ("GET", "/admin/business-units"): FILTERED,
    ("GET", "/admin/business-units/{id}"): FILTERED,
    # The approval queue: the lifecycle shows a unit administrator its units' changes only; only
    # platform administrators decide (approve and reject are not here: 403).
    ("GET", "/admin/changes"): FILTERED,
    ("GET", "/admin/changes/{id}"): FILTERED,
    # Deciding: the lifecycle refuses a unit administrator (403 self_approval for its own change,
    # 403 forbidden otherwise), so the answer names the reason.
    ("POST", "/admin/changes/{id}/approve"): OPEN,
    ("POST", "/admin/changes/{id}/reject"): OPEN,
    # Pilots: those whose members are all in the actor's units (graduation and a model's status,
    # roster and limited cap stay platform-only: absent here, or refused by MODEL_UNITS).
    ("GET", "/admin/pilots"): FILTERED,
    ("POST", "/admin/pilots"): PILOT,
    ("GET", "/admin/pilots/{id}"): PILOT,
    ("PUT", "/admin/pilots/{id}"): PILOT,
    ("DELETE", "/admin/pilots/{id}"): PILOT,
}
# All a business-unit administrator with no unit left may call: its own session.
UNITLESS = frozenset({("GET", "/admin/me"), ("POST", "/admin/logout"), ("POST", "/admin/change-password")})
PLATFORM_ONLY = frozenset({("POST", "/admin/business-units"), ("PUT", "/admin/business-units/{id}")})
# The checks that also name the audit record's unit, so they run for every actor.
_AUDITED = frozenset({USER_WRITE, USER_CREATE, USER_UPDATE, POLICY, ACCESS, RULE_WRITE, KEY_WRITE, USER_ROTATE,
                      USER_EXPIRY, KEY_EXPIRY})
_USER_WRITES = frozenset({USER_WRITE, USER_UPDATE, POLICY, USER_ROTATE, USER_EXPIRY, KEY_EXPIRY})


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        value = msgspec.json.decode(body) if body.strip() else None
    except (msgspec.DecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _listed(value: list[Any] | None) -> list[str] | None:
    """A restriction's list compared as a set of strings (null stays null)."""
    return None if value is None else sorted({str(v).strip() for v in value})


class _Cap(msgspec.Struct):
    """The part of a policy body the lock check reads, decoded as the route decodes it."""

    daily_cap_usd: Decimal = DEFAULT_DAILY_CAP_USD


class _Expiry(msgspec.Struct):
    expires_at: dt.datetime | None


def _uuid(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value is not None else None
    except ValueError:
        return None


class Guard:
    """The route table's checks, against the database: called by the routers before a handler."""

    def __init__(self, pool: asyncpg.Pool, service: AdminService) -> None:
        self._pool = pool
        self._service = service

    async def check(self, actor: Actor, method: str, route: str, params: Mapping[str, str], body: bytes) -> None:
        """403 for a route the actor may not call; then the route's own check. A body the check
        cannot read is left to the handler, which refuses it (400) before it writes anything."""
        key = (method, route)
        if key in PLATFORM_ONLY:
            require_platform(actor)
            return
        kind = ROUTES.get(key)
        if actor.business_units is not None and kind is None:
            raise errors.Forbidden("a business-unit administrator may not do this")
        if actor.business_units == frozenset() and key not in UNITLESS:
            raise errors.Forbidden("you administer no business unit")
        if kind is None or (actor.business_units is None and kind not in _AUDITED):
            return
        if kind == USER_READ or kind in _USER_WRITES:
            unit = await self._user(actor, params["id"], write=kind != USER_READ)
            if kind == USER_UPDATE:
                await self._moved(actor, unit, params["id"], body)
                await self._manager(actor, body)
            elif kind == POLICY and actor.business_units is not None:
                await self._cap(unit, params["id"], params["model"], body)
            elif kind in (USER_ROTATE, USER_EXPIRY, KEY_EXPIRY) and actor.business_units is not None:
                await self._standing(kind, params["id"], body)
        elif kind == USER_CREATE:
            fields = _json_object(body) or {}
            unit = fields.get("business_unit")
            unit = unit.strip() if isinstance(unit, str) else None
            require_unit(actor, unit)
            await self._manager(actor, body)
            concerns(unit)
        elif kind == ACCESS:
            await self._access(actor, body)
        elif kind == KEY_WRITE:
            await self._key(actor, params["id"])
        elif kind in (RULE_READ, RULE_WRITE, RULE_DRAFT):
            await self._rule(actor, method, kind, params.get("id"), body)
        elif kind == MODEL_UNITS:
            await self._model(actor, params["id"], body)
        elif kind == PILOT:
            await self._pilot(actor, method, params.get("id"), body)

    async def unit_of(self, principal_id: Any) -> str | None:
        """A principal's business unit (None: none, or no such principal)."""
        uid = _uuid(principal_id)
        return None if uid is None else (await self._principal_unit(uid))[1]

    async def _principal_unit(self, principal_id: uuid.UUID) -> tuple[bool, str | None]:
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(units_sql.PRINCIPAL_UNIT, principal_id)
        return row is not None, None if row is None else row["business_unit"]

    async def _user(self, actor: Actor, user_id: str, write: bool) -> str | None:
        """The person's unit (recorded for the audit); out of scope: 404 to read, 403 to write.
        An unknown person is left to the handler (its own 404)."""
        uid = _uuid(user_id)
        if uid is None:
            return None
        found, unit = await self._principal_unit(uid)
        if found and not in_scope(actor, unit):
            if write:
                raise errors.Forbidden("the user is outside your business units")
            raise errors.UserNotFound()
        concerns(unit)
        if write and found:
            _hold(actor, uid)
        return unit

    async def _key(self, actor: Actor, key_id: str) -> None:
        """A named key is its person's (or application's): written only within the actor's units."""
        kid = _uuid(key_id)
        if kid is None:
            return
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(units_sql.KEY_UNIT, kid)
        if row is None:
            return
        if not in_scope(actor, row["business_unit"]):
            raise errors.Forbidden("the key's owner is outside your business units")
        if row["kind"] == "application" and actor.business_units is not None:
            raise errors.Forbidden("a business-unit administrator manages people, not applications")
        concerns(row["business_unit"])
        _hold(actor, row["id"])

    async def _moved(self, actor: Actor, unit: str | None, user_id: str, body: bytes) -> None:
        """A person stays in the actor's units: a new ``business_unit`` must be one of them, and
        a scoped actor's move keeps the person's caps within the destination's lock (without one:
        the $20 default), or moving between its own units would lift a cap past a lock."""
        fields = _json_object(body)
        if fields is None or "business_unit" not in fields:
            return
        new = fields["business_unit"]
        new = new.strip() if isinstance(new, str) else None
        require_unit(actor, new)
        if unit is None:
            concerns(new)
        uid = _uuid(user_id)
        if actor.business_units is None or new == unit or uid is None:
            return
        async with self._pool.acquire() as conn:
            highest = await conn.fetchval(units_sql.HIGHEST_POLICY_CAP, uid)
            lock = await conn.fetchval(units_sql.UNIT_LOCK, new)
        limit = DEFAULT_DAILY_CAP_USD if lock is None else lock
        if highest is not None and highest > limit:
            raise errors.AbovePlatformLock(f"the person's cap of ${highest} a day is above the platform's lock on "
                                           f"{new} (${limit} a day)", lock_usd=float(limit))

    async def _manager(self, actor: Actor, body: bytes) -> None:
        """A scoped actor's new manager (``manager_id`` or ``manager_email``) is a person in its
        units: 403 otherwise, the same for a person who does not exist (no oracle)."""
        if actor.business_units is None:
            return
        fields = _json_object(body)
        if fields is None:
            return
        refused = errors.Forbidden("the manager is outside your business units")
        async with self._pool.acquire() as conn:
            if fields.get("manager_id") is not None:
                mid = _uuid(fields["manager_id"])
                if mid is None:
                    raise refused
                row = await conn.fetchrow(units_sql.MANAGER_UNIT_BY_ID, mid)
                if row is None or not in_scope(actor, row["business_unit"]):
                    raise refused
            if fields.get("manager_email") is not None:
                email = fields["manager_email"]
                if not isinstance(email, str):
                    raise refused
                row = await conn.fetchrow(units_sql.MANAGER_UNIT_BY_EMAIL, email.strip().lower())
                if row is None or not in_scope(actor, row["business_unit"]):
                    raise refused

    async def _standing(self, kind: str, user_id: str, body: bytes) -> None:
        """What a unit administrator may not undo at once (the approval queue does not reach it):
        a revoked person stays revoked (a new key would reactivate it), and an expiry, the
        person's or its key's, only comes sooner (later or cleared: 403)."""
        uid = _uuid(user_id)
        if uid is None:
            return
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(units_sql.USER_STANDING, uid)
        if row is None:
            return  # the handler's 404
        moment: dt.datetime | None = None
        if kind != USER_ROTATE:
            try:
                moment = msgspec.json.decode(body, type=_Expiry).expires_at
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                return  # the handler answers 400
            if moment is not None and moment.tzinfo is None:
                return  # the handler answers 400 (an RFC 3339 moment carries its offset)
        _refuse_standing(kind, row, moment)
        _standing_held.set((kind, uid, moment))

    async def _cap(self, unit: str | None, user_id: str, model_id: str, body: bytes) -> None:
        """A unit administrator's cap stays within the platform's lock on the unit (read as the
        handler reads it, a Decimal: a float would round 50.0000000001 down to the lock); the
        write's transaction reads the lock again (:func:`recheck`)."""
        try:
            cap = msgspec.json.decode(body, type=_Cap).daily_cap_usd
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return  # the handler answers 400
        if not cap.is_finite():
            return
        _cap_held.set((unit, cap))
        uid, mid = _uuid(user_id), _uuid(model_id)
        async with self._pool.acquire() as conn:
            lock = await conn.fetchval(units_sql.UNIT_LOCK, unit)
            if lock is None:
                current = None if uid is None or mid is None else await conn.fetchval(units_sql.POLICY_CAP, uid, mid)
                lock = DEFAULT_DAILY_CAP_USD if current is None else current
        if cap > lock:
            raise errors.AbovePlatformLock(f"the platform's lock on {unit} is ${lock} a day",
                                           lock_usd=float(lock))

    async def _access(self, actor: Actor, body: bytes) -> None:
        fields = _json_object(body)
        if fields is None:
            return
        if fields.get("application_id") is not None:
            if actor.business_units is not None:
                raise errors.Forbidden("a business-unit administrator manages people, not applications")
            principal = _uuid(fields.get("application_id"))
        else:
            principal = _uuid(fields.get("user_id"))
        if principal is None:
            return
        found, unit = await self._principal_unit(principal)
        if found and not in_scope(actor, unit):
            raise errors.Forbidden("the user is outside your business units")
        concerns(unit)
        if found:
            _hold(actor, principal)

    async def _rule(self, actor: Actor, method: str, kind: str, rule_id: str | None, body: bytes) -> None:
        """A rule the actor reads or writes (the stored one, and the body it sends) names only
        business units in its scope in every entry; the audit record names the rule's unit."""
        stored = None
        if rule_id is not None and rules.SLUG.match(rule_id):
            async with self._pool.acquire() as conn:
                row = await conn.fetchrow(rules_sql.GET_RULE, rule_id)
            stored = None if row is None else rule_admin.stored_body(row["body"])
            if row is not None:
                _seen_version.set(str(row["version"]))
        if kind == RULE_READ:
            if stored is not None and not rule_in_scope(actor, stored):
                raise errors.RuleNotFound()
            return
        if stored is not None and not rule_in_scope(actor, stored):
            raise errors.Forbidden("the rule reaches outside your business units")
        # An unreadable body is the handler's 400 (nothing is written).
        draft = stored if method == "DELETE" else _json_object(body)
        if draft is not None and not rule_in_scope(actor, draft):
            raise errors.Forbidden("every entry's population.business_units must name only your business units")
        concerns(_single(rule_units(draft)))

    async def _model(self, actor: Actor, model_id: str, body: bytes) -> None:
        """A unit administrator may only close or open the model for its own units: the body is
        ``{restrictions}`` alone, equal to the stored one but for ``business_units_closed``
        entries of its units."""
        assert actor.business_units is not None
        refused = errors.Forbidden("a business-unit administrator may only change business_units_closed for its "
                                   "units")
        fields = _json_object(body)
        if fields is None or set(fields) != {"restrictions"} or not isinstance(fields["restrictions"], dict):
            raise refused
        model = await self._service.get_model(model_id)
        _seen_version.set(str(model.get("version")))
        current = model.get("restrictions") or {}
        wanted = fields["restrictions"]
        for field in (*rules.RESTRICTION_PEOPLE, *rules.RESTRICTION_UNITS):
            if field == "business_units_closed":
                continue
            empty: list[str] | None = None if field in rules.RESTRICTION_NULLABLE else []
            old, new = current.get(field, empty), wanted.get(field, empty)
            if not isinstance(new, list | None) or _listed(old) != _listed(new):
                raise refused
        old_closed = {str(u).strip() for u in current.get("business_units_closed") or []}
        new_given = wanted.get("business_units_closed") or []
        if not isinstance(new_given, list):
            raise refused
        changed = old_closed ^ {str(u).strip() for u in new_given}
        if not changed <= actor.business_units:
            raise refused
        concerns(_single(frozenset(changed)))

    async def _pilot(self, actor: Actor, method: str, pilot_id: str | None, body: bytes) -> None:
        """A pilot the actor reads or writes has every member in its units: the stored one (out of
        scope: 404 to read, 403 to write) and the body's (403; unknown people are the handler's 400)."""
        assert actor.business_units is not None
        units = actor.business_units
        pid = _uuid(pilot_id)
        async with self._pool.acquire() as conn:
            row = None if pid is None else await conn.fetchrow(onboarding_sql.GET_PILOT, pid)
            if row is not None:
                members = onboarding._ids(row["members"])
                known = await _pilots().member_units(conn, members)
                if not all(known.get(m) in units for m in members):
                    if method == "GET":
                        raise errors.PilotNotFound()
                    raise errors.Forbidden("the pilot has members outside your business units")
            fields = _json_object(body) if method in ("POST", "PUT") else None
            if fields is not None and isinstance(fields.get("members"), list):
                known = await _pilots().member_units(conn, [m for m in fields["members"] if _uuid(m) is not None])
                if not all(unit in units for unit in known.values()):
                    raise errors.Forbidden("every member of the pilot must be in your business units")
