"""A caller library for meshfast's Mesh-native API (``/v1/proxy``, ``/v1/embeddings``,
``/v1/generate``, ``/v1/models``, ``/v1/usage``), sync and async.

    from meshfast.client import Client, text, image

    with Client("http://127.0.0.1:8080", api_key="mesh_live_…") as mesh:
        answer = mesh.proxy("claude", "Say hello")            # the whole answer
        print(answer.text, answer.usage.output_tokens, answer.status.limit)
        with mesh.stream("claude", content=[text("What is this?"), image(png, "image/png")]) as stream:
            for event in stream:                               # Delta, Sources
                if isinstance(event, Delta):
                    print(event.text, end="")
            print(stream.result.usage)                         # the same Result as proxy()

``AsyncClient`` has the same methods as coroutines; its ``stream`` is an ``async with`` / ``async for``.

A denial or error is raised as a :class:`MeshfastError` subclass carrying the status, the deny
reason (``code``: ``budget_exceeded``, ``model_not_permitted``, …), ``resume_at`` and
``retry_after`` when the denial ends, and the request id of its row. Every answer carries the
status headers as a :class:`Status` (the governing limit, its utilization, when it resets, a rule's
warning). Stream lines follow the Mesh SDKs: deltas and sources as they come, the final line's
usage; a stream that ends without its final line is ``incomplete``, and a line that does not parse
is skipped.

It needs ``httpx`` (``pip install 'meshfast[client]'``) and nothing of the gateway itself.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

try:
    import httpx
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("meshfast.client needs httpx: pip install 'meshfast[client]'") from exc

__all__ = [
    "AsyncClient", "AuthenticationError", "BadRequest", "Block", "Client", "Delta", "Embedding",
    "Generation", "MeshfastError", "ModelInfo", "PermissionDenied", "RateLimited", "Result", "Source",
    "Sources", "Status", "Unavailable", "UpstreamError", "Usage", "audio", "document", "image", "text",
    "video",
]

DEFAULT_MAX_TOKENS = 4096
DEFAULT_TIMEOUT_S = 120.0
GENERATE_TIMEOUT_S = 900.0


# --- content blocks --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """One content block of a ``/v1/proxy`` call: text, or media given inline (base64) or by URL."""

    type: str
    text: str | None = None
    media_type: str | None = None
    data: str | None = None
    url: str | None = None

    def to_json(self) -> dict[str, str]:
        return {k: v for k, v in (("type", self.type), ("text", self.text), ("media_type", self.media_type),
                                  ("data", self.data), ("url", self.url)) if v is not None}


def text(value: str) -> Block:
    return Block("text", text=value)


def _media(kind: str, data: bytes | str | None, media_type: str | None, url: str | None) -> Block:
    if (data is None) == (url is None):
        raise ValueError(f"a {kind} block takes data or a url, not both or neither")
    if isinstance(data, bytes):
        import base64

        data = base64.b64encode(data).decode()
    return Block(kind, media_type=media_type, data=data, url=url)


def image(data: bytes | str | None = None, media_type: str | None = None, url: str | None = None) -> Block:
    """An image: raw bytes (encoded here) or base64 text with its media type, or a URL."""
    return _media("image", data, media_type, url)


def document(data: bytes | str | None = None, media_type: str | None = None, url: str | None = None) -> Block:
    return _media("document", data, media_type, url)


def audio(data: bytes | str | None = None, media_type: str | None = None, url: str | None = None) -> Block:
    return _media("audio", data, media_type, url)


def video(data: bytes | str | None = None, media_type: str | None = None, url: str | None = None) -> Block:
    return _media("video", data, media_type, url)


# --- answers -------------------------------------------------------------------------------------


def _time(value: Any) -> dt.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Status:
    """The status headers of an answer: the limit closest to binding (``policy.daily_budget``,
    ``rule:<id>``, …), its utilization in percent, when it resets, and a rule's warning text."""

    request_id: str | None
    limit: str | None = None
    utilization: float | None = None
    reset: dt.datetime | None = None
    warning: str | None = None

    @classmethod
    def from_headers(cls, headers: httpx.Headers) -> Status:
        return cls(request_id=headers.get("x-request-id"), limit=headers.get("x-meshfast-limit"),
                   utilization=_float(headers.get("x-meshfast-utilization")),
                   reset=_time(headers.get("x-meshfast-reset")), warning=headers.get("x-meshfast-warning"))


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    web_searches: int = 0


