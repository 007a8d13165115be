"""OpenTelemetry: with OTEL_EXPORTER_OTLP_ENDPOINT set (http/protobuf), a real gateway sends a span
per request to a local OTLP receiver: the GenAI conventions' name and attributes, the phases as
events, the caller's W3C trace context as its parent, that context passed upstream, and the trace
id in the request's row. Without the variable nothing is traced."""

from __future__ import annotations

import http.server
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import EmulatedProviders, Gateway, tag, until
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1: decodes every export into spans."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.resources: list[dict[str, Any]] = []
        self.content_types: set[str] = set()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                receiver.content_types.add(self.headers.get("content-type") or "")
                if self.path == "/v1/traces":
                    request = ExportTraceServiceRequest.FromString(body)
                    for resource_spans in request.resource_spans:
                        receiver.resources.append({a.key: a.value.string_value
                                                   for a in resource_spans.resource.attributes})
                        for scope_spans in resource_spans.scope_spans:
                            receiver.spans.extend(scope_spans.spans)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def _attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in span.attributes:
        v = a.value
        kind = v.WhichOneof("value")
        out[a.key] = list(x.string_value for x in v.array_value.values) if kind == "array_value" else getattr(v, kind)
    return out


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Receiver]]:
    receiver = Receiver()
    gw = Gateway(Path(tmp_path_factory.mktemp("otel")) / "data", workers=2, env={
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_SERVICE_NAME": "meshfast-test"}).start()
    try:
        yield gw, receiver
    finally:
        gw.stop()
        receiver.close()


def test_a_traced_call_reaches_the_collector_with_its_parent_and_the_conventions(
        traced: tuple[Gateway, Receiver], testserve: EmulatedProviders) -> None:
    gw, receiver = traced
    name = f"ot-{tag()}"
    provider = gw.create_provider(name, family="anthropic", base_url=f"{testserve.base_url}/anthropic",
                                  api_key="testserve-key")
    model = gw.create_model(provider["id"], name, resolved_model="dummy-ok",
                            input_price_per_1k_tokens="0", output_price_per_1k_tokens="1")
    user = gw.create_user()
    gw.grant(user["id"], model["id"])
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    testserve.client.delete("/_debug/requests")
    response = gw.client.post("/v1/messages", json={
        "model": name, "max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]},
        headers={"x-api-key": user["key"], "anthropic-version": "2023-06-01",
                 "traceparent": f"00-{trace_id}-{parent_id}-01"})
    assert response.status_code == 200, response.text
    rid = response.headers["x-request-id"]

    span = until(lambda: next((s for s in receiver.spans if _attributes(s).get("meshfast.request_id") == rid), None),
                 10, "the request's span")
    assert span.trace_id.hex() == trace_id and span.parent_span_id.hex() == parent_id
    assert span.name == f"chat {name}" and span.kind == 2  # SERVER
    attributes = _attributes(span)
    usage = response.json()["usage"]
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.system"] == attributes["gen_ai.provider.name"] == "anthropic"
    assert attributes["gen_ai.request.model"] == attributes["gen_ai.response.model"] == name
    assert attributes["gen_ai.usage.input_tokens"] == usage["input_tokens"]
    assert attributes["gen_ai.usage.output_tokens"] == usage["output_tokens"]
    assert attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert attributes["meshfast.outcome"] == "success" and attributes["http.response.status_code"] == 200
    events = [e.name for e in span.events]
    assert events[:2] == ["meshfast.received", "meshfast.admitted"]
    assert span.start_time_unix_nano <= span.events[0].time_unix_nano <= span.end_time_unix_nano
    assert {"service.name": "meshfast-test"}.items() <= receiver.resources[-1].items()
    assert any("protobuf" in c for c in receiver.content_types)

    # The span's own context went upstream: same trace, the gateway's span as the parent.
    sent = [r for r in testserve.requests() if r["model"] == "dummy-ok"]
    traceparent = sent[-1]["headers"].get("traceparent")
    assert traceparent == f"00-{trace_id}-{span.span_id.hex()}-01", sent[-1]["headers"]
    assert gw.fetch_row(rid)["trace_id"] == trace_id


def test_a_denied_call_is_a_span_with_its_reason_and_an_unknown_key_is_none(
        traced: tuple[Gateway, Receiver], testserve: EmulatedProviders) -> None:
    gw, receiver = traced
    user = gw.create_user()
    response = gw.client.post("/v1/proxy", params={"model": f"ot-missing-{tag()}"}, json={"query": "x"},
                              headers={"authorization": f"Bearer {user['key']}"})
    assert response.status_code == 403
    rid = response.headers["x-request-id"]
    span = until(lambda: next((s for s in receiver.spans if _attributes(s).get("meshfast.request_id") == rid), None),
                 10, "the denial's span")
    attributes = _attributes(span)
    assert attributes["meshfast.deny_reason"] == attributes["error.type"] == "model_not_permitted"
    assert span.status.code == 2  # ERROR
    assert gw.fetch_row(rid)["trace_id"] == span.trace_id.hex()
    # Unauthenticated work costs nothing, a span included.
    before = len(receiver.spans)
    bad = gw.client.post("/v1/proxy", params={"model": "x"}, json={"query": "x"},
                         headers={"authorization": "Bearer mesh_live_" + "x" * 43})
    assert bad.status_code == 401
    time.sleep(0.5)
    assert not any(_attributes(s).get("meshfast.request_id") == bad.headers["x-request-id"]
                   for s in receiver.spans[before:])


def test_without_the_variable_nothing_is_traced(gateway: Gateway, testserve: EmulatedProviders) -> None:
    """The shared gateway runs without OTEL_*: rows carry no trace id and OpenTelemetry is not loaded."""
    name = f"ot-off-{tag()}"
    provider = gateway.create_provider(name, base_url=f"{testserve.base_url}/openai", api_key="testserve-key")
    model = gateway.create_model(provider["id"], name, resolved_model="dummy-chat")
    user = gateway.create_user()
    gateway.grant(user["id"], model["id"])
    response = gateway.client.post("/v1/proxy", params={"model": name}, json={"query": "x"},
                                   headers={"authorization": f"Bearer {user['key']}",
                                            "traceparent": f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"})
    assert response.status_code == 200
    assert gateway.fetch_row(response.headers["x-request-id"])["trace_id"] is None
