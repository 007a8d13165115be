"""Wire shapes per provider family: streamed frames (as a `Plan`) and non-stream bodies.

Per-word frames are built as pre-encoded prefix + JSON string + suffix, so the ok path costs one
small encode per delta (testserve must never be the bottleneck of a gateway benchmark)."""

from __future__ import annotations

import itertools
import time
from typing import Any

import msgspec

from .content import (
    CACHE_READ_TOKENS,
    CACHE_WRITE_1H_TOKENS,
    CACHE_WRITE_TOKENS,
    REASONING_SIGNATURE,
    REASONING_TEXT,
    SEARCH_RESULTS,
    chunk_text,
)

enc = msgspec.json.Encoder().encode
dec = msgspec.json.decode
_ids = itertools.count(1)

DONE = b"data: [DONE]\n\n"
CUSTOM_DONE = b"data: END_OF_STREAM\n\n"
BLANK_DATA = b"data:\n\n"
BAD_JSON = b"data: {this is not json\n\n"
ANTHROPIC_PING = b'event: ping\ndata: {"type":"ping"}\n\n'


class Call:
    """One provider call, decided: who, which scenario, what to answer."""

    __slots__ = ("family", "model", "body", "scenario", "words", "input_tokens", "tool", "search_query",
                 "include_usage", "seq", "created", "prompt_cache")

    def __init__(self, family: str, model: str, body: dict[str, Any], scenario: str, words: list[str],
                 input_tokens: int, tool: tuple[str, str] | None, search_query: str | None) -> None:
        self.family = family
        self.model = model
        self.body = body
        self.scenario = scenario
        self.words = words
        self.input_tokens = max(1, input_tokens)
        self.tool = tool  # (function name, JSON arguments)
        self.search_query = search_query
        self.include_usage = False
        self.seq = next(_ids)
        self.created = int(time.time())
        # The `promptcache` scenario's emulated cache use (testserve.promptcache).
        self.prompt_cache: Any = None

    @property
    def text(self) -> str:
        return "".join(self.words)

    @property
    def usage(self) -> bool:
        return self.scenario != "nousage"

    @property
    def cache(self) -> bool:
        """Usage reports prompt-cache tokens (the `cache` scenario)."""
        return self.scenario == "cache"

    @property
    def reasoning(self) -> bool:
        """A thinking block comes ahead of the answer (the `reasoning` scenario; not with a tool call)."""
        return self.scenario == "reasoning" and not self.tool


class Plan:
    """A stream: head frames, one frame per delta, tail frames; `keepalive` goes before every
    third delta in the keepalive scenario."""

    __slots__ = ("head", "deltas", "tail", "keepalive", "content_type")

    def __init__(self, head: list[bytes], deltas: list[bytes], tail: list[bytes],
                 keepalive: bytes = BLANK_DATA, content_type: str = "text/event-stream") -> None:
        self.head = head
        self.deltas = deltas
        self.tail = tail
        self.keepalive = keepalive
        self.content_type = content_type


def sse(event: str, payload: Any) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + enc(payload) + b"\n\n"


def citations(text: str) -> list[dict[str, Any]]:
    return [{"url": url, "title": title, "start_index": 0, "end_index": len(text)}
            for url, title in SEARCH_RESULTS]


# --- OpenAI chat completions (also Ollama's OpenAI-compatible route) ---------------------------

def _openai_usage(c: Call, n: int) -> dict[str, Any]:
    if c.prompt_cache is not None:
        pc = c.prompt_cache
        return {"prompt_tokens": pc.total, "completion_tokens": n, "total_tokens": pc.total + n,
                "prompt_tokens_details": {"cached_tokens": pc.read}}
    if c.cache:
        # OpenAI counts cached tokens inside prompt_tokens.
        prompt = c.input_tokens + CACHE_READ_TOKENS
        return {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n,
                "prompt_tokens_details": {"cached_tokens": CACHE_READ_TOKENS}}
    return {"prompt_tokens": c.input_tokens, "completion_tokens": n, "total_tokens": c.input_tokens + n}


def _openai_tool_call(c: Call, arguments: str) -> dict[str, Any]:
    assert c.tool is not None
    return {"id": f"call_ts{c.seq}", "type": "function", "function": {"name": c.tool[0], "arguments": arguments}}


