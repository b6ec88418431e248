from __future__ import annotations

import time

import pytest

from engine import scheduler as scheduler_module
from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.scheduler import Scheduler
from engine.sequence import FinishReason, Sequence, SequenceStatus
from tests.engine.test_block_manager import cache_blocks, make_seq, still_cached
from tests.utils.envelopes import envelope


def run_step(scheduler: Scheduler, sampled_token: int = 7, charged: bool = False):
    """Apply a schedule the way the engine does: advance computed tokens, sample at the end, and
    (charged) charge the step's time to its tenants, 1 ms a token, as the engine charges its own."""
    batch = scheduler.schedule()
    if charged:
        scheduler.charge(batch, float(batch.num_tokens))
    for seq, n in zip(batch.seqs, batch.num_new_tokens):
        seq.num_computed_tokens += n
        if seq.num_computed_tokens == seq.num_tokens:
            seq.append_token(sampled_token)
    return batch


def test_decodes_go_first_then_new_prompts_fill_the_budget() -> None:
    config = EngineConfig(block_size=4, max_num_batched_tokens=10, max_num_seqs=8)
    scheduler = Scheduler(config, BlockManager(64, 4))
    a = make_seq("a", 6)
    scheduler.add(a)
    assert run_step(scheduler).num_new_tokens == [6]
    b = make_seq("b", 20)
    scheduler.add(b)
    batch = run_step(scheduler)
    assert [s.request_id for s in batch.seqs] == ["a", "b"]
    assert batch.num_new_tokens == [1, 9]  # b's prompt is chunked into the remaining budget
    assert scheduler.num_chunked_prefills == 1
    batch = run_step(scheduler)
    assert batch.num_new_tokens == [1, 9]
    batch = run_step(scheduler)
    assert batch.num_new_tokens == [1, 2]  # b finishes its prompt and samples
    assert b.num_output_tokens == 1


def test_max_num_seqs_limits_admission() -> None:
    config = EngineConfig(block_size=4, max_num_batched_tokens=100, max_num_seqs=2)
    scheduler = Scheduler(config, BlockManager(64, 4))
    for name in "abc":
        scheduler.add(make_seq(name, 3))
    batch = run_step(scheduler)
    assert [s.request_id for s in batch.seqs] == ["a", "b"]
    assert [s.request_id for s in scheduler.waiting] == ["c"]


def test_preemption_frees_the_latest_arrival_and_recomputes_it() -> None:
    config = EngineConfig(block_size=4, max_num_batched_tokens=100, max_num_seqs=8)
    bm = BlockManager(4, 4)
    scheduler = Scheduler(config, bm)
    a, b = make_seq("a", 8), make_seq("b", 8)
    scheduler.add(a)
    scheduler.add(b)
    run_step(scheduler)  # both prompts fill all 4 blocks, each samples one token
    assert bm.num_free_blocks == 0
    batch = run_step(scheduler)  # a needs a third block: b is preempted
    assert batch.preempted == [b]
    assert [s.request_id for s in batch.seqs] == ["a"]
    assert b.status is SequenceStatus.WAITING and b.num_computed_tokens == 0 and b.block_table == []
    assert b.num_tokens == 9  # its sampled token is kept and recomputed with the prompt
    assert scheduler.num_preemptions == 1
    scheduler.finish(a, FinishReason.LENGTH)
    batch = run_step(scheduler)
    assert batch.num_new_tokens == [9]
    bm.check_invariants(scheduler.live_sequences())


def test_a_readmitted_sequence_keeps_its_seniority() -> None:
    config = EngineConfig(block_size=4, max_num_batched_tokens=100, max_num_seqs=8)
    bm = BlockManager(6, 4)
    scheduler = Scheduler(config, bm)
    a, b, c = make_seq("a", 4), make_seq("b", 4), make_seq("c", 4)
    for seq in (a, b, c):
        scheduler.add(seq)
    run_step(scheduler)  # 3 blocks used, each sequence sampled one token
    for _ in range(3):
        run_step(scheduler)  # every sequence crosses into its second block: 6 used
    assert bm.num_free_blocks == 0
    # Preempt b by hand (as if it had been the victim); its two blocks let it come back at once.
    scheduler._preempt(b)
    batch = run_step(scheduler)
    assert [s.request_id for s in batch.seqs] == ["a", "c", "b"]
    assert [s.request_id for s in scheduler.running] == ["a", "b", "c"]  # arrival order, not admission order


