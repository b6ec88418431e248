"""Span export in a child process (gateway/span_export.py): the spans it rebuilds encode to the same
OTLP bytes, the child answers a flush only once what came before is exported, a child that died is
replaced, and shutdown waits for the child to finish. The export to a real collector through the
child is tests/gateway/test_tracing.py's."""

from __future__ import annotations

import io
import os
import pickle
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from gateway import span_export
from gateway.span_export import _FRAME, ChildSpanExporter, FlatSpan, FlatteningSpanProcessor, flatten, main, rebuild


def finished_spans() -> list:
    """Spans with everything OTLP carries: parents, kinds, attributes of each type, events, links,
    an error status, a tracestate, two resources."""
    spans = []
    for service in ("a", "b"):
        memory = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource({"service.name": service, "deployment.environment": "test"}))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        tracer = provider.get_tracer("tenantgate.test", "1.2.3")
        attributes = {"s": "x", "i": 7, "f": 0.5, "b": True, "l": ["p", "q"]}
        with tracer.start_as_current_span("parent", kind=SpanKind.SERVER, attributes=attributes) as parent:
            parent.add_event("checked", {"n": 3})
            link = Link(parent.get_span_context(), {"why": "test"})
            with tracer.start_as_current_span("child", links=[link]) as child:
                child.set_status(Status(StatusCode.ERROR, "broken"))
        provider.shutdown()
        spans += memory.get_finished_spans()
    return spans


def test_rebuilt_spans_encode_to_the_same_otlp_bytes() -> None:
    spans = finished_spans()
    flat, resources = flatten(spans)
    assert len(resources) == 2  # each resource once, however many spans share it
    rebuilt = rebuild(*pickle.loads(pickle.dumps((flat, resources))))
    assert encode_spans(rebuilt).SerializeToString() == encode_spans(spans).SerializeToString()


def test_spans_flattened_as_they_end_hand_over_the_same_values() -> None:
    spans = finished_spans()
    assert flatten([FlatSpan(span) for span in spans]) == flatten(spans)
    mixed = [FlatSpan(span) if i % 2 else span for i, span in enumerate(spans)]
    assert flatten(mixed) == flatten(spans)


def test_the_processor_queues_each_span_flattened_and_drops_the_unsampled() -> None:
    """The batch's thread gets FlatSpans (flattening was most of its hold of the GIL)."""
    class Kinds(SpanExporter):
        def __init__(self) -> None:
            self.kinds: list[type] = []
            self.names: list[str] = []

        def export(self, spans) -> SpanExportResult:
            self.kinds += [type(span) for span in spans]
            self.names += [span.row[0] for span in spans]
            return SpanExportResult.SUCCESS

    exporter = Kinds()
    provider = TracerProvider(sampler=ALWAYS_ON)
    provider.add_span_processor(FlatteningSpanProcessor(exporter))
    tracer = provider.get_tracer("tenantgate.test")
    with tracer.start_as_current_span("kept"):
        pass
    unsampled = TracerProvider(sampler=ALWAYS_OFF)
    unsampled.add_span_processor(FlatteningSpanProcessor(exporter))
    with unsampled.get_tracer("tenantgate.test").start_as_current_span("dropped"):
        pass
    provider.shutdown()
    unsampled.shutdown()
    assert exporter.kinds == [FlatSpan] and exporter.names == ["kept"]


class Recording(SpanExporter):
    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.shut = False

    @property
    def names(self) -> list[str]:
        return [name for batch in self.batches for name in batch]

    def export(self, spans) -> SpanExportResult:
        self.batches.append([span.name for span in spans])
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shut = True


def frame(spans) -> bytes:
    payload = pickle.dumps(flatten(spans))
    return _FRAME.pack(len(payload)) + payload


def test_the_child_sends_what_arrived_together_at_once_answers_a_flush_after_it_and_shuts_down() -> None:
    spans = finished_spans()
    flushed = io.BytesIO()
    exporter = Recording()
    handed = frame(spans[:1]) + _FRAME.pack(0) + frame(spans[1:2]) + frame(spans[2:])
    assert main(io.BytesIO(handed), flushed, exporter) == 0
    # The first batch went out before the flush was answered; the next two arrived together.
    assert exporter.batches == [[spans[0].name], [span.name for span in spans[1:]]] and exporter.shut
    assert flushed.getvalue() == b"\x01"


def test_the_child_sends_at_most_its_batch_size_in_one_request(monkeypatch) -> None:
    monkeypatch.setattr(span_export, "EXPORT_SPANS", 3)
    spans = finished_spans()
    exporter = Recording()
    main(io.BytesIO(b"".join(frame([span]) for span in spans)), io.BytesIO(), exporter)
    assert [len(batch) for batch in exporter.batches] == [3, 1]


