"""Context signals (issue "ecosystem", item 5): the tools a call declared and the tools the model
called reach the row, the summary (``by_tool``) and ``/admin/logs/unused-tools``, through the
official SDKs against testserve (whose `tools` scenario calls the first declared tool)."""

from __future__ import annotations

import json
import math
from typing import Any

import anthropic
import httpx
import openai
import pytest
from conftest import EmulatedProviders, Gateway

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = {
    "get_weather": ("The weather in a city.", SCHEMA),
    "send_email": ("Send an email to someone on the team.",
                   {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}}}),
    "lookup_stock": ("A ticker's last price.", {"type": "object", "properties": {"ticker": {"type": "string"}}}),
}


def definition_bytes(name: str) -> int:
    """What the core counts for a declared tool: its definition as compact JSON."""
    description, schema = TOOLS[name]
    return len(json.dumps({"name": name, "description": description, "parameters": schema},
                          separators=(",", ":")))


@pytest.fixture(scope="module")
def world(gateway: Gateway, testserve: EmulatedProviders) -> dict[str, Any]:
    user = gateway.create_user()
    models = {}
    for family, prefix in (("openai", "openai"), ("anthropic", "anthropic")):
        provider = gateway.create_provider(f"ts-ctx-{family}", family=family, base_url=f"{testserve.base_url}/{prefix}",
                                           api_key="testserve-key", max_retries=0)
        for scenario in ("ok", "tools"):
            model = gateway.create_model(provider["id"], f"ctx-{family}-{scenario}", resolved_model=f"dummy-{scenario}")
            gateway.grant(user["id"], model["id"])
            models[(family, scenario)] = model
    return {"user": user, "key": user["key"], "models": models}


def _openai_call(gateway: Gateway, key: str, model: str, names: list[str], stream: bool) -> str:
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key, max_retries=0)
    tools: Any = [{"type": "function", "function": {"name": n, "description": TOOLS[n][0], "parameters": TOOLS[n][1]}}
                  for n in names]
    messages: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    if stream:
        raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, tools=tools,
                                                                stream=True)
        calls = [c.function.name for chunk in raw.parse() for choice in chunk.choices
                 for c in choice.delta.tool_calls or () if c.function and c.function.name]
        assert calls in ([], ["get_weather"])
        return raw.headers["x-request-id"]
    raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, tools=tools)
    raw.parse()
    return raw.headers["x-request-id"]


def _anthropic_call(gateway: Gateway, key: str, model: str, names: list[str]) -> str:
    client = anthropic.Anthropic(base_url=gateway.base_url, api_key=key, max_retries=0)
    tools: Any = [{"name": n, "description": TOOLS[n][0], "input_schema": TOOLS[n][1]} for n in names]
    with client.messages.with_streaming_response.create(
            model=model, max_tokens=64, tools=tools, stream=True,
            messages=[{"role": "user", "content": "What is the weather in Paris?"}]) as raw:
        for _ in raw.iter_lines():
            pass
        return raw.headers["x-request-id"]


def test_rows_record_the_tools_declared_and_the_tools_called(gateway: Gateway, world: dict[str, Any]) -> None:
    names = ["get_weather", "send_email", "lookup_stock"]
    called = _openai_call(gateway, world["key"], "ctx-openai-tools", names, stream=False)
    streamed = _openai_call(gateway, world["key"], "ctx-openai-tools", names, stream=True)
    # Anthropic's codec renames nothing: the same tools, another entry format and upstream family.
    crossed = _anthropic_call(gateway, world["key"], "ctx-openai-tools", names)
    not_called = _openai_call(gateway, world["key"], "ctx-openai-ok", names[1:], stream=False)
    for request_id in (called, streamed, crossed):
        row = gateway.fetch_row(request_id)
        assert row["outcome"] == "success"
        assert row["tools_declared"] == names
        assert row["tools_declared_bytes"] == [definition_bytes(n) for n in names]
        assert row["tools_invoked"] == ["get_weather"], request_id
    row = gateway.fetch_row(not_called)
    assert row["tools_declared"] == names[1:]
    assert row["tools_invoked"] is None
    # A call without tools records none.
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=world["key"], max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="ctx-openai-ok",
                                                           messages=[{"role": "user", "content": "hi"}])
    row = gateway.fetch_row(raw.headers["x-request-id"])
    assert (row["tools_declared"], row["tools_declared_bytes"], row["tools_invoked"]) == (None, None, None)
    # The admin log listing carries them too, and so does the CSV export.
    listed = gateway.admin("GET", f"/admin/logs?request_id={called}").json()["logs"][0]
    assert listed["tools_declared"] == names and listed["tools_invoked"] == ["get_weather"]
    csv = gateway.admin("GET", f"/admin/logs/export.csv?user_id={world['user']['id']}")
    assert csv.status_code == 200, csv.text
    assert "get_weather;send_email;lookup_stock,get_weather" in csv.text


