"""meshfast's upstream client over real sockets: framing, keep-alive, stale connections, timeouts, SSRF."""

from __future__ import annotations

import asyncio
import gzip
import itertools
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshfast import http1
from meshfast._core import ResponseParser, encode_request
from meshfast.dispatch import Dispatcher, Timeouts, UpstreamError


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


class Upstream:
    """A raw asyncio server that answers each request with whatever bytes a test scripts."""

    def __init__(self, answer: Callable[[int, bytes, bytes], bytes | None], close_after: int | None = None) -> None:
        self.answer = answer
        self.close_after = close_after
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head, body = await _read_request(reader)
                self.requests.append(head + body)
                reply = self.answer(len(self.requests), head, body)
                if reply is None:
                    await asyncio.sleep(3600)
                writer.write(reply or b"")
                await writer.drain()
                served += 1
                if self.close_after is not None and served >= self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


def _ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: " + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body


def _chunked(parts: list[bytes]) -> bytes:
    wire = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    for part in parts:
        wire += f"{len(part):x}\r\n".encode() + part + b"\r\n"
    return wire + b"0\r\n\r\n"


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 20))  # type: ignore[arg-type]


def test_keep_alive_reuses_one_connection() -> None:
    async def main() -> None:
        upstream = Upstream(lambda n, head, body: _ok(b"answer %d" % n))
        async with upstream as base:
            client = http1.Client()
            for i in range(1, 4):
                response = await client.request("POST", f"{base}/v1/x?a=1", [("x-api-key", "k")], b"{}",
                                                guard=False, idle_timeout_s=5)
                assert response.status == 200
                assert await response.read(1024) == b"answer %d" % i
                response.release()
            await client.close()
        assert upstream.connections == 1
        assert upstream.requests[0].startswith(b"POST /v1/x?a=1 HTTP/1.1\r\nhost: 127.0.0.1:")
        assert b"x-api-key: k\r\n" in upstream.requests[0] and upstream.requests[0].endswith(b"\r\n\r\n{}")

    run(main())


def test_a_stale_pooled_connection_is_replaced_transparently() -> None:
    async def main() -> None:
        # The server closes every connection after one answer, as an idle-timeout would.
        upstream = Upstream(lambda n, head, body: _ok(b"fresh"), close_after=1)
        async with upstream as base:
            client = http1.Client()
            for _ in range(3):
                response = await client.request("POST", f"{base}/", [], b"x", guard=False, idle_timeout_s=5)
                assert await response.read(100) == b"fresh"
                response.release()
                await asyncio.sleep(0.05)  # let the server's close arrive, or not
            await client.close()
        assert upstream.connections == 3

    run(main())


def test_streamed_chunks_arrive_as_they_are_sent_and_large_bodies_are_exact() -> None:
    big = bytes(range(256)) * 20_000  # 5 MB, past the pause threshold
    parts = [b"data: %d\n\n" % i for i in range(50)] + [big]

    async def main() -> None:
        async with Upstream(lambda n, head, body: _chunked(parts)) as base:
            client = http1.Client()
            response = await client.request("GET", f"{base}/s", [], b"", guard=False, idle_timeout_s=5)
            received = []
            while chunk := await response.read_chunk():
                received.append(chunk)
                await asyncio.sleep(0)  # a slow reader: the socket is paused and resumed
            assert b"".join(received) == b"".join(parts)
            response.release()
            await client.close()

    run(main())


def test_gzip_and_close_delimited_bodies() -> None:
    payload = b'{"data":[1,2,3]}' * 100
    zipped = gzip.compress(payload)

    async def main() -> None:
        replies = {1: _ok(zipped, b"content-encoding: gzip\r\n"),
                   2: b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + payload}
        async with Upstream(lambda n, head, body: replies[n], close_after=2) as base:
            client = http1.Client()
            for _ in range(2):
                response = await client.request("POST", f"{base}/", [], b"{}", guard=False, idle_timeout_s=5)
                assert await response.read(1 << 20) == payload
                response.release()
            await client.close()

    run(main())


def test_idle_timeout_and_cut_short_bodies_raise() -> None:
    async def main() -> None:
        async with Upstream(lambda n, head, body: None) as base:
            client = http1.Client()
            with pytest.raises(TimeoutError):
                await client.request("POST", f"{base}/", [], b"{}", guard=False, idle_timeout_s=0.2)
            await client.close()
        cut = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial"
        async with Upstream(lambda n, head, body: cut, close_after=1) as base:
            client = http1.Client()
            response = await client.request("POST", f"{base}/", [], b"{}", guard=False, idle_timeout_s=5)
            assert await response.read_chunk() == b"partial"
            with pytest.raises(ConnectionError):
                await response.read_chunk()
            response.release()
            await client.close()

    run(main())


