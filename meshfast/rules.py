"""Spend rules: the admin API's rule (people by id, models by name, USD as decimals) and the
core's config form (indexes, nano-USD). See API.md "Organisation and spend rules".

Validation of a rule as authored lives here too (``validate``), listing every problem.
"""

from __future__ import annotations

from typing import Any

from meshfast import snapshot

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


def entry_config(entry: dict[str, Any], principal_index: dict[str, int],
                 model_index: dict[str, int]) -> snapshot.RuleEntry | None:
    """One authored entry (already valid) as the core's; None when it can match nobody any more
    (every leader it named, or the model of its scope, was deleted): dropping a gone leader must
    never widen the population to everyone."""
    population = entry.get("population") or {}
    leaders, gone = _indexes(population.get("leaders"), principal_index)
    if gone:
        return None
    exempt, _ = _indexes(population.get("exempt_users"), principal_index)
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
        tag=scope.get("tag"),
        model=model,
        threshold_nano=None if threshold is None else snapshot.usd_to_nanos(threshold),
        calls_per_minute=entry.get("calls_per_minute"),
        tokens_per_minute=entry.get("tokens_per_minute"),
    )


def to_config(rule: dict[str, Any], principal_index: dict[str, int], model_index: dict[str, int]) -> snapshot.Rule:
    """A stored rule as the core's. ``principal_index``: user id (str) -> principal index;
    ``model_index``: model name -> model index. Entries that can match nobody are left out, but
    keep their position's number: the core reports entries by ``entry_numbers``' values."""
    entries = []
    numbers = []
    for number, entry in enumerate(rule.get("entries") or []):
        config = entry_config(entry, principal_index, model_index)
        if config is not None:
            entries.append(config)
            numbers.append(number)
    return snapshot.Rule(id=rule["id"], weight=int(rule.get("weight") or 0), mode=rule.get("mode") or "inherit",
                         entries=entries, entry_numbers=numbers)
