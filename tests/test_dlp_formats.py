"""Data protection in every entry format, through the official SDKs (issue "DLP"): the corpus of
`dlp_corpus.py` (valid values and near misses of every detector and an operator pattern), spread
over the places a conversation carries text (system prompt, tool call arguments, tool result, the
last user turn), on a real two-worker gateway with testserve behind it.

- block: a 400 in the entry's own error shape, code `sensitive_content_blocked`, naming every
  detector (so every place was read) and never a value; nothing reaches testserve.
- redact: testserve sees `[REDACTED:<detector>]` for every detector and no value.
- pseudonymize: testserve sees no value, and the answer (whole and streamed; testserve echoes the
  last user turn, or the tool result a conversation ends with) equals, byte for byte, the answer of
  the same call by someone no policy covers.
- near misses reach testserve untouched under every action."""

from __future__ import annotations

import base64
import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
from conftest import EmulatedProviders, Gateway, tag, until
from dlp_corpus import CUSTOM, DETECTORS, NEAR_MISSES, VALID, custom_matches, escaped, near_miss_text
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from meshfast._core import dlp_scan

FORMATS = ("openai_chat", "openai_responses", "anthropic", "gemini", "ollama")
# Each entry format against the upstream family that speaks it (testserve's path prefix).
FAMILY = {"openai_chat": "openai", "openai_responses": "openai_responses", "anthropic": "anthropic",
          "gemini": "gemini", "ollama": "ollama"}
PREFIX = {"openai": "openai", "openai_responses": "openai", "anthropic": "anthropic", "gemini": "gemini",
          "ollama": "ollama"}
ACTIONS = ("block", "redact", "pseudonymize")
TOOL = "lookup"
SCHEMA = {"type": "object", "properties": {"ticket": {"type": "string"}}}
# Digit-bearing values are also looked for with their separators gone (a leak reformatted).
SEPARATORS = re.compile(r"[\s().-]")
COMPACT_CHECKED = ("card", "iban", "phone", "ssn")


@dataclass(frozen=True)
class Turns:
    """One conversation: a system prompt, a user turn, the model's call to `lookup` with
    `arguments`, the tool's `result`, then (unless None) a last user turn `ask`. testserve echoes
    `ask`, or `result` when the conversation ends with it."""

    system: str
    user: str
    arguments: dict[str, str]
    result: str
    ask: str | None


# Each detector's values in one place only: a refusal that names them all read every place.
CORPUS = Turns(
    system=f"account {' and '.join(VALID['iban'])}; ssn {' or '.join(VALID['ssn'])}. Not these: {near_miss_text()}",
    user="look up my ticket",
    arguments={"ticket": VALID["ticket"][0]},
    result=" ".join(VALID["secret"]),
    ask=(f"card {', '.join(VALID['card'])}; mail {VALID['email'][0]}; phone {', '.join(VALID['phone'])}; "
         f"ip {' and '.join(VALID['ip'])}"),
)
PLACED = {"system": ("iban", "ssn"), "arguments": ("ticket",), "result": ("secret",),
          "ask": ("card", "email", "phone", "ip")}
NEAR = Turns(system=near_miss_text(), user="look it up", arguments={"ticket": NEAR_MISSES["ticket"][0]},
             result=near_miss_text(), ask=near_miss_text())


