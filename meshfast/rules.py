"""Spend rules: the admin API's rule (people by id, models by name, USD as decimals) and the
core's config form (indexes, nano-USD). See API.md "Organisation and spend rules".

Validation of a rule as authored lives here too (``validate``), listing every problem.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from meshfast import errors, snapshot
from meshfast.validate import Id, Label, Name, text_problem

WINDOWS = ("daily", "weekly", "monthly")
MODES = ("enforce", "shadow", "inherit")
ACTIONS = ("block", "pause", "warn", "notify")
CHANNELS = ("webhook", "email")


def _indexes(ids: list[Any] | None, index: dict[str, int]) -> tuple[list[int], bool]:
    """The known ids' indexes, and whether the list named someone and all of them are gone."""
    if not ids:
        return [], False
    found = [index[str(i)] for i in ids if str(i) in index]
    return found, not found


def entry_config(entry: dict[str, Any], principal_index: dict[str, int], model_index: dict[str, int],
                 pilots: Mapping[str, list[int]] | None = None) -> snapshot.RuleEntry | None:
    """One authored entry (already valid) as the core's; None when it can match nobody any more
    (every leader it named, or the model of its scope, was deleted; every pilot it named is gone,
    expired or empty): dropping a gone leader or pilot must never widen the population to
    everyone. ``pilots``: each live pilot's members (principal indexes) by pilot id."""
    population = entry.get("population") or {}
    principals: list[int] = []
    if population.get("pilots"):
        live = pilots or {}
        principals = sorted({p for pilot in population["pilots"] for p in live.get(str(pilot), ())})
        if not principals:
            return None
    leaders, gone = _indexes(population.get("leaders"), principal_index)
    if gone:
        return None
    exempt, _ = _indexes(population.get("exempt_users"), principal_index)
    # Applications deleted since: the entry holds to those left, and to nobody when none is.
    applications, gone = _indexes(population.get("applications"), principal_index)
    if gone:
        return None
    scope = entry.get("scope") or {}
    model = None
    if scope.get("model") is not None:
        if scope["model"] not in model_index:
            return None
        model = model_index[scope["model"]]
    threshold = entry.get("threshold_usd")
    return snapshot.RuleEntry(
        window=entry.get("window") or "daily",
        actions=[
            snapshot.RuleAction(
                type=a["type"], hours=int(a.get("hours") or 0), text=a.get("text") or "",
                channels=list(a.get("channels") or []), template=a.get("template"),
            )
            for a in entry.get("actions") or []
        ],
        tiers=list(population.get("tiers") or []),
        leaders=leaders,
        business_units=list(population.get("business_units") or []),
        exempt=exempt,
        applications=applications,
        principals=principals,
        tag=scope.get("tag"),
        model=model,
        threshold_nano=None if threshold is None else snapshot.usd_to_nanos(threshold),
        calls_per_minute=entry.get("calls_per_minute"),
        tokens_per_minute=entry.get("tokens_per_minute"),
    )


def to_config(rule: dict[str, Any], principal_index: dict[str, int], model_index: dict[str, int],
              pilots: Mapping[str, list[int]] | None = None) -> snapshot.Rule:
    """A stored rule as the core's. ``principal_index``: user id (str) -> principal index;
    ``model_index``: model name -> model index; ``pilots``: live pilots' members by pilot id.
    Entries that can match nobody are left out, but keep their position's number: the core
    reports entries by ``entry_numbers``' values."""
    entries = []
    numbers = []
    for number, entry in enumerate(rule.get("entries") or []):
        config = entry_config(entry, principal_index, model_index, pilots)
        if config is not None:
            entries.append(config)
            numbers.append(number)
    return snapshot.Rule(id=rule["id"], weight=int(rule.get("weight") or 0), mode=rule.get("mode") or "inherit",
                         entries=entries, entry_numbers=numbers)


# --- validation of a rule as authored --------------------------------------------------------

