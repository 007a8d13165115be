"""Chaos at the upstream: with testserve failing 10 % of calls at random, every failure is
accounted for the same way by the caller's status, the row and the metrics."""

from __future__ import annotations

import re
import threading
from typing import Any

import httpx
from conftest import EmulatedProviders, Gateway

CALLS = 200
THREADS = 8


def _metrics(gateway: Gateway) -> dict[str, float]:
    response = gateway.admin("GET", "/admin/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    out: dict[str, float] = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_every_chaos_failure_is_accounted_for(gateway: Gateway, testserve: EmulatedProviders) -> None:
    user = gateway.create_user()
    provider = gateway.create_provider("ts-chaos", family="openai", base_url=f"{testserve.base_url}/openai",
                                       api_key="testserve-key", max_retries=0)
    model = gateway.create_model(provider["id"], "chaos-model", resolved_model="dummy-chaos")
    gateway.grant(user["id"], model["id"])
    before = _metrics(gateway)
    results: list[tuple[int, str, dict[str, Any] | None]] = []
    lock = threading.Lock()

    def caller(n: int) -> None:
        with httpx.Client(base_url=gateway.base_url, timeout=30) as client:
            for _ in range(n):
                r = client.post("/v1/proxy", params={"model": "chaos-model"}, json={"query": "hi"},
                                headers={"authorization": f"Bearer {user['key']}"})
                body = r.json() if r.status_code != 200 else None
                with lock:
                    results.append((r.status_code, r.headers["x-request-id"], body))

    testserve.client.post("/_debug/config", json={"chaos_rate": 0.1}).raise_for_status()
    try:
        threads = [threading.Thread(target=caller, args=(CALLS // THREADS,)) for _ in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        testserve.client.post("/_debug/config", json={"chaos_rate": 0.0}).raise_for_status()

    assert len(results) == CALLS
    failed = [(rid, body) for status, rid, body in results if status != 200]
    assert {status for status, _, _ in results} <= {200, 502}
    assert 0 < len(failed) < CALLS // 3, "about 10 % fail"
    for _, body in failed:
        assert body == {"error": "upstream_unavailable", "provider_status": 500,
                        "provider_message": "testserve: chaos"}
    rows = {r["request_id"]: r for r in gateway.fetch_rows("model_name", ["chaos-model"], at_least=CALLS)}
    assert len(rows) == CALLS
    failed_ids = {rid for rid, _ in failed}
    for status, rid, _ in results:
        row = rows[rid]
        assert (status == 200) == (rid not in failed_ids)
        if rid in failed_ids:
            assert (row["outcome"], row["status_code"], row["output_cost"]) == ("upstream_error", 500, 0)
        else:
            assert (row["outcome"], row["status_code"]) == ("success", 200) and row["output_cost"] > 0

    after = _metrics(gateway)

    def delta(series: str) -> float:
        return after.get(series, 0) - before.get(series, 0)

    assert delta('meshfast_requests_total{route="proxy",outcome="success"}') == CALLS - len(failed)
    assert delta('meshfast_requests_total{route="proxy",outcome="upstream_error"}') == len(failed)
    assert delta('meshfast_upstream_attempts_total{result="5xx"}') == len(failed)
    assert delta('meshfast_upstream_attempts_total{result="2xx"}') == CALLS - len(failed)
    upstream_calls = testserve.client.get("/_debug/requests", params={"model": "dummy-chaos", "limit": 1000}).json()
    assert upstream_calls["count"] == CALLS


def test_metrics_need_an_admin(gateway: Gateway) -> None:
    assert gateway.client.get("/admin/metrics").status_code == 401
    text = gateway.admin("GET", "/admin/metrics").text
    assert re.search(r'^meshfast_denials_total\{reason="invalid_or_revoked_key"\} \d+$', text, re.M)
