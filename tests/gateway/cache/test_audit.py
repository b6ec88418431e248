"""The audit's procedure, verdicts and bounds, against a simulated deployment: a prefix cache in a
dict whose hits answer fast and misses slow, with noise. The real deployments are test_embedded.py's
and tests/gateway/deployments/test_llamacpp_cache_audit.py's."""

from __future__ import annotations

import asyncio
import random

import pytest

from gateway.cache import (
    ATTACKER,
    VICTIM,
    AuditBudget,
    Comparison,
    Verdict,
    audit,
    run_audit,
    token_prefixes,
    verdict_of,
)

HIT_S, MISS_S = 0.010, 0.050


class SimulatedCache:
    """A prefix cache keyed by (namespace, prefix); `shared`: one namespace for all. `caches`
    False: nothing is ever a hit. Times are simulated, not slept (except `sleep_s`)."""

    def __init__(self, *, shared: bool = False, caches: bool = True, sleep_s: float = 0.0, seed: int = 0) -> None:
        self.shared, self.caches, self.sleep_s = shared, caches, sleep_s
        self.cached: set[tuple[str, tuple]] = set()
        self.rng = random.Random(seed)
        self.sent: list[str] = []
        self.in_flight = self.most_in_flight = 0

    async def __call__(self, prompt: list[int], namespace: str) -> float:
        self.sent.append(namespace)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.sleep_s:
                await asyncio.sleep(self.sleep_s)
            key = ("all" if self.shared else namespace, tuple(prompt))
            hit = self.caches and key in self.cached
            self.cached.add(key)
            return (HIT_S if hit else MISS_S) * self.rng.uniform(0.8, 1.25)
        finally:
            self.in_flight -= 1


PREFIXES = token_prefixes(16, 1000)


def test_isolated_namespaces_give_no_leak_with_a_significant_control() -> None:
    result = audit(SimulatedCache(), PREFIXES, budget=AuditBudget(trials=20), seed=1)
    assert result.verdict is Verdict.NO_LEAK
    assert result.control.p_value < 1e-6 and result.cross.p_value > 0.05
    assert result.control.probe_median_s < result.control.baseline_median_s
    assert (result.trials, result.requests, result.stopped_by) == (20, 84, "trials")  # one warm-up trial
    assert result.cross.n_probe == result.cross.n_baseline == result.control.n_probe == 20


def test_a_shared_cache_is_a_leak() -> None:
    result = audit(SimulatedCache(shared=True), PREFIXES, budget=AuditBudget(trials=20), seed=1)
    assert result.verdict is Verdict.LEAK
    assert result.cross.p_value < 1e-6 and result.control.p_value < 1e-6
    assert result.cross.probe_median_s < result.cross.baseline_median_s


def test_a_deployment_that_caches_nothing_is_inconclusive_not_a_pass() -> None:
    result = audit(SimulatedCache(caches=False), PREFIXES, budget=AuditBudget(trials=20), seed=1)
    assert result.verdict is Verdict.INCONCLUSIVE


def test_each_trial_sends_the_victim_first_then_the_probes_in_a_drawn_order() -> None:
    deployment = SimulatedCache()
    audit(deployment, PREFIXES, budget=AuditBudget(trials=12, warmup_trials=0), seed=3)
    trials = [deployment.sent[i:i + 4] for i in range(0, len(deployment.sent), 4)]
    assert all(trial[0] == VICTIM and sorted(trial[1:]) == [VICTIM, ATTACKER, ATTACKER] for trial in trials)
    assert len({tuple(trial) for trial in trials}) > 1  # the order varies


def test_the_request_cap_stops_the_audit_between_trials() -> None:
    deployment = SimulatedCache()
    result = audit(deployment, PREFIXES, budget=AuditBudget(trials=50, max_requests=30), seed=1)
    assert len(deployment.sent) == result.requests == 28  # 7 whole trials, the first a warm-up
    assert (result.trials, result.stopped_by) == (6, "requests")