SLUG = re.compile(r"[a-z0-9-]{1,64}\Z")
MAX_WEIGHT = 1_000_000
MAX_ENTRIES = 100
# People or labels in one population or restriction list.
MAX_LIST = 1_000
MAX_THRESHOLD_USD = Decimal(10**9)
THRESHOLD_DECIMALS = 9
MAX_PER_MINUTE = 10**9
MAX_PAUSE_HOURS = 720
MAX_WARN_TEXT = 500
MAX_TEMPLATE = 4_000
LABEL_LENGTH = 200  # a tier or business unit, as users carry them (validate.Label)
TAG_LENGTH = 254  # a registry tag (validate.Name)
# A body can name a problem in every one of its 100 entries' 1,000 leaders: the answer lists the first ones.
MAX_ERRORS = 100
# What GET answers beside the authored shape; a PUT or a file may carry them back (they are ignored).
READ_ONLY = ("version", "created_at", "updated_at", "saved_revision", "enforced_revision", "scheduled",
             "activation_error")

RULE_FIELDS = ("id", "weight", "mode", "entries")
ENTRY_FIELDS = ("population", "scope", "window", "threshold_usd", "calls_per_minute", "tokens_per_minute", "actions")
POPULATION_FIELDS = ("tiers", "leaders", "business_units", "exempt_users", "applications", "pilots")
# How a set of known principals marks an application's id (people are bare ids): a leader or an
# exempt user must be a person, an entry of `applications` an application.
APPLICATION_MARK = "application:"
# How a set of known principals marks a pilot's id (population.pilots must name existing pilots).
PILOT_MARK = "pilot:"
ACTION_FIELDS = {"block": ("type",), "pause": ("type", "hours"), "warn": ("type", "text"),
                 "notify": ("type", "channels", "template")}
# Rank of a window's length: a shorter window's block threshold may not exceed a longer one's.
_WINDOW_RANK = {"daily": 0, "weekly": 1, "monthly": 2}


class _Problems(list[str]):
    """Every problem, up to MAX_ERRORS (then one line saying how many more there were)."""

    dropped = 0

    def add(self, problem: str) -> None:
        if len(self) < MAX_ERRORS:
            self.append(problem)
        else:
            self.dropped += 1

    def listed(self) -> list[str]:
        return [*self, *([f"... and {self.dropped} more problems"] if self.dropped else [])]


def shown(value: Any) -> str:
    """A value for an error message: quoted, escaped (NUL, surrogates), at most 64 characters."""
    text = value if isinstance(value, str) else str(value)
    return repr(text[:64] + ("…" if len(text) > 64 else ""))


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _unknown(fields: dict[str, Any], known: tuple[str, ...], where: str, problems: _Problems) -> None:
    for key in fields:
        if key not in known:
            problems.add(f"{where}: unknown field {shown(key)}")


def _text(value: Any, where: str, max_length: int, problems: _Problems, *, printable: bool = False) -> str | None:
    """A non-empty string PostgreSQL can store (stripped), or None with the problem added."""
    if not isinstance(value, str):
        problems.add(f"{where}: must be a string, not {_kind(value)}")
        return None
    why = text_problem(value, max_length)
    if why is None and printable and not (value.isascii() and value.isprintable()):
        why = "may hold only printable ASCII characters (it travels in a response header)"
    if why is not None:
        problems.add(f"{where}: {why}")
        return None
    if not value.strip():
        problems.add(f"{where}: may not be empty")
        return None
    return value.strip()


def _integer(value: Any, where: str, low: int, high: int, problems: _Problems) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        problems.add(f"{where}: must be an integer, not {_kind(value)}")
        return None
    if not low <= value <= high:
        problems.add(f"{where}: must be between {low:,} and {high:,}")
        return None
    return value


