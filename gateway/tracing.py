"""OpenTelemetry traces: a server span per API request, named and attributed per the GenAI
semantic conventions, with a child span for each stage (authentication, policy, quota, engine
or upstream, audit).

Configured by the standard OTEL_* variables (docs/operations.md, "Traces"). Without an OTLP
endpoint no provider, exporter or thread exists and every span is OpenTelemetry's non-recording
one. The W3C traceparent of a caller is the parent of the server span, and the engine or upstream
span's context goes on to the deployment in the same header.

Spans carry digests, enums and numbers only: the tenant as its keyed digest, the model only when
this gateway serves it (an unknown name is the caller's text), never prompt or completion text.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACER_NAME = "tenantgate.gateway"
# gen_ai.operation.name for each route (the conventions' well-known values).
OPERATIONS = {"chat.completions": "chat", "completions": "text_completion", "embeddings": "embeddings",
              "responses": "chat"}  # the Responses API is a chat: its operation in the conventions
PROPAGATOR = TraceContextTextMapPropagator()
# Only the caller's traceparent (hex ids and flags, checked by the propagator): its tracestate is
# free text of the caller's, which would be exported with every span.
CALLER_HEADER = b"traceparent"


class TracingError(ValueError):
    """The OTEL_* variables ask for something the gateway cannot do."""


def traces_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether OTEL_* turns tracing on: an endpoint is set, and neither OTEL_SDK_DISABLED nor
    OTEL_TRACES_EXPORTER=none turns it off. TracingError for a protocol other than http/protobuf."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    if not (environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        return False
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
    if protocol != "http/protobuf":
        raise TracingError(f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol} is not supported; use http/protobuf")
    return True


HANDOVER_SPANS = 64  # spans per batch handed to the export process (about 0.3 ms of pickling)


def tracer_provider(environ: Mapping[str, str] = os.environ):
    """An SDK TracerProvider exporting OTLP over HTTP as OTEL_* says, or None when tracing is off."""
    if not traces_enabled(environ):
        return None
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider

    from gateway.span_export import ChildSpanExporter, FlatteningSpanProcessor

    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "tenantgate"}))
    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER(_ARG)
    # The processor reads OTEL_BSP_*; the OTLP exporter, in a process of its own (span_export.py: its
    # encoding would hold this process's GIL), the endpoint, headers, timeout and compression. The
    # processor hands spans over in batches of HANDOVER_SPANS unless OTEL_BSP_MAX_EXPORT_BATCH_SIZE
    # says otherwise: each is one hold of the GIL, and the child sends what arrives together at once.
    handover = None if environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") else HANDOVER_SPANS
    provider.add_span_processor(FlatteningSpanProcessor(ChildSpanExporter(), max_export_batch_size=handover))
    return provider


def error_type(exc: BaseException) -> str:
    """error.type: a GatewayError's code (rate_limit_exceeded, policy_denied, ...), else the class name."""
    return getattr(exc, "code", None) or type(exc).__name__


class RequestTrace:
    """One request's server span, and the child spans its stages start under it."""

    def __init__(self, tracer: Tracer, span: Span) -> None:
        self.tracer = tracer
        self.span = span
        # False only when tracing is off. A span the sampler dropped still has a context, which
        # its children share and pass on (sampled flag unset), so deployments drop theirs too.
        self.traced = span.get_span_context().is_valid
        self.named = False  # by the pipeline, once it knows the operation and model
        self._context = trace.set_span_in_context(span)

    @property
    def recording(self) -> bool:
        return self.span.is_recording()

    def start(self, name: str, *, kind: SpanKind = SpanKind.INTERNAL, attributes: dict | None = None) -> Span:
        """A child span of the server span; the caller ends it (see `stage` for the common case)."""
        if not self.traced:
            return trace.INVALID_SPAN
        return self.tracer.start_span(name, context=self._context, kind=kind, attributes=attributes)

    def stage(self, name: str, **attributes) -> AbstractContextManager[Span]:
        """A child span around a block; an exception leaving it sets error.type (never its message)."""
        if not self.traced:
            return _NO_STAGE  # tracing off: not even a generator per stage
        return self._stage(name, attributes)

    @contextmanager
    def _stage(self, name: str, attributes: dict) -> Iterator[Span]:
        span = self.start(name, attributes=attributes)
        try:
            yield span
        except BaseException as exc:
            failed(span, exc)
            raise
        finally:
            span.end()

    def set(self, attributes: dict) -> None:
        """Attributes of the server span; None values are left out."""
        if self.recording:
            self.span.set_attributes({key: value for key, value in attributes.items() if value is not None})

    def name(self, operation: str, model: str | None) -> None:
        """The conventions' span name: `{gen_ai.operation.name} {gen_ai.request.model}`."""
        if self.recording:
            self.named = True
            self.span.update_name(f"{operation} {model}" if model else operation)


def failed(span: Span, exc: BaseException, *, error: bool = True) -> None:
    span.set_attribute("error.type", error_type(exc))
    if error:
        span.set_status(Status(StatusCode.ERROR))


def headers_for(span: Span) -> dict[str, str]:
    """The W3C traceparent that makes a deployment's span a child of `span`; none when tracing is off."""
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


OFF = RequestTrace(trace.NoOpTracer(), trace.INVALID_SPAN)
_NO_STAGE = nullcontext(trace.INVALID_SPAN)


def trace_of(request) -> RequestTrace:
    """The request's trace, OFF when tracing is off or the path is not traced."""
    return getattr(request.state, "trace", OFF)


def first_output(span: Span, started: float) -> None:
    """The time to first token, as an event on the engine or upstream span."""
    span.add_event("gen_ai.first_token",
                   {"gen_ai.server.time_to_first_token": round(time.perf_counter() - started, 6)})
