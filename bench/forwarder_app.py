"""A bare forwarder: the floor that meshfast's governed `POST /v1/proxy` is measured against.

A Granian RSGI app with one pooled aiohttp `ClientSession` per worker (opened in `__rsgi_init__`, with
the connector settings meshfast uses when told `MESHFAST_UPSTREAM_CLIENT=aiohttp`); with
`FORWARDER_CLIENT=native` it uses meshfast's own upstream client (`meshfast.http1`) instead, and with
`FORWARDER_CLIENT=thread` the upstream exchange runs off the event loop: a pool of threads, each with
one blocking keep-alive socket, does the whole exchange (write, read the content-length framed answer)
and hands the answer back to the loop once (`run_in_executor`, i.e. `call_soon_threadsafe`). That is
the shape of an upstream exchange in a compiled runtime with one hand-off per response, less the
speed of compiled parsing; `bench/floor_bench.py` measures it beside the loop's own client. It takes the Mesh-native request
`POST /v1/proxy?model=NAME` with body `{"query": ..., "max_tokens": ...}`, splices the query into a
pre-rendered Anthropic Messages body, sends it to testserve and streams the upstream bytes back chunk
by chunk: no authentication, policy, accounting, SSE parsing or re-encoding. What it adds over a direct
call is what Granian + aiohttp cost, the budget ARCHITECTURE.md gives the governed path.

    FORWARDER_UPSTREAM=http://127.0.0.1:PORT/anthropic/v1/messages \
        python -m granian --interface rsgi --workers 2 --host 127.0.0.1 --port 8001 bench.forwarder_app:app
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import socket
import threading
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import msgspec
from granian.rsgi import ProtocolClosed

ENV_UPSTREAM = "FORWARDER_UPSTREAM"
ENV_API_KEY = "FORWARDER_API_KEY"
ENV_CLIENT = "FORWARDER_CLIENT"
DEFAULT_API_KEY = "testserve-key"
# The Mesh model names the bench grants, mapped to testserve models (suffix = scenario).
MODELS: dict[str, bytes] = {
    "b-anthropic": b"dummy-chat",
    "b-anthropic-huge": b"dummy-huge",
}
DEFAULT_MAX_TOKENS = 64


class ProxyBody(msgspec.Struct):
    query: str
    max_tokens: int = DEFAULT_MAX_TOKENS


_decode_body = msgspec.json.Decoder(ProxyBody).decode
_encode = msgspec.json.encode

# NOTE: the same bytes meshfast renders for this request (key order included), so the upstream
# does the same work for both; only the query and max_tokens are spliced in per request.
_BODY_HEAD = b'{"model":"'
_BODY_MID = b'","max_tokens":'
_BODY_MSG = b',"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":'
_BODY_TAIL = b"}]}]}"

_NOT_FOUND = b'{"error":{"code":"model_not_found","message":"unknown model"}}\n'
_BAD_REQUEST = b'{"error":{"code":"invalid_request","message":"body must be {query, max_tokens}"}}\n'
_BAD_GATEWAY = b'{"error":{"code":"upstream_error","message":"upstream answered non-2xx"}}\n'
_JSON_HEADERS = [("content-type", "application/json")]


def render(model: bytes, query: str, max_tokens: int) -> bytes:
    return b"".join((_BODY_HEAD, model, _BODY_MID, str(max_tokens).encode(), _BODY_MSG, _encode(query),
                     _BODY_TAIL))


class ForwarderApp:
    def __init__(self) -> None:
        self.session: aiohttp.ClientSession | None = None
        self.native: Any = None
        self.upstream = ""
        self.upstream_headers: dict[str, str] = {}
        self.header_list: list[tuple[str, str]] = []
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.thread_client: ThreadClient | None = None
        self.rs: Any = None
        self.rs_waiting: dict[int, asyncio.Future] = {}
        self.rs_next = 0

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.run_until_complete(self.startup())

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.session is not None:
            loop.run_until_complete(self.session.close())
        if self.native is not None:
            loop.run_until_complete(self.native.close())
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)

    async def startup(self) -> None:
        self.upstream = os.environ[ENV_UPSTREAM]
        self.upstream_headers = {
            "content-type": "application/json",
            "x-api-key": os.environ.get(ENV_API_KEY, DEFAULT_API_KEY),
            "anthropic-version": "2023-06-01",
        }
        self.header_list = list(self.upstream_headers.items())
        if os.environ.get(ENV_CLIENT, "aiohttp") == "rs":
            import offloop_rs  # built by `make bench-offloop`, on PYTHONPATH for this target only

            self.rs = offloop_rs.Client(self.upstream, self.header_list)
            asyncio.get_running_loop().add_reader(self.rs.fileno(), self._rs_collect)
            return
        if os.environ.get(ENV_CLIENT, "aiohttp") == "thread":
            self.thread_client = ThreadClient(self.upstream, self.header_list)
            self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="upstream")
            return
        if os.environ.get(ENV_CLIENT, "aiohttp") == "native":
            from meshfast.http1 import Client

            self.native = Client(connect_timeout_s=10)
            return
        # Same pool settings as meshfast's aiohttp client, so the comparison is the governance.
        connector = aiohttp.TCPConnector(limit=512, limit_per_host=256, keepalive_timeout=60)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=True,
            skip_auto_headers=("User-Agent",),
        )

    async def __rsgi__(self, scope, proto) -> None:
        if scope.method != "POST" or scope.path != "/v1/proxy":
            proto.response_bytes(404, _JSON_HEADERS, _NOT_FOUND)
            return
        names = parse_qs(scope.query_string).get("model")
        model = MODELS.get(names[0]) if names else None
        if model is None:
            proto.response_bytes(404, _JSON_HEADERS, _NOT_FOUND)
            return
        try:
            req = _decode_body(await proto())
        except msgspec.DecodeError:
            proto.response_bytes(400, _JSON_HEADERS, _BAD_REQUEST)
            return
        body = render(model, req.query, req.max_tokens)
        if self.native is not None:
            await self._forward_native(proto, body)
            return
        if self.thread_client is not None:
            await self._forward_thread(proto, body)
            return
        if self.rs is not None:
            await self._forward_rs(proto, body)
            return
        assert self.session is not None, "__rsgi_init__ did not run"
        async with self.session.post(self.upstream, data=body, headers=self.upstream_headers) as resp:
            if resp.status >= 300:
                await resp.read()
                proto.response_bytes(502, _JSON_HEADERS, _BAD_GATEWAY)
                return
            transport = proto.response_stream(
                200, [("content-type", resp.headers.get("content-type", "text/event-stream"))]
            )
            try:
                async for chunk in resp.content.iter_any():
                    await transport.send_bytes(chunk)
            except ProtocolClosed:
                pass  # the caller left mid-stream (wrk closing its connections at the end of a run)

    async def _forward_native(self, proto, body: bytes) -> None:
        resp = await self.native.request("POST", self.upstream, self.header_list, body, guard=False,
                                         idle_timeout_s=300)
        if resp.status >= 300:
            await resp.read(1 << 20)
            resp.release()
            proto.response_bytes(502, _JSON_HEADERS, _BAD_GATEWAY)
            return
        transport = proto.response_stream(
            200, [("content-type", resp.headers.get("content-type", "text/event-stream"))]
        )
        try:
            while chunk := await resp.read_chunk():
                await transport.send_bytes(chunk)
        except ProtocolClosed:
            resp.close()
            return
        resp.release()

    def _rs_collect(self) -> None:
        """The loop's one callback for every answer the compiled client finished since the last."""
        for ident, status, text, answer in self.rs.take():
            future = self.rs_waiting.pop(ident, None)
            if future is not None and not future.done():
                future.set_result((status, text, answer))

    async def _forward_rs(self, proto, body: bytes) -> None:
        self.rs_next += 1
        ident = self.rs_next
        future = asyncio.get_running_loop().create_future()
        self.rs_waiting[ident] = future
        self.rs.send(ident, body)
        try:
            status, content_type, answer = await future
        finally:
            self.rs_waiting.pop(ident, None)
        await _send_whole(proto, status, content_type, answer)

    async def _forward_thread(self, proto, body: bytes) -> None:
        assert self.pool is not None and self.thread_client is not None
        loop = asyncio.get_running_loop()
        status, content_type, answer = await loop.run_in_executor(self.pool, self.thread_client.exchange, body)
        await _send_whole(proto, status, content_type, answer)


