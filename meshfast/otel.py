"""Traces over OTLP, when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``…_TRACES_ENDPOINT``) is set.

One span per data-plane request that passed authentication, named as the GenAI semantic
conventions name a model call (``chat gpt-4o``), with their attributes (operation, provider
system, request and response model, token usage, finish reasons) and meshfast's own (route,
outcome, deny reason, status, request id). The request's phases are events on it: the body
received, admitted (authentication, policy and admission done, the upstream call begins), the
first byte to the caller. The caller's W3C trace context (``traceparent``, ``tracestate``) is the
span's parent, and the span's own context goes upstream, so a provider that traces joins the same
trace; the trace id lands in the request's row.

Standard variables configure it (the SDK reads them): ``OTEL_SERVICE_NAME`` (default
``meshfast``), ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_BSP_*``,
``OTEL_TRACES_SAMPLER``. The protocol is ``http/protobuf``; ``OTEL_SDK_DISABLED=true`` turns it
off. Off, nothing of OpenTelemetry is imported and a request costs one ``is None`` test.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("meshfast.otel")

# meshfast's provider families as the GenAI conventions name the systems.
_SYSTEMS = {"openai": "openai", "openai_responses": "openai", "anthropic": "anthropic", "gemini": "gcp.gemini",
            "ollama": "ollama"}
# The entry route's operation (gen_ai.operation.name).
_OPERATIONS = {"embeddings": "embeddings", "openai_embeddings": "embeddings", "generate": "generate_content"}


def enabled() -> bool:
    if (os.environ.get("OTEL_SDK_DISABLED") or "").strip().lower() == "true":
        return False
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


class Tracing:
    """The worker's tracer and propagator (built once, at start)."""

    def __init__(self) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
        if protocol != "http/protobuf":
            log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s: meshfast exports http/protobuf only", protocol)
        attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "meshfast"}
        self._provider = TracerProvider(resource=Resource.create(attributes))
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self._tracer = self._provider.get_tracer("meshfast")
        self._propagator = TraceContextTextMapPropagator()
        self._server = SpanKind.SERVER
        self._error = Status(StatusCode.ERROR)
        self._ok = Status(StatusCode.OK)

    @classmethod
    def from_env(cls) -> Tracing | None:
        if not enabled():
            return None
        try:
            return cls()
        except ImportError:
            log.error("OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not installed: "
                      "pip install 'meshfast[otel]'; tracing stays off")
            return None

    def start(self, headers: Any, route: str, model: str | None, start_ns: int) -> Any:
        """A request's span, its parent the caller's ``traceparent`` (if any)."""
        carrier = {}
        for name in ("traceparent", "tracestate"):
            value = headers.get(name)
            if value:
                carrier[name] = value
        parent = self._propagator.extract(carrier) if carrier else None
        operation = _OPERATIONS.get(route, "chat")
        return self._tracer.start_span(f"{operation} {model}" if model else operation, context=parent,
                                       kind=self._server, start_time=start_ns,
                                       attributes={"gen_ai.operation.name": operation, "meshfast.route": route})

    def inject(self, span: Any) -> list[tuple[str, str]]:
        """The span's context as headers for the upstream request."""
        from opentelemetry.trace import set_span_in_context

        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=set_span_in_context(span))
        return list(carrier.items())

    @staticmethod
    def trace_id(span: Any) -> str:
        return format(span.get_span_context().trace_id, "032x")

    @staticmethod
    def event(span: Any, name: str, at_ns: int) -> None:
        span.add_event(name, timestamp=at_ns)

    def finish(self, span: Any, row: Any, family: str | None, max_tokens: int | None, end_ns: int) -> None:
        """The row's facts as the conventions' attributes; the span ends."""
        attributes: dict[str, Any] = {
            "meshfast.request_id": row.request_id, "meshfast.outcome": row.outcome,
            "http.response.status_code": row.status_code,
        }
        if family:
            system = _SYSTEMS.get(family, family)
            attributes["gen_ai.system"] = system
            attributes["gen_ai.provider.name"] = system
        if row.requested_model or row.model_name:
            attributes["gen_ai.request.model"] = row.requested_model or row.model_name
        if row.model_name:
            attributes["gen_ai.response.model"] = row.model_name
        if max_tokens:
            attributes["gen_ai.request.max_tokens"] = max_tokens
        if row.outcome != "denied":
            attributes["gen_ai.usage.input_tokens"] = row.tokens_in
            attributes["gen_ai.usage.output_tokens"] = row.tokens_out
            if row.cache_read_tokens:
                attributes["gen_ai.usage.cache_read.input_tokens"] = row.cache_read_tokens
            # What the row knows of why the answer ended: its length cap, an error, or a stop.
            if row.outcome == "upstream_error":
                reason = "error"
            elif max_tokens and row.tokens_out >= max_tokens:
                reason = "length"
            else:
                reason = "stop"
            attributes["gen_ai.response.finish_reasons"] = (reason,)
        if row.deny_reason:
            attributes["meshfast.deny_reason"] = row.deny_reason
            attributes["error.type"] = row.deny_reason
        elif row.outcome == "upstream_error":
            attributes["error.type"] = str(row.status_code)
        span.set_attributes(attributes)
        span.set_status(self._ok if row.outcome == "success" else self._error)
        span.end(end_time=end_ns)

    def shutdown(self) -> None:
        self._provider.shutdown()
