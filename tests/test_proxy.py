"""POST /v1/proxy end to end: every family and every testserve scenario through real workers,
what the caller receives and what row is written."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from conftest import EmulatedProviders, Gateway

from testserve.content import Prompt, reply_text

FAMILIES = ("anthropic", "openai", "openai_responses", "gemini", "ollama")
PREFIX = {"anthropic": "anthropic", "openai": "openai", "openai_responses": "openai", "gemini": "gemini",
          "ollama": "ollama"}


@dataclass(frozen=True)
class Expect:
    """What a scenario must produce: HTTP status, stream ending, row outcome, deltas."""

    status: int
    ending: str  # "done", "incomplete" or "error"
    outcome: str
    deltas: str  # "words", "none", "two", "huge", "any"
    provider_status: int | None = None
    attempts: int = 1


# scenario -> behaviour, for the Anthropic family (max_retries 2 => 3 attempts on retryable errors).
SCENARIOS: dict[str, Expect] = {
    "ok": Expect(200, "done", "success", "words"),
    "slow": Expect(200, "done", "success", "words"),
    "hang": Expect(502, "error", "upstream_error", "none", None, 3),
    "error-400": Expect(502, "error", "upstream_error", "none", 400, 1),
    "error-429": Expect(502, "error", "upstream_error", "none", 429, 3),
    "error-500": Expect(502, "error", "upstream_error", "none", 500, 3),
    "flaky": Expect(200, "done", "success", "words", None, 3),
    "conn-reset": Expect(200, "incomplete", "upstream_error", "two"),
    "badjson": Expect(200, "done", "success", "none"),
    "nousage": Expect(200, "done", "success", "words"),
    "empty": Expect(200, "done", "success", "none"),
    "unicode": Expect(200, "done", "success", "words"),
    "huge": Expect(200, "done", "success", "huge"),
    "keepalive": Expect(200, "done", "success", "words"),
    "customdone": Expect(200, "done", "success", "words"),
}


def _hello() -> Prompt:
    prompt = Prompt()
    prompt.add_text("hello")
    return prompt


@pytest.fixture(scope="module")
def world(gateway: Gateway, testserve: EmulatedProviders) -> dict[str, Any]:
    user = gateway.create_user()
    models: dict[str, dict[str, Any]] = {}
    for family in FAMILIES:
        provider = gateway.create_provider(
            f"ts-proxy-{family}", family=family, base_url=f"{testserve.base_url}/{PREFIX[family]}",
            api_key="testserve-key", retry_backoff_ms=50, max_retries=2,
            response_done_signal="END_OF_STREAM" if family == "anthropic" else None,
        )
        for scenario in SCENARIOS:
            name = f"px-{family}-{scenario}"
            models[name] = gateway.create_model(provider["id"], name, resolved_model=f"dummy-{scenario}",
                                                supports_image_in=True)
            gateway.grant(user["id"], models[name]["id"])
    return {"user": user, "models": models}


def _call(gateway: Gateway, key: str, model: str, body: Any, timeout: float = 30) -> tuple[httpx.Response, list[dict[str, Any]], bool]:
    """POST /v1/proxy; returns the response, its parsed NDJSON lines and whether the stream broke."""
    lines: list[dict[str, Any]] = []
    broken = False
    with gateway.client.stream("POST", "/v1/proxy", params={"model": model}, json=body,
                               headers={"authorization": f"Bearer {key}"}, timeout=timeout) as response:
        try:
            raw = b"".join(response.iter_raw())
        except httpx.HTTPError:
            broken = True
            raw = b""
    for line in raw.splitlines():
        if line.strip():
            lines.append(json.loads(line))
    return response, lines, broken


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_anthropic_scenario_table(gateway: Gateway, testserve: EmulatedProviders, world: dict[str, Any], scenario: str) -> None:
    """Each scenario gives its status, stream ending, row outcome and token counts."""
    expect = SCENARIOS[scenario]
    model = f"px-anthropic-{scenario}"
    testserve.client.delete("/_debug/requests")
    started = time.monotonic()
    response, lines, _ = _call(gateway, world["user"]["key"], model, {"query": "hello", "max_tokens": 64})
    took = time.monotonic() - started
    rid = response.headers["x-request-id"]
    assert response.status_code == expect.status
    upstream_calls = [e for e in testserve.requests() if e["model"] == f"dummy-{scenario}"]
    assert len(upstream_calls) == expect.attempts
    row = gateway.fetch_row(rid)
    assert row["outcome"] == expect.outcome
    assert row["model_name"] == model and row["requested_model"] == model
    assert str(row["user_id"]) == world["user"]["id"]
    if expect.ending == "error":
        body = lines[0]
        assert body["error"] == "upstream_unavailable"
        if expect.provider_status:
            assert body["provider_status"] == expect.provider_status
            assert body["provider_message"]
            assert row["status_code"] == expect.provider_status
        else:
            assert row["status_code"] == 502
        assert row["tokens_in"] == 0 and row["tokens_out"] == 0
        return
    assert response.headers["content-type"].startswith("application/x-ndjson")
    deltas = [line["delta"] for line in lines if "delta" in line]
    done = lines[-1]
    assert all(line["id"] == rid for line in lines)
    assert done["done"] is True
    text = "".join(deltas)
    words = reply_text("anthropic", _hello(), scenario)
    if expect.ending == "incomplete":
        assert done.get("incomplete") is True
    else:
        assert "incomplete" not in done
    if expect.deltas == "words":
        assert text == words
    elif expect.deltas == "none":
        assert deltas == []
    elif expect.deltas == "two":
        assert len(deltas) == 2
    elif expect.deltas == "huge":
        assert text == words and len(deltas) == len(words.split(" "))
    assert row["status_code"] == 200
    assert row["tokens_out"] == done["usage"]["output_tokens"]
    assert row["tokens_in"] == done["usage"]["input_tokens"]
    if scenario == "nousage":
        assert row["usage_estimated"] is True and row["tokens_out"] > 0
    elif expect.deltas == "words":
        assert row["tokens_out"] == len(deltas) and row["usage_estimated"] is False
    if scenario == "slow":
        assert took >= 1.0
    if row["tokens_in"] or row["tokens_out"]:
        expected_in = row["tokens_in"] * 1_000_000 // 1000  # $0.001 per 1k tokens, in nano-USD
        assert int(row["input_cost"] * 1_000_000_000) == expected_in


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_streams_renders_and_never_leaks(gateway: Gateway, testserve: EmulatedProviders,
                                                     world: dict[str, Any], family: str) -> None:
    """Text and an image reach each family in its own shape; no key or placeholder upstream."""
    testserve.client.delete("/_debug/requests")
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGBgAAAABQABpfZFQAAAAABJRU5ErkJggg=="
    body = {"content": [{"type": "text", "text": "hello"},
                        {"type": "image", "media_type": "image/png", "data": png}], "max_tokens": 50}
    response, lines, broken = _call(gateway, world["user"]["key"], f"px-{family}-ok", body)
    assert response.status_code == 200 and not broken
    text = "".join(line.get("delta", "") for line in lines)
    assert text.startswith(f"testserve[{family}")
    assert "image(image/png" in text
    assert lines[-1]["done"] is True and lines[-1]["usage"]["output_tokens"] > 0
    (entry,) = [e for e in testserve.requests() if e["model"] == "dummy-ok"]
    assert entry["key_presented"] == "testserve-key"
    assert entry["key_leaked_in_body"] is False
    assert entry["placeholders_left"] is False
    assert world["user"]["key"] not in json.dumps(entry)
    assert "max_tokens" in json.dumps(entry["body"]) or "maxOutputTokens" in json.dumps(entry["body"]) \
        or "max_output_tokens" in json.dumps(entry["body"])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("scenario", ["conn-reset", "nousage", "unicode"])
def test_every_family_handles_breaks_missing_usage_and_unicode(
        gateway: Gateway, world: dict[str, Any], family: str, scenario: str) -> None:
    """conn-reset ends incomplete, nousage is estimated, unicode arrives byte-exact, in every family."""
    response, lines, broken = _call(gateway, world["user"]["key"], f"px-{family}-{scenario}", {"query": "hello"})
    assert response.status_code == 200 and not broken
    done = lines[-1]
    assert done["done"] is True
    row = gateway.fetch_row(response.headers["x-request-id"])
    if scenario == "conn-reset":
        assert done.get("incomplete") is True and row["outcome"] == "upstream_error"
        assert len([line for line in lines if "delta" in line]) == 2
    elif scenario == "nousage":
        assert row["usage_estimated"] is True and row["tokens_in"] > 0 and row["tokens_out"] > 0
    else:
        text = "".join(line.get("delta", "") for line in lines)
        assert text == reply_text(family, _hello(), "unicode")


@pytest.mark.parametrize(
    ("body", "detail_hint"),
    [
        (b"{not json", None),
        (json.dumps({"query": "a", "content": [{"type": "text", "text": "b"}]}).encode(), None),
        (b"{}", None),
        (json.dumps({"query": "a", "max_tokens": 0}).encode(), None),
        (json.dumps({"content": [{"type": "hologram", "text": "x"}]}).encode(), None),
        (json.dumps({"content": [{"type": "image"}]}).encode(), None),
        (json.dumps({"content": [{"type": "image", "data": "AAAA"}]}).encode(), None),
        (json.dumps({"content": [{"type": "image", "media_type": "image/png",
                                  "data": "A" * (28 * 1024 * 1024)}]}).encode(), None),
        (b"\xff\xfe\xfd", None),
        (b"[1,2,3]", None),
    ],
)
def test_bad_bodies_are_mesh_400s_with_a_row(gateway: Gateway, world: dict[str, Any], body: bytes,
                                             detail_hint: str | None) -> None:
    """Malformed JSON, wrong block types, oversized blocks, both/neither query and content: 400."""
    response = gateway.client.post("/v1/proxy", params={"model": "px-openai-ok"}, content=body,
                                   headers={"authorization": f"Bearer {world['user']['key']}"})
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "invalid_request"
    row = gateway.fetch_row(response.headers["x-request-id"])
    assert row["outcome"] == "denied" and row["deny_reason"] == "invalid_request"


def test_denials_are_rows_too(gateway: Gateway, world: dict[str, Any]) -> None:
    """A bad key (401) and an ungranted model (403) answer in Mesh's shape and write a row."""
    response = gateway.client.post("/v1/proxy", params={"model": "px-openai-ok"}, json={"query": "x"},
                                   headers={"authorization": "Bearer mesh_live_nope"})
    assert response.status_code == 401 and response.json() == {"error": "invalid_or_revoked_key"}
    assert gateway.fetch_row(response.headers["x-request-id"])["deny_reason"] == "invalid_or_revoked_key"
    response = gateway.client.post("/v1/proxy", params={"model": "not-a-model"}, json={"query": "x"},
                                   headers={"authorization": f"Bearer {world['user']['key']}"})
    assert response.status_code == 403 and response.json()["error"] == "model_not_permitted"
    row = gateway.fetch_row(response.headers["x-request-id"])
    assert row["deny_reason"] == "model_not_permitted" and str(row["user_id"]) == world["user"]["id"]


