"""Execution records and engine metrics.

Every request leaves an x-record and every step an s-record. Records hold keyed digests
and numbers only, never text or token ids: digests use a per-deployment key, so a
record cannot be used to confirm a guessed prompt. The engine's Recorder builds them and
hands them to sinks; the gateway routes them to its audit trail, PrometheusSink turns
them into metrics whose labels are bounded enums (scope class, regime, lane), never
tenant ids.
"""

from __future__ import annotations

import hashlib
import threading
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from engine.envelope import tenant_digest

if TYPE_CHECKING:
    from engine.scheduler import ScheduledBatch, Scheduler
    from engine.sequence import Sequence

NUM_MARGIN_STEPS = 4


def record_digest(key: bytes, data: bytes) -> str:
    return hashlib.blake2b(data, key=key, digest_size=16).hexdigest()


def token_digest(key: bytes, token_ids: Seq[int]) -> str:
    return record_digest(key, array("q", token_ids).tobytes())


@dataclass(frozen=True)
class RequestRecord:
    """x: what ran for one request."""

    request_id: str
    raw_prompt_digest: str  # the prompt as the caller sent it (text, or token ids)
    effective_prompt_digest: str  # the token ids that actually ran
    output_digest: str  # the generated token ids
    prompt_tokens: int
    output_tokens: int
    truncated: bool
    truncation_reason: str | None
    decode: dict  # max_tokens, temperature, top_p, top_k, min_p, penalties, logit_bias_tokens, seeded, stops, logprobs
    model_fingerprint: str
    cache_scope: str
    cached_tokens: int
    isolation: str
    deterministic: bool
    top_margins: tuple[float, ...]  # top-1 minus top-2 logit of the first steps
    finish_reason: str
    preemptions: int
    queue_ms: float
    ttft_ms: float | None
    e2e_ms: float
    kv_block_seconds: float  # KV blocks held, integrated over the request's life (preempted: none held)
    engine_ms: float  # the time of the engine steps the request ran in (shared with its batch)
    # n > 1: the counts above are summed over the choices (kv_block_seconds meters the blocks
    # they shared once), engine_ms is the longest choice's, top_margins choice 0's, and
    # finish_reason choice 0's unless one was aborted.
    choices: int = 1
    shared_prefix_blocks: int = 0  # the prompt's KV blocks the choices held together, computed once
    finish_reasons: tuple[str, ...] = ()  # n > 1: each choice's, in order
    # The public segment the prompt started with (its digest, hex; "" none) and the prompt tokens
    # keyed in its namespace (the blocks wholly inside it): shared with everyone given the segment.
    public_segment: str = ""
    public_tokens: int = 0
    # Speculation (engine/speculation.py): draft tokens verified, and those the model agreed with
    draft_tokens: int = 0
    accepted_tokens: int = 0


@dataclass(frozen=True)
class StepRecord:
    """s: what one step ran, and under which regime."""

    step: int
    batch_fingerprint: str  # digest of the sorted request ids
    lane: str  # shared | tenant | exclusive
    isolation_modes: tuple[str, ...]
    members: tuple[tuple[str, str], ...]  # (isolation, tenant digest) per sequence, for audits
    deterministic: bool  # ran the batch-invariant path
    num_seqs: int
    num_tokens: int
    queue_ms: float  # mean wait of the requests admitted in this step
    step_ms: float
    free_kv_blocks: int  # the pool as the step leaves it: blocks of sequences it finished are back
    cached_kv_blocks: int
    used_kv_blocks: int
    kv_waste: float
    num_preempted: int
    num_waiting: int
    regime: str  # normal | memory_pressured | queue_degraded | isolation_strict
    # (tenant digest, blocks held, blocks cached, guaranteed share) per tenant charged with KV
    kv_tenants: tuple[tuple[str, int, int, int], ...] = ()
    # (tenant digest, cached blocks of that tenant evicted for this step's allocations) per tenant that lost any
    kv_evicted: tuple[tuple[str, int], ...] = ()
    # Speculation: draft tokens this step verified (in num_tokens), and those the model agreed with
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


class RecordSink(Protocol):
    def request(self, record: RequestRecord) -> None: ...

    def step(self, record: StepRecord) -> None: ...


# A request waiting longer than this marks the step's regime as queue_degraded.
QUEUE_DEGRADED_SECONDS = 2.0