def openai_chat_stream(c: Call) -> Plan:
    rid = f"chatcmpl-ts{c.seq}".encode()
    head_json = (b'{"id":"' + rid + b'","object":"chat.completion.chunk","created":' + str(c.created).encode()
                 + b',"model":' + enc(c.model) + b',"system_fingerprint":"fp_testserve"')
    pre = b"data: " + head_json + b',"choices":[{"index":0,"delta":'
    usage_null = b',"usage":null' if c.include_usage else b""
    post = b',"logprobs":null,"finish_reason":null}]' + usage_null + b"}\n\n"
    if c.tool:
        first = _openai_tool_call(c, "")
        head = [pre + enc({"role": "assistant", "content": None, "tool_calls": [{"index": 0, **first}]}) + post]
        deltas = [pre + enc({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}) + post
                  for piece in chunk_text(c.tool[1])]
        finish = b"tool_calls"
    else:
        head = [pre + b'{"role":"assistant","content":"","refusal":null}' + post]
        if c.reasoning:
            # DeepSeek-style reasoning text, the Chat form meshfast's codec reads.
            head.append(pre + enc({"reasoning_content": REASONING_TEXT}) + post)
        deltas = [pre + b'{"content":' + enc(w) + b"}" + post for w in c.words]
        finish = b"stop"
    tail = []
    if c.search_query and not c.tool:
        notes = [{"type": "url_citation", "url_citation": cit} for cit in citations(c.text)]
        tail.append(pre + enc({"annotations": notes}) + post)
    tail.append(pre + b'{},"logprobs":null,"finish_reason":"' + finish + b'"}]' + usage_null + b"}\n\n")
    if c.include_usage and c.usage:
        tail.append(b"data: " + head_json + b',"choices":[],"usage":' + enc(_openai_usage(c, len(deltas))) + b"}\n\n")
    tail.append(CUSTOM_DONE if c.scenario == "customdone" else DONE)
    return Plan(head, deltas, tail)


def openai_chat_full(c: Call) -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": c.text, "refusal": None, "annotations": []}
    finish = "stop"
    n = len(c.words)
    if c.tool:
        message["content"] = None
        message["tool_calls"] = [_openai_tool_call(c, c.tool[1])]
        finish = "tool_calls"
        n = len(chunk_text(c.tool[1]))
    elif c.search_query:
        message["annotations"] = [{"type": "url_citation", "url_citation": cit} for cit in citations(c.text)]
    if c.reasoning:
        message["reasoning_content"] = REASONING_TEXT
    out: dict[str, Any] = {
        "id": f"chatcmpl-ts{c.seq}", "object": "chat.completion", "created": c.created, "model": c.model,
        "system_fingerprint": "fp_testserve",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
    }
    if c.usage:
        out["usage"] = _openai_usage(c, n)
    return enc(out)


# --- Anthropic Messages --------------------------------------------------------------------------

def _anthropic_message(c: Call, content: list[Any], usage: dict[str, Any] | None,
                       stop_reason: str | None) -> dict[str, Any]:
    msg: dict[str, Any] = {"id": f"msg_ts{c.seq}", "type": "message", "role": "assistant", "model": c.model,
                           "content": content, "stop_reason": stop_reason, "stop_sequence": None}
    if usage is not None and c.usage:
        msg["usage"] = usage
    return msg


def _anthropic_search_blocks(c: Call) -> tuple[dict[str, Any], dict[str, Any]]:
    tool_id = f"srvtoolu_ts{c.seq}"
    use = {"type": "server_tool_use", "id": tool_id, "name": "web_search", "input": {"query": c.search_query}}
    result = {"type": "web_search_tool_result", "tool_use_id": tool_id, "content": [
        {"type": "web_search_result", "url": url, "title": title, "encrypted_content": "dGVzdHNlcnZl",
         "page_age": "April 1, 2025"} for url, title in SEARCH_RESULTS]}
    return use, result


def _anthropic_citation(c: Call) -> dict[str, Any]:
    url, title = SEARCH_RESULTS[0]
    return {"type": "web_search_result_location", "url": url, "title": title, "encrypted_index": "dGVzdA==",
            "cited_text": c.text[:100]}


