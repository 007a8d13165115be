"""The translation matrix (docs/translation-matrix.md): for every entry API x upstream family, which
features carry over, and a test for every cell, end to end through meshfast and testserve.

The matrix is derived from one small table, `FORMATS`, of what each wire format can express,
taken from the codecs' module docs (core/src/translate/*.rs, "Losses: ..."); a feature carries
over when both the upstream's format (what the provider reports or takes) and the entry's format
(what the caller sends or reads) can express it. The doc is generated from the same table:
`python tests/test_translation_matrix.py` rewrites it, and a test fails when it is stale.

Each cell's test speaks the entry's wire format with httpx (so it controls every field), reads
what reached the upstream from testserve's `/_debug/requests`, and asserts what the cell says:
carried, or lost exactly as documented."""

from __future__ import annotations

import base64
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script, or under PYTHONSAFEPATH=1
    sys.path.insert(0, str(REPO))

from testserve import media  # noqa: E402
from testserve.content import (  # noqa: E402
    CACHE_READ_TOKENS,
    CACHE_WRITE_TOKENS,
    REASONING_SIGNATURE,
    REASONING_TEXT,
    TOOL_ARGUMENTS,
    Prompt,
    reply_text,
    split_words,
)

DOC = REPO / "docs" / "translation-matrix.md"

ENTRIES = ("openai_chat", "openai_responses", "anthropic", "gemini", "ollama")
FAMILIES = ("openai", "openai_responses", "anthropic", "gemini", "ollama")
FEATURES = ("text", "system", "images", "tools", "tool_results", "streaming", "usage", "cache_tokens", "reasoning")
ENTRY_TITLES = {"openai_chat": "OpenAI Chat (`/v1/chat/completions`)", "openai_responses": "OpenAI Responses "
                "(`/v1/responses`)", "anthropic": "Anthropic Messages (`/v1/messages`)",
                "gemini": "Gemini (`/v1beta/models/{m}:generateContent`, `:streamGenerateContent`)",
                "ollama": "Ollama (`/api/chat`)"}
# The format meshfast speaks to each provider family (core/src/entry.rs `upstream_format`): the
# Ollama preset calls Ollama's OpenAI-compatible endpoint.
UPSTREAM_FORMAT = {"openai": "openai_chat", "openai_responses": "openai_responses", "anthropic": "anthropic",
                   "gemini": "gemini", "ollama": "openai_chat"}
PREFIX = {"openai": "openai", "openai_responses": "openai", "anthropic": "anthropic", "gemini": "gemini",
          "ollama": "ollama"}


@dataclass(frozen=True)
class Format:
    """What one wire format can express, for the features where formats differ. Every format
    has text, a system prompt, base64 images, tools and tool calls, tool results, a stream and
    input/output usage."""

    tool_result_error: bool
    cache: frozenset[str]  # prompt-cache counts: "read", "write"
    reasoning: frozenset[str]  # "text", "signature"
    source: str  # the codec's documented losses this row restates


FORMATS = {
    "openai_chat": Format(False, frozenset({"read"}), frozenset({"text"}),
                          "openai_chat.rs: Losses: `is_error` of tool results, thinking signatures (Chat has no "
                          "field; DeepSeek-style `reasoning_content` carries the text), cache-write token counts"),
    "openai_responses": Format(False, frozenset({"read"}), frozenset({"text", "signature"}),
                               "openai_responses.rs: Losses: ... `is_error` of tool results, cache-write counts; "
                               "`encrypted_content` is the thinking signature"),
    "anthropic": Format(True, frozenset({"read", "write"}), frozenset({"text", "signature"}),
                        "anthropic.rs: Anthropic's content blocks are the IR's, so little is lost"),
    "gemini": Format(True, frozenset({"read"}), frozenset({"text", "signature"}),
                     "gemini.rs: Losses: ... `is_error` of tool results becomes an `error` key, cache-write counts "
                     "(Gemini has none); `thoughtSignature` is the thinking signature"),
    "ollama": Format(False, frozenset(), frozenset({"text"}),
                     "ollama.rs: Losses: ... thinking signatures and cache token counts have no field, `is_error` "
                     "of tool results is dropped"),
}

