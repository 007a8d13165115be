"""Spend and call counters: shared memory on the request path, PostgreSQL as the record.

The request path only touches the shared-memory counters. The leader checkpoints them: for each
counter it pushes the delta since the last checkpoint (what the database holds is the counter's
shadow, a word of its own slot, so a new leader carries on where the old one stopped), receives the database total and
absorbs what other hosts added. The supervisor seeds the counters from the database before the
workers start, so a restart keeps today's spend and this hour's calls.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
import zoneinfo
from collections.abc import Iterable
from typing import Any

import asyncpg

from meshfast._core import (
    CALLS_HOUR,
    CLUSTER,
    PROVIDER_CALLS_HOUR,
    RULE_PAUSE,
    SPEND_DAY,
    WINDOW_DAY,
    WINDOW_MONTH,
    WINDOW_WEEK,
    WORKFLOW_SPEND,
    ceiling_key,
    cluster_key,
    counter_key,
)
from meshfast.snapshot import Config, calendar_tz
from meshfast.store.counters import (
    SEED_CALENDAR_DAYS,
    SEED_CALENDAR_SUM,
    SEED_DAILY_SPEND,
    SEED_PAUSES,
    SEED_PROVIDER_HOURLY,
    SEED_USER_HOURLY,
    SEED_WORKFLOW_SPEND,
    UPSERT_CALENDAR_SPEND,
    UPSERT_DAILY_SPEND,
    UPSERT_PROVIDER_HOURLY,
    UPSERT_USER_HOURLY,
    UPSERT_WORKFLOW_SPEND,
)

log = logging.getLogger("meshfast.counters")

ZERO_ID = "00000000-0000-0000-0000-000000000000"
DAY_MS = 86_400_000
HOUR_MS = 3_600_000

EPOCH = dt.date(1970, 1, 1)


# The rules' calendar (the same arithmetic as the core's ruleset::CalendarWindow).
def local_date(now_ms: int, tz: str | None = None) -> dt.date:
    zone = zoneinfo.ZoneInfo(tz or calendar_tz())
    return dt.datetime.fromtimestamp(now_ms / 1000, dt.UTC).astimezone(zone).date()


def day_period(date: dt.date) -> int:
    return (date - EPOCH).days


def week_period(date: dt.date) -> int:
    """Weeks run Monday to Sunday; 1970-01-01 was a Thursday."""
    return (day_period(date) + 3) // 7


def month_period(date: dt.date) -> int:
    return (date.year - 1970) * 12 + date.month - 1


def _window_keys(a: str, b: str, date: dt.date) -> tuple[bytes, bytes, bytes]:
    return (counter_key(WINDOW_DAY, a, b, day_period(date)), counter_key(WINDOW_WEEK, a, b, week_period(date)),
            counter_key(WINDOW_MONTH, a, b, month_period(date)))


def _day(period: int) -> dt.date:
    return dt.date(1970, 1, 1) + dt.timedelta(days=period)


def _hour(period: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(period * 3600, dt.UTC)


def _periods(now_ms: int, unit_ms: int) -> tuple[int, int]:
    """The current period and the one before (its last increments are synced after it ends)."""
    current = now_ms // unit_ms
    return current - 1, current


def _keys(config: Config, now_ms: int) -> Iterable[tuple[int, str, str, int]]:
    principals = config.principals
    models = config.models
    pairs = {(principals[p].id, models[m].id) for p, m in config.grant_pairs()}
    for period in _periods(now_ms, DAY_MS):
        for principal_id, model_id in pairs:
            yield SPEND_DAY, principal_id, model_id, period
    today = day_period(local_date(now_ms, config.calendar_tz))
    for period in (today - 1, today):
        for principal_id, model_id in pairs:
            yield WINDOW_DAY, principal_id, model_id, period
    for period in _periods(now_ms, HOUR_MS):
        for principal_id, model_id in pairs:
            yield CALLS_HOUR, principal_id, model_id, period
        for provider in config.providers:
            yield PROVIDER_CALLS_HOUR, ZERO_ID, provider.id, period


def _periods_of(config: Config, now_ms: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The (kind, period) pairs a checkpoint covers: per principal × model, per provider."""
    today = day_period(local_date(now_ms, config.calendar_tz))
    pairs = [(SPEND_DAY, p) for p in _periods(now_ms, DAY_MS)] + [(CALLS_HOUR, p) for p in _periods(now_ms, HOUR_MS)]
    pairs += [(WINDOW_DAY, today - 1), (WINDOW_DAY, today)]
    return pairs, [(PROVIDER_CALLS_HOUR, p) for p in _periods(now_ms, HOUR_MS)]


