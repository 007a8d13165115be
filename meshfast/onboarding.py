"""Model onboarding and pilots as the core sees them (API.md "Governed lifecycle").

What the admin API stores (a model's status, roster and limited-access cap; pilots with members,
models, an enforcement mode, a tier ladder and an expiry) becomes, at every snapshot build:

- a model's ``status`` (a ``limited`` model past its expiry is ``staged``) and ``roster``;
- ``pilot_access`` on each model a live authoritative pilot lists: its members are served it
  whatever the status, roster or restrictions say, with the default grant terms when they hold
  no grant (API.md: "A grant with no policy row gets $20/day cap...");
- synthetic rules the core enforces like any other (reserved, so they never overshoot):
  ``limited:<model name>`` caps the roster's spend on a limited model, and ``pilot:<id>`` holds
  a pilot's tier ladder, one entry per tier over the pilot's models together, in the pilot's mode;
- the members of each live pilot, by id, for rules' ``population.pilots``.

A pilot past its expiry, and a limited model's access past its expiry, stop applying: the build
reports the next such moment (``Release.next_change``) and each worker rebuilds then.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from meshfast import snapshot

# A roster member or an authoritative pilot's member without a grant gets the terms of a grant
# without a policy row (sql.SNAPSHOT_GRANT_TERMS' first row).
DEFAULT_DAILY_CAP_USD = Decimal(20)
ALL_DAYS = [0, 1, 2, 3, 4, 5, 6]


@dataclasses.dataclass
class Release:
    """What onboarding adds to a build: the synthetic rules, each live pilot's members (principal
    indexes, by pilot id) and the next moment something expires (unix ms; None: nothing will)."""

    rules: list[snapshot.Rule]
    pilot_members: dict[str, list[int]]
    next_change_ms: int | None


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _ids(value: Any) -> list[str]:
    out = []
    for item in _json(value) or ():
        try:
            out.append(str(uuid.UUID(str(item))))
        except ValueError:
            continue
    return out


def live(expires_at: dt.datetime | None, now: dt.datetime) -> bool:
    return expires_at is None or expires_at > now


def governing_tier(tiers: list[dict[str, Any]], user_id: str) -> int | None:
    """The index of the tier that governs ``user_id``: the lowest (by amount) whose exceptions do
    not list them (an exception promotes a user up the ladder); None when every tier excepts them."""
    order = sorted(range(len(tiers)), key=lambda i: Decimal(str(tiers[i]["amount_usd"])))
    for i in order:
        if user_id not in _ids(tiers[i].get("exceptions")):
            return i
    return None


def _ms(moment: dt.datetime) -> int:
    return int(moment.timestamp() * 1000)


def apply(config: snapshot.Config, model_rows: Iterable[Any], pilot_rows: Iterable[Any],
          principal_index: Mapping[str, int], now: dt.datetime) -> Release:
    """Sets the models' status, roster and pilot access, adds the grants rosters and
    authoritative pilots imply, and answers the synthetic rules and the pilots' members."""
    model_index = {m.name: i for i, m in enumerate(config.models)}
    by_id = {m.id: m for m in config.models}
    held = set(config.grant_pairs())
    extra: set[tuple[int, int]] = set()
    synthetic: list[snapshot.Rule] = []
    moments: list[dt.datetime] = []

    def people(ids: Iterable[str]) -> list[int]:
        return sorted({principal_index[i] for i in ids if i in principal_index})

    for row in model_rows:
        model = by_id.get(str(row["id"]))
        if model is None or row["status"] != "limited":
            continue
        expires_at = row.get("limited_expires_at")
        if not live(expires_at, now):
            # NOTE: the roster's access ended: the model answers as staged until graduated.
            model.status = "staged"
            continue
        if expires_at is not None:
            moments.append(expires_at)
        model.roster = people(_ids(row.get("roster")))
        m = model_index[model.name]
        extra.update((p, m) for p in model.roster)
        amount, window = row.get("limited_amount_usd"), row.get("limited_window")
        if model.roster and amount is not None and window:
            synthetic.append(snapshot.Rule(id=f"limited:{model.name}", weight=0, mode="enforce", entries=[
                snapshot.RuleEntry(window=window, actions=[snapshot.RuleAction(type="block")],
                                   principals=model.roster, model=m,
                                   threshold_nano=snapshot.usd_to_nanos(amount))]))

    pilot_members: dict[str, list[int]] = {}
    access: dict[int, set[int]] = {}
    for row in pilot_rows:
        if not live(row["expires_at"], now):
            continue
        if row["expires_at"] is not None:
            moments.append(row["expires_at"])
        pilot_id = str(row["id"])
        member_ids = _ids(row["members"])
        members = people(member_ids)
        pilot_members[pilot_id] = members
        models = sorted({model_index[n] for n in _json(row["models"]) or () if n in model_index})
        if row["authoritative"]:
            for m in models:
                access.setdefault(m, set()).update(members)
                extra.update((p, m) for p in members)
        tiers = _json(row["tiers"]) or []
        if not tiers or not models:
            continue
        governed: dict[int, list[int]] = {}
        for user_id in member_ids:
            tier = governing_tier(tiers, user_id)
            if tier is not None and user_id in principal_index:
                governed.setdefault(tier, []).append(principal_index[user_id])
        entries, numbers = [], []
        for i, tier in enumerate(tiers):
            if governed.get(i):
                entries.append(snapshot.RuleEntry(
                    window=tier["window"], actions=[snapshot.RuleAction(type="block")],
                    principals=sorted(governed[i]), models=models,
                    threshold_nano=snapshot.usd_to_nanos(tier["amount_usd"])))
                numbers.append(i)
        if entries:
            synthetic.append(snapshot.Rule(id=f"pilot:{pilot_id}", weight=0, mode=row["mode"], entries=entries,
                                           entry_numbers=numbers))

    for m, cohort in access.items():
        config.models[m].pilot_access = sorted(cohort)
    for p, m in sorted(extra - held):
        config.grants.append(snapshot.Grant(
            principal=p, model=m, daily_cap_nano_usd=snapshot.usd_to_nanos(DEFAULT_DAILY_CAP_USD),
            max_calls_per_hour=None, allowed_from_min=None, allowed_to_min=None, timezone="UTC",
            active_days=ALL_DAYS, always_open=False))
    return Release(rules=synthetic, pilot_members=pilot_members,
                   next_change_ms=min(map(_ms, moments)) if moments else None)
