"""Tool calling and image input through the official Python SDKs, unmodified, base_url pointed at
meshfast: every entry API against every upstream family (testserve), streaming and not.

Tool calling: testserve's `tools` scenario answers a request that declares tools with one call of
the first tool with fixed arguments (`testserve.content.TOOL_ARGUMENTS`); the SDK must see that
call, and the follow-up turn carrying the tool result must come back as text that quotes the
result (testserve acknowledges the results a conversation ends with). Images: a base64 PNG must
reach the upstream, which describes the media it received in its reply text."""

from __future__ import annotations

import base64
import json
from typing import Any

import anthropic
import ollama
import openai
import pytest
from conftest import EmulatedProviders, Gateway
from google import genai
from google.genai import types as genai_types
from openai.types.responses import ResponseFunctionToolCall

from testserve import media
from testserve.content import TOOL_ARGUMENTS, Prompt, reply_text

FAMILIES = ("anthropic", "openai", "openai_responses", "gemini", "ollama")
PREFIX = {"anthropic": "anthropic", "openai": "openai", "openai_responses": "openai", "gemini": "gemini",
          "ollama": "ollama"}
ENTRIES = ("openai_chat", "openai_responses", "anthropic", "gemini", "ollama")

TOOL_NAME = "get_weather"
TOOL_DESCRIPTION = "The weather in a city."
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
          "required": ["city"]}
QUESTION = "What is the weather in Paris?"
RESULT = "18C and sunny"
PNG_B64 = base64.b64encode(media.PNG).decode()


@pytest.fixture(scope="module")
def world(gateway: Gateway, testserve: EmulatedProviders) -> dict[str, Any]:
    user = gateway.create_user()
    for family in FAMILIES:
        provider = gateway.create_provider(
            f"ts-tools-{family}", family=family, base_url=f"{testserve.base_url}/{PREFIX[family]}",
            api_key="testserve-key", retry_backoff_ms=20, max_retries=0,
        )
        for scenario in ("ok", "tools"):
            model = gateway.create_model(provider["id"], f"ti-{family}-{scenario}", resolved_model=f"dummy-{scenario}",
                                         supports_image_in=True)
            gateway.grant(user["id"], model["id"])
    return {"key": user["key"]}


def _tool_result_reply(family: str) -> str:
    prompt = Prompt()
    prompt.add_tool_result(RESULT)
    return reply_text(family, prompt)


def _image_reply(family: str) -> str:
    prompt = Prompt()
    prompt.add_text("describe")
    prompt.add_media("image", "image/png", PNG_B64, None)
    return reply_text(family, prompt)


# --- tool calling, one function per entry SDK: (name, arguments, follow-up text) ---------------------

def _openai_chat_tools(base: str, key: str, model: str, stream: bool) -> tuple[str, dict[str, Any], str]:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    tools: Any = [{"type": "function", "function": {"name": TOOL_NAME, "description": TOOL_DESCRIPTION,
                                                    "parameters": SCHEMA}}]
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    if not stream:
        r = client.chat.completions.create(model=model, messages=messages, tools=tools)
        assert r.choices[0].finish_reason == "tool_calls"
        calls = r.choices[0].message.tool_calls or []
        assert len(calls) == 1 and calls[0].type == "function"
        call_id, name, arguments = calls[0].id, calls[0].function.name, calls[0].function.arguments
    else:
        call_id, name, arguments, finish = "", "", "", None
        for chunk in client.chat.completions.create(model=model, messages=messages, tools=tools, stream=True):
            if not chunk.choices:
                continue
            for delta in chunk.choices[0].delta.tool_calls or ():
                assert delta.index == 0
                call_id = call_id or delta.id or ""
                if delta.function is not None:
                    name = name or delta.function.name or ""
                    arguments += delta.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        assert finish == "tool_calls" and call_id
    messages += [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": RESULT}]
    if not stream:
        follow = client.chat.completions.create(model=model, messages=messages, tools=tools)
        assert follow.choices[0].finish_reason == "stop"
        return name, json.loads(arguments), follow.choices[0].message.content or ""
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=messages, tools=tools, stream=True) if c.choices)
    return name, json.loads(arguments), text