def test_the_time_cap_stops_the_audit_mid_trial() -> None:
    deployment = SimulatedCache(sleep_s=0.02)
    result = audit(deployment, PREFIXES, budget=AuditBudget(trials=1000, max_seconds=0.5), seed=1)
    assert result.stopped_by == "time"
    assert result.elapsed_s < 1.0
    assert 0 < result.requests < 40 and result.trials < 10


def test_concurrency_bounds_the_trials_in_flight() -> None:
    deployment = SimulatedCache(sleep_s=0.005)
    result = audit(deployment, PREFIXES, budget=AuditBudget(trials=20, concurrency=3), seed=1)
    assert deployment.most_in_flight == 3
    assert result.trials == 20 and result.requests == 84
    sequential = SimulatedCache(sleep_s=0.005)
    audit(sequential, PREFIXES, budget=AuditBudget(trials=5), seed=1)
    assert sequential.most_in_flight == 1


def test_a_plain_function_may_be_the_deployment() -> None:
    cached: set[tuple] = set()

    def shared_cache(prompt: list[int], namespace: str) -> float:
        hit = tuple(prompt) in cached
        cached.add(tuple(prompt))
        return HIT_S if hit else MISS_S

    result = audit(shared_cache, PREFIXES, budget=AuditBudget(trials=10), seed=1)
    assert result.verdict is Verdict.LEAK


async def test_a_failing_send_ends_the_audit_with_its_error() -> None:
    calls = 0

    async def failing(prompt, namespace) -> float:
        nonlocal calls
        calls += 1
        if calls == 6:
            raise ConnectionError("refused")
        await asyncio.sleep(0.001)
        return MISS_S

    with pytest.raises(ConnectionError):
        await run_audit(failing, PREFIXES, budget=AuditBudget(trials=10, concurrency=2), seed=1)


async def test_a_send_that_returns_no_time_is_refused() -> None:
    with pytest.raises(ValueError, match="not a time"):
        await run_audit(lambda prompt, namespace: -1.0, PREFIXES, seed=1)


@pytest.mark.parametrize("options", [{"trials": 1}, {"max_requests": 3}, {"max_seconds": 0},
                                     {"concurrency": 0}, {"concurrency": 65}, {"warmup_trials": -1}])
def test_budget_refuses_unusable_bounds(options: dict) -> None:
    with pytest.raises(ValueError):
        AuditBudget(**options)


def test_verdict_needs_a_significant_control() -> None:
    significant = Comparison(1.0, 1e-6, 20, 20, 0.01, 0.05)
    not_significant = Comparison(0.2, 0.8, 20, 20, 0.05, 0.05)
    assert verdict_of(cross=not_significant, control=significant, alpha=0.01) is Verdict.NO_LEAK
    assert verdict_of(cross=significant, control=significant, alpha=0.01) is Verdict.LEAK
    assert verdict_of(cross=significant, control=not_significant, alpha=0.01) is Verdict.INCONCLUSIVE
    assert verdict_of(cross=not_significant, control=not_significant, alpha=0.01) is Verdict.INCONCLUSIVE


def test_result_as_dict_holds_numbers_only() -> None:
    result = audit(SimulatedCache(), PREFIXES, budget=AuditBudget(trials=5), seed=1)
    document = result.as_dict()
    assert set(document) == {"verdict", "alpha", "cross", "control", "trials", "requests", "elapsed_s", "stopped_by"}
    assert set(document["cross"]) == {"statistic", "p_value", "n_probe", "n_baseline", "probe_median_s",
                                      "baseline_median_s"}


def test_a_deployment_that_holds_namespaces_is_called_leaking_in_about_alpha_of_runs() -> None:
    # The cross probes and the misses are exchangeable when namespaces hold (the draw of the
    # order sees to it), so the exact KS test's false-leak rate is at most alpha. Seeded: the
    # same 300 runs every time.
    runs = [audit(SimulatedCache(seed=seed), PREFIXES, budget=AuditBudget(trials=20), seed=seed, alpha=0.05)
            for seed in range(300)]
    assert all(run.control.p_value < 0.05 for run in runs)
    false_leaks = sum(run.verdict is Verdict.LEAK for run in runs)
    assert false_leaks <= 0.05 * 300 * 1.5, false_leaks  # 18 with these seeds; 4.35% over 2,000 runs
