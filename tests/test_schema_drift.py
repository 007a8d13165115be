"""Schema drift is a signal: every request field of the pinned official SDKs is classified by its
codec (mapped into the IR, passed through to an upstream of the same format, or ignored), and a
field no codec knows is counted and never forwarded."""

from __future__ import annotations

import secrets
from typing import Any

import httpx
import pytest
from anthropic.types import message_create_params
from conftest import EmulatedProviders, Gateway
from google import genai
from google.genai import models as genai_models
from google.genai import types as genai_types
from ollama._types import ChatRequest, Options
from openai.types.chat import completion_create_params
from openai.types.responses import response_create_params

from meshfast import _core

FORMATS = ("openai_chat", "openai_responses", "anthropic", "gemini", "ollama")

# One plausible value per GenerateContentConfig field, so the SDK's own converter shows where
# it puts the field on the wire (Gemini's request is not a typed dict: the SDK builds it).
_GEMINI_CONFIG_SAMPLES: dict[str, Any] = {
    "system_instruction": "be terse", "temperature": 0.5, "top_p": 0.9, "top_k": 40, "candidate_count": 1,
    "max_output_tokens": 10, "stop_sequences": ["x"], "response_logprobs": True, "logprobs": 2,
    "presence_penalty": 0.1, "frequency_penalty": 0.1, "seed": 1, "response_mime_type": "application/json",
    "response_schema": {"type": "OBJECT"}, "response_json_schema": {"type": "object"},
    "safety_settings": [{"category": "HARM_CATEGORY_HATE_SPEECH", "threshold": "BLOCK_NONE"}],
    "tools": [{"function_declarations": [{"name": "f"}]}], "tool_config": {"function_calling_config": {"mode": "ANY"}},
    "labels": {"team": "a"}, "cached_content": "cachedContents/abc", "response_modalities": ["TEXT"],
    "media_resolution": "MEDIA_RESOLUTION_LOW", "speech_config": {"voice_config": {"prebuilt_voice_config": {
        "voice_name": "Kore"}}}, "thinking_config": {"thinking_budget": 100}, "image_config": {"aspect_ratio": "1:1"},
    "enable_enhanced_civic_answers": True, "service_tier": "flex", "audio_transcription_config": {},
    "continuation_token": "tok", "store": True, "routing_config": {}, "model_selection_config": {},
    "audio_timestamp": True, "model_armor_config": {}, "generation_output_config": {},
}
# Client-side settings: the SDK never sends them.
_GEMINI_CLIENT_ONLY = {"http_options", "automatic_function_calling", "automatic_continuation",
                       "should_return_http_response"}


def _typed_dict_fields(*types: Any) -> set[str]:
    return {name for t in types for name in t.__annotations__}


def _gemini_fields() -> set[str]:
    """The paths google-genai writes for generateContent: top-level keys, and ``generationConfig.x``."""
    api = genai.Client(api_key="unused")._api_client
    fields = {"contents"}
    unsampled = set(genai_types.GenerateContentConfig.model_fields) - set(_GEMINI_CONFIG_SAMPLES) - _GEMINI_CLIENT_ONLY
    assert not unsampled, f"google-genai added config fields; give them a sample value: {sorted(unsampled)}"
    for name, value in _GEMINI_CONFIG_SAMPLES.items():
        config = genai_types.GenerateContentConfig(**{name: value})
        try:
            wire = genai_models._GenerateContentParameters_to_mldev(
                api, {"model": "gemini-x", "contents": "hi", "config": config})
        except ValueError:
            continue  # Vertex-only: the SDK refuses it for the Gemini API.
        wire.pop("_url", None)
        fields.update(key for key in wire if key != "generationConfig")
        fields.update(f"generationConfig.{key}" for key in wire.get("generationConfig", {}))
    return fields


def sdk_request_fields(fmt: str) -> set[str]:
    """Every request field the pinned SDK for ``fmt`` can send, nested ones as ``container.field``."""
    if fmt == "openai_chat":
        return _typed_dict_fields(completion_create_params.CompletionCreateParamsBase,
                                  completion_create_params.CompletionCreateParamsStreaming)
    if fmt == "openai_responses":
        return _typed_dict_fields(response_create_params.ResponseCreateParamsBase,
                                  response_create_params.ResponseCreateParamsStreaming)
    if fmt == "anthropic":
        return _typed_dict_fields(message_create_params.MessageCreateParamsBase,
                                  message_create_params.MessageCreateParamsStreaming)
    if fmt == "gemini":
        return _gemini_fields()
    return set(ChatRequest.model_fields) | {f"options.{name}" for name in Options.model_fields}


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_sdk_request_field_is_classified(fmt: str) -> None:
    """A field the pinned SDK sends and the codec does not classify fails here, not in production."""
    mapped, passthrough, ignored = _core.known_request_fields(fmt)
    sdk = sdk_request_fields(fmt)
    assert len(sdk) > 5, sdk
    unclassified = sorted(sdk - set(mapped) - set(passthrough) - set(ignored))
    assert not unclassified, f"{fmt}: classify these fields in its codec: {unclassified}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_field_classes_are_disjoint_and_keep_caller_identity_out(fmt: str) -> None:
    """No field is in two classes; caller identity and the governed fields are never passthrough."""
    mapped, passthrough, ignored = _core.known_request_fields(fmt)
    everything = [*mapped, *passthrough, *ignored]
    assert len(everything) == len(set(everything)), fmt
    never_forwarded = {"user", "metadata", "safety_identifier", "user_profile_id", "labels", "model", "stream",
                       "stream_options", "n", "service_tier", "generationConfig.candidateCount"}
    assert not never_forwarded & set(passthrough), fmt
    assert "frobnicate" not in everything
    with pytest.raises(ValueError, match="unknown format"):
        _core.known_request_fields("mesh")


