"""The encoder's scheduler: small steps, filled by deficit round robin across tenants by tokens,
only within a lane (shared with shared, a tenant's own, exclusive and deterministic alone)."""

from __future__ import annotations

from collections import Counter

import pytest

from engine.encoder.scheduler import EncodeJob, EncoderScheduler
from tests.utils.envelopes import envelope


def job(tenant: str, count: int, length: int = 256, **fields) -> EncodeJob:
    return EncodeJob([[101] * length for _ in range(count)], envelope(tenant=tenant, **fields))


def drain(scheduler: EncoderScheduler) -> list[list[tuple[EncodeJob, int]]]:
    steps = []
    while scheduler.has_work():
        steps.append(scheduler.next_step())
    return steps


def test_a_large_batch_runs_in_slices_and_a_later_tenant_is_in_the_next_step() -> None:
    scheduler = EncoderScheduler(max_tokens=8 * 256, quantum=256)
    big = job("tenant-a", 600)
    scheduler.add(big)
    first = scheduler.next_step()
    assert len(first) == 8 and {j for j, _ in first} == {big}
    small = job("tenant-b", 1)
    scheduler.add(small)
    second = scheduler.next_step()
    assert (small, 0) in second and len(second) == 8
    rest = drain(scheduler)
    assert sum(map(len, rest)) == 600 - 15  # every input once, nothing of the small job again
    assert sorted(i for j, i in [*first, *second, *(s for step in rest for s in step)] if j is big) == list(range(600))


def test_tenants_get_equal_tokens_whatever_their_request_sizes() -> None:
    # Tenant a sends inputs of 256 tokens, b of 16: by tokens each gets half of every step.
    scheduler = EncoderScheduler(max_tokens=32 * 256, quantum=256)
    scheduler.add(job("tenant-a", 1000, length=256))
    scheduler.add(job("tenant-b", 10_000, length=16))
    tokens = Counter()
    for _ in range(20):
        for j, index in scheduler.next_step():
            tokens[j.tenant] += len(j.inputs[index])
    a, b = (tokens[envelope(tenant=t).isolation_key] for t in ("tenant-a", "tenant-b"))
    assert 0.8 < a / b < 1.25, (a, b)


def test_shared_requests_of_different_tenants_share_a_step() -> None:
    scheduler = EncoderScheduler(max_tokens=8 * 256, quantum=256)
    jobs = [job(f"tenant-{n}", 1) for n in "abc"]
    for j in jobs:
        scheduler.add(j)
    assert {j for j, _ in scheduler.next_step()} == set(jobs)
    assert not scheduler.has_work()


@pytest.mark.parametrize("fields", [{"isolation": "exclusive"}, {"deterministic": True}])
def test_exclusive_and_deterministic_requests_run_alone_in_their_own_slices(fields) -> None:
    scheduler = EncoderScheduler(max_tokens=2 * 256, quantum=256)
    alone = EncodeJob([[101] * n for n in (250, 100, 200, 150, 50, 240)], envelope(tenant="tenant-d", **fields))
    scheduler.add(job("tenant-a", 10))
    scheduler.add(alone)
    scheduler.add(job("tenant-d", 2))  # the same tenant's shared request does not join it either
    mine = [f for f in drain(scheduler) if any(j is alone for j, _ in f)]
    assert all({j for j, _ in f} == {alone} for f in mine)
    # Shortest first in slices of at most max_tokens, the same whatever else waits.
    assert [[len(alone.inputs[i]) for _, i in f] for f in mine] == [[50, 100, 150, 200], [240, 250]]


def test_tenant_isolated_requests_share_only_with_their_own_tenant() -> None:
    scheduler = EncoderScheduler(max_tokens=16 * 256, quantum=256)
    mine = [job("tenant-t", 2, isolation="tenant") for _ in range(2)]
    others = [job("tenant-u", 2, isolation="tenant"), job("tenant-v", 2)]
    for j in [*mine, *others]:
        scheduler.add(j)
    for step in drain(scheduler):
        assert len({j.lane for j, _ in step}) == 1
        if any(j in mine for j, _ in step):
            assert {j for j, _ in step} == set(mine)


def test_a_cancelled_job_runs_no_further_inputs() -> None:
    scheduler = EncoderScheduler(max_tokens=4 * 256, quantum=256)
    cancelled = job("tenant-a", 100)
    scheduler.add(cancelled)
    scheduler.next_step()
    cancelled.cancelled = True
    other = job("tenant-b", 2)
    scheduler.add(other)
    assert drain(scheduler) == [[(other, 0), (other, 1)]]
