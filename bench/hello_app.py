"""A Granian RSGI hello-world: the ceiling that `GET /v1/models` is measured against.

It answers every request with one fixed JSON body shaped and sized like meshfast's `/v1/models`
answer for a caller granted five models (API.md: OpenAI `data` entries plus Mesh `models` entries),
so the comparison isolates what meshfast does per request (key lookup, snapshot read, encoding)
from what Granian and the kernel cost anyway.

A `POST` (any path; the body is read and ignored) gets a fixed streamed answer instead:
`text/event-stream`, chunked, one write of ~1 KB shaped like testserve's short Anthropic stream
(`message_start` ... three `content_block_delta` ... `message_stop`), the framing the proxy runs
stream. `bench/ceiling_bench.py` uses it as the trivial server that measures the load generators'
own ceiling: the client parses the same kind of body as in the real runs, and the server does
nothing per request but hand Granian the bytes.
"""

from __future__ import annotations

import json

MODEL_COUNT = 5


def _models_body(model_count: int = MODEL_COUNT) -> bytes:
    """Build the fixed body once, at import; about 1.5 KB for five models."""
    names = [f"bench-model-{i}" for i in range(model_count)]
    body = {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": 1700000000, "owned_by": "bench-openai"}
            for name in names
        ],
        "models": [
            {
                "model": name,
                "kind": "chat",
                "formats_accepted": ["openai_chat", "openai_responses", "anthropic", "gemini", "ollama"],
                "status": "available",
                "usage": {"spent_usd": 0.0, "daily_cap_usd": 20.0, "remaining_usd": 20.0},
                "resume_at": None,
            }
            for name in names
        ],
    }
    return json.dumps(body, separators=(",", ":")).encode()


def _sse(event: str, data: dict) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def _stream_body(words: tuple[str, ...] = ("Hello", " from", " the ceiling.")) -> bytes:
    """A short Anthropic Messages stream, built once: what testserve answers a short call with."""
    message = {"id": "msg_ceiling", "type": "message", "role": "assistant", "model": "dummy-chat", "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 8, "output_tokens": 0}}
    frames = [_sse("message_start", {"type": "message_start", "message": message}),
              _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                           "content_block": {"type": "text", "text": ""}})]
    frames += [_sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "text_delta", "text": w}}) for w in words]
    frames += [_sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
               _sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                                                         "stop_sequence": None},
                                      "usage": {"output_tokens": len(words)}}),
               _sse("message_stop", {"type": "message_stop"})]
    return b"".join(frames)


BODY: bytes = _models_body()
HEADERS: list[tuple[str, str]] = [("content-type", "application/json")]
STREAM_BODY: bytes = _stream_body()
STREAM_END: bytes = b"message_stop"
STREAM_HEADERS: list[tuple[str, str]] = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]


class HelloApp:
    """RSGI app with no per-request work beyond handing Granian the bytes (POST: the stream)."""

    async def __rsgi__(self, scope, proto) -> None:
        if scope.method == "POST":
            await proto()  # the request body, read and dropped (as any server reads it)
            transport = proto.response_stream(200, STREAM_HEADERS)
            await transport.send_bytes(STREAM_BODY)
            return
        proto.response_bytes(200, HEADERS, BODY)


app = HelloApp()