def threshold(value: Any) -> Decimal | str:
    """A threshold in USD (a JSON number or a numeric string) as a Decimal, or why it is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return f"must be a decimal number of USD (a number or a numeric string), not {_kind(value)}"
    if isinstance(value, str) and (len(value) > 64 or not re.fullmatch(r"-?[0-9]*\.?[0-9]*([eE][-+]?[0-9]+)?", value)):
        return f"must be a decimal number of USD, not {shown(value)}"
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return f"must be a decimal number of USD, not {shown(value)}"
    if not amount.is_finite() or amount <= 0:
        return "must be greater than 0"
    if amount > MAX_THRESHOLD_USD:
        return f"must be at most {MAX_THRESHOLD_USD:,} USD"
    exponent = amount.normalize().as_tuple().exponent
    if isinstance(exponent, int) and exponent < -THRESHOLD_DECIMALS:
        return f"may have at most {THRESHOLD_DECIMALS} decimals"
    return amount


def usd_text(amount: Decimal) -> str:
    """A threshold as the API answers it: a decimal string without exponent or trailing zeros ("250", "0.5")."""
    return format(amount.normalize(), "f")


def _user_id(value: Any, where: str, known_users: set[str] | None, problems: _Problems,
             emails: Mapping[str, str] | None = None) -> str | None:
    if not isinstance(value, str):
        problems.add(f"{where}: must be a user id (a string), not {_kind(value)}")
        return None
    if emails is not None and "@" in value:
        if value.strip().lower() not in emails:
            problems.add(f"{where}: unknown user {shown(value)}")
            return None
        value = emails[value.strip().lower()]
    try:
        user_id = str(uuid.UUID(value)) if len(value) <= 64 else ""
    except ValueError:
        user_id = ""
    if not user_id:
        problems.add(f"{where}: {shown(value)} is not a user id")
        return None
    if known_users is not None and user_id not in known_users:
        problems.add(f"{where}: unknown user {shown(value)}")
        return None
    return user_id


def _list(value: Any, where: str, problems: _Problems, max_items: int = MAX_LIST) -> list[Any] | None:
    if not isinstance(value, list):
        problems.add(f"{where}: must be a list, not {_kind(value)}")
        return None
    if len(value) > max_items:
        problems.add(f"{where}: has {len(value):,} items; at most {max_items:,}")
        return None
    return value


def _people(value: Any, where: str, known_users: set[str] | None, problems: _Problems,
            emails: Mapping[str, str] | None = None) -> list[str]:
    items = [] if value is None else _list(value, where, problems)
    out: list[str] = []
    for i, item in enumerate(items or ()):
        user_id = _user_id(item, f"{where}[{i}]", known_users, problems, emails)
        if user_id is not None and user_id not in out:
            out.append(user_id)
    return out


def _labels(value: Any, where: str, problems: _Problems) -> list[str]:
    items = [] if value is None else _list(value, where, problems)
    out: list[str] = []
    for i, item in enumerate(items or ()):
        label = _text(item, f"{where}[{i}]", LABEL_LENGTH, problems)
        if label is not None and label not in out:
            out.append(label)
    return out


def _population(value: Any, where: str, known_users: set[str] | None, problems: _Problems) -> dict[str, Any]:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        problems.add(f"{where}: must be an object, not {_kind(value)}")
        return {}
    _unknown(value, POPULATION_FIELDS, where, problems)
    out = {
        "tiers": _labels(value.get("tiers"), f"{where}.tiers", problems),
        "leaders": _people(value.get("leaders"), f"{where}.leaders", known_users, problems),
        "business_units": _labels(value.get("business_units"), f"{where}.business_units", problems),
        # An application may be exempted as a person is.
        "exempt_users": _people(value.get("exempt_users"), f"{where}.exempt_users", _with_applications(known_users),
                                problems),
    }
    # NOTE: kept only when it names some, so every rule stored before applications keeps its shape.
    if value.get("applications") is not None:
        listed = _applications(value["applications"], f"{where}.applications", known_users, problems)
        if listed:
            out["applications"] = listed
    # NOTE: kept only when it names some, as applications.
    if value.get("pilots") is not None:
        pilots = _pilots(value["pilots"], f"{where}.pilots", known_users, problems)
        if pilots:
            out["pilots"] = pilots
    return out


def _pilots(value: Any, where: str, known: set[str] | None, problems: _Problems) -> list[str]:
    """Pilot ids (a cohort: the members of the listed pilots while they are live)."""
    items = _list(value, where, problems)
    out: list[str] = []
    for i, item in enumerate(items or ()):
        try:
            pilot_id = str(uuid.UUID(item)) if isinstance(item, str) and len(item) <= 64 else ""
        except ValueError:
            pilot_id = ""
        if not pilot_id:
            problems.add(f"{where}[{i}]: {shown(item) if isinstance(item, str) else _kind(item)} is not a pilot id")
        elif known is not None and PILOT_MARK + pilot_id not in known:
            problems.add(f"{where}[{i}]: unknown pilot {shown(item)}")
        elif pilot_id not in out:
            out.append(pilot_id)
    return out


def _with_applications(known: set[str] | None) -> set[str] | None:
    """``known`` with its applications' ids bare (as people's are): a list either may name."""
    if known is None:
        return None
    return known | {k[len(APPLICATION_MARK):] for k in known if k.startswith(APPLICATION_MARK)}


def _applications(value: Any, where: str, known: set[str] | None, problems: _Problems) -> list[str]:
    items = _list(value, where, problems)
    out: list[str] = []
    for i, item in enumerate(items or ()):
        try:
            app_id = str(uuid.UUID(item)) if isinstance(item, str) and len(item) <= 64 else ""
        except ValueError:
            app_id = ""
        if not app_id:
            problems.add(f"{where}[{i}]: {shown(item) if isinstance(item, str) else _kind(item)} is not an "
                         "application id")
        elif known is not None and APPLICATION_MARK + app_id not in known:
            problems.add(f"{where}[{i}]: unknown application {shown(item)}")
        elif app_id not in out:
            out.append(app_id)
    return out


def _scope(value: Any, where: str, models: Mapping[str, str] | None, problems: _Problems) -> dict[str, str] | None:
    if not isinstance(value, dict):
        problems.add(f"{where}: must be {{\"tag\": T}} or {{\"model\": NAME}}, not {_kind(value)}")
        return None
    _unknown(value, ("tag", "model"), where, problems)
    if ("tag" in value) == ("model" in value):
        problems.add(f"{where}: needs exactly one of tag and model")
        return None
    if "tag" in value:
        tag = _text(value["tag"], f"{where}.tag", TAG_LENGTH, problems)
        return None if tag is None else {"tag": tag}
    name = _text(value["model"], f"{where}.model", TAG_LENGTH, problems)
    if name is None:
        return None
    if models is not None:
        if name not in models:
            problems.add(f"{where}: unknown model {shown(name)}")
            return None
        name = models[name]
    return {"model": name}


def _action(value: Any, where: str, has_threshold: bool, problems: _Problems) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        problems.add(f"{where}: must be an object, not {_kind(value)}")
        return None
    kind = value.get("type")
    if kind not in ACTIONS:
        problems.add(f"{where}.type: must be one of {', '.join(ACTIONS)}"
                     + ("" if kind is None else f", not {shown(kind)}"))
        return None
    _unknown(value, ACTION_FIELDS[kind], where, problems)
    if not has_threshold and kind != "block":
        problems.add(f"{where}: {kind} needs the entry's threshold_usd")
    action: dict[str, Any] = {"type": kind}
    if kind == "pause":
        if "hours" not in value:
            problems.add(f"{where}.hours: is required for pause")
        action["hours"] = _integer(value.get("hours"), f"{where}.hours", 1, MAX_PAUSE_HOURS, problems)
    elif kind == "warn":
        if "text" not in value:
            problems.add(f"{where}.text: is required for warn")
        else:
            action["text"] = _text(value["text"], f"{where}.text", MAX_WARN_TEXT, problems, printable=True)
    elif kind == "notify":
        channels = _list(value.get("channels"), f"{where}.channels", problems, len(CHANNELS) * 4)
        if channels is not None:
            if not channels:
                problems.add(f"{where}.channels: name at least one of {', '.join(CHANNELS)}")
            bad = [c for c in channels if c not in CHANNELS]
            if bad:
                problems.add(f"{where}.channels: {', '.join(shown(c) for c in bad[:4])} not one of "
                             f"{', '.join(CHANNELS)}")
            elif len(set(channels)) != len(channels):
                problems.add(f"{where}.channels: lists a channel twice")
            action["channels"] = [c for c in CHANNELS if c in channels]
        if value.get("template") is not None:
            template = value["template"]
            if not isinstance(template, str):
                problems.add(f"{where}.template: must be a string, not {_kind(template)}")
            else:
                why = text_problem(template, MAX_TEMPLATE)
                if why is not None:
                    problems.add(f"{where}.template: {why}")
                action["template"] = template
    return action


def _entry(value: Any, where: str, known_users: set[str] | None, models: Mapping[str, str] | None,
           problems: _Problems) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        problems.add(f"{where}: must be an object, not {_kind(value)}")
        return None
    _unknown(value, ENTRY_FIELDS, where, problems)
    before = len(problems) + problems.dropped
    entry: dict[str, Any] = {
        "population": _population(value.get("population"), f"{where}.population", known_users, problems)}
    if "scope" not in value:
        problems.add(f"{where}.scope: is required ({{\"tag\": T}} or {{\"model\": NAME}})")
    entry["scope"] = _scope(value.get("scope"), f"{where}.scope", models, problems) if "scope" in value else None
    amount: Decimal | None = None
    if value.get("threshold_usd") is not None:
        parsed = threshold(value["threshold_usd"])
        if isinstance(parsed, str):
            problems.add(f"{where}.threshold_usd: {parsed}")
        else:
            amount = parsed
    has_threshold = value.get("threshold_usd") is not None
    window = value.get("window")
    if window is None:
        if has_threshold:
            problems.add(f"{where}.window: is required with threshold_usd ({', '.join(WINDOWS)})")
    elif window not in WINDOWS:
        problems.add(f"{where}.window: must be one of {', '.join(WINDOWS)}, not {shown(window)}")
    entry["window"] = window
    entry["threshold_usd"] = None if amount is None else usd_text(amount)
    for cap in ("calls_per_minute", "tokens_per_minute"):
        entry[cap] = None if value.get(cap) is None else _integer(value[cap], f"{where}.{cap}", 1, MAX_PER_MINUTE,
                                                                  problems)
    if not has_threshold and value.get("calls_per_minute") is None and value.get("tokens_per_minute") is None:
        problems.add(f"{where}: needs threshold_usd, calls_per_minute or tokens_per_minute")
    actions: list[dict[str, Any]] = []
    listed = [] if value.get("actions") is None else _list(value["actions"], f"{where}.actions", problems,
                                                           len(ACTIONS) * 4)
    for i, item in enumerate(listed or ()):
        action = _action(item, f"{where}.actions[{i}]", has_threshold, problems)
        if action is None:
            continue
        if any(a["type"] == action["type"] for a in actions):
            problems.add(f"{where}.actions[{i}]: a second {action['type']} action (one of each type per entry)")
            continue
        actions.append(action)
    entry["actions"] = actions
    return entry if len(problems) + problems.dropped == before else None


def _rule(body: Any, known_users: set[str] | None, models: Mapping[str, str] | None,
          problems: _Problems) -> dict[str, Any] | None:
    """The rule in its stored form (every default filled in, people as canonical ids, models by
    name, thresholds as decimal strings), adding every problem; None when there is one."""
    if not isinstance(body, dict):
        problems.add(f"the rule must be a JSON object, not {_kind(body)}")
        return None
    _unknown(body, RULE_FIELDS, "rule", problems)
    rule_id = body.get("id")
    if not isinstance(rule_id, str) or not SLUG.match(rule_id):
        problems.add("id: " + ("is required" if rule_id is None else
                               f"must be 1 to 64 of a-z, 0-9 and '-', not {shown(rule_id)}"))
    weight = 0 if body.get("weight") is None else _integer(body["weight"], "weight", -MAX_WEIGHT, MAX_WEIGHT,
                                                           problems)
    mode = "inherit" if body.get("mode") is None else body["mode"]
    if mode not in MODES:
        problems.add(f"mode: must be one of {', '.join(MODES)}, not {shown(mode)}")
    entries = _list(body.get("entries"), "entries", problems, MAX_ENTRIES) if "entries" in body else None
    if "entries" not in body:
        problems.add("entries: is required (a list of 1 to 100 entries)")
    elif entries is not None and not entries:
        problems.add("entries: needs at least one entry")
    out = [_entry(e, f"entries[{i}]", known_users, models, problems) for i, e in enumerate(entries or ())]
    if problems:
        return None
    return {"id": rule_id, "weight": weight, "mode": mode, "entries": out}


def _caps(rule: dict[str, Any]) -> list[tuple[str, int, str, Decimal, str]]:
    """The rule's block thresholds: (population and scope as a key, entry number, window, USD, rule id)."""
    out = []
    for number, entry in enumerate(rule.get("entries") or ()):
        if entry.get("threshold_usd") is None or not any(a.get("type") == "block" for a in entry.get("actions") or ()):
            continue
        population = entry.get("population") or {}
        key = json.dumps([{k: sorted(population.get(k) or []) for k in POPULATION_FIELDS}, entry.get("scope")],
                         sort_keys=True)
        out.append((key, number, entry.get("window") or "daily", Decimal(str(entry["threshold_usd"])), rule["id"]))
    return out


