"""Upstream dispatch: one pooled keep-alive client per worker, SSRF-safe, with retries.

Retries cover transport errors, 408, 429 and the transient 5xx, with exponential backoff and
full jitter, honouring ``Retry-After``, all within one total deadline. Only a 2xx with a body is
an answer: redirects are never followed (an upstream API has no business redirecting a POST, and
a redirect is the classic SSRF path) and, like a protocol switch nobody asked for, a 204/205 or any
other status, they are final upstream failures. Providers not marked local may not resolve to
non-public addresses (:func:`meshfast.http1.forbidden_address`).

Every failure message is built here, from what the provider said, and loses the provider's
credentials on the way (:func:`~meshfast._core.redact_credentials`, from the headers and URL of
the request that was sent): a provider that quotes the key it refused shows it to nobody.

The client is meshfast's own (:mod:`meshfast.http1`: asyncio protocols, framing in the Rust
core). ``MESHFAST_UPSTREAM_CLIENT=aiohttp`` selects aiohttp instead, behind the same
:class:`UpstreamResponse` interface, so the two can be measured side by side (bench/).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from meshfast import http1
from meshfast._core import redact_credentials
from meshfast.http1 import ForbiddenAddress

# NOTE: 529 is Anthropic's "overloaded"; 408 a server that gave up waiting for the request.
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504, 529})
# Upstream error bodies are read up to this many bytes for provider_message.
ERROR_BODY_LIMIT = 16 * 1024


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float = 5.0
    # NOTE: the per-read idle timeout on streams; Mesh used 300 s.
    idle_s: float = 300.0
    total_deadline_s: float = 600.0
    max_backoff_s: float = 8.0


class UpstreamError(Exception):
    """The final upstream failure after retries: an HTTP status, or a transport error (status None)."""

    def __init__(self, status: int | None, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s


@dataclass(slots=True)
class Attempts:
    """What the retry loop did, for the row and the metrics."""

    count: int = 0
    statuses: list[int | None] = field(default_factory=list)


def _retry_after_s(headers: Any) -> float | None:
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def is_answer(status: int) -> bool:
    """A status whose body is the answer: a 2xx with content. Anything else (1xx, 204, 205,
    3xx, 4xx, 5xx, nonsense) is an upstream failure."""
    return 200 <= status < 300 and status not in (204, 205)


def _status_message(status: int, headers: Any, body: bytes) -> str:
    """What the caller is told about a failed answer (before redaction)."""
    if 300 <= status < 400:
        location = headers.get("location")
        target = f" to {location}" if location else ""
        return f"upstream redirected ({status}){target}; redirects are not followed"
    if status < 200:
        return f"upstream answered {status} (an interim or protocol-switch status) instead of a response"
    if status in (204, 205):
        return f"upstream answered {status} with no content"
    return _provider_message(body) or f"upstream answered {status}"


def _provider_message(body: bytes) -> str:
    try:
        decoded = msgspec.json.decode(body)
        if isinstance(decoded, dict):
            error = decoded.get("error")
            if isinstance(error, dict) and isinstance(error.get("message"), str):
                return error["message"]
            if isinstance(error, str):
                return error
    except msgspec.DecodeError:
        pass
    return body.decode("utf-8", "replace").strip()


class UpstreamResponse(Protocol):
    """What :meth:`Dispatcher.send` returns, whichever client is in use."""

    @property
    def status(self) -> int: ...
    @property
    def headers(self) -> Any: ...
    async def read_chunk(self) -> bytes:
        """Body bytes as they arrive; ``b""`` at the end. Raises TimeoutError after the idle
        timeout and ConnectionError (an OSError) when the body is cut short."""
    async def read(self, limit: int) -> bytes:
        """The body, at most ``limit + 1`` bytes (so a caller can tell it was longer)."""
    def adopt(self, exchange: Any) -> None:
        """Hand the body to ``exchange`` (:class:`~meshfast._core.Exchange`): :meth:`read_chunk`
        then returns the caller's bytes, ``b""`` once the body or the exchange's stream ended."""
    def release(self) -> None:
        """Done: the connection is reused when the body was read to its end, else closed."""
    def close(self) -> None:
        """Abandon the exchange and its connection."""


class Dispatcher:
    def __init__(self, timeouts: Timeouts | None = None, client: str = "native", metrics: Any = None) -> None:
        if client not in ("native", "aiohttp"):
            raise ValueError(f"unknown upstream client {client!r} (native or aiohttp)")
        self.timeouts = timeouts or Timeouts()
        self.client = client
        # meshfast.metrics.Metrics, counting every attempt's result.
        self.metrics = metrics
        self._native: http1.Client | None = None
        self._aiohttp: Any = None

    async def start(self) -> None:
        if self.client == "native":
            self._native = http1.Client(self.timeouts.connect_s)
        else:
            from meshfast import aiohttp_client

            self._aiohttp = aiohttp_client.AiohttpClient(self.timeouts.connect_s)
            await self._aiohttp.start()

    async def close(self) -> None:
        if self._native is not None:
            await self._native.close()
        if self._aiohttp is not None:
            await self._aiohttp.close()

    async def _request(self, method: str, url: str, headers: list[tuple[str, str]], body: bytes,
                       local: bool) -> UpstreamResponse:
        if self._native is not None:
            return await self._native.request(method, url, headers, body, guard=not local,
                                              idle_timeout_s=self.timeouts.idle_s)
        assert self._aiohttp is not None, "Dispatcher.start() was not awaited"
        return await self._aiohttp.request(method, url, headers, body, guard=not local,
                                           idle_timeout_s=self.timeouts.idle_s)

    async def send(self, method: str, url: str, headers: list[tuple[str, str]], body: bytes, *,
                   local: bool, attempts: int, backoff_ms: int, attempts_log: Attempts | None = None,
                   provider: str | None = None) -> UpstreamResponse:
        """Send with retries; returns a 2xx response (with content) whose body is still unread.

        Raises :class:`UpstreamError` when every attempt failed; its message never carries the
        credentials this request sent.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeouts.total_deadline_s
        base_s = max(backoff_ms, 1) / 1000

        def failure(status: int | None, text: str, retry_after_s: int | None = None) -> UpstreamError:
            return UpstreamError(status, redact_credentials(text, headers, url) if text else text, retry_after_s)

        last: UpstreamError | None = None
        for attempt in range(max(attempts, 1)):
            if attempts_log is not None:
                attempts_log.count += 1
            retry_after: float | None = None
            try:
                response = await self._request(method, url, headers, body, local)
            except (ForbiddenAddress, ValueError) as exc:
                # A refused address, URL or header: the same on every attempt.
                if attempts_log is not None:
                    attempts_log.statuses.append(None)
                if self.metrics is not None:
                    self.metrics.attempt(None, attempt > 0, provider)
                raise failure(None, str(exc)) from None
            except (TimeoutError, OSError) as exc:
                exc.__traceback__ = None
                last = failure(None, f"{type(exc).__name__}: {exc}".strip())
                if attempts_log is not None:
                    attempts_log.statuses.append(None)
                if self.metrics is not None:
                    self.metrics.attempt(None, attempt > 0, provider)
            else:
                status = response.status
                if self.metrics is not None:
                    self.metrics.attempt(status, attempt > 0, provider)
                if is_answer(status):
                    return response
                error_body = b""
                if status >= 200:
                    try:
                        error_body = await response.read(ERROR_BODY_LIMIT)
                    except (TimeoutError, OSError):
                        pass
                    retry_after = _retry_after_s(response.headers)
                    response.release()
                else:
                    # A protocol switch: what follows is not HTTP; the connection goes.
                    response.close()
                if attempts_log is not None:
                    attempts_log.statuses.append(status)
                last = failure(status, _status_message(status, response.headers, error_body[:ERROR_BODY_LIMIT]),
                               None if retry_after is None else max(1, int(retry_after + 0.999)))
                if status not in RETRYABLE_STATUS:
                    raise last
            if attempt + 1 >= attempts:
                break
            # Full jitter over an exponential ceiling; Retry-After, when given, is a floor.
            delay = random.uniform(0, min(self.timeouts.max_backoff_s, base_s * (2 ** attempt)))
            if retry_after is not None:
                delay = max(delay, retry_after)
            if loop.time() + delay >= deadline:
                break
            await asyncio.sleep(delay)
        assert last is not None
        raise last