@dataclass(frozen=True)
class Source:
    url: str
    title: str | None = None
    cited_text: str | None = None
    page_age: str | None = None


@dataclass(frozen=True)
class Delta:
    """A piece of the answer's text, as the stream delivers it."""

    text: str


@dataclass(frozen=True)
class Sources:
    """Citations found since the previous ``Sources`` event (web search)."""

    sources: list[Source]


@dataclass
class Result:
    """A whole ``/v1/proxy`` answer (or a finished stream's)."""

    id: str | None
    text: str
    usage: Usage
    status: Status
    sources: list[Source] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)
    search_suggestions_html: str | None = None
    truncated: bool = False
    incomplete: bool = False


@dataclass(frozen=True)
class Embedding:
    id: str | None
    model: str
    embedding: list[float]
    input_tokens: int
    status: Status


@dataclass(frozen=True)
class Generation:
    id: str | None
    model: str
    media_type: str | None
    output: Any
    outputs: list[Any]
    usage: dict[str, Any]
    status: Status


@dataclass(frozen=True)
class ModelInfo:
    """One entry of ``GET /v1/models``'s Mesh list."""

    model: str
    kind: str
    formats_accepted: list[str]
    status: str | None
    resume_at: dt.datetime | None
    raw: dict[str, Any]


# --- errors ------------------------------------------------------------------------------------


class MeshfastError(Exception):
    """A refusal or an error from meshfast: ``status`` (HTTP), ``code`` (the deny reason or error
    code), ``resume_at`` and ``retry_after`` (seconds) when the refusal ends by itself,
    ``request_id`` (the row in the logs) and the whole ``body``."""

    def __init__(self, status: int, code: str, body: dict[str, Any], headers: httpx.Headers) -> None:
        self.status = status
        self.code = code
        self.body = body
        self.request_id = headers.get("x-request-id")
        self.resume_at = _time(body.get("resume_at"))
        self.retry_after = _float(headers.get("retry-after"))
        self.limit = headers.get("x-meshfast-limit")
        detail = body.get("detail") or body.get("provider_message") or body.get("message")
        super().__init__(f"{status} {code}" + (f": {detail}" if detail else "")
                         + (f" (resume at {self.resume_at.isoformat()})" if self.resume_at else ""))

    @property
    def deny_reason(self) -> str:
        return self.code


class BadRequest(MeshfastError):
    """400 or 413: the call itself is wrong (``invalid_request``, ``payload_too_large``, …)."""


class AuthenticationError(MeshfastError):
    """401 ``invalid_or_revoked_key``."""


class PermissionDenied(MeshfastError):
    """403 (``model_not_permitted``, ``model_blocked``, ``outside_allowed_hours``) or 404."""


class RateLimited(MeshfastError):
    """429: a budget, an hourly cap or a rule; ``resume_at`` says when it lifts."""


class Unavailable(MeshfastError):
    """503: ``paused_by_admin``, ``server_busy``, ``provider_busy``."""


class UpstreamError(MeshfastError):
    """502 ``upstream_unavailable`` (``provider_status``, ``provider_message``) or another 5xx."""


def _error_class(status: int) -> type[MeshfastError]:
    if status == 401:
        return AuthenticationError
    if status in (403, 404):
        return PermissionDenied
    if status == 429:
        return RateLimited
    if status == 503:
        return Unavailable
    if status >= 500:
        return UpstreamError
    if status >= 400:
        return BadRequest
    return MeshfastError