def _found(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for detector, start, end in dlp_scan(text):
        found.setdefault(detector, []).append(text[start:end])
    if custom_matches(text):
        found[CUSTOM["name"]] = custom_matches(text)
    return found


def test_the_corpus_is_what_the_scanner_finds_and_lets_pass() -> None:
    """Each valid value is found whole by its detector and nothing else; no near miss is found;
    each place of the conversation holds exactly the detectors it is meant to."""
    for detector, values in VALID.items():
        for value in values:
            assert _found(f"x {value} y") == {detector: [value]}, (detector, value)
    for detector, values in NEAR_MISSES.items():
        for value in values:
            assert _found(f"x {value} y") == {}, (detector, value)
    assert _found(near_miss_text()) == {}
    for place, detectors in PLACED.items():
        text = json.dumps(CORPUS.arguments) if place == "arguments" else getattr(CORPUS, place)
        text = text.split(". Not these:")[0]
        assert _found(text) == {d: list(VALID[d]) for d in detectors}, place
    assert sorted(d for ds in PLACED.values() for d in ds) == sorted(DETECTORS)
    # testserve echoes 400 characters of a prompt and 200 of a tool result: both fit whole.
    assert CORPUS.ask is not None and len(CORPUS.ask) < 400 and len(CORPUS.result) < 200


# --- the gateway, its users and policies ---------------------------------------------------------

@pytest.fixture(scope="module")
def world(gateway: Gateway, testserve: EmulatedProviders) -> Iterator[dict[str, Any]]:
    run = tag()
    models: dict[str, dict[str, Any]] = {}
    providers: dict[str, dict[str, Any]] = {}
    for fmt in FORMATS:
        family = FAMILY[fmt]
        providers[family] = gateway.create_provider(f"dlpf-{family}-{run}", family=family,
                                                    base_url=f"{testserve.base_url}/{PREFIX[family]}",
                                                    api_key="testserve-key")
        models[fmt] = gateway.create_model(providers[family]["id"], f"dlpf-{fmt}-{run}",
                                           resolved_model=f"dlpf-{fmt}-{run}", supports_image_in=True,
                                           supports_document_in=True)
    models["embeddings"] = gateway.create_model(providers["openai"]["id"], f"dlpf-embed-{run}",
                                                resolved_model=f"dlpf-embed-{run}", kind="embedding")
    users = {who: gateway.create_user() for who in ("plain", *ACTIONS)}
    for user in users.values():
        for model in models.values():
            gateway.grant(user["id"], model["id"])
    names = {action: f"dlpf-{action}-{run}" for action in ACTIONS}
    # NOTE: block last: the snapshot that refuses its user's card holds the other two policies.
    for action in ("redact", "pseudonymize", "block"):
        name = names[action]
        body = {"detectors": dict.fromkeys(VALID.keys() - {CUSTOM["name"]}, action),
                "custom": [{**CUSTOM, "action": action}], "applies_to": {"users": [users[action]["id"]]}}
        put = gateway.admin("PUT", f"/admin/dlp/policies/{name}", body)
        assert put.status_code == 200, put.text

    def refused() -> int:
        # A new connection each time, so both workers are asked.
        return httpx.post(f"{gateway.base_url}/v1/chat/completions", timeout=10,
                          headers={"authorization": f"Bearer {users['block']['key']}"},
                          json={"model": models["openai_chat"]["name"],
                                "messages": [{"role": "user", "content": VALID["card"][0]}]}).status_code

    until(lambda: all(refused() == 400 for _ in range(6)), 5.0, "the policies on every worker")
    try:
        yield {"models": models, "users": users}
    finally:
        for name in names.values():
            gateway.admin("DELETE", f"/admin/dlp/policies/{name}")


def _recorded(testserve: EmulatedProviders, model: dict[str, Any]) -> list[dict[str, Any]]:
    """What testserve received for ``model``, newest first."""
    return testserve.requests(model=model["resolved_model"])


def _leaks(seen: str) -> list[str]:
    """The valid values in ``seen`` (a recorded body as JSON), as written or with their
    separators gone, outside the near misses (one of which is a card's digits regrouped)."""
    rest = seen.replace(escaped(near_miss_text()), "|")
    compact = SEPARATORS.sub("", rest)
    return [value for detector, values in VALID.items() for value in values
            if escaped(value) in rest
            or (detector in COMPACT_CHECKED and SEPARATORS.sub("", value) in compact)]


def _near_misses_changed(seen: str) -> list[str]:
    """The near misses not in ``seen`` as written (empty: each arrived untouched)."""
    return [v for values in NEAR_MISSES.values() for v in values if escaped(v) not in seen]


# --- one call in each format through its SDK --------------------------------------------------------

def _openai_chat(base: str, key: str, model: str, turns: Turns, stream: bool) -> str:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    messages: Any = [
        {"role": "system", "content": turns.system},
        {"role": "user", "content": turns.user},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": TOOL,
                                                               "arguments": json.dumps(turns.arguments)}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": turns.result},
        *([{"role": "user", "content": turns.ask}] if turns.ask is not None else [])]
    tools: Any = [{"type": "function", "function": {"name": TOOL, "parameters": SCHEMA}}]
    if not stream:
        return client.chat.completions.create(model=model, messages=messages, tools=tools).choices[0].message.content \
            or ""
    return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=messages, tools=tools, stream=True) if c.choices)


