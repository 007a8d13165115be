"""Applications as principals (API.md "Identities"): ``POST /admin/applications``, ``GET``,
``GET/PUT/DELETE /admin/applications/{id}``, and their keys, grants and policies.

An application is a registered service that calls the data plane on its own behalf: it has a name,
an owner (a person, who answers for it) and optionally a business unit, and it holds keys, grants,
per-model policies and spend counters exactly as a person does. It is stored beside people in
``users`` with ``kind = 'application'`` (migration 0024), so every key, grant, policy, counter and
row that names a principal by id works for it unchanged; its rows carry ``principal_kind =
'application'`` and its id as ``application_id``. Spend rules select applications with
``population.applications``; a workflow lists them as ``{application_id}``; a platform token
names one through its issuer's ``claims.application`` (by id or name).
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

import asyncpg
import msgspec
from msgspec import UNSET, Meta, UnsetType

from meshfast import errors
from meshfast.secrets import Secrets, new_mesh_key
from meshfast.store import applications as applications_sql
from meshfast.validate import Id, Label

# A name is what a token's application claim and the dashboard show: ASCII letters, digits,
# spaces and . _ -, starting with a letter or digit; unique whatever its case.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}\Z")
Name = Annotated[str, Meta(max_length=64)]


class ApplicationCreate(msgspec.Struct, forbid_unknown_fields=True):
    name: Name
    owner_id: Id
    business_unit: Label | None = None


class ApplicationUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """``PUT /admin/applications/{id}``: a field left out is kept; ``business_unit: null`` clears
    it; ``status: revoked`` refuses every key and token of the application until it is active again."""

    name: Name | UnsetType = UNSET
    owner_id: Id | UnsetType = UNSET
    business_unit: Label | None | UnsetType = UNSET
    status: Literal["active", "revoked"] | UnsetType = UNSET


def application_name(value: str) -> str:
    """An application's name as stored (400 when it cannot be one)."""
    name = value.strip()
    if not _NAME.match(name):
        raise errors.InvalidRequest(
            "name must be 1 to 64 of A-Z a-z 0-9, space, . _ - (starting with a letter or digit)"
        )
    try:
        uuid.UUID(name)
    except ValueError:
        return name
    raise errors.InvalidRequest(
        "name must not be a UUID (a token's application claim names an application by id or name)"
    )


def _uuid(value: str, field: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise errors.InvalidRequest(f"{field} must be a UUID") from None


def _path(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise errors.ApplicationNotFound() from None


def _json(row: asyncpg.Record) -> dict[str, Any]:
    def moment(value: dt.datetime) -> str:
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")

    return {
        "id": str(row["id"]),
        "name": row["name"],
        "owner_id": str(row["owner_id"]),
        "owner_email": row["owner_email"],
        "business_unit": row["business_unit"],
        "status": row["status"],
        "key_prefix": row["key_prefix"],
        "version": row["version"],
        "created_at": moment(row["created_at"]),
        "updated_at": moment(row["updated_at"]),
    }


class ApplicationService:
    """The admin routes' work; ``write`` is AdminService._write (the transaction, the config bump,
    NOTIFY and the audit row)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        secrets: Secrets,
        write: Callable[..., Awaitable[Any]],
        label: Callable[[str | None, str], str | None],
    ) -> None:
        self._pool = pool
        self._secrets = secrets
        self._write = write
        self._label = label

    async def create(self, actor: str, body: ApplicationCreate) -> dict[str, Any]:
        name = application_name(body.name)
        owner = _uuid(body.owner_id, "owner_id")
        unit = self._label(body.business_unit, "business_unit")
        key, prefix = new_mesh_key()
        digest = self._secrets.hash_key(key)

        async def work(conn: asyncpg.Connection) -> uuid.UUID:
            if await conn.fetchval(applications_sql.OWNER_EXISTS, owner) is None:
                raise errors.InvalidRequest("owner_id names no user")
            try:
                app_id = await conn.fetchval(applications_sql.INSERT_APPLICATION, name, owner, unit)
            except asyncpg.UniqueViolationError:
                raise errors.ApplicationExists("an application has this name already") from None
            await conn.execute(applications_sql.INSERT_APPLICATION_KEY, app_id, digest, prefix)
            return app_id

        app_id = await self._write(actor, "create_application", name, {"owner_id": str(owner)}, work)
        return {
            "id": str(app_id),
            "name": name,
            "owner_id": str(owner),
            "business_unit": unit,
            "key": key,
            "key_prefix": prefix,
        }

    async def list(self) -> list[dict[str, Any]]:
        async with self._pool.acquire() as conn:
            return [_json(r) for r in await conn.fetch(applications_sql.LIST_APPLICATIONS)]

    async def get(self, app_id: str) -> dict[str, Any]:
        uid = _path(app_id)
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(applications_sql.GET_APPLICATION, uid)
        if row is None:
            raise errors.ApplicationNotFound()
        return _json(row)

    async def update(self, actor: str, app_id: str, body: ApplicationUpdate, if_match: str | None) -> dict[str, Any]:
        """The given fields; against ``If-Match``'s version when one is sent (stale: 409)."""
        uid = _path(app_id)
        changes: dict[str, Any] = {}
        if body.name is not UNSET:
            changes["display_name"] = application_name(body.name)
        if body.owner_id is not UNSET:
            changes["owner_id"] = _uuid(body.owner_id, "owner_id")
        if body.business_unit is not UNSET:
            changes["business_unit"] = self._label(body.business_unit, "business_unit")
        if body.status is not UNSET:
            changes["status"] = body.status

        async def work(conn: asyncpg.Connection) -> None:
            row = await conn.fetchrow(applications_sql.APPLICATION_FOR_UPDATE, uid)
            if row is None:
                raise errors.ApplicationNotFound()
            if if_match and if_match.strip() not in (f'"{row["version"]}"', str(row["version"]), "*"):
                raise errors.VersionConflict()
            wanted = {**dict(row), **changes}
            if "owner_id" in changes and \
                    await conn.fetchval(applications_sql.OWNER_EXISTS, wanted["owner_id"]) is None:
                raise errors.InvalidRequest("owner_id names no user")
            try:
                await conn.execute(
                    applications_sql.UPDATE_APPLICATION, uid, wanted["display_name"], wanted["owner_id"],
                    wanted["business_unit"], wanted["status"]
                )
            except asyncpg.UniqueViolationError:
                raise errors.ApplicationExists("an application has this name already") from None

        # NOTE: the principal alone changed: every worker patches it in place (no rebuild).
        await self._write(
            actor, "update_application", str(uid), {"fields": sorted(changes)}, work, change=f"user:{uid}"
        )
        return await self.get(app_id)

    async def delete(self, actor: str, app_id: str) -> dict[str, Any]:
        """The application, its keys (refused at once on every worker), grants and policies; its
        rows stay, with its id."""
        uid = _path(app_id)

        async def work(conn: asyncpg.Connection) -> None:
            if await conn.fetchval(applications_sql.DELETE_APPLICATION, uid) is None:
                raise errors.ApplicationNotFound()

        await self._write(actor, "delete_application", str(uid), {}, work)
        return {"status": "deleted"}
