"""Policy as callers see it: hourly caps, time windows, budgets, the kill switch, status headers."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any

import asyncpg
import pytest
from conftest import EmulatedProviders, Gateway, WorkerConnections, clear_of_window_edge


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _policy(**overrides: Any) -> dict[str, Any]:
    return {"daily_cap_usd": 20, "max_calls_per_hour": None, "allowed_from": None, "allowed_to": None,
            "timezone": "UTC", "active_days": [0, 1, 2, 3, 4, 5, 6], "always_open": False, **overrides}


@pytest.fixture
def caller(gateway: Gateway, testserve: EmulatedProviders) -> dict[str, Any]:
    """A fresh user with one granted chat model on testserve."""
    suffix = str(time.monotonic_ns())[-9:]
    provider = gateway.create_provider(f"pol-{suffix}", family="openai", base_url=f"{testserve.base_url}/openai",
                                       api_key="testserve-key")
    model = gateway.create_model(provider["id"], f"pol-{suffix}", resolved_model="dummy-chat")
    user = gateway.create_user()
    gateway.grant(user["id"], model["id"])
    return {"user": user, "model": model, "key": user["key"], "name": model["name"]}


def _set_policy(gateway: Gateway, caller: dict[str, Any], **overrides: Any) -> None:
    response = gateway.admin("PUT", f"/admin/users/{caller['user']['id']}/policies/{caller['model']['id']}",
                             _policy(**overrides))
    assert response.status_code == 200, response.text


def _proxy(gateway: Gateway, caller: dict[str, Any], **body: Any) -> Any:
    return gateway.client.post("/v1/proxy", params={"model": caller["name"]}, json={"query": "hello", **body},
                               headers=_bearer(caller["key"]))


def _entry(gateway: Gateway, caller: dict[str, Any]) -> dict[str, Any]:
    models = gateway.client.get("/v1/models", headers=_bearer(caller["key"])).json()["models"]
    return next(m for m in models if m["model"] == caller["name"])


def _parse(ts: str) -> dt.datetime:
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))


def test_hourly_cap_denies_with_resume_at_and_shows_in_models(gateway: Gateway, caller: dict[str, Any]) -> None:
    """max_calls_per_hour: the call over the cap is 429 with limit, resume_at (next hour) and Retry-After."""
    _set_policy(gateway, caller, max_calls_per_hour=2, always_open=True)
    clear_of_window_edge(3600, 10)
    assert [_proxy(gateway, caller).status_code for _ in range(2)] == [200, 200]
    denied = _proxy(gateway, caller)
    assert denied.status_code == 429
    body = denied.json()
    assert body["error"] == "user_model_hourly_limit_reached" and body["limit"] == 2
    now = dt.datetime.now(dt.UTC)
    next_hour = (now + dt.timedelta(hours=1)).replace(minute=0, second=0, microsecond=0)
    assert _parse(body["resume_at"]) == next_hour
    assert 1 <= int(denied.headers["retry-after"]) <= 3600
    assert denied.headers["x-meshfast-limit"] == "policy.hourly_calls"
    entry = _entry(gateway, caller)
    assert entry["status"] == "rate_limited" and _parse(entry["resume_at"]) == next_hour
    assert entry["usage"]["calls_this_hour"] == 2 and entry["usage"]["calls_per_hour_limit"] == 2
    row = gateway.fetch_row(denied.headers["x-request-id"])
    assert row["outcome"] == "denied" and row["deny_reason"] == "user_model_hourly_limit_reached"


def test_outside_allowed_hours_resumes_at_the_window_start(gateway: Gateway, caller: dict[str, Any]) -> None:
    """A window that opens in two hours (in the policy's timezone) denies now and resumes then."""
    tz = "Asia/Tokyo"
    from zoneinfo import ZoneInfo

    local = dt.datetime.now(ZoneInfo(tz))
    start = (local + dt.timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
    end = start + dt.timedelta(hours=1)
    _set_policy(gateway, caller, timezone=tz, allowed_from=start.strftime("%H:%M"), allowed_to=end.strftime("%H:%M"))
    denied = _proxy(gateway, caller)
    assert denied.status_code == 403
    body = denied.json()
    assert body["error"] == "outside_allowed_hours"
    assert _parse(body["resume_at"]) == start.astimezone(dt.UTC)
    entry = _entry(gateway, caller)
    assert entry["status"] == "outside_hours"
    assert entry["allowed_hours"]["timezone"] == tz and entry["allowed_hours"]["from"] == start.strftime("%H:%M")


def test_overnight_window_is_open_across_midnight(gateway: Gateway, caller: dict[str, Any]) -> None:
    """from > to is an overnight window: open now when now lies in it (Mesh never opened these)."""
    now = dt.datetime.now(dt.UTC)
    start = (now - dt.timedelta(hours=1)).strftime("%H:%M")
    end = (now - dt.timedelta(hours=2)).strftime("%H:%M")  # earlier than start: the window wraps
    _set_policy(gateway, caller, allowed_from=start, allowed_to=end)
    assert _proxy(gateway, caller).status_code == 200
    assert _entry(gateway, caller)["status"] == "available"


def test_budget_exceeded_after_spend_reaches_the_cap(gateway: Gateway, caller: dict[str, Any]) -> None:
    """Once spend + the next call's worst case passes the cap: 429 budget_exceeded, no retry, resume at midnight."""
    # Caps have cent precision; at $0.002 per 1k output tokens, 6000 max_tokens alone cost $0.012.
    _set_policy(gateway, caller, daily_cap_usd="0.01", always_open=True)
    first = _proxy(gateway, caller, max_tokens=10)
    assert first.status_code == 200
    denied = _proxy(gateway, caller, max_tokens=6000)
    assert denied.status_code == 429
    body = denied.json()
    assert body["error"] == "budget_exceeded" and body["cap"] == 0.01
    tomorrow = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    assert _parse(body["resume_at"]) == tomorrow
    assert denied.headers["x-should-retry"] == "false"
    assert denied.headers["x-meshfast-limit"] == "policy.daily_usd"
    usage = gateway.client.get("/v1/usage", headers=_bearer(caller["key"])).json()["usage"][0]
    assert 0 < usage["spent_usd"] <= 0.01


def test_sub_cent_caps_are_kept_exactly(gateway: Gateway, caller: dict[str, Any]) -> None:
    """A cap of $0.0002 is a cap, not a rounded-away 0 (which would mean no cap at all)."""
    _set_policy(gateway, caller, daily_cap_usd="0.0002", always_open=True)
    denied = _proxy(gateway, caller, max_tokens=200)  # worst case 200 x $0.000002 = $0.0004
    assert denied.status_code == 429 and denied.json()["cap"] == 0.0002
    policies = gateway.admin("GET", f"/admin/users/{caller['user']['id']}/policies").json()
    assert policies[0]["daily_cap_usd"] == 0.0002


def test_status_headers_name_the_governing_limit(gateway: Gateway, caller: dict[str, Any]) -> None:
    """X-Meshfast-Limit/Utilization/Reset on a governed success: the limit with the highest utilization."""
    _set_policy(gateway, caller, max_calls_per_hour=4, always_open=True)
    response = _proxy(gateway, caller)
    assert response.status_code == 200
    assert response.headers["x-meshfast-limit"] == "policy.hourly_calls"
    assert float(response.headers["x-meshfast-utilization"]) == 25.0
    assert _parse(response.headers["x-meshfast-reset"]) > dt.datetime.now(dt.UTC)


def test_kill_switch_pauses_every_worker_and_is_persisted(gateway: Gateway, caller: dict[str, Any]) -> None:
    """Tripping the kill switch: 503 paused_by_admin on every worker within 1 s, stored in the database."""
    pinned = WorkerConnections(gateway)
    try:
        assert gateway.admin("POST", "/admin/kill-switch", {"tripped": True}).json() == {"kill_switch": True}
        try:
            deadline = time.monotonic() + 1.0
            while True:
                answers = [gateway.client.post("/v1/proxy", params={"model": caller["name"]}, json={"query": "x"},
                                               headers=_bearer(caller["key"])) for _ in range(6)]
                if all(a.status_code == 503 for a in answers):
                    break
                assert time.monotonic() < deadline, [a.status_code for a in answers]
                time.sleep(0.05)
            body = answers[0].json()
            assert body["error"] == "paused_by_admin" and body["resume_at"]
            assert int(answers[0].headers["retry-after"]) >= 1

            async def stored() -> bool:
                conn = await asyncpg.connect(gateway.database_url)
                try:
                    return bool(await conn.fetchval("SELECT kill_switch FROM gateway_state"))
                finally:
                    await conn.close()

            assert asyncio.run(stored()) is True
        finally:
            assert gateway.admin("POST", "/admin/kill-switch", {"tripped": False}).json() == {"kill_switch": False}
        deadline = time.monotonic() + 1.0
        while _proxy(gateway, caller).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        pinned.close()
