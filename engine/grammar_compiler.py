"""Compiling a request's JSON schema without letting it cost other tenants more than a bound.

Each compilation runs off the caller's thread (the event loop never waits on one), on a
FairExecutor: `workers` at once, one per tenant, tenants taking turns. It is tried first in a
ProbeWorker child, killed after `timeout_s` (the schema is then refused); only a schema that compiled
there is built here, where it takes as long. The result is kept per cache namespace and schema
digest (an LRU of `cache_size`), refusals too, so a schema sent again costs nothing; a namespace
never sees another's entries (a hit is faster, which would tell whether someone else had sent the
schema), and a request whose policy shares no cache (scope none) keeps nothing.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future

import llguidance

from engine.envelope import ExecutionEnvelope
from engine.fair_executor import FairExecutor
from engine.grammar_probe import ProbeDied, ProbeWorker

logger = logging.getLogger(__name__)

MAX_ERROR_CHARS = 200
PER_TENANT = 1  # compilations of one tenant at once
# Compact JSON (no whitespace between tokens): what OpenAI's strict mode produces, and what a small
# model finishes soonest.
JSON_DEFAULTS = {"whitespace_flexible": False}


class GrammarError(ValueError):
    """A schema the grammar library refuses, or one it cannot compile in time; the message is safe to show."""


class GrammarCompiler:
    def __init__(self, tokenizer: Callable[[], llguidance.LLTokenizer], probe: Callable[[], ProbeWorker],
                 timeout_s: float, workers: int, cache_size: int) -> None:
        self._tokenizer = tokenizer
        self._new_probe = probe
        self.timeout_s = timeout_s
        self._executor = FairExecutor(workers, PER_TENANT, thread_name_prefix="grammar-compile")
        self._cache_size = cache_size
        # A matcher, or the refusal's message (a new GrammarError each time: a raised one keeps its traceback).
        self._cache: OrderedDict[tuple[bytes, bytes], llguidance.LLMatcher | str] = OrderedDict()
        self._lock = threading.Lock()  # guards _cache and _probes
        self._probes: list[ProbeWorker] = []  # idle children

    def submit(self, json_schema: str, envelope: ExecutionEnvelope) -> Future:
        """A future of the schema's compiled matcher (a template: copy it, never advance it), or of
        its GrammarError."""
        key = None if envelope.cache_namespace is None else (
            envelope.cache_namespace, hashlib.sha256(json_schema.encode()).digest())
        cached = self._cached(key)
        if cached is None:
            return self._executor.submit(envelope.isolation_key, lambda: self._compile(json_schema, key))
        future: Future = Future()
        if isinstance(cached, str):
            future.set_exception(GrammarError(cached))
        else:
            future.set_result(cached)
        return future

    def close(self) -> None:
        self._executor.shutdown()
        with self._lock:
            probes, self._probes = self._probes, []
        for probe in probes:
            probe.close()

    def _compile(self, json_schema: str, key: tuple[bytes, bytes] | None) -> llguidance.LLMatcher:
        cached = self._cached(key)  # the tenant's previous request may just have compiled it
        if cached is None:
            try:
                cached = self._build(json_schema)
            except GrammarError as exc:
                cached = str(exc)
            self._keep(key, cached)
        if isinstance(cached, str):
            raise GrammarError(cached)
        return cached

    def _build(self, json_schema: str) -> llguidance.LLMatcher:
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                json_schema, defaults=JSON_DEFAULTS)  # type: ignore[arg-type]  # its TypedDict is not exported
        except ValueError:
            raise GrammarError("the schema is not a JSON object") from None
        error = self._probe(grammar)
        if error is None:
            raise GrammarError(f"it takes more than {self.timeout_s:g} s to compile (patternProperties, large "
                               "anyOf or regex patterns); simplify it")
        if not error:
            matcher = llguidance.LLMatcher(self._tokenizer(), grammar, log_level=0)
            error = matcher.get_error() if matcher.is_error() else ""
        if error:
            raise GrammarError(error[:MAX_ERROR_CHARS])
        return matcher

    def _probe(self, grammar: str) -> str | None:
        with self._lock:
            probe = self._probes.pop() if self._probes else None
        try:
            probe = probe or self._new_probe()
            error = probe.probe(grammar, self.timeout_s)
        except ProbeDied:
            logger.warning("a grammar probe exited while compiling a schema; the schema is refused")
            raise GrammarError("the schema could not be compiled") from None
        if error is not None:
            with self._lock:
                self._probes.append(probe)
        return error

    def _cached(self, key: tuple[bytes, bytes] | None) -> llguidance.LLMatcher | str | None:
        if key is None:
            return None
        with self._lock:
            value = self._cache.get(key)
            if value is not None:
                self._cache.move_to_end(key)
            return value

    def _keep(self, key: tuple[bytes, bytes] | None, value: llguidance.LLMatcher | str) -> None:
        if key is None or self._cache_size == 0:
            return
        with self._lock:
            self._cache[key] = value
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