def _anthropic_cache(usage: dict[str, Any], c: Call) -> dict[str, Any]:
    if c.prompt_cache is not None:
        pc = c.prompt_cache
        usage["input_tokens"] = pc.uncached
        usage["cache_read_input_tokens"] = pc.read
        usage["cache_creation_input_tokens"] = pc.write_5m + pc.write_1h
        usage["cache_creation"] = {"ephemeral_5m_input_tokens": pc.write_5m, "ephemeral_1h_input_tokens": pc.write_1h}
        return usage
    if c.cache:
        usage["cache_read_input_tokens"] = CACHE_READ_TOKENS
        usage["cache_creation_input_tokens"] = CACHE_WRITE_TOKENS
        usage["cache_creation"] = {"ephemeral_5m_input_tokens": CACHE_WRITE_TOKENS - CACHE_WRITE_1H_TOKENS,
                                   "ephemeral_1h_input_tokens": CACHE_WRITE_1H_TOKENS}
    return usage


def _anthropic_thinking() -> dict[str, Any]:
    return {"type": "thinking", "thinking": REASONING_TEXT, "signature": REASONING_SIGNATURE}


def anthropic_stream(c: Call) -> Plan:
    start_usage = _anthropic_cache({"input_tokens": c.input_tokens, "output_tokens": 0}, c)
    head = [sse("message_start", {"type": "message_start",
                                  "message": _anthropic_message(c, [], start_usage, None)})]
    index = 0
    if c.search_query and not c.tool:
        use, result = _anthropic_search_blocks(c)
        head.append(sse("content_block_start", {"type": "content_block_start", "index": 0,
                                                "content_block": {**use, "input": {}}}))
        head.append(sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {
            "type": "input_json_delta", "partial_json": enc({"query": c.search_query}).decode()}}))
        head.append(sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
        head.append(sse("content_block_start", {"type": "content_block_start", "index": 1,
                                                "content_block": result}))
        head.append(sse("content_block_stop", {"type": "content_block_stop", "index": 1}))
        index = 2
    elif c.reasoning:
        empty = {"type": "thinking", "thinking": "", "signature": ""}
        head.append(sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": empty}))
        for delta in ({"type": "thinking_delta", "thinking": REASONING_TEXT},
                      {"type": "signature_delta", "signature": REASONING_SIGNATURE}):
            head.append(sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}))
        head.append(sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
        index = 1
    idx = str(index).encode()
    if c.tool:
        block = {"type": "tool_use", "id": f"toolu_ts{c.seq}", "name": c.tool[0], "input": {}}
        head.append(sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": block}))
        deltas = [sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                              "delta": {"type": "input_json_delta", "partial_json": piece}})
                  for piece in chunk_text(c.tool[1])]
        stop_reason = "tool_use"
    else:
        block = {"type": "text", "text": ""}
        if c.search_query:
            block["citations"] = []
        head.append(sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": block}))
        if c.search_query:
            head.append(sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": {
                "type": "citations_delta", "citation": _anthropic_citation(c)}}))
        pre = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":' + idx \
            + b',"delta":{"type":"text_delta","text":'
        deltas = [pre + enc(w) + b"}}\n\n" for w in c.words]
        stop_reason = "end_turn"
    message_delta: dict[str, Any] = {"type": "message_delta",
                                     "delta": {"stop_reason": stop_reason, "stop_sequence": None}}
    if c.usage:
        usage: dict[str, Any] = {"output_tokens": len(deltas)}
        if c.search_query:
            usage["server_tool_use"] = {"web_search_requests": 1}
        message_delta["usage"] = usage
    tail = [b'event: content_block_stop\ndata: {"type":"content_block_stop","index":' + idx + b"}\n\n",
            sse("message_delta", message_delta),
            b'event: message_stop\ndata: {"type":"message_stop"}\n\n']
    if c.scenario == "customdone":
        tail.append(CUSTOM_DONE)
    return Plan(head, deltas, tail, keepalive=ANTHROPIC_PING + BLANK_DATA)


