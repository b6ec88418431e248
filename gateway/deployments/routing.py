"""Where an admitted request runs: the targets that honour its decision, in rendezvous order.

A target is one place a request can run: the embedded engine, one replica of a tenantgate
engine deployment, or one OpenAI-compatible deployment. For each request the router

1. keeps the targets that can honour the decision (batch-invariant for the deterministic lane,
   dedicated to the tenant for tenant or exclusive isolation, a cache knob for the scope);
   none left is a 403 that says why: never a silent downgrade;
2. orders them by rendezvous hashing of the cache namespace digest, so a namespace's prefixes
   stay warm on one replica (scope none spreads by request id); a request given public prefix
   segments by its longest segment's namespace instead, so the tenants sharing it meet;
3. moves targets over their load bound (Mirrokni et al.'s consistent hashing with bounded
   loads) and targets whose breaker is open behind the rest, and keeps the first few.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from engine import ExecutionEnvelope, RequestOutput
from gateway.deployments.base import Embeddings, ReplicaLoad, RunRequest
from gateway.errors import PolicyDenied

KV_FULL = 0.95  # a replica whose KV cache is this full takes new namespaces only when all are


class Target(Protocol):
    name: str  # unique: "<deployment>" or "<deployment>/<replica index>"
    fingerprint: str
    expects_records: bool
    max_model_len: int | None  # its own context window, when known
    remote: bool  # called over the network (its span is a client span, with a traceparent)

    def unmet(self, envelope: ExecutionEnvelope, tenant_id: str) -> str | None: ...
    def run(self, request: RunRequest) -> AsyncIterator[RequestOutput]: ...  # generating targets
    async def embed(self, request: RunRequest) -> Embeddings: ...  # embedding targets
    def engine_record(self, request_id: str): ...
    def reported_load(self) -> ReplicaLoad | None: ...
    def ready(self) -> bool: ...
    async def aclose(self) -> None: ...


@dataclass
class _Health:
    failures: int = 0  # consecutive
    open_until: float = 0.0
    in_flight: int = 0


def routing_key(envelope: ExecutionEnvelope) -> bytes | None:
    """What a request's replica is chosen by (rendezvous hashing): the cache namespace, so a namespace's
    prefixes stay on one replica; with public segments, the longest segment's namespace, so the
    tenants that share it reach the replica that holds it (bounded load still spreads them).
    None: scope none, nothing to keep together."""
    if envelope.public_segments:
        return max(envelope.public_segments, key=lambda s: (s.num_tokens, s.digest)).namespace
    return envelope.cache_namespace


class Router:
    def __init__(self, *, max_attempts: int = 3, breaker_failures: int = 3, breaker_open_s: float = 10.0,
                 load_factor: float = 1.25, metrics=None, clock=time.monotonic) -> None:
        self.max_attempts = max_attempts
        self.breaker_failures = breaker_failures
        self.breaker_open_s = breaker_open_s
        self.load_factor = load_factor
        self.metrics = metrics
        self._clock = clock
        self._health: dict[str, _Health] = {}

    def _of(self, target: Target) -> _Health:
        return self._health.setdefault(target.name, _Health())

    def targets(self, served, envelope: ExecutionEnvelope, tenant_id: str, request_id: str,
                revision: str) -> list[Target]:
        eligible, reasons = [], []
        for target in served.targets:
            reason = target.unmet(envelope, tenant_id)
            if reason is None:
                eligible.append(target)
            elif reason not in reasons:
                reasons.append(reason)
        if not eligible:
            raise PolicyDenied(reasons, revision)
        key = routing_key(envelope) or request_id.encode()
        ordered = sorted(eligible, key=lambda t: hashlib.sha256(key + b"\0" + t.name.encode()).digest(), reverse=True)
        now = self._clock()
        loads = {t.name: self.load(t) for t in ordered}
        bound = math.ceil(self.load_factor * (sum(load for load, _ in loads.values()) + 1) / len(ordered))

        def rank(target: Target) -> int:
            health = self._of(target)
            if health.open_until > now or not target.ready():
                return 2
            load, kv_usage = loads[target.name]
            return 1 if load >= bound or kv_usage >= KV_FULL else 0

        return sorted(ordered, key=rank)[: self.max_attempts]  # sorted() is stable: rendezvous order within a rank

    def load(self, target: Target) -> tuple[int, float]:
        """(requests in flight or queued, KV usage): the replica's report when it has one, never below ours."""
        reported = target.reported_load()
        in_flight = self._of(target).in_flight
        if reported is None:
            return in_flight, 0.0
        return max(in_flight, reported.queue_depth), reported.kv_usage

    def started(self, target: Target) -> None:
        self._of(target).in_flight += 1

    def ended(self, target: Target) -> None:
        self._of(target).in_flight -= 1

    def succeeded(self, target: Target) -> None:
        health = self._of(target)
        health.failures, health.open_until = 0, 0.0
        if self.metrics is not None:
            self.metrics.deployment_answered(target.name).inc()

    def failed(self, target: Target, *, after_output: bool) -> None:
        health = self._of(target)
        health.failures += 1
        if health.failures >= self.breaker_failures:
            health.open_until = self._clock() + self.breaker_open_s
        if self.metrics is not None:
            when = "after_output" if after_output else "before_output"
            self.metrics.deployment_failures.labels(target.name, when).inc()

    def is_open(self, target: Target) -> bool:
        return self._of(target).open_until > self._clock()
