"""Pilots (API.md "Governed lifecycle"): ``POST /admin/pilots``, ``GET``, ``GET/PUT/DELETE
/admin/pilots/{id}``.

A pilot is a cohort (``members``: user ids) trying ``models`` (names) until ``expires_at``. Its
``tiers`` ladder caps each member's spend on the pilot's models together: a member is governed by
the lowest tier (by amount) whose ``exceptions`` do not list them. ``mode`` is the pilot's own
enforcement (``shadow`` only records ``would_deny``; ``inherit`` follows the global switch).
``authoritative: true`` lets the pilot decide its members' access to its models (served over a
staged or limited status, a roster or restrictions, with the default grant terms when they hold
no grant); otherwise the pilot only adds its spend controls. Rules select a pilot's members with
``population.pilots``. The snapshot build turns all of it into what the core enforces
(:mod:`meshfast.onboarding`).

Every write goes through :func:`apply_pilot` inside one admin write transaction (config bump,
NOTIFY, audit ``pilot.create`` / ``pilot.update`` / ``pilot.delete``), so a later approval queue
can hold the exact checked change and apply it by calling the same function.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Annotated, Any, Literal

import asyncpg
import msgspec
from msgspec import Meta

from meshfast import errors, onboarding, rules, validate
from meshfast.admin.rules import decode_body
from meshfast.store import onboarding as onboarding_sql

WINDOWS = ("daily", "weekly", "monthly")
MODES = ("enforce", "shadow", "inherit")
FIELDS = ("name", "members", "models", "authoritative", "mode", "expires_at", "tiers")
TIER_FIELDS = ("name", "amount_usd", "window", "exceptions")
READ_ONLY = ("id", "version", "created_at", "updated_at", "live")
MAX_MEMBERS = 10_000
MAX_MODELS = 200
MAX_TIERS = 20
NAME_LENGTH = 200

Write = Callable[..., Awaitable[Any]]


# --- wire shapes (the OpenAPI document; bodies are checked by check_pilot, every problem at once) ---


class TierBody(msgspec.Struct, forbid_unknown_fields=True):
    """One rung of the ladder: a cap on the pilot's models together, in a calendar window."""

    name: Annotated[str, Meta(min_length=1, max_length=NAME_LENGTH)]
    amount_usd: Annotated[Decimal, Meta(description="USD, > 0; no two tiers share an amount")]
    window: Literal["daily", "weekly", "monthly"]
    # Members promoted past this tier (governed by the next one up).
    exceptions: Annotated[list[validate.Id], Meta(max_length=MAX_MEMBERS)] = []


class PilotBody(msgspec.Struct, forbid_unknown_fields=True):
    """A pilot as authored."""

    name: Annotated[str, Meta(min_length=1, max_length=NAME_LENGTH)]
    members: Annotated[list[validate.Id], Meta(max_length=MAX_MEMBERS)] = []
    models: Annotated[list[validate.Name], Meta(max_length=MAX_MODELS)] = []
    authoritative: bool = False
    mode: Literal["enforce", "shadow", "inherit"] = "inherit"
    expires_at: Annotated[dt.datetime, Meta(tz=True)] | None = None
    tiers: Annotated[list[TierBody], Meta(max_length=MAX_TIERS)] = []


# --- validation ------------------------------------------------------------------------------


def _moment(value: Any, where: str, problems: list[str]) -> dt.datetime | None:
    """An RFC 3339 time with its offset (a time without one means another instant on every host)."""
    if value is None:
        return None
    if not isinstance(value, str):
        problems.append(f"{where}: must be an RFC 3339 time (a string)")
        return None
    try:
        moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        problems.append(f"{where}: {rules.shown(value)} is not an RFC 3339 time")
        return None
    if moment.tzinfo is None:
        problems.append(f"{where}: needs a timezone offset (e.g. Z or +02:00)")
        return None
    if not validate.EARLIEST <= moment <= validate.LATEST:
        problems.append(f"{where}: must be between {validate.EARLIEST.date()} and {validate.LATEST.date()}")
        return None
    return moment


def _ids(value: Any, where: str, problems: list[str], limit: int) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        problems.append(f"{where}: must be a list of user ids")
        return []
    if len(value) > limit:
        problems.append(f"{where}: has {len(value):,} items; at most {limit:,}")
        return []
    out: list[str] = []
    for i, item in enumerate(value):
        try:
            user_id = str(uuid.UUID(item)) if isinstance(item, str) and len(item) <= 64 else ""
        except ValueError:
            user_id = ""
        if not user_id:
            problems.append(f"{where}[{i}]: {rules.shown(item)} is not a user id")
        elif user_id not in out:
            out.append(user_id)
    return out


