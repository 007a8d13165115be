"""Issue 15: every cap holds across instances, not only the daily budget. Per-user and provider
hourly call caps and a spend rule's block threshold, each oversubscribed 4x by concurrent calls
spread round-robin over three instances of one cluster (one PostgreSQL), admit at most what the cap
fits; after the instances' unused slices return, calls through one instance fill the cap exactly."""

from __future__ import annotations

import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from conftest import Cluster, EmulatedProviders, clear_of_window_edge, in_window, running_cluster, tag, until
from test_cluster import CALL_USD, _bearer, _burst, _caller, _cost, _proxy, _rows_of

Json = dict[str, Any]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with running_cluster(size=3, workers=2) as shared:
        yield shared


def _slow(testserve: EmulatedProviders) -> Any:
    """Each answer streams for ~60 ms, so the admitted calls overlap."""
    testserve.client.post("/_debug/config", json={"delta_delay_ms": 20}).raise_for_status()


def _fast(testserve: EmulatedProviders) -> None:
    testserve.client.post("/_debug/config", json={"delta_delay_ms": 0}).raise_for_status()


def _oversubscribe(cluster: Cluster, testserve: EmulatedProviders, caller: Json, fits: int) -> list[Any]:
    _slow(testserve)
    try:
        return _burst([(cluster.instances[n % 3], caller) for n in range(4 * fits)])
    finally:
        _fast(testserve)


def _fill_through_one(cluster: Cluster, caller: Json, fits: int) -> tuple[int, Any]:
    """Calls through instance 0 until refused; returns how many passed and the refusal."""
    passed = 0
    while (response := _proxy(cluster.instances[0], caller)).status_code == 200:
        passed += 1
        assert passed <= fits, "the cap admitted more calls than it fits"
    return passed, response


def test_a_users_hourly_call_cap_holds_across_instances(cluster: Cluster, testserve: EmulatedProviders) -> None:
    fits = 6
    caller = _caller(cluster, testserve)
    admin = cluster.instances[0]
    policy = {"daily_cap_usd": "100", "max_calls_per_hour": fits, "allowed_from": None, "allowed_to": None,
              "timezone": "UTC", "active_days": [0, 1, 2, 3, 4, 5, 6], "always_open": True}
    response = admin.admin("PUT", f"/admin/users/{caller['user']['id']}/policies/{caller['model']['id']}", policy)
    assert response.status_code == 200, response.text
    time.sleep(1.0)  # the policy on every worker of every instance (API: within 1 s)

    hour = clear_of_window_edge(3600, 60)
    responses = _oversubscribe(cluster, testserve, caller, fits)
    ok = [r for r in responses if r.status_code == 200]
    assert 1 <= len(ok) <= fits, [r.status_code for r in responses]
    for refused in (r for r in responses if r.status_code != 200):
        assert (refused.status_code, refused.json()["error"]) == (429, "user_model_hourly_limit_reached"), \
            refused.text
    time.sleep(7.0)  # unused slices return
    passed, refusal = _fill_through_one(cluster, caller, fits)
    assert (refusal.status_code, refusal.json()["error"]) == (429, "user_model_hourly_limit_reached")
    assert in_window(3600) == hour, "the test ran past its hour"
    assert len(ok) + passed == fits, f"{len(ok)} in the burst + {passed} after: the cap fits exactly {fits}"


def test_a_providers_hourly_quota_holds_across_instances(cluster: Cluster, testserve: EmulatedProviders) -> None:
    fits = 6
    caller = _caller(cluster, testserve, max_calls_per_hour=fits)
    hour = clear_of_window_edge(3600, 60)
    responses = _oversubscribe(cluster, testserve, caller, fits)
    ok = [r for r in responses if r.status_code == 200]
    assert 1 <= len(ok) <= fits, [r.status_code for r in responses]
    for refused in (r for r in responses if r.status_code != 200):
        assert (refused.status_code, refused.json()["error"]) == (429, "provider_hourly_limit_reached"), \
            refused.text
    time.sleep(7.0)
    passed, refusal = _fill_through_one(cluster, caller, fits)
    assert (refusal.status_code, refusal.json()["error"]) == (429, "provider_hourly_limit_reached")
    assert in_window(3600) == hour, "the test ran past its hour"
    assert len(ok) + passed == fits
    rows = _rows_of(cluster, caller, 4 * fits + passed + 1)
    assert sum(1 for r in rows if r["status_code"] == 200) == fits


