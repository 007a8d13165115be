"""Verify-on-save: one live call per model before a provider or model is written.

The call goes through the same code as traffic: a throwaway core is loaded with a config that
holds only the provider, its models and a one-off caller, ``prepare`` renders the request, and
the dispatcher sends it. So what is verified is exactly what callers will get.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from typing import TYPE_CHECKING, Any

import msgspec

from meshfast import errors
from meshfast._core import Core
from meshfast.dispatch import Dispatcher, UpstreamError
from meshfast.snapshot import Config, Grant, Key, Model, Principal, Provider, encode

if TYPE_CHECKING:
    from meshfast.dataplane import Route

PARALLEL = 8
CHAT_TIMEOUT_S = 10.0
EMBEDDING_TIMEOUT_S = 30.0
GENERATION_TIMEOUT_S = 90.0
# Per model kind: the route, the body and the timeout of its one live call.
_ROUTES: dict[str, tuple[Route, dict[str, Any], float]] = {
    "chat": ("proxy", {"query": "test", "max_tokens": 16}, CHAT_TIMEOUT_S),
    "embedding": ("embeddings", {"input": "test"}, EMBEDDING_TIMEOUT_S),
    "image_generation": ("generate", {"prompt": "test"}, GENERATION_TIMEOUT_S),
    "video_generation": ("generate", {"prompt": "test"}, GENERATION_TIMEOUT_S),
}


class Failure(msgspec.Struct):
    model: str
    reason: str


async def verify(dispatcher: Dispatcher, provider: Provider, models: list[Model]) -> list[Failure]:
    """Call each model once (up to 8 at a time); returns the failures (empty when all answered)."""
    if not models:
        return []
    pepper = secrets.token_bytes(32)
    token = "mesh_live_" + secrets.token_urlsafe(32)[:43]
    principal = Principal(id="00000000-0000-0000-0000-00000000ffff", email="verify@meshfast.local",
                          display_name="verify", status="active", expires_at_ms=None)
    key = Key(id="00000000-0000-0000-0000-00000000fffe", principal=0,
              digest=hashlib.sha256(pepper + token.encode()).digest(), status="active", expires_at_ms=None)
    for model in models:
        model.provider = 0
    grants = [Grant(principal=0, model=i, daily_cap_nano_usd=0, max_calls_per_hour=None, allowed_from_min=None,
                    allowed_to_min=None, timezone="UTC", active_days=[], always_open=True)
              for i in range(len(models))]
    core = Core(pepper, None)
    core.load(encode(Config(seq=0, kill_switch=False, principals=[principal], keys=[key],
                            providers=[provider], models=models, grants=grants)))
    gate = asyncio.Semaphore(PARALLEL)

    async def one(model: Model) -> Failure | None:
        route, body, timeout_s = _ROUTES[model.kind]
        raw = msgspec.json.encode(body)
        prepared = core.prepare(route, f"Bearer {token}", None, None, f"model={model.name}", raw, len(raw),
                                time.time_ns() // 1_000_000)
        if prepared.status:
            return Failure(model.name, prepared.body.decode(errors="replace").strip())
        # NOTE: status 0 is an admitted call, which always carries its upstream request.
        assert prepared.method is not None and prepared.url is not None
        async with gate:
            try:
                async with asyncio.timeout(timeout_s):
                    response = await dispatcher.send(prepared.method, prepared.url, prepared.headers,
                                                     prepared.upstream_body, local=prepared.local, attempts=1,
                                                     backoff_ms=prepared.backoff_ms)
                    try:
                        await response.read(64 * 1024)
                    finally:
                        response.close()
            except UpstreamError as exc:
                status = f"HTTP {exc.status}: " if exc.status else ""
                return Failure(model.name, f"{status}{exc.message}"[:500])
            except TimeoutError:
                return Failure(model.name, f"no answer within {timeout_s:.0f} s")
        return None

    results = await asyncio.gather(*(one(m) for m in models))
    return [f for f in results if f is not None]


def wants_verify(kind: str, flag: bool | None) -> bool:
    """Chat and embedding models verify unless told not to; generation only when asked."""
    if kind in ("image_generation", "video_generation"):
        return flag is True
    return flag is not False


def describe(failures: list[Failure]) -> dict[str, Any]:
    return {"error": errors.VerificationFailed.code, "failures": [msgspec.to_builtins(f) for f in failures]}
