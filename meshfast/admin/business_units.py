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
from meshfast.admin.service import AdminService, Price, parse_uuid, row_json
from meshfast.admin.service.common import _invalid, _price
from meshfast.store import business_units as units_sql
from meshfast.validate import Id, Label, Word

if TYPE_CHECKING:  # the routes import this module
    from meshfast.admin.routes import Actor

Admins = list[Id]
# As the table's check holds it (migration 0026).
MAX_NAME = 128


class BusinessUnitBody(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /admin/business-units`` and ``PUT /admin/business-units/{id}`` (the whole unit)."""

    name: Label
    timezone: Word
    admins: Admins = msgspec.field(default_factory=list)
    daily_cap_lock_usd: Price | None = None


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
        for given in body.admins:
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
                                             {"admins": sorted(body.admins)}, work,
                                             business_unit=body.name.strip())
        return await self.get(actor, str(unit_id))

    async def update(self, actor: Actor, unit_id: str, body: BusinessUnitBody, if_match: str | None) -> dict[str, Any]:
        """The whole unit; ``If-Match``, when sent, must name the current version (stale: 409).
        Admin tokens scoped to a renamed unit follow its new name; people's ``business_unit``
        labels are theirs and are not rewritten."""
        uid = parse_uuid(unit_id, errors.BusinessUnitNotFound)

        detail: dict[str, Any] = {"admins": sorted(body.admins)}

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
            await conn.execute(units_sql.CLEAR_UNIT_ADMINS, uid)
            await conn.execute(units_sql.ADD_UNIT_ADMINS, uid, admins)
            if row["name"] != name:
                await conn.execute(units_sql.RENAME_IN_TOKENS, row["name"], name)
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