def test_spend_reaches_usage_and_models(gateway: Gateway, world: dict[str, Any]) -> None:
    """A priced call shows up as spend in /v1/usage and /v1/models right away (shared counters)."""
    key = world["user"]["key"]
    before = {u["model"]: u for u in gateway.client.get("/v1/usage", headers={"authorization": f"Bearer {key}"}).json()["usage"]}
    response, lines, _ = _call(gateway, key, "px-gemini-ok", {"query": "hello"})
    assert response.status_code == 200
    after = {u["model"]: u for u in gateway.client.get("/v1/usage", headers={"authorization": f"Bearer {key}"}).json()["usage"]}
    assert after["px-gemini-ok"]["spent_usd"] > before["px-gemini-ok"]["spent_usd"]


def test_verify_on_save_calls_each_model_and_refuses_failures(gateway: Gateway, testserve: EmulatedProviders) -> None:
    """verify (the default) makes one live call per chat model; a failing model means 422 and no write."""
    base = {"family": "openai", "base_url": f"{testserve.base_url}/openai", "api_key": "testserve-key", "local": True}
    model = {"resolved_model": "dummy-chat", "kind": "chat", "input_price_per_1k_tokens": "0.001",
             "output_price_per_1k_tokens": "0.002"}
    testserve.client.delete("/_debug/requests")
    good = gateway.admin("POST", "/admin/providers", {**base, "name": "verified-ok",
                                                      "models": [{**model, "name": "verified-ok-chat"}]})
    assert good.status_code == 201, good.text
    assert [e["model"] for e in testserve.requests()] == ["dummy-chat"]
    bad = gateway.admin("POST", "/admin/providers", {**base, "name": "verified-bad", "models": [
        {**model, "name": "verified-bad-chat"}, {**model, "name": "verified-bad-400", "resolved_model": "dummy-error-400"}]})
    assert bad.status_code == 422, bad.text
    assert bad.json()["error"] == "model_verification_failed"
    assert [f["model"] for f in bad.json()["failures"]] == ["verified-bad-400"]
    assert "verified-bad" not in {p["name"] for p in gateway.admin("GET", "/admin/providers").json()}
    # A model added later is verified against its provider too.
    refused = gateway.admin("POST", "/admin/models", {**model, "name": "verified-late", "provider_id": good.json()["id"],
                                                      "resolved_model": "dummy-error-500"})
    assert refused.status_code == 422 and refused.json()["failures"][0]["model"] == "verified-late"
    unreachable = gateway.admin("POST", "/admin/providers", {**base, "name": "verified-gone", "base_url": "http://127.0.0.1:9/openai",
                                                             "models": [{**model, "name": "verified-gone-chat"}]})
    assert unreachable.status_code == 422


