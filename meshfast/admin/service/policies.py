"""Grants, per-model policies and the gateway's kill switch."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import asyncpg
import msgspec

from meshfast import errors, validate
from meshfast.admin.controls import policy_target
from meshfast.admin.service.common import Price, ServiceBase, _body_uuid, _missing, _price, parse_uuid, row_json
from meshfast.store import sql
from meshfast.validate import Id, Int32, Weekdays, Word

if TYPE_CHECKING:  # the routes import this package
    from meshfast.admin.routes import Actor


class AccessBody(msgspec.Struct, forbid_unknown_fields=True):
    """A grant: ``{user_id, model_id}`` or ``{application_id, model_id}``."""

    model_id: Id
    user_id: Id | None = None
    application_id: Id | None = None


def _access_principal(body: AccessBody) -> tuple[uuid.UUID, str]:
    """The grant's principal and its kind: exactly one of user_id and application_id."""
    if (body.user_id is None) == (body.application_id is None):
        raise errors.InvalidRequest("give user_id or application_id, not both")
    if body.user_id is not None:
        return _body_uuid(body.user_id, "user_id"), "user"
    assert body.application_id is not None
    return _body_uuid(body.application_id, "application_id"), "application"


class PolicyBody(msgspec.Struct, forbid_unknown_fields=True):
    daily_cap_usd: Price = Decimal(20)
    max_calls_per_hour: Int32 | None = None
    allowed_from: Word | None = None
    allowed_to: Word | None = None
    timezone: Word = "UTC"
    active_days: Weekdays = msgspec.field(default_factory=lambda: [0, 1, 2, 3, 4, 5, 6])
    always_open: bool = False
    # When the policy goes live: RFC 3339 with its offset, or "local-midnight" (the person's
    # business unit's timezone); absent: now (API.md "Governed lifecycle").
    activate_at: Word | None = None


class KillSwitchBody(msgspec.Struct, forbid_unknown_fields=True):
    tripped: bool


def _hhmm(value: str | None, field: str) -> dt.time | None:
    if value is None:
        return None
    try:
        hours, minutes = value.split(":")
        if len(hours) != 2 or len(minutes) != 2:
            raise ValueError
        return dt.time(int(hours), int(minutes))
    except ValueError:
        raise errors.InvalidRequest(f"{field} must be HH:MM") from None


class AccessOperations(ServiceBase):
    """Grants, policies and the kill switch (mixed into :class:`AdminService`)."""

    async def _check_pair(self, conn: asyncpg.Connection, user_id: uuid.UUID, model_id: uuid.UUID,
                          kind: str = "user") -> None:
        if await conn.fetchval(sql.PRINCIPAL_EXISTS, user_id, kind) is None:
            raise _missing(kind)()
        if await conn.fetchval(sql.MODEL_EXISTS, model_id) is None:
            raise errors.ModelNotFound()

    async def grant(self, actor: str, body: AccessBody) -> dict[str, Any]:
        """``POST /admin/access`` with ``{user_id, model_id}`` or ``{application_id, model_id}``."""
        uid, kind = _access_principal(body)
        mid = _body_uuid(body.model_id, "model_id")

        async def work(conn: asyncpg.Connection) -> None:
            await self._check_pair(conn, uid, mid, kind)
            await conn.execute(sql.GRANT_ACCESS, uid, mid)

        await self._write(actor, "grant_access", f"{uid}:{mid}", {}, work)
        return {"status": "ok"}

    async def revoke_grant(self, actor: str, body: AccessBody) -> dict[str, Any]:
        uid, kind = _access_principal(body)
        mid = _body_uuid(body.model_id, "model_id")

        async def work(conn: asyncpg.Connection) -> None:
            if await conn.fetchval(sql.PRINCIPAL_EXISTS, uid, kind) is None:
                raise _missing(kind)()
            await conn.execute(sql.REVOKE_ACCESS, uid, mid)

        await self._write(actor, "revoke_access", f"{uid}:{mid}", {}, work)
        return {"status": "ok"}

    async def list_access(self, user_id: str) -> list[dict[str, Any]]:
        uid = _body_uuid(user_id, "user_id")
        async with self._pool.acquire() as conn:
            return [row_json(r) for r in await conn.fetch(sql.LIST_ACCESS, uid)]

    async def put_policy(self, actor: Actor, user_id: str, model_id: str, body: PolicyBody,
                         kind: str = "user") -> dict[str, Any]:
        """A person's (or an application's) policy for one model, through the lifecycle: a
        business-unit administrator's raise waits for approval (``status: pending``)."""
        uid = parse_uuid(user_id, _missing(kind))
        mid = parse_uuid(model_id, errors.ModelNotFound)
        cap = _price(body.daily_cap_usd, "daily_cap_usd")
        if body.max_calls_per_hour is not None and body.max_calls_per_hour < 1:
            raise errors.InvalidRequest("max_calls_per_hour must be at least 1 or null")
        if any(not 0 <= d <= 6 for d in body.active_days):
            raise errors.InvalidRequest("active_days holds integers 0-6 (0 = Sunday)")
        allowed_from = _hhmm(body.allowed_from, "allowed_from")
        allowed_to = _hhmm(body.allowed_to, "allowed_to")
        async with self._pool.acquire() as conn:
            # NOTE: a name only one side knows would put the window somewhere else (the core
            # reads an unknown zone as UTC), so both must know it.
            timezone = validate.timezone(body.timezone, "timezone", await validate.load_timezones(conn))
        assert cap is not None
        proposed = {"principal_kind": kind, "daily_cap_usd": format(cap.normalize(), "f"),
                    "max_calls_per_hour": body.max_calls_per_hour,
                    "allowed_from": None if allowed_from is None else allowed_from.strftime("%H:%M"),
                    "allowed_to": None if allowed_to is None else allowed_to.strftime("%H:%M"),
                    "timezone": timezone, "active_days": sorted(set(body.active_days)), "always_open": body.always_open}
        outcome = await self.lifecycle.write(actor, "policy", policy_target(uid, mid), "update", proposed,
                                             body.activate_at, audit_action="update_policy")
        if outcome.pending:
            return outcome.reply()
        if outcome.status == "scheduled":
            return {"status": "scheduled", **outcome.detail()}
        return {"status": "ok"}

    async def list_policies(self, user_id: str, kind: str = "user") -> list[dict[str, Any]]:
        missing = _missing(kind)
        uid = parse_uuid(user_id, missing)
        async with self._pool.acquire() as conn:
            if await conn.fetchval(sql.PRINCIPAL_EXISTS, uid, kind) is None:
                raise missing()
            rows = [row_json(r) for r in await conn.fetch(sql.LIST_POLICIES, uid)]
            states = await self.lifecycle.revisions("policy", [policy_target(uid, r["model_id"]) for r in rows], conn)
        return [{**r, **states[policy_target(uid, r["model_id"])]} for r in rows]

    async def set_kill_switch(self, actor: str, body: KillSwitchBody) -> dict[str, Any]:
        async def work(conn: asyncpg.Connection) -> bool:
            return bool(await conn.fetchval(sql.SET_KILL_SWITCH, body.tripped))

        action = "pause_gateway" if body.tripped else "resume_gateway"
        state = await self._write(actor, action, "gateway", {}, work)
        return {"kill_switch": state}