def _responses_tools(base: str, key: str, model: str, stream: bool) -> tuple[str, dict[str, Any], str]:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    tools: Any = [{"type": "function", "name": TOOL_NAME, "description": TOOL_DESCRIPTION, "parameters": SCHEMA,
                   "strict": False}]
    items: list[Any] = [{"role": "user", "content": QUESTION}]
    if not stream:
        resp = client.responses.create(model=model, input=items, tools=tools)
    else:
        resp, streamed = None, ""
        for event in client.responses.create(model=model, input=items, tools=tools, stream=True):
            if event.type == "response.function_call_arguments.delta":
                streamed += event.delta
            elif event.type == "response.completed":
                resp = event.response
        assert resp is not None
    assert resp is not None
    calls = [o for o in resp.output if isinstance(o, ResponseFunctionToolCall)]
    assert len(calls) == 1, resp.output
    call = calls[0]
    if stream:
        assert streamed == call.arguments
    items += [{"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
              {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}]
    if not stream:
        text = client.responses.create(model=model, input=items, tools=tools).output_text
    else:
        text = "".join(e.delta for e in client.responses.create(model=model, input=items, tools=tools, stream=True)
                       if e.type == "response.output_text.delta")
    return call.name, json.loads(call.arguments), text


def _anthropic_tools(base: str, key: str, model: str, stream: bool) -> tuple[str, dict[str, Any], str]:
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    tools: Any = [{"name": TOOL_NAME, "description": TOOL_DESCRIPTION, "input_schema": SCHEMA}]
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    if not stream:
        m = client.messages.create(model=model, max_tokens=100, messages=messages, tools=tools)
    else:
        with client.messages.stream(model=model, max_tokens=100, messages=messages, tools=tools) as s:
            partial = "".join(e.partial_json for e in s if e.type == "input_json")
            m = s.get_final_message()
        assert json.loads(partial) == TOOL_ARGUMENTS
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1, m.content
    use = uses[0]
    messages += [{"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name,
                                                     "input": use.input}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": RESULT}]}]
    if not stream:
        follow = client.messages.create(model=model, max_tokens=100, messages=messages, tools=tools)
        assert follow.stop_reason == "end_turn"
        text = "".join(b.text for b in follow.content if b.type == "text")
    else:
        with client.messages.stream(model=model, max_tokens=100, messages=messages, tools=tools) as s:
            text = "".join(s.text_stream)
    return use.name, dict(use.input), text


def _gemini_client(base: str, key: str) -> genai.Client:
    return genai.Client(api_key=key, http_options=genai_types.HttpOptions(base_url=base, api_version="v1beta",
                                                                          retry_options=None))


def _gemini_tools(base: str, key: str, model: str, stream: bool) -> tuple[str, dict[str, Any], str]:
    client = _gemini_client(base, key)
    declaration = genai_types.FunctionDeclaration(name=TOOL_NAME, description=TOOL_DESCRIPTION,
                                                  parameters_json_schema=SCHEMA)
    config = genai_types.GenerateContentConfig(tools=[genai_types.Tool(function_declarations=[declaration])])
    contents: list[Any] = [genai_types.Content(role="user", parts=[genai_types.Part(text=QUESTION)])]
    if not stream:
        r = client.models.generate_content(model=model, contents=contents, config=config)
        calls = r.function_calls or []
        assert r.candidates and r.candidates[0].content is not None
        model_parts = r.candidates[0].content.parts or []
    else:
        calls, model_parts = [], []
        for chunk in client.models.generate_content_stream(model=model, contents=contents, config=config):
            calls += chunk.function_calls or []
            if chunk.candidates and chunk.candidates[0].content is not None:
                model_parts += chunk.candidates[0].content.parts or []
    assert len(calls) == 1, calls
    call = calls[0]
    assert call.name is not None
    contents += [genai_types.Content(role="model", parts=model_parts),
                 genai_types.Content(role="user", parts=[genai_types.Part.from_function_response(
                     name=call.name, response={"output": RESULT})])]
    if not stream:
        text = client.models.generate_content(model=model, contents=contents, config=config).text or ""
    else:
        text = "".join(c.text or "" for c in client.models.generate_content_stream(
            model=model, contents=contents, config=config))
    return call.name, dict(call.args or {}), text


def _ollama_tools(base: str, key: str, model: str, stream: bool) -> tuple[str, dict[str, Any], str]:
    client = ollama.Client(host=base, headers={"authorization": f"Bearer {key}"})
    tools: Any = [{"type": "function", "function": {"name": TOOL_NAME, "description": TOOL_DESCRIPTION,
                                                    "parameters": SCHEMA}}]
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    if not stream:
        r = client.chat(model=model, messages=messages, tools=tools, stream=False)
        calls = r.message.tool_calls or []
    else:
        calls = []
        for chunk in client.chat(model=model, messages=messages, tools=tools, stream=True):
            calls += chunk.message.tool_calls or []
    assert len(calls) == 1, calls
    call = calls[0].function
    messages += [{"role": "assistant", "content": "", "tool_calls": [
                     {"function": {"name": call.name, "arguments": dict(call.arguments)}}]},
                 {"role": "tool", "content": RESULT, "tool_name": call.name}]
    if not stream:
        text = client.chat(model=model, messages=messages, tools=tools, stream=False).message.content or ""
    else:
        text = "".join(c.message.content or "" for c in client.chat(model=model, messages=messages, tools=tools,
                                                                     stream=True))
    return call.name, dict(call.arguments), text


TOOL_CALLS = {"openai_chat": _openai_chat_tools, "openai_responses": _responses_tools, "anthropic": _anthropic_tools,
              "gemini": _gemini_tools, "ollama": _ollama_tools}


# --- images: the reply text per entry SDK -------------------------------------------------------------

def _image_text(base: str, key: str, entry: str, model: str, stream: bool) -> str:
    if entry == "openai_chat":
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
        messages: Any = [{"role": "user", "content": [
            {"type": "text", "text": "describe"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}}]}]
        if not stream:
            return client.chat.completions.create(model=model, messages=messages).choices[0].message.content or ""
        return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=model, messages=messages, stream=True) if c.choices)
    if entry == "openai_responses":
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
        items: Any = [{"role": "user", "content": [
            {"type": "input_text", "text": "describe"},
            {"type": "input_image", "image_url": f"data:image/png;base64,{PNG_B64}", "detail": "auto"}]}]
        if not stream:
            return client.responses.create(model=model, input=items).output_text
        return "".join(e.delta for e in client.responses.create(model=model, input=items, stream=True)
                       if e.type == "response.output_text.delta")
    if entry == "anthropic":
        aclient = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
        amessages: Any = [{"role": "user", "content": [
            {"type": "text", "text": "describe"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}}]}]
        if not stream:
            m = aclient.messages.create(model=model, max_tokens=100, messages=amessages)
            return "".join(b.text for b in m.content if b.type == "text")
        with aclient.messages.stream(model=model, max_tokens=100, messages=amessages) as s:
            return "".join(s.text_stream)
    if entry == "gemini":
        gclient = _gemini_client(base, key)
        contents = [genai_types.Content(role="user", parts=[
            genai_types.Part(text="describe"), genai_types.Part.from_bytes(data=media.PNG, mime_type="image/png")])]
        if not stream:
            return gclient.models.generate_content(model=model, contents=contents).text or ""
        return "".join(c.text or "" for c in gclient.models.generate_content_stream(model=model, contents=contents))
    oclient = ollama.Client(host=base, headers={"authorization": f"Bearer {key}"})
    omessages: Any = [{"role": "user", "content": "describe", "images": [media.PNG]}]
    if not stream:
        return oclient.chat(model=model, messages=omessages, stream=False).message.content or ""
    return "".join(c.message.content or "" for c in oclient.chat(model=model, messages=omessages, stream=True))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("entry", ENTRIES)
