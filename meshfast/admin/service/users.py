"""Users: their bodies, creation with a first key, the primary key's rotation and expiry, their
place in the organisation, their own expiry, revocation and deletion."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import msgspec
from msgspec import UNSET, UnsetType

from meshfast import errors
from meshfast.admin.service.common import (
    ServiceBase,
    Timestamp,
    _body_uuid,
    _email,
    _jsonable,
    _label,
    _moment,
    _nonempty,
    parse_uuid,
    row_json,
)
from meshfast.secrets import new_mesh_key
from meshfast.store import sql
from meshfast.validate import DisplayName, Email, Id, Label


class UserCreate(msgspec.Struct, forbid_unknown_fields=True):
    email: Email
    display_name: DisplayName
    # An existing user's email; the user stores the manager's id.
    manager_email: Email | None = None
    business_unit: Label | None = None
    tier: Label | None = None


class UserUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """``PUT /admin/users/{id}``: a field left out is kept, ``null`` clears it (``display_name``
    cannot be cleared). The manager is named by ``manager_id`` or ``manager_email``, not both."""

    display_name: DisplayName | UnsetType = UNSET
    manager_id: Id | None | UnsetType = UNSET
    manager_email: Email | None | UnsetType = UNSET
    business_unit: Label | None | UnsetType = UNSET
    tier: Label | None | UnsetType = UNSET
    # After this moment the user's keys are refused (401) on every worker.
    expires_at: Timestamp | None | UnsetType = UNSET


class ExpiryBody(msgspec.Struct, forbid_unknown_fields=True):
    """``PUT /admin/users/{id}/expiry`` (Mesh's) and ``PUT /admin/users/{id}/key/expiry``: an
    RFC 3339 moment with its offset, or ``null`` for none."""

    expires_at: Timestamp | None


async def _manager_by_email(conn: asyncpg.Connection, email: str) -> uuid.UUID:
    manager_id = await conn.fetchval(sql.USER_ID_BY_EMAIL, email)
    if manager_id is None:
        raise errors.InvalidRequest("manager_email names no user")
    return manager_id


class UserOperations(ServiceBase):
    """Users (mixed into :class:`AdminService`)."""

    async def create_user(self, actor: str, body: UserCreate) -> dict[str, Any]:
        email = _email(body.email)
        display_name = _nonempty(body.display_name, "display_name")
        manager_email = None if body.manager_email is None else _email(body.manager_email, "manager_email")
        business_unit, tier = _label(body.business_unit, "business_unit"), _label(body.tier, "tier")
        key, prefix = new_mesh_key()
        digest = self._secrets.hash_key(key)

        async def work(conn: asyncpg.Connection) -> asyncpg.Record:
            # NOTE: a new user has no reports, so naming a manager cannot close a loop.
            manager_id = None if manager_email is None else await _manager_by_email(conn, manager_email)
            try:
                row = await conn.fetchrow(sql.INSERT_USER, email, display_name, manager_id, business_unit, tier)
            except asyncpg.UniqueViolationError:
                raise errors.EmailExists() from None
            await conn.execute(sql.INSERT_KEY, row["id"], digest, prefix)
            return row

        row = await self._write(actor, "create_user", email, {}, work)
        return {"id": str(row["id"]), "email": row["email"], "display_name": row["display_name"],
                "key": key, "key_prefix": prefix}

    async def rotate_key(self, actor: str, user_id: str) -> dict[str, Any]:
        uid = parse_uuid(user_id, errors.UserNotFound)
        key, prefix = new_mesh_key()
        digest = self._secrets.hash_key(key)

        async def work(conn: asyncpg.Connection) -> None:
            if await conn.fetchval(sql.LOCK_USER, uid) is None or await conn.fetchval(sql.ACTIVATE_USER, uid) is None:
                raise errors.UserNotFound()
            # NOTE: the primary key only; the person's named keys stay as they are.
            await conn.execute(sql.REVOKE_PRIMARY_KEYS, uid)
            await conn.execute(sql.INSERT_KEY, uid, digest, prefix)

        await self._write(actor, "rotate_user_key", str(uid), {}, work)
        return {"key": key, "key_prefix": prefix}

    async def revoke_user(self, actor: str, user_id: str) -> dict[str, Any]:
        uid = parse_uuid(user_id, errors.UserNotFound)

        async def work(conn: asyncpg.Connection) -> None:
            if await conn.fetchval(sql.REVOKE_USER, uid) is None:
                raise errors.UserNotFound()
            await conn.execute(sql.REVOKE_ACTIVE_KEYS, uid)

        await self._write(actor, "revoke_user", str(uid), {}, work)
        return {"status": "revoked"}

    async def delete_user(self, actor: str, user_id: str) -> dict[str, Any]:
        uid = parse_uuid(user_id, errors.UserNotFound)

        async def work(conn: asyncpg.Connection) -> None:
            try:
                deleted = await conn.fetchval(sql.DELETE_USER, uid)
            except asyncpg.ForeignKeyViolationError:
                raise errors.OwnsApplications("the user owns applications: delete them or give them another owner "
                                              "first") from None
            if deleted is None:
                raise errors.UserNotFound()

        await self._write(actor, "delete_user", str(uid), {}, work)
        return {"status": "deleted"}

    async def update_user(self, actor: str, user_id: str, body: UserUpdate, if_match: str | None) -> dict[str, Any]:
        """``PUT /admin/users/{id}``: the given fields, only against the version in ``If-Match``
        (missing 428, stale 409); 409 ``manager_cycle`` when the new manager is the user or
        reports to them. A manager change holds LOCK_ORGANISATION to commit, so two concurrent
        changes cannot each pass the loop check and close a loop together."""
        uid = parse_uuid(user_id, errors.UserNotFound)
        if not if_match:
            raise errors.PreconditionRequired()
        if body.manager_id is not UNSET and body.manager_email is not UNSET:
            raise errors.InvalidRequest("give manager_id or manager_email, not both")
        changes: dict[str, Any] = {}
        if body.display_name is not UNSET:
            changes["display_name"] = _nonempty(body.display_name, "display_name")
        for field in ("business_unit", "tier"):
            if getattr(body, field) is not UNSET:
                changes[field] = _label(getattr(body, field), field)
        if body.expires_at is not UNSET:
            changes["expires_at"] = _moment(body.expires_at, "expires_at")
        manager: tuple[str, Any] | None = None
        if body.manager_id is not UNSET:
            manager = ("id", None if body.manager_id is None else _body_uuid(body.manager_id, "manager_id"))
        elif body.manager_email is not UNSET:
            manager = ("email", None if body.manager_email is None else _email(body.manager_email, "manager_email"))

        async def work(conn: asyncpg.Connection) -> None:
            if manager is not None:
                await conn.execute(sql.LOCK_ORGANISATION)
            row = await conn.fetchrow(sql.USER_FOR_UPDATE, uid)
            if row is None:
                raise errors.UserNotFound()
            if if_match.strip() not in (f'"{row["version"]}"', str(row["version"]), "*"):
                raise errors.VersionConflict()
            wanted = {**dict(row), **changes}
            if manager is not None:
                kind, value = manager
                if value is None:
                    wanted["manager_id"] = None
                elif kind == "email":
                    wanted["manager_id"] = await _manager_by_email(conn, value)
                elif await conn.fetchval(sql.USER_EXISTS, value) is None:
                    raise errors.InvalidRequest("manager_id names no user")
                else:
                    wanted["manager_id"] = value
                if wanted["manager_id"] is not None and await conn.fetchval(
                        sql.MANAGER_WOULD_LOOP, uid, wanted["manager_id"]):
                    raise errors.ManagerCycle("the new manager is the user or reports to them")
            await conn.execute(sql.UPDATE_USER, uid, wanted["display_name"], wanted["manager_id"],
                               wanted["business_unit"], wanted["tier"], wanted["expires_at"])

        fields = sorted([*changes, *(["manager_id"] if manager is not None else [])])
        action = "update_user_expiry" if fields == ["expires_at"] else "update_user"
        await self._write(actor, action, str(uid), {"fields": fields}, work, change=f"user:{uid}")
        return await self.get_user(user_id)

    async def set_user_expiry(self, actor: str, user_id: str, body: ExpiryBody) -> dict[str, Any]:
        """Mesh's route: after ``expires_at`` every key of the user is refused, on every worker
        within a second of the write."""
        uid = parse_uuid(user_id, errors.UserNotFound)
        moment = _moment(body.expires_at, "expires_at")

        async def work(conn: asyncpg.Connection) -> None:
            if await conn.fetchval(sql.SET_USER_EXPIRY, uid, moment) is None:
                raise errors.UserNotFound()

        await self._write(actor, "update_user_expiry", str(uid), {"expires_at": _jsonable(moment)}, work,
                          change=f"user:{uid}")
        return {"status": "ok"}

    async def set_key_expiry(self, actor: str, user_id: str, body: ExpiryBody) -> dict[str, Any]:
        """The user's active key stops working after ``expires_at`` (the user stays active, and a
        rotated key starts without an expiry)."""
        uid = parse_uuid(user_id, errors.UserNotFound)
        moment = _moment(body.expires_at, "expires_at")

        async def work(conn: asyncpg.Connection) -> str:
            if await conn.fetchval(sql.LOCK_PRINCIPAL, uid, "user") is None:
                raise errors.UserNotFound()
            key_id = await conn.fetchval(sql.SET_KEY_EXPIRY, uid, moment)
            if key_id is None:
                raise errors.InvalidRequest("the user has no active key")
            return str(key_id)

        key_id = await self._write(actor, "update_key_expiry", str(uid), {"expires_at": _jsonable(moment)}, work)
        return {"status": "ok", "key_id": key_id, "expires_at": _jsonable(moment)}

    async def list_users(self) -> list[dict[str, Any]]:
        async with self._pool.acquire() as conn:
            return [row_json(r) for r in await conn.fetch(sql.LIST_USERS)]

    async def get_user(self, user_id: str) -> dict[str, Any]:
        uid = parse_uuid(user_id, errors.UserNotFound)
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(sql.GET_USER, uid)
        if row is None:
            raise errors.UserNotFound()
        return row_json(row)
