"""A Granian RSGI hello-world: the ceiling that `GET /v1/models` is measured against.

It answers every request with one fixed JSON body shaped and sized like meshfast's `/v1/models`
answer for a caller granted five models (API.md: OpenAI `data` entries plus Mesh `models` entries),
so the comparison isolates what meshfast does per request (key lookup, snapshot read, encoding)
from what Granian and the kernel cost anyway.
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


BODY: bytes = _models_body()
HEADERS: list[tuple[str, str]] = [("content-type", "application/json")]


class HelloApp:
    """RSGI app with no routing and no per-request work beyond handing Granian the bytes."""

    async def __rsgi__(self, scope, proto) -> None:
        proto.response_bytes(200, HEADERS, BODY)


app = HelloApp()
