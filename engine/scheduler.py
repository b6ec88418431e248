"""Continuous batching: which sequences run in the next step, and how many tokens each.

Every step has a token budget. Running sequences go first (a decode costs one token,
an unfinished prefill takes what is left of its prompt up to the budget); waiting
sequences are admitted FCFS into whatever budget and KV remains. When a running
sequence cannot grow, the most recently arrived one is preempted: its blocks are freed
and it is recomputed from its tokens later.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.sequence import FinishReason, Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __bool__(self) -> bool:
        return bool(self.seqs)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.chunked_prefill = config.enable_chunked_prefill
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_chunked_prefills = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def live_sequences(self) -> list[Sequence]:
        return [*self.running, *self.waiting]

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens

        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_uncomputed_tokens, budget)
            target = seq.num_computed_tokens + num_new
            while not self.block_manager.allocate(seq, target):
                victim = self.running.pop()
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            else:
                batch.seqs.append(seq)
                batch.num_new_tokens.append(num_new)
                budget -= num_new
                i += 1

        # Admitting new work right after a preemption would only thrash the pool.
        while self.waiting and budget > 0 and not batch.preempted and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            num_new = min(seq.num_uncomputed_tokens, budget)
            if num_new < seq.num_uncomputed_tokens and not self.chunked_prefill:
                break
            if not self.block_manager.allocate(seq, seq.num_computed_tokens + num_new):
                break
            if num_new < seq.num_uncomputed_tokens:
                self.num_chunked_prefills += 1
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            # Running stays in arrival order: a re-admitted, preempted sequence keeps its
            # seniority, so the victim of the next preemption is always the latest arrival.
            bisect.insort(self.running, seq, key=lambda s: s.arrival_index)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
        return batch

    def _preempt(self, seq: Sequence) -> None:
        self.num_preemptions += 1
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        seq.finish(reason)
        self.block_manager.free(seq)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def find(self, request_id: str) -> Sequence | None:
        for seq in self.live_sequences():
            if seq.request_id == request_id:
                return seq
        return None
