"""Realtime sessions: ``GET /v1/realtime?model=NAME`` upgrades to a WebSocket speaking the OpenAI
Realtime protocol, relayed to the model's provider (issue "ecosystem", item 2).

Governance is the data plane's, applied per response. The upgrade is decided as a call would be
(the key or platform token, the grant, the model's policy window, the kill switch, the caller's
tags): refused, it is answered with the refusal's HTTP status and leaves a row. Then every response
(a client's ``response.create``, or one the provider starts itself under voice activity detection)
is a governed call of its own: decided and reserved against every cap before it is forwarded (its
worst case: its output limit plus the conversation's input so far and what was added since, priced
as the model is), admitted per provider, and settled at ``response.done`` with the usage the
provider reports, priced into a row of its own (route ``realtime``). So a crash loses at most the
response in flight, never a minute of spend. A response refused (a cap, a rule, the kill switch) is
never forwarded: the client gets the protocol's ``error`` event naming the refusal's code (and
``resume_at`` when there is one), then the session closes. The session has a row of its own (route
``realtime_session``): its opening was decided as a call and counts as one against hourly call
caps, and the row records the session's duration in ``latency_ms``.

NOTE: Granian's RSGI WebSocket transport sends its close frame without a status code, so the
reason a session ends travels in the ``error`` event just before the close (the close code the
client sees is 1005).

Data protection: a session that a data protection policy would cover is refused at its upgrade
(400 ``sensitive_content_blocked``): its audio cannot be scanned, so nothing of it leaves.

On SIGTERM, open sessions keep going for ``MESHFAST_REALTIME_DRAIN_S`` (default 300 s, at most
1,800) while the worker takes no new connections; then each gets an ``error`` event with code
``session_draining`` and is closed, so its client reconnects to another worker or instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, quote

import msgspec

from meshfast import errors, tags
from meshfast._core import redact_credentials
from meshfast.telemetry import Row

log = logging.getLogger(__name__)

# A response's rows, and the session's own (its opening, decided as a call; its duration).
ROUTE = "realtime"
SESSION_ROUTE = "realtime_session"
# The most input tokens a response's reservation assumes (the largest context windows).
MAX_INPUT_ESTIMATE = 2_000_000
# Base64 audio: 24 kHz 16-bit mono is 64,000 base64 characters a second, about 10 tokens.
AUDIO_B64_CHARS_PER_TOKEN = 6400
# The largest frame relayed either way.
MAX_FRAME_BYTES = 16 * 1024 * 1024
# Headers of the rendered upstream call that a WebSocket handshake does not take.
_HOP_HEADERS = frozenset({"content-type", "content-length", "accept", "accept-encoding", "host", "connection",
                          "transfer-encoding", "upgrade", "te"})


class _Event(msgspec.Struct):
    """The part of a protocol event the relay reads (the rest passes through untouched)."""

    type: str = ""


_event = msgspec.json.Decoder(_Event)


def _kind(data: str) -> str:
    try:
        return _event.decode(data).type
    except (msgspec.DecodeError, msgspec.ValidationError):
        return ""


def _limit(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value > 0:
        return value
    return None


class _Turn:
    """One governed response: its decision (and reservation) and its row."""

    __slots__ = ("p", "row", "started", "response_id", "admitted", "text", "audio_chars")

    def __init__(self, p: Any, row: Row) -> None:
        self.p, self.row, self.started = p, row, time.perf_counter()
        self.response_id: str | None = None
        self.admitted = False
        # What it carried to the client so far: charged when the response never ends.
        self.text: list[str] = []
        self.audio_chars = 0


class Session:
    """One relayed session; :meth:`run` returns when either side has gone."""

    def __init__(self, data: Any, scope: Any, proto: Any, sessions: set[Session]) -> None:
        self.data, self.scope, self.proto = data, scope, proto
        self.sessions = sessions
        headers = scope.headers
        self.authorization = headers.get("authorization")
        self.x_api_key = headers.get("x-api-key")
        self.query = scope.query_string
        self.model = (parse_qs(self.query).get("model") or [""])[0]
        self.user_agent = headers.get("user-agent")
        self.source_ip = _client_ip(scope)
        self.call_tags: dict[str, str] | None = None
        self.transport: Any = None
        self.upstream: Any = None
        self.upstream_url = ""
        self.upstream_headers: list[tuple[str, str]] = []
        self.model_id: str | None = None
        # What the next response's reservation assumes: the session's output limit as the provider
        # confirmed it (None: the model's maximum), the input the last response reported, what the
        # client added since, and the session's configuration (instructions, tools), all in tokens.
        self.max_output: int | None = None
        self.last_input = 0
        self.added = 0
        self.configured = 0
        self.pending: deque[_Turn] = deque()
        self.by_response: dict[str, _Turn] = {}
        self.closing: str | None = None
        # Which side ended the session ("client" or "upstream"), once one has.
        self.ended_by: str | None = None
        self.current: _Turn | None = None
        self.started_ms = time.time_ns() // 1_000_000
        self.started = time.perf_counter()
        self.first: Any = None

    # --- the decision ------------------------------------------------------------------

    def _body(self, output_tokens: int | None, input_tokens: int) -> bytes:
        """The call a decision prices: the model, an input of ``input_tokens`` (the core bounds
        text at 3 bytes a token) and an output limit (None: the model's own maximum)."""
        content = "x" * (3 * min(input_tokens, MAX_INPUT_ESTIMATE))
        call: dict[str, Any] = {"model": self.model, "stream": False,
                                "messages": [{"role": "user", "content": content}]}
        if output_tokens is not None:
            call["max_tokens"] = max(1, output_tokens)
        return json.dumps(call).encode()

    async def _decide(self, output_tokens: int | None, input_tokens: int) -> Any:
        """The data plane's decision for one response (or the session's upgrade), with the
        cluster's lease round trips when a cap wants a slice."""
        data = self.data
        body = self._body(output_tokens, input_tokens)
        workflow = self.call_tags.get("workflow") if self.call_tags else None

        def prepare() -> Any:
            return data.core.prepare("openai_chat", self.authorization, self.x_api_key, None, self.query, body,
                                     len(body), time.time_ns() // 1_000_000, None, False, False, workflow)

        p = prepare()
        if p.status in (401, 403, 404) and await data.caught_up():
            p = prepare()
        if p.status and data.leases is not None:
            for _ in range(8):
                wanted = p.lease_wanted
                if wanted is None or p.principal_id is None or p.model_id is None:
                    break
                granted = await data.leases.acquire(wanted, p.principal_id, p.model_id, p.provider_id)
                if not granted:
                    break
                p = prepare()
        return p

    def _row(self, p: Any, request_id: str | None = None) -> Row:
        return Row(
            request_id=request_id or p.request_id, created_ms=time.time_ns() // 1_000_000, route=ROUTE,
            outcome="denied" if p.status else "success", status_code=p.status or 200,
            mesh_key_id=p.key_id, user_id=p.principal_id, provider_id=p.provider_id, model_id=p.model_id,
            model_name=p.model_name, requested_model=self.model or None, deny_reason=p.deny_reason,
            source_ip=self.source_ip, user_agent=self.user_agent, business_unit=p.business_unit,
            manager_id=p.manager_id, tier=p.tier, would_deny=p.would_deny, tags=p.model_tags,
            principal_kind=p.principal_kind, token_issuer=p.token_issuer, token_subject=p.token_subject,
            call_tags=self.call_tags)

    def _reserve_input(self, extra: int = 0) -> int:
        return min(MAX_INPUT_ESTIMATE, max(self.last_input, self.configured) + self.added + extra)

    # --- the session ----------------------------------------------------------------------

    async def run(self) -> None:
        # NOTE: counted from the start: a stop that arrives while the upstream connects waits for it.
        self.sessions.add(self)
        try:
            await self._run()
        finally:
            self.sessions.discard(self)

    async def _run(self) -> None:
        data = self.data
        if self.data.core.authenticate(self.authorization, self.x_api_key, None, self.query,
                                       self.started_ms) is None and data.identities is not None:
            # A platform token this worker cannot place yet: an early key set fetch, or a person
            # provisioned just in time (as on the HTTP routes).
            await data._token_refused(self.authorization, self.x_api_key, None, self.query, self.started_ms)
        header = self.scope.headers.get("x-meshfast-tags")
        if header is not None:
            try:
                self.call_tags = tags.parse(header, data.settings.tag_keys) or None
            except errors.InvalidTags as exc:
                self._refuse_upgrade(None, exc)
                return
        if not self.model:
            self._refuse_upgrade(None, errors.InvalidRequest("give the model as ?model=NAME"))
            return
        p = await self._decide(1, 1)
        if p.status:
            self._refuse_upgrade(p, None)
            return
        if p.dlp_applies:
            # NOTE: fail closed: a session's audio cannot be scanned, so data protection cannot hold
            # for it; the caller uses the HTTP routes, where every text is protected.
            p.settle(0)
            self._refuse_upgrade(p, errors.SensitiveContentBlocked(
                "a data protection policy applies to this model for this caller; realtime sessions "
                "(audio) cannot be protected, so they are refused"))
            return
        # The upgrade is decided as a call (and counts as one against hourly call caps); nothing is
        # spent until a response.
        p.settle(0)
        self.first = p
        self.model_id = p.model_id
        url: str = p.url
        if not url.endswith("/chat/completions"):
            self._refuse_upgrade(p, errors.InvalidRequest(f"model {self.model} is not served over the OpenAI "
                                                          "Realtime protocol (an OpenAI-family provider)"))
            return
        try:
            resolved = json.loads(p.upstream_body)["model"]
        except (ValueError, KeyError, TypeError):
            resolved = self.model
        base = url[: -len("/chat/completions")] + "/realtime"
        scheme, _, rest = base.partition("://")
        self.upstream_url = ("wss" if scheme == "https" else "ws") + "://" + rest + "?model=" + quote(resolved, safe="")
        self.upstream_headers = [(k, v) for k, v in p.headers if k.lower() not in _HOP_HEADERS]
        try:
            from websockets.asyncio.client import connect

            self.upstream = await connect(
                self.upstream_url, additional_headers=self.upstream_headers, max_size=MAX_FRAME_BYTES,
                open_timeout=data.settings.upstream_connect_timeout_s, ping_interval=20, ping_timeout=20,
                user_agent_header=None, compression=None)
        except Exception as exc:  # noqa: BLE001 - a handshake refused, a connection failure, a timeout
            log.warning("realtime upstream for %s unavailable: %s", self.model, type(exc).__name__)
            self._refuse_upgrade(p, errors.UpstreamUnavailable())
            return
        try:
            self.transport = await self.proto.accept()
        except Exception:  # noqa: BLE001 - the client left during the handshake
            await self.upstream.close()
            self._record_session()
            return
        try:
            await self._relay()
        finally:
            await self._end()

    def _refuse_upgrade(self, p: Any, error: errors.MeshfastError | None) -> None:
        """A session refused before its upgrade: a row, then the HTTP status."""
        if p is not None:
            row = self._row(p)
            row.route = SESSION_ROUTE
            if error is not None:
                row.outcome, row.status_code, row.deny_reason = "denied", error.status, error.code
            status = row.status_code
        else:
            assert error is not None
            from meshfast._core import request_id

            status = error.status
            row = Row(request_id=request_id(), created_ms=self.started_ms, route=SESSION_ROUTE, outcome="denied",
                      status_code=status, deny_reason=error.code, requested_model=self.model or None,
                      source_ip=self.source_ip, user_agent=self.user_agent, call_tags=self.call_tags)
            # The row names the caller when the credential holds.
            principal = self.data.core.authenticate(self.authorization, self.x_api_key, None, self.query,
                                                    self.started_ms)
            if principal is not None:
                row.user_id, row.principal_kind, row.mesh_key_id = principal.id, principal.kind, principal.key_id
                row.token_issuer, row.token_subject = principal.token_issuer, principal.token_subject
        if row.status_code and row.status_code >= 400 and row.outcome != "denied":
            row.outcome = "denied"
        row.latency_ms = self._elapsed_ms()
        self.data._record(row, True if p is None else p.log_requests)
        self.proto.close(status)

    async def _relay(self) -> None:
        to_upstream = asyncio.create_task(self._client_to_upstream())
        to_client = asyncio.create_task(self._upstream_to_client())
        try:
            done, _ = await asyncio.wait({to_upstream, to_client}, return_when=asyncio.FIRST_COMPLETED)
            self.ended_by = "client" if to_upstream in done else "upstream"
        finally:
            for task in (to_upstream, to_client):
                task.cancel()
            for task in (to_upstream, to_client):
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                except Exception:
                    log.exception("realtime session for %s failed", self.model)

    async def _client_to_upstream(self) -> None:
        while self.closing is None:
            try:
                message = await self.transport.receive()
            except Exception:  # noqa: BLE001 - the client went away
                return
            if message.kind == 0:
                return
            data = message.data
            if isinstance(data, bytes):
                # The protocol is JSON text: a binary frame would pass governance by.
                await self._refuse_event("invalid_request", "events are JSON text frames")
                continue
            if len(data) > MAX_FRAME_BYTES:
                await self._refuse_event("invalid_request", f"an event is at most {MAX_FRAME_BYTES} bytes")
                continue
            kind = _kind(data)
            if kind == "response.create":
                if not await self._govern(data):
                    if self.closing is not None:
                        return
                    continue
            elif kind in ("session.update", "conversation.item.create", "input_audio_buffer.append"):
                self._note_input(kind, data)
            await self.upstream.send(data)

    def _note_input(self, kind: str, data: str) -> None:
        """What a client event adds to the next response's reservation."""
        try:
            event = json.loads(data)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if kind == "session.update" and isinstance(event.get("session"), dict):
            # Instructions and tools go with every response: the whole configuration, as text.
            # (The output limit is taken from the provider's session.updated, not from here.)
            self.configured = max(self.configured, 8 + math.ceil(len(data.encode()) / 3))
        elif kind == "input_audio_buffer.append":
            self.added += math.ceil(len(str(event.get("audio") or "")) / AUDIO_B64_CHARS_PER_TOKEN)
        else:
            # Text at 3 bytes a token (the core's own bound), audio as above, 8 tokens of framing.
            text = json.dumps(event.get("item") or {})
            self.added += 8 + math.ceil(len(text.encode()) / 3)

    async def _govern(self, data: str) -> bool:
        """A client's ``response.create``: decided and reserved before it is forwarded (its output
        limit, else the session's as the provider confirmed it, else the model's maximum). One response
        at a time (as the provider answers in a conversation): another is refused here, so every
        reservation has its response."""
        if self.pending or self.by_response:
            await self._refuse_event("conversation_already_has_active_response",
                                     "a response is in progress; wait for its response.done")
            return False
        output = self.max_output
        extra = 0
        try:
            event = json.loads(data)
            params = event.get("response") if isinstance(event, dict) else None
            if isinstance(params, dict):
                output = _output_limit(params, output)
                # The response's own instructions, tools and input items go upstream with it.
                extra = math.ceil(len(data.encode()) / 3)
        except ValueError:
            pass
        turn = await self._turn(output, extra)
        if turn is None:
            return False
        self.pending.append(turn)
        return True

    async def _turn(self, output_tokens: int | None, extra: int = 0) -> _Turn | None:
        """A governed response (decided, reserved, admitted), or None after telling the client why
        not (and closing the session when the refusal is a governance one)."""
        p = await self._decide(output_tokens, self._reserve_input(extra))
        row = self._row(p)
        if p.status:
            row.latency_ms = 0
            self.data._events(p, row)
            self.data._record(row, p.log_requests)
            await self._refuse_event(p.deny_reason or "denied", _message(p.body), _resume_at(p.body))
            await self._close("refused")
            return None
        try:
            await self.data.admission.admit(p)
        except asyncio.CancelledError:
            # The session ended while this response waited for a slot: its row, then on.
            p.settle(0)
            row.outcome, row.status_code, row.deny_reason = "denied", 499, "client_disconnected"
            self.data._events(p, row)
            self.data._record(row, p.log_requests)
            raise
        except errors.MeshfastError as exc:
            p.settle(0)
            row.outcome, row.status_code, row.deny_reason = "denied", exc.status, exc.code
            self.data._events(p, row)
            self.data._record(row, p.log_requests)
            await self._refuse_event(exc.code, exc.detail or "the gateway is busy; try again")
            return None
        turn = _Turn(p, row)
        turn.admitted = True
        return turn

    async def _upstream_to_client(self) -> None:
        try:
            async for data in self.upstream:
                if isinstance(data, bytes):
                    # The protocol is JSON text; a binary frame is not relayed (it could carry anything).
                    continue
                kind = _kind(data)
                if kind.endswith(".delta") and self.current is not None:
                    self._carried(self.current, kind, data)
                elif kind == "response.created":
                    if not await self._claim(data):
                        return
                elif kind == "response.done":
                    self._settle(data)
                elif kind in ("session.created", "session.updated"):
                    self._confirmed(data)
                elif kind == "error":
                    self._provider_refused()
                # NOTE: any event may quote the provider's key (an error, a failed response's
                # details, a transcription failure): every one is redacted.
                data = redact_credentials(data, self.upstream_headers, self.upstream_url)
                await self.transport.send_str(data)
        except Exception:  # noqa: BLE001 - either side went away
            return

    async def _claim(self, data: str) -> bool:
        """``response.created``: the oldest reservation is this response's; one the provider
        started on its own (voice activity) is decided now, and cancelled when refused."""
        response_id = _response_id(data)
        turn = self.pending.popleft() if self.pending else None
        if turn is None:
            turn = await self._turn(self.max_output)
            if turn is None:
                with contextlib.suppress(Exception):
                    await self.upstream.send(json.dumps({"type": "response.cancel", "response_id": response_id}))
                return False
        turn.response_id = response_id
        if response_id:
            self.by_response[response_id] = turn
        self.current = turn
        return True

    def _confirmed(self, data: str) -> None:
        """The provider's session: its output limit is what the next responses reserve."""
        try:
            session = json.loads(data).get("session")
        except (ValueError, AttributeError):
            return
        if isinstance(session, dict):
            self.max_output = _output_limit(session, None)

    def _provider_refused(self) -> None:
        """An ``error`` from the provider while a response it never started waits: that response
        is refused upstream (one response at a time, so it is the one pending); it settles at
        nothing and gives its slot back."""
        if not self.pending:
            return
        turn = self.pending.popleft()
        turn.row.outcome, turn.row.status_code = "upstream_error", 502
        self._finish(turn)

    @staticmethod
    def _carried(turn: _Turn, kind: str, data: str) -> None:
        """A delta relayed: kept (text) or counted (audio) for a response that never ends."""
        try:
            delta = json.loads(data).get("delta")
        except (ValueError, AttributeError):
            return
        if not isinstance(delta, str):
            return
        if "audio" in kind and "transcript" not in kind:
            turn.audio_chars += len(delta)
        else:
            turn.text.append(delta)

    def _settle(self, data: str) -> None:
        """``response.done``: the response's usage priced into its row, its reservation settled."""
        try:
            response = json.loads(data).get("response") or {}
        except (ValueError, AttributeError):
            response = {}
        response_id = response.get("id") if isinstance(response, dict) else None
        turn = self.by_response.pop(response_id, None) if response_id else None
        if turn is None and self.pending:
            turn = self.pending.popleft()
        if turn is None:
            return
        usage = response.get("usage") if isinstance(response, dict) else None
        usage = usage if isinstance(usage, dict) else {}
        tokens_in = _count(usage.get("input_tokens"))
        tokens_out = _count(usage.get("output_tokens"))
        details = usage.get("input_token_details")
        cached = min(tokens_in, _count(details.get("cached_tokens"))) if isinstance(details, dict) else 0
        row = turn.row
        self.data._charge(turn.p, row, tokens_in - cached, tokens_out, cache_read=cached)
        row.cache_read_tokens = cached
        row.usage_estimated = not usage
        status = response.get("status") if isinstance(response, dict) else None
        if status not in (None, "completed"):
            row.outcome = "success" if status in ("cancelled", "incomplete") else "error"
        self.last_input, self.added = tokens_in + tokens_out, 0
        if self.current is turn:
            self.current = None
        self._finish(turn)

    def _finish(self, turn: _Turn) -> None:
        row = turn.row
        row.latency_ms = int((time.perf_counter() - turn.started) * 1000)
        try:
            if turn.admitted:
                self.data.admission.release(turn.p)
            turn.p.settle(row.input_cost_nano + row.output_cost_nano, row.tokens_in + row.tokens_out)
        finally:
            self.data._events(turn.p, row)
            self.data._record(row, turn.p.log_requests)

    async def _refuse_event(self, code: str, message: str, resume_at: str | None = None) -> None:
        error: dict[str, Any] = {"type": "invalid_request_error", "code": code, "message": message}
        if resume_at:
            error["resume_at"] = resume_at
        with contextlib.suppress(Exception):
            await self.transport.send_str(json.dumps({"type": "error", "error": error}))

    async def _close(self, why: str) -> None:
        self.closing = why
        with contextlib.suppress(Exception):
            await self.upstream.close()

    async def drain(self) -> None:
        """The worker stops: the client is told to reconnect elsewhere, then the session closes."""
        await self._refuse_event("session_draining", "this gateway worker is shutting down: reconnect to continue")
        await self._close("draining")

    async def _end(self) -> None:
        """Either side gone: responses never finished settle at nothing (the provider reported no
        usage), the upstream closes, and the session's own row records its duration."""
        with contextlib.suppress(Exception):
            await self.upstream.close()
        open_turns = [*self.pending, *self.by_response.values()]
        if self.current is not None and self.current not in open_turns:
            open_turns.append(self.current)
        for turn in open_turns:
            # A response that never ended is charged what it carried (as a stream cut short is):
            # the input the reservation assumed and the output relayed, estimated.
            row = turn.row
            row.outcome = "upstream_error" if self.ended_by == "upstream" else "success"
            row.usage_estimated = True
            with contextlib.suppress(Exception):
                carried = "".join(turn.text)
                tokens_out = (self.data.core.estimate_tokens(carried) if carried else 0) + math.ceil(
                    turn.audio_chars / AUDIO_B64_CHARS_PER_TOKEN)
                tokens_in = self._reserve_input() if turn.response_id is not None else 0
                self.data._charge(turn.p, row, tokens_in, tokens_out)
            with contextlib.suppress(Exception):
                self._finish(turn)
        self.pending.clear()
        self.by_response.clear()
        self.current = None
        self._record_session()
        with contextlib.suppress(Exception):
            self.proto.close(1000)

    def _record_session(self) -> None:
        """The session's own row: its opening was decided (and counted) as a call; its duration."""
        if self.first is None:
            return
        row = self._row(self.first, self.first.request_id)
        row.route = SESSION_ROUTE
        row.deny_reason = self.closing if self.closing not in (None, "draining") else None
        row.latency_ms = self._elapsed_ms()
        self.data._record(row, self.first.log_requests)
        self.first = None

    def _elapsed_ms(self) -> int:
        return int((time.perf_counter() - self.started) * 1000)


def _output_limit(config: dict[str, Any], default: int | None) -> int | None:
    """An output limit as the protocol gives it (``max_output_tokens``, the beta's
    ``max_response_output_tokens``): the larger when both are there; ``"inf"`` or anything else
    that is not a positive integer means the model's own maximum (None)."""
    names = [n for n in ("max_output_tokens", "max_response_output_tokens") if n in config]
    if not names:
        return default
    limits = [_limit(config[n]) for n in names]
    if any(limit is None for limit in limits):
        return None
    return max(limit for limit in limits if limit is not None)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _response_id(data: str) -> str | None:
    try:
        response = json.loads(data).get("response")
    except (ValueError, AttributeError):
        return None
    value = response.get("id") if isinstance(response, dict) else None
    return value if isinstance(value, str) else None


def _refusal(body: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except (ValueError, TypeError):
        return {}
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return parsed["error"]
    return parsed if isinstance(parsed, dict) else {}


def _message(body: bytes) -> str:
    found = _refusal(body)
    message = found.get("message") or found.get("detail")
    return message if isinstance(message, str) else "refused"


def _resume_at(body: bytes) -> str | None:
    value = _refusal(body).get("resume_at")
    return value if isinstance(value, str) else None


def _client_ip(scope: Any) -> str | None:
    from meshfast.dataplane import client_ip

    return client_ip(scope)


async def serve(data: Any, scope: Any, proto: Any, sessions: set[Session]) -> None:
    """``GET /v1/realtime`` on the data plane ``data``."""
    await Session(data, scope, proto, sessions).run()


def drain_later(sessions: set[Session], after_s: float, loop: asyncio.AbstractEventLoop,
                spawn: Callable[[Any], Any]) -> None:
    """After ``after_s``, every session still open is told to reconnect and closed."""

    def cut() -> None:
        for session in list(sessions):
            spawn(session.drain())

    loop.call_later(after_s, cut)