@pytest.mark.parametrize("family", ["anthropic", "openai", "openai_responses", "gemini"])
def test_web_search_streams_sources_and_bills_searches(gateway: Gateway, testserve: EmulatedProviders,
                                                       family: str) -> None:
    """web_search: sources lines as citations arrive, merged sources and web_searches in the done line."""
    provider = gateway.create_provider(f"ws-{family}", family=family, base_url=f"{testserve.base_url}/{PREFIX[family]}",
                                       api_key="testserve-key", supports_web_search=True,
                                       web_search_price_per_call="0.01")
    model = gateway.create_model(provider["id"], f"ws-{family}", resolved_model="dummy-chat", supports_web_search=True)
    user = gateway.create_user()
    gateway.grant(user["id"], model["id"])
    response, lines, broken = _call(gateway, user["key"], f"ws-{family}", {"query": "news", "web_search": True})
    assert response.status_code == 200 and not broken
    streamed = [s for line in lines if "sources" in line and "done" not in line for s in line["sources"]]
    done = lines[-1]
    assert streamed and all(s["url"].startswith("http") for s in streamed)
    assert [s["url"] for s in done["sources"]] == list(dict.fromkeys(s["url"] for s in streamed))
    assert done["usage"]["web_searches"] >= 1
    row = gateway.fetch_row(response.headers["x-request-id"])
    assert row["web_searches"] == done["usage"]["web_searches"]
    searches_nano = 10_000_000 * row["web_searches"]
    tokens_nano = row["tokens_in"] * 1_000_000 // 1000
    assert int(row["input_cost"] * 1_000_000_000) == searches_nano + tokens_nano
    # Without the flag the same model streams no sources.
    response, lines, _ = _call(gateway, user["key"], f"ws-{family}", {"query": "news"})
    assert not any("sources" in line for line in lines)
