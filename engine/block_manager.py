"""Paged KV memory: a fixed pool of blocks, per-sequence block tables, reference counts.

The block manager only does bookkeeping (no torch): block ids index the per-layer KV
pools that the model runner owns. Reference counts are there so that later a block can
be held by more than one sequence (prefix sharing); today every count is 0 or 1.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable

from engine.sequence import Sequence


class AllocatorError(RuntimeError):
    """The block pool's bookkeeping is inconsistent (a leak or a double free)."""


@dataclass(frozen=True)
class KVStats:
    num_blocks: int
    num_free_blocks: int
    allocated_slots: int
    used_slots: int

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def waste(self) -> float:
        """Share of allocated KV slots that hold no token (the tail of each last block)."""
        return 1 - self.used_slots / self.allocated_slots if self.allocated_slots else 0.0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        # Sequences that hold blocks, by request id, to report usage and check invariants.
        self._holders: dict[str, Sequence] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks seq must gain so that its table covers num_tokens slots."""
        return max(0, -(-num_tokens // self.block_size) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """Grow seq's block table to cover num_tokens slots; all or nothing."""
        needed = self.blocks_needed(seq, num_tokens)
        if needed > self.num_free_blocks:
            return False
        for _ in range(needed):
            block_id = self.free_block_ids.popleft()
            self.ref_counts[block_id] = 1
            seq.block_table.append(block_id)
        if seq.block_table:
            self._holders[seq.request_id] = seq
        return True

    def free(self, seq: Sequence) -> None:
        # Release in reverse so the tail of a sequence (least likely to be shared) goes first.
        for block_id in reversed(seq.block_table):
            if self.ref_counts[block_id] <= 0:
                raise AllocatorError(f"block {block_id} freed twice")
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self.free_block_ids.append(block_id)
        seq.block_table.clear()
        self._holders.pop(seq.request_id, None)

    def stats(self) -> KVStats:
        allocated = used = 0
        for seq in self._holders.values():
            allocated += len(seq.block_table) * self.block_size
            used += min(seq.num_computed_tokens, len(seq.block_table) * self.block_size)
        return KVStats(self.num_blocks, self.num_free_blocks, allocated, used)

    def check_invariants(self, live: Iterable[Sequence] = ()) -> None:
        """Raise AllocatorError unless every block is either free or held, never both or neither."""
        free = list(self.free_block_ids)
        if len(set(free)) != len(free):
            raise AllocatorError("a block appears twice on the free list")
        held: dict[int, int] = {}
        for seq in self._holders.values():
            if not seq.block_table:
                raise AllocatorError(f"{seq.request_id!r} is registered but holds no block")
            for block_id in seq.block_table:
                held[block_id] = held.get(block_id, 0) + 1
        free_set = set(free)
        for block_id in range(self.num_blocks):
            refs = held.get(block_id, 0)
            if refs != self.ref_counts[block_id]:
                raise AllocatorError(f"block {block_id}: ref count {self.ref_counts[block_id]} but {refs} holders")
            if (refs == 0) != (block_id in free_set):
                raise AllocatorError(f"block {block_id}: free-list membership disagrees with its ref count")
        live_ids = {seq.request_id for seq in live}
        leaked = set(self._holders) - live_ids
        if leaked:
            raise AllocatorError(f"{len(leaked)} finished or unknown sequences still hold blocks")
