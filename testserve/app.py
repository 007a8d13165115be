"""The testserve RSGI application: emulated LLM providers plus a `/_debug` API.

Served by Granian (`python -m testserve`). All state (request log, counters, scenario override,
flaky counters) lives in this worker's memory: with `--workers N` each worker keeps its own."""

from __future__ import annotations

import asyncio
import base64
import collections
import os
import random
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, unquote

import msgspec
from granian.rsgi import ProtocolClosed

from . import content, families, media, promptcache, realtime
from .content import Prompt
from .families import Call, Plan, enc

dec = msgspec.json.decode

SCENARIOS = ("ok", "slow", "hang", "error-400", "error-429", "error-500", "flaky", "conn-reset", "badjson",
             "nousage", "empty", "unicode", "huge", "keepalive", "customdone", "failed", "tools", "cache",
             "reasoning", "error-401-echo", "error-401-masked", "stream-error-echo", "promptcache")
# Longest first, so `-error-500` wins over a shorter suffix that also matches.
_SUFFIXES = tuple(sorted((s for s in SCENARIOS if s != "ok"), key=len, reverse=True))
# `-status-NNN`: answer that status (2xx to 5xx); a 3xx carries a Location back to this route.
_STATUS_SCENARIO = re.compile(r"(?:^|-)(status-[2-5][0-9][0-9])$")
# A redirect's Location carries this, and the call it leads to is answered normally: a client
# that follows the redirect gets a 200, which is how a test tells it did.
REDIRECTED_MARK = "testserve_redirected=1"
PLACEHOLDERS = ("{{content_json}}", "{{max_tokens_json}}", "{{input_json}}", "{{prompt_json}}", "{{query}}",
                "{{model}}", "{{api_key}}")
_PLACEHOLDER_BYTES = tuple(p.encode() for p in PLACEHOLDERS)
KEY_HEADERS = ("authorization", "x-api-key", "x-goog-api-key", "api-key")

JSON_HEADERS = [("content-type", "application/json")]
SSE_HEADERS = [("content-type", "text/event-stream"), ("cache-control", "no-cache"), ("x-accel-buffering", "no")]
NDJSON_HEADERS = [("content-type", "application/x-ndjson"), ("cache-control", "no-cache")]
_GOOGLE_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED",
                  500: "INTERNAL", 503: "UNAVAILABLE"}


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    return float(raw) if raw.strip() else default


class Settings(msgspec.Struct):
    """Knobs read from the environment at worker start; `POST /_debug/config` changes them live."""

    slow_delay_ms: float = 5000
    hang_seconds: float = 3600
    delta_delay_ms: float = 0
    chaos_rate: float = 0
    flaky_failures: int = 2
    retry_after_s: int = 1
    require_key: bool = False
    api_key: str = "testserve-key"
    force_scenario: str = ""
    log_limit: int = 500
    embedding_dim: int = 16
    video_job_s: float = 1.0

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            slow_delay_ms=_env_float("TESTSERVE_SLOW_DELAY_MS", 5000),
            hang_seconds=_env_float("TESTSERVE_HANG_SECONDS", 3600),
            delta_delay_ms=_env_float("TESTSERVE_DELTA_DELAY_MS", 0),
            chaos_rate=_env_float("TESTSERVE_CHAOS_RATE", 0),
            flaky_failures=int(_env_float("TESTSERVE_FLAKY_FAILURES", 2)),
            retry_after_s=int(_env_float("TESTSERVE_RETRY_AFTER_S", 1)),
            require_key=os.environ.get("TESTSERVE_REQUIRE_KEY", "").lower() in ("1", "true", "yes"),
            api_key=os.environ.get("TESTSERVE_API_KEY") or "testserve-key",
            force_scenario=os.environ.get("TESTSERVE_FORCE_SCENARIO", ""),
            log_limit=int(_env_float("TESTSERVE_LOG_LIMIT", 500)),
            embedding_dim=int(_env_float("TESTSERVE_EMBEDDING_DIM", 16)),
            video_job_s=_env_float("TESTSERVE_VIDEO_JOB_S", 1.0),
        )


def scenario_for_model(model: str) -> str:
    status = _STATUS_SCENARIO.search(model)
    if status:
        return status.group(1)
    for name in _SUFFIXES:
        if model.endswith("-" + name) or model == name:
            return name
    return "ok"


def error_body(family: str, status: int, etype: str, message: str) -> bytes:
    """An error in the family's own shape (every shape carries `error.message`, except Ollama's)."""
    if family == "anthropic":
        return enc({"type": "error", "error": {"type": etype, "message": message}})
    if family == "gemini":
        return enc({"error": {"code": status, "message": message, "status": _GOOGLE_STATUS.get(status, "UNKNOWN")}})
    if family == "ollama_native":
        return enc({"error": message})
    return enc({"error": {"message": message, "type": etype, "param": None, "code": etype}})