def test_the_latest_arrival_preempts_itself_when_it_cannot_grow() -> None:
    config = EngineConfig(block_size=4, max_num_batched_tokens=100, max_num_seqs=8)
    bm = BlockManager(3, 4)
    scheduler = Scheduler(config, bm)
    a, b = make_seq("a", 4), make_seq("b", 7)
    scheduler.add(a)
    scheduler.add(b)
    run_step(scheduler)  # a: 1 block, b: 2 blocks; both sampled
    batch = run_step(scheduler)  # a needs a second block: b (latest) goes
    assert batch.preempted == [b]
    assert [s.request_id for s in batch.seqs] == ["a"]
    bm.check_invariants(scheduler.live_sequences())


def test_without_chunked_prefill_a_prompt_waits_for_a_full_budget() -> None:
    config = EngineConfig(block_size=4, max_num_batched_tokens=10, enable_chunked_prefill=False)
    scheduler = Scheduler(config, BlockManager(64, 4))
    scheduler.add(make_seq("a", 6))
    scheduler.add(make_seq("b", 6))
    batch = run_step(scheduler)
    assert batch.num_new_tokens == [6]  # b does not fit whole into the 4 tokens left
    batch = run_step(scheduler)
    assert batch.num_new_tokens == [1, 6]


def test_finish_releases_blocks_of_waiting_and_running_sequences() -> None:
    config = EngineConfig(block_size=4, max_num_batched_tokens=4)
    bm = BlockManager(16, 4)
    scheduler = Scheduler(config, bm)
    a, b = make_seq("a", 10), make_seq("b", 3)
    scheduler.add(a)
    scheduler.add(b)
    run_step(scheduler)  # a is mid-prefill
    scheduler.finish(a, FinishReason.ABORT)
    scheduler.finish(b, FinishReason.ABORT)
    assert bm.num_free_blocks == 16
    assert not scheduler.has_unfinished()
    bm.check_invariants([])


# -- guaranteed shares -------------------------------------------------------------------


def b_bursts_then_a_arrives(num_b: int, a_tokens: int) -> tuple[Scheduler, list[Sequence], Sequence]:
    """Tenants a and b, each with a quota of 8 on an 8-block pool: shares of 4 once both are
    active. b, alone, runs num_b 5-token prompts (2 blocks each, its share is the pool);
    then a's prompt arrives."""
    scheduler = Scheduler(EngineConfig(block_size=4, max_num_batched_tokens=100, max_num_seqs=8), BlockManager(8, 4))
    bs = [make_seq(f"b{i}", 5, envelope("b", quota=8)) for i in range(num_b)]
    for seq in bs:
        scheduler.add(seq)
    run_step(scheduler)
    a1 = make_seq("a1", a_tokens, envelope("a", quota=8))
    scheduler.add(a1)
    return scheduler, bs, a1


def test_a_tenant_over_its_share_preempts_its_own_not_a_later_arrival_within_its_share() -> None:
    scheduler, bs, a1 = b_bursts_then_a_arrives(3, 5)
    run_step(scheduler)  # a1 takes the last 2 blocks: b holds 6 of its share of 4, a 2
    run_step(scheduler)
    run_step(scheduler)
    batch = run_step(scheduler)  # b's sequences need a third block now
    assert batch.preempted == [bs[2]]  # its own latest, not a1, the latest arrival
    assert batch.seqs == [bs[0], bs[1], a1]
    scheduler.block_manager.check_invariants(scheduler.live_sequences())