@dataclass(frozen=True)
class Cell:
    status: str  # "yes" | "partial" | "no"
    note: str = ""  # why, for a cell that is not plainly "yes"
    kept: str = ""  # which parts carry over, where a feature has parts


def _intersect(feature: str, entry: str, family: str) -> Cell:
    """A feature the upstream reports and the entry reads (cache counts, reasoning parts)."""
    up, down = FORMATS[UPSTREAM_FORMAT[family]], FORMATS[entry]
    have, show = (up.cache, down.cache) if feature == "cache_tokens" else (up.reasoning, down.reasoning)
    kept, lost = have & show, have - show
    words = {"read": "cache reads", "write": "cache writes", "text": "reasoning text", "signature": "signature"}
    order = ("read", "write", "text", "signature")
    label = " + ".join(k for k in order if k in kept)
    if not kept:
        return Cell("no", f"{entry} has no field for {' or '.join(words[k] for k in order if k in lost)}")
    if lost:
        return Cell("partial", f"{' and '.join(words[k] for k in order if k in lost)} lost ({entry} has no field)",
                    label)
    return Cell("yes", kept=label)


def cell(entry: str, family: str, feature: str) -> Cell:
    """One cell of the matrix, from `FORMATS`."""
    up = UPSTREAM_FORMAT[family]
    if feature == "tool_results" and FORMATS[entry].tool_result_error and not FORMATS[up].tool_result_error:
        return Cell("partial", f"`is_error` dropped ({up} has no field)")
    if feature in ("cache_tokens", "reasoning"):
        return _intersect(feature, entry, family)
    return Cell("yes")


MATRIX = {(e, f, feat): cell(e, f, feat) for e in ENTRIES for f in FAMILIES for feat in FEATURES}


# --- the doc --------------------------------------------------------------------------------------

FEATURE_TITLES = {"text": "text", "system": "system", "images": "images", "tools": "tools",
                  "tool_results": "tool results", "streaming": "streaming", "usage": "usage",
                  "cache_tokens": "cache tokens", "reasoning": "reasoning"}
FEATURE_MEANING = {
    "text": "the user's text reaches the upstream and the reply's text comes back exactly",
    "system": "the system prompt arrives in the upstream's system slot",
    "images": "a base64 image arrives whole (testserve names its type, size and digest in the reply)",
    "tools": "tool declarations reach the upstream; the model's call (name, arguments) comes back, "
             "streamed and not, with the format's tool-call stop reason",
    "tool_results": "the caller's tool result reaches the upstream as that format's tool result, with "
                    "its error flag where both formats have one",
    "streaming": "a streamed call streams in the entry's format, with the same text as a non-streamed one",
    "usage": "input and output tokens as the upstream reported them",
    "cache_tokens": "prompt-cache counts as the upstream reported them: `read`s (every format but Ollama's) "
                    "and `write`s (Anthropic's only); the cell names the parts that carry over",
    "reasoning": "the model's reasoning `text` and its `signature` (the opaque token vendors need echoed "
                 "on the next turn); the cell names the parts that carry over",
}
STATUS_MARK = {"yes": "yes", "partial": "partial", "no": "lost"}


