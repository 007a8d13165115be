"""meshfast's upstream HTTP/1.1 client: asyncio protocols over a keep-alive pool, framing in Rust.

Each connection is an :class:`asyncio.Protocol` whose ``data_received`` feeds the socket read to
the core's :class:`~meshfast._core.ResponseParser`, which returns decoded body bytes. There are
no stream readers, tasks or header objects per request: a streamed answer costs one parser call
per socket read and one future per wait. Requests are encoded by the core too, which refuses
any header that could split them.

Errors are the standard ones: :class:`ConnectionError` (reset, closed early, malformed
response), :class:`OSError` (connect failures, refused addresses) and :class:`TimeoutError`.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from meshfast._core import Exchange, ResponseParser, encode_request
from meshfast._core import forbidden_address as _forbidden_address

# Buffered body bytes above which the socket stops being read until the caller catches up.
HIGH_WATER = 1 << 20
# How long a released exchange may take to deliver the rest of its body (often just the last
# chunk's framing) before its connection is given up instead of pooled.
DRAIN_S = 5.0
# Idle connections kept per origin, and how long one may idle before it is dropped.
MAX_IDLE_PER_ORIGIN = 256
IDLE_TTL_S = 30.0
DNS_TTL_S = 60.0
_URL_CACHE_MAX = 1024


class ForbiddenAddress(OSError):
    """The upstream is (or resolves only to) an address a non-local provider may not reach."""


def forbidden_address(address: str) -> bool:
    """Loopback, private, shared, link-local and every other non-public address (SSRF targets):
    the core's list, IANA's special-purpose registries. Raises ValueError for a name."""
    return _forbidden_address(address)


class _Origin:
    __slots__ = ("scheme", "host", "port", "host_header", "target")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        default = (parts.scheme == "https" and self.port == 443) or (parts.scheme == "http" and self.port == 80)
        name = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = name if default else f"{name}:{self.port}"
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


class _Connection(asyncio.Protocol):
    """One keep-alive connection; carries one exchange at a time."""

    __slots__ = ("transport", "exchange", "closed", "idle_since", "key")

    def __init__(self, key: tuple[str, str, int, bool]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.exchange: Response | None = None
        self.closed = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None:
            # Bytes on an idle connection: the server is confused; never reuse it.
            self.abort()
            return
        exchange._received(data)

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.exchange is not None:
            self.exchange._lost(exc)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Headers:
    """Read access to response headers by name, case-insensitively."""

    __slots__ = ("_parser",)

    def __init__(self, parser: ResponseParser | Exchange) -> None:
        self._parser = parser

    def get(self, name: str, default: str | None = None) -> str | None:
        value = self._parser.header(name)
        return default if value is None else value

    def items(self) -> list[tuple[str, str]]:
        return self._parser.headers


class Response:
    """One exchange. The body is read with :meth:`read_chunk` or :meth:`read`; afterwards
    :meth:`release` returns the connection to the pool (or closes it if it cannot be reused)."""

    __slots__ = ("_client", "_conn", "_parser", "_chunks", "_buffered", "_error", "_waiter", "_paused",
                 "_idle_s", "_received_any", "headers", "_finished", "_timed_out")

    def __init__(self, client: Client, conn: _Connection, no_body: bool, idle_s: float) -> None:
        self._client = client
        self._conn = conn
        self._parser: ResponseParser | Exchange = ResponseParser(no_body)
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._idle_s = idle_s
        self._received_any = False
        self._finished = False
        self._timed_out = False
        self.headers = Headers(self._parser)

    @property
    def status(self) -> int:
        return self._parser.status

    def adopt(self, exchange: Exchange) -> None:
        """Hands the response's framing to ``exchange`` (:class:`~meshfast._core.Exchange`):
        each socket read is then framed and translated in one call into the core, and
        :meth:`read_chunk` returns the caller's bytes, ``b""`` once the body or the exchange's
        stream ended. Body bytes already buffered are translated now."""
        parser = self._parser
        if not isinstance(parser, ResponseParser):
            raise RuntimeError("the response's framing was adopted already")
        exchange.adopt(parser)
        self._parser = exchange
        self.headers = Headers(exchange)
        if self._chunks:
            data = b"".join(self._chunks)
            self._chunks.clear()
            out = exchange.feed_body(data)
            if out:
                self._chunks.append(out)
            self._buffered = len(out)
        if self._paused and self._buffered <= HIGH_WATER and self._conn.transport is not None:
            # A whole answer's caller reads nothing until the end: the socket must not stay paused.
            self._paused = False
            self._conn.transport.resume_reading()

    # --- protocol side --------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _received(self, data: bytes) -> None:
        self._received_any = True
        try:
            body = self._parser.feed(data)
        except ConnectionError as exc:
            self._error = exc
            self._conn.abort()
            self._wake()
            return
        if self._finished:
            # Released before its end: the rest is discarded, then the connection is pooled.
            if self._parser.complete:
                self._pool_or_close()
            return
        if body:
            self._chunks.append(body)
            self._buffered += len(body)
            if self._buffered > HIGH_WATER and not self._paused and self._conn.transport is not None:
                self._conn.transport.pause_reading()
                self._paused = True
        if body or self._parser.complete or self._parser.head_done:
            self._wake()

    def _lost(self, exc: Exception | None) -> None:
        if self._finished:
            self._conn.exchange = None
            return
        if not self._parser.complete and self._error is None:
            try:
                tail = self._parser.eof()
            except ConnectionError as cut:
                self._error = exc if isinstance(exc, OSError) else cut
            else:
                if tail:
                    self._chunks.append(tail)
                    self._buffered += len(tail)
        self._wake()

    # --- caller side ----------------------------------------------------------------------

    # NOTE: errors are raised as fresh exceptions and never stored on a future. A stored
    # exception's traceback pins the caller's frame, and with it the caller's own response
    # stream, until the cyclic GC runs: the caller's stream would stay open for seconds.

    def _failure(self) -> BaseException:
        error = self._error
        assert error is not None
        return type(error)(*error.args)

    def _expire(self) -> None:
        self._timed_out = True
        self._wake()

    async def _wait(self) -> None:
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        timer = loop.call_later(self._idle_s, self._expire)
        try:
            await self._waiter
        finally:
            timer.cancel()
            self._waiter = None
        if self._timed_out:
            self._timed_out = False
            raise TimeoutError("upstream idle timeout")

    async def _head(self) -> None:
        while not self._parser.head_done:
            if self._error is not None:
                raise self._failure()
            if self._conn.closed:
                raise ConnectionResetError("connection closed before the response head")
            await self._wait()

    async def read_chunk(self) -> bytes:
        """The body bytes received since the last call, waiting for some; ``b""`` at the end.

        Raises TimeoutError when nothing arrives within the idle timeout, ConnectionError when
        the body is cut short or malformed."""
        while True:
            if self._chunks:
                chunks = self._chunks
                data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
                if len(chunks) > 1:
                    chunks.clear()
                self._buffered = 0
                if self._paused and self._conn.transport is not None:
                    self._paused = False
                    self._conn.transport.resume_reading()
                return data
            if self._parser.ended:
                return b""
            if self._error is not None:
                raise self._failure()
            if self._conn.closed:
                raise ConnectionResetError("connection closed mid-body")
            await self._wait()

    async def read(self, limit: int) -> bytes:
        """The whole body, or its first ``limit + 1`` bytes when it is longer (callers check)."""
        parts: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = await self.read_chunk()
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
        return b"".join(parts)[: limit + 1]

    def release(self) -> None:
        """Done with the exchange: the connection goes back to the pool when it can carry
        another one, otherwise it is closed. A body not read to its end (a stream that ended on
        its done event, before the last chunk's framing arrived) is let finish for up to
        :data:`DRAIN_S` in the background, discarded, and then pooled."""
        if self._finished:
            return
        self._finished = True
        self._chunks.clear()
        if self._paused and self._conn.transport is not None:
            self._paused = False
            self._conn.transport.resume_reading()
        if self._parser.complete or self._error is not None or self._conn.closed:
            self._pool_or_close()
        else:
            asyncio.get_running_loop().call_later(DRAIN_S, self._drain_expired)

    def _drain_expired(self) -> None:
        if self._conn.exchange is self:
            self._conn.exchange = None
            self._conn.abort()

    def _pool_or_close(self) -> None:
        conn = self._conn
        if conn.exchange is not self:
            return
        conn.exchange = None
        if self._parser.complete and self._parser.reusable and self._error is None and not conn.closed:
            self._client._put(conn)
        else:
            conn.abort()

    def close(self) -> None:
        """Abandon the exchange and its connection."""
        self._finished = True
        if self._conn.exchange is self:
            self._conn.exchange = None
            self._conn.abort()


class Client:
    """A pooled keep-alive HTTP/1.1 client for one event loop.

    ``guard=True`` requests may only reach public addresses: names are resolved here (cached
    for a minute) and every answer is checked before connecting.
    """

    def __init__(self, connect_timeout_s: float = 5.0) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[tuple[str, str, int, bool], collections.deque[_Connection]] = {}
        self._origins: dict[str, _Origin] = {}
        self._dns: dict[tuple[str, int], tuple[float, list[str]]] = {}
        self._tls: ssl.SSLContext | None = None

    def _origin(self, url: str) -> _Origin:
        origin = self._origins.get(url)
        if origin is None:
            origin = _Origin(url)
            if len(self._origins) >= _URL_CACHE_MAX:
                self._origins.clear()
            self._origins[url] = origin
        return origin

    async def request(self, method: str, url: str, headers: list[tuple[str, str]], body: bytes, *,
                      guard: bool, idle_timeout_s: float) -> Response:
        """Send one request and wait for the response head. The body is read from the result."""
        origin = self._origin(url)
        wire = encode_request(method, origin.target, origin.host_header, headers, body)
        key = (origin.scheme, origin.host, origin.port, guard)
        no_body = method == "HEAD"
        while True:
            conn = self._take(key)
            reused = conn is not None
            if conn is None:
                conn = await self._connect(key, origin)
            response = Response(self, conn, no_body, idle_timeout_s)
            conn.exchange = response
            assert conn.transport is not None
            conn.transport.write(wire)
            try:
                await response._head()
            except ConnectionError:
                response.close()
                # NOTE: a pooled connection the server closed while idle fails before any byte
                # comes back; the request never reached the application, so send it again.
                if reused and not response._received_any:
                    continue
                raise
            except BaseException:
                response.close()
                raise
            return response

    def _take(self, key: tuple[str, str, int, bool]) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        cutoff = time.monotonic() - IDLE_TTL_S
        while idle:
            conn = idle.pop()  # the most recently used: the likeliest to be alive
            if conn.closed or conn.idle_since < cutoff:
                conn.abort()
                continue
            return conn
        return None

    def _put(self, conn: _Connection) -> None:
        idle = self._idle.get(conn.key)
        if idle is None:
            idle = self._idle[conn.key] = collections.deque()
        if len(idle) >= MAX_IDLE_PER_ORIGIN:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    async def _addresses(self, host: str, port: int) -> list[str]:
        now = time.monotonic()
        cached = self._dns.get((host, port))
        if cached is not None and cached[0] > now:
            return cached[1]
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        allowed = [a for a in addresses if not forbidden_address(a)]
        if not allowed:
            raise ForbiddenAddress(
                f"{host} resolves only to private, loopback, link-local or other non-public addresses"
            )
        self._dns[(host, port)] = (now + DNS_TTL_S, allowed)
        return allowed

    async def _connect(self, key: tuple[str, str, int, bool], origin: _Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        scheme, host, port, guard = key
        tls: ssl.SSLContext | None = None
        if scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        targets = [host]
        if guard:
            try:
                if forbidden_address(host):
                    raise ForbiddenAddress("upstream address is private, loopback, link-local or otherwise not public")
            except ValueError:
                targets = await self._addresses(host, port)  # a name
        factory: Callable[[], _Connection] = lambda: _Connection(key)  # noqa: E731
        last: OSError | None = None
        for target in targets:
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    _, conn = await loop.create_connection(
                        factory, target, port, ssl=tls, server_hostname=host if tls else None)
                return conn
            except TimeoutError:
                last = TimeoutError(f"connect to {host}:{port} timed out")
            except OSError as exc:
                last = exc
        assert last is not None
        raise last

    async def close(self) -> None:
        for idle in self._idle.values():
            while idle:
                idle.pop().abort()
        self._idle.clear()
