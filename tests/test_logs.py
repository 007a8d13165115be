"""Log analytics: the rollups the ingest keeps agree with the rows, and the explorer's answers
agree with plain SQL over request_logs."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any
from urllib.parse import urlencode

import asyncpg
import httpx
import pytest
from conftest import EmulatedProviders, Gateway

from meshfast import errors
from meshfast.admin import logs


@pytest.fixture(scope="module")
def traffic(gateway: Gateway, testserve: EmulatedProviders) -> dict[str, Any]:
    """Two users, two models, successes, upstream errors and denials."""
    provider = gateway.create_provider("logs-p", family="openai", base_url=f"{testserve.base_url}/openai",
                                       api_key="testserve-key", max_retries=0)
    ok = gateway.create_model(provider["id"], "logs-ok", resolved_model="dummy-ok")
    bad = gateway.create_model(provider["id"], "logs-bad", resolved_model="dummy-error-500")
    users = [gateway.create_user() for _ in range(2)]
    for user in users:
        gateway.grant(user["id"], ok["id"])
        gateway.grant(user["id"], bad["id"])
    rids = []
    with httpx.Client(base_url=gateway.base_url, timeout=30) as client:
        for i in range(30):
            user = users[i % 2]
            model = "logs-bad" if i % 5 == 0 else "logs-ok"
            r = client.post("/v1/proxy", params={"model": model}, json={"query": f"hello {i}"},
                            headers={"authorization": f"Bearer {user['key']}"})
            rids.append(r.headers["x-request-id"])
        r = client.post("/v1/proxy", params={"model": "logs-ok"}, json={"query": "x"},
                        headers={"authorization": "Bearer mesh_live_" + "z" * 43})
        rids.append(r.headers["x-request-id"])
    rows = gateway.fetch_rows("request_id", rids, at_least=len(rids))
    assert len(rows) == len(rids)
    return {"users": users, "models": {"ok": ok, "bad": bad}, "rids": rids}


def _run(gateway: Gateway, fn: Any) -> Any:
    async def go() -> Any:
        conn = await asyncpg.connect(gateway.database_url)
        try:
            return await fn(conn)
        finally:
            await conn.close()
    return asyncio.run(go())


def test_rollups_agree_with_the_rows(gateway: Gateway, traffic: dict[str, Any]) -> None:
    async def check(conn: asyncpg.Connection) -> None:
        raw = await conn.fetchrow("SELECT sum(count) AS calls, count(*) AS rows, sum(tokens_in) AS t_in, "
                                  "sum(input_cost + output_cost) AS cost FROM request_logs")
        for table in ("request_rollup_hourly", "request_rollup_hourly_all", "request_rollup_daily_user"):
            roll = await conn.fetchrow(f"SELECT sum(calls) AS calls, sum(rows) AS rows, sum(tokens_in) AS t_in, "
                                       f"sum(input_cost + output_cost) AS cost FROM {table}")
            assert dict(roll) == dict(raw), table
        by_user_raw = dict(await conn.fetch("SELECT user_id, sum(count) FROM request_logs GROUP BY 1"))
        by_user_roll = dict(await conn.fetch("SELECT user_id, sum(calls) FROM request_rollup_daily_user GROUP BY 1"))
        assert by_user_raw == by_user_roll
    _run(gateway, check)


def test_summary_and_listing_agree_with_plain_sql(gateway: Gateway, traffic: dict[str, Any]) -> None:
    user = traffic["users"][0]["id"]
    now = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1)
    window = urlencode({"from": (now - dt.timedelta(days=3)).isoformat(), "to": now.isoformat()})

    async def check(conn: asyncpg.Connection) -> None:
        summary = await logs.summary(conn, logs.Query(f"{window}&tz=America/New_York", summary=True))
        raw = await conn.fetchrow("SELECT sum(count) AS calls, sum(input_cost + output_cost) AS cost, "
                                  "sum(count) FILTER (WHERE outcome = 'denied') AS denied FROM request_logs")
        assert summary["totals"]["calls"] == raw["calls"] and summary["totals"]["denials"] == raw["denied"]
        assert summary["totals"]["cost_usd"] == pytest.approx(float(raw["cost"]))
        assert sum(p["calls"] for p in summary["series"]) == raw["calls"]
        assert sum(b["calls"] for b in summary["latency_buckets"]) == raw["calls"]
        by_user = {u["user_id"]: u["calls"] for u in summary["by_user"]}
        assert by_user[user] == await conn.fetchval("SELECT sum(count) FROM request_logs WHERE user_id = $1", user)
        statuses = {s["status"]: s["calls"] for s in summary["by_status"]}
        assert statuses["upstream_error"] == await conn.fetchval(
            "SELECT sum(count) FROM request_logs WHERE outcome = 'upstream_error'")
        mine = await logs.list_logs(conn, logs.Query(f"{window}&user_id={user}&page_size=4&page=2"))
        expected = await conn.fetch("SELECT request_id FROM request_logs WHERE user_id = $1 "
                                    "ORDER BY created_at DESC, request_id DESC LIMIT 4 OFFSET 4", user)
        assert [r["request_id"] for r in mine["logs"]] == [r["request_id"] for r in expected]
        assert mine["total"] == await conn.fetchval("SELECT count(*) FROM request_logs WHERE user_id = $1", user)
        errors_only = await logs.list_logs(conn, logs.Query(f"{window}&status=error&user_id={user}"))
        assert errors_only["total"] == 3 and {r["outcome"] for r in errors_only["logs"]} == {"upstream_error"}
        found = await logs.list_logs(conn, logs.Query(f"{window}&q={traffic['rids'][3]}"))
        assert [r["request_id"] for r in found["logs"]] == [traffic["rids"][3]]
    _run(gateway, check)


@pytest.mark.parametrize("query", ["page=0", "page_size=501", "status=weird", "from=yesterday", "user_id=12",
                                   "sort=password", "tz=Mars/Olympus", "bucket=minute", "nope=1",
                                   "from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z"])
def test_bad_filters_are_400s(query: str) -> None:
    with pytest.raises(errors.InvalidRequest):
        logs.Query(query, summary=True)
