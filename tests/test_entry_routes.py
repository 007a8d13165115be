"""The standard routes with the official SDKs, unmodified, base_url pointed at meshfast: every
entry API against every upstream family (testserve), streaming and not, exact text, usage and
the row; errors raise each SDK's own exception types."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
from conftest import EmulatedProviders, Gateway
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from testserve.content import Prompt, reply_text

FAMILIES = ("anthropic", "openai", "openai_responses", "gemini", "ollama")
PREFIX = {"anthropic": "anthropic", "openai": "openai", "openai_responses": "openai", "gemini": "gemini",
          "ollama": "ollama"}
ENTRIES = ("openai_chat", "openai_responses", "anthropic", "gemini", "ollama")
SCENARIOS = ("ok", "error-429", "error-500", "conn-reset", "nousage")


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
            f"ts-entry-{family}", family=family, base_url=f"{testserve.base_url}/{PREFIX[family]}",
            api_key="testserve-key", retry_backoff_ms=20, max_retries=1,
        )
        for scenario in SCENARIOS:
            name = f"en-{family}-{scenario}"
            models[name] = gateway.create_model(provider["id"], name, resolved_model=f"dummy-{scenario}",
                                                supports_image_in=True)
            gateway.grant(user["id"], models[name]["id"])
        if family in ("openai", "gemini"):
            embed = gateway.create_model(provider["id"], f"en-{family}-embed", resolved_model="dummy-embed",
                                         kind="embedding")
            gateway.grant(user["id"], embed["id"])
    gateway.create_model(provider["id"], "en-not-granted", resolved_model="dummy-ok")
    return {"user": user, "models": models}


def _call(gateway: Gateway, entry: str, key: str, model: str, stream: bool) -> tuple[str, int, int]:
    """One call through the entry's official SDK; returns (text, input tokens, output tokens)."""
    base = gateway.base_url
    if entry == "openai_chat":
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
        messages: Any = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
        if not stream:
            r = client.chat.completions.create(model=model, messages=messages, max_tokens=50)
            assert r.model == model and r.choices[0].finish_reason == "stop"
            assert r.usage is not None
            return r.choices[0].message.content or "", r.usage.prompt_tokens, r.usage.completion_tokens
        parts, usage = [], None
        for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=50, stream=True,
                                                    stream_options={"include_usage": True}):
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
        assert usage is not None
        return "".join(parts), usage.prompt_tokens, usage.completion_tokens
    if entry == "openai_responses":
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
        if not stream:
            resp = client.responses.create(model=model, input="hello", instructions="be brief", max_output_tokens=50)
            assert resp.usage is not None
            return resp.output_text, resp.usage.input_tokens, resp.usage.output_tokens
        parts, final = [], None
        for event in client.responses.create(model=model, input="hello", max_output_tokens=50, stream=True):
            if event.type == "response.output_text.delta":
                parts.append(event.delta)
            elif event.type == "response.completed":
                final = event.response
        assert final is not None and final.usage is not None
        assert final.output_text == "".join(parts)
        return "".join(parts), final.usage.input_tokens, final.usage.output_tokens
    if entry == "anthropic":
        aclient = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
        messages = [{"role": "user", "content": "hello"}]
        if not stream:
            m = aclient.messages.create(model=model, max_tokens=50, system="be brief", messages=messages)
            assert m.model == model and m.stop_reason == "end_turn"
            return "".join(b.text for b in m.content if b.type == "text"), m.usage.input_tokens, m.usage.output_tokens
        with aclient.messages.stream(model=model, max_tokens=50, messages=messages) as s:
            text = "".join(s.text_stream)
            final_message = s.get_final_message()
        return text, final_message.usage.input_tokens, final_message.usage.output_tokens
    if entry == "gemini":
        gclient = genai.Client(api_key=key, http_options=genai_types.HttpOptions(base_url=base, api_version="v1beta",
                                                                                 retry_options=None))
        config = genai_types.GenerateContentConfig(max_output_tokens=50, system_instruction="be brief")
        if not stream:
            g = gclient.models.generate_content(model=model, contents="hello", config=config)
            assert g.usage_metadata is not None
            return g.text or "", g.usage_metadata.prompt_token_count or 0, g.usage_metadata.candidates_token_count or 0
        parts, meta = [], None
        for chunk in gclient.models.generate_content_stream(model=model, contents="hello", config=config):
            parts.append(chunk.text or "")
            meta = chunk.usage_metadata or meta
        assert meta is not None
        return "".join(parts), meta.prompt_token_count or 0, meta.candidates_token_count or 0
    oclient = ollama.Client(host=base, headers={"authorization": f"Bearer {key}"})
    if not stream:
        o = oclient.chat(model=model, messages=[{"role": "user", "content": "hello"}], stream=False)
        return o.message.content or "", o.prompt_eval_count or 0, o.eval_count or 0
    parts, last = [], None
    for chunk in oclient.chat(model=model, messages=[{"role": "user", "content": "hello"}], stream=True):
        parts.append(chunk.message.content or "")
        last = chunk
    assert last is not None and last.done
    return "".join(parts), last.prompt_eval_count or 0, last.eval_count or 0


