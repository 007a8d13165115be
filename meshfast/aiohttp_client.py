"""aiohttp behind the dispatcher's response interface (``MESHFAST_UPSTREAM_CLIENT=aiohttp``).

Kept so the choice of upstream client stays a measurement (bench/proxy_bench.py runs both);
the default is meshfast's own client in :mod:`meshfast.http1`.
"""

from __future__ import annotations

import socket
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from meshfast.http1 import ForbiddenAddress, forbidden_address


class GuardedResolver(AbstractResolver):
    """Resolves like the default resolver, then refuses non-public answers (see forbidden_address)."""

    def __init__(self) -> None:
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        allowed = [r for r in results if not forbidden_address(r["host"])]
        if not allowed:
            raise ForbiddenAddress(
                f"{host} resolves only to private, loopback, link-local or other non-public addresses"
            )
        return allowed

    async def close(self) -> None:
        await self._inner.close()


class _Response:
    __slots__ = ("_r", "_exchange")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._r = response
        self._exchange: Any = None

    def adopt(self, exchange: Any) -> None:
        """From now on :meth:`read_chunk` returns what ``exchange`` makes of the body (the
        caller's bytes), ``b""`` once the body or the exchange's stream ended."""
        self._exchange = exchange

    @property
    def status(self) -> int:
        return self._r.status

    @property
    def headers(self) -> Any:
        return self._r.headers

    async def read_chunk(self) -> bytes:
        exchange = self._exchange
        try:
            if exchange is None:
                return await self._r.content.readany()
            while not exchange.ended:
                data = await self._r.content.readany()
                if not data:
                    return b""
                out: bytes = exchange.feed(data)
                if out or exchange.ended:
                    return out
            return b""
        except aiohttp.ClientError as exc:
            # NOTE: aiohttp keeps the exception on the response; its traceback would pin the
            # caller's frame, and with it the client's stream, until the cyclic GC runs.
            exc.__traceback__ = None
            raise ConnectionError(f"{type(exc).__name__}: {exc}") from None

    async def read(self, limit: int) -> bytes:
        try:
            return await self._r.content.read(limit + 1)
        except aiohttp.ClientError as exc:
            exc.__traceback__ = None
            raise ConnectionError(f"{type(exc).__name__}: {exc}") from None

    def release(self) -> None:
        self._r.release()

    def close(self) -> None:
        self._r.close()


class AiohttpClient:
    def __init__(self, connect_timeout_s: float) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._sessions: dict[bool, aiohttp.ClientSession] = {}

    async def start(self) -> None:
        for guard in (False, True):
            connector = aiohttp.TCPConnector(limit=512, limit_per_host=256, keepalive_timeout=60,
                                             resolver=GuardedResolver() if guard else None, ttl_dns_cache=60)
            self._sessions[guard] = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s),
                auto_decompress=True, skip_auto_headers=("User-Agent",),
            )

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()

    async def request(self, method: str, url: str, headers: list[tuple[str, str]], body: bytes, *,
                      guard: bool, idle_timeout_s: float) -> _Response:
        if guard:
            host = URL(url).host or ""
            try:
                if forbidden_address(host):
                    raise ForbiddenAddress("upstream address is private, loopback, link-local or otherwise not public")
            except ValueError:
                pass  # a name: checked by the resolver
        try:
            response = await self._sessions[guard].request(
                method, url, headers=headers, data=body, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s,
                                              sock_read=idle_timeout_s),
            )
        except aiohttp.ClientError as exc:
            if isinstance(exc.__cause__, ForbiddenAddress):
                raise exc.__cause__ from None
            raise ConnectionError(f"{type(exc).__name__}: {exc}") from None
        return _Response(response)