def render_doc() -> str:
    lines = [
        "# Translation matrix",
        "",
        "<!-- Generated by `python tests/test_translation_matrix.py` from the table in that file;",
        "     tests/test_translation_matrix.py fails when this file is stale. Do not edit by hand. -->",
        "",
        "Any entry route reaches any chat model whatever its provider's family (API.md, \"Standard routes\"):",
        "meshfast decodes the caller's request into one intermediate representation (core/src/translate/mod.rs)",
        "and encodes it in the provider's format, and translates the (streamed) response back the same way.",
        "The tables say, for every entry API and upstream family, which features carry over. A feature",
        "carries over when both formats can express it; what a format cannot express comes from its codec's",
        "documented losses (the module docs of core/src/translate/*.rs), restated in the last table.",
        "",
        "Every cell is a test: `tests/test_translation_matrix.py::test_cell[<entry>-<family>-<feature>]` calls",
        "meshfast in the entry's wire format against testserve (scenarios `tools`, `cache`, `reasoning`) and",
        "asserts the cell, reading what reached the upstream from testserve's `/_debug/requests`; a `partial`",
        "or `lost` cell asserts the loss. The official SDKs cover the same pairs in tests/test_entry_routes.py,",
        "tests/test_sdk_tools_images.py and tests/test_node_sdks.py.",
        "",
        "meshfast always streams from the upstream and asks it for usage; a caller that did not ask for a",
        "stream gets one response accumulated from the translated events (core/src/entry.rs).",
        "",
        "The Ollama family is reached through Ollama's OpenAI-compatible endpoint, so it translates as",
        "OpenAI Chat does. No cell is refused: the one refusal in the codecs (an image by URL encoded for",
        "Ollama's `/api/chat`) cannot occur, as `/api/chat` is an entry format only, and it has no URL images.",
        "",
        "## Features",
        "",
    ]
    lines += [f"- **{FEATURE_TITLES[f]}**: {FEATURE_MEANING[f]}." for f in FEATURES]
    notes: list[str] = []
    for entry in ENTRIES:
        lines += ["", f"## Entry: {ENTRY_TITLES[entry]}", "",
                  "| upstream family | " + " | ".join(FEATURE_TITLES[f] for f in FEATURES) + " |",
                  "|---|" + "---|" * len(FEATURES)]
        for family in FAMILIES:
            row = []
            for feature in FEATURES:
                c = MATRIX[(entry, family, feature)]
                mark = STATUS_MARK[c.status] + (f": {c.kept}" if c.kept else "")
                if c.note:
                    if c.note not in notes:
                        notes.append(c.note)
                    mark += f" [{notes.index(c.note) + 1}]"
                row.append(mark)
            lines.append(f"| {family} | " + " | ".join(row) + " |")
    lines += ["", "## Notes", ""]
    lines += [f"{i}. {note}" for i, note in enumerate(notes, 1)]
    lines += ["", "## What each format can express (the table the matrix is derived from)", "",
              "| format | tool-result error flag | cache counts | reasoning | codec's documented losses |",
              "|---|---|---|---|---|"]
    for name, fmt in FORMATS.items():
        cache = " + ".join(k for k in ("read", "write") if k in fmt.cache) or "none"
        reasoning = " + ".join(k for k in ("text", "signature") if k in fmt.reasoning)
        lines.append(f"| {name} | {'yes' if fmt.tool_result_error else 'no'} | {cache} | {reasoning} | {fmt.source} |")
    lines += [
        "",
        "## Losses outside the cells",
        "",
        "Documented in the codecs and not part of a cell above (no testserve scenario exercises them):",
        "",
        "- OpenAI Chat: `StopSequence` is sent as `stop`; a system message in the middle of the conversation",
        "  joins the system prompt.",
        "- OpenAI Responses: stop sequences (Responses has none); reasoning is not sent back upstream in",
        "  requests (an input reasoning item needs the id OpenAI gave it, which the IR does not hold).",
        "- Anthropic: `cache_control` breakpoints reach only an Anthropic upstream (kept by IR index), and",
        "  those inside a tool result's blocks are lost; tool results made of blocks other than text.",
        "- Gemini: images by URL are sent as `fileData` with a media type guessed from the extension.",
        "- Ollama: images by URL are refused, several text or thinking blocks of one message are joined.",
        "- Gemini tool-call signatures travel inside the tool-call id (`mfts_<n>_<base64url>`) through",
        "  formats without a field for them (core/src/translate/mod.rs).",
        "- Request settings (reasoning effort or budget, structured output, `top_k`, `seed`, penalties) and",
        "  the fields that reach an upstream of the same format only are listed per codec under",
        "  \"Request fields\" in its module docs.",
        "",
    ]
    return "\n".join(lines)