def test_a_tenant_within_its_share_preempts_a_sequence_over_its_share_scheduled_earlier_in_the_step() -> None:
    scheduler, bs, a1 = b_bursts_then_a_arrives(3, 8)
    run_step(scheduler)  # a1 takes the last 2 blocks, and fills them
    batch = run_step(scheduler)  # b's decodes go first and fit; a1 needs a third block
    assert batch.preempted == [bs[2]]
    assert batch.seqs == [bs[0], bs[1], a1] and batch.num_new_tokens == [1, 1, 1]
    scheduler.block_manager.check_invariants(scheduler.live_sequences())


def test_a_tenant_within_its_share_is_admitted_into_a_pool_another_filled_by_bursting() -> None:
    scheduler, bs, a1 = b_bursts_then_a_arrives(4, 5)  # b holds all 8 blocks
    batch = run_step(scheduler)
    assert batch.preempted == [bs[3]]  # b's latest gives its blocks back for a's share
    assert batch.seqs == [*bs[:3], a1] and batch.admitted == [a1]
    bm = scheduler.block_manager
    assert (bm.charged[a1.tenant], bm.charged[bs[0].tenant]) == (2, 6)
    bm.check_invariants(scheduler.live_sequences())
    for _ in range(8):  # a1 grows to its share of 4 blocks; b, over its share, cannot take them back
        run_step(scheduler)
    assert a1.num_preemptions == 0 and len(a1.block_table) == 4
    bm.check_invariants(scheduler.live_sequences())


def test_a_request_larger_than_its_share_still_runs_once_nothing_else_does() -> None:
    # Three tenants with a quota of 8 on 8 blocks: shares of 2. a and c keep 2 cached
    # blocks each, within their shares; b's prompt needs 5 blocks and nothing is running.
    bm = BlockManager(8, 4)
    scheduler = Scheduler(EngineConfig(block_size=4, max_num_batched_tokens=100, max_num_seqs=8), bm)
    a_cached = cache_blocks(bm, envelope("a", quota=8), 2, 0)
    c_cached = cache_blocks(bm, envelope("c", quota=8), 2, 100)
    big = make_seq("big", 20, envelope("b", quota=8))
    bm.set_quota(big.tenant, 8)
    assert not bm.allocate(big, 20)  # the shares alone would keep it waiting forever
    scheduler.add(big)
    batch = run_step(scheduler)
    assert batch.seqs == [big]  # the idle caches gave way: the least recently used block of one of them
    assert sum(still_cached(bm, [b]) for b in a_cached + c_cached) == 3
    bm.check_invariants(scheduler.live_sequences())


def test_advance_does_the_steps_bookkeeping_so_a_later_prompt_hits_the_published_blocks() -> None:
    scheduler = Scheduler(EngineConfig(block_size=4, max_num_batched_tokens=100, max_num_seqs=8), BlockManager(16, 4))
    a = make_seq("a", 10)
    scheduler.add(a)
    batch = scheduler.schedule()
    start = time.monotonic()
    scheduler.advance(batch, start, start + 0.5)
    assert a.num_computed_tokens == 10 and len(a.block_hashes) == 2  # its two full blocks are in the prefix cache
    assert a.engine_ms == pytest.approx(500) and a.kv_block_seconds == pytest.approx(3 * 0.5)  # 3 blocks for 0.5 s
    assert scheduler.peak_kv_stats().num_used_blocks == 3 and scheduler.kv_usage() == 3 / 16
    scheduler.finish(a, FinishReason.LENGTH)
    b = make_seq("b", 10)  # the same tokens in the same namespace
    scheduler.add(b)
    scheduler.schedule()
    assert b.num_cached_tokens == 8 and scheduler.num_prefix_hit_tokens == 8
    assert scheduler.peak_kv_stats().num_used_blocks == 3  # the peak is kept at advance, not at every schedule
    scheduler.check_invariants()


