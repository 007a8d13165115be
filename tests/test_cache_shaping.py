"""Prompt-cache shaping (issue "ecosystem", item 1; API.md "Prompt-cache shaping"), seen by testserve
through the official SDKs: Anthropic breakpoints placed when the caller set none (with the model's
TTL), the caller's own kept as sent, an opaque `prompt_cache_key` for OpenAI upstreams, and both
turned off by the model's registry entry or the caller's `X-Meshfast-Cache: off`. A multi-turn
conversation against testserve's emulated prompt cache is cheaper with shaping, priced in the rows."""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

import anthropic
import httpx
import openai
import pytest
from conftest import EmulatedProviders, Gateway

SYSTEM = "You are a careful assistant for the payments team. " * 120  # about 1,500 tokens
TOOLS = [{"type": "function", "function": {"name": f"tool_{n}", "description": f"Tool number {n}.",
                                            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
         for n in range(3)]
EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture(scope="module")
def world(gateway: Gateway, testserve: EmulatedProviders) -> dict[str, Any]:
    tag = secrets.token_hex(3)
    user, other = gateway.create_user(), gateway.create_user()
    providers = {family: gateway.create_provider(f"ts-cache-{family}-{tag}", family=family, api_key="testserve-key",
                                                 base_url=f"{testserve.base_url}/{prefix}", max_retries=0)
                 for family, prefix in (("anthropic", "anthropic"), ("openai", "openai"),
                                        ("openai_responses", "openai"))}
    models: dict[str, dict[str, Any]] = {}

    def model(name: str, family: str, resolved: str, **extra: Any) -> None:
        models[name] = gateway.create_model(providers[family]["id"], f"{name}-{tag}", resolved_model=resolved,
                                            input_price_per_1k_tokens="0.003", output_price_per_1k_tokens="0.015",
                                            cache_read_price_per_1k_tokens="0.0003",
                                            cache_write_price_per_1k_tokens="0.00375",
                                            cache_write_1h_price_per_1k_tokens="0.006", **extra)
        for person in (user, other):
            gateway.grant(person["id"], models[name]["id"])

    model("claude", "anthropic", f"claude-{tag}")
    model("claude-1h", "anthropic", f"claude1h-{tag}", cache_ttl="1h")
    model("claude-plain", "anthropic", f"claudeplain-{tag}", cache_shaping=False)
    model("gpt", "openai", f"gpt-{tag}")
    model("gpt-responses", "openai_responses", f"gptr-{tag}")
    model("claude-cached", "anthropic", f"cc-{tag}-promptcache")
    model("claude-cached-off", "anthropic", f"ccoff-{tag}-promptcache")
    return {"tag": tag, "user": user, "other": other, "models": models}


def _name(world: dict[str, Any], short: str) -> str:
    return str(world["models"][short]["name"])


def _upstream_body(testserve: EmulatedProviders, resolved: str) -> dict[str, Any]:
    entries = testserve.requests(model=resolved)
    assert entries, f"testserve saw no call for {resolved}"
    return dict(entries[0]["body"])


def _chat(gateway: Gateway, key: str, model: str, messages: list[Any], headers: dict[str, str] | None = None,
          tools: Any = TOOLS) -> Any:
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key, max_retries=0,
                           default_headers=headers or {})
    return client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "system", "content": SYSTEM}, *messages], tools=tools, max_tokens=64)


def _marks(body: Any) -> list[str]:
    """Where the body carries cache_control: tools[i], system[i], messages[m].content[b]."""
    found = []
    for i, tool in enumerate(body.get("tools") or []):
        if "cache_control" in tool:
            found.append(f"tools[{i}]")
    if isinstance(body.get("system"), list):
        found += [f"system[{i}]" for i, part in enumerate(body["system"]) if "cache_control" in part]
    for m, message in enumerate(body.get("messages") or []):
        if isinstance(message.get("content"), list):
            found += [f"messages[{m}].content[{b}]" for b, block in enumerate(message["content"])
                      if "cache_control" in block]
    return found


