"""Governance across four real workers: provider concurrency and rate, budgets that never
overshoot, and isolation between providers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest
from conftest import EmulatedProviders, Gateway, running_gateway


@pytest.fixture(scope="module")
def gw4() -> Iterator[Gateway]:
    with running_gateway(4) as gw:
        yield gw


def _setup(gw: Gateway, testserve: EmulatedProviders, name: str, resolved: str = "dummy-chat",
           cap_usd: str | None = None, output_price: str = "0.002", **provider: Any) -> tuple[str, str]:
    prov = gw.create_provider(name, family="anthropic", base_url=f"{testserve.base_url}/anthropic",
                              api_key="testserve-key", **provider)
    model = gw.create_model(prov["id"], name, resolved_model=resolved, output_price_per_1k_tokens=output_price)
    user = gw.create_user()
    gw.grant(user["id"], model["id"])
    if cap_usd is not None:
        policy = {"daily_cap_usd": cap_usd, "max_calls_per_hour": None, "allowed_from": None, "allowed_to": None,
                  "timezone": "UTC", "active_days": [0, 1, 2, 3, 4, 5, 6], "always_open": True}
        response = gw.admin("PUT", f"/admin/users/{user['id']}/policies/{model['id']}", policy)
        assert response.status_code == 200, response.text
    return user["key"], name


async def _fire(gw: Gateway, key: str, model: str, n: int, body: dict[str, Any] | None = None,
                concurrency: int | None = None) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=concurrency or n, max_keepalive_connections=concurrency or n)
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=30, limits=limits) as client:
        gate = asyncio.Semaphore(concurrency or n)

        async def one() -> httpx.Response:
            async with gate:
                return await client.post("/v1/proxy", params={"model": model}, json=body or {"query": "hello"},
                                         headers={"authorization": f"Bearer {key}"})

        return await asyncio.gather(*(one() for _ in range(n)))


def test_concurrent_upstream_calls_never_exceed_the_providers_slots(gw4: Gateway, testserve: EmulatedProviders) -> None:
    """30 concurrent calls through 4 workers: testserve never sees more than max_concurrent_upstream."""
    key, model = _setup(gw4, testserve, "gov-slots", max_concurrent_upstream=3)
    testserve.client.post("/_debug/config", json={"delta_delay_ms": 30})
    testserve.client.delete("/_debug/requests")
    try:
        responses = asyncio.run(_fire(gw4, key, model, 30))
    finally:
        testserve.client.post("/_debug/config", json={"delta_delay_ms": 0})
    assert [r.status_code for r in responses] == [200] * 30
    assert 1 <= testserve.client.get("/_debug/stats").json()["peak_in_flight"] <= 3


def test_outbound_rate_holds_across_workers(gw4: Gateway, testserve: EmulatedProviders) -> None:
    """After the initial burst, the upstream sees max_outbound_rps within 5 % over 10 s."""
    rps = 20
    key, model = _setup(gw4, testserve, "gov-rate", max_outbound_rps=rps)
    testserve.client.delete("/_debug/requests")
    duration_s = 10.0

    async def closed_loop() -> list[int]:
        statuses: list[Any] = []
        stop = time.monotonic() + duration_s + 1.5
        async with httpx.AsyncClient(base_url=gw4.base_url, timeout=30) as client:

            async def user() -> None:
                while time.monotonic() < stop:
                    response = await client.post("/v1/proxy", params={"model": model}, json={"query": "hi"},
                                                 headers={"authorization": f"Bearer {key}"})
                    statuses.append(response.status_code if response.status_code == 200 else response.text)

            await asyncio.gather(*(user() for _ in range(8)))
        return statuses

    statuses = asyncio.run(closed_loop())
    assert set(statuses) == {200}
    stamps = sorted(e["ts"] for e in testserve.requests(model="dummy-chat", limit=5000)
                    if e["path"].startswith("/anthropic"))
    # Skip the burst (rate = burst = rps), then count arrivals over a 10 s window.
    start = stamps[rps]
    window = [t for t in stamps if start <= t < start + duration_s]
    achieved = len(window) / duration_s
    assert abs(achieved - rps) <= 0.05 * rps, achieved


def test_budget_is_never_overshot_by_concurrent_calls(gw4: Gateway, testserve: EmulatedProviders) -> None:
    """200 concurrent calls against a cap whose worst case fits 10: recorded spend stays under the cap."""
    # Worst case per call: 100 output tokens at $1 per 1k = $0.10 (+ a little input); cap $1.05 fits 10.
    key, model = _setup(gw4, testserve, "gov-budget", cap_usd="1.05", output_price="1")
    responses = asyncio.run(_fire(gw4, key, model, 200, {"query": "hello", "max_tokens": 100}, concurrency=200))
    ok = [r for r in responses if r.status_code == 200]
    denied = [r for r in responses if r.status_code == 429]
    assert len(ok) + len(denied) == 200
    assert len(ok) >= 10
    for response in denied:
        assert response.json()["error"] == "budget_exceeded"
        assert response.headers["x-should-retry"] == "false"
        assert int(response.headers["retry-after"]) >= 1
    spent = Decimal(0)
    for response in ok:
        row = gw4.fetch_row(response.headers["x-request-id"])
        spent += row["input_cost"] + row["output_cost"]
    assert spent <= Decimal("1.05")
    usage = gw4.client.get("/v1/usage", headers={"authorization": f"Bearer {key}"}).json()["usage"][0]
    assert Decimal(str(usage["spent_usd"])) == spent


def test_a_saturated_provider_does_not_shed_another_providers_calls(gw4: Gateway,
                                                                    testserve: EmulatedProviders) -> None:
    """Provider A (one slot, slow) is saturated; every call to provider B still succeeds."""
    key_a, model_a = _setup(gw4, testserve, "gov-sat-a", resolved="dummy-slow", max_concurrent_upstream=1)
    key_b, model_b = _setup(gw4, testserve, "gov-sat-b")

    async def both() -> tuple[list[httpx.Response], list[httpx.Response]]:
        a = asyncio.create_task(_fire(gw4, key_a, model_a, 12))
        await asyncio.sleep(0.3)
        b = await _fire(gw4, key_b, model_b, 40, concurrency=10)
        return await a, b

    a, b = asyncio.run(both())
    assert [r.status_code for r in b] == [200] * 40
    busy = [r for r in a if r.status_code == 503]
    assert busy, "provider A was expected to turn some calls away"
    for response in busy:
        assert response.json()["error"] == "provider_busy"
        assert int(response.headers["retry-after"]) >= 1 and response.json()["resume_at"]


def test_a_providers_share_caps_its_weight(gw4: Gateway, testserve: EmulatedProviders) -> None:
    """admission_share_pct 1 of capacity 200 = weight 2: at most two text calls upstream at once."""
    key, model = _setup(gw4, testserve, "gov-share", admission_share_pct=1)
    testserve.client.post("/_debug/config", json={"delta_delay_ms": 30})
    testserve.client.delete("/_debug/requests")
    try:
        responses = asyncio.run(_fire(gw4, key, model, 20))
    finally:
        testserve.client.post("/_debug/config", json={"delta_delay_ms": 0})
    assert [r.status_code for r in responses] == [200] * 20
    assert 1 <= testserve.client.get("/_debug/stats").json()["peak_in_flight"] <= 2


def test_a_client_that_leaves_is_charged_what_was_streamed(gw4: Gateway, testserve: EmulatedProviders) -> None:
    """A caller that disconnects mid-stream pays its input and the output already sent, not nothing."""
    key, model = _setup(gw4, testserve, "gov-leave", resolved="dummy-huge")
    testserve.client.post("/_debug/config", json={"delta_delay_ms": 5})
    try:
        with httpx.Client(base_url=gw4.base_url, timeout=30) as client:
            with client.stream("POST", "/v1/proxy", params={"model": model}, json={"query": "hello"},
                               headers={"authorization": f"Bearer {key}"}) as response:
                request_id = response.headers["x-request-id"]
                lines = response.iter_lines()
                for _ in range(5):
                    next(lines)
        row = gw4.fetch_row(request_id, timeout_s=10)
    finally:
        testserve.client.post("/_debug/config", json={"delta_delay_ms": 0})
    assert row["tokens_in"] > 0 and row["tokens_out"] >= 5
    assert row["output_cost"] > 0