# --- the entry side: one request builder and one response reader per entry format ------------------

QUESTION = "hello"
SYSTEM = "be brief"
RESULT = "18C and sunny"
TOOL = {"name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}}
PNG_B64 = base64.b64encode(media.PNG).decode()
PNG_B64URL = base64.urlsafe_b64encode(media.PNG).decode()


@dataclass
class Ask:
    """What one call sends, in no particular format."""

    stream: bool = False
    system: bool = False
    image: bool = False
    tools: bool = False
    result: bool = False  # the conversation ends with the result of an earlier call
    result_error: bool = False


def build(entry: str, model: str, key: str, ask: Ask) -> tuple[str, dict[str, str], dict[str, Any]]:
    """(path, headers, JSON body) of one call in the entry's wire format."""
    bearer = {"authorization": f"Bearer {key}"}
    args = json.dumps(TOOL_ARGUMENTS)
    if entry == "openai_chat":
        user: Any = QUESTION
        if ask.image:
            user = [{"type": "text", "text": QUESTION},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}}]
        messages: list[Any] = [{"role": "system", "content": SYSTEM}] if ask.system else []
        messages.append({"role": "user", "content": user})
        if ask.result:
            messages += [{"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": TOOL["name"], "arguments": args}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": RESULT}]
        body: dict[str, Any] = {"model": model, "messages": messages, "stream": ask.stream}
        if ask.stream:
            body["stream_options"] = {"include_usage": True}
        if ask.tools:
            body["tools"] = [{"type": "function", "function": TOOL}]
        return "/v1/chat/completions", bearer, body
    if entry == "openai_responses":
        content: list[Any] = [{"type": "input_text", "text": QUESTION}]
        if ask.image:
            content.append({"type": "input_image", "image_url": f"data:image/png;base64,{PNG_B64}"})
        items: list[Any] = [{"role": "user", "content": content}]
        if ask.result:
            items += [{"type": "function_call", "call_id": "call_1", "name": TOOL["name"], "arguments": args},
                      {"type": "function_call_output", "call_id": "call_1", "output": RESULT}]
        body = {"model": model, "input": items, "stream": ask.stream}
        if ask.system:
            body["instructions"] = SYSTEM
        if ask.tools:
            body["tools"] = [{"type": "function", **TOOL}]
        return "/v1/responses", bearer, body
    if entry == "anthropic":
        blocks: list[Any] = [{"type": "text", "text": QUESTION}]
        if ask.image:
            blocks.append({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}})
        messages = [{"role": "user", "content": blocks}]
        if ask.result:
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": "toolu_1", "content": RESULT}
            if ask.result_error:
                result["is_error"] = True
            messages += [{"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": TOOL["name"],
                                                             "input": TOOL_ARGUMENTS}]},
                         {"role": "user", "content": [result]}]
        body = {"model": model, "max_tokens": 100, "messages": messages, "stream": ask.stream}
        if ask.system:
            body["system"] = SYSTEM
        if ask.tools:
            body["tools"] = [{"name": TOOL["name"], "description": TOOL["description"],
                              "input_schema": TOOL["parameters"]}]
        return "/v1/messages", {"x-api-key": key}, body
    if entry == "gemini":
        parts: list[Any] = [{"text": QUESTION}]
        if ask.image:
            # NOTE: base64url, as google-genai sends it (protobuf JSON takes either alphabet).
            parts.append({"inlineData": {"mimeType": "image/png", "data": PNG_B64URL}})
        contents: list[Any] = [{"role": "user", "parts": parts}]
        if ask.result:
            response = {"error": RESULT} if ask.result_error else {"output": RESULT}
            contents += [{"role": "model", "parts": [{"functionCall": {"name": TOOL["name"], "args": TOOL_ARGUMENTS}}]},
                         {"role": "user", "parts": [{"functionResponse": {"name": TOOL["name"], "response": response}}]}]
        body = {"contents": contents}
        if ask.system:
            body["systemInstruction"] = {"parts": [{"text": SYSTEM}]}
        if ask.tools:
            body["tools"] = [{"functionDeclarations": [TOOL]}]
        action = "streamGenerateContent?alt=sse" if ask.stream else "generateContent"
        return f"/v1beta/models/{model}:{action}", {"x-goog-api-key": key}, body
    message: dict[str, Any] = {"role": "user", "content": QUESTION}
    if ask.image:
        message["images"] = [PNG_B64]
    messages = [{"role": "system", "content": SYSTEM}] if ask.system else []
    messages.append(message)
    if ask.result:
        messages += [{"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": TOOL["name"], "arguments": TOOL_ARGUMENTS}}]},
            {"role": "tool", "content": RESULT, "tool_name": TOOL["name"]}]
    body = {"model": model, "messages": messages, "stream": ask.stream}
    if ask.tools:
        body["tools"] = [{"type": "function", "function": TOOL}]
    return "/api/chat", bearer, body


