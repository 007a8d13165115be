"""Named keys: a person's or an application's keys beside the primary one, their rotation
with an overlap and their revocation."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any

import asyncpg
import msgspec
from msgspec import Meta

from meshfast import errors
from meshfast.admin.service.common import ServiceBase, Timestamp, _missing, _moment, parse_uuid, row_json
from meshfast.secrets import new_mesh_key
from meshfast.store import sql
from meshfast.validate import Id

KeyName = Annotated[str, Meta(min_length=1, max_length=64)]
# The longest overlap a rotation may give the key it replaces: 30 days.
MAX_OVERLAP_S = 30 * 86_400


class KeyCreate(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /admin/users/{id}/keys``: a named key, with an optional expiry and model subset."""

    name: KeyName
    expires_at: Timestamp | None = None
    # Model ids; absent or null: every model the person is granted.
    models: Annotated[list[Id], Meta(max_length=1024)] | None = None


class KeyRotate(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /admin/keys/{id}/rotate``: the old key keeps working ``overlap_s`` seconds."""

    overlap_s: Annotated[int, Meta(ge=0, le=MAX_OVERLAP_S)] = 0


class KeyOperations(ServiceBase):
    """Named keys (mixed into :class:`AdminService`)."""

    @staticmethod
    def _key_json(row: asyncpg.Record) -> dict[str, Any]:
        """A key as listed: never the key itself (only its prefix)."""
        out = row_json(row)
        out["primary"] = row["name"] is None
        expired = row["expires_at"] is not None and row["expires_at"] <= dt.datetime.now(dt.UTC)
        out["current"] = row["status"] == "active" and row["replaced_by"] is None and not expired
        return out

    async def create_key(self, actor: str, user_id: str, body: KeyCreate, kind: str = "user") -> dict[str, Any]:
        """``POST /admin/users/{id}/keys`` (``kind`` user) or ``/admin/applications/{id}/keys``."""
        missing = _missing(kind)
        uid = parse_uuid(user_id, missing)
        name = body.name.strip()
        if not name:
            raise errors.InvalidRequest("name is required")
        moment = _moment(body.expires_at, "expires_at")
        if moment is not None and moment <= dt.datetime.now(dt.UTC):
            raise errors.InvalidRequest("expires_at must be in the future")
        models = None
        if body.models is not None:
            if not body.models:
                raise errors.InvalidRequest("models lists at least one model id (leave it out for every model)")
            try:
                models = sorted({uuid.UUID(m) for m in body.models})
            except ValueError:
                raise errors.InvalidRequest("models lists model ids (UUIDs)") from None
        key, prefix = new_mesh_key()
        digest = self._secrets.hash_key(key)

        async def work(conn: asyncpg.Connection) -> asyncpg.Record:
            # NOTE: the person's row locked, as every key change does: changes to one person's
            # keys take turns (the unique indexes then never see two at once).
            if await conn.fetchval(sql.LOCK_PRINCIPAL, uid, kind) is None:
                raise missing()
            if models:
                found = {r["id"] for r in await conn.fetch(sql.MODELS_EXISTING, models)}
                unknown = [str(m) for m in models if m not in found]
                if unknown:
                    raise errors.InvalidRequest(f"models: no model has the id {', '.join(unknown)}")
            try:
                return await conn.fetchrow(sql.INSERT_NAMED_KEY, uid, digest, prefix, name, moment, models)
            except asyncpg.UniqueViolationError:
                raise errors.KeyNameExists() from None

        row = await self._write(actor, "create_key", str(uid), {"name": name}, work)
        return {**self._key_json(row), "key": key}

    async def list_keys(self, user_id: str, kind: str = "user") -> list[dict[str, Any]]:
        missing = _missing(kind)
        uid = parse_uuid(user_id, missing)
        async with self._pool.acquire() as conn:
            if await conn.fetchval(sql.PRINCIPAL_EXISTS, uid, kind) is None:
                raise missing()
            return [self._key_json(r) for r in await conn.fetch(sql.LIST_USER_KEYS, uid)]

    async def rotate_key_by_id(self, actor: str, key_id: str, body: KeyRotate) -> dict[str, Any]:
        """A new key with the old one's name, models and expiry; the old one works ``overlap_s``
        more seconds (never past its own expiry), or stops at once without an overlap."""
        kid = parse_uuid(key_id, errors.KeyNotFound)
        key, prefix = new_mesh_key()
        digest = self._secrets.hash_key(key)

        async def work(conn: asyncpg.Connection) -> asyncpg.Record:
            owner = await conn.fetchval(sql.KEY_OWNER, kid)
            if owner is None:
                raise errors.KeyNotFound()
            await conn.fetchval(sql.LOCK_USER, owner)
            old = await conn.fetchrow(sql.KEY_FOR_UPDATE, kid)
            if old is None:
                raise errors.KeyNotFound()
            expired = old["expires_at"] is not None and old["expires_at"] <= await conn.fetchval(sql.NOW)
            if old["status"] != "active" or old["replaced_by"] is not None or expired:
                raise errors.KeyNotCurrent()
            until = None
            if body.overlap_s:
                until = await conn.fetchval(sql.NOW_PLUS_SECONDS, body.overlap_s)
            # NOTE: the old key leaves the unique indexes (replaced, by itself for a moment)
            # before its successor takes its place.
            await conn.execute(sql.RETIRE_KEY, kid, kid, until)
            new = await conn.fetchrow(sql.INSERT_NAMED_KEY, old["user_id"], digest, prefix, old["name"],
                                      old["expires_at"], old["models"])
            await conn.execute(sql.SET_REPLACED_BY, kid, new["id"])
            return new

        row = await self._write(actor, "rotate_key", str(kid), {"overlap_s": body.overlap_s}, work)
        return {**self._key_json(row), "key": key}

    async def revoke_key(self, actor: str, key_id: str) -> dict[str, Any]:
        kid = parse_uuid(key_id, errors.KeyNotFound)

        async def work(conn: asyncpg.Connection) -> None:
            owner = await conn.fetchval(sql.KEY_OWNER, kid)
            if owner is None:
                raise errors.KeyNotFound()
            await conn.fetchval(sql.LOCK_USER, owner)
            if await conn.fetchval(sql.KEY_FOR_UPDATE, kid) is None:
                raise errors.KeyNotFound()
            await conn.execute(sql.REVOKE_KEY, kid)

        await self._write(actor, "revoke_key", str(kid), {}, work)
        return {"id": str(kid), "status": "revoked"}