def test_a_batch_cut_short_ends_the_child_with_what_it_had() -> None:
    exporter = Recording()
    whole = frame(finished_spans())
    assert main(io.BytesIO(whole + whole[:-5]), io.BytesIO(), exporter) == 0
    assert len(exporter.names) == 4 and exporter.shut


# A child that records what it exports in a file (argv[1]), one line per span, then "shutdown".
RECORDING_CHILD = (
    "import sys\n"
    "from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult\n"
    "from gateway.span_export import main\n"
    "class Lines(SpanExporter):\n"
    "    def export(self, spans):\n"
    "        with open(sys.argv[1], 'a') as f: f.write(''.join(s.name + '\\n' for s in spans))\n"
    "        return SpanExportResult.SUCCESS\n"
    "    def shutdown(self):\n"
    "        with open(sys.argv[1], 'a') as f: f.write('shutdown\\n')\n"
    "sys.exit(main(exporter=Lines()))\n"
)


def test_the_exporter_hands_batches_to_its_child_flushes_replaces_a_dead_one_and_waits_at_shutdown(
        tmp_path: Path) -> None:
    record = tmp_path / "exported.txt"
    exporter = ChildSpanExporter([sys.executable, "-c", RECORDING_CHILD, str(record)])
    spans = finished_spans()
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert exporter.force_flush(10_000)
    assert record.read_text().split() == [span.name for span in spans]  # exported before the flush answered
    first = exporter._child
    assert first is not None
    first.kill()
    first.wait()
    assert exporter.export(spans[:1]) is SpanExportResult.SUCCESS  # a new child takes it
    assert exporter._child is not None and exporter._child.pid != first.pid
    exporter.shutdown()
    assert record.read_text().split()[-2:] == [spans[0].name, "shutdown"]  # the rest exported, then closed
    assert exporter.export(spans) is SpanExportResult.FAILURE  # nothing after shutdown


def test_the_child_outlives_a_ctrl_c_to_the_process_group(tmp_path: Path) -> None:
    """The gateway's own shutdown ends the child by closing the pipe; an interrupt sent to the whole
    group (a terminal's Ctrl-C) must not kill it before the gateway hands over its last spans."""
    record = tmp_path / "exported.txt"
    exporter = ChildSpanExporter([sys.executable, "-c", RECORDING_CHILD, str(record)])
    spans = finished_spans()
    exporter.export(spans[:1])
    assert exporter.force_flush(10_000)  # the child is up, its handler installed
    child = exporter._child
    assert child is not None
    os.kill(child.pid, signal.SIGINT)
    time.sleep(0.2)
    assert child.poll() is None
    exporter.export(spans[1:2])
    exporter.shutdown()
    assert record.read_text().split() == [spans[0].name, spans[1].name, "shutdown"]


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_the_child_runs_only_on_cpu_time_nothing_else_wants(tmp_path: Path) -> None:
    """Encoding a batch must not hold a core a request is about to wake on: the child is SCHED_IDLE."""
    exporter = ChildSpanExporter([sys.executable, "-c", RECORDING_CHILD, str(tmp_path / "exported.txt")])
    exporter.export(finished_spans()[:1])
    assert exporter.force_flush(10_000)  # the child is up and has set its priority
    child = exporter._child
    assert child is not None
    assert os.sched_getscheduler(child.pid) == os.SCHED_IDLE
    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the gateway's own priority is untouched
    exporter.shutdown()


def test_an_export_process_that_cannot_start_fails_the_batch_and_the_next_one_tries_again(tmp_path: Path) -> None:
    exporter = ChildSpanExporter([str(tmp_path / "no-such-python")])
    spans = finished_spans()
    assert exporter.export(spans) is SpanExportResult.FAILURE  # not an exception into the processor
    exporter._command = [sys.executable, "-c", RECORDING_CHILD, str(tmp_path / "exported.txt")]
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert (tmp_path / "exported.txt").read_text().split()[-1] == "shutdown"


def test_a_batch_that_races_shutdown_starts_no_child_after_it(tmp_path: Path, monkeypatch) -> None:
    """The processor's last batch may still be pickling when shutdown runs: it is refused, and no
    export process outlives the exporter."""
    exporter = ChildSpanExporter([sys.executable, "-c", RECORDING_CHILD, str(tmp_path / "exported.txt")])
    pickling, shut = threading.Event(), threading.Event()
    real_flatten = span_export.flatten

    def slow_flatten(spans):
        pickling.set()
        shut.wait(10)
        return real_flatten(spans)

    monkeypatch.setattr(span_export, "flatten", slow_flatten)
    results: list = []
    racer = threading.Thread(target=lambda: results.append(exporter.export(finished_spans())))
    racer.start()
    assert pickling.wait(10)
    exporter.shutdown()
    shut.set()
    racer.join(10)
    assert results == [SpanExportResult.FAILURE] and exporter._child is None
