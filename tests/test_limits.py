"""Limits on input: each gives a clear error in the route's shape and never takes a worker down."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import httpx
from conftest import SESSION_ENV, EmulatedProviders, Gateway


def test_requests_past_the_limit_get_a_quick_503_and_a_row(fresh_dir: Path, testserve: EmulatedProviders) -> None:
    """MESHFAST_MAX_CONNECTIONS=3 on one worker: three slow calls run, the next ones are refused at
    once with 503 server_busy (Mesh shape on /v1/proxy, OpenAI's on /v1/chat/completions)."""
    gw = Gateway(fresh_dir / "data", workers=1, env={**SESSION_ENV, "MESHFAST_MAX_CONNECTIONS": "3"}).start()
    try:
        provider = gw.create_provider("lim-p", family="openai", base_url=f"{testserve.base_url}/openai",
                                      api_key="testserve-key")
        model = gw.create_model(provider["id"], "lim-slow", resolved_model="dummy-slow")
        user = gw.create_user()
        gw.grant(user["id"], model["id"])
        auth = {"authorization": f"Bearer {user['key']}"}
        slow: list[int] = []

        def slow_call() -> None:
            with httpx.Client(base_url=gw.base_url, timeout=30) as client:
                r = client.post("/v1/proxy", params={"model": "lim-slow"}, json={"query": "hi"}, headers=auth)
                slow.append(r.status_code)

        threads = [threading.Thread(target=slow_call) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.4)  # the three are in flight (testserve holds them for a second)
        with httpx.Client(base_url=gw.base_url, timeout=30) as client:
            started = time.monotonic()
            busy = client.post("/v1/proxy", params={"model": "lim-slow"}, json={"query": "hi"}, headers=auth)
            took = time.monotonic() - started
            busy_openai = client.post("/v1/chat/completions", headers=auth,
                                      json={"model": "lim-slow", "messages": [{"role": "user", "content": "x"}]})
            health = client.get("/healthz")
        for t in threads:
            t.join()
        assert slow == [200, 200, 200]
        assert (busy.status_code, busy.json()["error"], busy.headers["retry-after"]) == (503, "server_busy", "1")
        assert took < 0.5, "refused at once, not queued"
        assert busy_openai.status_code == 503 and busy_openai.json()["error"]["code"] == "server_busy"
        assert health.status_code == 200, "health is always answered"
        row = gw.fetch_row(busy.headers["x-request-id"])
        assert (row["outcome"], row["status_code"], row["deny_reason"]) == ("denied", 503, "server_busy")
        # Once the slow calls are done, the worker serves as usual.
        assert gw.client.post("/v1/proxy", params={"model": "lim-slow"}, json={"query": "hi"},
                              headers=auth, timeout=30).status_code == 200
    finally:
        gw.stop()


def test_oversized_headers_are_431_and_the_worker_keeps_serving(gateway: Gateway) -> None:
    host, port = gateway.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/proxy?model=x HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 600_000 + b"\r\n\r\n")
        assert s.recv(64).startswith(b"HTTP/1.1 431 ")
    assert gateway.client.get("/healthz").status_code == 200


def test_a_body_over_the_limit_is_413_in_the_routes_shape(gateway: Gateway) -> None:
    """A valid caller's body over MESHFAST_MAX_BODY_MB is 413 (a bad key is 401 before any body read)."""
    user = gateway.create_user()
    big = b"x" * (301 << 20)
    r = gateway.client.post("/v1/chat/completions", content=big, timeout=60,
                            headers={"authorization": f"Bearer {user['key']}"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