_calls: dict[str, int] = {}


def _row_of_last_call(gateway: Gateway, model: str) -> dict[str, Any]:
    """The row of the latest call on ``model`` (each model's calls are counted here)."""
    _calls[model] = _calls.get(model, 0) + 1
    rows = gateway.fetch_rows("model_name", [model], at_least=_calls[model])
    assert len(rows) == _calls[model], f"{len(rows)} rows for {_calls[model]} calls on {model}"
    return rows[-1]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("entry", ENTRIES)
def test_every_sdk_reaches_every_family(gateway: Gateway, world: dict[str, Any], entry: str, family: str) -> None:
    """Non-streaming and streaming: the exact text testserve wrote, usage as reported, one row each."""
    key = world["user"]["key"]
    model = f"en-{family}-ok"
    want = reply_text(family, _hello())
    for stream in (False, True):
        text, tokens_in, tokens_out = _call(gateway, entry, key, model, stream)
        assert text == want, (entry, family, stream)
        assert tokens_in > 0 and tokens_out > 0
        row = _row_of_last_call(gateway, model)
        assert (row["route"], row["outcome"], row["status_code"]) == (entry, "success", 200)
        assert (row["tokens_in"], row["tokens_out"]) == (tokens_in, tokens_out)
        assert row["usage_estimated"] is False
        assert row["output_cost"] > 0 and row["model_name"] == model and row["requested_model"] == model


def test_errors_raise_each_sdks_own_exceptions(gateway: Gateway, world: dict[str, Any]) -> None:
    key = world["user"]["key"]
    base = gateway.base_url
    oc = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    msgs: Any = [{"role": "user", "content": "hello"}]
    with pytest.raises(openai.NotFoundError) as nf:
        oc.chat.completions.create(model="no-such-model", messages=msgs)
    assert nf.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        oc.chat.completions.create(model="en-not-granted", messages=msgs)
    rows = {r["requested_model"]: r for r in gateway.fetch_rows("requested_model", ["no-such-model", "en-not-granted"],
                                                               at_least=2)}
    assert rows["no-such-model"]["deny_reason"] == "unknown_model"
    assert rows["en-not-granted"]["deny_reason"] == "model_not_permitted"
    assert {r["status_code"] for r in rows.values()} == {404}
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base}/v1", api_key="mesh_live_" + "x" * 43, max_retries=0).chat.completions.create(
            model="en-openai-ok", messages=msgs)
    with pytest.raises(openai.RateLimitError) as rl:
        oc.chat.completions.create(model="en-openai-error-429", messages=msgs)
    assert rl.value.code == "upstream_rate_limited"
    with pytest.raises(openai.InternalServerError) as bad:
        oc.chat.completions.create(model="en-openai-error-500", messages=msgs)
    assert bad.value.status_code == 502 and bad.value.code == "upstream_unavailable"

    ac = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    with pytest.raises(anthropic.NotFoundError):
        ac.messages.create(model="no-such-model", max_tokens=10, messages=msgs)
    with pytest.raises(anthropic.RateLimitError):
        ac.messages.create(model="en-anthropic-error-429", max_tokens=10, messages=msgs)
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=base, api_key="bad", max_retries=0).messages.create(
            model="en-anthropic-ok", max_tokens=10, messages=msgs)

    gc = genai.Client(api_key=key, http_options=genai_types.HttpOptions(base_url=base, api_version="v1beta"))
    with pytest.raises(genai_errors.ClientError) as gerr:
        gc.models.generate_content(model="no-such-model", contents="hello")
    assert gerr.value.code == 404

    with pytest.raises(ollama.ResponseError) as oerr:
        ollama.Client(host=base, headers={"authorization": f"Bearer {key}"}).chat(
            model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert oerr.value.status_code == 404


def test_a_stream_cut_short_ends_in_the_formats_error_signal(gateway: Gateway, world: dict[str, Any]) -> None:
    """OpenAI: an error event and no [DONE]; Anthropic: an `event: error` frame; the row says so."""
    key = world["user"]["key"]
    with httpx.Client(base_url=gateway.base_url, timeout=30) as client:
        r = client.post("/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                        json={"model": "en-anthropic-conn-reset", "stream": True,
                              "messages": [{"role": "user", "content": "hello"}]})
        assert r.status_code == 200
        assert "upstream_incomplete" in r.text and "[DONE]" not in r.text
        row = _row_of_last_call(gateway, "en-anthropic-conn-reset")
        assert row["outcome"] == "upstream_error"
        r = client.post("/v1/messages", headers={"x-api-key": key},
                        json={"model": "en-openai-conn-reset", "stream": True, "max_tokens": 20,
                              "messages": [{"role": "user", "content": "hello"}]})
        assert "event: error" in r.text and "message_stop" not in r.text
        # Not streamed: the broken upstream is a 502 in the API's shape.
        r = client.post("/v1/messages", headers={"x-api-key": key},
                        json={"model": "en-gemini-conn-reset", "max_tokens": 20,
                              "messages": [{"role": "user", "content": "hello"}]})
        assert r.status_code == 502 and r.json()["type"] == "error"


