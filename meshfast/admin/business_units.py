"""Business units (API.md "Governed lifecycle"): a unit is named as people's ``business_unit``
is, keeps a timezone (both Python and PostgreSQL know it) and its administrators, and carries the
platform's lock on it: ``daily_cap_lock_usd``, the highest per-person daily cap its administrators
may set (null: they may not raise a cap above the one in force, a policy's or the $20 default).

Platform administrators create and change units; a unit's administrators read their own
(:mod:`meshfast.admin.scope`). Every write is audited (``business_unit.create`` and
``business_unit.update``) with the unit's name, in the write's transaction.
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import asyncpg
import msgspec

from meshfast import errors, validate
from meshfast.admin.scope import in_scope
from meshfast.admin.service.common import Price, _invalid, _price, parse_uuid, row_json
from meshfast.store import business_units as units_sql
from meshfast.validate import Email, Id, Label, Word

if TYPE_CHECKING:  # the routes and the service import this module
    from meshfast.admin.routes import Actor
    from meshfast.admin.service import AdminService

Admins = list[Id]
# As the table's check holds it (migration 0026).
MAX_NAME = 128


class BusinessUnitBody(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /admin/business-units`` and ``PUT /admin/business-units/{id}`` (the whole unit but
    ``admins``: absent from a PUT, the unit keeps its administrators; absent from a POST, none)."""

    name: Label
    timezone: Word
    admins: Admins | msgspec.UnsetType = msgspec.UNSET
    daily_cap_lock_usd: Price | None = None


class FileBusinessUnit(msgspec.Struct, forbid_unknown_fields=True):
    """A unit in a registry file (``meshfast apply``): matched by name, its administrators named
    by email (ids are not known to a file); created when missing, else set to exactly this."""

    name: Label
    timezone: Word = "UTC"
    admins: list[Email] = msgspec.field(default_factory=list)
    daily_cap_lock_usd: Price | None = None


def check_file_unit(entry: Any) -> FileBusinessUnit:
    """A file's unit, its own fields checked (the timezone and administrators are checked when
    applied, against the database): 400 listing the problems."""
    try:
        unit = msgspec.convert(entry, FileBusinessUnit)
    except msgspec.ValidationError as exc:
        raise _invalid([str(exc)]) from None
    problems = []
    if not unit.name.strip() or len(unit.name.strip()) > MAX_NAME:
        problems.append(f"name may not be empty or longer than {MAX_NAME} characters")
    try:
        _price(unit.daily_cap_lock_usd, "daily_cap_lock_usd")
    except errors.InvalidRequest as exc:
        problems.append(exc.detail or "daily_cap_lock_usd is not a non-negative number")
    if problems:
        raise _invalid(problems)
    return unit


async def apply_file_units(conn: asyncpg.Connection, units: list[FileBusinessUnit],
                           summary: dict[str, list[str]]) -> list[str]:
    """Creates or sets each unit of a registry file, in the file's transaction; the problems found
    against the database (an unknown timezone or admin email, a platform administrator named as
    a unit's), with nothing written when there are any (the caller raises them)."""
    zones = await validate.load_timezones(conn)
    emails = sorted({e for u in units for e in u.admins})
    admins = {row["email"]: row for row in await conn.fetch(units_sql.ADMINS_BY_EMAILS, emails)}
    problems: list[str] = []
    for unit in units:
        label = f"business unit {unit.name.strip()!r}"
        if unit.timezone not in zones:
            problems.append(f"{label}: timezone {unit.timezone[:64]!r} is not a time zone both Python and "
                            "PostgreSQL know")
        for email in unit.admins:
            if email not in admins:
                problems.append(f"{label}: admin {email!r} is not registered")
            elif admins[email]["is_super"]:
                problems.append(f"{label}: admin {email!r} is a platform administrator (never scoped to a unit)")
    if problems:
        return problems
    for unit in units:
        name = unit.name.strip()
        lock = _price(unit.daily_cap_lock_usd, "daily_cap_lock_usd")
        wanted = sorted({admins[e]["id"] for e in unit.admins})
        row = await conn.fetchrow(units_sql.UNIT_BY_NAME, name)
        if row is None:
            unit_id = await conn.fetchval(units_sql.INSERT_UNIT, name, unit.timezone, lock)
            await conn.execute(units_sql.ADD_UNIT_ADMINS, unit_id, wanted)
            summary["created"].append(f"business_unit:{name}")
            continue
        same = (row["timezone"] == unit.timezone and row["daily_cap_lock_usd"] == lock
                and sorted(row["admins"]) == wanted)
        if same:
            summary["unchanged"].append(f"business_unit:{name}")
            continue
        await conn.execute(units_sql.UPDATE_UNIT, row["id"], name, unit.timezone, lock)
        await conn.execute(units_sql.CLEAR_UNIT_ADMINS, row["id"])
        await conn.execute(units_sql.ADD_UNIT_ADMINS, row["id"], wanted)
        summary["updated"].append(f"business_unit:{name}")
    return []


def unit_json(row: asyncpg.Record) -> dict[str, Any]:
    out = row_json(row)
    out["daily_cap_lock_usd"] = None if row["daily_cap_lock_usd"] is None else float(row["daily_cap_lock_usd"])
    return out


