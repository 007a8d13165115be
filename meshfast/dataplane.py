"""The data plane: Mesh's ``POST /v1/proxy``, ``/v1/embeddings``, ``/v1/generate`` and the
standard chat entry routes (OpenAI Chat and Responses, Anthropic Messages, Gemini, Ollama).

One call into the core decides (authenticate, authorize, policy, validate, render or
translate); Python moves bytes: it sends the upstream request, feeds the upstream stream to the
core's reader (SSE to NDJSON, or the IR translator) and writes what it returns, one flush per
upstream read. Every POST ends in exactly one row.
"""

from __future__ import annotations

import array
import asyncio
import base64
import collections
import contextlib
import logging
import re
import sys
import time
from typing import Any, Literal, TypeAlias

import msgspec

from meshfast import errors, tags
from meshfast._core import Core, ShmError, UpstreamBodyError, entry_error, entry_stream_content_type, request_id
from meshfast.admission import Admission
from meshfast.dispatch import Dispatcher, UpstreamError, UpstreamResponse
from meshfast.dlp_model import DetectionModel
from meshfast.metrics import Metrics
from meshfast.settings import Settings
from meshfast.telemetry import Row, RuleEvent, Telemetry

log = logging.getLogger("meshfast.dataplane")

# A data-plane route as the core's ``Core.prepare`` takes it (mypy holds this list to the stub's).
Route: TypeAlias = Literal["proxy", "embeddings", "generate", "openai_chat", "openai_responses", "anthropic",
                           "gemini", "ollama", "openai_embeddings"]

JSON = "application/json"
NDJSON = "application/x-ndjson"
_json = msgspec.json.Encoder()
# Upstream calls in flight at once for one multi-input OpenAI embeddings request.
EMBEDDING_PARALLEL = 8
# Largest non-streamed upstream answer read (embeddings, generation).
MAX_UPSTREAM_BODY = 300 * 1024 * 1024
# How long a refusal the configuration decides waits for a write this instance already knows of
# (DataPlane.caught_up); past it, the worker decides on what it has.
CONFIG_CATCH_UP_S = 2.0
# Refusals a later configuration may turn into admissions: an unknown key (401), a model not
# granted or not allowed (403), an unknown model (404).
_CONFIG_REFUSALS = frozenset({401, 403, 404})


def client_ip(scope: Any) -> str | None:
    client = scope.client or ""
    host = client.rsplit(":", 1)[0] if ":" in client else client
    return host.strip("[]") or None


def _header(headers: Any, name: str) -> str | None:
    try:
        return headers.get(name)
    except (UnicodeDecodeError, ValueError):
        return None


class _ClientGone(Exception):
    """The caller closed the connection mid-stream."""


class _Held:
    """The caller's side of one upstream exchange, held until the call's row is in the ring.

    A whole answer (``response_bytes``) is kept and sent by :meth:`release`; a stream's transport
    is referenced until then, and Granian ends a streamed response (its last chunk) when the
    transport is dropped. So the caller never holds a complete answer whose row a SIGKILL of this
    worker could still lose: the row is pushed first (telemetry's promise)."""

    __slots__ = ("_proto", "_answer", "_stream", "_last")

    def __init__(self, proto: Any) -> None:
        self._proto = proto
        self._answer: tuple[int, list[tuple[str, str]], bytes] | None = None
        self._stream: Any = None
        self._last: bytes | None = None

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self._answer = (status, headers, body)

    def response_stream(self, status: int, headers: list[tuple[str, str]]) -> Any:
        self._stream = self._proto.response_stream(status, headers)
        return self._stream

    def send_last(self, data: bytes) -> None:
        """A stream's last bytes (its done line, its usage): sent by :meth:`release`, after the row,
        so a caller that stops reading at the done line also never has it before the row is pushed."""
        self._last = data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._proto, name)

    async def release(self) -> None:
        answer, last, stream = self._answer, self._last, self._stream
        self._answer = self._last = self._stream = None
        if last and stream is not None:
            with contextlib.suppress(Exception):  # the caller left
                await stream.send_bytes(last)
        if answer is not None:
            self._proto.response_bytes(*answer)