async def check_pilot(conn: asyncpg.Connection, body: Any, pilot_id: uuid.UUID | None) -> dict[str, Any]:
    """The pilot as stored (ids canonical, amounts as decimal strings, defaults filled in), or
    400 ``invalid_pilot`` listing every problem: unknown fields, an empty name, unknown members
    or models, a member already enrolled in another live pilot, tiers sharing an amount, an
    exception who is not a member. Runs in the write's transaction, the pilots table locked."""
    problems: list[str] = []
    if not isinstance(body, dict):
        raise errors.InvalidPilot("a pilot must be a JSON object", errors=["a pilot must be a JSON object"])
    body = {k: v for k, v in body.items() if k not in READ_ONLY}
    problems.extend(f"unknown field {rules.shown(k)}" for k in body if k not in FIELDS)
    name = body.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.append("name: is required (a non-empty string)")
        name = ""
    elif len(name.strip()) > NAME_LENGTH or validate.text_problem(name, NAME_LENGTH):
        problems.append(f"name: {validate.text_problem(name, NAME_LENGTH) or 'is too long'}")
    members = _ids(body.get("members"), "members", problems, MAX_MEMBERS)
    listed = body.get("models") or []
    models: list[str] = []
    if not isinstance(listed, list) or len(listed) > MAX_MODELS:
        problems.append(f"models: must be a list of at most {MAX_MODELS} model names")
    else:
        known_models = {row["name"] for row in await conn.fetch(onboarding_sql.MODEL_NAMES)}
        for i, item in enumerate(listed):
            if not isinstance(item, str) or item not in known_models:
                problems.append(f"models[{i}]: unknown model {rules.shown(item)}")
            elif item not in models:
                models.append(item)
    authoritative = body.get("authoritative", False)
    if not isinstance(authoritative, bool):
        problems.append("authoritative: must be true or false")
        authoritative = False
    mode = body.get("mode", "inherit")
    if mode not in MODES:
        problems.append(f"mode: must be one of {', '.join(MODES)}, not {rules.shown(mode)}")
    expires_at = _moment(body.get("expires_at"), "expires_at", problems)
    tiers: list[dict[str, Any]] = []
    raw_tiers = body.get("tiers") or []
    if not isinstance(raw_tiers, list) or len(raw_tiers) > MAX_TIERS:
        problems.append(f"tiers: must be a list of at most {MAX_TIERS} tiers")
        raw_tiers = []
    amounts: dict[Decimal, int] = {}
    for i, tier in enumerate(raw_tiers):
        where = f"tiers[{i}]"
        if not isinstance(tier, dict):
            problems.append(f"{where}: must be an object")
            continue
        problems.extend(f"{where}: unknown field {rules.shown(k)}" for k in tier if k not in TIER_FIELDS)
        tier_name = tier.get("name")
        if not isinstance(tier_name, str) or not tier_name.strip():
            problems.append(f"{where}.name: is required (a non-empty string)")
            tier_name = ""
        amount = rules.threshold(tier.get("amount_usd")) if "amount_usd" in tier else "is required"
        if isinstance(amount, str):
            problems.append(f"{where}.amount_usd: {amount}")
        elif amount in amounts:
            problems.append(f"{where}.amount_usd: {rules.usd_text(amount)} is tiers[{amounts[amount]}]'s amount too "
                            "(each tier has its own amount)")
        else:
            amounts[amount] = i
        window = tier.get("window")
        if window not in WINDOWS:
            problems.append(f"{where}.window: must be one of {', '.join(WINDOWS)}")
        exceptions = _ids(tier.get("exceptions"), f"{where}.exceptions", problems, MAX_MEMBERS)
        for user_id in exceptions:
            if user_id not in members:
                problems.append(f"{where}.exceptions: {rules.shown(user_id)} is not a member of the pilot")
        tiers.append({"name": tier_name.strip(), "amount_usd": amount if isinstance(amount, str) else
                      rules.usd_text(amount), "window": window, "exceptions": exceptions})
    if members:
        people = {row[0] for row in await conn.fetch(onboarding_sql.KNOWN_PEOPLE, members)}
        problems.extend(f"members: unknown user {rules.shown(m)}" for m in members if m not in people)
        await conn.execute(onboarding_sql.LOCK_PILOTS)
        now = dt.datetime.now(dt.UTC)
        for row in await conn.fetch(onboarding_sql.PILOT_ENROLLMENTS):
            if row["id"] == pilot_id or not onboarding.live(row["expires_at"], now):
                continue
            enrolled = set(onboarding._ids(row["members"]))
            problems.extend(f"members: {rules.shown(m)} is already enrolled in the live pilot "
                            f"{rules.shown(row['name'])} ({row['id']})" for m in members if m in enrolled)
    if problems:
        raise errors.InvalidPilot("; ".join(problems), errors=problems)
    return {"name": name.strip(), "members": members, "models": models, "authoritative": authoritative,
            "mode": mode, "expires_at": expires_at, "tiers": tiers}