async def _send_whole(proto, status: int, content_type: str, answer: bytes) -> None:
    """An off-loop exchange's answer (status 0: none came), streamed back in one write, as the loop's
    own client makes of an answer that arrives in one read."""
    if not 200 <= status < 300:
        proto.response_bytes(502, _JSON_HEADERS, _BAD_GATEWAY)
        return
    transport = proto.response_stream(200, [("content-type", content_type)])
    try:
        await transport.send_bytes(answer)
    except ProtocolClosed:
        pass


THREADS = 64  # wrk's connections in the floor bench: no call waits for a thread


class ThreadClient:
    """Blocking HTTP/1.1 upstream exchanges, one keep-alive socket per pool thread (content-length
    framed answers only: the floor bench's upstream). The GIL is released while a thread waits on
    its socket, so the event loop runs meanwhile."""

    def __init__(self, url: str, headers: list[tuple[str, str]]) -> None:
        parts = urlsplit(url)
        self.address = (parts.hostname or "127.0.0.1", parts.port or 80)
        head = [f"POST {parts.path or '/'} HTTP/1.1", f"host: {parts.netloc}"]
        head += [f"{k}: {v}" for k, v in headers]
        self.head = ("\r\n".join(head) + "\r\ncontent-length: ").encode()
        self.local = threading.local()

    def exchange(self, body: bytes) -> tuple[int, str, bytes]:
        local = self.local
        sock: socket.socket | None = getattr(local, "sock", None)
        try:
            if sock is None:
                sock = socket.create_connection(self.address)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                local.sock, local.buf = sock, b""
            sock.sendall(b"".join((self.head, str(len(body)).encode(), b"\r\n\r\n", body)))
            buf = local.buf
            while (end := buf.find(b"\r\n\r\n")) < 0:
                buf += self._recv(sock)
            status = int(buf[9:12])
            length, content_type = 0, "text/event-stream"
            for line in buf[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"content-type":
                    content_type = value.strip().decode()
            need = end + 4 + length
            while len(buf) < need:
                buf += self._recv(sock)
            local.buf = buf[need:]
            return status, content_type, buf[end + 4:need]
        except BaseException:
            if sock is not None:
                sock.close()
            local.sock = None
            raise

    @staticmethod
    def _recv(sock: socket.socket) -> bytes:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("upstream closed the connection")
        return chunk


app = ForwarderApp()
