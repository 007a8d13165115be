"""Controls under the governed lifecycle (API.md "Governed lifecycle"): what a control kind is
(how to read its stored state, check a proposed one, tell tightening from relaxing, apply it in
a transaction), the registry of kinds, and the kinds this module defines: spend rules, a model's
restrictions and a person's per-model policy.

A kind registers once with :func:`register`; the lifecycle (:mod:`meshfast.admin.changes`) then
queues, schedules, approves and activates its changes without knowing more about it.

Classification is by pure functions over the stored shapes, one per kind: ``TIGHTEN`` when the
new state refuses at least everything the old one refused (nothing anyone could do before becomes
possible), else ``RELAX``. A change that tightens one thing and relaxes another is a ``RELAX``;
so is anything these functions cannot prove tighter (a rule's scope moved to another model, a
policy's hours moved to another timezone).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Awaitable, Callable, Iterable
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

import asyncpg

from meshfast import errors, rules
from meshfast.store import changes as changes_sql
from meshfast.store import rules as rules_sql

Direction = Literal["tighten", "relax"]
TIGHTEN: Direction = "tighten"
RELAX: Direction = "relax"
Action = Literal["create", "update", "delete"]
ACTIONS = ("create", "update", "delete")


@dataclasses.dataclass(frozen=True, slots=True)
class ControlKind:
    """One kind of control. ``target`` is the control's id as a string (a rule's id, a model's
    id, ``<user id>:<model id>``); a state is the control as stored (JSON-able), None when absent.

    - ``load(conn, target)``: the stored state, or None.
    - ``check(conn, target, action, proposed)``: the proposed state as it would be stored, checked
      against the current database (people and models exist, caps ordered, ...), or a
      :class:`errors.MeshfastError`; a delete's proposed state is None. Called at submission and
      again when a scheduled revision or an approved change is applied.
    - ``apply(conn, target, action, state)``: write it to the live table (in the caller's
      transaction; raise to refuse, e.g. the control vanished).
    - ``classify(old, new)``: ``TIGHTEN`` or ``RELAX`` (pure).
    - ``units(conn, target, state)``: the business units the control names (for the change's unit,
      "local-midnight" and a unit administrator's view of the queue).
    - ``change``: what a worker reloads (the NOTIFY hint: ``rules``; "" rebuilds the snapshot).
    - ``registry``: the write holds the registry lock (rules and models are checked under it).
    """

    name: str
    load: Callable[[asyncpg.Connection, str], Awaitable[Any]]
    check: Callable[[asyncpg.Connection, str, str, Any], Awaitable[Any]]
    apply: Callable[[asyncpg.Connection, str, str, Any], Awaitable[None]]
    classify: Callable[[Any, Any], Direction]
    units: Callable[[asyncpg.Connection, str, Any], Awaitable[set[str]]]
    change: str = ""
    registry: bool = False


KINDS: dict[str, ControlKind] = {}


def register(kind: ControlKind) -> ControlKind:
    """Puts ``kind`` under the lifecycle (once per name)."""
    if kind.name in KINDS and KINDS[kind.name] is not kind:
        raise ValueError(f"control kind {kind.name!r} is registered twice")
    KINDS[kind.name] = kind
    return kind


def kind_of(name: str) -> ControlKind:
    try:
        return KINDS[name]
    except KeyError:
        raise errors.InvalidRequest(f"no control kind {name!r}") from None


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


# --- classification helpers -------------------------------------------------------------------


def _decimal(value: Any) -> Decimal | None:
    if value is None:
        return None
    try:
        return Decimal(str(value))
    except InvalidOperation:
        return None


def _cap_not_looser(old: Any, new: Any) -> bool:
    """A cap (None: no cap) is not looser when it exists wherever the old one did, and is lower or equal."""
    old_d, new_d = _decimal(old), _decimal(new)
    if old_d is None:
        return True
    return new_d is not None and new_d <= old_d


def _matches_at_least(old: Iterable[Any] | None, new: Iterable[Any] | None) -> bool:
    """A population list (empty or None: everyone) matching at least whom the old one matched."""
    old_set, new_set = set(old or ()), set(new or ())
    if not new_set:
        return True
    return bool(old_set) and new_set >= old_set


def _allow_list_not_wider(old: Iterable[Any] | None, new: Iterable[Any] | None) -> bool:
    """An allow list (None: everyone allowed) allowing at most whom the old one allowed."""
    if new is None:
        return old is None
    return old is None or set(new) <= set(old)


# --- spend rules ----------------------------------------------------------------------------------

_MODE_RANK = {"shadow": 0, "inherit": 1, "enforce": 2}
_WINDOW_RANK = {"daily": 0, "weekly": 1, "monthly": 2}


def _actions_not_looser(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> bool:
    by_type = {a.get("type"): a for a in new}
    for action in old:
        kept = by_type.get(action.get("type"))
        if kept is None:
            return False
        if action.get("type") == "pause" and int(kept.get("hours") or 0) < int(action.get("hours") or 0):
            return False
        if action.get("type") == "notify" and not set(kept.get("channels") or ()) >= set(action.get("channels") or ()):
            return False
    return True


def _entry_not_looser(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """``new`` refuses at least what ``old`` refused: the same scope, a population at least as
    wide, caps as low, a window as long and every action kept (a pause as long)."""
    if (old.get("scope") or {}) != (new.get("scope") or {}):
        return False
    old_pop, new_pop = old.get("population") or {}, new.get("population") or {}
    for field in ("tiers", "leaders", "business_units", "applications"):
        if not _matches_at_least(old_pop.get(field), new_pop.get(field)):
            return False
    if not set(new_pop.get("exempt_users") or ()) <= set(old_pop.get("exempt_users") or ()):
        return False
    if not _cap_not_looser(old.get("threshold_usd"), new.get("threshold_usd")):
        return False
    # Spend in a longer window is at least the spend in a shorter one: the same threshold over a
    # month refuses sooner than over a day.
    if old.get("threshold_usd") is not None and \
            _WINDOW_RANK.get(new.get("window") or "daily", 0) < _WINDOW_RANK.get(old.get("window") or "daily", 0):
        return False
    for field in ("calls_per_minute", "tokens_per_minute"):
        if not _cap_not_looser(old.get(field), new.get(field)):
            return False
    return _actions_not_looser(old.get("actions") or [], new.get("actions") or [])


def classify_rule(old: dict[str, Any] | None, new: dict[str, Any] | None) -> Direction:
    """A spend rule's change. Every enforcing entry can refuse a call (weight only orders them),
    so a new rule only adds refusals (tightens) and a deleted one relaxes. An edited rule
    tightens when its mode is not weaker (shadow < inherit < enforce) and each old entry is
    covered by a new entry that is not looser (added entries only tighten)."""
    if new is None:
        return TIGHTEN if old is None else RELAX
    if old is None:
        return TIGHTEN
    if _MODE_RANK.get(new.get("mode") or "inherit", 1) < _MODE_RANK.get(old.get("mode") or "inherit", 1):
        return RELAX
    new_entries = new.get("entries") or []
    for entry in old.get("entries") or []:
        if not any(_entry_not_looser(entry, candidate) for candidate in new_entries):
            return RELAX
    return TIGHTEN


def _rule_units(state: dict[str, Any] | None) -> set[str]:
    out: set[str] = set()
    for entry in (state or {}).get("entries") or []:
        out.update((entry.get("population") or {}).get("business_units") or ())
    return out


async def _load_rule(conn: asyncpg.Connection, target: str) -> dict[str, Any] | None:
    return _json(await conn.fetchval(changes_sql.RULE_BODY, target))


async def _check_rule(conn: asyncpg.Connection, target: str, action: str, proposed: Any) -> dict[str, Any] | None:
    from meshfast.admin import rules as rule_admin  # the admin rules module imports this one

    if action == "delete":
        return None
    stored = await rule_admin.stored_rules(conn)
    rule = await rule_admin.checked(conn, proposed, [r for i, r in stored.items() if i != target])
    if rule["id"] != target:
        raise rule_admin.invalid([f"id: the body names {rules.shown(rule['id'])}, the change {target!r}"])
    return rule


async def _apply_rule(conn: asyncpg.Connection, target: str, action: str, state: Any) -> None:
    if action == "delete":
        if await conn.fetchval(rules_sql.DELETE_RULE, target) is None:
            raise errors.RuleNotFound()
        return
    body = json.dumps(state)
    if await conn.fetchrow(rules_sql.UPDATE_RULE, target, body) is None:
        await conn.execute(rules_sql.INSERT_RULE, target, body)


async def _rule_units_of(conn: asyncpg.Connection, target: str, state: Any) -> set[str]:
    return _rule_units(state)


RULE = register(ControlKind("rule", _load_rule, _check_rule, _apply_rule, classify_rule, _rule_units_of,
                            change="rules", registry=True))


# --- model restrictions ---------------------------------------------------------------------------


def classify_restrictions(old: dict[str, Any] | None, new: dict[str, Any] | None) -> Direction:
    """A model's restrictions (None: none). Tightening: more people denied, fewer allowed (an
    allow list where there was none), fewer exemptions, more units closed, fewer open."""
    old, new = old or {}, new or {}
    if not set(new.get("leader_deny") or ()) >= set(old.get("leader_deny") or ()):
        return RELAX
    if not _allow_list_not_wider(old.get("leader_allow"), new.get("leader_allow")):
        return RELAX
    if not set(new.get("exempt") or ()) <= set(old.get("exempt") or ()):
        return RELAX
    if not set(new.get("business_units_closed") or ()) >= set(old.get("business_units_closed") or ()):
        return RELAX
    if not _allow_list_not_wider(old.get("business_units_open"), new.get("business_units_open")):
        return RELAX
    return TIGHTEN


def _model_id(target: str) -> Any:
    from meshfast.admin.service.common import parse_uuid

    return parse_uuid(target, errors.ModelNotFound)


async def _load_restrictions(conn: asyncpg.Connection, target: str) -> dict[str, Any] | None:
    return _json(await conn.fetchval(changes_sql.MODEL_RESTRICTIONS, _model_id(target)))


async def _check_restrictions(conn: asyncpg.Connection, target: str, action: str, proposed: Any) -> Any:
    from meshfast.admin import rules as rule_admin
    from meshfast.store import sql

    if await conn.fetchval(sql.MODEL_EXISTS, _model_id(target)) is None:
        raise errors.ModelNotFound()
    if action == "delete" or proposed is None:
        return None
    known = await rule_admin.known_users(conn, {"restrictions": proposed})
    stored, problems = rules.check_restrictions(proposed, known)
    if stored is None:
        raise errors.InvalidRequest("; ".join(problems), errors=problems)
    return stored


async def _apply_restrictions(conn: asyncpg.Connection, target: str, action: str, state: Any) -> None:
    from meshfast.store import sql

    mid = _model_id(target)
    if await conn.fetchval(sql.MODEL_EXISTS, mid) is None:
        raise errors.ModelNotFound()
    await conn.execute(rules_sql.SET_RESTRICTIONS, mid, None if state is None else json.dumps(state))


async def _restriction_units(conn: asyncpg.Connection, target: str, state: Any) -> set[str]:
    state = state or {}
    return set(state.get("business_units_closed") or ()) | set(state.get("business_units_open") or ())


RESTRICTIONS = register(ControlKind("restrictions", _load_restrictions, _check_restrictions, _apply_restrictions,
                                    classify_restrictions, _restriction_units, registry=True))


# --- per-person policies ---------------------------------------------------------------------------

# What a person without a policy row gets (sql.LIST_POLICIES' defaults).
DEFAULT_POLICY: dict[str, Any] = {"daily_cap_usd": "20", "max_calls_per_hour": None, "allowed_from": None,
                                  "allowed_to": None, "timezone": "UTC", "active_days": [0, 1, 2, 3, 4, 5, 6],
                                  "always_open": False}
_DAY_MINUTES = 24 * 60


def _minutes(allowed_from: str | None, allowed_to: str | None) -> set[int]:
    """The open minutes of a local day, as the core reads a window: none (or from == to) is the
    whole day; from > to runs overnight."""
    if allowed_from is None or allowed_to is None:
        return set(range(_DAY_MINUTES))
    start = int(allowed_from[:2]) * 60 + int(allowed_from[3:5])
    end = int(allowed_to[:2]) * 60 + int(allowed_to[3:5])
    if start < end:
        return set(range(start, end))
    if start > end:
        return set(range(0, end)) | set(range(start, _DAY_MINUTES))
    return set(range(_DAY_MINUTES))


def classify_policy(old: dict[str, Any] | None, new: dict[str, Any] | None) -> Direction:
    """A person's per-model policy (None: the defaults). Tightening: a lower daily cap, an hourly
    cap where there was none or a lower one, fewer days, fewer hours (in the same timezone), and
    always_open turned off; removing the policy falls back to the defaults."""
    old, new = old or DEFAULT_POLICY, new or DEFAULT_POLICY
    if not _cap_not_looser(old.get("daily_cap_usd"), new.get("daily_cap_usd")):
        return RELAX
    if not _cap_not_looser(old.get("max_calls_per_hour"), new.get("max_calls_per_hour")):
        return RELAX
    if new.get("always_open") and not old.get("always_open"):
        return RELAX
    if old.get("always_open"):
        return TIGHTEN
    if not set(new.get("active_days") or ()) <= set(old.get("active_days") or ()):
        return RELAX
    old_minutes = _minutes(old.get("allowed_from"), old.get("allowed_to"))
    new_minutes = _minutes(new.get("allowed_from"), new.get("allowed_to"))
    if not new_minutes <= old_minutes:
        return RELAX
    if new.get("timezone") != old.get("timezone") and \
            (new_minutes != set(range(_DAY_MINUTES)) or set(new.get("active_days") or ()) != set(range(7))):
        return RELAX  # the same hours elsewhere open at other instants
    return TIGHTEN


def policy_target(principal_id: Any, model_id: Any) -> str:
    return f"{principal_id}:{model_id}"


def _policy_ids(target: str) -> tuple[Any, Any]:
    from meshfast.admin.service.common import parse_uuid

    principal, _, model = target.partition(":")
    return parse_uuid(principal, errors.UserNotFound), parse_uuid(model, errors.ModelNotFound)


def policy_state(row: asyncpg.Record) -> dict[str, Any]:
    """A stored policy as the lifecycle keeps it (times as HH:MM, the cap as a decimal string)."""
    return {"daily_cap_usd": str(Decimal(row["daily_cap_usd"]).normalize()),
            "max_calls_per_hour": row["max_calls_per_hour"],
            "allowed_from": None if row["allowed_from"] is None else row["allowed_from"].strftime("%H:%M"),
            "allowed_to": None if row["allowed_to"] is None else row["allowed_to"].strftime("%H:%M"),
            "timezone": row["timezone"], "active_days": sorted(row["active_days"]),
            "always_open": row["always_open"]}


async def _load_policy(conn: asyncpg.Connection, target: str) -> dict[str, Any] | None:
    row = await conn.fetchrow(changes_sql.GET_POLICY, *_policy_ids(target))
    return None if row is None else policy_state(row)


async def _check_policy(conn: asyncpg.Connection, target: str, action: str, proposed: Any) -> Any:
    """The principal and the model exist (the body was checked when the route decoded it)."""
    from meshfast.store import sql

    principal, model = _policy_ids(target)
    kind = proposed.get("principal_kind", "user") if isinstance(proposed, dict) else "user"
    if await conn.fetchval(sql.PRINCIPAL_EXISTS, principal, kind) is None:
        raise errors.ApplicationNotFound() if kind == "application" else errors.UserNotFound()
    if await conn.fetchval(sql.MODEL_EXISTS, model) is None:
        raise errors.ModelNotFound()
    return proposed


def _time(value: str | None) -> dt.time | None:
    return None if value is None else dt.time(int(value[:2]), int(value[3:5]))


async def _apply_policy(conn: asyncpg.Connection, target: str, action: str, state: Any) -> None:
    from meshfast.store import sql

    principal, model = _policy_ids(target)
    await conn.execute(sql.UPSERT_POLICY, principal, model, Decimal(state["daily_cap_usd"]),
                       state["max_calls_per_hour"], _time(state["allowed_from"]), _time(state["allowed_to"]),
                       state["timezone"], state["active_days"], state["always_open"])


async def _policy_units(conn: asyncpg.Connection, target: str, state: Any) -> set[str]:
    unit = await conn.fetchval(changes_sql.PRINCIPAL_UNIT, _policy_ids(target)[0])
    return {unit} if unit else set()


POLICY = register(ControlKind("policy", _load_policy, _check_policy, _apply_policy, classify_policy,
                              _policy_units))