class Recorder:
    """Builds the engine's x- and s-records and hands them to its sinks. `sinks` is the engine's
    own list, read at each record, so a sink appended to it later receives what follows."""

    def __init__(self, sinks: list[RecordSink], key: bytes, fingerprint: str, block_size: int) -> None:
        self.sinks = sinks
        self._key = key
        self._fingerprint = fingerprint
        self._block_size = block_size
        self._step_index = 0

    def prompt_digest(self, prompt: str | Seq[int]) -> str:
        """The prompt as the caller sent it: its text, or its token ids."""
        raw = prompt.encode() if isinstance(prompt, str) else array("q", prompt).tobytes()
        return record_digest(self._key, raw)

    def step(self, batch: ScheduledBatch, step_ms: float, scheduler: Scheduler) -> None:
        """The s-record of the step that just ended, with the pool as the step leaves it."""
        self._step_index += 1
        if not self.sinks:
            return
        stats = scheduler.kv_stats()
        now = time.monotonic()
        envelopes = [seq.envelope for seq in batch.seqs]
        deterministic = batch.deterministic
        waits = [(seq.first_scheduled_time - seq.arrival_time) * 1000  # type: ignore[operator]  # admitted: scheduled
                 for seq in batch.admitted]
        waiting = scheduler.waiting
        oldest_wait = now - min((s.arrival_time for s in waiting), default=now)
        if batch.preempted or stats.num_free_blocks + stats.num_cached_blocks < 0.05 * stats.num_blocks:
            regime = "memory_pressured"
        elif len(waiting) > scheduler.max_num_seqs or oldest_wait > QUEUE_DEGRADED_SECONDS:
            regime = "queue_degraded"
        elif batch.lane.isolation != "shared" or deterministic:
            regime = "isolation_strict"
        else:
            regime = "normal"
        ids = "\0".join(sorted(seq.request_id for seq in batch.seqs)).encode()
        record = StepRecord(
            step=self._step_index,
            batch_fingerprint=record_digest(self._key, ids),
            lane=batch.lane.isolation,
            isolation_modes=tuple(sorted({e.isolation.value for e in envelopes})),
            members=tuple((e.isolation.value, e.tenant_digest) for e in envelopes),
            deterministic=deterministic,
            num_seqs=len(batch.seqs),
            num_tokens=batch.num_tokens,
            queue_ms=sum(waits) / len(waits) if waits else 0.0,
            step_ms=step_ms,
            free_kv_blocks=stats.num_free_blocks,
            cached_kv_blocks=stats.num_cached_blocks,
            used_kv_blocks=stats.num_used_blocks,
            kv_waste=stats.waste,
            num_preempted=len(batch.preempted),
            num_waiting=len(waiting),
            regime=regime,
            kv_tenants=tuple(
                sorted((tenant_digest(t), u.held, u.cached, u.share) for t, u in scheduler.tenant_kv_usage().items())
            ),
            kv_evicted=tuple(sorted((tenant_digest(t), n) for t, n in scheduler.take_evictions().items())),
            num_draft_tokens=batch.num_draft_tokens,
            num_accepted_tokens=batch.num_accepted_tokens,
        )
        for sink in self.sinks:
            sink.step(record)

    def request(self, seq: Sequence) -> None:
        """One x-record per request, once its last choice has ended."""
        choices = seq.choices
        if not self.sinks or not all(c.is_finished for c in choices):
            return
        seq = choices[0]
        now = time.monotonic()
        p = seq.params
        scheduled = seq.first_scheduled_time or now
        first_tokens = [c.first_token_time for c in choices if c.first_token_time]
        if len(choices) == 1:
            output_digest = token_digest(self._key, seq.output_token_ids)
        else:  # the choices in order, each ended by -1 (never a token id)
            output_digest = token_digest(self._key, [t for c in choices for t in (*c.output_token_ids, -1)])
        reasons = [c.finish_reason.value if c.finish_reason else "abort" for c in choices]
        record = RequestRecord(
            request_id=seq.request_id,
            raw_prompt_digest=seq.raw_prompt_digest,
            effective_prompt_digest=token_digest(self._key, seq.token_ids[: seq.num_prompt_tokens]),
            output_digest=output_digest,
            prompt_tokens=seq.num_prompt_tokens,
            output_tokens=sum(c.num_output_tokens for c in choices),
            truncated=False,  # the engine refuses what does not fit; it never cuts a prompt
            truncation_reason=None,
            decode={
                "max_tokens": p.max_tokens,
                "n": p.n,
                "temperature": p.temperature,
                "top_p": p.top_p,
                "top_k": p.top_k,
                "min_p": p.min_p,
                "presence_penalty": p.presence_penalty,
                "frequency_penalty": p.frequency_penalty,
                "logit_bias_tokens": len(p.logit_bias),
                "seeded": p.seed is not None,
                "stops": len(p.stop) + len(p.stop_token_ids),
                "logprobs": p.logprobs,
                "json_schema": p.json_schema is not None,
            },
            model_fingerprint=self._fingerprint,
            cache_scope=seq.envelope.cache_scope.value,
            cached_tokens=seq.num_cached_tokens,
            isolation=seq.envelope.isolation.value,
            deterministic=seq.envelope.deterministic,
            top_margins=tuple(seq.top_margins),
            finish_reason="abort" if "abort" in reasons else reasons[0],
            preemptions=sum(c.num_preemptions for c in choices),
            queue_ms=(scheduled - seq.arrival_time) * 1000,
            ttft_ms=(min(first_tokens) - seq.arrival_time) * 1000 if first_tokens else None,
            e2e_ms=(now - seq.arrival_time) * 1000,
            kv_block_seconds=round(sum(c.kv_block_seconds for c in choices), 6),
            engine_ms=round(max(c.engine_ms for c in choices), 3),
            choices=len(choices),
            shared_prefix_blocks=seq.num_shared_blocks,
            finish_reasons=tuple(reasons) if len(choices) > 1 else (),
            public_segment=seq.public_segment.digest.hex() if seq.public_segment is not None else "",
            public_tokens=seq.num_public_blocks * self._block_size,
            draft_tokens=sum(c.num_draft_tokens for c in choices),
            accepted_tokens=sum(c.num_accepted_tokens for c in choices),
        )
        for sink in self.sinks:
            sink.request(record)


