from __future__ import annotations

import itertools

import pytest

from engine.block_manager import AllocatorError, BlockManager
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from tests.utils.envelopes import ENV


_arrivals = itertools.count()


def make_seq(request_id: str, num_tokens: int, envelope=ENV, tokens: list[int] | None = None) -> Sequence:
    """A sequence that arrives after every one made before it."""
    token_ids = list(range(num_tokens)) if tokens is None else tokens
    return Sequence(request_id, token_ids, SamplingParams(), 1024, next(_arrivals), envelope)


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
