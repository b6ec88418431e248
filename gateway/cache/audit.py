"""The timing audit of a prefix cache, after Gu et al., "Auditing Prompt Caching in Language Model
APIs" (ICML 2025): does a prefix cached under one namespace make the same prefix faster under another?

One trial: a fresh random prefix P goes in as the victim, under namespace A. Then three probes, in
an order drawn afresh for each trial so that drift in the machine's load falls on all alike:
  cross    P under namespace B: the attacker's probe;
  control  P under namespace A: the same namespace, which any working cache hits (positive control);
  miss     a second fresh prefix under B, which nothing can have cached (the baseline).
A two-sided two-sample KS test compares the cross probes' times to first token with the misses',
and the controls' with the misses'. A significant control shows the audit can see a hit here; only
then does the cross test mean anything: significant, the cache crosses namespaces (leak); not
significant, no leak was found at this sample size. A control that is not significant makes the
audit inconclusive (too few trials, too much noise, or a deployment that caches nothing).

`send(prompt, namespace)` is the deployment: it sends the prompt (the prefix, plus whatever fresh
suffix the target adds) under namespace "a" or "b" and returns the time to first token in seconds.
It may be a plain function or a coroutine function. Nothing here sees what a prompt says; the
result holds numbers only.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import math
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.cache.stats import ks_2samp

VICTIM, ATTACKER = "a", "b"  # the namespaces a target is asked for; it maps them to its own knob
REQUESTS_PER_TRIAL = 4  # victim, cross, control, miss
DEFAULT_ALPHA = 0.01

Send = Callable[[Any, str], "float | Awaitable[float]"]
FreshPrefix = Callable[[random.Random], Any]


class Verdict(str, enum.Enum):  # noqa: UP042 - StrEnum changes str() and f-strings of a member
    NO_LEAK = "no_leak"
    LEAK = "leak"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class AuditBudget:
    """Bounds of one audit run: it stops at whichever comes first. Warm-up trials count against
    the requests and the time but give no samples (a first request pays one-time costs)."""

    trials: int = 30
    max_requests: int = 400
    max_seconds: float = 600.0
    concurrency: int = 1  # trials in flight at once; 1 (sequential) keeps them from timing each other
    warmup_trials: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.trials, int) and self.trials >= 2):
            raise ValueError("trials must be a whole number of at least 2")
        if not (isinstance(self.max_requests, int) and self.max_requests >= REQUESTS_PER_TRIAL):
            raise ValueError(f"max_requests must be at least {REQUESTS_PER_TRIAL} (one trial)")
        if not (self.max_seconds > 0 and math.isfinite(self.max_seconds)):
            raise ValueError("max_seconds must be a positive number")
        if not (isinstance(self.concurrency, int) and 1 <= self.concurrency <= 64):
            raise ValueError("concurrency must be a whole number from 1 to 64")
        if not (isinstance(self.warmup_trials, int) and self.warmup_trials >= 0):
            raise ValueError("warmup_trials must be a whole number, 0 or more")


@dataclass(frozen=True)
class Comparison:
    """One KS test: the probes' times to first token against the misses'."""

    statistic: float
    p_value: float
    n_probe: int
    n_baseline: int
    probe_median_s: float
    baseline_median_s: float

    @classmethod
    def of(cls, probe: list[float], baseline: list[float]) -> Comparison:
        if not probe or not baseline:
            return cls(math.nan, 1.0, len(probe), len(baseline), math.nan, math.nan)
        ks = ks_2samp(probe, baseline)
        return cls(ks.statistic, ks.p_value, len(probe), len(baseline), statistics.median(probe),
                   statistics.median(baseline))

    def significant(self, alpha: float) -> bool:
        return self.p_value < alpha


@dataclass(frozen=True)
class AuditResult:
    verdict: Verdict
    alpha: float
    cross: Comparison  # namespace B's probe of A's prefix, against the misses
    control: Comparison  # namespace A's probe of its own prefix, against the misses
    trials: int  # trials that gave samples (warm-up ones excluded)
    requests: int  # requests sent, warm-up and unfinished trials included
    elapsed_s: float
    stopped_by: str  # "trials", "requests" or "time"
    samples: dict[str, tuple[float, ...]] = field(repr=False, default_factory=dict)  # cross, control, miss

    def as_dict(self) -> dict:
        """Numbers only (what the CLI prints as JSON, and logs)."""

        def comparison(c: Comparison) -> dict:
            return {"statistic": _number(c.statistic), "p_value": c.p_value, "n_probe": c.n_probe,
                    "n_baseline": c.n_baseline, "probe_median_s": _number(c.probe_median_s),
                    "baseline_median_s": _number(c.baseline_median_s)}

        return {"verdict": self.verdict.value, "alpha": self.alpha, "cross": comparison(self.cross),
                "control": comparison(self.control), "trials": self.trials, "requests": self.requests,
                "elapsed_s": round(self.elapsed_s, 3), "stopped_by": self.stopped_by}


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


def verdict_of(cross: Comparison, control: Comparison, alpha: float) -> Verdict:
    if not control.significant(alpha):
        return Verdict.INCONCLUSIVE
    return Verdict.LEAK if cross.significant(alpha) else Verdict.NO_LEAK


class _Stop(Exception):
    pass


@dataclass
class _Progress:
    next: int = 0  # the next trial's index
    requests: int = 0  # sent
    in_flight: int = 0  # trials started and not ended
    done: int = 0  # trials that gave samples
    stopped_by: str = "trials"


async def run_audit(send: Send, fresh_prefix: FreshPrefix, *, budget: AuditBudget | None = None,
                    alpha: float = DEFAULT_ALPHA, seed: int | None = None) -> AuditResult:
    """Run the audit against `send` within `budget`. `fresh_prefix(rng)` makes a prefix nobody has
    sent before (random enough never to repeat, across runs too: leave `seed` None outside tests).
    A send that raises ends the audit with that exception."""
    budget = budget or AuditBudget()
    if not 0 < alpha < 1:
        raise ValueError("alpha must lie between 0 and 1")
    rng = random.Random(seed if seed is not None else random.SystemRandom().getrandbits(64))
    started = time.monotonic()
    deadline = started + budget.max_seconds
    samples: dict[str, list[float]] = {"cross": [], "control": [], "miss": []}
    state = _Progress()
    total_trials = budget.warmup_trials + budget.trials

    async def timed(prompt: Any, namespace: str) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Stop("time")
        state.requests += 1
        try:
            async with asyncio.timeout(remaining):
                value = send(prompt, namespace)
                if inspect.isawaitable(value):
                    value = await value
        except TimeoutError:
            raise _Stop("time") from None
        seconds = float(value)
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(f"send returned {seconds!r}, not a time in seconds")
        return seconds

    async def worker() -> None:
        while True:
            if state.next >= total_trials:
                return
            # Counts the requests in-flight trials have sent twice: never over the cap.
            if state.requests + REQUESTS_PER_TRIAL * (state.in_flight + 1) > budget.max_requests:
                state.stopped_by = "requests"
                return
            if time.monotonic() >= deadline:
                state.stopped_by = "time"
                return
            index = state.next
            state.next += 1
            state.in_flight += 1
            # Drawn before any await, so a seeded run draws the same prefixes and orders.
            prefix, other = fresh_prefix(rng), fresh_prefix(rng)
            probes = [("cross", prefix, ATTACKER), ("control", prefix, VICTIM), ("miss", other, ATTACKER)]
            rng.shuffle(probes)
            try:
                await timed(prefix, VICTIM)
                times = {name: await timed(prompt, namespace) for name, prompt, namespace in probes}
            except _Stop as stop:
                state.stopped_by = str(stop)
                return
            finally:
                state.in_flight -= 1
            if index >= budget.warmup_trials:
                for name, seconds in times.items():
                    samples[name].append(seconds)
                state.done += 1

    workers = [asyncio.ensure_future(worker()) for _ in range(budget.concurrency)]
    try:
        await asyncio.gather(*workers)
    except BaseException:  # a send failed (or the audit was cancelled): no worker outlives it
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        raise
    cross = Comparison.of(samples["cross"], samples["miss"])
    control = Comparison.of(samples["control"], samples["miss"])
    return AuditResult(
        verdict=verdict_of(cross, control, alpha), alpha=alpha, cross=cross, control=control,
        trials=state.done, requests=state.requests, elapsed_s=time.monotonic() - started,
        stopped_by=state.stopped_by, samples={name: tuple(values) for name, values in samples.items()},
    )


def audit(send: Send, fresh_prefix: FreshPrefix, **options) -> AuditResult:
    """run_audit from synchronous code (no event loop running in this thread)."""
    return asyncio.run(run_audit(send, fresh_prefix, **options))