@dataclass
class Answer:
    """What the caller read, in no particular format."""

    text: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    stop: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    cache_read: int | None = None  # None: the field is absent
    cache_write: int | None = None
    reasoning: str = ""
    signature: str | None = None


def _events(raw: str) -> list[dict[str, Any]]:
    out = []
    for block in raw.replace("\r\n", "\n").split("\n\n"):
        data = "".join(line[5:].strip() for line in block.split("\n") if line.startswith("data:"))
        if data.startswith("{"):
            out.append(json.loads(data))
    return out


def _openai_chat(raw: str, stream: bool) -> Answer:
    a = Answer()
    usage: dict[str, Any] = {}
    if not stream:
        body = json.loads(raw)
        choice = body["choices"][0]
        msg = choice["message"]
        a.text, a.stop, a.reasoning = msg.get("content") or "", choice["finish_reason"], msg.get("reasoning_content", "")
        a.calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls") or ()]
        usage = body.get("usage") or {}
    else:
        assert raw.rstrip().endswith("data: [DONE]"), raw[-200:]
        calls: dict[int, list[str]] = {}
        for chunk in _events(raw):
            usage = chunk.get("usage") or usage
            if not chunk.get("choices"):
                continue
            delta = chunk["choices"][0]["delta"]
            a.text += delta.get("content") or ""
            a.reasoning += delta.get("reasoning_content") or ""
            for d in delta.get("tool_calls") or ():
                slot = calls.setdefault(d["index"], ["", ""])
                slot[0] += (d.get("function") or {}).get("name") or ""
                slot[1] += (d.get("function") or {}).get("arguments") or ""
            a.stop = chunk["choices"][0].get("finish_reason") or a.stop
        a.calls = [(name, json.loads(args)) for name, args in calls.values()]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if usage:
        a.tokens_in, a.tokens_out = usage["prompt_tokens"] - (cached or 0), usage["completion_tokens"]
    a.cache_read = cached
    return a


def _responses(raw: str, stream: bool) -> Answer:
    if stream:
        events = _events(raw)
        done = [e for e in events if e["type"] == "response.completed"]
        assert len(done) == 1, raw[-300:]
        body = done[0]["response"]
        streamed = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    else:
        body = json.loads(raw)
    a = Answer(stop=body["status"])
    for item in body["output"]:
        if item["type"] == "message":
            a.text += "".join(p.get("text", "") for p in item["content"])
        elif item["type"] == "function_call":
            a.calls.append((item["name"], json.loads(item["arguments"])))
        elif item["type"] == "reasoning":
            a.reasoning += "".join(s["text"] for s in item.get("summary") or ())
            a.signature = item.get("encrypted_content")
    if stream:
        assert streamed == a.text
    usage = body.get("usage") or {}
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
    if usage:
        a.tokens_in, a.tokens_out = usage["input_tokens"] - (cached or 0), usage["output_tokens"]
    a.cache_read = cached
    return a