def _conflicts(rule: dict[str, Any], others: list[dict[str, Any]], problems: _Problems) -> None:
    """A daily block above the weekly (or monthly) one, or a weekly above the monthly one, of the
    same population and scope, in this rule or against another stored rule."""
    mine = _caps(rule)
    theirs = [cap for other in others if other.get("id") != rule["id"] for cap in _caps(other)]
    for i, (key, number, window, amount, _) in enumerate(mine):
        for other_key, other_number, other_window, other_amount, other_id in mine[i + 1:] + theirs:
            if key != other_key or window == other_window:
                continue
            here = f"entries[{number}]"
            there = f"entries[{other_number}]"
            if other_id != rule["id"]:
                there = f"rule {other_id!r} {there}"
            shorter, longer = ((here, window, amount), (there, other_window, other_amount))
            if _WINDOW_RANK[window] > _WINDOW_RANK[other_window]:
                shorter, longer = longer, shorter
            if shorter[2] > longer[2]:
                problems.add(f"{here}: the {shorter[1]} block threshold of {shorter[0]} ({usd_text(shorter[2])} USD) "
                             f"is above the {longer[1]} one of {longer[0]} ({usd_text(longer[2])} USD), for the "
                             "same population and scope")


def conflicts(rule: dict[str, Any], others: list[dict[str, Any]]) -> list[str]:
    """The unordered caps between ``rule`` and ``others`` (all in stored form)."""
    problems = _Problems()
    _conflicts(rule, others, problems)
    return problems.listed()


