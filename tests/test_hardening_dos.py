"""Slow and huge bodies: a request is authenticated from its headers before its body is read; a
body that stalls gets a 408 and a row; stalled connections never cost valid callers their service."""

from __future__ import annotations

import contextlib
import resource
import shutil
import socket
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from conftest import SESSION_ENV, EmulatedProviders, Gateway

BAD_KEY = "mesh_live_" + "x" * 43
STALLED = 2000


@pytest.fixture(scope="module")
def slow_world(testserve: EmulatedProviders) -> Iterator[dict[str, Any]]:
    """A two-worker gateway with short body timeouts, one model and one granted user."""
    root = Path(tempfile.mkdtemp(prefix="mf-dos-"))
    env = {**SESSION_ENV, "MESHFAST_BODY_IDLE_TIMEOUT_S": "1", "MESHFAST_BODY_TIMEOUT_S": "3",
           "MESHFAST_MAX_ADMIN_BODY_KB": "64"}
    # The gateway starts under a low soft open-file limit, which it must raise itself.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    try:
        gw = Gateway(root / "data", workers=2, env=env).start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        provider = gw.create_provider("dos-p", family="openai", base_url=f"{testserve.base_url}/openai",
                                      api_key="testserve-key")
        model = gw.create_model(provider["id"], "dos-chat", resolved_model="dummy-chat")
        user = gw.create_user()
        gw.grant(user["id"], model["id"])
        yield {"gw": gw, "key": user["key"], "user_id": user["id"]}
    finally:
        gw.stop()
        shutil.rmtree(root, ignore_errors=True)


def _address(gw: Gateway) -> tuple[str, int]:
    host, port = gw.base_url.removeprefix("http://").split(":")
    return host, int(port)


def _stalled(gw: Gateway, path: str, headers: dict[str, str], declared: int = 100, sent: bytes = b"") -> socket.socket:
    """A connection that sends a request head declaring ``declared`` body bytes, then only ``sent``."""
    sock = socket.create_connection(_address(gw), timeout=10)
    head = f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {declared}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall(head.encode() + b"\r\n" + sent)
    return sock


def _status(sock: socket.socket, timeout_s: float) -> int | None:
    """The status of the answer on ``sock`` within ``timeout_s``, None if none came."""
    sock.settimeout(timeout_s)
    try:
        data = sock.recv(64)
    except (TimeoutError, OSError):
        return None
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None


@contextlib.contextmanager
def _many_stalled(gw: Gateway, n: int, path: str, headers: dict[str, str]) -> Iterator[list[socket.socket]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * n + 1024)), hard))
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            socks.append(_stalled(gw, path, headers))
        yield socks
    finally:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()