def workflow_period(window: str, date: dt.date) -> int:
    return {"daily": day_period, "weekly": week_period}.get(window, month_period)(date)


def _workflow_keys(config: Config, now_ms: int) -> Iterable[tuple[int, str, str, int]]:
    """Each workflow's counter in its window's current instance and the one before (late settles)."""
    today = local_date(now_ms, config.calendar_tz)
    for wf in config.workflows:
        current = workflow_period(wf.window, today)
        for period in (current - 1, current):
            yield WORKFLOW_SPEND, ZERO_ID, wf.uid, period


async def _moved(segment: Any, config: Config, now_ms: int, core: Any) -> list[tuple[int, str, str, int, int]]:
    """(kind, a, b, period, delta) of every counter that moved since the last checkpoint. With the
    worker's core, one pass over the snapshot in Rust, off the event loop (a million grants);
    without, the same in Python (the supervisor's last checkpoint)."""
    moved: list[tuple[int, str, str, int, int]] = []
    keys: Iterable[tuple[int, str, str, int]] = _keys(config, now_ms)
    if core is not None:
        pairs, providers = _periods_of(config, now_ms)
        moved = list(await asyncio.to_thread(core.counter_deltas, pairs, providers))
        keys = ()
    # Open budget reservations share the spend counters; only settled spend is pushed.
    reserved = segment.reserved()
    for kind, a, b, period in (*keys, *_workflow_keys(config, now_ms)):
        key = counter_key(kind, a, b, period)
        delta = segment.get(key) - reserved.get(key, 0) - segment.shadow(key)
        if delta:
            moved.append((kind, a, b, period, delta))
    return moved


async def checkpoint(segment: Any, conn: asyncpg.Connection, config: Config, now_ms: int, core: Any = None) -> int:
    """Push every counter's unsynced delta to PostgreSQL; returns how many counters moved."""
    moved = 0
    for kind, a, b, period, delta in await _moved(segment, config, now_ms, core):
        key = counter_key(kind, a, b, period)
        synced = segment.shadow(key)
        if kind == SPEND_DAY:
            total = await conn.fetchval(UPSERT_DAILY_SPEND, a, b, _day(period), delta)
        elif kind == WINDOW_DAY:
            total = await conn.fetchval(UPSERT_CALENDAR_SPEND, a, b, _day(period), delta)
        elif kind == CALLS_HOUR:
            total = await conn.fetchval(UPSERT_USER_HOURLY, a, b, _hour(period), delta)
        elif kind == WORKFLOW_SPEND:
            total = await conn.fetchval(UPSERT_WORKFLOW_SPEND, b, period, delta)
            if total is None:
                continue  # the workflow was deleted meanwhile: nothing to keep
        else:
            total = await conn.fetchval(UPSERT_PROVIDER_HOURLY, b, _hour(period), delta)
        segment.add_shadow(key, delta)
        # What other hosts pushed in the meantime becomes part of this host's view.
        absorbed = total - (synced + delta)
        if absorbed:
            # In a cluster, other hosts' spend came out of their own slices: the ceiling of this
            # instance's slice rises with the counter, after it (never more room), and only if the
            # ceiling was there before the counter moved (one made since already counts it).
            mode = segment.get(cluster_key())
            leased = mode and kind in (SPEND_DAY, CALLS_HOUR, PROVIDER_CALLS_HOUR, WORKFLOW_SPEND) and segment.get(
                ceiling_key(key, mode))
            segment.add(key, absorbed)
            segment.add_shadow(key, absorbed)
            if leased:
                segment.add(ceiling_key(key, mode), absorbed)
            if kind == WINDOW_DAY:
                # Another host's spend that day counts in that day's week and month too.
                _, week, month = _window_keys(a, b, _day(period))
                segment.add(week, absorbed)
                segment.add(month, absorbed)
        moved += 1
    return moved