def mask_key(key: str) -> str:
    """The key as OpenAI quotes one it refused: the first 8 and last 4 characters, stars between."""
    if len(key) <= 12:
        return "*" * len(key)
    return key[:8] + "*" * (len(key) - 12) + key[-4:]


def refused_key_message(key: str) -> str:
    return (f"Incorrect API key provided: {key}. You can find your API key at "
            "https://platform.openai.com/account/api-keys.")


def stream_error_frame(family: str, message: str) -> bytes:
    """An error event inside a stream, in the family's own framing."""
    if family == "anthropic":
        return families.sse("error", {"type": "error", "error": {"type": "authentication_error", "message": message}})
    if family == "openai_responses":
        return families.sse("error", {"type": "error", "code": "invalid_api_key", "message": message, "param": None})
    if family == "gemini":
        return b"data: " + enc({"error": {"code": 401, "message": message, "status": "UNAUTHENTICATED"}}) + b"\r\n\r\n"
    if family == "ollama_native":
        return enc({"error": message}) + b"\n"
    return b"data: " + enc({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                      "code": "invalid_api_key"}}) + b"\n\n"


_SCENARIO_ERRORS = {
    "error-400": (400, "invalid_request_error", "testserve: scenario error-400"),
    "error-429": (429, "rate_limit_error", "testserve: scenario error-429 (rate limited)"),
    "error-500": (500, "api_error", "testserve: scenario error-500"),
}