def test_another_tenants_work_over_its_share_gives_way_before_a_tenants_own_cache() -> None:
    # 12 blocks, quotas of 12: shares of 6 once both are active. a keeps 2 cached blocks and
    # runs a1 (2 blocks); b's two prompts take the other 8, 2 over its share.
    bm = BlockManager(12, 4)
    scheduler = Scheduler(EngineConfig(block_size=4, max_num_batched_tokens=100, max_num_seqs=8), bm)
    a_env, b_env = envelope("a", quota=12), envelope("b", quota=12)
    a_cached = cache_blocks(bm, a_env, 2, 100)
    a1 = make_seq("a1", 8, a_env)
    b1, b2 = make_seq("b1", 16, b_env), make_seq("b2", 16, b_env)
    for seq in (a1, b1, b2):
        scheduler.add(seq)
    run_step(scheduler)
    assert bm.num_free_blocks == 0 and (bm.charged[a1.tenant], bm.charged[b1.tenant]) == (4, 8)
    batch = run_step(scheduler)  # a1's decode needs a third block, within a's share
    assert batch.preempted == [b2]  # b's latest, over b's share, not a's cached blocks
    assert a1 in batch.seqs and still_cached(bm, a_cached)
    bm.check_invariants(scheduler.live_sequences())


@pytest.fixture
def frozen_clock(monkeypatch) -> list[float]:
    """The scheduler's clock, stopped at 1000 s: a test moves it by adding to [0]."""
    now = [1000.0]
    monkeypatch.setattr(scheduler_module.time, "monotonic", lambda: now[0])
    return now


def contended(max_tokens: int = 100, contended_tokens: int = 20, max_num_seqs: int = 8) -> Scheduler:
    # No window: a tenant alone again gets the whole budget at once (the window's own test below).
    config = EngineConfig(block_size=4, max_num_batched_tokens=max_tokens, contended_batched_tokens=contended_tokens,
                          max_num_seqs=max_num_seqs, contention_window_s=0)
    return Scheduler(config, BlockManager(256, 4))


def test_a_long_prompt_costs_another_tenants_request_only_contended_steps() -> None:
    scheduler = contended()
    b = make_seq("b", 600, envelope("b"))
    scheduler.add(b)
    assert run_step(scheduler).num_new_tokens == [100]  # alone, b has the whole budget
    a = make_seq("a", 6, envelope("a"))
    scheduler.add(a)
    for _ in range(3):  # a's prompt, then its decodes, each in a step of at most 20 tokens
        batch = run_step(scheduler)
        assert a in batch.seqs and batch.num_tokens == 20
        assert batch.num_new_tokens[batch.seqs.index(a)] == (6 if a.num_output_tokens == 1 else 1)
    assert a.num_output_tokens == 3
    scheduler.finish(a, FinishReason.LENGTH)
    assert run_step(scheduler).num_new_tokens == [100]  # alone again: the whole budget


def test_a_step_stays_contended_for_the_window_after_another_tenants_work(frozen_clock) -> None:
    # A burst that lands between a neighbour's requests must not run one whole-budget step that
    # the neighbour's next request then waits behind.
    scheduler = Scheduler(EngineConfig(block_size=4, max_num_batched_tokens=100, contended_batched_tokens=20,
                                       max_num_seqs=8, contention_window_s=5), BlockManager(256, 4))
    a = make_seq("a", 2, envelope("a"))
    scheduler.add(a)
    run_step(scheduler)
    scheduler.finish(a, FinishReason.LENGTH)
    b = make_seq("b", 600, envelope("b"))
    scheduler.add(b)
    frozen_clock[0] += 4.9
    assert run_step(scheduler).num_new_tokens == [20]  # a had work 4.9 s ago: contended
    frozen_clock[0] += 0.2
    assert run_step(scheduler).num_new_tokens == [100]  # 5.1 s: b is alone


