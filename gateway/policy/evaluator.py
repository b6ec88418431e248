"""Embedded evaluation with regorus: one Engine per thread, an optional decision cache."""

import json
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from gateway.policy.exceptions import PolicyEvaluationError
from gateway.policy.loader import (
    ARGUMENTS_ENTRYPOINT,
    DEFAULT_POLICY_DIR,
    ENTRYPOINT,
    TOOLS_ENTRYPOINT,
    PolicySource,
    load_source,
    new_engine,
    raw_decision,
)
from gateway.policy.prepared import PreparedPolicy, build_engine
from gateway.policy.reads import InputReads, engine_reads
from gateway.policy.schema import (
    Decision,
    ToolsDecision,
    parse_argument_denials,
    parse_decision,
    parse_tools_decision,
    with_argument_denials,
)

T = TypeVar("T")


class EmbeddedEvaluator:
    """Evaluates data.tenantgate.decision in-process.

    Policies and data are read once; each thread builds its own regorus Engine from
    them on first use (regorus' Engine is unsendable: pyo3 refuses to touch it from any
    thread but its creator's, clone() included). An engine built elsewhere on the calling
    thread (the gateway's loop builds one a slice at a time) may be given as `engine`.
    An evaluation error is that input's alone: the engine stays, and the next input is
    judged as if the error had never happened. Each entrypoint is evaluated on what its packages
    read of the input (reads.py), never on the whole document: a decision is a function of those
    paths alone, and regorus parses and holds only them. With cache_size > 0, decisions are also
    cached by that projection (a field no rule they reach refers to never misses the cache); the
    policy revision is part of the key, so a reload never serves a stale decision. A revision that
    calls a builtin of the clock, chance or the network is never cached. The request decision and
    the tools decision have a cache each; the arguments are judged afresh on every call. counts()
    says what the caches did for the decisions made.
    """

    def __init__(
        self,
        policy_dir: Path = DEFAULT_POLICY_DIR,
        data_dir: Path | None = None,
        *,
        cache_size: int = 0,
        source: PolicySource | PreparedPolicy | None = None,
        engine: object | None = None,
    ) -> None:
        self._source = source or load_source(policy_dir, data_dir)
        self._local = threading.local()
        self._local.engine = engine if engine is not None else _new_engine(self._source)  # errors surface here
        if isinstance(self._source, PreparedPolicy):
            self._reads, self._tools_reads = self._source.reads, self._source.tools_reads
            self._arguments_reads = self._source.arguments_reads
        else:
            self._reads = engine_reads(self._local.engine, ENTRYPOINT)
            self._tools_reads = engine_reads(self._local.engine, TOOLS_ENTRYPOINT)
            self._arguments_reads = engine_reads(self._local.engine, ARGUMENTS_ENTRYPOINT)
        self._cache_size = cache_size
        self._cache: OrderedDict[tuple[str, tuple], Decision] = OrderedDict()
        self._tools_cache: OrderedDict[tuple[str, tuple], ToolsDecision] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()  # (kind, cache) -> decisions; under _cache_lock

    @property
    def revision(self) -> str:
        return self._source.revision

    @property
    def reads(self) -> InputReads:
        """What this revision's request decision reads of its input (the decision cache's key)."""
        return self._reads

    @property
    def tools_reads(self) -> InputReads:
        """What this revision's tools decision reads of its input (the tools cache's key)."""
        return self._tools_reads

    @property
    def arguments_reads(self) -> InputReads:
        """What this revision's arguments package reads of its input (what it is evaluated on)."""
        return self._arguments_reads

    @property
    def source(self) -> PolicySource | PreparedPolicy:
        return self._source

    def _engine(self):
        engine = getattr(self._local, "engine", None)
        if engine is None:
            engine = self._local.engine = _new_engine(self._source)
        return engine

    def release_engine(self) -> None:
        """Drops the calling thread's engine now, on this thread. An engine left to die with the
        evaluator on another thread is refused by pyo3 and leaks; the thread that evaluates next
        builds its own."""
        self._local.engine = None

    def evaluate_json(self, input_json: str) -> str:
        """Returns the raw decision JSON for an input given as JSON."""
        return raw_decision(self._engine(), input_json)

    def evaluate(self, input_document: Mapping, entrypoint: str = ENTRYPOINT) -> dict:
        """Returns the decision as a plain dict, unvalidated (for tools and parity checks)."""
        raw = (self.evaluate_json(json.dumps(input_document)) if entrypoint == ENTRYPOINT
               else raw_decision(self._engine(), json.dumps(input_document), entrypoint))
        decision = json.loads(raw)
        if decision is None:
            raise PolicyEvaluationError(f"{entrypoint} is undefined")
        return decision

    def decide_tools(self, input_document: Mapping) -> ToolsDecision:
        """The validated tools decision for one MCP tools/list or tools/call; raises a PolicyError
        (deny) otherwise. The decision is cached (it never reads a call's arguments); a call it
        allows is then judged on its arguments, every time."""
        decision = self._cached("tools", self._tools_cache, self._tools_reads, input_document,
                                lambda read: parse_tools_decision(raw_decision(self._engine(), read, TOOLS_ENTRYPOINT)))
        if not decision.allow or input_document.get("method") != "tools/call":
            return decision
        raw = raw_decision(self._engine(), self._arguments_reads.key(input_document), ARGUMENTS_ENTRYPOINT)
        if raw == "null":  # no arguments package: no call can be judged, so none is allowed
            raise PolicyEvaluationError(f"{ARGUMENTS_ENTRYPOINT} is undefined")
        return with_argument_denials(decision, parse_argument_denials(raw))

    def decide(self, input_document: Mapping) -> Decision:
        """The validated decision for one request; raises a PolicyError (deny) otherwise."""
        return self._cached("request", self._cache, self._reads, input_document,
                            lambda read: parse_decision(self.evaluate_json(read)))

    def counts(self) -> Counter[tuple[str, str]]:
        """Decisions made, by kind ("request", "tools") and by what the decision cache did: "hit"
        (served from it), "miss" (evaluated, then kept) or "off" (evaluated: no cache, or a revision
        that cannot be cached). A decision that failed to evaluate is not one."""
        with self._cache_lock:
            return self._counts.copy()

    def _cached(self, kind: str, cache: OrderedDict[tuple[str, tuple], T], reads: InputReads,
                input_document: Mapping, evaluate: Callable[[str], T]) -> T:
        """evaluate(the input as its packages read it, JSON), unless the cache holds its answer."""
        if not self._cache_size or not reads.cacheable:
            value = evaluate(reads.key(input_document))
            with self._cache_lock:
                self._counts[kind, "off"] += 1
            return value
        key = (self.revision, reads.identity(input_document))
        with self._cache_lock:
            cached = cache.get(key)
            if cached is not None:
                cache.move_to_end(key)
                self._counts[kind, "hit"] += 1
                return cached
        value = evaluate(reads.key(input_document))
        with self._cache_lock:
            self._counts[kind, "miss"] += 1
            cache[key] = value
            if len(cache) > self._cache_size:
                cache.popitem(last=False)
        return value


def _new_engine(source: PolicySource | PreparedPolicy):
    return build_engine(source) if isinstance(source, PreparedPolicy) else new_engine(source)