class DataPlane:
    def __init__(self, core: Core, dispatcher: Dispatcher, telemetry: Telemetry, settings: Settings,
                 admission: Admission, metrics: Metrics | None = None, leases: Any = None,
                 tracing: Any = None, family: Any = None, config: Any = None, identities: Any = None) -> None:
        self.core = core
        # Platform tokens' side work (meshfast.admin.issuers.Identities): an early key set fetch,
        # just-in-time provisioning.
        self.identities = identities
        # Data protection's detection model (meshfast.dlp_model), when one is configured.
        self.dlp_model = DetectionModel(settings.dlp_model_url, settings.dlp_model_timeout_s,
                                        settings.dlp_model_max_bytes) if settings.dlp_model_url else None
        # The worker's ConfigFeed: ``behind()`` and ``reach(seq, timeout_s)`` (see caught_up).
        self._config = config
        # OpenTelemetry (meshfast.otel) when configured: a span per authenticated request, by
        # request id until its row is recorded; ``family(provider_id)`` names its provider's family.
        self.tracing = tracing
        self._family = family
        self._spans: dict[str, tuple[Any, int, int]] = {}
        # In a cluster: asks the database for a budget slice when the core wants one.
        self.leases = leases
        self.metrics = metrics
        self.admission = admission
        self.dispatcher = dispatcher
        self.telemetry = telemetry
        self.settings = settings
        # Schema drift: request fields an entry codec could not classify, by format and path.
        self.unclassified: collections.Counter[tuple[str, str]] = collections.Counter()

    # --- entry --------------------------------------------------------------------------

    async def caught_up(self) -> bool:
        """Before a refusal the configuration decides (an unknown key, model or grant): when this
        instance knows of a write this worker has not loaded yet, wait for it (up to
        CONFIG_CATCH_UP_S) and say so, so the caller decides again. A caller that gets a key or a
        grant from one worker is never refused by another for the next moments."""
        seq = self._config.behind() if self._config is not None else 0
        if not seq:
            return False
        return bool(await self._config.reach(seq, CONFIG_CATCH_UP_S))

    async def _token_refused(self, authorization: str | None, x_api_key: str | None, x_goog_api_key: str | None,
                             query: str | None, now_ms: int) -> Any:
        """A platform token the core refused: a key it does not know asks for an early fetch of
        its issuer's set (the caller's next try may pass); a person unknown to meshfast whose
        issuer provisions just in time is created from the token's claims, once this worker has
        them the call goes on (the principal, else None)."""
        refusal = self.core.token_refusal(authorization, x_api_key, x_goog_api_key, query, now_ms)
        if refusal is None:
            return None
        code, issuer, provision = refusal
        if code == "unknown_key" and issuer is not None:
            self.identities.ask(issuer)
        elif code == "unknown_principal" and provision is not None:
            try:
                seq = await self.identities.provision(provision)
            except Exception:  # noqa: BLE001 - the database is away: the 401 stands
                log.warning("just-in-time provisioning failed", exc_info=True)
                return None
            if seq is not None and self._config is not None:
                await self._config.reach(seq, CONFIG_CATCH_UP_S)
            elif not await self.caught_up():
                return None
            return self.core.authenticate(authorization, x_api_key, x_goog_api_key, query, now_ms)
        return None

    async def handle(self, scope: Any, proto: Any, route: Route, read_body: Any, model: str | None = None,
                     stream: bool | None = None, busy: Any = None) -> None:
        """One data-plane POST: a Mesh route (``proxy``, ``embeddings``, ``generate``) or a standard
        one (its wire format; ``model`` and ``stream`` when the path names them, as Gemini's).
        Errors in the route's own shape; exactly one row.

        The key is checked from the headers first: a request without a valid key is refused before
        its body is read and is never counted against the worker's request limit (``busy()``, true
        when the worker is past it), so stalled or huge unauthenticated bodies cost nothing."""
        started = time.perf_counter()
        now_ms = time.time_ns() // 1_000_000
        headers = scope.headers
        authorization, x_api_key = _header(headers, "authorization"), _header(headers, "x-api-key")
        x_goog_api_key, query = _header(headers, "x-goog-api-key"), scope.query_string
        body = b""
        received = started
        cache_shaping = True
        call_tags: dict[str, str] | None = None
        principal = self.core.authenticate(authorization, x_api_key, x_goog_api_key, query, now_ms)
        if principal is None and mesh_key_shaped(authorization, x_api_key, x_goog_api_key, query) \
                and await self.caught_up():
            principal = self.core.authenticate(authorization, x_api_key, x_goog_api_key, query, now_ms)
        elif principal is None and self.identities is not None:
            principal = await self._token_refused(authorization, x_api_key, x_goog_api_key, query, now_ms)
        close = False
        if principal is None:
            # NOTE: a small body is drained (briefly) so the connection stays usable for the
            # caller's next, possibly pipelined, request; a large, chunked or stalled one is never
            # read: the 401 then closes the connection.
            close = not await read_body.drain(scope, proto)
        else:
            # NOTE: the limit is checked after authentication, so bad keys are always 401 (never
            # throttled into another status) and cost no slot.
            failure: errors.MeshfastError | None = errors.ServerBusy(retry_after_s=1) if busy and busy() else None
            # NOTE: the tags first: a call refused for another reason still lands in its workflow's rows.
            tag_header = _caller_header(headers, "x-meshfast-tags")
            if tag_header is not None:
                try:
                    call_tags = tags.parse(tag_header, self.settings.tag_keys) or None
                except errors.InvalidTags as exc:
                    failure = failure or exc
            cache = _caller_header(headers, "x-meshfast-cache")
            if cache is not None and failure is None:
                # Prompt-cache shaping is on unless the caller turns it off for this call.
                setting = cache.strip().lower()
                if setting not in ("on", "off"):
                    failure = errors.InvalidRequest("X-Meshfast-Cache must be on or off")
                cache_shaping = setting != "off"
            if failure is None:
                try:
                    body = await read_body(scope, proto, self.settings.max_body_bytes)
                    received = time.perf_counter()
                except (errors.PayloadTooLarge, errors.RequestTimeout, errors.ClientDisconnected,
                        errors.InvalidRequest) as exc:
                    failure = exc
            if failure is not None:
                self._refuse_unread(scope, proto, route, model, failure, principal, started, now_ms, call_tags)
                return
        workflow = call_tags.get("workflow") if call_tags else None
        dlp_found: list[tuple[str, str]] | None = None
        # NOTE: with a detection model configured and wanted, the first decision runs as if it had
        # not answered: only a call refused for that alone (authenticated, granted, within every
        # cap, covered by a policy that wants the model; nothing reserved yet) is sent to it.
        dlp_failed = self.dlp_model is not None and principal is not None and self.core.dlp_wants_model
        p = self.core.prepare(route, authorization, x_api_key, x_goog_api_key, query, body, len(body), now_ms,
                              model, stream, cache_shaping, workflow, dlp_found, dlp_failed)
        if principal is not None and p.status in _CONFIG_REFUSALS and await self.caught_up():
            dlp_failed = dlp_failed or (self.dlp_model is not None and self.core.dlp_wants_model)
            p = self.core.prepare(route, authorization, x_api_key, x_goog_api_key, query, body, len(body), now_ms,
                                  model, stream, cache_shaping, workflow, dlp_found, dlp_failed)
        if self.dlp_model is not None and dlp_found is None and p.dlp_needs_model:
            dlp_found, dlp_failed = await self.dlp_model.find(body)
            p = self.core.prepare(route, authorization, x_api_key, x_goog_api_key, query, body, len(body), now_ms,
                                  model, stream, cache_shaping, workflow, dlp_found, dlp_failed)
        if self.leases is not None and p.status:
            # A cluster member holds only slices of each cap: out of room, it asks for another
            # (one round trip, rare far from a cap) and decides again.
            # NOTE: a call may want up to one slice per cap it meets (budget, rules, hourly counts).
            for _ in range(8):
                wanted = p.lease_wanted
                if wanted is None or p.principal_id is None or p.model_id is None:
                    break
                granted = await self.leases.acquire(wanted, p.principal_id, p.model_id, p.provider_id)
                if granted is None:
                    self._refuse_unread(scope, proto, route, model, errors.ServerBusy(retry_after_s=1), principal,
                                        started, now_ms, call_tags)
                    return
                if not granted:
                    break
                p = self.core.prepare(route, authorization, x_api_key, x_goog_api_key, query, body, len(body),
                                      now_ms, model, stream, cache_shaping, workflow, dlp_found, dlp_failed)
        user_agent = _header(headers, "user-agent")
        source_ip = client_ip(scope)
        mesh = route in _MESH
        (request_id, status, key_id, principal_id, provider_id, model_id, model_name, requested_model, deny_reason,
         business_unit, manager_id, tier, would_deny, model_tags, principal_kind, token_issuer, token_subject, dlp,
         dlp_action) = p.row_head
        row = Row(
            request_id=request_id, created_ms=now_ms, route=route, outcome="denied", status_code=status,
            mesh_key_id=key_id, user_id=principal_id, provider_id=provider_id, model_id=model_id,
            model_name=model_name, requested_model=requested_model, deny_reason=deny_reason,
            source_ip=source_ip, user_agent=user_agent, business_unit=business_unit, manager_id=manager_id,
            tier=tier, would_deny=would_deny, tags=model_tags, principal_kind=principal_kind,
            token_issuer=token_issuer, token_subject=token_subject, call_tags=call_tags, dlp=dlp,
            dlp_action=dlp_action,
        )
        if self.tracing is not None and principal is not None:
            # NOTE: an unknown key costs no span (unauthenticated work must cost almost nothing).
            self._trace_start(p, row, headers, route, now_ms, received - started)
        governed = _status_headers(p)
        if status:
            extra = governed
            if p.retry_after_s:
                extra.append(("retry-after", str(p.retry_after_s)))
            if p.should_retry is False:
                extra.append(("x-should-retry", "false"))
            if close:
                extra.append(("connection", "close"))
            # NOTE: the row first, then the answer: a worker killed in between loses no row of an
            # answer its caller received (here and on every path below).
            row.latency_ms = self._elapsed_ms(started)
            self._events(p, row)
            self._record(row, p.log_requests)
            self._respond(proto, status, request_id, p.body, extra)
            return
        if not mesh:
            self._note_unclassified(route, p.unknown_fields)
        try:
            await self.admission.admit(p)
        except errors.MeshfastError as exc:
            extra = [*governed, ("retry-after", str(exc.retry_after_s or 1))]
            row.status_code, row.deny_reason = exc.status, exc.code
            row.latency_ms = self._elapsed_ms(started)
            p.settle(0)
            self._events(p, row)
            self._record(row, p.log_requests)
            self._respond(proto, exc.status, p.request_id, self._error_body(route, exc), extra)
            return
        row.deny_reason = None
        metrics = self.metrics
        admitted = time.perf_counter()
        if self.tracing is not None:
            self._trace_event(p.request_id, "meshfast.admitted", admitted - started)
        if metrics is not None:
            metrics.phase("receive", int((received - started) * 1e9))
            metrics.phase("gateway", int((admitted - received) * 1e9))
        held = _Held(proto)
        try:
            if route == "proxy":
                await self._proxy(p, held, row, started, body, governed)
            elif route == "embeddings":
                await self._embeddings(p, held, row, started, governed)
            elif route == "generate":
                await self._generate(p, held, row, started, governed)
            elif route == "openai_embeddings":
                await self._openai_embeddings(p, held, row, body, governed)
            else:
                await self._entry(p, held, row, started, route, body, governed)
        finally:
            try:
                if metrics is not None:
                    metrics.phase("upstream", int((time.perf_counter() - admitted) * 1e9))
                self.admission.release(p)
                try:
                    # Turns the budget reservation into the actual cost (0 when the call failed).
                    p.settle(row.input_cost_nano + row.output_cost_nano, row.tokens_in + row.tokens_out)
                finally:
                    # NOTE: a settle that fails (a full counter table) costs neither the row nor the answer.
                    row.latency_ms = self._elapsed_ms(started)
                    self._events(p, row)
                    self._record(row, p.log_requests)
            finally:
                # Only now may the caller see the end of the answer.
                # NOTE: a caller already gone must not mask the route's own exception (a cancellation).
                with contextlib.suppress(Exception):
                    await held.release()

    @staticmethod
    def _error_body(route: str, exc: errors.MeshfastError) -> bytes:
        return exc.body() if route in _MESH else entry_error(_shape(route), exc.status, exc.code)

    # --- routes -------------------------------------------------------------------------

    async def _send(self, p: Any, proto: Any, row: Row) -> UpstreamResponse | None:
        """Send upstream with retries and one failover; on final failure answer 502 and fill the row."""
        try:
            return await self._dispatch(p, row)
        except UpstreamError as exc:
            self._upstream_failed(p, proto, row, exc)
            return None

    async def _dispatch(self, p: Any, row: Row) -> UpstreamResponse:
        """Send with the deployment's retries; after a final transport failure (no HTTP answer) or
        503, once more to the model's next deployment, whose provider the row then names."""
        try:
            return await self._send_call(p)
        except UpstreamError as exc:
            if exc.status not in (None, 503) or not p.failover():
                raise
            log.info("request %s: failing over to provider %s (%s)", p.request_id, p.provider_id,
                     exc.status or "no answer")
            try:
                await self.admission.readmit(p)
            except errors.MeshfastError:
                # The next provider stayed at its limits for the whole wait: the first answer stands.
                raise exc from None
        row.provider_id = p.provider_id
        return await self._send_call(p)

    def _send_call(self, p: Any) -> Any:
        """The dispatcher's send of the upstream call in force (with the request's trace context
        when it is traced)."""
        method, url, headers, body, local, attempts, backoff_ms, provider = p.upstream_call
        return self.dispatcher.send(method, url, self._traced(p, headers), body, local=local, attempts=attempts,
                                    backoff_ms=backoff_ms, provider=provider)

    def _upstream_failed(self, p: Any, proto: Any, row: Row, exc: UpstreamError, detail: str | None = None) -> None:
        payload: dict[str, Any] = {"error": errors.UpstreamUnavailable.code}
        if exc.status is not None:
            payload["provider_status"] = exc.status
            payload["provider_message"] = exc.message
        elif detail:
            payload["detail"] = detail
        self._respond(proto, errors.UpstreamUnavailable.status, p.request_id, _json.encode(payload) + b"\n")
        row.outcome = "upstream_error"
        row.status_code = exc.status if exc.status is not None else 502

    async def _proxy(self, p: Any, proto: Any, row: Row, started: float, request_body: bytes,
                     governed: list[tuple[str, str]]) -> None:
        response = await self._send(p, proto, row)
        if response is None:
            return
        # The core frames, translates and accounts for the answer from here on (one call per read).
        exchange = p.exchange()
        response.adopt(exchange)
        transport = proto.response_stream(200, [
            ("content-type", NDJSON), ("x-request-id", p.request_id), ("cache-control", "no-cache"), *governed,
        ])
        incomplete, client_gone, cancelled, tail = await self._pump(response, exchange, transport, row, started)
        final = self._settle_exchange(exchange, row, incomplete, client_gone, request_body)[0]
        row.status_code = 200
        row.outcome = "upstream_error" if incomplete else "success"
        if cancelled:
            raise asyncio.CancelledError
        if not client_gone:
            proto.send_last(tail + final)

    async def _pump(self, response: UpstreamResponse, exchange: Any, transport: Any, row: Row,
                    started: float) -> tuple[bool, bool, bool, bytes]:
        """The one stream pump of both chat routes: the upstream's answer, framed and translated
        by ``exchange`` (adopted by ``response``), to the caller's ``transport`` (None: a whole
        answer, which the exchange gives at its end). Returns ``(incomplete, client_gone,
        cancelled, tail)``: the upstream broke off (or timed out), the caller left, the call was
        cut at the drain bound (the caller charges, records, then re-raises), and the bytes that
        came with the stream's end signal, which leave with the exchange's last bytes in one write.
        The connection is pooled after an answer that ended (its last framing drains in the
        background), closed otherwise."""
        incomplete = client_gone = ended = cancelled = False
        tail = b""
        try:
            while True:
                try:
                    # NOTE: the dispatcher's idle timeout is the stream's idle timeout.
                    out = await response.read_chunk()
                except (TimeoutError, OSError):
                    incomplete = True
                    break
                if not out:
                    # The body's end or the stream's end signal (a body cut short raises above).
                    ended = True
                    break
                if row.ttfb_ms is None:
                    row.ttfb_ms = self._elapsed_ms(started)
                if exchange.ended:
                    tail = out
                    ended = True
                    break
                if transport is not None:
                    try:
                        await transport.send_bytes(out)
                    except Exception:
                        client_gone = True
                        break
        except asyncio.CancelledError:
            incomplete = cancelled = True
        finally:
            if ended:
                response.release()
            else:
                response.close()
        return incomplete, client_gone, cancelled, tail

    @staticmethod
    def _settle_exchange(exchange: Any, row: Row, incomplete: bool, client_gone: bool,
                         request_body: bytes) -> tuple[bytes, str | None]:
        """Ends the exchange (usage as reported or estimated, priced at the call's rates) into the
        row; returns the caller's last bytes and, for an entry stream that broke, its error."""
        (final, row.tokens_in, row.tokens_out, row.cache_read_tokens, cache_write, row.cache_write_1h_tokens,
         row.input_cost_nano, row.output_cost_nano, estimated, row.web_searches, tools,
         error) = exchange.finish(incomplete, client_gone, request_body)
        # The row counts five-minute and one-hour cache writes together (they are priced apart).
        row.cache_write_tokens = cache_write + row.cache_write_1h_tokens
        if estimated:
            row.usage_estimated = True
        if tools:
            row.tools_invoked = tools
        return final, error

    def _charge(self, p: Any, row: Row, tokens_in: int, tokens_out: int, seconds: float = 0.0,
                web_searches: int = 0, cache_read: int = 0, cache_write: int = 0, cache_write_1h: int = 0) -> None:
        """Price the call into the row (each token class at its price; ``tokens_in`` excludes
        cached tokens, ``cache_write`` the one-hour writes, priced as ``cache_write_1h``); `handle` settles the
        reservation with it."""
        input_nano, output_nano = p.price(tokens_in, tokens_out, seconds, web_searches, cache_read, cache_write,
                                          cache_write_1h)
        row.web_searches = web_searches
        row.tokens_in, row.tokens_out = tokens_in, tokens_out
        row.input_cost_nano, row.output_cost_nano = input_nano, output_nano

    async def _read_all(self, response: UpstreamResponse) -> bytes:
        async with asyncio.timeout(self.settings.stream_idle_timeout_s):
            data = await response.read(MAX_UPSTREAM_BODY)
        if len(data) > MAX_UPSTREAM_BODY:
            raise UpstreamError(None, "upstream answer too large")
        return data

    async def _fetch(self, p: Any, proto: Any, row: Row) -> tuple[int, bytes] | None:
        """Send and read the whole (non-streamed) answer; on failure answer 502 and return None."""
        response = await self._send(p, proto, row)
        if response is None:
            return None
        try:
            return response.status, await self._read_all(response)
        except (UpstreamError, TimeoutError, OSError) as exc:
            exc.__traceback__ = None
            self._upstream_failed(p, proto, row, UpstreamError(None, str(exc)), "upstream answer unreadable")
            return None
        finally:
            response.release()

    async def _embeddings(self, p: Any, proto: Any, row: Row, started: float,
                          governed: list[tuple[str, str]]) -> None:
        fetched = await self._fetch(p, proto, row)
        if fetched is None:
            return
        status, data = fetched
        try:
            vector_json, tokens_in = p.extract_embedding(data)
        except UpstreamBodyError as exc:
            self._upstream_failed(p, proto, row, UpstreamError(status, str(exc)))
            return
        self._charge(p, row, tokens_in, 0)
        body = (b'{"id":"' + p.request_id.encode() + b'","model":' + _json.encode(p.model_name)
                + b',"embedding":' + vector_json + b',"usage":{"input_tokens":' + str(tokens_in).encode() + b"}}\n")
        self._respond(proto, 200, p.request_id, body, governed)
        row.outcome, row.status_code = "success", 200

    async def _generate(self, p: Any, proto: Any, row: Row, started: float,
                        governed: list[tuple[str, str]]) -> None:
        fetched = await self._fetch(p, proto, row)
        if fetched is None:
            return
        _, data = fetched
        try:
            if p.generation_mode == "async_poll":
                outputs, seconds, tokens_in, tokens_out = await self._poll_job(p, data)
            else:
                media, seconds, _, _, tokens_in, tokens_out = p.extract_generation(data)
                outputs = [_classify(item) for item in media]
        except UpstreamError as exc:
            self._upstream_failed(p, proto, row, exc, exc.message)
            return
        except UpstreamBodyError as exc:
            self._upstream_failed(p, proto, row, UpstreamError(None, str(exc)), str(exc))
            return
        self._charge(p, row, tokens_in, tokens_out, seconds)
        usage: dict[str, Any] = {"input_tokens": tokens_in, "output_tokens": tokens_out}
        if seconds > 0:
            usage["seconds"] = seconds
        rendered = [{"type": kind, "data": value} for kind, value in outputs]
        body = _json.encode({"id": p.request_id, "model": p.model_name, "media_type": p.output_media_type,
                             "output": rendered[0], "outputs": rendered, "usage": usage}) + b"\n"
        if seconds:
            row.generated_seconds = seconds
        self._respond(proto, 200, p.request_id, body, governed)
        row.outcome, row.status_code = "success", 200

    async def _poll_job(self, p: Any, submitted: bytes) -> tuple[list[tuple[str, str]], float, int, int]:
        _, _, job_id, _, tokens_in, tokens_out = p.extract_generation(submitted)
        if not job_id:
            raise UpstreamBodyError("the submit answer carries no job id")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + p.max_wait_s
        status_url = p.render_status_url(job_id)
        success = {v.lower() for v in p.success_values}
        failure = {v.lower() for v in p.failure_values}
        seconds = 0.0
        while True:
            if loop.time() >= deadline:
                raise UpstreamError(None, "generation job did not finish in time")
            await asyncio.sleep(p.poll_interval_ms / 1000)
            try:
                response = await self.dispatcher.send("GET", status_url, p.headers, b"", local=p.local,
                                                      attempts=1, backoff_ms=p.backoff_ms, provider=p.provider_id)
                status_body = await response.read(256 * 1024)
                response.release()
            except (UpstreamError, OSError, TimeoutError):
                continue  # poll errors are retried until the deadline
            try:
                _, seconds, _, state, _, _ = p.extract_generation(status_body)
            except UpstreamBodyError:
                continue
            state = (state or "").lower()
            if state in failure:
                raise UpstreamError(None, f"generation job {job_id} failed")
            if state in success:
                break
        response = await self.dispatcher.send("GET", p.render_content_url(job_id), p.headers, b"",
                                              local=p.local, attempts=p.attempts, backoff_ms=p.backoff_ms,
                                              provider=p.provider_id)
        content = await self._read_all(response)
        response.release()
        if not content:
            raise UpstreamError(None, "generation job returned no content")
        return [("base64", base64.b64encode(content).decode())], seconds, tokens_in, tokens_out

    # --- standard entry routes -----------------------------------------------------------

    async def _openai_embeddings(self, p: Any, proto: Any, row: Row, request_body: bytes,
                                 governed: list[tuple[str, str]]) -> None:
        """One upstream call per input (a few at a time), answered as OpenAI's list."""
        gate = asyncio.Semaphore(EMBEDDING_PARALLEL)

        async def one(body: bytes) -> tuple[bytes, int]:
            async with gate:
                response = await self.dispatcher.send(p.method, p.url, self._traced(p, p.headers), body,
                                                      local=p.local, attempts=p.attempts, backoff_ms=p.backoff_ms,
                                                      provider=p.provider_id)
                try:
                    data = await self._read_all(response)
                finally:
                    response.release()
            return p.extract_embedding(data)

        try:
            results = await asyncio.gather(*(one(b) for b in p.embedding_bodies))
        except UpstreamError as exc:
            self._entry_failed(proto, "openai_chat", p, row, exc)
            return
        except (UpstreamBodyError, TimeoutError, OSError) as exc:
            self._entry_failed(proto, "openai_chat", p, row, UpstreamError(None, str(exc)))
            return
        options = _EmbeddingOptions.of(request_body)
        as_base64 = options.encoding_format == "base64"
        data = []
        for index, (vector_json, _) in enumerate(results):
            embedding: Any = msgspec.Raw(vector_json)
            if as_base64:
                floats = array.array("f", msgspec.json.decode(vector_json, type=list[float]))
                if sys.byteorder != "little":
                    floats.byteswap()
                embedding = base64.b64encode(floats.tobytes()).decode()
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        tokens_in = sum(tokens for _, tokens in results)
        if tokens_in == 0:
            # NOTE: only when the upstream reported no usage: tokenize the inputs.
            inputs = [options.input] if isinstance(options.input, str) else options.input
            tokens_in = sum(self.core.estimate_tokens(text) for text in inputs)
            row.usage_estimated = True
        self._charge(p, row, tokens_in, 0)
        body = _json.encode({"object": "list", "data": data, "model": p.model_name,
                             "usage": {"prompt_tokens": tokens_in, "total_tokens": tokens_in}}) + b"\n"
        self._respond(proto, 200, p.request_id, body, governed)
        row.outcome, row.status_code = "success", 200

    def _refuse_unread(self, scope: Any, proto: Any, route: str, model: str | None, error: errors.MeshfastError,
                       principal: Any, started: float, now_ms: int, call_tags: dict[str, str] | None = None) -> None:
        """An authenticated POST refused before its body was whole (the worker is past its limit,
        the body is too large, too slow, malformed in its framing, or its caller left): the answer
        in the route's shape (none when the caller left) and its row, which names the caller."""
        rid = request_id()
        self._record(Row(
            request_id=rid, created_ms=now_ms, route=route, outcome="denied", status_code=error.status,
            deny_reason=error.code, latency_ms=self._elapsed_ms(started), mesh_key_id=principal.key_id,
            user_id=principal.id, principal_kind=principal.kind, token_issuer=principal.token_issuer,
            token_subject=principal.token_subject, call_tags=call_tags, source_ip=client_ip(scope),
            user_agent=_header(scope.headers, "user-agent"),
            requested_model=_model_param(scope.query_string) if route in _MESH else model))
        if not isinstance(error, errors.ClientDisconnected):
            extra = [("retry-after", str(error.retry_after_s))] if error.retry_after_s else None
            with contextlib.suppress(Exception):
                self._respond(proto, error.status, rid, self._error_body(route, error), extra)

    @staticmethod
    def _events(p: Any, row: Row) -> None:
        """What the rules did (a pause begun, a notification due) rides on the row to the outbox."""
        events = p.events()
        if events:
            row.events = [RuleEvent(*event) for event in events]

    # --- tracing (meshfast.otel) ------------------------------------------------------------

    def _trace_start(self, p: Any, row: Row, headers: Any, route: str, now_ms: int, received_s: float) -> None:
        carrier = {name: value for name in ("traceparent", "tracestate") if (value := _header(headers, name))}
        start_ns = now_ms * 1_000_000
        span = self.tracing.start(carrier, route, p.model_name or p.requested_model or None, start_ns)
        self._spans[p.request_id] = (span, start_ns, p.max_tokens if p.status == 0 else 0)
        row.trace_id = self.tracing.trace_id(span)
        self.tracing.event(span, "meshfast.received", start_ns + int(received_s * 1e9))

    def _trace_event(self, request_id: str, name: str, since_start_s: float) -> None:
        entry = self._spans.get(request_id)
        if entry is not None:
            self.tracing.event(entry[0], name, entry[1] + int(since_start_s * 1e9))

    def _traced(self, p: Any, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The upstream request's ``headers``, with the request's trace context when it is traced."""
        entry = self._spans.get(p.request_id) if self.tracing is not None else None
        return headers if entry is None else [*headers, *self.tracing.inject(entry[0])]

    def _trace_end(self, row: Row) -> None:
        entry = self._spans.pop(row.request_id, None)
        if entry is None:
            return
        span, start_ns, max_tokens = entry
        if row.ttfb_ms is not None:
            self.tracing.event(span, "meshfast.first_byte", start_ns + row.ttfb_ms * 1_000_000)
        family = self._family(row.provider_id) if self._family is not None and row.provider_id else None
        try:
            self.tracing.finish(span, row, family, max_tokens, start_ns + row.latency_ms * 1_000_000)
        except Exception:  # a tracing fault never costs the row
            log.exception("request %s: ending its span failed", row.request_id)

    def _record(self, row: Row, log_requests: bool = True) -> None:
        """Counts the request in the metrics and, unless its provider opted out, writes its row."""
        if self.tracing is not None:
            self._trace_end(row)
        if log_requests:
            self.telemetry.record(row)
        if self.metrics is not None:
            # NOTE: after the row: a full counter table (fail closed) must not cost the row.
            with contextlib.suppress(ShmError):
                self.metrics.request(row.route, row.outcome, row.deny_reason, row.count)
                self.metrics.row(row)
                self.metrics.flush()

    def _note_unclassified(self, fmt: str, fields: list[str]) -> None:
        if fields and self.metrics is not None:
            self.metrics.unclassified(len(fields))
        for field in fields:
            key = (fmt, field)
            if key not in self.unclassified:
                log.warning("unclassified request field %r on %s (counted, not forwarded)", field, fmt)
            self.unclassified[key] += 1

    def _entry_failed(self, proto: Any, fmt: str, p: Any, row: Row, exc: UpstreamError) -> None:
        """The final upstream failure: 429 stays a 429 (with the provider's Retry-After),
        anything else is 502; both in the API's shape."""
        extra: list[tuple[str, str]] = []
        error: type[errors.MeshfastError] = errors.UpstreamUnavailable
        if exc.status == 429:
            error = errors.UpstreamRateLimited
            if exc.retry_after_s:
                extra.append(("retry-after", str(exc.retry_after_s)))
        detail = f"(provider status {exc.status}: {exc.message})" if exc.status is not None else None
        self._respond(proto, error.status, p.request_id, entry_error(fmt, error.status, error.code, detail), extra)
        row.outcome = "upstream_error"
        row.status_code = exc.status if exc.status is not None else 502

    async def _entry(self, p: Any, proto: Any, row: Row, started: float, fmt: str, request_body: bytes,
                     governed: list[tuple[str, str]]) -> None:
        declared = p.tools_declared
        if declared:
            row.tools_declared = [name for name, _ in declared]
            row.tools_declared_bytes = [size for _, size in declared]
        try:
            response = await self._dispatch(p, row)
        except UpstreamError as exc:
            self._entry_failed(proto, fmt, p, row, exc)
            return
        exchange = p.exchange()
        response.adopt(exchange)
        transport = None
        if p.client_stream:
            transport = proto.response_stream(200, [
                ("content-type", entry_stream_content_type(fmt)), ("x-request-id", p.request_id),
                ("cache-control", "no-cache"), *governed,
            ])
        cut_short, client_gone, cancelled, tail = await self._pump(response, exchange, transport, row, started)
        final, error = self._settle_exchange(exchange, row, cut_short, client_gone, request_body)
        broken = cut_short or error is not None
        if cancelled:
            row.status_code = 200 if transport is not None else 503
            row.outcome = "upstream_error"
            raise asyncio.CancelledError
        if transport is not None:
            if (tail or final) and not client_gone:
                proto.send_last(tail + final)
            row.status_code = 200
            row.outcome = "upstream_error" if broken else "success"
            return
        if broken:
            self._entry_failed(proto, fmt, p, row, UpstreamError(None, error or "upstream stream cut short"))
            return
        self._respond(proto, 200, p.request_id, final, governed)
        row.outcome, row.status_code = "success", 200

    # --- helpers ------------------------------------------------------------------------

    @staticmethod
    def _elapsed_ms(started: float) -> int:
        return int((time.perf_counter() - started) * 1000)

    @staticmethod
    def _respond(proto: Any, status: int, rid: str, body: bytes, extra: list[tuple[str, str]] | None = None) -> None:
        headers = [("content-type", JSON), ("x-request-id", rid)]
        if extra:
            headers.extend(extra)
        proto.response_bytes(status, headers, body)


# The standard routes whose body names the model, and the wire format each speaks.
ENTRY_ROUTES: dict[str, Route] = {
    "/v1/chat/completions": "openai_chat",
    "/v1/responses": "openai_responses",
    "/v1/messages": "anthropic",
    "/api/chat": "ollama",
}
_GEMINI_PREFIXES = ("/v1beta/models/", "/v1/models/")
_GEMINI_METHODS = {"generateContent": False, "streamGenerateContent": True}


_MESH = frozenset({"proxy", "embeddings", "generate"})
_MESH_KEY = re.compile(r"(?<![A-Za-z0-9_-])mesh_live_[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])")


# A caller's header that is there but is not text: what its parser then refuses.
_NOT_TEXT = "\x00"


def _caller_header(headers: Any, name: str) -> str | None:
    """A meshfast header a caller sent, as text; None when absent; ``_NOT_TEXT`` when present but
    not visible ASCII (Granian answers None for such a value, so presence is asked apart)."""
    try:
        value = headers.get(name)
    except (UnicodeDecodeError, ValueError):
        return _NOT_TEXT
    if value is None and name in headers:
        return _NOT_TEXT
    return value


def mesh_key_shaped(*sources: str | None) -> bool:
    """Whether a credential source holds something shaped like an issued key (a refused one
    may be one this worker has not loaded yet; anything else never will be)."""
    return any(source is not None and _MESH_KEY.search(source) is not None for source in sources)


def _shape(fmt: str) -> str:
    """The wire format whose error shape a route answers in."""
    return "openai_chat" if fmt == "openai_embeddings" else fmt


def gemini_call(path: str) -> tuple[str, bool] | None:
    """``(model, stream)`` of a Gemini ``models/{model}:generateContent`` (or
    ``:streamGenerateContent``) path under ``/v1beta`` or ``/v1``; None for any other path."""
    for prefix in _GEMINI_PREFIXES:
        if path.startswith(prefix):
            model, sep, method = path[len(prefix):].rpartition(":")
            if sep and model and method in _GEMINI_METHODS:
                from urllib.parse import unquote

                return unquote(model), _GEMINI_METHODS[method]
    return None


def ollama_tags(models_json: bytes) -> bytes:
    """Ollama's ``GET /api/tags`` from the ``/v1/models`` view of the same key."""
    listed = msgspec.json.decode(models_json)
    tags = []
    for entry in listed.get("data", ()):
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(entry.get("created", 0)))
        tags.append({"name": entry["id"], "model": entry["id"], "modified_at": created, "size": 0,
                     "digest": "", "details": {"format": "", "family": entry.get("owned_by", ""),
                                               "families": None, "parameter_size": "", "quantization_level": ""}})
    return _json.encode({"models": tags}) + b"\n"


def _status_headers(p: Any) -> list[tuple[str, str]]:
    """X-Meshfast-Limit/Utilization/Reset: the governing limit of this call, when one applies;
    X-Meshfast-Warning: a rule's warning."""
    headers = []
    if p.limit_id is not None:
        headers += [("x-meshfast-limit", p.limit_id), ("x-meshfast-utilization", f"{p.utilization:g}")]
        if p.reset_at:
            headers.append(("x-meshfast-reset", p.reset_at))
    warning = p.warning
    if warning is not None:
        headers.append(("x-meshfast-warning", _header_text(warning)))
    return headers


def _header_text(text: str) -> str:
    """A header value: printable ASCII only (other characters as \\uXXXX), one line."""
    return "".join(c if " " <= c <= "~" else f"\\u{ord(c):04x}" for c in text)


def _classify(item: str) -> tuple[str, str]:
    return ("url", item) if item.startswith(("http://", "https://")) else ("base64", item)


class _EmbeddingOptions(msgspec.Struct):
    input: str | list[str] = ""
    encoding_format: str | None = None

    @classmethod
    def of(cls, body: bytes) -> _EmbeddingOptions:
        try:
            return msgspec.json.decode(body, type=cls)
        except msgspec.MsgspecError:
            return cls()


def _model_param(query: str) -> str | None:
    from urllib.parse import parse_qs

    try:
        values = parse_qs(query or "").get("model")
    except ValueError:
        return None
    return values[0] if values else None