def test_the_summary_counts_tools_and_unused_tools_are_recommended(gateway: Gateway,
                                                                  testserve: EmulatedProviders) -> None:
    user = gateway.create_user()
    other = gateway.create_user()
    models = {m["name"]: m for m in gateway.admin("GET", "/admin/models").json()}
    for person in (user, other):
        for name in ("ctx-openai-tools", "ctx-openai-ok"):
            gateway.grant(person["id"], models[name]["id"])
    names = ["get_weather", "send_email", "lookup_stock"]
    ids = [_openai_call(gateway, user["key"], "ctx-openai-tools", names, stream=n % 2 == 0) for n in range(3)]
    ids.append(_openai_call(gateway, user["key"], "ctx-openai-ok", ["send_email"], stream=False))
    ids.append(_openai_call(gateway, other["key"], "ctx-openai-ok", ["get_weather"], stream=False))
    gateway.fetch_rows("request_id", ids, at_least=len(ids))

    summary = gateway.admin("GET", f"/admin/logs/summary?user_id={user['id']}").json()
    by_tool = {t["tool"]: t for t in summary["by_tool"]}
    assert set(by_tool) == set(names)
    assert by_tool["get_weather"]["declared_calls"] == 3 and by_tool["get_weather"]["invoked_calls"] == 3
    assert by_tool["get_weather"]["invocation_rate"] == 1.0
    assert by_tool["send_email"]["declared_calls"] == 4 and by_tool["send_email"]["invoked_calls"] == 0
    assert by_tool["lookup_stock"]["declared_calls"] == 3
    assert by_tool["send_email"]["estimated_tokens_per_declaration"] == math.ceil(definition_bytes("send_email") / 4)
    assert [t["tool"] for t in summary["by_tool"]][0] == "send_email", "the most declared first"

    everyone = gateway.admin("GET", "/admin/logs/unused-tools").json()
    assert everyone["bytes_per_token"] == 4
    mine = next(u for u in everyone["users"] if u["user_id"] == user["id"])
    assert mine["user_email"] == user["email"]
    unused = {t["tool"]: t for t in mine["tools"]}
    assert set(unused) == {"send_email", "lookup_stock"}, "a called tool is not recommended for removal"
    assert unused["send_email"]["declared_calls"] == 4
    per_request = {n: math.ceil(definition_bytes(n) / 4) for n in ("send_email", "lookup_stock")}
    assert unused["lookup_stock"]["estimated_tokens_per_request"] == per_request["lookup_stock"]
    assert mine["estimated_tokens_in_window"] == 4 * per_request["send_email"] + 3 * per_request["lookup_stock"]
    theirs = next(u for u in everyone["users"] if u["user_id"] == other["id"])
    assert [t["tool"] for t in theirs["tools"]] == ["get_weather"]
    # A tool called by one person is unused for another who never got it called.
    only_me = gateway.admin("GET", f"/admin/logs/unused-tools?user_id={user['id']}").json()
    assert [u["user_id"] for u in only_me["users"]] == [user["id"]]


@pytest.mark.parametrize("query", ["user_id=nope", "from=yesterday", "to=2026-01-01T00:00:00Z&from=2026-02-01T00:00:00Z",
                                   "user_id=%00", "junk=1"])
def test_unused_tools_refuses_bad_filters(gateway: Gateway, query: str) -> None:
    r = gateway.admin("GET", f"/admin/logs/unused-tools?{query}")
    assert r.status_code == 400, r.text
    assert "error" in r.json()