def _openai_responses(base: str, key: str, model: str, turns: Turns, stream: bool) -> str:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    items: Any = [
        {"role": "user", "content": turns.user},
        {"type": "function_call", "call_id": "call_1", "name": TOOL, "arguments": json.dumps(turns.arguments)},
        {"type": "function_call_output", "call_id": "call_1", "output": turns.result},
        *([{"role": "user", "content": [{"type": "input_text", "text": turns.ask}]}] if turns.ask is not None
          else [])]
    tools: Any = [{"type": "function", "name": TOOL, "parameters": SCHEMA, "strict": False}]
    if not stream:
        return client.responses.create(model=model, instructions=turns.system, input=items, tools=tools).output_text
    parts, final = [], None
    for event in client.responses.create(model=model, instructions=turns.system, input=items, tools=tools,
                                         stream=True):
        if event.type == "response.output_text.delta":
            parts.append(event.delta)
        elif event.type == "response.completed":
            final = event.response
    assert final is not None and final.output_text == "".join(parts), (final, parts)
    return "".join(parts)


def _anthropic(base: str, key: str, model: str, turns: Turns, stream: bool) -> str:
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    messages: Any = [
        {"role": "user", "content": turns.user},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": TOOL,
                                           "input": turns.arguments}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": turns.result}]},
        *([{"role": "user", "content": turns.ask}] if turns.ask is not None else [])]
    tools: Any = [{"name": TOOL, "input_schema": SCHEMA}]
    if not stream:
        m = client.messages.create(model=model, max_tokens=300, system=turns.system, messages=messages, tools=tools)
        return "".join(b.text for b in m.content if b.type == "text")
    with client.messages.stream(model=model, max_tokens=300, system=turns.system, messages=messages,
                                tools=tools) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert "".join(b.text for b in final.content if b.type == "text") == text
    return text


def _gemini(base: str, key: str, model: str, turns: Turns, stream: bool) -> str:
    client = genai.Client(api_key=key, http_options=genai_types.HttpOptions(base_url=base, api_version="v1beta",
                                                                            retry_options=None))
    declaration = genai_types.FunctionDeclaration(name=TOOL, parameters_json_schema=SCHEMA)
    config = genai_types.GenerateContentConfig(system_instruction=turns.system, tools=[
        genai_types.Tool(function_declarations=[declaration])])
    contents: Any = [
        genai_types.Content(role="user", parts=[genai_types.Part(text=turns.user)]),
        genai_types.Content(role="model", parts=[genai_types.Part(
            function_call=genai_types.FunctionCall(name=TOOL, args=turns.arguments))]),
        genai_types.Content(role="user", parts=[genai_types.Part.from_function_response(
            name=TOOL, response={"output": turns.result})]),
        *([genai_types.Content(role="user", parts=[genai_types.Part(text=turns.ask)])] if turns.ask is not None
          else [])]
    if not stream:
        return client.models.generate_content(model=model, contents=contents, config=config).text or ""
    return "".join(c.text or "" for c in client.models.generate_content_stream(model=model, contents=contents,
                                                                               config=config))


# Ollama's refusals as they came over the wire (its SDK keeps only `error`, not `code` and `detectors`).
_ollama_refusals: list[dict[str, Any]] = []


def _keep_refusal(response: httpx.Response) -> None:
    if response.status_code >= 400:
        response.read()
        _ollama_refusals.append(response.json())


def _ollama(base: str, key: str, model: str, turns: Turns, stream: bool) -> str:
    client = ollama.Client(host=base, headers={"authorization": f"Bearer {key}"},
                           event_hooks={"response": [_keep_refusal]})
    messages: Any = [
        {"role": "system", "content": turns.system},
        {"role": "user", "content": turns.user},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": TOOL,
                                                                          "arguments": turns.arguments}}]},
        {"role": "tool", "content": turns.result, "tool_name": TOOL},
        *([{"role": "user", "content": turns.ask}] if turns.ask is not None else [])]
    tools: Any = [{"type": "function", "function": {"name": TOOL, "parameters": SCHEMA}}]
    if not stream:
        return client.chat(model=model, messages=messages, tools=tools, stream=False).message.content or ""
    return "".join(c.message.content or "" for c in client.chat(model=model, messages=messages, tools=tools,
                                                                 stream=True))


CALL = {"openai_chat": _openai_chat, "openai_responses": _openai_responses, "anthropic": _anthropic,
        "gemini": _gemini, "ollama": _ollama}


