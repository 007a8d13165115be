"""Upstream dispatch: one pooled keep-alive client per worker, SSRF-safe, with retries.

Retries cover transport errors, 429 and 5xx, with exponential backoff and full jitter,
honouring ``Retry-After``, all within one total deadline. Redirects are never followed (an
upstream API has no business redirecting a POST, and a redirect is the classic SSRF path);
providers not marked local may not resolve to loopback, link-local or private addresses.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import socket
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

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


def _forbidden(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_reserved or ip.is_multicast


class GuardedResolver(AbstractResolver):
    """Resolves like the default resolver, then refuses private, loopback and link-local answers."""

    def __init__(self) -> None:
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        allowed = [r for r in results if not _forbidden(r["host"])]
        if not allowed:
            raise OSError(f"{host} resolves only to private, loopback or link-local addresses")
        return allowed

    async def close(self) -> None:
        await self._inner.close()


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
    import msgspec

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


class Dispatcher:
    def __init__(self, timeouts: Timeouts | None = None) -> None:
        self.timeouts = timeouts or Timeouts()
        self._local: aiohttp.ClientSession | None = None
        self._public: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        def session(resolver: AbstractResolver | None) -> aiohttp.ClientSession:
            connector = aiohttp.TCPConnector(
                limit=512, limit_per_host=256, keepalive_timeout=60, resolver=resolver, ttl_dns_cache=60,
            )
            return aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeouts.connect_s),
                auto_decompress=True,
                skip_auto_headers=("User-Agent",),
            )

        self._local = session(None)
        self._public = session(GuardedResolver())

    async def close(self) -> None:
        for s in (self._local, self._public):
            if s is not None:
                await s.close()

    async def send(self, method: str, url: str, headers: list[tuple[str, str]], body: bytes, *,
                   local: bool, attempts: int, backoff_ms: int, attempts_log: Attempts | None = None
                   ) -> aiohttp.ClientResponse:
        """Send with retries; returns a 2xx-3xx response whose body is still unread.

        Raises :class:`UpstreamError` when every attempt failed.
        """
        session = self._local if local else self._public
        assert session is not None, "Dispatcher.start() was not awaited"
        if not local:
            host = URL(url).host or ""
            try:
                if _forbidden(host):
                    raise UpstreamError(None, "upstream address is private, loopback or link-local")
            except ValueError:
                pass  # a name: checked by the resolver
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeouts.total_deadline_s
        base_s = max(backoff_ms, 1) / 1000
        last: UpstreamError | None = None
        for attempt in range(max(attempts, 1)):
            if attempts_log is not None:
                attempts_log.count += 1
            retry_after: float | None = None
            try:
                response = await session.request(
                    method, url, headers=headers, data=body, allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeouts.connect_s,
                                                  sock_read=self.timeouts.idle_s),
                )
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                last = UpstreamError(None, f"{type(exc).__name__}: {exc}".strip())
                if attempts_log is not None:
                    attempts_log.statuses.append(None)
            else:
                if response.status < 400:
                    return response
                try:
                    error_body = await response.content.read(ERROR_BODY_LIMIT)
                except (TimeoutError, aiohttp.ClientError):
                    error_body = b""
                retry_after = _retry_after_s(response.headers)
                response.release()
                if attempts_log is not None:
                    attempts_log.statuses.append(response.status)
                last = UpstreamError(response.status, _provider_message(error_body),
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
