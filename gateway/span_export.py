"""Span export in a process of its own, so that encoding spans never holds the gateway's GIL.

The OTLP exporter builds a protobuf message per span and per attribute in Python: on the traced
gateway that was a fifth of the process's CPU, on the span processor's thread, holding the GIL
while the event loop waited for it (a request could wait up to the interpreter's switch interval,
5 ms, each time it needed the GIL back). Here the processor's thread only flattens each batch into
plain values and pickles it to a child process, which rebuilds the spans and runs the OTLP exporter
as the OTEL_* variables configure it (it inherits them).

The pipe is bounded: when the child falls behind, a write blocks the processor's thread (not the
loop; it waits outside the GIL), and the processor drops spans once its own queue is full, as it
would with a slow collector. A child that died is started again at the next batch. force_flush
waits until the child has exported everything written before it; shutdown closes the pipe and
waits for the child to export the rest and exit.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO, BinaryIO

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

logger = logging.getLogger("tenantgate.tracing")

_FRAME = struct.Struct("<I")  # the length of the pickled batch that follows; 0: a flush request
_FLUSHED = b"\x01"
# The child sends what arrives together in one request of at most this many spans (the SDK's own
# batch size): the gateway hands spans over in smaller batches, each a shorter hold of its GIL.
EXPORT_SPANS = 512
_START = [sys.executable, "-P", "-m", "gateway.span_export"]


class ChildSpanExporter(SpanExporter):
    """Hands each batch to a child process that exports it over OTLP/HTTP."""

    def __init__(self, command: Sequence[str] = tuple(_START), shutdown_timeout_s: float = 30.0) -> None:
        self._command = list(command)
        self._shutdown_timeout_s = shutdown_timeout_s
        self._child: subprocess.Popen | None = None
        self._lock = threading.Lock()  # the processor's thread exports; force_flush may come from another
        self._closed = False
        self._failing = False

    def _running(self) -> subprocess.Popen:
        child = self._child
        if child is None or child.poll() is not None:
            if child is not None:
                logger.warning("the span export process ended (status %s); starting another", child.returncode)
                _close_pipes(child)
                self._child = None
            child = self._child = subprocess.Popen(self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        return child

    def export(self, spans: Sequence[ReadableSpan | FlatSpan]) -> SpanExportResult:
        payload = pickle.dumps(flatten(spans), protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            if self._closed:  # under the lock: a batch racing shutdown must not start a child after it
                return SpanExportResult.FAILURE
            try:
                child = self._running()
                _write(child.stdin, _FRAME.pack(len(payload)) + payload)
            except OSError as exc:  # it could not start, or died under the write: the batch is lost,
                if not self._failing:  # as with a collector that is down (said once, until one goes out)
                    logger.warning("spans not exported: the export process is not there (%s)", type(exc).__name__)
                self._failing = True
                return SpanExportResult.FAILURE
            self._failing = False
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Whether the child has sent everything handed to it so far (within the timeout). The SDK's
        processor does not call this from its own force_flush, which returns once its spans are
        handed over: a caller that needs them at the collector calls this, or shuts down."""
        with self._lock:
            child = self._child
            if child is None or child.poll() is not None:
                return True  # nothing written waits in a live child
            try:
                _write(child.stdin, _FRAME.pack(0))
                return _read_ack(child.stdout, timeout_millis / 1000)
            except OSError:
                return False

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            child, self._child = self._child, None
        if child is None:
            return
        try:
            if child.stdin is not None:
                child.stdin.close()  # end of input: the child exports what it has and exits
        except OSError:
            pass
        try:
            child.wait(timeout=self._shutdown_timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        _close_pipes(child)


def _close_pipes(child: subprocess.Popen) -> None:
    for pipe in (child.stdin, child.stdout):
        try:
            if pipe is not None:
                pipe.close()
        except OSError:
            pass  # a pipe to a dead process may refuse its last flush


def _write(stream: IO[bytes] | None, data: bytes) -> None:
    if stream is None:
        raise OSError("no pipe to the span export process")
    stream.write(data)
    stream.flush()


def _read_ack(stream: IO[bytes] | None, timeout_s: float) -> bool:
    if stream is None:
        return False
    ready, _, _ = select.select([stream], [], [], timeout_s)
    return bool(ready) and os.read(stream.fileno(), 1) == _FLUSHED


# -- spans as plain values, and back ----------------------------------------------------------------


class FlatSpan:
    """A span as the handover needs it, flattened when it ended (FlatteningSpanProcessor): the
    processor's queue holds these, and the exporter's thread only pickles them."""

    __slots__ = ("context", "instrumentation_scope", "resource", "row")

    def __init__(self, span: ReadableSpan) -> None:
        self.context = span.context  # what the processor reads to drop an unsampled span
        self.resource = span.resource
        self.instrumentation_scope = span.instrumentation_scope
        self.row = _row(span)


class FlatteningSpanProcessor(BatchSpanProcessor):
    """The SDK's batch processor, with each span flattened on the thread that ends it.

    The processor's thread holds the GIL for whatever it does to a batch, and every request in
    flight waits for it. Flattening was most of that: 6.5 us of the 8 a span cost there (the rest
    is pickling), 0.55 ms per batch of 48-64 spans, about once per 11 requests of the traced
    gateway, where it made the p90 and p99. Flattened as each span ends, the same work is a few
    microseconds per span on the loop, and the batch's hold is its pickling alone."""

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            super().on_end(FlatSpan(span))  # type: ignore[arg-type]  # the processor reads .context alone


def _row(span: ReadableSpan) -> tuple:
    status = span.status
    return (span.name, _context(span.context), _context(span.parent), span.kind.value,
            span.start_time, span.end_time, dict(span.attributes) if span.attributes else {},
            [(event.name, dict(event.attributes or {}), event.timestamp) for event in span.events],
            [(_context(link.context), dict(link.attributes or {})) for link in span.links],
            (status.status_code.value, status.description))


def flatten(spans: Sequence[ReadableSpan | FlatSpan]) -> tuple[list, list]:
    """The spans as tuples of plain values (what pickle writes fast), and their resources once each."""
    resources: list = []
    seen: dict[int, int] = {}
    scopes: dict[int, tuple | None] = {}
    flat = []
    for span in spans:
        resource = span.resource
        index = seen.get(id(resource))
        if index is None:
            index = seen[id(resource)] = len(resources)
            resources.append((dict(resource.attributes), resource.schema_url))
        scope = span.instrumentation_scope
        if id(scope) not in scopes:
            scopes[id(scope)] = (scope.name, scope.version, scope.schema_url) if scope is not None else None
        row = span.row if isinstance(span, FlatSpan) else _row(span)
        flat.append((*row, scopes[id(scope)], index))
    return flat, resources


def _context(context) -> tuple | None:
    if context is None:
        return None
    state = context.trace_state
    return (context.trace_id, context.span_id, context.is_remote, int(context.trace_flags),
            list(state.items()) if state else ())


def rebuild(flat: list, resources: list) -> list[ReadableSpan]:
    """ReadableSpans equal in everything the OTLP exporter reads to those flatten() was given."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode

    built = [Resource(attributes, schema_url) for attributes, schema_url in resources]
    spans = []
    for (name, context, parent, kind, start, end, attributes, events, links, (code, description), scope,
         resource) in flat:
        spans.append(ReadableSpan(
            name=name, context=_span_context(context), parent=_span_context(parent), resource=built[resource],
            attributes=attributes,
            events=[Event(event_name, event_attributes, timestamp) for event_name, event_attributes, timestamp
                    in events],
            links=[Link(_span_context(link_context), link_attributes) for link_context, link_attributes in links],
            kind=SpanKind(kind), status=Status(StatusCode(code), description), start_time=start, end_time=end,
            instrumentation_scope=InstrumentationScope(*scope) if scope is not None else None,
        ))
    return spans


def _span_context(value: tuple | None):
    from opentelemetry.trace import SpanContext, TraceFlags, TraceState

    if value is None:
        return None
    trace_id, span_id, is_remote, flags, state = value
    return SpanContext(trace_id, span_id, is_remote, TraceFlags(flags), TraceState(state))


# -- the child ----------------------------------------------------------------------------------------


def main(stdin: BinaryIO | None = None, stdout: BinaryIO | None = None, exporter: SpanExporter | None = None) -> int:
    """Reads batches until the pipe closes and exports them, those that arrived together in one
    export of up to EXPORT_SPANS; answers each flush request once every batch before it is exported."""
    source: BinaryIO = stdin or os.fdopen(os.dup(0), "rb", buffering=0)
    if stdout is None:
        # The answers to flush requests go out on the original stdout, alone: anything the exporter
        # or a library prints goes to stderr instead.
        sink: BinaryIO = os.fdopen(os.dup(1), "wb", buffering=0)
        os.dup2(2, 1)
        # The gateway's shutdown ends this process (it closes the pipe); a Ctrl-C sent to the whole
        # process group must not lose the spans the gateway still hands over on its way out.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        background_priority()
    else:
        sink = stdout
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()  # endpoint, headers, timeout and compression from OTEL_*
    pending: list[ReadableSpan] = []
    try:
        while True:
            head = _read_exactly(source, _FRAME.size)
            if head is None:
                return 0
            (length,) = _FRAME.unpack(head)
            if length == 0:  # a flush request: what came before it goes out first
                if pending:
                    exporter.export(pending)
                    pending = []
                sink.write(_FLUSHED)
                sink.flush()
                continue
            payload = _read_exactly(source, length)
            if payload is None:
                return 0
            pending += rebuild(*pickle.loads(payload))  # our own parent's batch, on a pipe only it holds
            if len(pending) >= EXPORT_SPANS or not _waiting(source):
                exporter.export(pending)
                pending = []
    finally:
        if pending:
            exporter.export(pending)
        exporter.shutdown()


def background_priority() -> None:
    """Runs this process only on CPU time nothing else wants: Linux's SCHED_IDLE (elsewhere the
    lowest nice value). Exporting is background work, and on a small machine a batch's encoding on a
    core a request was about to wake on delayed that request by milliseconds: the traced gateway's
    added p99 at concurrency 1 fell from 4.2-4.6 to 2.0-2.4 ms with it (the lowest nice value alone
    changed nothing: Linux wakes a task onto a core running only SCHED_IDLE work as onto an idle
    one). A gateway that keeps every core busy starves the child; its batches then wait in the
    pipe and the processor's queue, whose overflow is dropped as with a slow collector."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or refused: the lowest nice value instead
        try:
            os.nice(19)
        except OSError:
            pass


def _read_exactly(source: BinaryIO, size: int) -> bytes | None:
    """size bytes, or None when the pipe ends first."""
    data = b""
    while len(data) < size:
        chunk = source.read(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _waiting(source: BinaryIO) -> bool:
    """Whether more is there to read now (the parent handed over several batches at once)."""
    try:
        descriptor = source.fileno()
    except (AttributeError, OSError, ValueError):  # an in-memory stream (tests): whatever is left in it
        return source.tell() < len(source.getbuffer())  # type: ignore[attr-defined]
    return bool(select.select([descriptor], [], [], 0)[0])


if __name__ == "__main__":
    sys.exit(main())
