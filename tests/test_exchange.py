"""The exchange object through either upstream client: the native client hands the response's
framing to the core's Exchange (one call per socket read); the aiohttp client (kept for
measurement, ``MESHFAST_UPSTREAM_CLIENT=aiohttp``) feeds it body bytes. Both must give the
caller the same bytes and the row the same usage and price, on both chat routes, streamed or
not, with reported usage, estimated usage and a stream cut short."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest
from conftest import SESSION_ENV, EmulatedProviders, Gateway, running_gateway

SCENARIOS = ("ok", "nousage", "conn-reset", "unicode", "keepalive")
ROW_FIELDS = ("outcome", "status_code", "tokens_in", "tokens_out", "input_cost", "output_cost", "usage_estimated")


@pytest.fixture(scope="module")
def aiohttp_gateway() -> Iterator[Gateway]:
    with running_gateway(1, env=dict(SESSION_ENV, MESHFAST_UPSTREAM_CLIENT="aiohttp")) as gw:
        yield gw


def _provision(gateway: Gateway, testserve: EmulatedProviders) -> dict[str, Any]:
    user = gateway.create_user()
    provider = gateway.create_provider("ts-exchange", family="openai", base_url=f"{testserve.base_url}/openai",
                                       api_key="testserve-key", retry_backoff_ms=50, max_retries=0)
    for scenario in SCENARIOS:
        model = gateway.create_model(provider["id"], f"ex-{scenario}", resolved_model=f"dummy-{scenario}")
        gateway.grant(user["id"], model["id"])
    return user


@pytest.fixture(scope="module")
def both(gateway: Gateway, aiohttp_gateway: Gateway, testserve: EmulatedProviders) -> list[tuple[Gateway, str]]:
    return [(gw, _provision(gw, testserve)["key"]) for gw in (gateway, aiohttp_gateway)]


def _post(gateway: Gateway, key: str, path: str, body: dict[str, Any], params: dict[str, str] | None = None,
          ) -> tuple[int, bytes, str]:
    with gateway.client.stream("POST", path, params=params, json=body, timeout=30,
                               headers={"authorization": f"Bearer {key}"}) as response:
        try:
            raw = b"".join(response.iter_raw())
        except httpx.HTTPError:
            raw = b"<cut>"
    return response.status_code, raw, response.headers["x-request-id"]


def _same_answer(raw: bytes, rid: str) -> bytes:
    """The answer with what differs by call (ids, timestamps) blanked."""
    text = raw.decode().replace(rid, "<rid>")
    out = []
    for line in text.splitlines(keepends=True):
        body = line[len("data: "):] if line.startswith("data: ") else line
        try:
            value = json.loads(body)
        except ValueError:
            out.append(line)
            continue
        if isinstance(value, dict):
            for key in ("id", "created", "system_fingerprint"):
                if key in value:
                    value[key] = "<x>"
        out.append(line.replace(body.strip(), json.dumps(value, sort_keys=True)))
    return "".join(out).encode()


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("route", ["proxy", "chat", "chat-stream"])
def test_both_clients_give_the_same_answer_and_row(both: list[tuple[Gateway, str]], route: str,
                                                   scenario: str) -> None:
    results = []
    for gateway, key in both:
        model = f"ex-{scenario}"
        if route == "proxy":
            status, raw, rid = _post(gateway, key, "/v1/proxy", {"query": "hello there", "max_tokens": 64},
                                     {"model": model})
        else:
            body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hello there"}]}
            if route == "chat-stream":
                body |= {"stream": True, "stream_options": {"include_usage": True}}
            status, raw, rid = _post(gateway, key, "/v1/chat/completions", body)
        row = gateway.fetch_row(rid)
        results.append((status, _same_answer(raw, rid), {f: row[f] for f in ROW_FIELDS}))
    native, via_aiohttp = results
    assert native == via_aiohttp
    status, answer, row = native
    if scenario == "nousage":
        assert row["usage_estimated"] is True and row["tokens_in"] > 0 and row["tokens_out"] > 0
    elif scenario == "conn-reset":
        assert row["outcome"] == "upstream_error"
    else:
        assert (status, row["outcome"], row["usage_estimated"]) == (200, "success", False)
    if row["outcome"] == "success":
        # Priced at the model's prices: 0.001 / 0.002 USD per 1k tokens.
        assert row["input_cost"] == Decimal(row["tokens_in"]) * Decimal("0.000001")
        assert row["output_cost"] == Decimal(row["tokens_out"]) * Decimal("0.000002")