def test_dispatcher_refuses_private_addresses_and_split_headers_without_retrying() -> None:
    async def main() -> None:
        upstream = Upstream(lambda n, head, body: _ok(b"secret"))
        async with upstream as base:
            dispatcher = Dispatcher(Timeouts(connect_s=1, idle_s=2, total_deadline_s=10))
            await dispatcher.start()
            loop = asyncio.get_running_loop()
            cases = [
                (f"{base}/", [], False, "private"),  # a loopback literal, provider not local
                (base.replace("127.0.0.1", "localhost") + "/", [], False, "private"),  # a name resolving there
                (f"{base}/", [("x-h", "a\r\nx-evil: 1")], True, "control character"),
            ]
            for url, headers, local, message in cases:
                started = loop.time()
                with pytest.raises(UpstreamError, match=message):
                    await dispatcher.send("POST", url, headers, b"{}", local=local, attempts=3, backoff_ms=2000)
                assert loop.time() - started < 1.0, "refusals are final, never retried"
            await dispatcher.close()
        assert upstream.requests == []

    run(main())


def test_retries_honour_retry_after_and_end_in_the_providers_error() -> None:
    async def main() -> None:
        def answer(n: int, head: bytes, body: bytes) -> bytes:
            path = head.split(b" ", 2)[1]
            if path == b"/bad":
                msg = b'{"error":{"message":"no such model"}}'
                return b"HTTP/1.1 400 Bad\r\ncontent-length: %d\r\n\r\n%s" % (len(msg), msg)
            if path == b"/busy" or n < 3:
                msg = b'{"error":{"message":"overloaded"}}'
                return b"HTTP/1.1 503 Busy\r\nretry-after: 0\r\ncontent-length: %d\r\n\r\n%s" % (len(msg), msg)
            return _ok(b"done")

        upstream = Upstream(answer)
        async with upstream as base:
            dispatcher = Dispatcher(Timeouts(connect_s=1, idle_s=2, total_deadline_s=10))
            await dispatcher.start()
            response = await dispatcher.send("POST", f"{base}/ok", [], b"{}", local=True, attempts=3, backoff_ms=1)
            assert await response.read(100) == b"done"
            response.release()
            assert len(upstream.requests) == 3  # two 503s, then the answer
            with pytest.raises(UpstreamError) as busy:
                await dispatcher.send("POST", f"{base}/busy", [], b"{}", local=True, attempts=2, backoff_ms=1)
            assert (busy.value.status, busy.value.message) == (503, "overloaded")
            assert len(upstream.requests) == 5
            with pytest.raises(UpstreamError) as bad:
                await dispatcher.send("POST", f"{base}/bad", [], b"{}", local=True, attempts=3, backoff_ms=1)
            assert (bad.value.status, bad.value.message) == (400, "no such model")
            assert len(upstream.requests) == 6  # a 400 is not retried
            await dispatcher.close()

    run(main())


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.binary(min_size=1, max_size=200), max_size=10),
       cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=12))
def test_any_split_of_a_chunked_answer_decodes_to_its_body(parts: list[bytes], cuts: list[int]) -> None:
    """The binding agrees with the obvious reference (concatenation) under any split."""
    wire = _chunked(parts)
    points = sorted({0, len(wire), *(c % (len(wire) + 1) for c in cuts)})
    parser = ResponseParser()
    body = b"".join(parser.feed(wire[a:b]) for a, b in itertools.pairwise(points))
    assert body == b"".join(parts) and parser.complete and parser.reusable


def test_encode_request_refuses_injection_and_owns_framing() -> None:
    wire = encode_request("POST", "/p", "h:1", [("Content-Length", "999"), ("Host", "evil"), ("a", "b")], b"xy")
    assert wire == b"POST /p HTTP/1.1\r\nhost: h:1\r\na: b\r\naccept: */*\r\naccept-encoding: identity\r\ncontent-length: 2\r\n\r\nxy"
    for bad in ([("a\nb", "v")], [("a", "v\r\n")], [("", "v")]):
        with pytest.raises(ValueError):
            encode_request("POST", "/", "h", bad, b"")
