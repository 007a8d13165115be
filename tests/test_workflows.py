"""Workflow budgets (issue "identity", item 4): calls tagged `workflow=<id>` reserve against a
registered workflow's budget like any cap, on a real two-worker gateway with testserve.

As in test_rules: input is free and each call asks `max_tokens: 3` for a prompt testserve answers
in exactly three output tokens at $1 per 1k, so every call costs and reserves $0.003, and a limit
of k x $0.003 admits exactly k calls."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
from decimal import Decimal
from typing import Any

import httpx
from conftest import EmulatedProviders, Gateway, until

CALL_USD = Decimal("0.003")
PROMPT, MAX_TOKENS = "hello", 3


def _tag() -> str:
    return secrets.token_hex(3)


def _setup(gateway: Gateway, testserve: EmulatedProviders, people: int = 1, **user: Any) -> tuple[dict, list[dict]]:
    provider = gateway.create_provider(f"wf-p-{_tag()}", base_url=f"{testserve.base_url}/openai",
                                       api_key="testserve-key")
    model = gateway.create_model(provider["id"], f"wf-m-{_tag()}", resolved_model="dummy-chat",
                                 input_price_per_1k_tokens="0", output_price_per_1k_tokens="1")
    made = []
    for _ in range(people):
        email = f"wf-{_tag()}@example.com"
        r = gateway.admin("POST", "/admin/users", {"email": email, "display_name": "wf", **user})
        assert r.status_code == 201, r.text
        gateway.grant(r.json()["id"], model["id"])
        made.append(r.json())
    return model, made


def _workflow(gateway: Gateway, **body: Any) -> dict[str, Any]:
    r = gateway.admin("POST", "/admin/workflows", {"window": "daily", **body})
    assert r.status_code == 201, r.text
    return r.json()


def _call(gateway: Gateway, person: dict, model: dict, tags: str) -> httpx.Response:
    return gateway.client.post("/v1/proxy", params={"model": model["name"]}, json={"query": PROMPT,
                               "max_tokens": MAX_TOKENS},
                               headers={"authorization": f"Bearer {person['key']}", "x-meshfast-tags": tags})


async def _burst(gateway: Gateway, calls: list[tuple[dict, dict]], tags: str) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(calls), max_keepalive_connections=len(calls))
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60, limits=limits) as client:
        async def one(person: dict, model: dict) -> httpx.Response:
            return await client.post("/v1/proxy", params={"model": model["name"]},
                                     json={"query": PROMPT, "max_tokens": MAX_TOKENS},
                                     headers={"authorization": f"Bearer {person['key']}", "x-meshfast-tags": tags})
        return await asyncio.gather(*(one(p, m) for p, m in calls))


def _rows(gateway: Gateway, request_ids: list[str]) -> list[dict[str, Any]]:
    return [gateway.fetch_row(rid) for rid in request_ids]


def test_four_times_oversubscription_of_a_workflow_never_overshoots(gateway: Gateway,
                                                                     testserve: EmulatedProviders) -> None:
    """A workflow whose limit fits 10 calls, shared by three people; 40 concurrent calls over two
    workers: at most 10 succeed, the rest are 429 budget_exceeded naming the workflow, and topping
    up one call at a time fills it to exactly 10. The rows' spend stays within the limit."""
    model, people = _setup(gateway, testserve, people=3)
    wf = _workflow(gateway, id=f"batch-{_tag()}", limit_usd=str(10 * CALL_USD))
    tags = f"workflow={wf['id']};platform=ci"
    until(lambda: _call(gateway, people[0], model, "platform=warmup").status_code == 200, 2.0, "the grant")
    testserve.client.delete("/_debug/requests")
    testserve.client.post("/_debug/config", json={"delta_delay_ms": 20})
    try:
        responses = asyncio.run(_burst(gateway, [(people[i % 3], model) for i in range(40)], tags))
    finally:
        testserve.client.post("/_debug/config", json={"delta_delay_ms": 0})
    assert testserve.client.get("/_debug/stats").json()["peak_in_flight"] >= 2, "the calls ran concurrently"
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert 1 <= len(ok) <= 10 and len(ok) + len(refused) == 40, [r.status_code for r in responses]
    for r in refused:
        body = r.json()
        assert (r.status_code, body["error"], body["workflow"]) == (429, "budget_exceeded", wf["id"]), r.text
        assert r.headers["x-meshfast-limit"] == f"workflow:{wf['id']}" and int(r.headers["retry-after"]) > 0
    topped_up = 0
    while (r := _call(gateway, people[topped_up % 3], model, tags)).status_code == 200:
        topped_up += 1
        assert topped_up <= 10
    assert r.status_code == 429 and r.json()["workflow"] == wf["id"]
    assert len(ok) + topped_up == 10, f"{len(ok)} in the burst + {topped_up} after: the limit fits exactly 10"
    rows = _rows(gateway, [x.headers["x-request-id"] for x in ok])
    spent = sum((Decimal(str(row["input_cost"])) + Decimal(str(row["output_cost"])) for row in rows), Decimal(0))
    assert spent == len(ok) * CALL_USD
    # The same people and model without the tag (or another workflow id) are not held by it.
    assert _call(gateway, people[0], model, "workflow=not-registered").status_code == 200
    assert _call(gateway, people[0], model, "platform=ci").status_code == 200
    # The admin view reports the spend once the checkpoint ran.
    until(lambda: Decimal(str(gateway.admin("GET", f"/admin/workflows/{wf['id']}").json()["spent_usd"]))
          == 10 * CALL_USD, 15.0, "the workflow's spend checkpointed")