class BusinessUnitService:
    def __init__(self, pool: asyncpg.Pool, service: AdminService) -> None:
        self._pool = pool
        self._service = service

    async def _checked(self, conn: asyncpg.Connection, body: BusinessUnitBody) -> tuple[str, str, list[uuid.UUID],
                                                                                           Decimal | None]:
        """The unit's fields as stored, or one 400 listing every problem."""
        problems: list[str] = []
        name = body.name.strip()
        if not name or len(name) > MAX_NAME:
            problems.append(f"name may not be empty or longer than {MAX_NAME} characters")
        timezone = body.timezone
        try:
            validate.timezone(body.timezone, "timezone", await validate.load_timezones(conn))
        except errors.InvalidRequest:
            problems.append(f"timezone {body.timezone[:64]!r} is not a time zone both Python and PostgreSQL know")
        lock: Decimal | None = None
        try:
            lock = _price(body.daily_cap_lock_usd, "daily_cap_lock_usd")
        except errors.InvalidRequest as exc:
            problems.append(exc.detail or "daily_cap_lock_usd is not a non-negative number")
        admin_ids: list[uuid.UUID] = []
        for given in body.admins or ():
            try:
                admin_ids.append(uuid.UUID(given))
            except ValueError:
                problems.append(f"admins: {given[:64]!r} is not an admin id")
        admin_ids = sorted(set(admin_ids))
        found = {row["id"]: row["is_super"] for row in await conn.fetch(units_sql.ADMINS_BY_IDS, admin_ids)}
        for admin_id in admin_ids:
            if str(admin_id) not in found:
                problems.append(f"admins: {admin_id} names no admin")
            elif found[str(admin_id)]:
                problems.append(f"admins: {admin_id} is a platform administrator (never scoped to a unit)")
        if problems:
            raise _invalid(problems)
        return name, timezone, admin_ids, lock

    async def create(self, actor: Actor, body: BusinessUnitBody) -> dict[str, Any]:
        async def work(conn: asyncpg.Connection) -> uuid.UUID:
            name, timezone, admins, lock = await self._checked(conn, body)
            try:
                unit_id: uuid.UUID = await conn.fetchval(units_sql.INSERT_UNIT, name, timezone, lock)
            except asyncpg.UniqueViolationError:
                raise errors.BusinessUnitExists() from None
            await conn.execute(units_sql.ADD_UNIT_ADMINS, unit_id, admins)
            return unit_id

        unit_id = await self._service._write(actor.name, "business_unit.create", body.name.strip(),
                                             {"admins": sorted(body.admins or ())}, work,
                                             business_unit=body.name.strip())
        return await self.get(actor, str(unit_id))

    async def update(self, actor: Actor, unit_id: str, body: BusinessUnitBody, if_match: str | None) -> dict[str, Any]:
        """The whole unit; ``If-Match``, when sent, must name the current version (stale: 409).
        A rename carries the unit's name everywhere it stands for the unit, in the same
        transaction: admin tokens' scopes, people's ``business_unit``, models' closed and open
        lists and rules' ``population.business_units`` (their stored revisions, pending changes,
        log rows and audit records keep the name they were made under)."""
        uid = parse_uuid(unit_id, errors.BusinessUnitNotFound)

        detail: dict[str, Any] = {} if body.admins is msgspec.UNSET else {"admins": sorted(body.admins)}

        async def work(conn: asyncpg.Connection) -> None:
            row = await conn.fetchrow(units_sql.UNIT_FOR_UPDATE, uid)
            if row is None:
                raise errors.BusinessUnitNotFound()
            if if_match and if_match.strip() not in (f'"{row["version"]}"', str(row["version"]), "*"):
                raise errors.VersionConflict()
            name, timezone, admins, lock = await self._checked(conn, body)
            try:
                await conn.execute(units_sql.UPDATE_UNIT, uid, name, timezone, lock)
            except asyncpg.UniqueViolationError:
                raise errors.BusinessUnitExists() from None
            if body.admins is not msgspec.UNSET:
                await conn.execute(units_sql.CLEAR_UNIT_ADMINS, uid)
                await conn.execute(units_sql.ADD_UNIT_ADMINS, uid, admins)
            if row["name"] != name:
                # NOTE: log rows and audit records keep the name they were written under.
                for statement in (units_sql.RENAME_IN_TOKENS, units_sql.RENAME_IN_USERS,
                                  units_sql.RENAME_IN_RESTRICTIONS, units_sql.RENAME_IN_RULES):
                    await conn.execute(statement, row["name"], name)
                # The audit row (written after this work, in its transaction) names the old name.
                detail["renamed_from"] = row["name"]

        await self._service._write(actor.name, "business_unit.update", str(uid), detail, work,
                                   business_unit=body.name.strip())
        return await self.get(actor, unit_id)

    async def list(self, actor: Actor) -> list[dict[str, Any]]:
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(units_sql.LIST_UNITS)
        return [unit_json(r) for r in rows if in_scope(actor, r["name"])]

    async def get(self, actor: Actor, unit_id: str) -> dict[str, Any]:
        """One unit; a unit outside a scoped actor's units answers as an unknown one (404)."""
        uid = parse_uuid(unit_id, errors.BusinessUnitNotFound)
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(units_sql.GET_UNIT, uid)
        if row is None or not in_scope(actor, row["name"]):
            raise errors.BusinessUnitNotFound()
        return unit_json(row)