def test_the_contended_budget_shrinks_to_the_measured_step_time_but_not_below_max_num_seqs() -> None:
    scheduler = Scheduler(EngineConfig(block_size=4, max_num_batched_tokens=1000, contended_batched_tokens=200,
                                       max_num_seqs=8, contended_step_ms=100), BlockManager(1024, 4))
    for tenant in ("a", "b"):
        scheduler.add(make_seq(tenant, 900, envelope(tenant)))
    assert scheduler.step_budget() == 200  # nothing measured yet
    scheduler.observe_step(8, 1000.0)  # too few tokens to measure the cost per token by
    assert scheduler.step_budget() == 200
    scheduler.observe_step(100, 100.0)  # 1 ms a token: 100 tokens fill 100 ms
    assert scheduler.step_budget() == 100
    for _ in range(40):
        scheduler.observe_step(50, 1000.0)  # 20 ms a token: 5 tokens, but every decode needs its seat
    assert scheduler.step_budget() == 8
    scheduler.contended_step_ms = 0  # off: the configured budget
    assert scheduler.step_budget() == 200


def test_tenants_with_prompts_get_equal_parts_of_a_contended_step_and_the_leftover_is_used() -> None:
    scheduler = contended()  # steps not charged: every tenant served alike
    b, c = make_seq("b", 600, envelope("b")), make_seq("c", 600, envelope("c"))
    scheduler.add(b)
    run_step(scheduler)
    scheduler.add(c)
    batch = run_step(scheduler)
    assert batch.seqs == [b, c] and batch.num_new_tokens == [10, 10]
    d = make_seq("d", 4, envelope("d"))
    scheduler.add(d)
    batch = run_step(scheduler)  # three parts of 6; d needs 4, and b, the first in line, takes the 4 left
    assert dict(zip(batch.seqs, batch.num_new_tokens)) == {b: 10, c: 6, d: 4}
    batch = run_step(scheduler)  # d decodes first; b and c split the rest
    assert dict(zip(batch.seqs, batch.num_new_tokens)) == {d: 1, b: 10, c: 9}


def test_a_light_tenant_takes_steps_alone_until_it_is_served_half_as_much_then_a_larger_part(frozen_clock) -> None:
    scheduler = contended()
    b, c = make_seq("b", 600, envelope("b")), make_seq("c", 600, envelope("c"))
    scheduler.add(b)
    run_step(scheduler, charged=True)  # b alone: 100 tokens, 100 ms
    scheduler.add(c)
    for _ in range(3):  # c: 0, 20, 40 ms against b's 100, under LIGHT_SHARE of it: a step of its own
        batch = run_step(scheduler, charged=True)
        assert batch.seqs == [c] and batch.num_new_tokens == [20]
    # 60 ms against 100: they share the step again, c, served less lately, with half of b's part.
    batch = run_step(scheduler, charged=True)
    assert batch.seqs == [b, c] and batch.num_new_tokens == [5, 15]


def test_a_small_request_beside_a_heavy_tenants_decodes_runs_without_them() -> None:
    # A step's time grows with its rows: batched with 8 decodes, a one-token chat pays for all of them.
    scheduler = contended(max_num_seqs=16)
    heavy = [make_seq(f"h{i}", 3, envelope("heavy")) for i in range(8)]
    for seq in heavy:
        scheduler.add(seq)
    for _ in range(3):
        run_step(scheduler, charged=True)  # the prompts, then decodes: 8 rows a step
    small = make_seq("v", 5, envelope("victim"))
    scheduler.add(small)
    batch = run_step(scheduler, charged=True)
    assert batch.seqs == [small] and batch.num_new_tokens == [5]
    batch = run_step(scheduler, charged=True)
    assert batch.seqs == [small] and batch.num_new_tokens == [1]  # its decode, alone again
    scheduler.finish(small, FinishReason.LENGTH)
    assert run_step(scheduler, charged=True).seqs == heavy  # and the heavy tenant's decodes go on