def test_anthropic_upstreams_get_breakpoints_with_the_models_ttl(gateway: Gateway, testserve: EmulatedProviders,
                                                                 world: dict[str, Any]) -> None:
    key, tag = world["user"]["key"], world["tag"]
    messages = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "answer"},
                {"role": "user", "content": "second"}]
    assert _chat(gateway, key, _name(world, "claude"), messages).status_code == 200
    body = _upstream_body(testserve, f"claude-{tag}")
    assert _marks(body) == ["tools[2]", "system[0]", "messages[2].content[0]"]
    assert body["tools"][2]["cache_control"] == EPHEMERAL
    assert body["system"][0] == {"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}
    assert _chat(gateway, key, _name(world, "claude-1h"), messages).status_code == 200
    body = _upstream_body(testserve, f"claude1h-{tag}")
    assert body["messages"][2]["content"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert len(_marks(body)) == 3


def test_shaping_is_off_for_a_model_that_turns_it_off_or_a_caller_that_asks(
        gateway: Gateway, testserve: EmulatedProviders, world: dict[str, Any]) -> None:
    key, tag = world["user"]["key"], world["tag"]
    messages = [{"role": "user", "content": "hello"}]
    assert _chat(gateway, key, _name(world, "claude-plain"), messages).status_code == 200
    assert _marks(_upstream_body(testserve, f"claudeplain-{tag}")) == []
    for value in ("off", "OFF", "Off"):
        assert _chat(gateway, key, _name(world, "claude"), messages, {"x-meshfast-cache": value}).status_code == 200
        assert _marks(_upstream_body(testserve, f"claude-{tag}")) == [], value
    assert _chat(gateway, key, _name(world, "gpt"), messages, {"x-meshfast-cache": "off"}).status_code == 200
    assert "prompt_cache_key" not in _upstream_body(testserve, f"gpt-{tag}")
    assert _chat(gateway, key, _name(world, "claude"), messages, {"x-meshfast-cache": "on"}).status_code == 200
    assert len(_marks(_upstream_body(testserve, f"claude-{tag}"))) == 3


@pytest.mark.parametrize("value", ["maybe", "0", "", "off;on", "o f f", "off\toff"])
def test_a_bad_cache_header_is_a_400_in_the_entrys_shape(gateway: Gateway, world: dict[str, Any], value: str) -> None:
    r = httpx.post(f"{gateway.base_url}/v1/chat/completions", timeout=30,
                   headers={"authorization": f"Bearer {world['user']['key']}",
                            "x-meshfast-cache": value.encode()},
                   json={"model": _name(world, "claude"), "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_request"
    row = gateway.fetch_row(r.headers["x-request-id"])
    assert (row["status_code"], row["deny_reason"]) == (400, "invalid_request")


def test_a_callers_own_breakpoints_are_kept_as_sent(gateway: Gateway, testserve: EmulatedProviders,
                                                    world: dict[str, Any]) -> None:
    key, tag = world["user"]["key"], world["tag"]
    client = anthropic.Anthropic(base_url=gateway.base_url, api_key=key, max_retries=0)
    client.messages.create(
        model=_name(world, "claude"), max_tokens=64,
        system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        tools=[{"name": "a", "input_schema": {"type": "object"}}, {"name": "b", "input_schema": {"type": "object"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "one", "cache_control": EPHEMERAL},
                                               {"type": "text", "text": "two"}]}])
    body = _upstream_body(testserve, f"claude-{tag}")
    assert _marks(body) == ["system[0]", "messages[0].content[0]"]
    assert body["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}


def test_openai_upstreams_get_an_opaque_key_per_principal(gateway: Gateway, testserve: EmulatedProviders,
                                                          world: dict[str, Any]) -> None:
    tag = world["tag"]
    keys = []
    for person in (world["user"], world["user"], world["other"]):
        assert _chat(gateway, person["key"], _name(world, "gpt"), [{"role": "user", "content": "hi"}]).status_code == 200
        keys.append(_upstream_body(testserve, f"gpt-{tag}")["prompt_cache_key"])
    assert all(re.fullmatch(r"[0-9a-f]{32}", k) for k in keys)
    assert keys[0] == keys[1] != keys[2], "one key per principal"
    for person in (world["user"], world["other"]):
        for k in keys:
            assert person["id"].replace("-", "") not in k and person["email"] not in k
    # The Responses API too: the same person gets another key at another provider (two providers
    # cannot link a person by it), the same one on every call there.
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=world["user"]["key"], max_retries=0)
    responses_keys = []
    for _ in range(2):
        client.responses.create(model=_name(world, "gpt-responses"), input="hi")
        responses_keys.append(_upstream_body(testserve, f"gptr-{tag}")["prompt_cache_key"])
    assert re.fullmatch(r"[0-9a-f]{32}", responses_keys[0]) and responses_keys[0] == responses_keys[1] != keys[0]


def test_model_cache_fields_are_validated_and_listed(gateway: Gateway, world: dict[str, Any]) -> None:
    listed = gateway.admin("GET", f"/admin/models/{world['models']['claude-1h']['id']}").json()
    assert (listed["cache_shaping"], listed["cache_ttl"]) == (True, "1h")
    plain = gateway.admin("GET", f"/admin/models/{world['models']['claude-plain']['id']}").json()
    assert (plain["cache_shaping"], plain["cache_ttl"]) == (False, "5m")
    provider_id = world["models"]["claude"]["provider_id"]
    for bad in ({"cache_ttl": "2h"}, {"cache_ttl": 5}, {"cache_shaping": "yes"}):
        r = gateway.admin("POST", "/admin/models", {"provider_id": provider_id, "name": f"bad-{secrets.token_hex(3)}",
                                                    "resolved_model": "x", "kind": "chat", "verify": False, **bad})
        assert r.status_code == 400, (bad, r.text)


def _conversation(gateway: Gateway, key: str, model: str, turns: int, headers: dict[str, str]) -> list[str]:
    """A tool-using agent's turns: each repeats the conversation so far and adds a tool result."""
    messages: list[Any] = [{"role": "user", "content": "Reconcile the ledger for March."}]
    ids = []
    for turn in range(turns):
        raw = _chat(gateway, key, model, messages, headers)
        ids.append(raw.headers["x-request-id"])
        reply = raw.parse().choices[0].message.content or ""
        call_id = f"call_{turn}"
        messages += [
            {"role": "assistant", "content": reply,
             "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "tool_0", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call_id, "content": json.dumps({"rows": list(range(60)), "turn": turn})},
        ]
    return ids


def test_a_multi_turn_conversation_reads_the_cache_and_costs_less(gateway: Gateway, world: dict[str, Any]) -> None:
    key = world["user"]["key"]
    shaped = [gateway.fetch_row(rid) for rid in _conversation(gateway, key, _name(world, "claude-cached"), 5, {})]
    plain = [gateway.fetch_row(rid) for rid in
             _conversation(gateway, key, _name(world, "claude-cached-off"), 5, {"x-meshfast-cache": "off"})]
    assert shaped[0]["cache_read_tokens"] == 0 < shaped[0]["cache_write_tokens"]
    assert all(r["cache_read_tokens"] > 0 for r in shaped[1:]), [r["cache_read_tokens"] for r in shaped]
    assert all(r["cache_read_tokens"] == 0 == r["cache_write_tokens"] for r in plain)
    cost = [float(sum(r["input_cost"] + r["output_cost"] for r in rows)) for rows in (shaped, plain)]
    print("five turns, shaped vs plain USD:", cost)
    assert cost[0] < cost[1] * 0.6, cost
    # The same prompts: the token totals agree; only their classes (and so the price) differ.
    total = [sum(r["tokens_in"] + r["cache_read_tokens"] + r["cache_write_tokens"] for r in rows)
             for rows in (shaped, plain)]
    assert abs(total[0] - total[1]) <= total[1] * 0.02, total
    # The summary (hourly rollups) reports the cache classes and the hit rate, equal to the rows'.
    model_id = world["models"]["claude-cached"]["id"]
    totals = gateway.admin("GET", f"/admin/logs/summary?user_id={world['user']['id']}&model_id={model_id}").json()
    read, write = (sum(r[k] for r in shaped) for k in ("cache_read_tokens", "cache_write_tokens"))
    assert (totals["totals"]["cache_read_tokens"], totals["totals"]["cache_write_tokens"]) == (read, write)
    assert totals["totals"]["cache_hit_rate"] == round(read / total[0], 4)
    assert totals["by_model"][0]["cache_read_tokens"] == read


def test_one_hour_cache_writes_are_kept_apart_in_the_row(gateway: Gateway, testserve: EmulatedProviders,
                                                         world: dict[str, Any]) -> None:
    provider_id = world["models"]["claude"]["provider_id"]
    model = gateway.create_model(provider_id, f"cc1h-{world['tag']}", resolved_model=f"cc1h-{world['tag']}-promptcache",
                                 cache_ttl="1h", input_price_per_1k_tokens="0.003", output_price_per_1k_tokens="0.015",
                                 cache_write_price_per_1k_tokens="0.00375", cache_write_1h_price_per_1k_tokens="0.006")
    gateway.grant(world["user"]["id"], model["id"])
    raw = _chat(gateway, world["user"]["key"], model["name"], [{"role": "user", "content": "hello"}])
    row = gateway.fetch_row(raw.headers["x-request-id"])
    assert row["cache_write_tokens"] > 0 and row["cache_write_1h_tokens"] == row["cache_write_tokens"]
    # Priced at the one-hour rate: input and writes at their own prices, nothing read.
    expected = (row["tokens_in"] * 0.003 + row["cache_write_tokens"] * 0.006) / 1000
    assert float(row["input_cost"]) == pytest.approx(expected, abs=1e-8)
