"""testserve, the emulated providers: a real `python -m testserve` (Granian, RSGI) reached with httpx."""

from __future__ import annotations

import base64
import hashlib
import math
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # PYTHONSAFEPATH=1 leaves the repo root off sys.path
    sys.path.insert(0, str(REPO))

from testserve import content, media, seed  # noqa: E402
from testserve.app import scenario_for_model  # noqa: E402

SLOW_MS = 1000
HANG_S = 1.5
VIDEO_JOB_S = 1.0
HELLO = [{"role": "user", "content": "hello"}]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ts() -> Iterator[httpx.Client]:
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), TESTSERVE_SLOW_DELAY_MS=str(SLOW_MS),
               TESTSERVE_HANG_SECONDS=str(HANG_S), TESTSERVE_VIDEO_JOB_S=str(VIDEO_JOB_S),
               TESTSERVE_FLAKY_FAILURES="2", TESTSERVE_RETRY_AFTER_S="1")
    for name in ("TESTSERVE_FORCE_SCENARIO", "TESTSERVE_REQUIRE_KEY", "TESTSERVE_CHAOS_RATE",
                 "TESTSERVE_DELTA_DELAY_MS"):
        env.pop(name, None)
    proc = subprocess.Popen([sys.executable, "-m", "testserve", "--port", str(port)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if client.get("/healthz").json() == {"ok": True}:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                out = proc.stdout.read().decode() if proc.stdout else ""
                raise RuntimeError(f"testserve did not start: {out}")
            time.sleep(0.05)
        yield client
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


# --- helpers -----------------------------------------------------------------------------------

def sse(raw: bytes) -> list[tuple[str | None, str]]:
    """(event, data) per SSE event; CRLF and LF separators both accepted."""
    out = []
    for block in raw.decode().replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        event, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        out.append((event, "\n".join(data)))
    return out


def jsons(raw: bytes) -> list[dict[str, Any]]:
    return [msgspec.json.decode(d) for _, d in sse(raw) if d.startswith("{")]


def openai_text(raw: bytes) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in jsons(raw) if c.get("choices"))


def anthropic_text(raw: bytes) -> str:
    return "".join(e["delta"]["text"] for e in jsons(raw)
                   if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta")


def gemini_text(raw: bytes) -> str:
    return "".join(p.get("text", "") for c in jsons(raw) for p in c["candidates"][0]["content"]["parts"])


def expected(family: str, text: str = "hello", scenario: str = "ok") -> str:
    p = content.Prompt()
    p.add_text(text)
    return content.reply_text(family, p, scenario)


def chat(ts: httpx.Client, family: str, model: str, stream: bool = True, text: str = "hello",
         extra: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> httpx.Response:
    """One chat call in the family's request shape."""
    extra = extra or {}
    if family == "gemini":
        action = "streamGenerateContent?alt=sse" if stream else "generateContent"
        body = {"contents": [{"role": "user", "parts": [{"text": text}]}], **extra}
        return ts.post(f"/gemini/v1beta/models/{model}:{action}", json=body, headers=headers)
    if family == "openai_responses":
        body = {"model": model, "input": [{"role": "user", "content": [{"type": "input_text", "text": text}]}],
                "stream": stream, **extra}
        return ts.post("/openai/v1/responses", json=body, headers=headers)
    path = {"anthropic": "/anthropic/v1/messages", "openai": "/openai/v1/chat/completions",
            "ollama": "/ollama/v1/chat/completions", "ollama_native": "/ollama/api/chat"}[family]
    body = {"model": model, "messages": [{"role": "user", "content": text}], "stream": stream, **extra}
    if family == "anthropic":
        body["max_tokens"] = 64
    return ts.post(path, json=body, headers=headers)


STREAM_TEXT = {
    "openai": openai_text,
    "ollama": openai_text,
    "anthropic": anthropic_text,
    "gemini": gemini_text,
    "openai_responses": lambda raw: "".join(e["delta"] for e in jsons(raw)
                                            if e["type"] == "response.output_text.delta"),
    "ollama_native": lambda raw: "".join(msgspec.json.decode(line)["message"]["content"]
                                         for line in raw.splitlines() if line.strip()),
}
FAMILIES = list(STREAM_TEXT)


def delta_count(family: str, raw: bytes) -> int:
    if family in ("openai", "ollama"):
        return sum(1 for c in jsons(raw) if c.get("choices") and c["choices"][0]["delta"].get("content"))
    if family == "anthropic":
        return sum(1 for e in jsons(raw) if e["type"] == "content_block_delta")
    if family == "gemini":
        return sum(1 for c in jsons(raw) if c["candidates"][0]["content"]["parts"][0].get("text"))
    if family == "openai_responses":
        return sum(1 for e in jsons(raw) if e["type"] == "response.output_text.delta")
    return sum(1 for line in raw.splitlines() if line.strip() and not msgspec.json.decode(line)["done"])


@pytest.fixture()
def config(ts: httpx.Client) -> Iterator[Any]:
    """Changes testserve settings for one test and restores them afterwards."""
    before = ts.get("/_debug/config").json()

    def change(**settings: Any) -> None:
        assert ts.post("/_debug/config", json=settings).status_code == 200

    yield change
    ts.post("/_debug/config", json=before)
    ts.post("/_debug/scenario", json={"scenario": ""})


# --- basics and stream shapes ---------------------------------------------------------------

def test_healthz_and_index_list_the_routes(ts: httpx.Client) -> None:
    """`/healthz` is `{"ok":true}` and `/` lists every family route."""
    assert ts.get("/healthz").json() == {"ok": True}
    index = ts.get("/").json()
    assert index["service"] == "testserve"
    for route in ("/anthropic/v1/messages", "/openai/v1/chat/completions", "/openai/v1/responses",
                  "/openai/v1/embeddings", "/openai/v1/images/generations", "/ollama/api/chat",
                  "/ollama/v1/chat/completions", "/gemini/v1beta/models/{model}:streamGenerateContent",
                  "/video/v1/jobs", "/video/v1/jobs/{id}"):
        assert route in index["routes"]
    assert ts.get("/nope").status_code == 404


def test_openai_stream_ends_in_done_and_sends_usage_only_when_asked(ts: httpx.Client) -> None:
    """Role chunk, one chunk per word, finish chunk, usage chunk only with include_usage, [DONE]."""
    r = chat(ts, "openai", "dummy-chat", extra={"stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
    assert r.headers["cache-control"] == "no-cache" and r.headers["x-accel-buffering"] == "no"
    events = sse(r.content)
    assert events[-1] == (None, "[DONE]")
    chunks = jsons(r.content)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [c["choices"][0]["delta"]["content"] for c in chunks[1:4]] == ["testserve[openai] ", "ack ", "prompt<hello>"]
    assert chunks[4]["choices"][0]["finish_reason"] == "stop"
    assert chunks[5]["choices"] == [] and chunks[5]["usage"] == {"prompt_tokens": 1, "completion_tokens": 3,
                                                                  "total_tokens": 4}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    plain = jsons(chat(ts, "openai", "dummy-chat").content)
    assert not any("usage" in c for c in plain) and len(plain) == 5


def test_openai_non_stream_is_a_chat_completion(ts: httpx.Client) -> None:
    """`stream:false` gives one `chat.completion` with message content and usage."""
    body = chat(ts, "openai", "dummy-chat", stream=False).json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == expected("openai")
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}


def test_anthropic_stream_follows_the_messages_event_grammar(ts: httpx.Client) -> None:
    """message_start (input tokens) … text deltas … message_delta (output tokens), message_stop."""
    r = chat(ts, "anthropic", "dummy-chat")
    events = sse(r.content)
    names = [e for e, _ in events]
    assert names == ["message_start", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    data = jsons(r.content)
    assert all(d["type"] == e for d, e in zip(data, names, strict=True))
    assert data[0]["message"]["usage"] == {"input_tokens": 1, "output_tokens": 0}
    assert data[6]["usage"] == {"output_tokens": 3} and data[6]["delta"]["stop_reason"] == "end_turn"
    assert anthropic_text(r.content) == expected("anthropic")
    full = chat(ts, "anthropic", "dummy-chat", stream=False).json()
    assert full["type"] == "message" and full["content"] == [{"type": "text", "text": expected("anthropic")}]
    assert full["usage"] == {"input_tokens": 1, "output_tokens": 3} and full["stop_reason"] == "end_turn"


def test_gemini_stream_has_cumulative_usage_and_no_terminator(ts: httpx.Client) -> None:
    """One chunk per word, candidatesTokenCount = i+1, finishReason on the last chunk, no [DONE]."""
    r = chat(ts, "gemini", "dummy-chat")
    assert b"\r\n\r\n" in r.content and b"[DONE]" not in r.content
    chunks = jsons(r.content)
    assert [c["usageMetadata"]["candidatesTokenCount"] for c in chunks] == [1, 2, 3]
    assert all(c["modelVersion"] == "testserve" for c in chunks)
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    assert gemini_text(r.content) == expected("gemini")
    full = chat(ts, "gemini", "dummy-chat", stream=False).json()
    assert full["candidates"][0]["content"]["parts"] == [{"text": expected("gemini")}]
    assert full["usageMetadata"] == {"promptTokenCount": 1, "candidatesTokenCount": 3, "totalTokenCount": 4}


def test_responses_stream_ends_in_response_completed_with_usage(ts: httpx.Client) -> None:
    """created, in_progress, item/part added, output_text deltas, done events, response.completed."""
    r = chat(ts, "openai_responses", "dummy-chat")
    data = jsons(r.content)
    kinds = [d["type"] for d in data]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    assert [e for e, _ in sse(r.content)] == kinds
    usage = data[-1]["response"]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (1, 3, 4)
    assert STREAM_TEXT["openai_responses"](r.content) == expected("openai_responses")
    full = chat(ts, "openai_responses", "dummy-chat", stream=False).json()
    assert full["object"] == "response" and full["status"] == "completed"
    assert full["output"][0]["content"][0]["text"] == expected("openai_responses")


def test_ollama_native_streams_ndjson_and_ends_with_counts(ts: httpx.Client) -> None:
    """`/ollama/api/chat` streams NDJSON by default; the last object has done:true and eval counts."""
    r = chat(ts, "ollama_native", "dummy-chat", stream=True)
    assert r.headers["content-type"] == "application/x-ndjson"
    lines = [msgspec.json.decode(line) for line in r.content.splitlines()]
    assert [x["done"] for x in lines] == [False, False, False, True]
    assert lines[-1]["prompt_eval_count"] == 1 and lines[-1]["eval_count"] == 3
    assert STREAM_TEXT["ollama_native"](r.content) == expected("ollama")
    default = ts.post("/ollama/api/chat", json={"model": "dummy-chat", "messages": HELLO})
    assert len(default.content.splitlines()) == 4
    full = chat(ts, "ollama_native", "dummy-chat", stream=False).json()
    assert full["done"] is True and full["message"]["content"] == expected("ollama")


def test_ollama_openai_route_refuses_blocks_other_than_text_and_image(ts: httpx.Client) -> None:
    """The Ollama OpenAI-compatible route is 400 for a file block, OpenAI-shaped otherwise."""
    r = chat(ts, "ollama", "dummy-chat")
    assert openai_text(r.content) == expected("ollama") and sse(r.content)[-1][1] == "[DONE]"
    bad = ts.post("/ollama/v1/chat/completions", json={"model": "dummy-chat", "messages": [{"role": "user", "content": [
        {"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,QQ=="}}]}]})
    assert bad.status_code == 400 and "message" in bad.json()["error"]


def test_media_blocks_are_described_and_counted(ts: httpx.Client) -> None:
    """An inline PNG becomes `image(image/png,70B,<sha16>)` and costs 100 input tokens."""
    png_b64 = base64.b64encode(media.PNG).decode()
    sha = hashlib.sha256(media.PNG).hexdigest()[:16]
    body = {"model": "dummy-chat", "max_tokens": 16, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hello"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png_b64}}]}]}
    full = ts.post("/anthropic/v1/messages", json=body).json()
    assert full["content"][0]["text"] == f"testserve[anthropic] ack prompt<hello> image(image/png,70B,{sha})"
    assert full["usage"]["input_tokens"] == 101
    empty = ts.post("/openai/v1/chat/completions", json={"model": "dummy-chat", "messages": []}).json()
    assert empty["choices"][0]["message"]["content"] == "testserve[openai] ack empty-content"


# --- scenarios ----------------------------------------------------------------------------------

def test_scenario_is_the_longest_matching_model_suffix() -> None:
    """`-error-500` wins over shorter suffixes; unknown names are `ok`."""
    assert scenario_for_model("dummy-error-500") == "error-500"
    assert scenario_for_model("dummy-conn-reset") == "conn-reset"
    assert scenario_for_model("dummy-chat") == "ok"
    assert scenario_for_model("my-model-huge") == "huge"


ERROR_SHAPES = {
    "openai": lambda b: b["error"]["message"] and b["error"]["type"],
    "anthropic": lambda b: b["type"] == "error" and b["error"]["message"],
    "gemini": lambda b: b["error"]["message"] and b["error"]["status"],
    "openai_responses": lambda b: b["error"]["message"],
    "ollama_native": lambda b: isinstance(b["error"], str),
}


@pytest.mark.parametrize("family", list(ERROR_SHAPES))
@pytest.mark.parametrize(("scenario", "status"), [("error-400", 400), ("error-429", 429), ("error-500", 500)])
def test_error_scenarios_answer_in_the_family_error_shape(ts: httpx.Client, family: str, scenario: str,
                                                          status: int) -> None:
    """error-N gives status N in the family's shape; 429 carries Retry-After."""
    r = chat(ts, family, f"dummy-{scenario}")
    assert r.status_code == status
    assert ERROR_SHAPES[family](r.json())
    if status == 429:
        assert r.headers["retry-after"] == "1"
    else:
        assert "retry-after" not in r.headers


def test_flaky_fails_twice_per_model_then_succeeds(ts: httpx.Client) -> None:
    """503 overloaded for the first two calls of a model, then a normal stream."""
    statuses = [chat(ts, "openai", "flakytest-a-flaky").status_code for _ in range(3)]
    assert statuses == [503, 503, 200]
    assert chat(ts, "openai", "flakytest-b-flaky").status_code == 503  # counted per model
    assert chat(ts, "anthropic", "flakytest-c-flaky").json()["error"]["type"] == "overloaded_error"


def test_slow_and_hang_delay_the_first_byte(ts: httpx.Client) -> None:
    """slow waits TESTSERVE_SLOW_DELAY_MS, hang waits TESTSERVE_HANG_SECONDS, then answer."""
    started = time.monotonic()
    assert chat(ts, "openai", "dummy-slow").status_code == 200
    assert time.monotonic() - started >= SLOW_MS / 1000
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        ts.post("/openai/v1/chat/completions", json={"model": "dummy-hang", "messages": HELLO}, timeout=0.5)
    time.sleep(0.2)
    assert ts.get("/_debug/stats").json()["in_flight"] == 0  # the abandoned hang stopped waiting
    started = time.monotonic()
    r = chat(ts, "anthropic", "dummy-hang")
    assert r.status_code == 200 and time.monotonic() - started >= HANG_S


@pytest.mark.parametrize("family", FAMILIES)
def test_conn_reset_breaks_the_stream_after_two_deltas(ts: httpx.Client, family: str) -> None:
    """The client gets two deltas and then an incomplete body, never a clean end."""
    received = b""
    with pytest.raises(httpx.RemoteProtocolError):
        model = "dummy-conn-reset"
        if family == "gemini":
            req = ts.build_request("POST", f"/gemini/v1beta/models/{model}:streamGenerateContent?alt=sse",
                                   json={"contents": [{"role": "user", "parts": [{"text": "a b c d e"}]}]})
        else:
            req = chat_request(ts, family, model, "a b c d e")
        r = ts.send(req, stream=True)
        try:
            for chunk in r.iter_bytes():
                received += chunk
        finally:
            r.close()
    assert delta_count(family, received) == 2
    with pytest.raises(httpx.RemoteProtocolError):
        chat(ts, "openai", "dummy-conn-reset", stream=False)


def chat_request(ts: httpx.Client, family: str, model: str, text: str) -> httpx.Request:
    path = {"anthropic": "/anthropic/v1/messages", "openai": "/openai/v1/chat/completions",
            "ollama": "/ollama/v1/chat/completions", "ollama_native": "/ollama/api/chat",
            "openai_responses": "/openai/v1/responses"}[family]
    key = "input" if family == "openai_responses" else "messages"
    return ts.build_request("POST", path, json={"model": model, "stream": True,
                                                key: [{"role": "user", "content": text}]})


def test_badjson_sends_unparseable_payloads(ts: httpx.Client) -> None:
    """OpenAI gets `data: {this is not json` then [DONE]; others only the bad line; non-stream too."""
    r = chat(ts, "openai", "dummy-badjson")
    assert r.status_code == 200 and sse(r.content) == [(None, "{this is not json"), (None, "[DONE]")]
    assert sse(chat(ts, "anthropic", "dummy-badjson").content) == [(None, "{this is not json")]
    with pytest.raises(ValueError):
        chat(ts, "openai", "dummy-badjson", stream=False).json()


def test_nousage_omits_usage_in_every_family(ts: httpx.Client) -> None:
    """No usage chunk (even with include_usage), no message_delta usage, no usageMetadata."""
    r = chat(ts, "openai", "dummy-nousage", extra={"stream_options": {"include_usage": True}})
    assert not any(c.get("usage") for c in jsons(r.content)) and openai_text(r.content)
    anth = jsons(chat(ts, "anthropic", "dummy-nousage").content)
    assert not any("usage" in e.get("message", e) for e in anth)
    assert not any("usageMetadata" in c for c in jsons(chat(ts, "gemini", "dummy-nousage").content))
    assert "usage" not in chat(ts, "openai", "dummy-nousage", stream=False).json()
    last = msgspec.json.decode(chat(ts, "ollama_native", "dummy-nousage").content.splitlines()[-1])
    assert last["done"] and "eval_count" not in last


def test_empty_sends_no_deltas(ts: httpx.Client) -> None:
    """Zero deltas, still a proper end; Gemini sends one chunk with empty text."""
    r = chat(ts, "openai", "dummy-empty", extra={"stream_options": {"include_usage": True}})
    assert openai_text(r.content) == "" and sse(r.content)[-1][1] == "[DONE]"
    assert jsons(r.content)[-1]["usage"]["completion_tokens"] == 0
    anth = chat(ts, "anthropic", "dummy-empty")
    assert delta_count("anthropic", anth.content) == 0 and sse(anth.content)[-1][0] == "message_stop"
    gem = jsons(chat(ts, "gemini", "dummy-empty").content)
    assert len(gem) == 1 and gem[0]["candidates"][0]["content"]["parts"] == [{"text": ""}]


@pytest.mark.parametrize("family", FAMILIES)
def test_unicode_arrives_byte_exact(ts: httpx.Client, family: str) -> None:
    """Emoji, CJK and accents survive every family's framing exactly."""
    label = "ollama" if family == "ollama_native" else family
    text = STREAM_TEXT[family](chat(ts, family, "dummy-unicode", text="héllo 世界").content)
    assert text == expected(label, "héllo 世界", "unicode")
    assert "🚀" in text and "日本語" in text and "café" in text


def test_huge_sends_two_hundred_times_the_deltas(ts: httpx.Client) -> None:
    """`hello` is 3 deltas; with -huge it is 600, and output tokens say so."""
    r = chat(ts, "anthropic", "dummy-huge")
    assert delta_count("anthropic", r.content) == 600
    assert jsons(r.content)[-2]["usage"]["output_tokens"] == 600
    assert anthropic_text(r.content) == expected("anthropic", scenario="huge")
    assert delta_count("openai", chat(ts, "openai", "dummy-huge").content) == 600


def test_keepalive_adds_blank_data_lines_and_anthropic_pings(ts: httpx.Client) -> None:
    """A blank `data:` before every third delta; Anthropic also sends `event: ping`."""
    r = chat(ts, "openai", "dummy-keepalive", text="a b c d e")  # 7 deltas → before 0, 3, 6
    assert r.content.count(b"data:\n\n") == 3
    assert openai_text(r.content) == expected("openai", "a b c d e")
    anth = chat(ts, "anthropic", "dummy-keepalive", text="a b c d e")
    assert [e for e, _ in sse(anth.content)].count("ping") == 3
    assert anth.content.count(b"data:\n\n") == 3


def test_customdone_replaces_the_done_line(ts: httpx.Client) -> None:
    """OpenAI ends with `data: END_OF_STREAM` instead of [DONE]; Anthropic appends it."""
    r = chat(ts, "openai", "dummy-customdone")
    assert sse(r.content)[-1] == (None, "END_OF_STREAM") and b"[DONE]" not in r.content
    assert sse(chat(ts, "anthropic", "dummy-customdone").content)[-1] == (None, "END_OF_STREAM")


def test_scenario_override_wins_over_the_model_suffix(ts: httpx.Client, config: Any) -> None:
    """POST /_debug/scenario forces a scenario for every model until cleared."""
    assert ts.post("/_debug/scenario", json={"scenario": "error-500"}).json() == {"scenario": "error-500"}
    assert chat(ts, "openai", "dummy-chat").status_code == 500
    assert ts.post("/_debug/scenario", json={"scenario": "bogus"}).status_code == 400
    ts.post("/_debug/scenario", json={"scenario": ""})
    assert chat(ts, "openai", "dummy-chat").status_code == 200


def test_require_key_refuses_a_wrong_key_in_the_family_shape(ts: httpx.Client, config: Any) -> None:
    """With require_key, a missing or wrong key is 401; the right key in any header works."""
    config(require_key=True, api_key="sekrit")
    r = chat(ts, "anthropic", "dummy-chat", headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert chat(ts, "gemini", "dummy-chat").json()["error"]["status"] == "UNAUTHENTICATED"
    assert chat(ts, "openai", "dummy-chat", headers={"authorization": "Bearer sekrit"}).status_code == 200
    assert chat(ts, "gemini", "dummy-chat", headers={"x-goog-api-key": "sekrit"}).status_code == 200


def test_chaos_rate_one_fails_every_call(ts: httpx.Client, config: Any) -> None:
    """TESTSERVE_CHAOS_RATE=1 turns every provider call into 500 chaos_error."""
    config(chaos_rate=1.0)
    r = chat(ts, "openai", "dummy-chat")
    assert r.status_code == 500 and r.json()["error"]["type"] == "chaos_error"


def test_delta_delay_spaces_deltas_and_stats_count_in_flight(ts: httpx.Client, config: Any) -> None:
    """TESTSERVE_DELTA_DELAY_MS slows streams; /_debug/stats sees the concurrent ones."""
    config(delta_delay_ms=300)
    ts.delete("/_debug/requests")
    results: list[int] = []

    def one() -> None:
        with httpx.Client(base_url=str(ts.base_url)) as c:
            results.append(delta_count("openai", chat(c, "openai", "dummy-chat").content))

    threads = [threading.Thread(target=one) for _ in range(4)]
    started = time.monotonic()
    for t in threads:
        t.start()
    # NOTE: polled, not sampled once: on a loaded machine the four may take a moment to start;
    # each stays in flight for at least 0.6 s (three deltas 300 ms apart).
    mid = ts.get("/_debug/stats").json()
    while mid["in_flight"] < 4 and any(t.is_alive() for t in threads):
        time.sleep(0.02)
        mid = ts.get("/_debug/stats").json()
    for t in threads:
        t.join()
    assert time.monotonic() - started >= 0.6 and results == [3, 3, 3, 3]
    assert mid["in_flight"] == 4
    stats = ts.get("/_debug/stats").json()
    assert stats["total"] == 4 and stats["peak_in_flight"] == 4 and stats["in_flight"] == 0
    assert {"started_at", "uptime_seconds", "requests_per_second"} <= set(stats)


# --- tools and web search -------------------------------------------------------------------------

WEATHER_OPENAI = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"]}}}]


def test_openai_streams_a_tool_call_in_argument_deltas(ts: httpx.Client) -> None:
    """"call tool" with tools → tool_calls deltas (id, name, arguments in pieces), finish tool_calls."""
    r = chat(ts, "openai", "dummy-chat", text="please call tool now", extra={"tools": WEATHER_OPENAI})
    chunks = [c for c in jsons(r.content) if c.get("choices")]
    first = chunks[0]["choices"][0]["delta"]["tool_calls"][0]
    assert first["id"].startswith("call_") and first["function"] == {"name": "get_weather", "arguments": ""}
    pieces = [c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
              for c in chunks[1:] if "tool_calls" in c["choices"][0]["delta"]]
    assert len(pieces) >= 2
    assert msgspec.json.decode("".join(pieces)) == {"city": "testserve", "days": 1}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    forced = chat(ts, "openai", "dummy-chat", stream=False, extra={
        "tools": WEATHER_OPENAI, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}).json()
    call = forced["choices"][0]["message"]["tool_calls"][0]
    assert forced["choices"][0]["finish_reason"] == "tool_calls" and call["function"]["name"] == "get_weather"
    plain = chat(ts, "openai", "dummy-chat", extra={"tools": WEATHER_OPENAI})
    assert openai_text(plain.content) == expected("openai")


def test_anthropic_and_gemini_stream_tool_calls_in_their_shapes(ts: httpx.Client) -> None:
    """Anthropic: tool_use block + input_json_delta, stop_reason tool_use; Gemini: functionCall part."""
    tools = [{"name": "get_weather", "input_schema": WEATHER_OPENAI[0]["function"]["parameters"]}]
    events = jsons(chat(ts, "anthropic", "dummy-chat", text="call tool", extra={"tools": tools}).content)
    assert events[1]["content_block"]["type"] == "tool_use" and events[1]["content_block"]["name"] == "get_weather"
    partial = "".join(e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta")
    assert msgspec.json.decode(partial) == {"city": "testserve", "days": 1}
    assert [e for e in events if e["type"] == "message_delta"][0]["delta"]["stop_reason"] == "tool_use"
    gtools = [{"functionDeclarations": [{"name": "get_weather", "parameters": {
        "type": "OBJECT", "properties": {"city": {"type": "STRING"}}}}]}]
    chunks = jsons(chat(ts, "gemini", "dummy-chat", text="call tool", extra={"tools": gtools}).content)
    assert chunks[-1]["candidates"][0]["content"]["parts"] == [
        {"functionCall": {"name": "get_weather", "args": {"city": "testserve"}}}]


def test_web_search_returns_citations_in_each_family_shape(ts: httpx.Client) -> None:
    """Anthropic result block + citations_delta; OpenAI url_citation; Responses annotation + call; Gemini grounding."""
    anth = jsons(chat(ts, "anthropic", "dummy-chat", extra={
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]}).content)
    starts = [e["content_block"]["type"] for e in anth if e["type"] == "content_block_start"]
    assert starts == ["server_tool_use", "web_search_tool_result", "text"]
    result = next(e for e in anth if e["type"] == "content_block_start"
                  and e["content_block"]["type"] == "web_search_tool_result")
    assert result["content_block"]["content"][0]["type"] == "web_search_result"
    assert any(e["type"] == "content_block_delta" and e["delta"]["type"] == "citations_delta" for e in anth)
    assert next(e for e in anth if e["type"] == "message_delta")["usage"]["server_tool_use"] == {
        "web_search_requests": 1}

    oai = jsons(chat(ts, "openai", "dummy-chat", extra={"web_search_options": {}}).content)
    notes = [a for c in oai if c.get("choices") for a in c["choices"][0]["delta"].get("annotations", [])]
    assert notes and notes[0]["type"] == "url_citation" and notes[0]["url_citation"]["url"].startswith("https://")

    resp = jsons(chat(ts, "openai_responses", "dummy-chat", extra={"tools": [{"type": "web_search"}]}).content)
    kinds = [e["type"] for e in resp]
    assert "response.output_text.annotation.added" in kinds
    added = [e["item"] for e in resp if e["type"] == "response.output_item.added"]
    assert added[0]["type"] == "web_search_call" and added[0]["action"]["query"] == "hello"

    gem = jsons(chat(ts, "gemini", "dummy-chat", extra={"tools": [{"google_search": {}}]}).content)
    grounding = gem[-1]["candidates"][0]["groundingMetadata"]
    assert grounding["webSearchQueries"] == ["hello"] and grounding["groundingChunks"][0]["web"]["uri"]


# --- embeddings, images, video ------------------------------------------------------------------

def test_embeddings_are_deterministic_unit_vectors(ts: httpx.Client) -> None:
    """OpenAI `data[i].embedding` + usage for string or list input; Gemini `embedding.values`."""
    one = ts.post("/openai/v1/embeddings", json={"model": "dummy-embed", "input": "The quick brown fox"}).json()
    vec = one["data"][0]["embedding"]
    assert len(vec) == 16 and math.isclose(math.sqrt(sum(v * v for v in vec)), 1, abs_tol=1e-4)
    assert one["usage"]["prompt_tokens"] == 4 and vec == content.embedding("The quick brown fox", 16)
    many = ts.post("/openai/v1/embeddings", json={"model": "dummy-embed", "input": ["a", "The quick brown fox"]})
    assert [d["index"] for d in many.json()["data"]] == [0, 1] and many.json()["data"][1]["embedding"] == vec
    gem = ts.post("/gemini/v1beta/models/dummy-embed:embedContent",
                  json={"content": {"parts": [{"text": "The quick brown fox"}]}}).json()
    assert gem == {"embedding": {"values": vec}}
    bad = ts.post("/openai/v1/embeddings", json={"model": "dummy-badjson", "input": "x"}).json()
    assert not isinstance(bad["data"][0]["embedding"], list)


def test_images_are_a_one_pixel_png(ts: httpx.Client) -> None:
    """OpenAI `data[0].b64_json` and Gemini `:predict` give the 70-byte PNG; a video model gives MP4."""
    r = ts.post("/openai/v1/images/generations", json={"model": "dummy-image", "prompt": "a lighthouse", "n": 1})
    png = base64.b64decode(r.json()["data"][0]["b64_json"])
    assert png.startswith(b"\x89PNG") and len(png) == 70
    pred = ts.post("/gemini/v1beta/models/dummy-image:predict", json={"instances": [{"prompt": "x"}]}).json()
    assert pred["predictions"][0]["mimeType"] == "image/png"
    vid = ts.post("/gemini/v1beta/models/dummy-video:predict", json={"instances": [{"prompt": "x"}]}).json()
    assert base64.b64decode(vid["predictions"][0]["bytesBase64Encoded"])[4:8] == b"ftyp"
    assert ts.post("/openai/v1/images/generations", json={"model": "dummy-badjson"}).json() == {"broken": True}


def test_video_job_goes_queued_running_completed_then_serves_mp4(ts: httpx.Client) -> None:
    """Submit → queued; polls see running then completed within TESTSERVE_VIDEO_JOB_S; content is MP4."""
    job = ts.post("/video/v1/jobs", json={"model": "dummy-video", "prompt": "waves"}).json()
    assert job["status"] == "queued" and job["id"]
    assert ts.get(f"/video/v1/jobs/{job['id']}/content").status_code == 409
    seen = []
    deadline = time.monotonic() + VIDEO_JOB_S + 2
    while time.monotonic() < deadline:
        status = ts.get(f"/video/v1/jobs/{job['id']}").json()["status"]
        if not seen or seen[-1] != status:
            seen.append(status)
        if status == "completed":
            break
        time.sleep(0.1)
    assert seen in (["queued", "running", "completed"], ["running", "completed"])
    mp4 = ts.get(f"/video/v1/jobs/{job['id']}/content")
    assert mp4.headers["content-type"] == "video/mp4" and mp4.content[4:8] == b"ftyp"
    failed = ts.post("/video/v1/jobs", json={"model": "dummy-video-failed", "prompt": "x"}).json()
    time.sleep(VIDEO_JOB_S + 0.1)
    assert ts.get(f"/video/v1/jobs/{failed['id']}").json()["status"] == "failed"
    assert ts.get("/video/v1/jobs/vj_nope").status_code == 404


# --- debug API and seed -------------------------------------------------------------------------

def test_debug_log_flags_leaked_keys_and_unrendered_placeholders(ts: httpx.Client) -> None:
    """Each call is captured with the key presented, a leak flag and a placeholder flag."""
    assert ts.delete("/_debug/requests").json() == {"ok": True}
    chat(ts, "openai", "dummy-chat", headers={"authorization": "Bearer k-123"})
    clean = ts.get("/_debug/last").json()
    assert clean["key_presented"] == "k-123" and clean["model"] == "dummy-chat"
    assert clean["key_leaked_in_body"] is False and clean["placeholders_left"] is False
    assert clean["body"]["messages"] == HELLO and clean["headers"]["authorization"] == "Bearer k-123"
    ts.post("/anthropic/v1/messages", headers={"x-api-key": "k-456"},
            json={"model": "dummy-leak", "messages": [{"role": "user", "content": "my key is k-456"}]})
    leak = ts.get("/_debug/last").json()
    assert leak["key_leaked_in_body"] is True and leak["placeholders_left"] is False
    ts.post("/gemini/v1beta/models/{{model}}:generateContent",
            json={"contents": [{"role": "user", "parts": "{{content_json}}"}]})
    left = ts.get("/_debug/last").json()
    assert left["placeholders_left"] is True and set(left["placeholders_found"]) == {"{{content_json}}", "{{model}}"}
    log = ts.get("/_debug/requests", params={"model": "dummy-leak"}).json()
    assert log["count"] == 1 and log["entries"][0]["path"] == "/anthropic/v1/messages"
    assert ts.get("/_debug/requests", params={"path": "gemini"}).json()["count"] == 1
    assert ts.get("/_debug/requests").json()["entries"][0]["seq"] == left["seq"]
    assert ts.get("/_debug/stats").json()["total"] == 3


def test_seed_points_every_family_at_testserve() -> None:
    """Seed payloads: one provider per family, local, testserve key, chat and scenario models."""
    providers = seed.demo_providers(9123)
    assert {p["family"] for p in providers} == {"openai", "anthropic", "gemini", "ollama", "openai_responses"}
    for p in providers:
        assert p["local"] is True and p["api_key"] == "testserve-key" and p["verify"] is False
        assert p["base_url"].startswith("http://127.0.0.1:9123/")
        names = {m["name"]: m["resolved_model"] for m in p["models"]}
        short = "responses" if p["family"] == "openai_responses" else p["family"]
        assert names[f"ts-{short}"] == "dummy-chat" and names[f"ts-{short}-huge"] == "dummy-huge"
        for m in p["models"]:
            assert m["kind"] in ("chat", "embedding", "image_generation", "video_generation")
            assert scenario_for_model(m["resolved_model"]) in ("ok", m["name"].split(f"ts-{short}-")[-1])
