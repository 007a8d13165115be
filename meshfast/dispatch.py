"""Upstream dispatch: one pooled keep-alive client per worker, SSRF-safe, with retries.

Retries cover transport errors, 429 and 5xx, with exponential backoff and full jitter,
honouring ``Retry-After``, all within one total deadline. Redirects are never followed (an
upstream API has no business redirecting a POST, and a redirect is the classic SSRF path);
providers not marked local may not resolve to loopback, link-local or private addresses.

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
from meshfast.http1 import ForbiddenAddress

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
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
                   local: bool, attempts: int, backoff_ms: int, attempts_log: Attempts | None = None
                   ) -> UpstreamResponse:
        """Send with retries; returns a 2xx-3xx response whose body is still unread.

        Raises :class:`UpstreamError` when every attempt failed.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeouts.total_deadline_s
        base_s = max(backoff_ms, 1) / 1000
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
                    self.metrics.attempt(None, attempt > 0)
                raise UpstreamError(None, str(exc)) from None
            except (TimeoutError, OSError) as exc:
                exc.__traceback__ = None
                last = UpstreamError(None, f"{type(exc).__name__}: {exc}".strip())
                if attempts_log is not None:
                    attempts_log.statuses.append(None)
                if self.metrics is not None:
                    self.metrics.attempt(None, attempt > 0)
            else:
                if self.metrics is not None:
                    self.metrics.attempt(response.status, attempt > 0)
                if response.status < 400:
                    return response
                try:
                    error_body = await response.read(ERROR_BODY_LIMIT)
                except (TimeoutError, OSError):
                    error_body = b""
                retry_after = _retry_after_s(response.headers)
                response.release()
                if attempts_log is not None:
                    attempts_log.statuses.append(response.status)
                last = UpstreamError(response.status, _provider_message(error_body[:ERROR_BODY_LIMIT]),
                                     None if retry_after is None else max(1, int(retry_after + 0.999)))
                if response.status not in RETRYABLE_STATUS:
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

