"""The edge's route table (meshfast/app.py), in process: which handler each method and path reach,
what is a 404, and what the worker's request limit lets through. No server: the data plane and
the transport are stand-ins that record what they were given."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from meshfast import app as app_module


class Scope:
    def __init__(self, method: str, path: str, query: str = "", proto: str = "http") -> None:
        self.proto, self.method, self.path, self.query_string, self.headers = proto, method, path, query, {}


class Proto:
    def __init__(self) -> None:
        self.responses: list[tuple[int, dict[str, str], bytes]] = []
        self.closed: list[int] = []

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.responses.append((status, dict(headers), body))

    def close(self, status: int) -> None:
        self.closed.append(status)


class Data:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, bool | None]] = []

    async def handle(self, scope: Any, proto: Any, route: str, read_body: Any, model: str | None = None,
                     stream: bool | None = None, busy: Any = None) -> None:
        self.calls.append((route, model, stream))


def _serve(method: str, path: str, query: str = "", busy: bool = False) -> tuple[Data, Proto]:
    app = app_module.App()
    data, proto = Data(), Proto()
    app.data = data  # type: ignore[assignment]
    app._jwks = b'{"keys":[]}'
    if busy:
        app._limit = 0  # this request alone is past it
    asyncio.run(app.__rsgi__(Scope(method, path, query), proto))
    return data, proto


@pytest.mark.parametrize(("path", "query", "route", "model", "stream"), [
    ("/v1/proxy", "model=m", "proxy", None, None),
    ("/v1/generate", "", "generate", None, None),
    ("/v1/embeddings", "", "openai_embeddings", None, None),
    ("/v1/embeddings", "model=m", "embeddings", None, None),
    ("/v1/chat/completions", "", "openai_chat", None, None),
    ("/v1/responses", "", "openai_responses", None, None),
    ("/v1/messages", "", "anthropic", None, None),
    ("/api/chat", "", "ollama", None, None),
    ("/v1beta/models/gemini-2.0-flash:generateContent", "", "gemini", "gemini-2.0-flash", False),
    ("/v1/models/a%2Fb:streamGenerateContent", "alt=sse", "gemini", "a/b", True),
])
def test_a_data_route_reaches_the_data_plane_in_its_wire_format(path: str, query: str, route: str,
                                                                 model: str | None, stream: bool | None) -> None:
    data, proto = _serve("POST", path, query)
    assert data.calls == [(route, model, stream)] and not proto.responses
    # Past the request limit too: the data plane checks it itself, after the key.
    data, proto = _serve("POST", path, query, busy=True)
    assert data.calls == [(route, model, stream)] and not proto.responses


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v1/chat/completions"), ("POST", "/v1/chat/completions/"), ("PUT", "/v1/proxy"),
    ("GET", "/v1beta/models/g:generateContent"), ("POST", "/v1beta/models/g:countTokens"),
    ("POST", "/healthz/"), ("POST", "/.well-known/jwks.json"), ("GET", "/v1"), ("GET", "/"),
    ("GET", "/dashboardx"), ("GET", "/admin"),
])
def test_anything_else_is_a_404(method: str, path: str) -> None:
    data, proto = _serve(method, path)
    assert not data.calls
    [(status, headers, body)] = proto.responses
    assert status == 404 and body == b'{"error":"not_found"}\n'
    assert headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "OPTIONS"])
def test_healthz_answers_every_method_even_past_the_limit(method: str) -> None:
    for busy in (False, True):
        _, proto = _serve(method, "/healthz", busy=busy)
        assert [(s, b) for s, _, b in proto.responses] == [(200, b'{"status":"ok"}\n')]


@pytest.mark.parametrize(("method", "path"), [("GET", "/nope"), ("GET", "/healthz/"), ("GET", "/v1/models"),
                                              ("GET", "/admin/users"), ("GET", "/dashboard")])
def test_past_the_limit_everything_but_the_probes_and_the_data_plane_is_a_quick_503(method: str, path: str) -> None:
    _, proto = _serve(method, path, busy=True)
    [(status, headers, body)] = proto.responses
    assert status == 503 and headers["retry-after"] == "1"
    assert body == b'{"error":"server_busy"}\n'


def test_the_documents_and_the_views_method_checks() -> None:
    [(status, headers, body)] = _serve("GET", "/admin/openapi.json")[1].responses
    assert status == 200 and headers["cache-control"] == "no-cache" and msgspec.json.decode(body)["openapi"]
    [(status, headers, body)] = _serve("GET", "/.well-known/jwks.json")[1].responses
    assert (status, headers["cache-control"], body) == (200, "public, max-age=300", b'{"keys":[]}')
    for path in ("/v1/models", "/v1/usage"):
        [(status, headers, body)] = _serve("POST", path)[1].responses
        assert status == 405 and body == b'{"error":"method_not_allowed"}\n'
        assert headers["x-request-id"]
    [(status, _, body)] = _serve("DELETE", "/api/tags")[1].responses
    assert status == 405 and "error" in msgspec.json.decode(body)


def test_the_dashboard_is_served_under_its_prefix() -> None:
    for path in ("/dashboard", "/dashboard/"):
        [(status, headers, _)] = _serve("GET", path)[1].responses
        assert status == 200 and headers["content-type"].startswith("text/html")


def _upgrade(path: str, monkeypatch: pytest.MonkeyPatch, busy: bool = False,
             draining: bool = False) -> tuple[list[str], Proto]:
    """A WebSocket upgrade to ``path``: the paths realtime sessions were served on, and the transport."""
    served: list[str] = []

    async def serve(data: Any, scope: Any, proto: Any, sessions: Any) -> None:
        served.append(scope.path)

    monkeypatch.setattr(app_module.realtime, "serve", serve)
    app = app_module.App()
    proto = Proto()
    app.data = Data()  # type: ignore[assignment]
    app._draining = draining
    if busy:
        app._limit = -1  # past it with nothing in flight: an upgrade is not a task the worker counts
    asyncio.run(app.__rsgi__(Scope("GET", path, proto="ws"), proto))
    return served, proto


def test_the_realtime_row_answers_only_a_websocket_upgrade(monkeypatch: pytest.MonkeyPatch) -> None:
    served, proto = _upgrade("/v1/realtime", monkeypatch)
    assert served == ["/v1/realtime"] and not proto.closed and not proto.responses
    # Over HTTP the path is no route.
    [(status, _, body)] = _serve("GET", "/v1/realtime")[1].responses
    assert status == 404 and body == b'{"error":"not_found"}\n'


@pytest.mark.parametrize("path", ["/v1/elsewhere", "/v1/realtime/", "/healthz", "/admin/users", "/v1/proxy", "/"])
def test_an_upgrade_to_any_other_path_is_closed_with_a_404(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for busy in (False, True):
        served, proto = _upgrade(path, monkeypatch, busy=busy)
        assert not served and proto.closed == [404] and not proto.responses


def test_a_draining_or_busy_worker_closes_a_new_session_with_a_503(monkeypatch: pytest.MonkeyPatch) -> None:
    for busy, draining in ((True, False), (False, True)):
        served, proto = _upgrade("/v1/realtime", monkeypatch, busy=busy, draining=draining)
        assert not served and proto.closed == [503] and not proto.responses