def _raise_for(response: httpx.Response, body: bytes) -> None:
    if response.status_code < 400:
        return
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        parsed = {"error": "unexpected_response", "detail": body[:500].decode(errors="replace")}
    error = parsed.get("error")
    if isinstance(error, dict):  # a standard route's shape, should a base URL point there
        code = str(error.get("code") or error.get("type") or "error")
    else:
        code = str(error or "error")
    raise _error_class(response.status_code)(response.status_code, code, parsed, response.headers)


# --- the stream's lines --------------------------------------------------------------------------


class _Assembler:
    """Folds NDJSON lines into events and the final :class:`Result` (the Mesh SDKs' rules)."""

    def __init__(self, status: Status) -> None:
        self.status = status
        self.id: str | None = None
        self.parts: list[str] = []
        self.sources: dict[str, Source] = {}
        self.done: dict[str, Any] | None = None
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[Delta | Sources]:
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        events: list[Delta | Sources] = []
        for line in lines:
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def _line(self, line: bytes) -> Delta | Sources | None:
        line = line.strip()
        if not line:
            return None
        try:
            obj = json.loads(line)
        except ValueError:
            return None  # a line that does not parse is skipped
        if not isinstance(obj, dict):
            return None
        self.id = obj.get("id") or self.id
        if obj.get("done") is True:
            self.done = obj
            for raw in obj.get("sources") or []:
                self._merge(raw)
            return None
        if isinstance(obj.get("delta"), str) and obj["delta"]:
            self.parts.append(obj["delta"])
            return Delta(obj["delta"])
        if isinstance(obj.get("sources"), list):
            new = [s for s in (self._merge(raw) for raw in obj["sources"]) if s is not None]
            return Sources(new) if new else None
        return None

    def _merge(self, raw: Any) -> Source | None:
        """Sources are merged by URL, filling in missing fields; returns the merged one."""
        if not isinstance(raw, dict) or not isinstance(raw.get("url"), str):
            return None
        old = self.sources.get(raw["url"])
        merged = Source(url=raw["url"], title=(old and old.title) or raw.get("title"),
                        cited_text=(old and old.cited_text) or raw.get("cited_text"),
                        page_age=(old and old.page_age) or raw.get("page_age"))
        self.sources[raw["url"]] = merged
        return merged

    def result(self) -> Result:
        if self._buffer.strip():
            self._line(self._buffer)
            self._buffer = b""
        done = self.done or {}
        usage: dict[str, Any] = done["usage"] if isinstance(done.get("usage"), dict) else {}
        return Result(
            id=self.id, text="".join(self.parts),
            usage=Usage(int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0),
                        int(usage.get("web_searches") or 0)),
            status=self.status, sources=list(self.sources.values()), queries=list(done.get("queries") or []),
            search_suggestions_html=done.get("search_suggestions_html"), truncated=bool(done.get("truncated")),
            # A stream without its final line did not finish.
            incomplete=self.done is None or bool(done.get("incomplete")))


def _proxy_body(query: str | None, content: list[Block] | None, max_tokens: int | None,
                web_search: bool | None) -> dict[str, Any]:
    if (query is None) == (content is None):
        raise ValueError("pass a query or content blocks, not both or neither")
    body: dict[str, Any] = {"query": query} if query is not None else {
        "content": [b.to_json() if isinstance(b, Block) else b for b in content or []]}
    body["max_tokens"] = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    if web_search is not None:
        body["web_search"] = web_search
    return body


def _model_infos(body: dict[str, Any]) -> list[ModelInfo]:
    return [ModelInfo(model=m.get("model", ""), kind=m.get("kind", ""), formats_accepted=list(m.get("formats_accepted")
                      or []), status=m.get("status"), resume_at=_time(m.get("resume_at")), raw=m)
            for m in body.get("models") or []]


