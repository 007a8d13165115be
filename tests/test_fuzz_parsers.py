"""Hypothesis against every parser the request path runs on caller or upstream bytes, through the
real binding: request bodies of every route, the upstream HTTP/1.1 framing, the SSE reader of
every family, the translator of every entry x upstream pair. Nothing may raise beyond the
documented error, and every answer stays well-formed. (The Rust fuzz targets in core/fuzz run the
same surfaces under libFuzzer: `make fuzz`.)"""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshfast._core import Core, ResponseParser
from meshfast.secrets import new_mesh_key
from meshfast.snapshot import Config, Grant, Key, Model, Principal, Provider, encode

ROUTES = ("proxy", "embeddings", "generate", "openai_chat", "openai_responses", "anthropic", "gemini", "ollama",
          "openai_embeddings")
FAMILIES = ("anthropic", "openai", "openai_responses", "gemini", "ollama")
NOW_MS = 1_764_000_000_000

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
# Bodies that look like each API's (the right keys, arbitrary values) as well as raw bytes.
body_keys = st.sampled_from(["model", "messages", "input", "query", "content", "max_tokens", "stream", "system",
                             "tools", "contents", "prompt", "role", "type", "text", "image_url", "tool_calls"])
shaped_bodies = st.dictionaries(body_keys, json_values, max_size=6).map(lambda d: json.dumps(d).encode())
bodies = st.binary(max_size=300) | shaped_bodies


@pytest.fixture(scope="module")
def core() -> tuple[Core, str]:
    core = Core(b"f" * 32)
    token, _ = new_mesh_key()
    providers = [Provider(id=str(uuid.uuid4()), name=f"p-{f}", family=f, max_calls_per_hour=None,
                          supports_web_search=True, base_url="http://127.0.0.1:9", api_key="k", local=True)
                 for f in FAMILIES]
    kinds = ("chat", "embedding")
    models = [Model(id=str(uuid.uuid4()), name=f"m-{f}-{kind}", provider=i, resolved_model="x",
                    max_output_tokens=64, price_per_second_nano=0, kind=kind, created_ms=0, blocked=False,
                    status="active", supports_image_in=True, supports_document_in=True, supports_audio_in=True,
                    supports_video_in=True, supports_web_search=True, output_media_type=None,
                    input_price_nano_per_1k=1000, output_price_nano_per_1k=2000)
              for i, f in enumerate(FAMILIES) for kind in kinds]
    config = Config(
        seq=1, kill_switch=False,
        principals=[Principal(id=str(uuid.uuid4()), email="f@example.com", display_name="F", status="active",
                              expires_at_ms=None)],
        keys=[Key(id=str(uuid.uuid4()), principal=0, digest=core.hash_token(token), status="active",
                  expires_at_ms=None)],
        providers=providers, models=models,
        grants=[Grant(principal=0, model=m, daily_cap_nano_usd=0, max_calls_per_hour=None, allowed_from_min=None,
                      allowed_to_min=None, timezone="UTC", active_days=[], always_open=True)
                for m in range(len(models))],
    )
    core.load(encode(config))
    return core, token


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES), family=st.sampled_from(FAMILIES), kind=st.sampled_from(("chat", "embedding")),
       body=bodies)
def test_any_request_body_gets_a_decision_never_an_exception(core: tuple[Core, str], route: str, family: str,
                                                              kind: str, body: bytes) -> None:
    c, token = core
    model = f"m-{family}-{kind}"
    query = f"model={model}" if route in ("proxy", "embeddings", "generate") else ""
    p = c.prepare(route, f"Bearer {token}", None, None, query, body, len(body), NOW_MS,  # type: ignore[arg-type]
                  model if route == "gemini" else None)
    if p.status:
        assert 400 <= p.status < 600
        json.loads(p.body)  # every denial is a JSON body in the route's shape
    else:
        json.loads(p.upstream_body)  # every rendered upstream body is JSON


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=600), cut=st.integers(min_value=0, max_value=600))
def test_upstream_framing_raises_only_connection_error(data: bytes, cut: int) -> None:
    for prefix in (b"", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
                   b"HTTP/1.1 200 OK\r\ncontent-length: 40\r\n\r\n"):
        parser = ResponseParser()
        try:
            parser.feed(prefix)
            parser.feed(data[:cut])
            parser.feed(data[cut:])
            parser.eof()
        except ConnectionError:
            pass


sse_lines = st.lists(
    st.sampled_from([b"data: ", b"event: x\n", b"\n", b": ping\n", b"data: [DONE]\n", b"data: {", b"}\n\n"])
    | st.binary(max_size=40)
    | json_values.map(lambda v: b"data: " + json.dumps(v).encode() + b"\n\n"),
    max_size=20,
).map(b"".join)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(family=st.sampled_from(FAMILIES), upstream=sse_lines, size=st.integers(min_value=1, max_value=64))
def test_any_upstream_stream_yields_json_lines(core: tuple[Core, str], family: str, upstream: bytes,
                                               size: int) -> None:
    c, token = core
    body = b'{"query":"hi","max_tokens":16}'
    p = c.prepare("proxy", f"Bearer {token}", None, None, f"model=m-{family}-chat", body, len(body), NOW_MS)
    assert p.status == 0
    exchange = p.exchange()
    out = b"".join(exchange.feed(upstream[i:i + size]) for i in range(0, len(upstream), size))
    out += exchange.finish(True, False, body)[0]
    for line in out.splitlines():
        json.loads(line)
    p.settle(0)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entry=st.sampled_from(("openai_chat", "openai_responses", "anthropic", "gemini", "ollama")),
       family=st.sampled_from(FAMILIES), stream=st.booleans(), upstream=sse_lines,
       size=st.integers(min_value=1, max_value=64))
def test_any_upstream_stream_translates_without_error(core: tuple[Core, str], entry: str, family: str,
                                                      stream: bool, upstream: bytes, size: int) -> None:
    c, token = core
    bodies_by_entry = {
        "openai_chat": {"messages": [{"role": "user", "content": "hi"}]},
        "openai_responses": {"input": "hi"},
        "anthropic": {"max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
        "gemini": {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        "ollama": {"messages": [{"role": "user", "content": "hi"}]},
    }
    request = dict(bodies_by_entry[entry], model=f"m-{family}-chat")
    if entry != "gemini":
        request["stream"] = stream
    body = json.dumps(request).encode()
    p = c.prepare(entry, f"Bearer {token}", None, None, "", body, len(body), NOW_MS,  # type: ignore[arg-type]
                  f"m-{family}-chat" if entry == "gemini" else None, stream if entry == "gemini" else None)
    assert p.status == 0, p.body
    exchange = p.exchange()
    out = b"".join(exchange.feed(upstream[i:i + size]) for i in range(0, len(upstream), size))
    last = exchange.finish(False, False, body)
    out += last[0]
    if not stream and last[-1] is None:
        json.loads(out)
    p.settle(0)