async def apply_pilot(conn: asyncpg.Connection, pilot_id: uuid.UUID | None, pilot: dict[str, Any] | None,
                      ) -> asyncpg.Record | None:
    """Store a checked pilot (:func:`check_pilot`): a new one (``pilot_id`` None), a replacement,
    or a deletion (``pilot`` None). The one place a pilot is written: an approval queue holding a
    change applies it through here, in its own write transaction."""
    if pilot is None:
        assert pilot_id is not None
        if await conn.fetchval(onboarding_sql.DELETE_PILOT, pilot_id) is None:
            raise errors.PilotNotFound()
        return None
    args = (pilot["name"], json.dumps(pilot["members"]), json.dumps(pilot["models"]), pilot["authoritative"],
            pilot["mode"], pilot["expires_at"], json.dumps(pilot["tiers"]))
    if pilot_id is None:
        return await conn.fetchrow(onboarding_sql.INSERT_PILOT, *args)
    return await conn.fetchrow(onboarding_sql.UPDATE_PILOT, pilot_id, *args)


def pilot_json(row: asyncpg.Record) -> dict[str, Any]:
    """A stored pilot as the API answers it, with ``live`` (not expired)."""

    def moment(value: dt.datetime | None) -> str | None:
        return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")

    return {"id": str(row["id"]), "name": row["name"], "members": onboarding._json(row["members"]),
            "models": onboarding._json(row["models"]), "authoritative": row["authoritative"], "mode": row["mode"],
            "expires_at": moment(row["expires_at"]), "tiers": onboarding._json(row["tiers"]),
            "live": onboarding.live(row["expires_at"], dt.datetime.now(dt.UTC)), "version": row["version"],
            "created_at": moment(row["created_at"]), "updated_at": moment(row["updated_at"])}


def _audited(pilot: dict[str, Any]) -> dict[str, Any]:
    """What the audit row keeps of a pilot write (the whole checked pilot, times as text)."""
    return {**pilot, "expires_at": None if pilot["expires_at"] is None else pilot["expires_at"].isoformat()}


def _pilot_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except (ValueError, AttributeError, TypeError):
        raise errors.PilotNotFound() from None


class PilotService:
    """``/admin/pilots`` over the admin service's write transaction."""

    def __init__(self, pool: asyncpg.Pool, write: Write) -> None:
        self._pool = pool
        self._write = write

    async def list(self) -> list[dict[str, Any]]:
        async with self._pool.acquire() as conn:
            return [pilot_json(row) for row in await conn.fetch(onboarding_sql.LIST_PILOTS)]

    async def get(self, pilot_id: str) -> dict[str, Any]:
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(onboarding_sql.GET_PILOT, _pilot_id(pilot_id))
        if row is None:
            raise errors.PilotNotFound()
        return pilot_json(row)

    async def create(self, actor: str, body: bytes) -> dict[str, Any]:
        draft = decode_body(body)

        detail: dict[str, Any] = {}

        async def work(conn: asyncpg.Connection) -> asyncpg.Record:
            pilot = await check_pilot(conn, draft, None)
            detail.update(_audited(pilot))
            return await apply_pilot(conn, None, pilot)

        row = await self._write(actor, "pilot.create", draft.get("name") if isinstance(draft, dict) else None,
                                detail, work)
        return pilot_json(row)

    async def update(self, actor: str, pilot_id: str, body: bytes, if_match: str | None) -> dict[str, Any]:
        """A whole pilot, only against the version in ``If-Match`` (missing 428, stale 409)."""
        pid = _pilot_id(pilot_id)
        if not if_match:
            raise errors.PreconditionRequired()
        draft = decode_body(body)

        async def work(conn: asyncpg.Connection) -> asyncpg.Record:
            row = await conn.fetchrow(onboarding_sql.PILOT_FOR_UPDATE, pid)
            if row is None:
                raise errors.PilotNotFound()
            if if_match.strip() not in (f'"{row["version"]}"', str(row["version"]), "*"):
                raise errors.VersionConflict()
            pilot = await check_pilot(conn, draft, pid)
            detail.update(_audited(pilot))
            return await apply_pilot(conn, pid, pilot)

        detail: dict[str, Any] = {}
        return pilot_json(await self._write(actor, "pilot.update", str(pid), detail, work))

    async def delete(self, actor: str, pilot_id: str) -> dict[str, Any]:
        pid = _pilot_id(pilot_id)

        async def work(conn: asyncpg.Connection) -> None:
            await apply_pilot(conn, pid, None)

        await self._write(actor, "pilot.delete", str(pid), {}, work)
        return {"status": "deleted"}