@dataclass
class ListSink:
    """Keeps every record (tests, the soak check)."""

    requests: list[RequestRecord] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)

    def request(self, record: RequestRecord) -> None:
        self.requests.append(record)

    def step(self, record: StepRecord) -> None:
        self.steps.append(record)


class PendingRecords:
    """Holds x-records until their reader picks them up (the gateway's audit, an engine server's stream)."""

    LIMIT = 10_000  # records nobody asked for (requests that never reached an audit) age out

    def __init__(self) -> None:
        self._records: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()

    def request(self, record) -> None:
        with self._lock:
            self._records[record.request_id] = record
            if len(self._records) > self.LIMIT:
                self._records.popitem(last=False)

    def step(self, record) -> None:
        pass

    def pop(self, request_id: str):
        with self._lock:
            return self._records.pop(request_id, None)


class StepHistory:
    """The last `limit` step records with the wall time each arrived, and every tenant's evicted
    blocks since the engine started (the gateway's operator console reads both)."""

    def __init__(self, limit: int = 4096) -> None:
        self._steps: deque[tuple[float, StepRecord]] = deque(maxlen=limit)
        self._evicted: dict[str, int] = {}
        self._lock = threading.Lock()

    def request(self, record: RequestRecord) -> None:
        pass

    def step(self, record: StepRecord) -> None:
        with self._lock:
            self._steps.append((time.time(), record))
            for tag, blocks in record.kv_evicted:
                self._evicted[tag] = self._evicted.get(tag, 0) + blocks

    def snapshot(self) -> tuple[list[tuple[float, StepRecord]], dict[str, int]]:
        """(the steps kept, oldest first, each with its time; evicted blocks by tenant digest)."""
        with self._lock:
            return list(self._steps), dict(self._evicted)


_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
HIT_RATIO_WINDOW = 1000  # requests per scope the prefix cache hit ratio is over (vLLM's window, too)


