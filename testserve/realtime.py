"""An emulated OpenAI Realtime endpoint (`GET /openai/v1/realtime?model=...`, a WebSocket).

Enough of the protocol for a client and a gateway in front of it: `session.created` on connect,
`session.update` → `session.updated`, `conversation.item.create` → `conversation.item.added` and
`conversation.item.done`, `response.create` → a text response streamed as
`response.output_text.delta` events and closed by `response.done` with usage, `response.cancel`
→ `response.done` (cancelled). Deterministic usage: a response's output is the first N words of
`REPLY` (N = its `max_output_tokens`, at most all of them), one token a word; its input is 10
tokens plus 2 per earlier response in the session. Each client event is captured in the request
log (family `openai_realtime`) like any provider call.

Scenarios by the model's name: `...-echo-key` quotes the key it was called with in a
`rate_limits.updated` event and in the `response.done` (as a failed response's details would);
`...-refuse` answers every `response.create` with an `error` and starts nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any
from urllib.parse import parse_qs

from granian.rsgi import ProtocolClosed

REPLY = "Hello from the realtime emulator, one word at a time for you."
_ids = itertools.count(1)


def _id(prefix: str) -> str:
    return f"{prefix}_{next(_ids):08d}"


def _limit(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


async def session(app: Any, scope: Any, proto: Any) -> None:
    """One realtime session on an accepted WebSocket."""
    model = (parse_qs(scope.query_string).get("model") or [""])[0]
    key = app.presented_key(scope)
    if app.settings.require_key and key != app.settings.api_key:
        proto.close(401)
        return
    transport = await proto.accept()
    state: dict[str, Any] = {"id": _id("sess"), "object": "realtime.session", "type": "realtime", "model": model,
                             "output_modalities": ["text"], "max_output_tokens": "inf"}
    responses = 0
    running: asyncio.Task[None] | None = None

    async def send(event: dict[str, Any]) -> None:
        await transport.send_str(json.dumps({"event_id": _id("event"), **event}))

    async def respond(params: dict[str, Any]) -> None:
        nonlocal responses
        rid = _id("resp")
        limit = _limit(params.get("max_output_tokens")) or _limit(state.get("max_output_tokens"))
        words = REPLY.split()[:limit] if limit else REPLY.split()
        input_tokens = 10 + 2 * responses
        responses += 1
        response = {"id": rid, "object": "realtime.response", "status": "in_progress", "output": [],
                    "conversation_id": "conv_1", "output_modalities": ["text"], "usage": None}
        await send({"type": "response.created", "response": response})
        item = {"id": _id("item"), "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        await send({"type": "response.output_item.added", "response_id": rid, "output_index": 0, "item": item})
        await send({"type": "response.content_part.added", "response_id": rid, "item_id": item["id"],
                    "output_index": 0, "content_index": 0, "part": {"type": "text", "text": ""}})
        status = "completed"
        try:
            for i, word in enumerate(words):
                if app.settings.delta_delay_ms:
                    await asyncio.sleep(app.settings.delta_delay_ms / 1000)
                await send({"type": "response.output_text.delta", "response_id": rid, "item_id": item["id"],
                            "output_index": 0, "content_index": 0, "delta": (" " if i else "") + word})
        except asyncio.CancelledError:
            status = "cancelled"
        text = " ".join(words)
        await send({"type": "response.output_text.done", "response_id": rid, "item_id": item["id"],
                    "output_index": 0, "content_index": 0, "text": text})
        done_item = {**item, "status": "completed", "content": [{"type": "output_text", "text": text}]}
        await send({"type": "response.output_item.done", "response_id": rid, "output_index": 0, "item": done_item})
        usage = {"total_tokens": input_tokens + len(words), "input_tokens": input_tokens, "output_tokens": len(words),
                 "input_token_details": {"cached_tokens": 0, "text_tokens": input_tokens, "audio_tokens": 0},
                 "output_token_details": {"text_tokens": len(words), "audio_tokens": 0}}
        done = {**response, "status": status, "output": [done_item], "usage": usage}
        if model.endswith("-echo-key"):
            quoted = f"Incorrect API key provided: {key}"
            await send({"type": "rate_limits.updated", "rate_limits": [{"name": "requests", "note": quoted}]})
            done["status_details"] = {"type": "failed", "error": {"type": "invalid_request_error", "message": quoted}}
        await send({"type": "response.done", "response": done})

    try:
        await send({"type": "session.created", "session": state})
        while True:
            message = await transport.receive()
            if message.kind == 0:
                break
            raw = message.data if isinstance(message.data, str) else message.data.decode("utf-8", "replace")
            try:
                event = json.loads(raw)
            except ValueError:
                event = {"type": "_unparsed"}
            if not isinstance(event, dict):
                event = {"type": "_unparsed"}
            kind = event.get("type")
            app.capture(scope, "openai_realtime", raw.encode(), event, model, "ok", key)
            app.total += 1
            if kind == "session.update" and isinstance(event.get("session"), dict):
                state.update(event["session"])
                await send({"type": "session.updated", "session": state})
            elif kind == "conversation.item.create":
                item = {**(event.get("item") or {}), "id": _id("item"), "status": "completed"}
                await send({"type": "conversation.item.added", "previous_item_id": None, "item": item})
                await send({"type": "conversation.item.done", "previous_item_id": None, "item": item})
            elif kind == "response.create" and model.endswith("-refuse"):
                await send({"type": "error", "error": {"type": "invalid_request_error", "code": "refused_by_provider",
                                                       "message": "testserve refuses every response here"}})
            elif kind == "response.create":
                if running is not None and not running.done():
                    await send({"type": "error", "error": {"type": "invalid_request_error",
                                                           "code": "conversation_already_has_active_response",
                                                           "message": "a response is in progress"}})
                    continue
                running = asyncio.create_task(respond(event.get("response") or {}))
            elif kind == "response.cancel":
                if running is not None and not running.done():
                    running.cancel()
            else:
                await send({"type": "error", "error": {"type": "invalid_request_error", "code": "unknown_event",
                                                       "message": f"unknown event type {kind!r}"}})
    except (ProtocolClosed, RuntimeError):
        pass
    finally:
        if running is not None and not running.done():
            running.cancel()