def _refusal(fmt: str, call: Any) -> tuple[str, list[str], str]:
    """``call``'s refusal through the format's SDK: (code, detectors, everything the caller saw)."""
    if fmt in ("openai_chat", "openai_responses"):
        with pytest.raises(openai.BadRequestError) as oe:
            call()
        body = oe.value.body if isinstance(oe.value.body, dict) else {}
        error = body.get("error", body)
        return str(oe.value.code), error.get("detectors", []), f"{oe.value} {oe.value.response.text}"
    if fmt == "anthropic":
        with pytest.raises(anthropic.BadRequestError) as ae:
            call()
        error = ae.value.body["error"] if isinstance(ae.value.body, dict) else {}
        return error.get("type", ""), error.get("detectors", []), f"{ae.value} {ae.value.response.text}"
    if fmt == "gemini":
        with pytest.raises(genai_errors.ClientError) as ge:
            call()
        assert ge.value.code == 400 and ge.value.status == "INVALID_ARGUMENT"
        info = next(d for d in ge.value.details["error"]["details"] if d["@type"].endswith("ErrorInfo"))
        shown = f"{ge.value} {json.dumps(ge.value.details)}"
        return info["reason"], info.get("metadata", {}).get("detectors", "").split(","), shown
    _ollama_refusals.clear()
    with pytest.raises(ollama.ResponseError) as le:
        call()
    assert le.value.status_code == 400 and len(_ollama_refusals) == 1
    body = _ollama_refusals[0]
    assert body["error"] == le.value.error
    return body.get("code", ""), body.get("detectors", []), f"{le.value} {json.dumps(body)}"


# --- the tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_block_refuses_in_the_entrys_shape_naming_every_detector_and_nothing_leaves(
        gateway: Gateway, testserve: EmulatedProviders, world: dict[str, Any], fmt: str) -> None:
    """The whole corpus: 400 naming all eight detectors (each sits in one place of the call),
    never a value, and testserve receives nothing; near misses alone pass, untouched."""
    model, key = world["models"][fmt], world["users"]["block"]["key"]
    before = len(_recorded(testserve, model))
    code, detectors, shown = _refusal(fmt, lambda: CALL[fmt](gateway.base_url, key, model["name"], CORPUS, False))
    assert code == "sensitive_content_blocked", shown
    assert sorted(detectors) == sorted(DETECTORS), shown
    assert not [v for values in VALID.values() for v in values
                if v in shown or escaped(v) in shown or SEPARATORS.sub("", v) in SEPARATORS.sub("", shown)], shown
    _refusal(fmt, lambda: CALL[fmt](gateway.base_url, key, model["name"], CORPUS, True))
    assert len(_recorded(testserve, model)) == before

    CALL[fmt](gateway.base_url, key, model["name"], NEAR, False)
    seen = json.dumps(_recorded(testserve, model)[0]["body"])
    assert _near_misses_changed(seen) == [], seen


@pytest.mark.parametrize("fmt", FORMATS)
def test_redact_sends_a_placeholder_for_every_detector_and_near_misses_untouched(
        gateway: Gateway, testserve: EmulatedProviders, world: dict[str, Any], fmt: str) -> None:
    """Every place of the call is rewritten: no value arrives, each detector's placeholder does."""
    model, key = world["models"][fmt], world["users"]["redact"]["key"]
    answer = CALL[fmt](gateway.base_url, key, model["name"], CORPUS, False)
    seen = json.dumps(_recorded(testserve, model)[0]["body"])
    assert _leaks(seen) == [], seen
    assert [d for d in DETECTORS if f"[REDACTED:{d}]" not in seen] == [], seen
    assert _near_misses_changed(seen) == [], seen
    # The echo of the last turn carries the placeholders of what it held.
    assert all(f"[REDACTED:{d}]" in answer for d in PLACED["ask"]), answer