def anthropic_full(c: Call) -> bytes:
    content: list[Any] = [_anthropic_thinking()] if c.reasoning else []
    usage: dict[str, Any] = _anthropic_cache({"input_tokens": c.input_tokens, "output_tokens": len(c.words)}, c)
    if c.tool:
        content.append({"type": "tool_use", "id": f"toolu_ts{c.seq}", "name": c.tool[0],
                        "input": dec(c.tool[1])})
        usage["output_tokens"] = len(chunk_text(c.tool[1]))
        stop = "tool_use"
    else:
        if c.search_query:
            content.extend(_anthropic_search_blocks(c))
            usage["server_tool_use"] = {"web_search_requests": 1}
        text_block: dict[str, Any] = {"type": "text", "text": c.text}
        if c.search_query:
            text_block["citations"] = [_anthropic_citation(c)]
        content.append(text_block)
        stop = "end_turn"
    return enc(_anthropic_message(c, content, usage, stop))


# --- OpenAI Responses ------------------------------------------------------------------------------

def _responses_usage(c: Call, n: int) -> dict[str, Any]:
    cached = CACHE_READ_TOKENS if c.cache else 0
    prompt = c.input_tokens + cached  # Responses counts cached tokens inside input_tokens
    if c.prompt_cache is not None:
        prompt, cached = c.prompt_cache.total, c.prompt_cache.read
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": n,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + n}


def _responses_call(c: Call, arguments: str, status: str) -> dict[str, Any]:
    assert c.tool is not None
    return {"type": "function_call", "id": f"fc_ts{c.seq}", "call_id": f"call_ts{c.seq}", "name": c.tool[0],
            "arguments": arguments, "status": status}


def _responses_reasoning(c: Call) -> dict[str, Any]:
    return {"type": "reasoning", "id": f"rs_ts{c.seq}", "status": "completed",
            "summary": [{"type": "summary_text", "text": REASONING_TEXT}], "encrypted_content": REASONING_SIGNATURE}


def _responses_object(c: Call, status: str, output: list[Any], usage: dict[str, Any] | None) -> dict[str, Any]:
    return {"id": f"resp_ts{c.seq}", "object": "response", "created_at": c.created, "status": status,
            "model": c.model, "output": output, "usage": usage if c.usage else None}


def _responses_items(c: Call) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    search = None
    if c.search_query:
        search = {"type": "web_search_call", "id": f"ws_ts{c.seq}", "status": "completed",
                  "action": {"type": "search", "query": c.search_query}}
    notes = [{"type": "url_citation", **cit} for cit in citations(c.text)] if c.search_query else []
    message = {"type": "message", "id": f"msg_ts{c.seq}", "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": c.text, "annotations": notes}]}
    return search, message