# The start-up seed's progress in the segment (the supervisor seeds while the workers load their
# snapshots; a worker serves nothing before the seed is in): state 0 running, 1 done, -1 failed,
# and its database and apply times (ms) for the workers' start clocks.
SEED_RUNNING, SEED_DONE, SEED_FAILED = 0, 1, -1


def seed_state_key() -> bytes:
    return counter_key(CLUSTER, ZERO_ID, "start-seed", 0)


def config_seq_key() -> bytes:
    """The highest config sequence any worker of this instance knows was written (a worker that
    made a write, or heard its NOTIFY, raises it): a worker behind it waits briefly before it
    refuses a key, a model or a grant it has not loaded yet."""
    return counter_key(CLUSTER, ZERO_ID, "config-seq", 0)


def seed_read_ms_key() -> bytes:
    return counter_key(CLUSTER, ZERO_ID, "start-seed", 1)


def seed_apply_ms_key() -> bytes:
    return counter_key(CLUSTER, ZERO_ID, "start-seed", 2)


async def seed(segment: Any, conn: asyncpg.Connection, now_ms: int, timing: dict[str, float] | None = None) -> int:
    """Load today's spend and this hour's calls into a fresh segment (supervisor, before workers).
    ``timing["apply_s"]`` gets the time spent adding them (the rest is the database's)."""
    first_day, _ = _periods(now_ms, DAY_MS)
    first_hour, _ = _periods(now_ms, HOUR_MS)
    loaded = 0
    for kind, query, since in ((SPEND_DAY, SEED_DAILY_SPEND, _day(first_day)),
                               (CALLS_HOUR, SEED_USER_HOURLY, _hour(first_hour)),
                               (PROVIDER_CALLS_HOUR, SEED_PROVIDER_HOURLY, _hour(first_hour))):
        loaded += await _seed_packed(segment, kind, await conn.fetchval(query, since), True, timing)
    loaded += await seed_calendar(segment, conn, now_ms, timing)
    today = local_date(now_ms)
    packed = await conn.fetchval(SEED_WORKFLOW_SPEND, day_period(today), week_period(today), month_period(today))
    loaded += await _seed_packed(segment, WORKFLOW_SPEND, packed, True, timing)
    return loaded


async def _seed_packed(segment: Any, kind: int, packed: bytes, shadow: bool,
                       timing: dict[str, float] | None) -> int:
    if not packed:
        return 0
    started = time.monotonic()
    # NOTE: off the event loop (the supervisor's start-up, or a leader's re-seed on a serving loop).
    loaded = int(await asyncio.to_thread(segment.seed_packed, kind, packed, shadow))
    if timing is not None:
        timing["apply_s"] = timing.get("apply_s", 0.0) + time.monotonic() - started
    return loaded


async def seed_calendar(segment: Any, conn: asyncpg.Connection, now_ms: int,
                        timing: dict[str, float] | None = None) -> int:
    """The rules' committed spend: yesterday's and today's calendar days (with their shadows, for
    the checkpoint), this week's and this month's sums, and the pauses running in this window."""
    today = local_date(now_ms)
    loaded = 0
    packed = await conn.fetchval(SEED_CALENDAR_DAYS, today - dt.timedelta(days=1))
    loaded += await _seed_packed(segment, WINDOW_DAY, packed, True, timing)
    week_start = today - dt.timedelta(days=today.weekday())
    month_start = today.replace(day=1)
    for kind, start, period in ((WINDOW_WEEK, week_start, week_period(today)),
                                (WINDOW_MONTH, month_start, month_period(today))):
        packed = await conn.fetchval(SEED_CALENDAR_SUM, start, today, period)
        loaded += await _seed_packed(segment, kind, packed, False, timing)
    # A pause begins once per rule, person and window: one that began before a restart still runs.
    # The core keeps one slot per person and entry with the start of the latest pause.
    zone = zoneinfo.ZoneInfo(calendar_tz())
    since = dt.datetime.combine(min(month_start, week_start), dt.time(), zone)
    latest: dict[bytes, int] = {}
    for row in await conn.fetch(SEED_PAUSES, since):
        if row["started_at_ms"] is not None:
            key = counter_key(RULE_PAUSE, str(row["user_id"]), f"{row['rule_id']}#{row['entry']}", 0)
            latest[key] = max(latest.get(key, 0), int(row["started_at_ms"]))
    for key, started in latest.items():
        segment.set_if_zero(key, started)
        loaded += 1
    return loaded