@pytest.mark.parametrize("fmt", FORMATS)
def test_pseudonyms_leave_and_every_answer_is_what_it_would_have_been(
        gateway: Gateway, testserve: EmulatedProviders, world: dict[str, Any], fmt: str) -> None:
    """Ending with a user turn (the echo holds cards, an email, phones, addresses) and with a tool
    result (secrets), whole and streamed: the pseudonymized call's answer equals the plain call's,
    and testserve saw surrogates only."""
    model = world["models"][fmt]
    plain, pseudo = world["users"]["plain"]["key"], world["users"]["pseudonymize"]["key"]
    for turns, echoed in ((CORPUS, PLACED["ask"]), (replace(CORPUS, ask=None), PLACED["result"])):
        for stream in (False, True):
            want = CALL[fmt](gateway.base_url, plain, model["name"], turns, stream)
            # The echo holds the originals, so restoring them is what is being checked.
            assert all(v in want for d in echoed for v in VALID[d]), want
            got = CALL[fmt](gateway.base_url, pseudo, model["name"], turns, stream)
            seen = json.dumps(_recorded(testserve, model)[0]["body"])
            assert _leaks(seen) == [], seen
            assert "[REDACTED" not in seen and _near_misses_changed(seen) == [], seen
            assert got == want, (stream, turns.ask is None)


@pytest.mark.parametrize("action", ACTIONS)
def test_embeddings_inputs_are_protected(gateway: Gateway, testserve: EmulatedProviders, world: dict[str, Any],
                                         action: str) -> None:
    """OpenAI's embeddings with a list input, and Mesh's with one text: blocked naming every
    detector, redacted or pseudonymized item by item; near misses untouched."""
    model, key = world["models"]["embeddings"], world["users"][action]["key"]
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key, max_retries=0)
    inputs = [CORPUS.system, json.dumps(CORPUS.arguments), CORPUS.result, CORPUS.ask or ""]
    before = len(_recorded(testserve, model))

    def mesh() -> httpx.Response:
        return gateway.client.post("/v1/embeddings", params={"model": model["name"]}, json={"input": "\n".join(inputs)},
                                   headers={"authorization": f"Bearer {key}"})

    if action == "block":
        code, detectors, shown = _refusal("openai_chat", lambda: client.embeddings.create(model=model["name"],
                                                                                           input=inputs))
        assert code == "sensitive_content_blocked" and sorted(detectors) == sorted(DETECTORS), shown
        assert not [v for values in VALID.values() for v in values if escaped(v) in shown], shown
        refused = mesh()
        assert refused.status_code == 400 and refused.json()["error"] == "sensitive_content_blocked", refused.text
        assert sorted(refused.json()["detectors"]) == sorted(DETECTORS)
        assert not [v for values in VALID.values() for v in values if escaped(v) in refused.text], refused.text
        assert len(_recorded(testserve, model)) == before
        return
    made = client.embeddings.create(model=model["name"], input=inputs)
    assert [d.index for d in made.data] == [0, 1, 2, 3]
    assert mesh().status_code == 200
    recorded = _recorded(testserve, model)
    assert len(recorded) - before == 5
    seen = json.dumps([e["body"] for e in recorded[:len(recorded) - before]])
    assert _leaks(seen) == [] and _near_misses_changed(seen) == [], seen
    placeholders = [d for d in DETECTORS if f"[REDACTED:{d}]" in seen]
    assert placeholders == (list(DETECTORS) if action == "redact" else []), seen


def test_a_text_document_inline_in_gemini_is_read_like_text(
        gateway: Gateway, testserve: EmulatedProviders, world: dict[str, Any]) -> None:
    """A Gemini `inlineData` part of type text/plain is text the caller sends (as a Mesh-native
    text document is): a card in it is refused under block, and its base64 never leaves."""
    model, key = world["models"]["gemini"], world["users"]["block"]["key"]
    document = f"invoice paid with {VALID['card'][0]}".encode()
    client = genai.Client(api_key=key, http_options=genai_types.HttpOptions(base_url=gateway.base_url,
                                                                            api_version="v1beta", retry_options=None))
    contents: Any = [genai_types.Content(role="user", parts=[
        genai_types.Part(text="summarize the attached note"),
        genai_types.Part.from_bytes(data=document, mime_type="text/plain")])]
    before = len(_recorded(testserve, model))
    with contextlib.suppress(genai_errors.ClientError):
        client.models.generate_content(model=model["name"], contents=contents)
    recorded = _recorded(testserve, model)
    seen = json.dumps([e["body"] for e in recorded[:len(recorded) - before]])
    # google-genai sends base64url; testserve records it as sent.
    assert base64.urlsafe_b64encode(document).decode().rstrip("=") not in seen, seen
    code, detectors, shown = _refusal("gemini", lambda: client.models.generate_content(model=model["name"],
                                                                                      contents=contents))
    assert (code, detectors) == ("sensitive_content_blocked", ["card"]), shown