def test_light_tenants_share_their_steps_and_fall_back_to_everyones_when_theirs_cannot_run() -> None:
    scheduler = contended(max_num_seqs=3)
    heavy = [make_seq(f"h{i}", 3, envelope("heavy")) for i in range(3)]
    for seq in heavy:
        scheduler.add(seq)
    run_step(scheduler, charged=True)
    light = [make_seq("x", 4, envelope("x")), make_seq("y", 4, envelope("y"))]
    for seq in light:
        scheduler.add(seq)
    # Both light tenants' requests wait for a seat the heavy tenant holds: the step is everyone's,
    # not an empty one (and not a preemption).
    batch = run_step(scheduler, charged=True)
    assert batch.seqs == heavy and not batch.preempted
    scheduler.finish(heavy[0], FinishReason.LENGTH)
    scheduler.finish(heavy[1], FinishReason.LENGTH)
    batch = run_step(scheduler, charged=True)  # two seats: the light tenants' prompts, together
    assert dict(zip(batch.seqs, batch.num_new_tokens)) == dict.fromkeys(light, 4)


def test_recent_service_fades_so_a_tenant_heavy_long_ago_is_not_held_back(frozen_clock) -> None:
    scheduler = contended()
    b, c = make_seq("b", 600, envelope("b")), make_seq("c", 600, envelope("c"))
    scheduler.add(b)
    for _ in range(3):
        run_step(scheduler, charged=True)  # b alone: 300 ms
    scheduler.finish(b, FinishReason.LENGTH)
    frozen_clock[0] += 10 * scheduler_module.RECENT_SERVICE_S  # b's 300 ms weigh 300 e^-10 < 0.014 now
    scheduler.add(c)
    run_step(scheduler, charged=True)  # c alone: 100 ms, just now
    b2 = make_seq("b2", 600, envelope("b"))
    scheduler.add(b2)
    batch = run_step(scheduler, charged=True)
    assert batch.seqs == [b2] and batch.num_new_tokens == [20]  # b is the light one now


def test_a_contended_step_is_never_smaller_than_max_num_seqs() -> None:
    # A contended budget under max_num_seqs would skip the latest decodes while the earliest kept going.
    scheduler = contended(max_tokens=100, contended_tokens=2)
    seqs = [make_seq(f"s{i}", 1, envelope(f"t{i % 2}")) for i in range(8)]
    for seq in seqs:
        scheduler.add(seq)
    assert run_step(scheduler).num_tokens == 8  # one-token prompts: all 8 admitted at once
    batch = run_step(scheduler)
    assert sorted(batch.seqs, key=lambda s: s.request_id) == seqs and batch.num_new_tokens == [1] * 8


def test_a_seq_takes_the_leftover_of_a_contended_step_only_from_blocks_it_can_have_without_a_preemption() -> None:
    # A 4-block pool: a's part (10 tokens, 3 blocks) and b's prompt (4 tokens, 1 block) fill it.
    # The 6 tokens left over would need a fifth block; a must not preempt itself (or anyone) for
    # them: that emptied a step for good in the multi-tenant soak, each step preempting the same seq.
    scheduler = Scheduler(EngineConfig(block_size=4, max_num_batched_tokens=100, contended_batched_tokens=20,
                                       max_num_seqs=8), BlockManager(4, 4))
    a1, b1 = make_seq("a1", 20, envelope("a")), make_seq("b1", 4, envelope("b"))
    scheduler.add(a1)
    scheduler.add(b1)
    batch = run_step(scheduler)
    assert batch.preempted == [] and dict(zip(batch.seqs, batch.num_new_tokens)) == {a1: 10, b1: 4}


def test_recent_service_of_tenants_long_unserved_is_forgotten(frozen_clock) -> None:
    scheduler = contended(max_num_seqs=64)
    for i in range(scheduler_module.FORGET_AFTER_TENANTS):
        seq = make_seq(f"old{i}", 1, envelope(f"old{i}"))
        scheduler.add(seq)
        run_step(scheduler, charged=True)
        scheduler.finish(seq, FinishReason.LENGTH)
    frozen_clock[0] += 20 * scheduler_module.RECENT_SERVICE_S
    new = make_seq("new", 1, envelope("new"))
    scheduler.add(new)
    run_step(scheduler, charged=True)
    assert scheduler._recent.keys() == {new.tenant}
