"""/admin/metrics per model and provider after known traffic: requests by outcome, tokens by type and
cost equal what the rows recorded; the provider's answers by status class and its time to first
byte histogram count the calls that reached it; labels carry names, never people. The Grafana
dashboard in server/grafana charts only series that a live gateway exports."""

from __future__ import annotations

import asyncio
import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
from conftest import EmulatedProviders, Gateway, tag, until

DASHBOARD = Path(__file__).resolve().parent.parent / "server" / "grafana" / "meshfast.json"
SERIES = re.compile(r"^(meshfast_[a-z_]+)(?:\{([^}]*)\})? (\S+)$")


def _scrape(gateway: Gateway) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = gateway.admin("GET", "/admin/metrics")
    assert response.status_code == 200
    out = {}
    for line in response.text.splitlines():
        if (m := SERIES.match(line)) is not None:
            labels = frozenset(tuple(kv.split("=", 1)) for kv in re.findall(r'[a-z_]+="[^"]*"', m.group(2) or ""))
            out[(m.group(1), frozenset((k, v.strip('"')) for k, v in labels))] = float(m.group(3))
    return out


def _value(scraped: dict, name: str, **labels: str) -> float:
    return scraped.get((name, frozenset(labels.items())), 0.0)


def _rows(gateway: Gateway, model_ids: list[str]) -> list[dict[str, Any]]:
    async def query() -> list[dict[str, Any]]:
        conn = await asyncpg.connect(gateway.database_url)
        try:
            return [dict(r) for r in await conn.fetch(
                "SELECT * FROM request_logs WHERE model_id = ANY($1::uuid[])", model_ids)]
        finally:
            await conn.close()

    return asyncio.run(query())


def test_per_model_and_provider_series_match_the_rows(gateway: Gateway, testserve: EmulatedProviders) -> None:
    name = f"mm-{tag()}"
    provider = gateway.create_provider(name, base_url=f"{testserve.base_url}/openai", api_key="testserve-key",
                                       max_retries=0)
    ok = gateway.create_model(provider["id"], f"{name}-ok", resolved_model="dummy-chat",
                              input_price_per_1k_tokens="0.5", output_price_per_1k_tokens="1.5")
    bad = gateway.create_model(provider["id"], f"{name}-bad", resolved_model="dummy-error-400")
    user = gateway.create_user()
    for model in (ok, bad):
        gateway.grant(user["id"], model["id"])
    auth = {"authorization": f"Bearer {user['key']}"}
    statuses = [gateway.client.post("/v1/proxy", params={"model": ok["name"]}, json={"query": f"hello {i}"},
                                    headers=auth).status_code for i in range(3)]
    statuses.append(gateway.client.post("/v1/chat/completions", headers=auth, json={
        "model": ok["name"], "messages": [{"role": "user", "content": "hi"}]}).status_code)
    statuses.append(gateway.client.post("/v1/proxy", params={"model": bad["name"]}, json={"query": "x"},
                                        headers=auth).status_code)
    assert statuses == [200, 200, 200, 200, 502]

    rows = until(lambda: (r := _rows(gateway, [ok["id"], bad["id"]])) and len(r) == 5 and r, 10, "the five rows")
    scraped = _scrape(gateway)
    mine = [r for r in rows if str(r["model_id"]) == ok["id"]]
    labels = {"model": ok["name"], "provider": name}
    assert _value(scraped, "meshfast_model_requests_total", **labels, outcome="success") == 4
    assert _value(scraped, "meshfast_model_requests_total", model=bad["name"], provider=name,
                  outcome="upstream_error") == 1
    assert _value(scraped, "meshfast_model_tokens_total", **labels, type="input") == sum(r["tokens_in"] for r in mine)
    assert _value(scraped, "meshfast_model_tokens_total", **labels, type="output") == sum(r["tokens_out"] for r in mine)
    cost = sum((Decimal(r["input_cost"]) + Decimal(r["output_cost"]) for r in mine), Decimal(0))
    assert cost > 0
    assert abs(Decimal(str(_value(scraped, "meshfast_model_cost_usd_total", **labels))) - cost) < Decimal("1e-9")

    assert _value(scraped, "meshfast_provider_upstream_responses_total", provider=name, status="2xx") == 4
    assert _value(scraped, "meshfast_provider_upstream_responses_total", provider=name, status="4xx") == 1
    reached = [r for r in rows if r["ttfb_ms"] is not None]
    assert _value(scraped, "meshfast_provider_ttfb_seconds_count", provider=name) == len(reached) >= 3
    assert _value(scraped, "meshfast_provider_ttfb_seconds_bucket", provider=name, le="+Inf") == len(reached)
    # Bounded cardinality: no series names a person or a key.
    text = gateway.admin("GET", "/admin/metrics").text
    assert user["id"] not in text and user["email"] not in text and user["key"] not in text


def test_the_grafana_dashboard_charts_series_a_gateway_exports(gateway: Gateway) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = {name for name, _ in _scrape(gateway)}
    # A histogram's series are exported as _bucket, _sum and _count.
    bases = exported | {n.rsplit("_", 1)[0] for n in exported if n.endswith(("_bucket", "_sum", "_count"))}
    panels = [p for p in dashboard["panels"] if p.get("type") != "row"]
    assert len(panels) >= 8
    used = set()
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = set(re.findall(r"meshfast_[a-z_]+", target["expr"]))
            assert names, target["expr"]
            used |= names
    missing = {n for n in used if n not in exported and n not in bases}
    assert not missing, f"the dashboard charts series no gateway exports: {sorted(missing)}"
    for series in ("meshfast_model_tokens_total", "meshfast_model_cost_usd_total",
                   "meshfast_provider_ttfb_seconds_bucket", "meshfast_provider_upstream_responses_total"):
        assert series in used, series
