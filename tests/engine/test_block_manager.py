from __future__ import annotations

import itertools

import pytest

from engine.block_manager import AllocatorError, BlockManager
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from tests.utils.envelopes import ENV, envelope

_arrivals = itertools.count()


def make_seq(request_id: str, num_tokens: int, envelope=ENV, tokens: list[int] | None = None) -> Sequence:
    """A sequence that arrives after every one made before it."""
    token_ids = list(range(num_tokens)) if tokens is None else tokens
    return Sequence(request_id, token_ids, SamplingParams(), 1024, next(_arrivals), envelope)


def compute_and_cache(bm: BlockManager, seq, keep: bool = False) -> None:
    """What the engine does for a prompt: allocate, compute every token, publish, free."""
    assert bm.allocate(seq, seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens
    bm.register_full_blocks(seq)
    if not keep:
        bm.free(seq)


def test_allocate_covers_requested_slots_and_frees_everything() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq("a", 10)
    assert bm.allocate(seq, 10)
    assert len(seq.block_table) == 3
    assert bm.num_free_blocks == 5
    assert bm.allocate(seq, 12)  # still fits in three blocks
    assert len(seq.block_table) == 3
    assert bm.allocate(seq, 13)
    assert len(seq.block_table) == 4
    bm.check_invariants([seq])
    bm.free(seq)
    assert seq.block_table == []
    assert bm.num_free_blocks == 8
    bm.check_invariants([])


def test_allocation_is_all_or_nothing() -> None:
    bm = BlockManager(num_blocks=3, block_size=4)
    a, b = make_seq("a", 8), make_seq("b", 8)
    assert bm.allocate(a, 8)
    assert not bm.allocate(b, 8)  # needs two, one is free
    assert b.block_table == []
    assert bm.num_free_blocks == 1
    bm.check_invariants([a, b])


def test_double_free_is_detected() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    seq = make_seq("a", 4)
    bm.allocate(seq, 4)
    table = list(seq.block_table)
    bm.free(seq)
    seq.block_table = table  # a buggy caller frees the same blocks again
    with pytest.raises(AllocatorError, match="freed twice"):
        bm.free(seq)


def test_leak_is_detected() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    seq = make_seq("a", 4)
    bm.allocate(seq, 4)
    with pytest.raises(AllocatorError, match="still hold blocks"):
        bm.check_invariants([])  # seq is no longer live but was never freed


def test_waste_counts_unused_tail_slots() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq("a", 5)
    bm.allocate(seq, 5)
    seq.num_computed_tokens = 5
    stats = bm.stats()
    assert (stats.allocated_slots, stats.used_slots) == (8, 5)
    assert stats.waste == pytest.approx(3 / 8)
    assert stats.num_used_blocks == 2


# -- guaranteed shares -------------------------------------------------------------------


def cache_blocks(bm: BlockManager, env, num_blocks: int, first_token: int) -> list[int]:
    """Give env's tenant num_blocks cached blocks of fresh tokens; returns them least recently used first."""
    tokens = list(range(first_token, first_token + num_blocks * bm.block_size))
    seq = make_seq(f"cache-{first_token}", len(tokens), env, tokens=tokens)
    bm.set_quota(seq.tenant, env.kv_block_quota)
    compute_and_cache(bm, seq, keep=True)
    table = list(seq.block_table)
    bm.free(seq)
    return table[::-1]  # a sequence's tail is released first


def still_cached(bm: BlockManager, block_ids: list[int]) -> bool:
    return all(bm.blocks[b].hash is not None and b in bm.evictable for b in block_ids)


def test_shares_are_the_quotas_scaled_down_when_they_oversubscribe_the_pool() -> None:
    bm = BlockManager(48, 4)
    a, b, c = envelope("a", quota=32), envelope("b", quota=48), envelope("c")  # c: no quota set, the whole pool
    for env in (a, b, c):
        bm.set_quota(env.isolation_key, env.kv_block_quota)
    A, B, C = a.isolation_key, b.isolation_key, c.isolation_key
    assert bm.shares() == {}
    assert bm.shares(A) == {A: 32}  # alone, its quota fits in the pool
    cache_blocks(bm, a, 2, 0)
    assert bm.shares() == {A: 32}  # a tenant with cached blocks stays active
    assert bm.shares(B) == {A: 19, B: 28}  # 32 + 48 > 48: 32 * 48 // 80 and 48 * 48 // 80
    cache_blocks(bm, b, 1, 100)
    assert bm.shares(C) == {A: 12, B: 18, C: 18}  # c's quota counts as the pool: 32 + 48 + 48
    assert sum(bm.shares(C).values()) <= bm.num_blocks


def test_a_tenant_over_its_share_cannot_evict_a_neighbour_within_its_share() -> None:
    # 10 blocks, two tenants with a quota of 10 each: shares of 5.
    bm = BlockManager(10, 4)
    a, b = envelope("a", quota=10), envelope("b", quota=10)
    a_prefix = cache_blocks(bm, a, 4, 0)
    cache_blocks(bm, b, 6, 1000)  # b bursts past its share into the free blocks
    assert bm.num_free_blocks == 0 and bm.charged[b.isolation_key] == 6
    for i in range(5):  # then floods: only its own cached blocks are open to it
        cache_blocks(bm, b, 4, 2000 + 100 * i)
        bm.check_invariants()
    assert bm.charged[b.isolation_key] == 6
    assert still_cached(bm, a_prefix)
    again = make_seq("again", 17, a, tokens=list(range(16)) + [0])
    assert len(bm.match_prefix(again)[0]) == 4


def test_a_tenant_within_its_share_takes_back_cached_blocks_down_to_the_others_share() -> None:
    bm = BlockManager(10, 4)
    a, b = envelope("a", quota=10), envelope("b", quota=10)
    a_cached = cache_blocks(bm, a, 4, 0)
    b_cached = cache_blocks(bm, b, 6, 1000)  # one over its share of 5
    seq = make_seq("a-new", 8, a, tokens=list(range(500, 508)))
    assert bm.allocate(seq, 8)
    # First block: b's least recently used cached block. Then b is at its share, and a
    # (now at its own) recycles its own least recently used one.
    assert still_cached(bm, b_cached[1:]) and not still_cached(bm, b_cached[:1])
    assert still_cached(bm, a_cached[1:]) and not still_cached(bm, a_cached[:1])
    assert bm.charged[a.isolation_key] == bm.charged[b.isolation_key] == 5
    bm.free(seq)
    bm.check_invariants()


def test_eviction_takes_from_the_tenant_furthest_over_its_share_not_the_oldest_block() -> None:
    # 12 blocks, three tenants with a quota of 12 each: shares of 4 once all are active.
    bm = BlockManager(12, 4)
    t1, t2, t3 = envelope("t1", quota=12), envelope("t2", quota=12), envelope("t3", quota=12)
    older = cache_blocks(bm, t2, 5, 0)  # one over, and the least recently used blocks of the pool
    cache_blocks(bm, t1, 7, 1000)  # three over
    seq = make_seq("t3", 8, t3, tokens=list(range(500, 508)))
    assert bm.allocate(seq, 8)
    assert still_cached(bm, older)
    assert bm.charged[t1.isolation_key] == 5
    bm.free(seq)
    bm.check_invariants()


def test_evictions_are_counted_per_owner_until_taken() -> None:
    bm = BlockManager(12, 4)
    t1, t2, t3 = envelope("t1", quota=12), envelope("t2", quota=12), envelope("t3", quota=12)
    cache_blocks(bm, t2, 5, 0)
    cache_blocks(bm, t1, 7, 1000)  # shares of 4: t1 is three over, t2 one
    assert bm.take_evictions() == {}
    seq = make_seq("t3", 8, t3, tokens=list(range(500, 508)))
    assert bm.allocate(seq, 8)  # two blocks, both t1's
    assert bm.take_evictions() == {t1.isolation_key: 2}
    assert bm.take_evictions() == {}  # each eviction is reported once


def test_tenants_over_their_shares_do_not_trade_blocks() -> None:
    bm = BlockManager(12, 4)
    t1, t2, t3 = envelope("t1", quota=12), envelope("t2", quota=12), envelope("t3", quota=12)
    cache_blocks(bm, t3, 1, 0)
    t1_cached = cache_blocks(bm, t1, 6, 1000)  # shares of 4: two over
    t2_cached = cache_blocks(bm, t2, 5, 2000)  # one over
    for env, first in ((t2, 3000), (t1, 4000), (t2, 5000)):
        # Taking t1's block would leave t1 no further over than t2 (and back): each recycles its own.
        cache_blocks(bm, env, 1, first)
    assert (bm.charged[t1.isolation_key], bm.charged[t2.isolation_key]) == (6, 5)
    assert still_cached(bm, t1_cached[1:]) and still_cached(bm, t2_cached[1:])
    bm.check_invariants()