def test_a_spend_rules_threshold_holds_across_instances(cluster: Cluster, testserve: EmulatedProviders) -> None:
    fits = 10
    admin = cluster.instances[0]
    scope_tag = f"cl-{tag()}"
    name = f"cl-{tag()}"
    provider = admin.create_provider(name, base_url=f"{testserve.base_url}/openai", api_key="testserve-key")
    model = admin.create_model(provider["id"], name, resolved_model="dummy-chat", tags=[scope_tag],
                               input_price_per_1k_tokens="0", output_price_per_1k_tokens="1")
    user = admin.create_user()
    admin.grant(user["id"], model["id"])
    caller = {"user": user, "model": model, "key": user["key"], "name": name, "resolved": "dummy-chat", "cap": None}
    threshold = fits * CALL_USD
    rule_id = f"cl-{tag()}"
    created = admin.admin("POST", "/admin/rules", {"id": rule_id, "weight": 10, "mode": "enforce", "entries": [
        {"population": {}, "scope": {"tag": scope_tag}, "window": "daily", "threshold_usd": str(threshold),
         "actions": [{"type": "block"}]}]})
    assert created.status_code == 201, created.text

    def listed_everywhere() -> bool:
        import httpx

        return all(rule_id in {r["id"] for r in httpx.get(f"{i.base_url}/v1/usage", headers=_bearer(caller["key"]),
                                                          timeout=10).json()["rules"]}
                   for i in cluster.instances for _ in range(3))

    until(listed_everywhere, 5, "the rule on every instance")

    day = clear_of_window_edge(86400, 60)
    responses = _oversubscribe(cluster, testserve, caller, fits)
    ok = [r for r in responses if r.status_code == 200]
    assert 1 <= len(ok) <= fits, [r.status_code for r in responses]
    for refused in (r for r in responses if r.status_code != 200):
        assert (refused.status_code, refused.json()["error"], refused.json().get("rule")) == (
            429, "budget_exceeded", rule_id), refused.text
    rows = _rows_of(cluster, caller, 4 * fits)
    assert sum((_cost(r) for r in rows), Decimal(0)) <= threshold

    time.sleep(7.0)
    passed, refusal = _fill_through_one(cluster, caller, fits)
    assert (refusal.status_code, refusal.json().get("rule")) == (429, rule_id), refusal.text
    assert in_window(86400) == day, "the test ran past its day"
    assert len(ok) + passed == fits, f"{len(ok)} in the burst + {passed} after: the threshold fits exactly {fits}"
    rows = _rows_of(cluster, caller, 4 * fits + passed + 1)
    spent = sum((_cost(r) for r in rows if r["status_code"] == 200), Decimal(0))
    assert threshold - CALL_USD < spent <= threshold, spent