def _anthropic(raw: str, stream: bool) -> Answer:
    a = Answer()
    if not stream:
        body = json.loads(raw)
        blocks, usage, a.stop = body["content"], body["usage"], body["stop_reason"]
    else:
        blocks, usage = [], {}
        for e in _events(raw):
            if e["type"] == "message_start":
                usage = dict(e["message"].get("usage") or {})
            elif e["type"] == "content_block_start":
                blocks.append(dict(e["content_block"], _json=""))
            elif e["type"] == "content_block_delta":
                block, d = blocks[-1], e["delta"]
                if d["type"] == "text_delta":
                    block["text"] += d["text"]
                elif d["type"] == "input_json_delta":
                    block["_json"] += d["partial_json"]
                elif d["type"] == "thinking_delta":
                    block["thinking"] += d["thinking"]
                elif d["type"] == "signature_delta":
                    block["signature"] += d["signature"]
            elif e["type"] == "message_delta":
                usage.update({k: v for k, v in (e.get("usage") or {}).items() if v is not None})
                a.stop = e["delta"].get("stop_reason")
        assert raw.rstrip().endswith('{"type":"message_stop"}'), raw[-200:]
        for block in blocks:
            if block["type"] == "tool_use":
                block["input"] = json.loads(block["_json"] or "{}")
    for block in blocks:
        if block["type"] == "text":
            a.text += block["text"]
        elif block["type"] == "tool_use":
            a.calls.append((block["name"], block["input"]))
        elif block["type"] == "thinking":
            a.reasoning += block["thinking"]
            a.signature = block.get("signature") or None
    a.tokens_in, a.tokens_out = usage.get("input_tokens"), usage.get("output_tokens")
    a.cache_read, a.cache_write = usage.get("cache_read_input_tokens"), usage.get("cache_creation_input_tokens")
    return a


def _gemini(raw: str, stream: bool) -> Answer:
    chunks = _events(raw) if stream else [json.loads(raw)]
    a = Answer()
    usage: dict[str, Any] = {}
    for chunk in chunks:
        usage = chunk.get("usageMetadata") or usage
        cand = chunk["candidates"][0]
        a.stop = cand.get("finishReason") or a.stop
        for part in (cand.get("content") or {}).get("parts") or ():
            if "functionCall" in part:
                a.calls.append((part["functionCall"]["name"], part["functionCall"].get("args") or {}))
            elif part.get("thought"):
                a.reasoning += part.get("text", "")
                a.signature = part.get("thoughtSignature") or a.signature
            else:
                a.text += part.get("text", "")
    cached = usage.get("cachedContentTokenCount")
    if usage:
        a.tokens_in, a.tokens_out = usage["promptTokenCount"] - (cached or 0), usage.get("candidatesTokenCount")
    a.cache_read = cached
    return a


def _ollama(raw: str, stream: bool) -> Answer:
    lines = [json.loads(line) for line in raw.splitlines() if line.strip()]
    assert stream or len(lines) == 1
    a = Answer()
    for line in lines:
        msg = line.get("message") or {}
        a.text += msg.get("content") or ""
        a.reasoning += msg.get("thinking") or ""
        a.calls += [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or ()]
    last = lines[-1]
    assert last["done"] is True
    a.stop, a.tokens_in, a.tokens_out = last.get("done_reason"), last.get("prompt_eval_count"), last.get("eval_count")
    return a


READERS = {"openai_chat": _openai_chat, "openai_responses": _responses, "anthropic": _anthropic, "gemini": _gemini,
           "ollama": _ollama}
TOOL_STOP = {"openai_chat": "tool_calls", "openai_responses": "completed", "anthropic": "tool_use", "gemini": "STOP",
             "ollama": "stop"}