def validate(body: Any, known_users: set[str] | None, known_models: set[str] | Mapping[str, str] | None,
             known_tags: set[str], others: list[dict[str, Any]]) -> list[str]:
    """Every problem of a rule as authored (API.md "Organisation and spend rules"); [] when it is
    valid. ``known_users``: user ids (canonical strings); ``known_models``: model names and
    aliases (a mapping gives each one's model name, so an alias and its name are one scope);
    ``others``: the other stored rules (stored form), checked for unordered caps. ``None`` for
    users or models skips those references (a registry file checked before the database).
    Tags need not be on a model yet (a model may gain one later); ``known_tags`` is not used to
    refuse."""
    return check(body, known_users, known_models, others)[1]


def check(body: Any, known_users: set[str] | None, known_models: set[str] | Mapping[str, str] | None,
          others: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, list[str]]:
    """:func:`validate`, and the rule as stored when there is no problem."""
    problems = _Problems()
    models = None if known_models is None else (
        known_models if isinstance(known_models, Mapping) else {name: name for name in known_models})
    rule = _rule(body, known_users, models, problems)
    if rule is not None:
        _conflicts(rule, others, problems)
    return (None if problems else rule), problems.listed()


def referenced_pilots(body: Any) -> list[str]:
    """The pilot ids a body's populations name (a rule, or a file's rules), as canonical strings."""
    return _referenced(body, ("pilots",))