class App:
    """The RSGI application object (`testserve.app:app`)."""

    def __init__(self) -> None:
        self.settings = Settings.from_env()
        self.override = ""
        self.log: collections.deque[dict[str, Any]] = collections.deque(maxlen=max(1, self.settings.log_limit))
        self.seq = 0
        self.total = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.started_at = time.time()
        self.flaky_counts: dict[str, int] = {}
        self.routes: dict[tuple[str, str], Callable[[Any, Any], Awaitable[None]]] = {
            ("GET", "/"): self.index,
            ("GET", "/healthz"): self.healthz,
            ("GET", "/_debug/requests"): self.debug_requests,
            ("DELETE", "/_debug/requests"): self.debug_clear,
            ("GET", "/_debug/last"): self.debug_last,
            ("GET", "/_debug/stats"): self.debug_stats,
            ("POST", "/_debug/scenario"): self.debug_set_scenario,
            ("GET", "/_debug/scenarios"): self.debug_scenarios,
            ("GET", "/_debug/files"): self.debug_files,
            ("GET", "/_debug/config"): self.debug_config,
            ("POST", "/_debug/config"): self.debug_config,
            ("POST", "/anthropic/v1/messages"): self._chat("anthropic"),
            ("POST", "/openai/v1/chat/completions"): self._chat("openai"),
            ("POST", "/openai/v1/responses"): self._chat("openai_responses"),
            ("POST", "/ollama/v1/chat/completions"): self._chat("ollama"),
            ("POST", "/ollama/api/chat"): self._chat("ollama_native"),
            ("POST", "/openai/v1/embeddings"): self._provider("openai", self.openai_embeddings),
            ("POST", "/openai/v1/images/generations"): self._provider("openai", self.openai_images),
            ("POST", "/openai/v1/images/urls"): self._provider("openai", self.openai_image_urls),
            ("POST", "/v1/videos/generations"): self._provider("openai", self.sync_video),
            ("POST", "/video/v1/jobs"): self._provider("video", self.video_submit),
        }

    def __rsgi_init__(self, loop: Any) -> None:
        # Granian imports the app in every worker; counting starts when the worker does.
        self.started_at = time.time()

    # --- dispatch ---------------------------------------------------------------------------------

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if scope.proto == "ws":
            if scope.path == "/openai/v1/realtime":
                await realtime.session(self, scope, proto)
            else:
                proto.close(404)
            return
        if scope.proto != "http":
            return
        path = scope.path
        handler = self.routes.get((scope.method, path))
        if handler is not None:
            await handler(scope, proto)
            return
        if path.startswith("/gemini/v1beta/models/") and scope.method == "POST" and ":" in path:
            model, _, action = path[len("/gemini/v1beta/models/"):].rpartition(":")
            model = unquote(model)
            if action in ("streamGenerateContent", "generateContent"):
                await self.provider_call(scope, proto, "gemini", model, self._chat_handler("gemini"))
                return
            gemini = {"embedContent": self.gemini_embed, "batchEmbedContents": self.gemini_embed,
                      "predict": self.gemini_predict}.get(action)
            if gemini is not None:
                await self.provider_call(scope, proto, "gemini", model, gemini)
                return
        if path.startswith("/video/v1/jobs/") and scope.method == "GET":
            await self.provider_call(scope, proto, "video", None, self.video_poll)
            return
        if path.startswith("/files/") and scope.method == "GET":
            found = media.FILES.get(path[len("/files/"):])
            if found:
                proto.response_bytes(200, [("content-type", found[0])], found[1])
            else:
                proto.response_bytes(404, JSON_HEADERS, enc({"error": {"message": f"no such file {path}"}}))
            return
        proto.response_bytes(404, JSON_HEADERS, enc({"error": {"message": f"no route {scope.method} {path}",
                                                              "type": "not_found", "code": "not_found"}}))

    def _provider(self, family: str, handler: Any) -> Callable[[Any, Any], Awaitable[None]]:
        async def route(scope: Any, proto: Any) -> None:
            await self.provider_call(scope, proto, family, None, handler)
        return route

    def _chat(self, family: str) -> Callable[[Any, Any], Awaitable[None]]:
        return self._provider(family, self._chat_handler(family))

    # --- the provider-call pipeline (capture, pre-flight, scenario, answer) -----------------------

    async def provider_call(self, scope: Any, proto: Any, family: str, model: str | None, handler: Any) -> None:
        raw = await proto()
        try:
            body = dec(raw) if raw else {}
        except msgspec.DecodeError:
            body = {"_unparsed": raw[:2000].decode("utf-8", "replace")}
        if not isinstance(body, dict):
            body = {"_unparsed": body}
        if model is None:
            model = _str(body.get("model"))
        key = self.presented_key(scope)
        scenario = self.override or self.settings.force_scenario or scenario_for_model(model)
        if REDIRECTED_MARK in scope.query_string:
            scenario = "ok"
        if self.settings.log_limit > 0:
            self.capture(scope, family, raw, body, model, scenario, key)
        self.total += 1
        self.in_flight += 1
        if self.in_flight > self.peak_in_flight:
            self.peak_in_flight = self.in_flight
        try:
            if not await self.preflight(proto, family, model, scenario, key, scope):
                return
            await handler(scope, proto, family, model, body, scenario)
        except ProtocolClosed:
            pass  # the client went away mid-stream (a benchmark ending, a client timeout)
        except Exception as exc:  # a request shape testserve did not expect: answer, don't die
            try:
                self.send_error(proto, family, 500, "api_error", f"testserve could not handle this: {exc!r}")
            except Exception:  # noqa: BLE001 - the response had already started
                pass
        finally:
            self.in_flight -= 1

    def presented_key(self, scope: Any) -> str | None:
        headers = scope.headers
        for name in KEY_HEADERS:
            value = headers.get(name)
            if value:
                return value.split()[-1] if value.split() else ""
        if "key=" in scope.query_string:
            keys = parse_qs(scope.query_string).get("key")
            if keys:
                return keys[0]
        return None

    def capture(self, scope: Any, family: str, raw: bytes, body: Any, model: str, scenario: str,
                key: str | None) -> None:
        self.seq += 1
        url_bits = (scope.path + "?" + scope.query_string).encode()
        found = [p for p, pb in zip(PLACEHOLDERS, _PLACEHOLDER_BYTES, strict=True)
                 if pb in raw or pb in url_bits or pb.replace(b"{", b"%7B").replace(b"}", b"%7D") in url_bits]
        self.log.append({
            "seq": self.seq, "ts": time.time(), "path": scope.path, "method": scope.method,
            "query": scope.query_string, "headers": {k.lower(): v for k, v in scope.headers.items()},
            "body": body, "body_bytes": len(raw), "model": model, "family": family, "scenario": scenario,
            "key_presented": key,
            "key_leaked_in_body": bool(key) and (key or "").encode() in raw,
            "placeholders_left": bool(found), "placeholders_found": found,
        })

    async def preflight(self, proto: Any, family: str, model: str, scenario: str, key: str | None,
                        scope: Any = None) -> bool:
        """Key check, chaos, then the scenario's error rows and delays; False when answered."""
        cfg = self.settings
        if cfg.require_key and key != cfg.api_key:
            self.send_error(proto, family, 401, "authentication_error", "testserve: invalid API key")
            return False
        if cfg.chaos_rate > 0 and random.random() < cfg.chaos_rate:
            self.send_error(proto, family, 500, "chaos_error", "testserve: chaos")
            return False
        if scenario == "ok":
            return True
        if scenario in ("error-401-echo", "error-401-masked"):
            # As OpenAI does: the refused key quoted back, whole or masked.
            shown = key or ""
            if scenario == "error-401-masked":
                shown = mask_key(shown)
            self.send_error(proto, family, 401, "invalid_api_key", refused_key_message(shown))
            return False
        if scenario.startswith("status-"):
            self.send_status(scope, proto, family, int(scenario[len("status-"):]))
            return False
        if scenario in _SCENARIO_ERRORS and not (family == "video" and scenario == "error-500"):
            status, etype, message = _SCENARIO_ERRORS[scenario]
            extra = [("retry-after", str(cfg.retry_after_s))] if status == 429 else []
            self.send_error(proto, family, status, etype, message, extra)
            return False
        if scenario == "flaky":
            seen = self.flaky_counts.get(model, 0)
            self.flaky_counts[model] = seen + 1
            if seen < cfg.flaky_failures:
                self.send_error(proto, family, 503, "overloaded_error", "testserve: flaky, try again")
                return False
        elif scenario == "slow":
            return not await _client_left_during(proto, cfg.slow_delay_ms / 1000)
        elif scenario == "hang":
            return not await _client_left_during(proto, cfg.hang_seconds)
        return True

    def send_status(self, scope: Any, proto: Any, family: str, status: int) -> None:
        """The `status-NNN` scenario: that status; a redirect points back at this route (marked,
        so the call it leads to is answered normally), 204 and 304 come without a body."""
        extra: list[tuple[str, str]] = []
        if 300 <= status < 400:
            query = f"{scope.query_string}&{REDIRECTED_MARK}" if scope.query_string else REDIRECTED_MARK
            extra.append(("location", f"{_base_url(scope)}{scope.path}?{query}"))
        if status in (204, 304):
            proto.response_empty(status, extra)
            return
        self.send_error(proto, family, status, "api_error", f"testserve: scenario status-{status}", extra)

    def send_error(self, proto: Any, family: str, status: int, etype: str, message: str,
                   extra: list[tuple[str, str]] | None = None) -> None:
        fam = "openai" if family == "video" else family
        proto.response_bytes(status, JSON_HEADERS + (extra or []), error_body(fam, status, etype, message))

    # --- chat --------------------------------------------------------------------------------------

    def _chat_handler(self, family: str) -> Any:
        async def handle(scope: Any, proto: Any, _fam: str, model: str, body: dict[str, Any], scenario: str) -> None:
            await self.chat(scope, proto, family, model, body, scenario)
        return handle

    async def chat(self, scope: Any, proto: Any, family: str, model: str, body: dict[str, Any],
                   scenario: str) -> None:
        if family == "gemini":
            stream = scope.path.endswith(":streamGenerateContent")
        elif family == "ollama_native":
            stream = body.get("stream", True) is not False
        else:
            stream = body.get("stream") is True
        prompt = _PROMPTS[family](body)
        if prompt.rejected:
            self.send_error(proto, family, 400, "invalid_request_error", f"testserve: {prompt.rejected}")
            return
        results = content.trailing_tool_results(family, body)
        if results:
            # The caller answered the model's calls: the reply acknowledges the results (the
            # earlier user text is not repeated, whichever turn each family calls "last user").
            prompt = Prompt()
            for result in results:
                prompt.add_tool_result(result)
        label = "ollama" if family == "ollama_native" else family
        text = content.reply_text(label, prompt, scenario)
        words = [] if scenario == "empty" else content.split_words(text)
        tool = _tool_call(family, body, prompt, scenario, after_results=bool(results))
        call = Call(label, model, body, scenario, words, prompt.input_tokens, tool,
                    _search_query(family, body, prompt))
        so = body.get("stream_options")
        call.include_usage = isinstance(so, dict) and so.get("include_usage") is True
        if scenario == "promptcache":
            if family == "anthropic":
                call.prompt_cache = promptcache.anthropic(model, body)
            elif family in ("openai", "openai_responses"):
                items = "input" if family == "openai_responses" else "messages"
                call.prompt_cache = promptcache.openai(model, body, items)
        stream_fn, full_fn = _SHAPES[family]
        if stream:
            plan = _bad_plan(family) if scenario == "badjson" else stream_fn(call)
            if scenario == "stream-error-echo":
                # A stream that starts, then fails with an error event quoting the key (whole, then masked).
                shown = self.presented_key(scope) or ""
                message = f"{refused_key_message(shown)} ({mask_key(shown)})"
                plan = families.Plan(plan.head, plan.deltas[:1], [stream_error_frame(family, message)],
                                     content_type=plan.content_type)
            await self.send_plan(proto, plan, scenario)
            return
        body_out = b"{this is not json" if scenario == "badjson" else full_fn(call)
        if scenario == "conn-reset":
            transport = proto.response_stream(200, JSON_HEADERS + [("content-length", str(len(body_out)))])
            await transport.send_bytes(body_out[: len(body_out) // 2])
            await asyncio.sleep(0.05)
            return
        proto.response_bytes(200, JSON_HEADERS, body_out)

    async def send_plan(self, proto: Any, plan: Plan, scenario: str) -> None:
        headers = SSE_HEADERS if plan.content_type == "text/event-stream" else NDJSON_HEADERS
        delay_s = self.settings.delta_delay_ms / 1000
        if scenario == "conn-reset":
            # NOTE: Granian ends a chunked stream cleanly even when the handler raises; announcing
            # the full length and returning early makes it drop the connection mid-body instead,
            # which the client sees as an incomplete message (not a clean end).
            full = len(b"".join(plan.head + plan.deltas + plan.tail))
            transport = proto.response_stream(200, headers + [("content-length", str(full))])
            await transport.send_bytes(b"".join(plan.head))
            for i, frame in enumerate(plan.deltas[:2]):
                if i and delay_s:
                    await asyncio.sleep(delay_s)
                await transport.send_bytes(frame)
            # NOTE: give the frames time to reach the socket before the abort drops the connection.
            await asyncio.sleep(0.05)
            return
        transport = proto.response_stream(200, headers)
        deltas = plan.deltas
        if scenario == "keepalive":
            deltas = []
            for i, frame in enumerate(plan.deltas):
                if i % 3 == 0:
                    deltas.append(plan.keepalive)
                deltas.append(frame)
        if delay_s <= 0:
            # One write: same bytes on the wire as per-frame writes, far fewer syscalls.
            await transport.send_bytes(b"".join(plan.head + deltas + plan.tail))
            return
        if plan.head:
            await transport.send_bytes(b"".join(plan.head))
        for i, frame in enumerate(deltas):
            if i:
                await asyncio.sleep(delay_s)
            await transport.send_bytes(frame)
        if plan.tail:
            await transport.send_bytes(b"".join(plan.tail))

    # --- embeddings, images, video -------------------------------------------------------------

    async def openai_embeddings(self, scope: Any, proto: Any, family: str, model: str, body: dict[str, Any],
                                scenario: str) -> None:
        raw_input = body.get("input", "")
        if isinstance(raw_input, str):
            texts = [raw_input]
        elif isinstance(raw_input, list) and raw_input and all(isinstance(x, str) for x in raw_input):
            texts = raw_input
        else:
            texts = [enc(raw_input).decode()]
        dims = body.get("dimensions")
        dim = dims if isinstance(dims, int) and dims > 0 else self.settings.embedding_dim
        data = [{"object": "embedding", "index": i,
                 "embedding": "not-a-vector" if scenario == "badjson" else content.embedding(t, dim)}
                for i, t in enumerate(texts)]
        out: dict[str, Any] = {"object": "list", "data": data, "model": model}
        if scenario != "nousage":
            tokens = sum(content.text_tokens(t) for t in texts)
            out["usage"] = {"prompt_tokens": tokens, "total_tokens": tokens}
        proto.response_bytes(200, JSON_HEADERS, enc(out))

    async def gemini_embed(self, scope: Any, proto: Any, family: str, model: str, body: dict[str, Any],
                           scenario: str) -> None:
        dim = self.settings.embedding_dim

        def values(req: Any) -> Any:
            parts = ((req or {}).get("content") or {}).get("parts") or []
            text = " ".join(p.get("text", "") for p in parts if isinstance(p, dict))
            return "not-a-vector" if scenario == "badjson" else content.embedding(text, dim)

        if scope.path.endswith(":batchEmbedContents"):
            out: Any = {"embeddings": [{"values": values(r)} for r in body.get("requests") or []]}
        else:
            out = {"embedding": {"values": values(body)}}
        proto.response_bytes(200, JSON_HEADERS, enc(out))

    async def openai_images(self, scope: Any, proto: Any, family: str, model: str, body: dict[str, Any],
                            scenario: str) -> None:
        if scenario == "badjson":
            proto.response_bytes(200, JSON_HEADERS, b'{"broken":true}')
            return
        n_raw = body.get("n")
        n = n_raw if isinstance(n_raw, int) else 1
        prompt = _str(body.get("prompt"))
        if body.get("response_format") == "url":
            item: dict[str, Any] = {"url": _base_url(scope) + "/files/dummy.png"}
        else:
            item = {"b64_json": base64.b64encode(media.PNG).decode()}
        item["revised_prompt"] = f"testserve: {prompt}"
        out: dict[str, Any] = {"created": int(time.time()), "data": [item] * max(1, n)}
        if scenario != "nousage":
            tokens = content.text_tokens(prompt)
            out["usage"] = {"input_tokens": tokens, "output_tokens": 1, "total_tokens": tokens + 1}
        proto.response_bytes(200, JSON_HEADERS, enc(out))

    async def openai_image_urls(self, scope: Any, proto: Any, family: str, model: str, body: dict[str, Any],
                                scenario: str) -> None:
        if scenario == "badjson":
            proto.response_bytes(200, JSON_HEADERS, b'{"broken":true}')
            return
        out = {"created": int(time.time()), "data": [{"url": _base_url(scope) + "/files/dummy.png"}]}
        proto.response_bytes(200, JSON_HEADERS, enc(out))

    async def gemini_predict(self, scope: Any, proto: Any, family: str, model: str, body: dict[str, Any],
                             scenario: str) -> None:
        if scenario == "badjson":
            proto.response_bytes(200, JSON_HEADERS, b'{"broken":true}')
            return
        mime, data = ("video/mp4", media.MP4) if "video" in model else ("image/png", media.PNG)
        out = {"predictions": [{"bytesBase64Encoded": base64.b64encode(data).decode(), "mimeType": mime}]}
        proto.response_bytes(200, JSON_HEADERS, enc(out))

    async def sync_video(self, scope: Any, proto: Any, family: str, model: str, body: dict[str, Any],
                         scenario: str) -> None:
        out = {"id": f"vid_{time.time_ns() // 1000}", "status": "succeeded",
               "video": {"url": _base_url(scope) + "/files/dummy.mp4", "duration_seconds": 2}}
        proto.response_bytes(200, JSON_HEADERS, enc(out))

    async def video_submit(self, scope: Any, proto: Any, family: str, model: str, body: dict[str, Any],
                           scenario: str) -> None:
        # The job id carries its own clock and fate, so any worker can answer a poll for it.
        now_ms = time.time_ns() // 1_000_000
        fate = "f" if scenario in ("failed", "error-500") else "o"
        job_id = f"vj_{now_ms}_{int(self.settings.video_job_s * 1000)}_{fate}_{random.getrandbits(32):08x}"
        out = {"id": job_id, "object": "video.job", "status": "queued", "model": model, "created_at": now_ms // 1000,
               "progress": 0}
        proto.response_bytes(200, JSON_HEADERS, enc(out))

    async def video_poll(self, scope: Any, proto: Any, family: str, model: str, body: dict[str, Any],
                         scenario: str) -> None:
        rest = scope.path[len("/video/v1/jobs/"):]
        job_id, _, tail = rest.partition("/")
        state = _video_state(job_id)
        if state is None or tail not in ("", "content"):
            self.send_error(proto, "video", 404, "not_found", f"testserve: no video job {job_id!r}")
            return
        status, progress, created_s = state
        if tail == "content":
            if status != "completed":
                self.send_error(proto, "video", 409, "invalid_request_error",
                                f"testserve: video job {job_id} is {status}")
                return
            proto.response_bytes(200, [("content-type", "video/mp4")], media.MP4)
            return
        out: dict[str, Any] = {"id": job_id, "object": "video.job", "status": status, "progress": progress,
                               "created_at": created_s}
        if status == "completed":
            out["content_url"] = _base_url(scope) + f"/video/v1/jobs/{job_id}/content"
            out["duration_seconds"] = 2
            if scenario != "nousage":
                out["usage"] = {"duration_seconds": 2}
        elif status == "failed":
            out["error"] = {"code": "generation_failed", "message": "testserve: scenario failed"}
        proto.response_bytes(200, JSON_HEADERS, enc(out))

    # --- plain and debug routes ---------------------------------------------------------------

    async def index(self, scope: Any, proto: Any) -> None:
        routes = sorted({p for _, p in self.routes} | {
            "/gemini/v1beta/models/{model}:streamGenerateContent", "/gemini/v1beta/models/{model}:generateContent",
            "/gemini/v1beta/models/{model}:embedContent", "/gemini/v1beta/models/{model}:batchEmbedContents",
            "/gemini/v1beta/models/{model}:predict", "/video/v1/jobs/{id}", "/video/v1/jobs/{id}/content",
            "/files/{name}"})
        proto.response_bytes(200, JSON_HEADERS, enc({"service": "testserve", "routes": routes,
                                                     "scenarios": SCENARIOS, "stats": self.stats()}))

    async def healthz(self, scope: Any, proto: Any) -> None:
        proto.response_bytes(200, JSON_HEADERS, b'{"ok":true}')

    def stats(self) -> dict[str, Any]:
        uptime = max(1e-9, time.time() - self.started_at)
        return {"total": self.total, "in_flight": self.in_flight, "peak_in_flight": self.peak_in_flight,
                "started_at": self.started_at, "uptime_seconds": round(uptime, 3),
                "requests_per_second": round(self.total / uptime, 3), "pid": os.getpid(),
                "scenario_override": self.override}

    async def debug_stats(self, scope: Any, proto: Any) -> None:
        proto.response_bytes(200, JSON_HEADERS, enc(self.stats()))

    async def debug_requests(self, scope: Any, proto: Any) -> None:
        q = parse_qs(scope.query_string)
        limit = int(q.get("limit", ["20"])[0])
        path, model = q.get("path", [""])[0], q.get("model", [None])[0]
        entries = [e for e in reversed(self.log)
                   if (not path or path in e["path"]) and (model is None or e["model"] == model)][:limit]
        proto.response_bytes(200, JSON_HEADERS, enc({"count": len(entries), "entries": entries}))

    async def debug_last(self, scope: Any, proto: Any) -> None:
        proto.response_bytes(200, JSON_HEADERS, enc(self.log[-1] if self.log else None))

    async def debug_clear(self, scope: Any, proto: Any) -> None:
        self.log.clear()
        self.flaky_counts.clear()
        promptcache.reset()
        self.total = 0
        self.peak_in_flight = self.in_flight
        self.started_at = time.time()
        proto.response_bytes(200, JSON_HEADERS, b'{"ok":true}')

    async def debug_set_scenario(self, scope: Any, proto: Any) -> None:
        body = dec(await proto() or b"{}")
        name = (body or {}).get("scenario") or ""
        if name and name not in SCENARIOS:
            proto.response_bytes(400, JSON_HEADERS, enc({"error": {"message": f"unknown scenario {name!r}",
                                                                  "type": "invalid_request_error",
                                                                  "code": "unknown_scenario"}}))
            return
        self.override = name
        proto.response_bytes(200, JSON_HEADERS, enc({"scenario": self.override}))

    async def debug_scenarios(self, scope: Any, proto: Any) -> None:
        proto.response_bytes(200, JSON_HEADERS, enc({"scenarios": SCENARIOS, "override": self.override,
                                                     "forced": self.settings.force_scenario}))

    async def debug_files(self, scope: Any, proto: Any) -> None:
        out = {name: {"media_type": mt, "bytes": len(data)} for name, (mt, data) in media.FILES.items()}
        proto.response_bytes(200, JSON_HEADERS, enc(out))

    async def debug_config(self, scope: Any, proto: Any) -> None:
        if scope.method == "POST":
            changes = dec(await proto() or b"{}")
            current = msgspec.structs.asdict(self.settings)
            unknown = sorted(set(changes) - set(current))
            if unknown:
                proto.response_bytes(400, JSON_HEADERS, enc({"error": {"message": f"unknown settings {unknown}",
                                                                      "type": "invalid_request_error",
                                                                      "code": "unknown_setting"}}))
                return
            current.update(changes)
            self.settings = msgspec.convert(current, Settings)
            if self.settings.log_limit > 0 and self.settings.log_limit != self.log.maxlen:
                self.log = collections.deque(self.log, maxlen=self.settings.log_limit)
        proto.response_bytes(200, JSON_HEADERS, enc(self.settings))


async def _client_left_during(proto: Any, seconds: float) -> bool:
    """Sleep, but stop early (True) if the client disconnects, so `in_flight` stays honest."""
    watcher = asyncio.ensure_future(proto.client_disconnect())
    try:
        done, _ = await asyncio.wait({watcher}, timeout=seconds)
        return bool(done)
    finally:
        watcher.cancel()


def _base_url(scope: Any) -> str:
    host = scope.headers.get("host") or scope.authority or "127.0.0.1"
    return f"{scope.scheme}://{host}"


def _video_state(job_id: str) -> tuple[str, int, int] | None:
    try:
        _, created_ms, dur_ms, fate, _ = job_id.split("_")
        created, duration = int(created_ms), max(1, int(dur_ms))
    except ValueError:
        return None
    elapsed = time.time_ns() // 1_000_000 - created
    if elapsed < duration * 0.3:
        return "queued", 0, created // 1000
    if elapsed < duration:
        return "running", min(99, int(100 * elapsed / duration)), created // 1000
    return ("failed" if fate == "f" else "completed"), 100, created // 1000


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


# --- per-family tables ---------------------------------------------------------------------------

_PROMPTS: dict[str, Callable[[dict[str, Any]], Prompt]] = {
    "anthropic": content.prompt_anthropic,
    "openai": content.prompt_openai_chat,
    "ollama": lambda body: content.prompt_openai_chat(body, text_and_image_only=True),
    "openai_responses": content.prompt_responses,
    "gemini": content.prompt_gemini,
    "ollama_native": content.prompt_ollama_native,
}

_SHAPES: dict[str, tuple[Callable[[Call], Plan], Callable[[Call], bytes]]] = {
    "anthropic": (families.anthropic_stream, families.anthropic_full),
    "openai": (families.openai_chat_stream, families.openai_chat_full),
    "ollama": (families.openai_chat_stream, families.openai_chat_full),
    "openai_responses": (families.responses_stream, families.responses_full),
    "gemini": (families.gemini_stream, families.gemini_full),
    "ollama_native": (families.ollama_stream, families.ollama_full),
}


def _bad_plan(family: str) -> Plan:
    if family == "ollama_native":
        return Plan([b"{this is not json\n"], [], [], content_type="application/x-ndjson")
    tail = [families.DONE] if family in ("openai", "ollama") else []
    return Plan([families.BAD_JSON], [], tail)


def _function_tools(tools: Any) -> list[tuple[str, Any]]:
    """(name, JSON schema) of every function tool in an OpenAI-style `tools` list."""
    out = []
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict):
            continue
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else None
        if fn and fn.get("name"):
            out.append((fn["name"], fn.get("parameters")))
        elif tool.get("type") == "function" and tool.get("name"):  # Responses puts fields flat
            out.append((tool["name"], tool.get("parameters")))
    return out


def _pick(declared: list[tuple[str, Any]], forced: str | None, force_any: bool, prompt: Prompt,
          scenario: str, after_results: bool) -> tuple[str, str] | None:
    if not declared:
        return None
    if forced:
        chosen = next((d for d in declared if d[0] == forced), None)
    elif scenario == "tools" and not after_results:
        # NOTE: fixed arguments, so SDK tests can assert them whatever schema they declared.
        return declared[0][0], enc(content.TOOL_ARGUMENTS).decode()
    elif force_any or content.wants_tool_call(prompt):
        chosen = declared[0]
    else:
        return None
    if chosen is None:
        return None
    return chosen[0], enc(content.example_arguments(chosen[1])).decode()


def _tool_call(family: str, body: dict[str, Any], prompt: Prompt, scenario: str = "ok",
               after_results: bool = False) -> tuple[str, str] | None:
    """(function name, JSON arguments) when this request should be answered with a tool call:
    a forcing tool choice, "call tool" in the prompt, or the `tools` scenario (unless the
    conversation ends with the results of earlier calls)."""
    tools = body.get("tools")
    if not tools:
        return None
    if family in ("openai", "ollama", "ollama_native", "openai_responses"):
        choice = body.get("tool_choice")
        if choice == "none":
            return None
        forced = None
        if isinstance(choice, dict):
            forced = _str(_obj(choice.get("function")).get("name") or choice.get("name")) or None
        return _pick(_function_tools(tools), forced, choice == "required", prompt, scenario, after_results)
    if family == "anthropic":
        declared = [(t["name"], t.get("input_schema")) for t in _list(tools)
                    if isinstance(t, dict) and t.get("name") and "input_schema" in t]
        choice = _obj(body.get("tool_choice"))
        if choice.get("type") == "none":
            return None
        forced = choice.get("name") if choice.get("type") == "tool" else None
        return _pick(declared, forced, choice.get("type") == "any", prompt, scenario, after_results)
    if family == "gemini":
        declared = []
        for tool in _list(tools):
            tool = _obj(tool)
            for fn in _list(tool.get("functionDeclarations") or tool.get("function_declarations")):
                if isinstance(fn, dict) and fn.get("name"):
                    declared.append((fn["name"], fn.get("parameters") or fn.get("parametersJsonSchema")))
        cfg = _obj(body.get("toolConfig") or body.get("tool_config"))
        fcc = _obj(cfg.get("functionCallingConfig") or cfg.get("function_calling_config"))
        mode = str(fcc.get("mode", "")).upper()
        if mode == "NONE":
            return None
        allowed = _list(fcc.get("allowedFunctionNames") or fcc.get("allowed_function_names"))
        return _pick(declared, allowed[0] if mode == "ANY" and allowed else None, mode == "ANY", prompt,
                     scenario, after_results)
    return None


def _search_query(family: str, body: dict[str, Any], prompt: Prompt) -> str | None:
    tools = _list(body.get("tools"))
    if family == "anthropic":
        wanted = any(isinstance(t, dict) and str(t.get("type", "")).startswith("web_search") for t in tools)
    elif family in ("openai", "ollama"):
        wanted = "web_search_options" in body
    elif family == "openai_responses":
        wanted = any(isinstance(t, dict) and str(t.get("type", "")).startswith("web_search") for t in tools)
    elif family == "gemini":
        wanted = any(isinstance(t, dict) and ({"google_search", "googleSearch", "google_search_retrieval",
                                                "googleSearchRetrieval"} & set(t)) for t in tools)
    else:
        wanted = False
    return (prompt.query[:100] or "testserve") if wanted else None


app = App()