def test_only_listed_principals_may_charge_a_workflow(gateway: Gateway, testserve: EmulatedProviders) -> None:
    model, (listed, unit_member, stranger) = _setup(gateway, testserve, people=3)
    etag = gateway.admin("GET", f"/admin/users/{unit_member['id']}").headers["etag"]
    r = gateway.client.put(f"/admin/users/{unit_member['id']}", json={"business_unit": "Payments"},
                           headers={"authorization": f"Bearer {gateway.admin_token}", "if-match": etag})
    assert r.status_code == 200, r.text
    wf = _workflow(gateway, id=f"close-{_tag()}", limit_usd=5, window="monthly",
                   principals=[{"user_id": listed["id"]}, {"business_unit": "Payments"}])
    tags = f"workflow={wf['id']}"
    until(lambda: _call(gateway, listed, model, tags).status_code == 200, 2.0, "the workflow loaded")
    until(lambda: _call(gateway, unit_member, model, tags).status_code == 200, 2.0, "the business unit's member")
    refused = _call(gateway, stranger, model, tags)
    assert (refused.status_code, refused.json()["error"], refused.json()["workflow"]) == \
        (403, "workflow_not_permitted", wf["id"]), refused.text
    entry = gateway.client.post("/v1/chat/completions", json={"model": model["name"], "max_tokens": 3,
                                "messages": [{"role": "user", "content": PROMPT}]},
                                headers={"authorization": f"Bearer {stranger['key']}", "x-meshfast-tags": tags})
    assert entry.status_code == 403 and entry.json()["error"]["code"] == "workflow_not_permitted", entry.text
    row = gateway.fetch_row(refused.headers["x-request-id"])
    assert row["deny_reason"] == "workflow_not_permitted"
    # Unregistered, the same id is attribution only.
    assert gateway.admin("DELETE", f"/admin/workflows/{wf['id']}").status_code == 200
    until(lambda: _call(gateway, stranger, model, tags).status_code == 200, 2.0, "unregistered: attribution only")
    assert gateway.admin("GET", f"/admin/workflows/{wf['id']}").status_code == 404