def test_hostile_tool_names_never_cost_the_row(gateway: Gateway, world: dict[str, Any]) -> None:
    """NUL bytes, 300-character and repeated names, 200 tools: the call is served and its row kept,
    with the names as PostgreSQL text holds them (at most 128); a lone surrogate is a 400 in the
    entry's own shape, and that row is kept too."""
    hostile = ["nul\u0000name", "x" * 300, "dup", "dup", *(f"t{n}" for n in range(200))]

    def call(body: str) -> httpx.Response:
        return httpx.post(f"{gateway.base_url}/v1/chat/completions", content=body, timeout=30,
                          headers={"authorization": f"Bearer {world['key']}", "content-type": "application/json"})

    body = json.dumps({
        "model": "ctx-openai-tools", "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in hostile],
    })
    r = call(body)
    assert r.status_code == 200, r.text
    row = gateway.fetch_row(r.headers["x-request-id"])
    declared = row["tools_declared"]
    assert len(declared) == 128 == len(row["tools_declared_bytes"])
    assert declared[:4] == ["nul\ufffdname", "x" * 64, "dup", "t0"], "names cut to the providers' 64 bytes"
    assert len(set(declared)) == len(declared)
    assert row["tools_invoked"] == ["nul\ufffdname"]
    r = call(body.replace('"dup"', '"dup\\ud800"', 1))
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", r.text
    assert gateway.fetch_row(r.headers["x-request-id"])["status_code"] == 400


def _spooled(gateway: Gateway) -> float:
    text = gateway.admin("GET", "/admin/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("meshfast_telemetry_rows_spooled_total"))


def test_tool_heavy_rows_stay_within_a_ring_record(gateway: Gateway, world: dict[str, Any]) -> None:
    """An agent declaring 100 tools with long names: the row keeps the first names up to 1 KB (so
    it fits one telemetry ring record and is never spooled by the worker), each name once."""
    names = [f"mcp__server_{n:03d}__a_fairly_long_tool_name" for n in range(100)]
    before = _spooled(gateway)
    r = httpx.post(f"{gateway.base_url}/v1/chat/completions", timeout=30,
                   headers={"authorization": f"Bearer {world['key']}"},
                   json={"model": "ctx-openai-tools", "messages": [{"role": "user", "content": "hi"}],
                         "tools": [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
                                   for n in names]})
    assert r.status_code == 200, r.text
    row = gateway.fetch_row(r.headers["x-request-id"])
    declared = row["tools_declared"]
    assert declared == names[:len(declared)]
    assert sum(len(n) for n in declared) <= 1024 < sum(len(n) for n in names[:len(declared) + 1])
    assert row["tools_invoked"] == [names[0]]
    assert _spooled(gateway) == before


def test_failed_calls_are_not_counted_as_declarations(gateway: Gateway, testserve: EmulatedProviders) -> None:
    user = gateway.create_user()
    provider = gateway.create_provider("ts-ctx-failing", family="openai", base_url=f"{testserve.base_url}/openai",
                                       api_key="testserve-key", max_retries=0)
    failing = gateway.create_model(provider["id"], "ctx-openai-failing", resolved_model="dummy-error-500")
    gateway.grant(user["id"], failing["id"])
    ok = next(m for m in gateway.admin("GET", "/admin/models").json() if m["name"] == "ctx-openai-ok")
    gateway.grant(user["id"], ok["id"])
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=user["key"], max_retries=0)
    tools: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
    with pytest.raises(openai.APIError):
        client.chat.completions.create(model="ctx-openai-failing", tools=tools,
                                       messages=[{"role": "user", "content": "hi"}])
    raw = client.chat.completions.with_raw_response.create(model="ctx-openai-ok", tools=tools,
                                                           messages=[{"role": "user", "content": "hi"}])
    gateway.fetch_row(raw.headers["x-request-id"])
    rows = gateway.fetch_rows("model_name", ["ctx-openai-failing"], at_least=1)
    assert any(r["user_id"] is not None and str(r["user_id"]) == user["id"] and r["outcome"] != "success"
               for r in rows)
    by_tool = gateway.admin("GET", f"/admin/logs/summary?user_id={user['id']}").json()["by_tool"]
    assert by_tool == [{"tool": "get_weather", "declared_calls": 1, "invoked_calls": 0, "invocation_rate": 0.0,
                        "estimated_tokens_per_declaration": by_tool[0]["estimated_tokens_per_declaration"]}]
