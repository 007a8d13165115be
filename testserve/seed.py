"""meshfast admin-API payloads that point a demo at a running testserve.

`demo_providers(port)` returns one provider body per family, each with its `models` list:
`ts-<family>` ← `dummy-chat` plus one `ts-<family>-<scenario>` ← `dummy-<scenario>` per scenario,
and the embedding / image / video models the family's testserve routes can answer.
Print them with `python -m testserve.seed [port]`."""

from __future__ import annotations

import sys
from typing import Any

import msgspec

API_KEY = "testserve-key"
# Scenarios worth a seeded model; `hang` and `error-400` stay reachable by resolved name only.
SCENARIO_MODELS = ("slow", "error-429", "error-500", "flaky", "conn-reset", "badjson", "nousage", "empty",
                   "unicode", "huge", "keepalive", "customdone", "tools", "cache", "reasoning")
FAMILY_PREFIX = {
    "openai": "openai",
    "openai_responses": "openai",
    "anthropic": "anthropic",
    "gemini": "gemini",
    "ollama": "ollama",
}
# Input kinds each family's chat route renders (mesh-behaviour §4.5).
_INPUTS = {
    "openai": {"supports_image_in": True, "supports_document_in": True, "supports_audio_in": True},
    "openai_responses": {"supports_image_in": True, "supports_document_in": True},
    "anthropic": {"supports_image_in": True, "supports_document_in": True},
    "gemini": {"supports_image_in": True, "supports_document_in": True, "supports_audio_in": True,
               "supports_video_in": True},
    "ollama": {"supports_image_in": True},
}
_WEB_SEARCH = {"openai", "openai_responses", "anthropic", "gemini"}


def _model(name: str, resolved: str, kind: str = "chat", inputs: dict[str, bool] | None = None,
           web_search: bool = False, output_media_type: str | None = None) -> dict[str, Any]:
    flags = {"supports_image_in": False, "supports_document_in": False, "supports_audio_in": False,
             "supports_video_in": False, **(inputs or {})}
    body: dict[str, Any] = {
        "name": name, "resolved_model": resolved, "kind": kind,
        "input_price_per_1k_tokens": "0.001", "output_price_per_1k_tokens": "0.002",
        **flags, "supports_web_search": web_search, "verify": False,
    }
    if output_media_type:
        body["output_media_type"] = output_media_type
    return body


def family_models(family: str) -> list[dict[str, Any]]:
    """The models seeded for one family (the chat model first)."""
    short = "responses" if family == "openai_responses" else family
    models = [_model(f"ts-{short}", "dummy-chat", inputs=_INPUTS[family], web_search=family in _WEB_SEARCH)]
    models += [_model(f"ts-{short}-{s}", f"dummy-{s}") for s in SCENARIO_MODELS]
    if family == "openai":
        models.append(_model("ts-openai-embed", "dummy-embed", kind="embedding"))
        models.append(_model("ts-openai-image", "dummy-image", kind="image_generation",
                             output_media_type="image/png"))
    elif family == "gemini":
        models.append(_model("ts-gemini-embed", "dummy-embed", kind="embedding"))
        models.append(_model("ts-gemini-video", "dummy-video", kind="video_generation",
                             output_media_type="video/mp4"))
    return models


def demo_providers(port: int = 9000, host: str = "127.0.0.1") -> list[dict[str, Any]]:
    """Admin-API provider bodies (with `models`) for every family testserve emulates."""
    out = []
    for family, prefix in FAMILY_PREFIX.items():
        out.append({
            "name": f"testserve-{family.replace('_', '-')}",
            "family": family,
            "base_url": f"http://{host}:{port}/{prefix}",
            "api_key": API_KEY,
            "local": True,
            "verify": False,
            "supports_web_search": family in _WEB_SEARCH,
            "models": family_models(family),
        })
    return out


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9000
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(demo_providers(port)), indent=2).decode() + "\n")