# --- the upstream side: what testserve recorded ---------------------------------------------------

def upstream_system(family: str, body: dict[str, Any]) -> str | None:
    fmt = UPSTREAM_FORMAT[family]
    if fmt == "openai_chat":
        return next((m["content"] for m in body["messages"] if m["role"] == "system"), None)
    if fmt == "openai_responses":
        return body.get("instructions")
    if fmt == "anthropic":
        system = body.get("system")
        return system if isinstance(system, str | None) else "".join(b["text"] for b in system)
    parts = (body.get("systemInstruction") or {}).get("parts") or []
    return "".join(p["text"] for p in parts) or None


def upstream_tool_names(family: str, body: dict[str, Any]) -> list[str]:
    fmt = UPSTREAM_FORMAT[family]
    tools = body.get("tools") or []
    if fmt == "openai_chat":
        return [t["function"]["name"] for t in tools]
    if fmt == "gemini":
        return [d["name"] for t in tools for d in t.get("functionDeclarations", [])]
    return [t["name"] for t in tools]


def upstream_result_error(family: str, body: dict[str, Any]) -> bool | None:
    """The tool result's error flag as the upstream got it (None: the format has no field)."""
    fmt = UPSTREAM_FORMAT[family]
    if fmt == "anthropic":
        block = next(b for b in body["messages"][-1]["content"] if b["type"] == "tool_result")
        return bool(block.get("is_error"))
    if fmt == "gemini":
        part = next(p for p in body["contents"][-1]["parts"] if "functionResponse" in p)
        return "error" in part["functionResponse"]["response"]
    if fmt == "openai_responses":
        item = next(i for i in body["input"] if i.get("type") == "function_call_output")
        assert set(item) <= {"type", "call_id", "output"}, item
        return None
    message = next(m for m in body["messages"] if m["role"] == "tool")
    assert set(message) <= {"role", "tool_call_id", "content"}, message
    return None


# --- the tests ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def matrix_world(gateway: Any, testserve: Any) -> dict[str, Any]:
    user = gateway.create_user()
    for family in FAMILIES:
        provider = gateway.create_provider(
            f"ts-matrix-{family}", family=family, base_url=f"{testserve.base_url}/{PREFIX[family]}",
            api_key="testserve-key", retry_backoff_ms=20, max_retries=0,
        )
        for scenario in ("ok", "tools", "cache", "reasoning"):
            # The resolved name is unique, so testserve's log can be filtered by it.
            model = gateway.create_model(provider["id"], f"mx-{family}-{scenario}",
                                         resolved_model=f"mx-{family}-{scenario}", supports_image_in=True)
            gateway.grant(user["id"], model["id"])
    return {"key": user["key"]}


class Caller:
    def __init__(self, gateway: Any, testserve: Any, key: str, entry: str, family: str) -> None:
        self.gateway, self.testserve, self.key, self.entry, self.family = gateway, testserve, key, entry, family

    def call(self, scenario: str, ask: Ask) -> tuple[Answer, dict[str, Any]]:
        """One call; the answer as the caller read it and the body the upstream received."""
        import httpx

        model = f"mx-{self.family}-{scenario}"
        path, headers, body = build(self.entry, model, self.key, ask)
        r = httpx.post(self.gateway.base_url + path, headers=headers, json=body, timeout=30)
        assert r.status_code == 200, (r.status_code, r.text[:500])
        seen = self.testserve.requests(model=model, limit=1)
        assert seen, f"nothing reached testserve for {model}"
        return READERS[self.entry](r.text, ask.stream), seen[0]["body"]


def _expected(family: str, *, image: bool = False, result: bool = False) -> tuple[str, int]:
    """testserve's reply text and input-token count for the builder's last turn."""
    prompt = Prompt()
    if result:
        prompt.add_tool_result(RESULT)
    else:
        prompt.add_text(QUESTION)
        if image:
            prompt.add_media("image", "image/png", PNG_B64, None)
    return reply_text(family, prompt), prompt.input_tokens