# --- through the gateway -----------------------------------------------------------------------

_HI = [{"role": "user", "content": "hello"}]


def _post(gateway: Gateway, key: str, fmt: str, model: str, body: dict[str, Any]) -> httpx.Response:
    with httpx.Client(base_url=gateway.base_url, timeout=30) as client:
        if fmt == "gemini":
            return client.post(f"/v1beta/models/{model}:generateContent", headers={"x-goog-api-key": key}, json=body)
        path = {"openai_chat": "/v1/chat/completions", "openai_responses": "/v1/responses",
                "anthropic": "/v1/messages", "ollama": "/api/chat"}[fmt]
        return client.post(path, headers={"authorization": f"Bearer {key}"}, json={"model": model, **body})


# Per entry format: a body with passthrough fields, caller identity and a made-up field (nested
# too, where the format nests options), and what must reach an upstream of the same format.
_CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "openai_chat": ("openai", {"messages": _HI, "logit_bias": {"50256": -100}, "verbosity": "low",
                               "user": "caller-7", "frobnicate_chat": 1},
                    {"logit_bias": {"50256": -100}, "verbosity": "low"}),
    "openai_responses": ("openai_responses", {"input": "hello", "truncation": "auto", "include": ["usage.x"],
                                              "safety_identifier": "caller-7", "frobnicate_responses": 1},
                         {"truncation": "auto", "include": ["usage.x"]}),
    "anthropic": ("anthropic", {"max_tokens": 64, "messages": _HI, "cache_control": {"type": "ephemeral"},
                                "metadata": {"user_id": "caller-7"}, "frobnicate_messages": 1},
                  {"cache_control": {"type": "ephemeral"}}),
    "gemini": ("gemini", {"contents": [{"role": "user", "parts": [{"text": "hello"}]}],
                          "safetySettings": [{"category": "HARM_CATEGORY_HATE_SPEECH", "threshold": "BLOCK_NONE"}],
                          "generationConfig": {"responseLogprobs": True, "frobnicate_option": 1},
                          "labels": {"caller": "caller-7"}, "frobnicate_gemini": 1},
               {"safetySettings": [{"category": "HARM_CATEGORY_HATE_SPEECH", "threshold": "BLOCK_NONE"}]}),
    "ollama": ("openai", {"messages": _HI, "stream": False, "options": {"num_ctx": 4096, "frobnicate_option": 1},
                          "keep_alive": "caller-7", "frobnicate_ollama": 1}, {}),
}


@pytest.fixture(scope="module")
def drift_world(gateway: Gateway, testserve: EmulatedProviders) -> dict[str, Any]:
    user = gateway.create_user()
    models: dict[str, str] = {}
    prefix = {"anthropic": "anthropic", "openai": "openai", "openai_responses": "openai", "gemini": "gemini"}
    for family, path in prefix.items():
        provider = gateway.create_provider(f"ts-drift-{family}-{secrets.token_hex(3)}", family=family,
                                           base_url=f"{testserve.base_url}/{path}", api_key="testserve-key")
        name = f"drift-{family}"
        model = gateway.create_model(provider["id"], name, resolved_model="dummy-ok")
        gateway.grant(user["id"], model["id"])
        models[family] = name
    return {"key": user["key"], "models": models}


@pytest.mark.parametrize("fmt", FORMATS)
def test_made_up_fields_are_counted_and_passthrough_reaches_the_same_format(
        gateway: Gateway, testserve: EmulatedProviders, drift_world: dict[str, Any], fmt: str) -> None:
    """A made-up field is logged as unclassified and not forwarded; passthrough fields reach an
    upstream of the entry's own format verbatim; caller identity never leaves."""
    family, body, carried = _CASES[fmt]
    model = drift_world["models"][family]
    before = {e["seq"] for e in testserve.requests()}
    response = _post(gateway, drift_world["key"], fmt, model, body)
    assert response.status_code == 200, response.text
    made_up = [key for key in body if key.startswith("frobnicate")]
    for container in ("generationConfig", "options"):
        made_up += [f"{container}.{key}" for key in body.get(container, {}) if key.startswith("frobnicate")]
    log = gateway.log()
    for field in made_up:
        assert f"unclassified request field '{field}' on {fmt}" in log, (field, log[-2000:])
    (upstream,) = [e for e in testserve.requests() if e["seq"] not in before]
    sent = upstream["body"]
    assert "frobnicate" not in str(sent) and "caller-7" not in str(sent), sent
    for key, value in carried.items():
        assert sent.get(key) == value, (key, sent)
    if fmt == "gemini":
        assert sent["generationConfig"]["responseLogprobs"] is True