def test_a_rules_calls_per_minute_cap_holds_across_instances(cluster: Cluster, testserve: EmulatedProviders) -> None:
    """calls_per_minute 6, 24 concurrent calls over three instances within one UTC minute: at most 6
    answer 200 and the rest are 429 rate_limited naming the rule; once the unused slices are back
    (the same minute), calls through one instance reach exactly 6 in the minute."""
    fits = 6
    caller = _caller(cluster, testserve)
    admin = cluster.instances[0]
    rule_id = f"cl-rate-{tag()}"
    created = admin.admin("POST", "/admin/rules", {"id": rule_id, "weight": 10, "mode": "enforce", "entries": [
        {"population": {}, "scope": {"model": caller["name"]}, "calls_per_minute": fits}]})
    assert created.status_code == 201, created.text
    time.sleep(1.0)  # on every worker of every instance (API: within 1 s)
    # One UTC minute for the whole test: the burst, the slices' return (~5 s) and the top-up.
    if time.time() % 60 > 40:
        time.sleep(61 - time.time() % 60)
    minute = int(time.time() // 60)
    responses = _oversubscribe(cluster, testserve, caller, fits)
    ok = [r for r in responses if r.status_code == 200]
    assert 1 <= len(ok) <= fits, [r.status_code for r in responses]
    for refused in (r for r in responses if r.status_code != 200):
        assert (refused.status_code, refused.json()["error"], refused.json().get("rule")) == (
            429, "rate_limited", rule_id), refused.text
    time.sleep(7.0)
    passed, refusal = _fill_through_one(cluster, caller, fits)
    assert int(time.time() // 60) == minute, "the test ran past its minute"
    assert (refusal.status_code, refusal.json().get("rule")) == (429, rule_id), refusal.text
    assert len(ok) + passed == fits, f"{len(ok)} in the burst + {passed} after: the cap fits exactly {fits}"


def test_a_survivor_never_goes_back_to_whole_caps_it_cannot_account_for(testserve: EmulatedProviders) -> None:
    """Two instances; B spends 8 of a cap's 10 calls and stops cleanly, then the other is alone. A
    survivor that took the caps whole again would count from its own counters (which never saw B's
    calls) and admit 10 more; it keeps leasing instead, so the day ends at exactly 10 calls."""
    fits = 10
    with running_cluster(size=2, workers=1) as pair:
        a, b = pair.instances
        caller = _caller(pair, testserve, cap_calls=fits)
        assert all(_proxy(b, caller).status_code == 200 for _ in range(8))
        b.stop()
        time.sleep(3.0)  # A's beats see B gone
        passed = 0
        while (response := _proxy(a, caller)).status_code == 200:
            passed += 1
            assert passed <= fits
        assert (response.status_code, response.json()["error"]) == (429, "budget_exceeded"), response.text
        assert passed == fits - 8, f"8 through B + {passed} through A alone: the cap fits exactly {fits}"
        status = a.admin("GET", "/admin/status").json()
        assert status["instance"]["mode"] == "cluster", status["instance"]


def test_a_busy_instance_gives_up_its_provider_share_to_one_that_waits(
        cluster: Cluster, testserve: EmulatedProviders) -> None:
    """max_concurrent_upstream 2: A keeps both slots busy with back-to-back slow calls; B's calls,
    arriving after, are served within the admission wait (the share splits between the two
    instances that want it) instead of every one being refused provider_busy."""
    import threading

    caller = _caller(cluster, testserve, max_concurrent_upstream=2)
    a, b = cluster.instances[0], cluster.instances[1]
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            _proxy(a, caller)

    testserve.client.delete("/_debug/requests")
    testserve.client.post("/_debug/config", json={"delta_delay_ms": 150}).raise_for_status()
    threads = [threading.Thread(target=hammer) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(3.0)  # A holds the whole limit by now
        answers = [_proxy(b, caller) for _ in range(4)]
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        _fast(testserve)
    assert [r.status_code for r in answers] == [200] * 4, [(r.status_code, r.text[:80]) for r in answers]
    assert testserve.client.get("/_debug/stats").json()["peak_in_flight"] <= 2


def test_a_workflow_budget_holds_across_instances(cluster: Cluster, testserve: EmulatedProviders) -> None:
    """A workflow's budget (calls tagged workflow=<id>) is leased in slices like any cap: 4x
    oversubscribed over three instances it admits at most what it fits, then exactly that."""
    import asyncio

    import httpx

    fits = 10
    caller = _caller(cluster, testserve)
    admin = cluster.instances[0]
    workflow = f"cl-{tag()}"
    created = admin.admin("POST", "/admin/workflows", {"id": workflow, "limit_usd": str(fits * CALL_USD),
                                                       "window": "daily"})
    assert created.status_code == 201, created.text
    headers = {**_bearer(caller["key"]), "x-meshfast-tags": f"workflow={workflow}"}
    body = {"query": "hello", "max_tokens": 3}
    time.sleep(1.5)  # the workflow on every worker of every instance (API: within 1 s)
    day = clear_of_window_edge(86400, 60)

    async def burst() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=4 * fits, max_keepalive_connections=4 * fits)
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:
            return await asyncio.gather(*(
                client.post(f"{cluster.instances[n % 3].base_url}/v1/proxy", params={"model": caller["name"]},
                            json=body, headers=headers) for n in range(4 * fits)))

    _slow(testserve)
    try:
        responses = asyncio.run(burst())
    finally:
        _fast(testserve)
    ok = [r for r in responses if r.status_code == 200]
    assert 1 <= len(ok) <= fits, [r.status_code for r in responses]
    for refused in (r for r in responses if r.status_code != 200):
        assert (refused.status_code, refused.json()["error"], refused.json().get("workflow")) == (
            429, "budget_exceeded", workflow), refused.text
    time.sleep(7.0)  # unused slices go back
    passed = 0
    while (response := httpx.post(f"{cluster.instances[0].base_url}/v1/proxy", params={"model": caller["name"]},
                                  json=body, headers=headers, timeout=30)).status_code == 200:
        passed += 1
        assert passed <= fits, "the workflow admitted more calls than it fits"
    assert (response.status_code, response.json().get("workflow")) == (429, workflow), response.text
    assert in_window(86400) == day, "the test ran past its day"
    assert len(ok) + passed == fits, f"{len(ok)} in the burst + {passed} after: the budget fits exactly {fits}"