# Past periods kept after they end: their last increments are checkpointed first.
KEEP_DAYS = 2
KEEP_HOURS = 2
# How far back a purge looks for keys left behind (e.g. while no leader ran).
PURGE_DAYS = 10
PURGE_HOURS = 48


# The latest period each kind was purged up to, in this process: a later purge starts after it.
_PURGED: dict[int, int] = {}


async def purge_with_core(core: Any, segment: Any, config: Config, now_ms: int) -> int:
    """``purge`` in one pass in Rust off the event loop, covering only the periods that ended since
    this process last purged (the first purge covers the whole look-back)."""
    today, hour = now_ms // DAY_MS, now_ms // HOUR_MS
    local = local_date(now_ms, config.calendar_tz)
    spans = {
        SPEND_DAY: (today - PURGE_DAYS, today - KEEP_DAYS),
        CALLS_HOUR: (hour - PURGE_HOURS, hour - KEEP_HOURS),
        PROVIDER_CALLS_HOUR: (hour - PURGE_HOURS, hour - KEEP_HOURS),
        WINDOW_DAY: (day_period(local) - PURGE_DAYS, day_period(local) - KEEP_DAYS),
        WINDOW_WEEK: (week_period(local) - 2, week_period(local) - 1),
        WINDOW_MONTH: (month_period(local) - 2, month_period(local) - 1),
    }
    pairs: list[tuple[int, int]] = []
    providers: list[tuple[int, int]] = []
    for kind, (first, last) in spans.items():
        periods = [(kind, p) for p in range(max(first, _PURGED.get(kind, first - 1) + 1), last + 1)]
        (providers if kind == PROVIDER_CALLS_HOUR else pairs).extend(periods)
    removed = int(await asyncio.to_thread(core.remove_counters, pairs, providers))
    for kind, (_, last) in spans.items():
        _PURGED[kind] = max(_PURGED.get(kind, last), last)
    removed += _purge_workflows(segment, config, local)
    await asyncio.to_thread(segment.sweep)
    return removed


def _purge_workflows(segment: Any, config: Config, local: dt.date) -> int:
    """Each workflow's counters of window instances before the previous one (that one's last
    settles are still checkpointed): a daily workflow's look-back is PURGE_DAYS."""
    removed = 0
    for wf in config.workflows:
        current = workflow_period(wf.window, local)
        first = current - (PURGE_DAYS if wf.window == "daily" else 3)
        for period in range(first, current - 1):
            removed += segment.remove(counter_key(WORKFLOW_SPEND, ZERO_ID, wf.uid, period))
    return removed


def purge(segment: Any, config: Config, now_ms: int) -> int:
    """Remove counters (and shadows) of periods that ended and were checkpointed; returns how many.

    Without this the slot table would fill with one key per grant per hour. Tombstones left by
    the removal become free slots again through the segment's sweep.
    """
    principals, models = config.principals, config.models
    pairs = {(principals[p].id, models[m].id) for p, m in config.grant_pairs()}
    today, hour = now_ms // DAY_MS, now_ms // HOUR_MS
    removed = 0

    def drop(kind: int, a: str, b: str, period: int) -> None:
        nonlocal removed
        removed += segment.remove(counter_key(kind, a, b, period))

    for period in range(today - PURGE_DAYS, today - KEEP_DAYS + 1):
        for a, b in pairs:
            drop(SPEND_DAY, a, b, period)
    local = local_date(now_ms, config.calendar_tz)
    for period in range(day_period(local) - PURGE_DAYS, day_period(local) - KEEP_DAYS + 1):
        for a, b in pairs:
            drop(WINDOW_DAY, a, b, period)
    for kind, current in ((WINDOW_WEEK, week_period(local)), (WINDOW_MONTH, month_period(local))):
        for period in (current - 2, current - 1):
            for a, b in pairs:
                drop(kind, a, b, period)
    for period in range(hour - PURGE_HOURS, hour - KEEP_HOURS + 1):
        for a, b in pairs:
            drop(CALLS_HOUR, a, b, period)
        for provider in config.providers:
            drop(PROVIDER_CALLS_HOUR, ZERO_ID, provider.id, period)
    removed += _purge_workflows(segment, config, local)
    segment.sweep()
    return removed
