"""The supervisor's start-up seed: PostgreSQL packs the counters it holds into one bytea per query
and the core adds them in one pass (``Segment.seed_packed``). Compared here, counter by counter,
with a slow obvious reference: each stored row's key computed in Python, its value and its shadow
(what the database already holds, so the first checkpoint pushes nothing twice)."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

import asyncpg
from conftest import Gateway, clear_of_window_edge, tag

from meshfast import counters
from meshfast._core import (
    CALLS_HOUR,
    PROVIDER_CALLS_HOUR,
    SPEND_DAY,
    WINDOW_DAY,
    WINDOW_MONTH,
    WINDOW_WEEK,
    Segment,
    counter_key,
)

ZERO_ID = "00000000-0000-0000-0000-000000000000"


def test_the_packed_seed_loads_every_stored_counter_and_its_shadow(gateway: Gateway, tmp_path: Path) -> None:
    clear_of_window_edge(3600, 30)
    provider = gateway.create_provider(f"seed-{tag()}")
    models = [gateway.create_model(provider["id"], f"seed-{tag()}")["id"] for _ in range(2)]
    users = [gateway.create_user()["id"] for _ in range(2)]
    now = dt.datetime.now(dt.UTC)
    now_ms = int(now.timestamp() * 1000)
    today = now.date()
    hour = now.replace(minute=0, second=0, microsecond=0)
    week_start = today - dt.timedelta(days=today.weekday())
    month_start = today.replace(day=1)
    calendar_days = sorted({today, today - dt.timedelta(days=1), week_start, month_start,
                            month_start - dt.timedelta(days=1), week_start - dt.timedelta(days=1),
                            today - dt.timedelta(days=40)})
    daily, hourly, calendar = [], [], []
    n = 0
    for user in users:
        for model in models:
            for day in (today, today - dt.timedelta(days=1), today - dt.timedelta(days=2)):
                n += 1
                daily.append((user, model, day, 1_000_003 * n))
            for start in (hour, hour - dt.timedelta(hours=1), hour - dt.timedelta(hours=2)):
                n += 1
                hourly.append((user, model, start, n))
            for day in calendar_days:
                n += 1
                calendar.append((user, model, day, 7_000_001 * n))
    provider_hourly = [(provider["id"], hour, 41), (provider["id"], hour - dt.timedelta(hours=1), 43),
                       (provider["id"], hour - dt.timedelta(hours=2), 47)]

    async def store_and_seed(segment: Segment) -> int:
        conn = await asyncpg.connect(gateway.database_url)
        try:
            await conn.executemany("INSERT INTO daily_spend VALUES ($1, $2, $3, $4)", daily)
            await conn.executemany("INSERT INTO user_model_hourly_usage VALUES ($1, $2, $3, $4)", hourly)
            await conn.executemany("INSERT INTO provider_hourly_usage VALUES ($1, $2, $3)", provider_hourly)
            await conn.executemany("INSERT INTO calendar_spend VALUES ($1, $2, $3, $4)", calendar)
            return await counters.seed(segment, conn, now_ms)
        finally:
            await conn.close()

    segment = Segment.create(str(tmp_path / "seed.seg"), slots=100_003)
    loaded = asyncio.run(store_and_seed(segment))

    # The reference: what each row should have become, keyed in Python.
    expected: dict[bytes, tuple[int, int]] = {}
    epoch = dt.date(1970, 1, 1)
    for user, model, day, spend in daily:
        if day >= today - dt.timedelta(days=1):
            expected[counter_key(SPEND_DAY, user, model, (day - epoch).days)] = (spend, spend)
    for user, model, start, calls in hourly:
        if start >= hour - dt.timedelta(hours=1):
            expected[counter_key(CALLS_HOUR, user, model, int(start.timestamp()) // 3600)] = (calls, calls)
    for provider_id, start, calls in provider_hourly:
        if start >= hour - dt.timedelta(hours=1):
            expected[counter_key(PROVIDER_CALLS_HOUR, ZERO_ID, provider_id, int(start.timestamp()) // 3600)] = (
                calls, calls)
    for user in users:
        for model in models:
            mine = [(day, spend) for u, m, day, spend in calendar if (u, m) == (user, model)]
            for day, spend in mine:
                if day >= today - dt.timedelta(days=1):
                    expected[counter_key(WINDOW_DAY, user, model, (day - epoch).days)] = (spend, spend)
            week = sum(spend for day, spend in mine if week_start <= day <= today)
            month = sum(spend for day, spend in mine if month_start <= day <= today)
            # The sums carry no shadow: the checkpoint pushes calendar days, never weeks or months.
            expected[counter_key(WINDOW_WEEK, user, model, counters.week_period(today))] = (week, 0)
            expected[counter_key(WINDOW_MONTH, user, model, counters.month_period(today))] = (month, 0)

    assert loaded >= len(expected)
    for key, (value, shadow) in expected.items():
        assert (segment.get(key), segment.shadow(key)) == (value, shadow), key.hex()
    # Rows outside the seeded periods stay out.
    assert segment.get(counter_key(SPEND_DAY, users[0], models[0], (today - epoch).days - 2)) == 0
    assert segment.get(counter_key(CALLS_HOUR, users[0], models[0], int(hour.timestamp()) // 3600 - 2)) == 0
