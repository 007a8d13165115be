"""What a request asked and what testserve answers: prompt extraction per family, reply text,
token counts, tool-call arguments and embedding vectors (mesh-behaviour §8.3)."""

from __future__ import annotations

import base64
import hashlib
import math
from typing import Any

import msgspec

UNICODE_HEAD = "🚀 héllo 日本語 "
UNICODE_TAIL = " naïve café 👍🏽 中文テスト Ωμέγα ✓"
HUGE_REPEAT = 200
# The `tools` scenario's call: the first declared tool, always these arguments.
TOOL_ARGUMENTS = {"city": "Paris", "unit": "celsius"}
# The `cache` scenario's prompt-cache counts (Anthropic reports both; the others only reads).
CACHE_READ_TOKENS = 7
CACHE_WRITE_TOKENS = 5
# Of the cache writes, those with a one-hour lifetime (Anthropic splits them by lifetime).
CACHE_WRITE_1H_TOKENS = 2
# The `reasoning` scenario's thinking block, streamed ahead of the answer.
REASONING_TEXT = "testserve is thinking"
REASONING_SIGNATURE = "dGVzdHNlcnZlLXNpZ25hdHVyZQ"
SEARCH_RESULTS = (
    ("https://example.com/testserve/result-1", "testserve result one"),
    ("https://example.org/testserve/result-2", "testserve result two"),
)


