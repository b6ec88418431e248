"""A real OpenTelemetry Collector for tests and benchmarks: otelcol-tenantgate (scripts/install-otelcol.sh builds
it with the collector's builder) receiving OTLP over HTTP on a loopback port and writing every
span it receives to a file as OTLP JSON, which `spans()` reads back."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from devkit.gotools import find_go_binary
from devkit.server import free_port

BINARY = "otelcol-tenantgate"


def find_otelcol() -> str | None:
    found = find_go_binary(BINARY)
    return str(found) if found is not None else None


@dataclass
class Span:
    name: str
    kind: int  # OTLP's SpanKind: 1 internal, 2 server, 3 client
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict
    events: list[dict]  # {"name": ..., "attributes": {...}}
    status: int  # 0 unset, 1 ok, 2 error
    resource: dict

    SERVER, CLIENT, INTERNAL = 2, 3, 1


def _value(value: dict):
    (kind, inner), = value.items()
    if kind == "intValue":
        return int(inner)  # OTLP JSON writes 64-bit integers as strings
    if kind == "arrayValue":
        return [_value(v) for v in inner.get("values", [])]
    return inner


def _attributes(items: list[dict] | None) -> dict:
    return {item["key"]: _value(item["value"]) for item in items or () if item.get("value")}


class OtelCollector:
    """`endpoint` is what OTEL_EXPORTER_OTLP_ENDPOINT takes; `raw()` is the file as written."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.file = workdir / "spans.jsonl"
        self.config = workdir / "otelcol.yaml"
        self.log = workdir / "otelcol.log"
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> OtelCollector:
        config = {
            "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{self.port}"}}}},
            "exporters": {"file": {"path": str(self.file), "flush_interval": "100ms"}},
            # No telemetry listener of its own (its default port would collide across collectors).
            "service": {"telemetry": {"metrics": {"level": "none"}},
                        "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["file"]}}},
        }
        self.config.write_text(json.dumps(config))  # YAML is a superset of JSON
        with self.log.open("w") as log:
            self.process = subprocess.Popen([self.binary, "--config", str(self.config)], stdout=log, stderr=log)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the collector exited at start-up:\n{self.log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    tail = self.log.read_text()[-2000:]
                    raise TimeoutError(f"the collector did not listen in time:\n{tail}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def raw(self) -> str:
        return self.file.read_text() if self.file.exists() else ""

    def spans(self) -> list[Span]:
        spans = []
        for line in self.raw().splitlines():
            for resource_spans in json.loads(line).get("resourceSpans", []):
                resource = _attributes(resource_spans.get("resource", {}).get("attributes"))
                for scope_spans in resource_spans.get("scopeSpans", []):
                    for span in scope_spans.get("spans", []):
                        spans.append(Span(
                            name=span["name"], kind=span.get("kind", 0), trace_id=span["traceId"],
                            span_id=span["spanId"], parent_span_id=span.get("parentSpanId", ""),
                            attributes=_attributes(span.get("attributes")),
                            events=[{"name": e["name"], "attributes": _attributes(e.get("attributes"))}
                                    for e in span.get("events", [])],
                            status=span.get("status", {}).get("code", 0), resource=resource))
        return spans

    def wait_for(self, count: int, timeout_s: float = 30.0, **match) -> list[Span]:
        """At least `count` spans whose fields equal `match` (name=..., trace_id=...), waiting for them."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = [s for s in self.spans() if all(getattr(s, k) == v for k, v in match.items())]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.1)
