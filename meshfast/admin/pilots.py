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

A pilot is a control under the governed lifecycle (the kind ``pilot``, registered here): a
business-unit administrator's write that relaxes it (:func:`classify_pilot`) waits for approval
(202), any write takes ``activate_at``, reads show ``saved_revision`` and ``enforced_revision``.
:func:`check_pilot` runs at submission, at approval and at activation; :func:`apply_pilot` is the
one place a pilot is written (audited ``pilot.create`` / ``pilot.update`` / ``pilot.delete``).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any, Literal

import asyncpg
import msgspec
from msgspec import Meta

from meshfast import errors, onboarding, rules, validate
from meshfast.admin import controls
from meshfast.admin.changes import Lifecycle, Outcome, record_enforced
from meshfast.admin.rules import decode_body
from meshfast.store import onboarding as onboarding_sql
from meshfast.store import rules as rules_sql

if TYPE_CHECKING:  # the routes import this module
    from meshfast.admin.routes import Actor

WINDOWS = ("daily", "weekly", "monthly")
MODES = ("enforce", "shadow", "inherit")
FIELDS = ("name", "members", "models", "authoritative", "mode", "expires_at", "tiers")
TIER_FIELDS = ("name", "amount_usd", "window", "exceptions")
# What a read adds (a pilot as GET answered it may come back in a PUT).
READ_ONLY = ("id", "version", "created_at", "updated_at", "live", "saved_revision", "enforced_revision", "scheduled",
             "activation_error")
MAX_MEMBERS = 10_000
MAX_MODELS = 200
MAX_TIERS = 20
NAME_LENGTH = 200


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
    # When the write goes live: RFC 3339 with an offset, or "local-midnight" (not part of the pilot).
    activate_at: Annotated[str, Meta(max_length=64)] | None = None


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
    """Store a checked pilot (:func:`check_pilot`): a new one (``pilot_id`` None, or an id no
    pilot has: a create decided through the lifecycle), a replacement, or a deletion (``pilot``
    None). The one place a pilot is written."""
    if pilot is None:
        assert pilot_id is not None
        if await conn.fetchval(onboarding_sql.DELETE_PILOT, pilot_id) is None:
            raise errors.PilotNotFound()
        return None
    args = (pilot["name"], json.dumps(pilot["members"]), json.dumps(pilot["models"]), pilot["authoritative"],
            pilot["mode"], pilot["expires_at"], json.dumps(pilot["tiers"]))
    if pilot_id is None:
        return await conn.fetchrow(onboarding_sql.INSERT_PILOT, *args)
    row = await conn.fetchrow(onboarding_sql.UPDATE_PILOT, pilot_id, *args)
    return row if row is not None else await conn.fetchrow(onboarding_sql.INSERT_PILOT_WITH_ID, pilot_id, *args)


def pilot_json(row: asyncpg.Record) -> dict[str, Any]:
    """A stored pilot as the API answers it, with ``live`` (not expired)."""

    def moment(value: dt.datetime | None) -> str | None:
        return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")

    return {"id": str(row["id"]), "name": row["name"], "members": onboarding._json(row["members"]),
            "models": onboarding._json(row["models"]), "authoritative": row["authoritative"], "mode": row["mode"],
            "expires_at": moment(row["expires_at"]), "tiers": onboarding._json(row["tiers"]),
            "live": onboarding.live(row["expires_at"], dt.datetime.now(dt.UTC)), "version": row["version"],
            "created_at": moment(row["created_at"]), "updated_at": moment(row["updated_at"])}


# --- the pilot as a control (API.md "Governed lifecycle") --------------------------------------