def test_usage_is_estimated_when_the_upstream_reports_none(gateway: Gateway, world: dict[str, Any]) -> None:
    key = world["user"]["key"]
    text, tokens_in, tokens_out = _call(gateway, "openai_chat", key, "en-openai-nousage", stream=False)
    assert text == reply_text("openai", _hello())
    row = _row_of_last_call(gateway, "en-openai-nousage")
    assert row["usage_estimated"] is True and row["tokens_out"] == tokens_out > 0


def test_bad_bodies_are_400_in_the_routes_shape(gateway: Gateway, world: dict[str, Any]) -> None:
    key = world["user"]["key"]
    with httpx.Client(base_url=gateway.base_url, timeout=30) as client:
        h = {"authorization": f"Bearer {key}", "content-type": "application/json"}
        for path, body in (("/v1/chat/completions", b"{not json"), ("/v1/messages", b'{"model":"x"}'),
                           ("/v1/responses", b"[]"), ("/api/chat", b'{"model":1}')):
            r = client.post(path, headers=h, content=body)
            assert r.status_code == 400, (path, r.text)
            error = r.json()["error"]
            assert error, r.text
        r = client.post("/v1beta/models/en-gemini-ok:generateContent", headers={"x-goog-api-key": key},
                        content=b'{"contents": 5}')
        assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
        r = client.post("/v1/chat/completions", content=b"{}")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_or_revoked_key"
        # An inline image over the per-block limit (20 MiB decoded): 400, never sent upstream.
        huge = "A" * (28 << 20)
        r = client.post("/v1/chat/completions", headers=h, json={
            "model": "en-openai-ok", "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{huge}"}}]}]})
        assert r.status_code == 400 and "size limit" in r.json()["error"]["message"]


def test_unclassified_fields_are_counted_not_silently_dropped(gateway: Gateway, world: dict[str, Any]) -> None:
    key = world["user"]["key"]
    with httpx.Client(base_url=gateway.base_url, timeout=30) as client:
        r = client.post("/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                        json={"model": "en-openai-ok", "messages": [{"role": "user", "content": "hello"}],
                              "frobnicate": True})
        assert r.status_code == 200
    assert "unclassified request field 'frobnicate' on openai_chat" in gateway.log()


def test_ollama_tags_lists_the_keys_models(gateway: Gateway, world: dict[str, Any]) -> None:
    key = world["user"]["key"]
    listed = ollama.Client(host=gateway.base_url, headers={"authorization": f"Bearer {key}"}).list()
    names = {m.model for m in listed.models}
    assert set(world["models"]) <= names and "en-not-granted" not in names
    r = httpx.get(f"{gateway.base_url}/api/tags")
    assert r.status_code == 401 and json.loads(r.text)["error"]


@pytest.mark.parametrize("family", ["openai", "gemini"])
def test_openai_embeddings_with_the_model_in_the_body(gateway: Gateway, world: dict[str, Any], family: str) -> None:
    """String and list input, base64 (the SDK's default) and float, one row per request."""
    key = world["user"]["key"]
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key, max_retries=0)
    model = f"en-{family}-embed"
    listed = client.embeddings.create(model=model, input=["hello", "world"])
    assert [d.index for d in listed.data] == [0, 1] and listed.model == model
    floats = client.embeddings.create(model=model, input="hello", encoding_format="float")
    assert len(floats.data) == 1 and len(floats.data[0].embedding) == len(listed.data[0].embedding) > 0
    # base64 carries float32: the same vector up to float32 rounding.
    assert listed.data[0].embedding == pytest.approx(floats.data[0].embedding, rel=1e-6)
    rows = gateway.fetch_rows("model_name", [model], at_least=2)
    assert [(r["route"], r["outcome"], r["status_code"]) for r in rows] == [("openai_embeddings", "success", 200)] * 2
    assert rows[0]["tokens_in"] == listed.usage.prompt_tokens > 0
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model=f"en-{family}-ok", input="a chat model")
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=model, input=[[1, 2, 3]])