def check(caller: Caller, feature: str, want: Cell) -> None:
    entry, family = caller.entry, caller.family
    text, tokens_in = _expected(family)
    if feature == "text":
        answer, _ = caller.call("ok", Ask())
        assert answer.text == text
    elif feature == "system":
        answer, up = caller.call("ok", Ask(system=True))
        assert upstream_system(family, up) == SYSTEM and answer.text == text
    elif feature == "images":
        answer, up = caller.call("ok", Ask(image=True))
        image_text, _ = _expected(family, image=True)
        assert want.status == "yes"
        assert answer.text == image_text
    elif feature == "tools":
        for stream in (False, True):
            answer, up = caller.call("tools", Ask(tools=True, stream=stream))
            assert upstream_tool_names(family, up) == [TOOL["name"]]
            assert answer.calls == [(TOOL["name"], TOOL_ARGUMENTS)], stream
            assert answer.stop == TOOL_STOP[entry], stream
    elif feature == "tool_results":
        error = FORMATS[entry].tool_result_error
        answer, up = caller.call("tools", Ask(tools=True, result=True, result_error=error))
        assert answer.calls == [] and answer.text == _expected(family, result=True)[0]
        flag = upstream_result_error(family, up)
        if not error:
            assert flag in (None, False)
        elif want.status == "yes":
            assert flag is True
        else:
            assert flag is None  # the error flag is gone upstream
    elif feature == "streaming":
        answer, _ = caller.call("ok", Ask(stream=True))
        assert answer.text == text and answer.tokens_out == len(split_words(text))
    elif feature == "usage":
        for stream in (False, True):
            answer, _ = caller.call("ok", Ask(stream=stream))
            assert (answer.tokens_in, answer.tokens_out) == (tokens_in, len(split_words(text))), stream
    elif feature == "cache_tokens":
        kept = FORMATS[UPSTREAM_FORMAT[family]].cache & FORMATS[entry].cache
        for stream in (False, True):
            answer, _ = caller.call("cache", Ask(stream=stream))
            assert answer.text == text
            assert answer.cache_read == (CACHE_READ_TOKENS if "read" in kept else None), stream
            if "write" in FORMATS[entry].cache:
                assert answer.cache_write == (CACHE_WRITE_TOKENS if "write" in kept else 0), stream
    elif feature == "reasoning":
        kept = FORMATS[UPSTREAM_FORMAT[family]].reasoning & FORMATS[entry].reasoning
        for stream in (False, True):
            answer, _ = caller.call("reasoning", Ask(stream=stream))
            assert answer.text == text, stream
            assert answer.reasoning == (REASONING_TEXT if "text" in kept else ""), stream
            assert answer.signature == (REASONING_SIGNATURE if "signature" in kept else None), stream
    else:
        raise AssertionError(feature)


@pytest.mark.parametrize(("entry", "family", "feature"), list(MATRIX))
def test_cell(gateway: Any, testserve: Any, matrix_world: dict[str, Any], entry: str, family: str,
              feature: str) -> None:
    """The cell holds end to end: what it says carries over does, and what it says is lost is."""
    check(Caller(gateway, testserve, matrix_world["key"], entry, family), feature, MATRIX[(entry, family, feature)])


def test_doc_is_generated_from_the_table() -> None:
    """docs/translation-matrix.md is `render_doc()`; run this file as a script to rewrite it."""
    assert DOC.read_text() == render_doc(), "stale: run `python tests/test_translation_matrix.py`"


def test_every_entry_and_family_pair_has_every_feature() -> None:
    assert len(MATRIX) == len(ENTRIES) * len(FAMILIES) * len(FEATURES) == 225
    assert {c.status for c in MATRIX.values()} <= set(STATUS_MARK)


if __name__ == "__main__":
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(render_doc())
    print(f"wrote {DOC.relative_to(REPO)}")