def responses_stream(c: Call) -> Plan:
    seq = itertools.count(0)

    def ev(kind: str, **fields: Any) -> bytes:
        return sse(kind, {"type": kind, "sequence_number": next(seq), **fields})

    head = [ev("response.created", response=_responses_object(c, "in_progress", [], None)),
            ev("response.in_progress", response=_responses_object(c, "in_progress", [], None))]
    if c.tool:
        item = _responses_call(c, c.tool[1], "completed")
        head.append(ev("response.output_item.added", output_index=0, item=_responses_call(c, "", "in_progress")))
        pieces = chunk_text(c.tool[1])
        deltas = [ev("response.function_call_arguments.delta", item_id=item["id"], output_index=0, delta=piece)
                  for piece in pieces]
        tail = [ev("response.function_call_arguments.done", item_id=item["id"], output_index=0,
                   arguments=c.tool[1]),
                ev("response.output_item.done", output_index=0, item=item),
                ev("response.completed",
                   response=_responses_object(c, "completed", [item], _responses_usage(c, len(pieces))))]
        if c.scenario == "customdone":
            tail.append(CUSTOM_DONE)
        return Plan(head, deltas, tail)
    search, message = _responses_items(c)
    out_index = 0
    if c.reasoning:
        thought = _responses_reasoning(c)
        summary = thought["summary"][0]
        head.append(ev("response.output_item.added", output_index=0,
                       item={**thought, "status": "in_progress", "summary": []}))
        head.append(ev("response.reasoning_summary_part.added", item_id=thought["id"], output_index=0,
                       summary_index=0, part={"type": "summary_text", "text": ""}))
        head.append(ev("response.reasoning_summary_text.delta", item_id=thought["id"], output_index=0,
                       summary_index=0, delta=REASONING_TEXT))
        head.append(ev("response.reasoning_summary_text.done", item_id=thought["id"], output_index=0,
                       summary_index=0, text=REASONING_TEXT))
        head.append(ev("response.reasoning_summary_part.done", item_id=thought["id"], output_index=0,
                       summary_index=0, part=summary))
        head.append(ev("response.output_item.done", output_index=0, item=thought))
        out_index = 1
    if search:
        head.append(ev("response.output_item.added", output_index=0, item={**search, "status": "in_progress"}))
        for step in ("in_progress", "searching", "completed"):
            head.append(ev(f"response.web_search_call.{step}", output_index=0, item_id=search["id"]))
        head.append(ev("response.output_item.done", output_index=0, item=search))
        out_index = 1
    item_id = message["id"]
    head.append(ev("response.output_item.added", output_index=out_index,
                   item={**message, "status": "in_progress", "content": []}))
    head.append(ev("response.content_part.added", item_id=item_id, output_index=out_index, content_index=0,
                   part={"type": "output_text", "text": "", "annotations": []}))
    pre = (b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":"'
           + item_id.encode() + b'","output_index":' + str(out_index).encode() + b',"content_index":0,"delta":')
    deltas = [pre + enc(w) + b',"logprobs":[],"sequence_number":' + str(next(seq)).encode() + b"}\n\n"
              for w in c.words]
    tail = []
    part = message["content"][0]
    for i, note in enumerate(part["annotations"]):
        tail.append(ev("response.output_text.annotation.added", item_id=item_id, output_index=out_index,
                       content_index=0, annotation_index=i, annotation=note))
    tail.append(ev("response.output_text.done", item_id=item_id, output_index=out_index, content_index=0,
                   text=c.text, logprobs=[]))
    tail.append(ev("response.content_part.done", item_id=item_id, output_index=out_index, content_index=0,
                   part=part))
    tail.append(ev("response.output_item.done", output_index=out_index, item=message))
    output = [search, message] if search else [message]
    if c.reasoning:
        output.insert(0, _responses_reasoning(c))
    tail.append(ev("response.completed",
                   response=_responses_object(c, "completed", output, _responses_usage(c, len(deltas)))))
    if c.scenario == "customdone":
        tail.append(CUSTOM_DONE)
    return Plan(head, deltas, tail)


def responses_full(c: Call) -> bytes:
    if c.tool:
        item = _responses_call(c, c.tool[1], "completed")
        body = _responses_object(c, "completed", [item], _responses_usage(c, len(chunk_text(c.tool[1]))))
        body["output_text"] = ""
        return enc(body)
    search, message = _responses_items(c)
    output = [search, message] if search else [message]
    if c.reasoning:
        output.insert(0, _responses_reasoning(c))
    body = _responses_object(c, "completed", output, _responses_usage(c, len(c.words)))
    body["output_text"] = c.text
    return enc(body)


# --- Gemini -----------------------------------------------------------------------------------------

def _gemini_grounding(c: Call) -> dict[str, Any]:
    return {
        "webSearchQueries": [c.search_query],
        "searchEntryPoint": {"renderedContent": f"<div class=\"testserve\">{c.search_query}</div>"},
        "groundingChunks": [{"web": {"uri": url, "title": title}} for url, title in SEARCH_RESULTS],
        "groundingSupports": [{"segment": {"startIndex": 0, "endIndex": len(c.text.encode()), "text": c.text},
                               "groundingChunkIndices": [0, 1]}],
    }


def _gemini_usage(c: Call, n: int) -> dict[str, int]:
    if c.cache:
        # Gemini counts cached tokens inside promptTokenCount.
        prompt = c.input_tokens + CACHE_READ_TOKENS
        return {"promptTokenCount": prompt, "candidatesTokenCount": n, "totalTokenCount": prompt + n,
                "cachedContentTokenCount": CACHE_READ_TOKENS}
    return {"promptTokenCount": c.input_tokens, "candidatesTokenCount": n, "totalTokenCount": c.input_tokens + n}


def _gemini_thought() -> dict[str, Any]:
    return {"text": REASONING_TEXT, "thought": True, "thoughtSignature": REASONING_SIGNATURE}