def test_every_sdk_calls_a_tool_and_sends_its_result_through_every_family(
        gateway: Gateway, world: dict[str, Any], entry: str, family: str) -> None:
    """The SDK sees one call of the declared tool with testserve's arguments; the follow-up turn
    with the tool result is answered with text that quotes the result."""
    for stream in (False, True):
        name, arguments, text = TOOL_CALLS[entry](gateway.base_url, world["key"], f"ti-{family}-tools", stream)
        assert (name, arguments) == (TOOL_NAME, TOOL_ARGUMENTS), (entry, family, stream)
        assert text == _tool_result_reply(family), (entry, family, stream)


# google-genai sends `inlineData.data` in base64url (protobuf JSON takes either alphabet); the
# Gemini codec hands the IR the standard alphabet, which every other upstream requires.
IMAGE_PAIRS = [(e, f) for e in ENTRIES for f in FAMILIES]


@pytest.mark.parametrize(("entry", "family"), IMAGE_PAIRS)
def test_every_sdk_sends_a_base64_image_to_every_family(
        gateway: Gateway, world: dict[str, Any], testserve: EmulatedProviders, entry: str, family: str) -> None:
    """The PNG arrives upstream whole: testserve's reply names its media type, size and digest."""
    for stream in (False, True):
        text = _image_text(gateway.base_url, world["key"], entry, f"ti-{family}-ok", stream)
        assert text == _image_reply(family), (entry, family, stream)