def test_workflows_are_validated(gateway: Gateway) -> None:
    for body, needle in [
        ({"id": "a b", "limit_usd": 1, "window": "daily"}, "id must"),
        ({"id": "ok", "limit_usd": 0, "window": "daily"}, ""),
        ({"id": "ok", "limit_usd": "-1", "window": "daily"}, "limit_usd"),
        ({"id": "ok", "limit_usd": "abc", "window": "daily"}, "limit_usd"),
        ({"id": "ok", "limit_usd": 1, "window": "hourly"}, "window"),
        ({"id": "ok", "limit_usd": 1, "window": "daily", "principals": [{"team": "x"}]}, "principals[0]"),
        ({"id": "ok", "limit_usd": 1, "window": "daily", "principals": [{"user_id": "nope"}]}, "UUID"),
        ({"id": "ok", "limit_usd": 1, "window": "daily",
          "principals": [{"user_id": "00000000-0000-4000-8000-000000000000"}]}, "do not exist"),
        ({"id": "ok", "limit_usd": 1, "window": "daily", "principals": [{"application_id": "x"}]}, "application"),
        ({"id": "ok", "limit_usd": 1, "window": "daily", "extra": 1}, ""),
    ]:
        r = gateway.admin("POST", "/admin/workflows", body)
        assert r.status_code == 400 and r.json()["error"] == "invalid_request" and needle in r.text, (body, r.text)
    made = _workflow(gateway, id=f"dup-{_tag()}", limit_usd="2.5")
    assert made["limit_usd"] == 2.5 and made["spent_usd"] == 0 and made["principals"] is None
    assert gateway.admin("POST", "/admin/workflows", {"id": made["id"], "limit_usd": 1, "window": "daily"}
                         ).status_code == 409
    assert made["id"] in [w["id"] for w in gateway.admin("GET", "/admin/workflows").json()]
    assert gateway.admin("DELETE", "/admin/workflows/nope-nope").status_code == 404
    # A path id no workflow could have (too long, odd characters) names none: not a prefix of one.
    assert gateway.admin("GET", f"/admin/workflows/{made['id']}{'x' * 64}").status_code == 404
    assert gateway.admin("DELETE", f"/admin/workflows/{made['id']}%20").status_code == 404
    assert gateway.admin("GET", f"/admin/workflows/{made['id']}").status_code == 200


def test_the_cli_registers_lists_and_removes_workflows(gateway: Gateway) -> None:
    import json

    def cli(*args: str) -> Any:
        result = subprocess.run([sys.executable, "-m", "meshfast.cli", "workflows", *args, "--json"],
                                env=gateway.env(), capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    wid = f"cli-{_tag()}"
    made = cli("add", wid, "--limit-usd", "3", "--window", "weekly", "--business-unit", "Risk")
    assert (made["id"], made["window"], made["principals"]) == (wid, "weekly", [{"business_unit": "Risk"}])
    assert wid in [w["id"] for w in cli("list")]
    assert cli("remove", wid) == {"status": "deleted"}


def test_a_workflows_spend_survives_a_restart(fresh_dir: Any, testserve: EmulatedProviders) -> None:
    """Checkpointed and seeded back: after a restart the (weekly) workflow still holds what it spent."""
    window = "weekly"
    from conftest import SESSION_ENV
    from conftest import Gateway as G

    gw = G(fresh_dir / "data", workers=1, env=SESSION_ENV).start()
    try:
        model, (person,) = _setup(gw, testserve)
        wf = _workflow(gw, id=f"keep-{_tag()}", limit_usd=str(3 * CALL_USD), window=window)
        tags = f"workflow={wf['id']}"
        until(lambda: _call(gw, person, model, tags).status_code == 200, 2.0, "the first call")
        assert _call(gw, person, model, tags).status_code == 200
        until(lambda: Decimal(str(gw.admin("GET", f"/admin/workflows/{wf['id']}").json()["spent_usd"]))
              == 2 * CALL_USD, 15.0, "checkpointed")
        gw.stop()
        gw.start()
        assert _call(gw, person, model, tags).status_code == 200
        r = _call(gw, person, model, tags)
        assert (r.status_code, r.json().get("workflow")) == (429, wf["id"]), r.text
    finally:
        gw.stop()
