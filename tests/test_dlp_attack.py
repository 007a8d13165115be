"""Review attacks on data protection (a second reviewer's pass over the windowed scanner, text
documents, registry policies and the detection model): each test states what a policy promises,
and each failed until the gap it showed was closed. The detection model is the stand-in
from test_dlp_model (it finds "Ada Lovelace", "Charles Babbage" and "221B Baker Street")."""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from conftest import EmulatedProviders, Gateway, until
from test_dlp_model import PEOPLE, Model

from meshfast._core import dlp_scan

CARD = "4111 1111 1111 1111"


@pytest.fixture(scope="module")
def attacked(tmp_path_factory: pytest.TempPathFactory, testserve: EmulatedProviders) -> Iterator[dict[str, Any]]:
    model = Model()
    gw = Gateway(Path(tmp_path_factory.mktemp("dlp-attack")) / "data", workers=2, env={
        "MESHFAST_DLP_MODEL_URL": model.url, "MESHFAST_DLP_MODEL_TIMEOUT_MS": "300"}).start()
    try:
        tag = secrets.token_hex(3)
        openai_p = gw.create_provider(f"atk-o-{tag}", base_url=f"{testserve.base_url}/openai", api_key="testserve-key")
        anthropic_p = gw.create_provider(f"atk-a-{tag}", family="anthropic",
                                         base_url=f"{testserve.base_url}/anthropic", api_key="testserve-key")
        chat = gw.create_model(openai_p["id"], f"atk-chat-{tag}", resolved_model="dummy-model-atk",
                               supports_document_in=True)
        claude = gw.create_model(anthropic_p["id"], f"atk-claude-{tag}", resolved_model="claude-atk")
        user, ungranted = gw.create_user(), gw.create_user()
        for m in (chat, claude):
            gw.grant(user["id"], m["id"])
        policy = f"atk-{tag}"
        r = gw.client.put(f"/admin/dlp/policies/{policy}", json={
            "detectors": {"person": "block", "card": "block"}, "applies_to": {"users": [user["id"]]}},
            headers={"authorization": f"Bearer {gw.admin_token}"})
        assert r.status_code == 200, r.text
        until(lambda: _proxy(gw, chat, user, {"query": f"hi {PEOPLE[0]}"}).status_code == 400, 5.0, "the policy")
        yield {"gw": gw, "model": model, "chat": chat, "claude": claude, "user": user, "ungranted": ungranted}
    finally:
        gw.stop()
        model.close()


def _proxy(gw: Gateway, chat: dict, user: dict, body: dict[str, Any]) -> Any:
    return gw.client.post("/v1/proxy", params={"model": chat["name"]}, json=body,
                          headers={"authorization": f"Bearer {user['key']}"})


def _seen(testserve: EmulatedProviders, model: str) -> str:
    entries = testserve.client.get("/_debug/requests", params={"model": model, "limit": 50}).json()["entries"]
    return json.dumps([e["body"] for e in entries])


def test_a_name_in_a_text_documents_base64_is_blocked(attacked: dict[str, Any]) -> None:
    """The core reads a text document's base64 `data` (0152c1c) but dlp_model skips `data`: the
    model never sees the name, so `person: block` lets it through."""
    gw, chat, user = attacked["gw"], attacked["chat"], attacked["user"]
    # The pattern rules do read the document: a card in it is blocked.
    card_doc = base64.b64encode(f"card {CARD}".encode()).decode()
    r = _proxy(gw, chat, user, {"content": [{"type": "text", "text": "summarise"},
        {"type": "document", "media_type": "text/plain", "data": card_doc}]})
    assert r.status_code == 400 and r.json()["detectors"] == ["card"], r.text
    doc = base64.b64encode(f"Letter to {PEOPLE[0]}".encode()).decode()
    r = _proxy(gw, chat, user, {"content": [{"type": "text", "text": "summarise"},
        {"type": "document", "media_type": "text/plain", "data": doc}]})
    assert r.status_code == 400 and r.json().get("detectors") == ["person"], r.text