def _call(client: httpx.Client, key: str) -> tuple[int, float]:
    started = time.perf_counter()
    r = client.post("/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                    json={"model": "dos-chat", "messages": [{"role": "user", "content": "hi"}]})
    return r.status_code, time.perf_counter() - started


def test_stalled_bodies_without_a_valid_key_never_starve_valid_callers(slow_world: dict[str, Any]) -> None:
    """2,000 connections that send a head without a valid key and then stall are refused 401 from
    their headers; valid calls on both planes keep being served with p99 ≤ 50 ms meanwhile."""
    gw: Gateway = slow_world["gw"]
    with httpx.Client(base_url=gw.base_url, timeout=10) as client:
        for _ in range(20):
            _call(client, slow_world["key"])  # warm pools and connections
        half = STALLED // 2
        with _many_stalled(gw, half, "/v1/chat/completions", {"authorization": f"Bearer {BAD_KEY}"}) as bad, \
                _many_stalled(gw, STALLED - half, "/v1/proxy?model=dos-chat", {}) as anonymous:
            time.sleep(0.5)
            latencies = []
            for _ in range(300):
                status, took = _call(client, slow_world["key"])
                assert status == 200
                latencies.append(took)
            admin = gw.admin("GET", "/admin/users")
            assert admin.status_code == 200
            refused = [_status(s, 5) for s in (bad[:50] + anonymous[:50])]
        p99 = statistics.quantiles(latencies, n=100)[98]
        assert p99 <= 0.050, f"p99 {p99 * 1000:.1f} ms under {STALLED} stalled connections"
        assert refused == [401] * 100, "refused from the headers, before any body byte"


def test_a_stalled_body_with_a_valid_key_gets_408_and_a_row(slow_world: dict[str, Any]) -> None:
    """A valid caller whose body stops (idle timeout) or trickles past the total timeout gets a 408 in
    the route's shape, with a row naming the caller; its slot is free again."""
    gw: Gateway = slow_world["gw"]
    auth = {"authorization": f"Bearer {slow_world['key']}"}
    idle = _stalled(gw, "/v1/chat/completions", auth, declared=100, sent=b'{"model":')
    started = time.monotonic()
    assert _status(idle, 5) == 408
    assert 0.8 <= time.monotonic() - started < 3, "the idle timeout (1 s) cut it"
    idle.close()

    # A byte every 0.5 s never idles for 1 s, but the whole body is not in after 3 s.
    trickle = _stalled(gw, "/v1/proxy?model=dos-chat", auth, declared=400_000, sent=b"{")
    started = time.monotonic()
    status = None
    while status is None and time.monotonic() - started < 8:
        with contextlib.suppress(OSError):
            trickle.sendall(b" ")
        status = _status(trickle, 0.5)
    assert status == 408 and time.monotonic() - started < 5
    trickle.close()

    rows = _rows_of(gw, slow_world["user_id"], 408, at_least=2)
    assert len(rows) >= 2
    assert {(r["outcome"], r["deny_reason"]) for r in rows} == {("denied", "request_timeout")}
    with httpx.Client(base_url=gw.base_url, timeout=10) as client:
        assert _call(client, slow_world["key"])[0] == 200


def _rows_of(gw: Gateway, user_id: str, status: int, at_least: int, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """The caller's rows with ``status`` (waiting up to ``timeout_s`` for ``at_least`` of them)."""
    deadline = time.monotonic() + timeout_s
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        logs = gw.admin("GET", f"/admin/logs?user_id={user_id}&page_size=200").json()["logs"]
        rows = [row for row in logs if row["status_code"] == status]
        if len(rows) >= at_least:
            break
        time.sleep(0.2)
    return rows


def test_a_client_leaving_mid_body_leaves_a_row_and_no_traceback(slow_world: dict[str, Any]) -> None:
    """A caller that closes its connection halfway through its body is recorded (status 499,
    ``client_disconnected``) and the worker logs no traceback."""
    gw: Gateway = slow_world["gw"]
    before = gw.log().count("Traceback")
    for path in ("/v1/chat/completions", "/v1/proxy?model=dos-chat"):
        sock = _stalled(gw, path, {"authorization": f"Bearer {slow_world['key']}"}, declared=1000, sent=b'{"x":')
        time.sleep(0.2)
        sock.close()
    rows = _rows_of(gw, slow_world["user_id"], 499, at_least=2)
    assert len(rows) == 2
    assert {(r["outcome"], r["deny_reason"]) for r in rows} == {("denied", "client_disconnected")}
    assert gw.log().count("Traceback") == before


def test_unauthenticated_huge_bodies_are_refused_unread(slow_world: dict[str, Any]) -> None:
    """A 200 MiB POST without valid credentials is a 401 on both planes without its body being read:
    the workers' memory does not grow by it."""
    gw: Gateway = slow_world["gw"]
    workers = [psutil.Process(pid) for pid in gw.worker_pids()]
    before = sum(w.memory_info().rss for w in workers)
    size = 200 << 20
    for path, headers in (("/v1/chat/completions", {"authorization": f"Bearer {BAD_KEY}"}),
                          ("/admin/providers", {"authorization": "Bearer not-an-admin-token"}),
                          ("/v1/proxy?model=dos-chat", {})):
        sock = _stalled(gw, path, headers, declared=size, sent=b"x" * 65536)
        started = time.monotonic()
        assert _status(sock, 5) == 401, path
        assert time.monotonic() - started < 1
        sock.close()
    after = sum(w.memory_info().rss for w in workers)
    assert after - before < 50 << 20


def test_admin_bodies_are_capped_far_below_data_plane_bodies(slow_world: dict[str, Any]) -> None:
    """An authenticated admin body over MESHFAST_MAX_ADMIN_BODY_KB is 413; a login body over 16 KiB too."""
    gw: Gateway = slow_world["gw"]
    auth = {"authorization": f"Bearer {gw.admin_token}"}
    big = _stalled(gw, "/admin/users", auth, declared=70 << 10)
    assert _status(big, 5) == 413
    big.close()
    login = _stalled(gw, "/admin/login", {}, declared=20 << 10)
    assert _status(login, 5) == 413
    login.close()


def test_saturation_shows_in_readyz_and_metrics(slow_world: dict[str, Any]) -> None:
    """/readyz's body and /admin/metrics report requests in flight, body reads and the request limit."""
    gw: Gateway = slow_world["gw"]
    auth = {"authorization": f"Bearer {slow_world['key']}"}
    socks = [_stalled(gw, "/v1/chat/completions", auth, declared=100, sent=b"{") for _ in range(6)]
    try:
        # Every worker publishes its load about once a second; the bodies trickle a byte at a
        # time, so the 1 s idle timeout never cuts them (the 3 s total one would, later).
        deadline = time.monotonic() + 2.5
        ready: dict[str, Any] = {}
        metrics = ""
        while time.monotonic() < deadline:
            for sock in socks:
                sock.sendall(b" ")
            ready = gw.client.get("/readyz").json()
            metrics = gw.admin("GET", "/admin/metrics").text
            if ready["load"]["body_reads"] >= 6 and "meshfast_body_reads_in_flight 6" in metrics:
                break
            time.sleep(0.3)
        assert ready["status"] == "ok"
        assert ready["load"]["body_reads"] >= 6, ready
        assert ready["load"]["limit"] >= 2 and ready["load"]["workers"] == 2
        reads = [line for line in metrics.splitlines() if line.startswith("meshfast_body_reads_in_flight ")]
        assert reads and float(reads[0].split()[1]) >= 6
        assert "meshfast_request_limit " in metrics and "meshfast_saturated 0" in metrics
    finally:
        for sock in socks:
            sock.close()


def test_the_worker_raises_its_open_file_limit(slow_world: dict[str, Any]) -> None:
    """Each worker runs with its soft open-file limit raised to the hard limit."""
    gw: Gateway = slow_world["gw"]
    for pid in gw.worker_pids():
        soft, hard = psutil.Process(pid).rlimit(psutil.RLIMIT_NOFILE)
        assert soft == hard > 1024 or soft >= 1 << 20, (pid, soft, hard)


def test_a_refused_small_body_keeps_a_pipelined_connection_serving(slow_world: dict[str, Any]) -> None:
    """A bad key's small body is drained, so the requests pipelined after it on the same connection
    are answered too (a soak pipelines bad keys among valid calls)."""
    gw: Gateway = slow_world["gw"]
    body = b'{"model":"dos-chat","messages":[{"role":"user","content":"hi"}]}'

    def request(key: str) -> bytes:
        return (f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                f"authorization: Bearer {key}\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body

    with socket.create_connection(_address(gw), timeout=10) as sock:
        sock.sendall(request(BAD_KEY) + request(slow_world["key"]) + request(BAD_KEY))
        received = b""
        deadline = time.monotonic() + 10
        while received.count(b"HTTP/1.1 ") < 3 and time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    statuses = [int(part.split(b" ", 1)[0]) for part in received.split(b"HTTP/1.1 ")[1:]]
    assert statuses == [401, 200, 401]