def _gemini_chunk(c: Call, parts: list[Any], n: int, last: bool) -> dict[str, Any]:
    cand: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
    if last:
        cand["finishReason"] = "STOP"
        if c.search_query and not c.tool:
            cand["groundingMetadata"] = _gemini_grounding(c)
    out: dict[str, Any] = {"candidates": [cand]}
    if c.usage:
        out["usageMetadata"] = _gemini_usage(c, n)
    out["modelVersion"] = "testserve"
    out["responseId"] = f"ts{c.seq}"
    return out


def gemini_stream(c: Call) -> Plan:
    # NOTE: the real alt=sse stream separates events with CRLF CRLF; parsers must cope.
    end = b"\r\n\r\n"
    if c.tool:
        part = {"functionCall": {"name": c.tool[0], "args": dec(c.tool[1])}}
        return Plan([], [b"data: " + enc(_gemini_chunk(c, [part], 1, True)) + end], _gemini_tail(c))
    words = c.words or [""]
    deltas = []
    if c.reasoning:
        deltas.append(b"data: " + enc(_gemini_chunk(c, [_gemini_thought()], 0, False)) + end)
    if len(words) > 1:
        pre = b'data: {"candidates":[{"content":{"parts":[{"text":'
        mid = b'}],"role":"model"},"index":0}]'
        rest = b',"modelVersion":"testserve","responseId":"ts' + str(c.seq).encode() + b'"}' + end
        p = c.input_tokens
        for i, w in enumerate(words[:-1]):
            if c.cache:
                usage = b',"usageMetadata":' + enc(_gemini_usage(c, i + 1))
            else:
                usage = (b',"usageMetadata":{"promptTokenCount":%d,"candidatesTokenCount":%d,"totalTokenCount":%d}'
                         % (p, i + 1, p + i + 1)) if c.usage else b""
            deltas.append(pre + enc(w) + mid + usage + rest)
    n_last = len(c.words)
    deltas.append(b"data: " + enc(_gemini_chunk(c, [{"text": words[-1]}], n_last, True)) + end)
    return Plan([], deltas, _gemini_tail(c))


def _gemini_tail(c: Call) -> list[bytes]:
    return [CUSTOM_DONE] if c.scenario == "customdone" else []


def gemini_full(c: Call) -> bytes:
    if c.tool:
        parts: list[Any] = [{"functionCall": {"name": c.tool[0], "args": dec(c.tool[1])}}]
        return enc(_gemini_chunk(c, parts, 1, True))
    parts = [_gemini_thought()] if c.reasoning else []
    return enc(_gemini_chunk(c, [*parts, {"text": c.text}], len(c.words), True))


# --- Ollama native /api/chat (NDJSON) -------------------------------------------------------------

def _ollama_final(c: Call, content: str, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {"model": c.model, "created_at": _iso(c.created),
                           "message": {"role": "assistant", "content": content}, "done": True, "done_reason": "stop"}
    if c.tool:
        out["message"]["tool_calls"] = [{"function": {"name": c.tool[0], "arguments": dec(c.tool[1])}}]
    elif c.reasoning and content:  # the stream sent its thinking in the first line
        out["message"]["thinking"] = REASONING_TEXT
    if c.usage:
        out.update(total_duration=1000, load_duration=100, prompt_eval_count=c.input_tokens,
                   prompt_eval_duration=100, eval_count=n, eval_duration=800)
    return out


def _iso(ts: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(ts))


def ollama_stream(c: Call) -> Plan:
    pre = (b'{"model":' + enc(c.model) + b',"created_at":"' + _iso(c.created).encode()
           + b'","message":{"role":"assistant","content":')
    deltas = [] if c.tool else [pre + enc(w) + b'},"done":false}\n' for w in c.words]
    tail = [enc(_ollama_final(c, "", len(deltas) or (1 if c.tool else 0))) + b"\n"]
    if c.reasoning:
        deltas.insert(0, pre + b'"","thinking":' + enc(REASONING_TEXT) + b'},"done":false}\n')
    return Plan([], deltas, tail, keepalive=b"\n", content_type="application/x-ndjson")


def ollama_full(c: Call) -> bytes:
    return enc(_ollama_final(c, "" if c.tool else c.text, len(c.words)))