def _embedding(body: dict[str, Any], status: Status) -> Embedding:
    return Embedding(id=body.get("id"), model=body.get("model", ""), embedding=list(body.get("embedding") or []),
                     input_tokens=int((body.get("usage") or {}).get("input_tokens") or 0), status=status)


def _generation(body: dict[str, Any], status: Status) -> Generation:
    return Generation(id=body.get("id"), model=body.get("model", ""), media_type=body.get("media_type"),
                      output=body.get("output"), outputs=list(body.get("outputs") or []),
                      usage=dict(body.get("usage") or {}), status=status)


def _json(body: bytes) -> dict[str, Any]:
    parsed = json.loads(body)
    if not isinstance(parsed, dict):
        raise ValueError("expected a JSON object")
    return parsed


# --- sync ----------------------------------------------------------------------------------------


class _StreamBase:
    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._assembler = _Assembler(Status.from_headers(response.headers))
        self._result: Result | None = None
        self._started = False

    @property
    def status(self) -> Status:
        return self._assembler.status


class Stream(_StreamBase):
    """A ``/v1/proxy`` stream: iterate for :class:`Delta` and :class:`Sources`; ``result`` once done."""

    def __iter__(self) -> Iterator[Delta | Sources]:
        if self._started:
            return
        self._started = True
        try:
            # NOTE: decoded bytes (a proxy between may compress the stream).
            for chunk in self._response.iter_bytes():
                yield from self._assembler.feed(chunk)
        except httpx.TransportError:
            pass  # the stream was cut: the result says incomplete
        self._result = self._assembler.result()

    @property
    def result(self) -> Result:
        """The whole answer: read to the end first if nobody iterated; after a loop left early,
        what arrived (``incomplete`` unless the final line did)."""
        if self._result is None:
            for _ in self:
                pass
        if self._result is None:
            self._response.close()
            self._result = self._assembler.result()
        return self._result

    def close(self) -> None:
        self._response.close()


class _StreamContext:
    def __init__(self, client: httpx.Client, request: httpx.Request) -> None:
        self._client, self._request = client, request
        self._response: httpx.Response | None = None

    def __enter__(self) -> Stream:
        self._response = self._client.send(self._request, stream=True)
        if self._response.status_code >= 400:
            body = self._response.read()
            self._response.close()
            _raise_for(self._response, body)
        return Stream(self._response)

    def __exit__(self, *exc: object) -> None:
        if self._response is not None:
            self._response.close()