class Prompt:
    """Text blocks and media descriptors of the last user turn, plus the input-token count."""

    __slots__ = ("texts", "media", "tool_results", "input_tokens", "rejected")

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.media: list[str] = []
        self.tool_results: list[str] = []
        self.input_tokens = 0
        self.rejected: str | None = None

    def add_text(self, text: Any) -> None:
        if isinstance(text, str):
            self.texts.append(text)
            self.input_tokens += max(1, len(text) // 4)

    def add_media(self, kind: str, media_type: str | None, data_b64: str | None, url: str | None,
                  urlsafe: bool = False) -> None:
        raw = b""
        if data_b64:
            if urlsafe:
                # NOTE: protobuf JSON (Gemini) takes either alphabet and google-genai sends base64url;
                # the other APIs take the standard alphabet only, so there it stays undecoded.
                data_b64 = data_b64.replace("-", "+").replace("_", "/")
            try:
                raw = base64.b64decode(data_b64, validate=False)
            except (ValueError, TypeError):
                raw = data_b64.encode()
        ident = url if url else hashlib.sha256(raw).hexdigest()[:16]
        self.media.append(f"{kind}({media_type or url},{len(raw)}B,{ident})")
        self.input_tokens += 100 + len(raw) // 1000

    def add_tool_result(self, result: str) -> None:
        self.tool_results.append(result)
        self.input_tokens += max(1, len(result) // 4)

    def add_data_uri_or_url(self, kind: str, value: Any) -> None:
        if not isinstance(value, str):
            return
        if value.startswith("data:") and ";base64," in value:
            head, data = value[5:].split(";base64,", 1)
            self.add_media(kind, head, data, None)
        else:
            self.add_media(kind, None, None, value)

    @property
    def query(self) -> str:
        return " | ".join(self.texts)


def reply_text(family: str, prompt: Prompt, scenario: str = "ok") -> str:
    """The exact text testserve streams back, before it is split into one delta per word."""
    text = f"testserve[{family}] ack"
    if prompt.texts:
        text += f" prompt<{prompt.query[:400]}>"
    for desc in prompt.media:
        text += " " + desc
    for result in prompt.tool_results:
        text += f" tool_result<{result[:200]}>"
    if not prompt.texts and not prompt.media and not prompt.tool_results:
        text += " empty-content"
    if scenario == "unicode":
        text = UNICODE_HEAD + text + UNICODE_TAIL
    elif scenario == "huge":
        text = " ".join([text] * HUGE_REPEAT)
    return text


def split_words(text: str) -> list[str]:
    """One delta per word, each with its trailing space except the last."""
    words = text.split(" ")
    return [w + " " for w in words[:-1]] + [words[-1]]


def text_tokens(text: str) -> int:
    return max(1, len(text) // 4)


# --- prompt extraction per family (mesh-behaviour §4.5) -------------------------------------------

def _last_user(messages: Any, role_key: str = "role", user: str = "user") -> Any:
    if not isinstance(messages, list):
        return None
    for msg in reversed(messages):
        if isinstance(msg, dict) and msg.get(role_key, user) == user:
            return msg
    return None


def prompt_anthropic(body: dict[str, Any]) -> Prompt:
    p = Prompt()
    msg = _last_user(body.get("messages"))
    content = msg.get("content") if msg else None
    if isinstance(content, str):
        p.add_text(content)
    elif isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                p.add_text(block.get("text"))
            elif kind in ("image", "document"):
                src = block.get("source") or {}
                if src.get("type") == "url":
                    p.add_media(kind, None, None, src.get("url"))
                else:
                    p.add_media(kind, src.get("media_type"), src.get("data"), None)
    return p


def prompt_openai_chat(body: dict[str, Any], text_and_image_only: bool = False) -> Prompt:
    p = Prompt()
    msg = _last_user(body.get("messages"))
    content = msg.get("content") if msg else None
    if isinstance(content, str):
        p.add_text(content)
    elif isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                p.add_text(block.get("text"))
            elif kind == "image_url":
                img = block.get("image_url")
                p.add_data_uri_or_url("image", img.get("url") if isinstance(img, dict) else img)
            elif text_and_image_only:
                p.rejected = f"unsupported content block type {kind!r}"
            elif kind == "file":
                f = block.get("file") or {}
                p.add_data_uri_or_url("document", f.get("file_data"))
            elif kind == "input_audio":
                a = block.get("input_audio") or {}
                p.add_media("audio", f"audio/{a.get('format', 'wav')}", a.get("data"), None)
    return p


def prompt_responses(body: dict[str, Any]) -> Prompt:
    p = Prompt()
    items = body.get("input")
    if isinstance(items, str):
        p.add_text(items)
        return p
    msg = _last_user(items)
    content = msg.get("content") if msg else None
    if isinstance(content, str):
        p.add_text(content)
    elif isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind in ("input_text", "text"):
                p.add_text(block.get("text"))
            elif kind == "input_image":
                p.add_data_uri_or_url("image", block.get("image_url"))
            elif kind == "input_file":
                p.add_data_uri_or_url("document", block.get("file_data") or block.get("file_url"))
    return p


def _gemini_kind(mime: str | None) -> str:
    major = (mime or "").split("/", 1)[0]
    return {"image": "image", "audio": "audio", "video": "video"}.get(major, "document")


def prompt_gemini(body: dict[str, Any]) -> Prompt:
    p = Prompt()
    msg = _last_user(body.get("contents"))
    parts = msg.get("parts") if msg else None
    for part in parts if isinstance(parts, list) else ():
        if not isinstance(part, dict):
            continue
        if "text" in part:
            p.add_text(part["text"])
        inline = part.get("inline_data") or part.get("inlineData")
        if isinstance(inline, dict):
            mime = inline.get("mime_type") or inline.get("mimeType")
            p.add_media(_gemini_kind(mime), mime, inline.get("data"), None, urlsafe=True)
        fdata = part.get("file_data") or part.get("fileData")
        if isinstance(fdata, dict):
            mime = fdata.get("mime_type") or fdata.get("mimeType")
            p.add_media(_gemini_kind(mime), mime, None, fdata.get("file_uri") or fdata.get("fileUri"))
    return p


def prompt_ollama_native(body: dict[str, Any]) -> Prompt:
    p = Prompt()
    msg = _last_user(body.get("messages"))
    if msg:
        if msg.get("content"):
            p.add_text(msg.get("content"))
        for img in msg.get("images") or ():
            if isinstance(img, str):
                p.add_media("image", None, img, None)
    return p


# --- tool results: the turn that answers the model's calls ------------------------------------

def _result_text(value: Any) -> str:
    """A tool result's content as text: a string, or the text parts of a block list."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(b.get("text", "") for b in value if isinstance(b, dict) and isinstance(b.get("text"), str))
    return ""


def _gemini_result_text(response: Any) -> str:
    if isinstance(response, dict) and len(response) == 1:
        only = next(iter(response.values()))
        if isinstance(only, str):
            return only
    return json_text(response)


def json_text(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def trailing_tool_results(family: str, body: dict[str, Any]) -> list[str]:
    """The tool results the conversation ends with (the caller's answer to the model's calls),
    oldest first; empty when the last turn is something else."""
    if family == "gemini":
        contents = body.get("contents")
        last = contents[-1] if isinstance(contents, list) and contents else None
        parts = last.get("parts") if isinstance(last, dict) else None
        out = []
        for part in parts if isinstance(parts, list) else ():
            fr = (part.get("functionResponse") or part.get("function_response")) if isinstance(part, dict) else None
            if isinstance(fr, dict):
                out.append(_gemini_result_text(fr.get("response")))
        return out
    if family == "anthropic":
        messages = body.get("messages")
        last = messages[-1] if isinstance(messages, list) and messages else None
        if not isinstance(last, dict) or last.get("role") != "user" or not isinstance(last.get("content"), list):
            return []
        return [_result_text(b.get("content")) for b in last["content"]
                if isinstance(b, dict) and b.get("type") == "tool_result"]
    if family == "openai_responses":
        items = body.get("input")
        out = []
        for item in reversed(items if isinstance(items, list) else []):
            if not isinstance(item, dict) or item.get("type") != "function_call_output":
                break
            out.append(_result_text(item.get("output")))
        return out[::-1]
    # OpenAI chat, Ollama (both routes): `tool` role messages after the assistant's calls.
    messages = body.get("messages")
    out = []
    for msg in reversed(messages if isinstance(messages, list) else []):
        if not isinstance(msg, dict) or msg.get("role") != "tool":
            break
        out.append(_result_text(msg.get("content")))
    return out[::-1]


# --- tool calls --------------------------------------------------------------------------------

def _example_value(schema: Any) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if isinstance(kind, str):
        kind = kind.lower()  # Gemini writes STRING / OBJECT
    if isinstance(schema, dict) and schema.get("enum"):
        return schema["enum"][0]
    return {
        "string": "testserve", "integer": 1, "number": 1.5, "boolean": True, "array": [],
        "object": example_arguments(schema),
    }.get(kind or "", None)


def example_arguments(schema: Any) -> dict[str, Any]:
    """Arguments that satisfy a JSON schema's properties with simple placeholder values."""
    if not isinstance(schema, dict):
        return {}
    props = schema.get("properties")
    if not isinstance(props, dict):
        return {}
    return {name: _example_value(sub) for name, sub in props.items()}


def wants_tool_call(prompt: Prompt) -> bool:
    return "call tool" in prompt.query.lower()


def chunk_text(text: str, parts: int = 3) -> list[str]:
    """Split a string into about `parts` pieces (at least one), as streamed argument deltas."""
    if not text:
        return [""]
    size = max(1, math.ceil(len(text) / parts))
    return [text[i:i + size] for i in range(0, len(text), size)]


# --- embeddings --------------------------------------------------------------------------------

def embedding(text: str, dim: int) -> list[float]:
    """SHA-256 bytes cycled to `dim`, mapped to [-1, 1], L2-normalised, rounded to 6 places."""
    digest = hashlib.sha256(text.encode()).digest()
    raw = [digest[i % len(digest)] / 127.5 - 1 for i in range(dim)]
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [round(v / norm, 6) for v in raw]