def referenced_users(body: Any) -> list[str]:
    """The user ids a body names (leaders, exempt users, restriction lists), as canonical strings,
    so a write checks just those against the users table."""
    return _referenced(body, ("leaders", "exempt_users", "applications", *RESTRICTION_PEOPLE))


def _referenced(body: Any, keys: tuple[str, ...]) -> list[str]:
    """The ids (canonical strings) in the lists held under ``keys`` anywhere in ``body``."""
    out: set[str] = set()
    # NOTE: a walk with a depth bound (rules nest 7 deep): a body nested 900 deep decodes fine
    # but would overflow a recursive walk.
    stack: list[tuple[Any, str | None, int]] = [(body, None, 0)]
    while stack:
        value, key, depth = stack.pop()
        if depth > 16:
            continue
        if isinstance(value, dict):
            stack.extend((v, k, depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            for item in value:
                if key in keys and isinstance(item, str):
                    try:
                        out.add(str(uuid.UUID(item)))
                    except ValueError:
                        pass
                else:
                    stack.append((item, key, depth + 1))
    return sorted(out)


# --- model restrictions ----------------------------------------------------------------------

RESTRICTION_PEOPLE = ("leader_deny", "leader_allow", "exempt")
RESTRICTION_UNITS = ("business_units_closed", "business_units_open")
# Lists that may be null (no allow list); the others are lists.
RESTRICTION_NULLABLE = ("leader_allow", "business_units_open")


def check_restrictions(value: Any, known_users: set[str] | None, emails: Mapping[str, str] | None = None,
                       where: str = "restrictions") -> tuple[dict[str, Any] | None, list[str]]:
    """A model's restrictions as stored (user ids as canonical strings, labels stripped, the
    allow lists null when absent) and every problem. ``emails`` (email -> user id) lets a
    registry file name people by email as well."""
    problems = _Problems()
    if not isinstance(value, dict):
        problems.add(f"{where}: must be an object, not {_kind(value)}")
        return None, problems.listed()
    _unknown(value, (*RESTRICTION_PEOPLE, *RESTRICTION_UNITS), where, problems)
    out: dict[str, Any] = {}
    for field in RESTRICTION_PEOPLE:
        given = value.get(field)
        if given is None:
            out[field] = None if field in RESTRICTION_NULLABLE else []
            continue
        out[field] = _people(given, f"{where}.{field}", known_users, problems, emails)
    for field in RESTRICTION_UNITS:
        given = value.get(field)
        out[field] = (None if field in RESTRICTION_NULLABLE else []) if given is None else \
            _labels(given, f"{where}.{field}", problems)
    both = set(out["leader_deny"]) & set(out["leader_allow"] or ())
    if both:
        problems.add(f"{where}: {shown(sorted(both)[0])} is both in leader_deny and leader_allow")
    both = set(out["business_units_closed"]) & set(out["business_units_open"] or ())
    if both:
        problems.add(f"{where}: business unit {shown(sorted(both)[0])} is both closed and open")
    return (None if problems else out), problems.listed()


# --- wire shapes (the admin API's OpenAPI document) --------------------------------------------
# NOTE: bodies are checked by :func:`check` (every problem at once), not decoded into these; they
# state the same shape and limits for the document, and a test holds a valid rule against them.

People = Annotated[list[Id], Meta(max_length=MAX_LIST)]
Labels = Annotated[list[Label], Meta(max_length=MAX_LIST)]
PerMinute = Annotated[int, Meta(ge=1, le=MAX_PER_MINUTE)]


class PopulationBody(msgspec.Struct, forbid_unknown_fields=True):
    """AND across the lists, OR within one; an empty list matches everyone; ``leaders`` are user ids."""

    tiers: Labels = []
    leaders: People = []
    business_units: Labels = []
    exempt_users: People = []
    # Application ids: the entry holds to these applications only.
    applications: People = []
    # Pilot ids: the entry holds to the members of these pilots while they are live (none: nobody).
    pilots: People = []


class ScopeBody(msgspec.Struct, forbid_unknown_fields=True):
    """Exactly one of a registry tag and a model (name or alias)."""

    tag: Name | None = None
    model: Name | None = None


class ActionBody(msgspec.Struct, forbid_unknown_fields=True):
    """block; pause {hours}; warn {text} (printable ASCII: it travels in X-Meshfast-Warning);
    notify {channels, template?}. One action of each type per entry."""

    type: Literal["block", "pause", "warn", "notify"]
    hours: Annotated[int, Meta(ge=1, le=MAX_PAUSE_HOURS)] | None = None
    text: Annotated[str, Meta(min_length=1, max_length=MAX_WARN_TEXT)] | None = None
    channels: Annotated[list[Literal["webhook", "email"]], Meta(min_length=1, max_length=2)] | None = None
    template: Annotated[str, Meta(max_length=MAX_TEMPLATE)] | None = None


class EntryBody(msgspec.Struct, forbid_unknown_fields=True):
    """A threshold (with its window) or per-minute caps, or both; actions other than block need
    the threshold."""

    scope: ScopeBody
    population: PopulationBody | None = None
    window: Literal["daily", "weekly", "monthly"] | None = None
    threshold_usd: Annotated[Decimal, Meta(description="USD, > 0, at most 1e9, at most 9 decimals")] | None = None
    calls_per_minute: PerMinute | None = None
    tokens_per_minute: PerMinute | None = None
    actions: Annotated[list[ActionBody], Meta(max_length=len(ACTIONS))] = []


class RuleBody(msgspec.Struct, forbid_unknown_fields=True):
    """A spend rule as authored (API.md "Organisation and spend rules")."""

    id: Annotated[str, Meta(pattern="^[a-z0-9-]{1,64}$", min_length=1, max_length=64)]
    entries: Annotated[list[EntryBody], Meta(min_length=1, max_length=MAX_ENTRIES)]
    weight: Annotated[int, Meta(ge=-MAX_WEIGHT, le=MAX_WEIGHT)] = 0
    mode: Literal["enforce", "shadow", "inherit"] = "inherit"
    # Not part of the rule: when a create or PUT goes live (RFC 3339 with an offset, or
    # "local-midnight" in the business unit's timezone); absent: at once.
    activate_at: Annotated[str, Meta(max_length=64)] | None = None


class RestrictionsBody(msgspec.Struct, forbid_unknown_fields=True):
    """Who may see a model: people by user id, business units by name; null allow lists allow everyone."""

    leader_deny: People = []
    leader_allow: People | None = None
    exempt: People = []
    business_units_closed: Labels = []
    business_units_open: Labels | None = None


class EnforcementBody(msgspec.Struct, forbid_unknown_fields=True):
    """The global switch: rules in mode ``inherit`` enforce when it is on (per-user policies always do)."""

    enforce: bool


# --- dry-run -----------------------------------------------------------------------------------


def dry_run(core: Any, config: snapshot.Config, rule: dict[str, Any], now_ms: int,
            pilots: Mapping[str, list[int]] | None = None) -> bytes:
    """The core's answer for a draft ``rule`` (stored form) against the snapshot ``config`` it
    has loaded, from its current counters: the JSON body ``{"affected": [...]}``. Writes nothing.
    ``pilots``: the live pilots' members (principal indexes) of that snapshot, by pilot id."""
    answer = getattr(core, "dry_run", None)
    if answer is None:
        raise errors.DryRunUnavailable("this build's core has no dry-run")
    principal_index = {p.id: i for i, p in enumerate(config.principals)}
    model_index = {m.name: i for i, m in enumerate(config.models)}
    draft = to_config(rule, principal_index, model_index, pilots)
    return bytes(answer(msgspec.msgpack.encode(draft), now_ms))