class Client:
    """The Mesh-native API over one connection pool (``httpx.Client``)."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 http: httpx.Client | None = None) -> None:
        self._http = http or httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s)
        self._http.headers["authorization"] = f"Bearer {api_key}"
        self._timeout_s = timeout_s

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, timeout_s: float | None = None, **kwargs: Any) -> tuple[bytes, Status]:
        response = self._http.request(method, path, timeout=timeout_s or self._timeout_s, **kwargs)
        _raise_for(response, response.content)
        return response.content, Status.from_headers(response.headers)

    def stream(self, model: str, query: str | None = None, *, content: list[Block] | None = None,
               max_tokens: int | None = None, web_search: bool | None = None) -> _StreamContext:
        request = self._http.build_request("POST", "/v1/proxy", params={"model": model},
                                           json=_proxy_body(query, content, max_tokens, web_search))
        return _StreamContext(self._http, request)

    def proxy(self, model: str, query: str | None = None, *, content: list[Block] | None = None,
              max_tokens: int | None = None, web_search: bool | None = None) -> Result:
        with self.stream(model, query, content=content, max_tokens=max_tokens, web_search=web_search) as stream:
            return stream.result

    def embeddings(self, model: str, input: str) -> Embedding:
        body, status = self._call("POST", "/v1/embeddings", params={"model": model}, json={"input": input})
        return _embedding(_json(body), status)

    def generate(self, model: str, prompt: str) -> Generation:
        body, status = self._call("POST", "/v1/generate", timeout_s=max(self._timeout_s, GENERATE_TIMEOUT_S),
                                  params={"model": model}, json={"prompt": prompt})
        return _generation(_json(body), status)

    def models(self) -> list[ModelInfo]:
        return _model_infos(_json(self._call("GET", "/v1/models")[0]))

    def usage(self) -> dict[str, Any]:
        """``GET /v1/usage`` as sent: ``usage`` per model and ``rules`` with their utilization."""
        return _json(self._call("GET", "/v1/usage")[0])


# --- async ---------------------------------------------------------------------------------------


class AsyncStream(_StreamBase):
    """:class:`Stream` for ``async for``."""

    async def __aiter__(self) -> AsyncIterator[Delta | Sources]:
        if self._started:
            return
        self._started = True
        try:
            async for chunk in self._response.aiter_bytes():
                for event in self._assembler.feed(chunk):
                    yield event
        except httpx.TransportError:
            pass
        self._result = self._assembler.result()

    async def result(self) -> Result:
        """As :attr:`Stream.result`."""
        if self._result is None:
            async for _ in self:
                pass
        if self._result is None:
            await self._response.aclose()
            self._result = self._assembler.result()
        return self._result


class _AsyncStreamContext:
    def __init__(self, client: httpx.AsyncClient, request: httpx.Request) -> None:
        self._client, self._request = client, request
        self._response: httpx.Response | None = None

    async def __aenter__(self) -> AsyncStream:
        self._response = await self._client.send(self._request, stream=True)
        if self._response.status_code >= 400:
            body = await self._response.aread()
            await self._response.aclose()
            _raise_for(self._response, body)
        return AsyncStream(self._response)

    async def __aexit__(self, *exc: object) -> None:
        if self._response is not None:
            await self._response.aclose()


class AsyncClient:
    """:class:`Client` on ``httpx.AsyncClient``."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 http: httpx.AsyncClient | None = None) -> None:
        self._http = http or httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout_s)
        self._http.headers["authorization"] = f"Bearer {api_key}"
        self._timeout_s = timeout_s

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, timeout_s: float | None = None,
                    **kwargs: Any) -> tuple[bytes, Status]:
        response = await self._http.request(method, path, timeout=timeout_s or self._timeout_s, **kwargs)
        _raise_for(response, response.content)
        return response.content, Status.from_headers(response.headers)

    def stream(self, model: str, query: str | None = None, *, content: list[Block] | None = None,
               max_tokens: int | None = None, web_search: bool | None = None) -> _AsyncStreamContext:
        request = self._http.build_request("POST", "/v1/proxy", params={"model": model},
                                           json=_proxy_body(query, content, max_tokens, web_search))
        return _AsyncStreamContext(self._http, request)

    async def proxy(self, model: str, query: str | None = None, *, content: list[Block] | None = None,
                    max_tokens: int | None = None, web_search: bool | None = None) -> Result:
        async with self.stream(model, query, content=content, max_tokens=max_tokens,
                               web_search=web_search) as stream:
            return await stream.result()

    async def embeddings(self, model: str, input: str) -> Embedding:
        body, status = await self._call("POST", "/v1/embeddings", params={"model": model}, json={"input": input})
        return _embedding(_json(body), status)

    async def generate(self, model: str, prompt: str) -> Generation:
        body, status = await self._call("POST", "/v1/generate", timeout_s=max(self._timeout_s, GENERATE_TIMEOUT_S),
                                        params={"model": model}, json={"prompt": prompt})
        return _generation(_json(body), status)

    async def models(self) -> list[ModelInfo]:
        return _model_infos(_json((await self._call("GET", "/v1/models"))[0]))

    async def usage(self) -> dict[str, Any]:
        return _json((await self._call("GET", "/v1/usage"))[0])