def _instant(value: Any) -> dt.datetime | None:
    if value is None or isinstance(value, dt.datetime):
        return value
    return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _text(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def pilot_state(pilot: Any) -> dict[str, Any]:
    """A pilot as the lifecycle keeps it (JSON: ``expires_at`` as RFC 3339 text), from a checked
    pilot (:func:`check_pilot`) or a stored row."""
    return {"name": pilot["name"], "members": onboarding._ids(pilot["members"]),
            "models": list(onboarding._json(pilot["models"]) or []), "authoritative": pilot["authoritative"],
            "mode": pilot["mode"], "expires_at": _text(_instant(pilot["expires_at"])),
            "tiers": list(onboarding._json(pilot["tiers"]) or [])}


_MODE_RANK = {"shadow": 0, "inherit": 1, "enforce": 2}
_WINDOW_RANK = {"daily": 0, "weekly": 1, "monthly": 2}
_EMPTY: dict[str, Any] = {"name": "", "members": [], "models": [], "authoritative": False, "mode": "enforce",
                          "expires_at": None, "tiers": []}


def _ends_no_later(new: Any, old: Any) -> bool:
    """``new`` expiry (None: never) comes no later than ``old``."""
    new_at, old_at = _instant(new), _instant(old)
    return old_at is None or (new_at is not None and new_at <= old_at)


def _tier_of(pilot: dict[str, Any], user_id: str) -> dict[str, Any] | None:
    tiers = pilot.get("tiers") or []
    index = onboarding.governing_tier(tiers, user_id) if tiers and pilot.get("models") else None
    return None if index is None else tiers[index]


def _access_not_wider(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """An authoritative pilot serves its members its models until it expires (over any status,
    roster or restriction): the new one serves nobody anything the old did not, for no longer."""
    if not new["authoritative"] or not new["members"] or not new["models"]:
        return True
    return bool(old["authoritative"]) and set(new["members"]) <= set(old["members"]) and \
        set(new["models"]) <= set(old["models"]) and _ends_no_later(new["expires_at"], old["expires_at"])


def _caps_not_looser(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """The tier ladder: every member the old ladder governed is governed by the new one, until no
    earlier, by a tier as low over a window as long, over at least the old models, in a mode as
    strong (shadow < inherit < enforce)."""
    if _MODE_RANK.get(new["mode"], 1) < _MODE_RANK.get(old["mode"], 1):
        return False
    for member in old["members"]:
        was = _tier_of(old, member)
        if was is None:
            continue
        now = _tier_of(new, member) if member in new["members"] else None
        if now is None or not _ends_no_later(old["expires_at"], new["expires_at"]):
            return False
        if Decimal(str(now["amount_usd"])) > Decimal(str(was["amount_usd"])):
            return False
        if _WINDOW_RANK.get(now["window"], 0) < _WINDOW_RANK.get(was["window"], 0):
            return False
        if not set(new["models"]) >= set(old["models"]):
            return False
    return True


def classify_pilot(old: dict[str, Any] | None, new: dict[str, Any] | None) -> controls.Direction:
    """A pilot's change. A pilot both widens access (an authoritative one serves its members its
    models, staged or limited, without a grant) and caps spend (its tier ladder), so fewer members
    is not simply tighter: it tightens only when neither side loosens.

    - Access (authoritative): adding members or models, making it authoritative, a later expiry
      relax; removing members or models, making it not authoritative, an earlier expiry tighten.
    - Caps (tiers over the pilot's models): lowering an amount, adding a tier, a longer window, a
      stronger mode tighten; raising an amount, removing a tier, adding an exception, a shorter
      window, enforce to shadow or inherit relax. A member who leaves a pilot whose ladder
      governed them, a model leaving it, or an earlier expiry of such a pilot frees them of the
      cap: relaxing (whatever access they lose with it). A pilot that is not authoritative only
      caps: a member or a model added to it tightens.
    - A deletion relaxes (unless there was nothing); a creation is a change from an empty pilot
      (a non-authoritative one only adds caps: tightening).
    - Anything mixed relaxes.

    Rules name pilots (``population.pilots``): a member leaving, or an earlier expiry, also takes
    them out of those rules. This function sees the pilot alone; :func:`loosens_rules` adds that
    (the kind's ``loosens_others``).
    """
    if new is None:
        return controls.TIGHTEN if old is None else controls.RELAX
    before, after = {**_EMPTY, **(old or {})}, {**_EMPTY, **new}
    if old is None:
        before["mode"] = after["mode"]
    if _access_not_wider(before, after) and _caps_not_looser(before, after):
        return controls.TIGHTEN
    return controls.RELAX


def leaves_cohort(old: dict[str, Any] | None, new: dict[str, Any] | None) -> bool:
    """Whether someone in the old pilot is out of it sooner: a member removed, or an earlier expiry."""
    if old is None or not old.get("members"):
        return False
    if new is None or not set(old["members"]) <= set(new.get("members") or ()):
        return True
    return not _ends_no_later(old.get("expires_at"), new.get("expires_at"))


async def loosens_rules(conn: asyncpg.Connection, target: str, old: Any, new: Any) -> bool:
    """A member leaving a pilot (or its earlier expiry) leaves the populations of the rules that
    name it: relaxing when a stored rule does."""
    return leaves_cohort(old, new) and bool(await conn.fetchval(onboarding_sql.PILOT_NAMED_BY_RULES, target))


def _target(value: str) -> uuid.UUID:
    return _pilot_id(value)


async def _load(conn: asyncpg.Connection, target: str) -> dict[str, Any] | None:
    row = await conn.fetchrow(onboarding_sql.GET_PILOT, _target(target))
    return None if row is None else pilot_state(row)


async def _check(conn: asyncpg.Connection, target: str, action: str, proposed: Any) -> dict[str, Any] | None:
    """:func:`check_pilot` (every problem, double enrollment under the pilots' lock), at submission,
    approval and activation; a delete needs the pilot."""
    pid = _target(target)
    if action == "delete":
        if await conn.fetchval(onboarding_sql.PILOT_FOR_UPDATE, pid) is None:
            raise errors.PilotNotFound()
        return None
    if action == "update" and await conn.fetchval(onboarding_sql.PILOT_FOR_UPDATE, pid) is None:
        raise errors.PilotNotFound()
    return pilot_state(await check_pilot(conn, proposed, pid))


async def _apply(conn: asyncpg.Connection, target: str, action: str, state: Any) -> None:
    if state is None:
        await apply_pilot(conn, _target(target), None)
        return
    await apply_pilot(conn, _target(target), {**state, "expires_at": _instant(state["expires_at"])})


async def member_units(conn: asyncpg.Connection, members: Any) -> dict[str, str | None]:
    """Each known member's business unit (None: no unit)."""
    ids = onboarding._ids(members)
    if not ids:
        return {}
    return {row["id"]: row["business_unit"] for row in await conn.fetch(onboarding_sql.MEMBER_UNITS, ids)}


async def _units(conn: asyncpg.Connection, target: str, state: Any) -> set[str]:
    """The unit the pilot's members share (none when they span several, or one has none): the
    change's unit when the caller has none of its own."""
    units = set((await member_units(conn, (state or {}).get("members"))).values())
    return {unit for unit in units if unit is not None} if len(units) == 1 else set()


PILOT = controls.register(controls.ControlKind("pilot", _load, _check, _apply, classify_pilot, _units,
                                               registry=True, loosens_others=loosens_rules))


def _pilot_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except (ValueError, AttributeError, TypeError):
        raise errors.PilotNotFound() from None


def _activate_at(draft: Any) -> tuple[Any, Any]:
    """A pilot body without its ``activate_at`` (when the write goes live; not part of the pilot)."""
    if isinstance(draft, dict) and "activate_at" in draft:
        draft = dict(draft)
        return draft, draft.pop("activate_at")
    return draft, None


class PilotService:
    """``/admin/pilots``: every write goes through the lifecycle (the kind ``pilot``)."""

    def __init__(self, pool: asyncpg.Pool, lifecycle: Lifecycle) -> None:
        self._pool = pool
        self._lifecycle = lifecycle

    async def _with_revisions(self, pilots: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Pilots as read, each with ``saved_revision`` and ``enforced_revision`` (and ``scheduled``
        / ``activation_error``; see :meth:`Lifecycle.revisions`)."""
        states = await self._lifecycle.revisions("pilot", [p["id"] for p in pilots])
        return [{**p, **states[p["id"]]} for p in pilots]

    async def list(self, units: frozenset[str] | None = None) -> list[dict[str, Any]]:
        """Every pilot; with ``units`` (a business-unit administrator's), those whose members are
        all in them."""
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(onboarding_sql.LIST_PILOTS)
            if units is not None:
                everyone = [m for row in rows for m in onboarding._ids(row["members"])]
                known = await member_units(conn, everyone)
                rows = [row for row in rows if all(known.get(m, "") in units for m in onboarding._ids(row["members"]))]
        return await self._with_revisions([pilot_json(row) for row in rows])

    async def get(self, pilot_id: str) -> dict[str, Any]:
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(onboarding_sql.GET_PILOT, _pilot_id(pilot_id))
        if row is None:
            raise errors.PilotNotFound()
        return (await self._with_revisions([pilot_json(row)]))[0]

    async def _answer(self, outcome: Outcome, pilot_id: str) -> dict[str, Any]:
        """A write's answer: the pending change (202), or the pilot as read now (one whose creation
        is only scheduled: the pilot as it will be, version 0)."""
        if outcome.pending:
            return outcome.reply()
        try:
            return await self.get(pilot_id)
        except errors.PilotNotFound:
            states = await self._lifecycle.revisions("pilot", [pilot_id])
            return {"id": pilot_id, **outcome.body, "live": False, "version": 0, "created_at": None,
                    "updated_at": None, **states[pilot_id]}

    async def create(self, actor: Actor, body: bytes) -> dict[str, Any]:
        draft, activate_at = _activate_at(decode_body(body))
        pilot_id = str(uuid.uuid4())
        outcome = await self._lifecycle.write(actor, "pilot", pilot_id, "create", draft, activate_at,
                                              audit_action="pilot.create")
        return await self._answer(outcome, pilot_id)

    async def update(self, actor: Actor, pilot_id: str, body: bytes, if_match: str | None) -> dict[str, Any]:
        """A whole pilot, only against the version in ``If-Match`` (missing 428, stale 409)."""
        pid = _pilot_id(pilot_id)
        if not if_match:
            raise errors.PreconditionRequired()
        draft, activate_at = _activate_at(decode_body(body))

        async def current(conn: asyncpg.Connection) -> None:
            version = await conn.fetchval(onboarding_sql.PILOT_FOR_UPDATE, pid)
            if version is None:
                raise errors.PilotNotFound()
            if if_match.strip() not in (f'"{version}"', str(version), "*"):
                raise errors.VersionConflict()

        outcome = await self._lifecycle.write(actor, "pilot", str(pid), "update", draft, activate_at,
                                              audit_action="pilot.update", precheck=current)
        return await self._answer(outcome, str(pid))

    async def delete(self, actor: Actor, pilot_id: str, activate_at: str | None = None) -> dict[str, Any]:
        pid = str(_pilot_id(pilot_id))
        outcome = await self._lifecycle.write(actor, "pilot", pid, "delete", None, activate_at,
                                              audit_action="pilot.delete")
        if outcome.pending:
            return outcome.reply()
        if outcome.status == "scheduled":
            return {"status": "scheduled", "revision": outcome.revision, "activate_at": outcome.detail()["activate_at"]}
        return {"status": "deleted"}


# --- registry files ------------------------------------------------------------------------------


def _emails(value: Any, where: str, problems: list[str]) -> list[str]:
    """A file's list of people by email (lower case, each once)."""
    if value is None:
        return []
    if not isinstance(value, list):
        problems.append(f"{where}: must be a list of emails")
        return []
    out: list[str] = []
    for i, item in enumerate(value):
        email = item.strip().lower() if isinstance(item, str) else ""
        if "@" not in email or len(email) > validate.MAX_TEXT:
            problems.append(f"{where}[{i}]: {rules.shown(item)} is not an email")
        elif email not in out:
            out.append(email)
    return out


def parse_file_pilots(entries: list[Any]) -> list[str]:
    """A registry file's ``pilots`` checked on their own (people and models are checked when the
    file is applied): each an object with a name, listed once, people named by email; every
    problem, each labelled with its pilot."""
    problems: list[str] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        label = f"pilots[{i}]" + (f" ({name!r})" if isinstance(name, str) else "")
        if not isinstance(entry, dict):
            problems.append(f"{label}: must be an object")
            continue
        found: list[str] = [f"unknown field {rules.shown(k)}" for k in entry if k not in FIELDS]
        if not isinstance(name, str) or not name.strip():
            found.append("name: is required (a non-empty string)")
        elif name.strip() in seen:
            found.append("a pilot of that name is listed twice")
        else:
            seen.add(name.strip())
        _emails(entry.get("members"), "members", found)
        tiers = entry.get("tiers") or []
        if isinstance(tiers, list):
            for j, tier in enumerate(tiers):
                if isinstance(tier, dict):
                    _emails(tier.get("exceptions"), f"tiers[{j}].exceptions", found)
        problems.extend(f"{label}: {p}" for p in found)
    return problems


def _with_ids(entry: dict[str, Any], ids: Mapping[str, str], problems: list[str]) -> dict[str, Any]:
    """A file's pilot as the API takes it: people by id (an unknown email is a problem)."""

    def people(value: Any, where: str) -> list[str]:
        out = []
        for email in _emails(value, where, problems):
            if email in ids:
                out.append(ids[email])
            else:
                problems.append(f"{where}: {email!r} is not a registered user")
        return out

    draft = {**entry, "members": people(entry.get("members"), "members")}
    if isinstance(entry.get("tiers"), list):
        draft["tiers"] = [{**t, "exceptions": people(t.get("exceptions"), f"tiers[{j}].exceptions")}
                          if isinstance(t, dict) else t for j, t in enumerate(entry["tiers"])]
    return draft


async def apply_file_pilots(conn: asyncpg.Connection, entries: list[dict[str, Any]], summary: dict[str, list[str]],
                            by: str) -> list[str]:
    """A registry file's pilots, matched by name: created, left unchanged, or set to exactly the
    file (a field left out takes its default), each checked as an API write is
    (:func:`check_pilot`) and recorded as an enforced revision; every problem (then the caller
    rolls back). After the file's models and people (a pilot may name them).

    NOTE: in the file's order: a person moved from one live pilot to another is refused as
    enrolled twice when the pilot they join comes first (list the one they leave first)."""
    ids = {row["email"]: row["id"] for row in await conn.fetch(rules_sql.USER_EMAILS)}
    stored: dict[str, list[asyncpg.Record]] = {}
    for row in await conn.fetch(onboarding_sql.LIST_PILOTS):
        stored.setdefault(row["name"], []).append(row)
    problems: list[str] = []
    for entry in entries:
        name = str(entry["name"]).strip()
        label = f"pilot {name!r}"
        rows = stored.get(name, [])
        if len(rows) > 1:
            problems.append(f"{label}: {len(rows)} pilots have that name (a file names one)")
            continue
        found: list[str] = []
        draft = _with_ids(entry, ids, found)
        pid = rows[0]["id"] if rows else uuid.uuid4()
        try:
            checked = await check_pilot(conn, draft, pid)
        except errors.MeshfastError as exc:
            found.extend(p for p in exc.extra.get("errors", [exc.detail]) if p not in found)
        if found:
            problems.extend(f"{label}: {p}" for p in found)
            continue
        state = pilot_state(checked)
        if rows and pilot_state(rows[0]) == state:
            summary["unchanged"].append(f"pilot {name}")
            continue
        await apply_pilot(conn, pid, checked)
        await record_enforced(conn, "pilot", str(pid), "update" if rows else "create", state, by)
        summary["updated" if rows else "created"].append(f"pilot {name}")
    return problems