@pytest.mark.parametrize("key", ["detail", "data", "id", "url", "format"])
def test_a_name_under_a_skipped_key_in_a_tool_input_is_blocked(
        attacked: dict[str, Any], testserve: EmulatedProviders, key: str) -> None:
    """dlp_model._SKIP drops keys at every depth, also inside a tool call's input object, which the
    core scans leaf by leaf: a name there never reaches the model, so `person: block` passes it."""
    gw, claude, user = attacked["gw"], attacked["claude"], attacked["user"]
    ac = anthropic.Anthropic(base_url=gw.base_url, api_key=user["key"], max_retries=0)
    for value in (f"card {CARD}", PEOPLE[0]):  # the card: the core does scan this leaf
        with pytest.raises(anthropic.BadRequestError):
            ac.messages.create(model=claude["name"], max_tokens=20, messages=[
                {"role": "user", "content": "look them up"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t1", "name": "lookup", "input": {key: value}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "done"}]},
            ], tools=[{"name": "lookup", "input_schema": {"type": "object"}}])
    assert PEOPLE[0] not in _seen(testserve, "claude-atk")


def test_a_name_nested_past_the_models_depth_is_blocked(attacked: dict[str, Any], testserve: EmulatedProviders) -> None:
    """texts_of stops at depth 64; the core's protect_json does not: a name 70 objects deep in a
    tool input is scanned by the rules but never shown to the model."""
    gw, claude, user = attacked["gw"], attacked["claude"], attacked["user"]
    ac = anthropic.Anthropic(base_url=gw.base_url, api_key=user["key"], max_retries=0)
    for value in (f"card {CARD}", f"to {PEOPLE[0]}"):  # the card: the core does scan this deep
        nested: Any = value
        for _ in range(70):
            nested = {"k": nested}
        with pytest.raises(anthropic.BadRequestError):
            ac.messages.create(model=claude["name"], max_tokens=20, messages=[
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t2", "name": "lookup", "input": nested}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "done"}]},
            ], tools=[{"name": "lookup", "input_schema": {"type": "object"}}])
    assert PEOPLE[0] not in _seen(testserve, "claude-atk")


def test_a_caller_refused_for_its_grant_never_reaches_the_detection_model(attacked: dict[str, Any]) -> None:
    """The model runs before core.prepare for any authenticated key: a key with no grant (or over
    its budget, rate-limited, kill-switched) makes the gateway post up to MAX_KB of text to the
    model per call, for free, and can starve it so covered callers fail closed."""
    gw, chat, model, ungranted = attacked["gw"], attacked["chat"], attacked["model"], attacked["ungranted"]
    marker = f"amplify-{secrets.token_hex(4)} " * 8
    r = _proxy(gw, chat, ungranted, {"query": marker})
    assert r.status_code in (403, 404), r.text
    assert not any(marker in texts for texts in model.asked), "a refused call's text went to the model"


def test_a_card_as_a_json_key_in_tool_arguments_is_blocked(attacked: dict[str, Any], testserve: EmulatedProviders) -> None:
    """protect_json walks object values only: a card written as a key of a tool call's arguments
    (or of a Gemini functionResponse) leaves under `card: block` (pre-existing since efdca65)."""
    gw, chat, user = attacked["gw"], attacked["chat"], attacked["user"]
    oa = openai.OpenAI(base_url=f"{gw.base_url}/v1", api_key=user["key"], max_retries=0)
    with pytest.raises(openai.BadRequestError):
        oa.chat.completions.create(model=chat["name"], messages=[
            {"role": "user", "content": "pay"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "pay", "arguments": json.dumps({CARD: "visa"})}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ])
    assert CARD not in _seen(testserve, "dummy-model-atk")


def test_a_unicode_digit_inside_a_card_or_phone_does_not_hide_it() -> None:
    """Regression from f8e1844 (`\\d` to `[0-9]`): before it, one Arabic-Indic digit inside an
    unseparated card or phone number was matched by the pattern and ignored by the check (which
    counts ASCII digits), so the number was found; now it splits the candidate and nothing is."""
    assert dlp_scan("4111\u0661111111111111"), "card"
    assert dlp_scan("+1415\u06615552671"), "phone"


def test_a_json_escaped_name_in_tool_arguments_is_blocked(attacked: dict[str, Any], testserve: EmulatedProviders) -> None:
    """The model is sent a tool call's arguments as the raw JSON text (escapes and all) while the
    core reads their decoded leaves and the translator decodes them for a provider of another
    format: `Ada \\u004covelace` is no name to the model and "Ada Lovelace" to the provider."""
    gw, claude, user = attacked["gw"], attacked["claude"], attacked["user"]
    escaped = '{"who": "' + PEOPLE[0].replace("L", "\\u004c") + '"}'
    assert json.loads(escaped)["who"] == PEOPLE[0]
    oa = openai.OpenAI(base_url=f"{gw.base_url}/v1", api_key=user["key"], max_retries=0)
    try:
        oa.chat.completions.create(model=claude["name"], messages=[
            {"role": "user", "content": "who?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c2", "type": "function", "function": {
                "name": "lookup", "arguments": escaped}}]},
            {"role": "tool", "tool_call_id": "c2", "content": "ok"},
        ])
    except openai.BadRequestError:
        pass
    assert PEOPLE[0] not in _seen(testserve, "claude-atk")