class PrometheusSink:
    """Engine metrics. The GenAI conventions' gen_ai_server_* are the gateway's (they need the model and
    the operation, and cover every deployment); the engine's own view of its latency is tenantgate_engine_*."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(
            "tenantgate_engine_time_to_first_token_seconds", "Time from arrival in the engine to the first token",
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.tpot = Histogram(
            "tenantgate_engine_time_per_output_token_seconds",
            "Time per output token after the first, in the engine",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.e2e = Histogram(
            "tenantgate_engine_request_duration_seconds", "Time from arrival in the engine to the request's end",
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.queue = Histogram(
            "tenantgate_request_queue_time_seconds", "Time from arrival to first schedule", buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "tenantgate_prefix_cache_query_tokens", "Prompt tokens looked up in the prefix cache", ["scope"], registry=r
        )
        self.hit_tokens = Counter(
            "tenantgate_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache", ["scope"], registry=r
        )
        self.hit_ratio = Gauge(
            "tenantgate_prefix_cache_hit_ratio", f"Share of prompt tokens served from the prefix cache, over the "
            f"last {HIT_RATIO_WINDOW} requests of each scope", ["scope"], unit="ratio", registry=r,
        )
        self._recent: dict[str, deque[tuple[int, int]]] = {}  # scope -> (hit, query) tokens per request
        self.batch_size = Histogram(
            "tenantgate_batch_size", "Sequences per step", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r
        )
        self.steps = Counter("tenantgate_steps", "Engine steps by regime and lane", ["regime", "lane"], registry=r)
        self.kv_waste = Gauge("tenantgate_kv_waste_ratio", "Allocated KV slots holding no token", registry=r)
        self.finished = Counter(
            "tenantgate_engine_requests", "Requests the engine ended, by finish reason (stop, length, abort)",
            ["finish_reason"], registry=r,
        )

    def watch(self, engine) -> None:
        """Gauges read from the engine at scrape time (so an idle engine reads true too): requests
        running and waiting, preemptions, the KV pool by state and the share of it in use. (The pool
        was once set from step records: requests aborted on an idle engine left it stale.)"""
        self.registry.register(_EngineCollector(engine))

    def request(self, record: RequestRecord) -> None:
        self.finished.labels(record.finish_reason).inc()
        self.e2e.observe(record.e2e_ms / 1000)
        self.queue.observe(record.queue_ms / 1000)
        if record.ttft_ms is not None:
            self.ttft.observe(record.ttft_ms / 1000)
            if record.output_tokens > 1:
                self.tpot.observe((record.e2e_ms - record.ttft_ms) / 1000 / (record.output_tokens - 1))
        if record.cache_scope != "none":
            self.prompt_tokens.labels(record.cache_scope).inc(record.prompt_tokens)
            self.hit_tokens.labels(record.cache_scope).inc(record.cached_tokens)
            recent = self._recent.setdefault(record.cache_scope, deque(maxlen=HIT_RATIO_WINDOW))
            recent.append((record.cached_tokens, record.prompt_tokens))
            queried = sum(query for _, query in recent)
            self.hit_ratio.labels(record.cache_scope).set(sum(hit for hit, _ in recent) / queried if queried else 0.0)

    def step(self, record: StepRecord) -> None:
        self.batch_size.observe(record.num_seqs)
        self.steps.labels(record.regime, record.lane).inc()
        self.kv_waste.set(record.kv_waste)


class _EngineCollector:
    """What vLLM users look for (vllm:num_requests_running, …_waiting, num_preemptions, kv_cache_usage_perc)."""

    def __init__(self, engine) -> None:
        self._engine = engine

    def collect(self):
        scheduler = self._engine.scheduler  # lengths only: safe beside the stepping engine thread
        yield GaugeMetricFamily("tenantgate_engine_requests_running", "Requests in the engine's running batch",
                                value=len(scheduler.running))
        yield GaugeMetricFamily("tenantgate_engine_requests_waiting", "Requests waiting for the engine (queued "
                                "or preempted)", value=len(scheduler.waiting))
        yield CounterMetricFamily("tenantgate_engine_preemptions", "Sequences preempted to free KV blocks",
                                  value=scheduler.num_preemptions)
        yield CounterMetricFamily("tenantgate_engine_spec_draft_tokens", "Draft tokens verified by speculative "
                                  "decoding (prompt lookup)", value=scheduler.num_draft_tokens)
        yield CounterMetricFamily("tenantgate_engine_spec_accepted_tokens", "Draft tokens the model agreed with",
                                  value=scheduler.num_accepted_tokens)
        pool = scheduler.block_manager  # lengths only: safe beside the stepping engine thread
        blocks = GaugeMetricFamily("tenantgate_kv_blocks", "KV blocks by state", labels=["state"])
        for state, value in (("free", pool.num_free_blocks), ("cached", pool.num_cached_blocks),
                             ("used", pool.num_held_blocks)):
            blocks.add_metric([state], value)
        yield blocks
        yield GaugeMetricFamily("tenantgate_kv_cache_usage", "Share of KV blocks held by requests (free and "
                                "evictable cached blocks are not)", value=self._engine.kv_usage(), unit="ratio")
