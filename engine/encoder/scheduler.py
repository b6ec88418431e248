"""Which inputs the encoder runs next: small steps, shared fairly across tenants.

Each request is an EncodeJob in its tenant's queue. A step (one Encoder.embed call, which runs
its inputs in forwards of similar lengths) takes at most `max_tokens` tokens, filled by deficit
round robin over the tenants by tokens (Shreedhar and Varghese, 1995): each tenant visited gains
`quantum` tokens of credit and takes inputs while its credit covers them, so every waiting tenant
gets about as many tokens encoded as any other, whatever its requests' sizes. One tenant's large
request delays another tenant's by about one step, not by all of it.

Only jobs of one lane share a step: shared requests with any shared one, a tenant's
tenant-isolated requests with each other, and an exclusive or deterministic request with none,
its inputs in the same slices whatever else waits, so its vectors depend on its inputs alone.
Free of torch, like the engine's scheduler.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from engine.envelope import ExecutionEnvelope, Isolation

_job_ids = itertools.count()


def lane_of(envelope: ExecutionEnvelope, job_id: int) -> Hashable:
    """Which jobs may share a step with this one: those of the same lane."""
    if envelope.deterministic or envelope.isolation is Isolation.EXCLUSIVE:
        return ("alone", job_id)
    if envelope.isolation is Isolation.TENANT:
        return ("tenant", envelope.isolation_key)
    return ("shared",)


@dataclass(eq=False)
class EncodeJob:
    """One request's inputs, handed to steps shortest first (less padding beside each other)."""

    inputs: list[list[int]]
    envelope: ExecutionEnvelope
    id: int = field(default_factory=lambda: next(_job_ids))
    taken: int = 0  # inputs already in a step
    done: int = 0  # inputs encoded
    cancelled: bool = False

    def __post_init__(self) -> None:
        self.order = sorted(range(len(self.inputs)), key=lambda i: len(self.inputs[i]))
        self.lane = lane_of(self.envelope, self.id)

    @property
    def tenant(self) -> bytes:
        return self.envelope.isolation_key

    @property
    def waiting(self) -> bool:
        return not self.cancelled and self.taken < len(self.order)

    def next_cost(self) -> int:
        return len(self.inputs[self.order[self.taken]])

    def take(self) -> int:
        index = self.order[self.taken]
        self.taken += 1
        return index


Slot = tuple[EncodeJob, int]  # a job and the index of one of its inputs


class _Step:
    def __init__(self, max_tokens: int) -> None:
        self.slots: list[Slot] = []
        self.room = max_tokens

    def add(self, job: EncodeJob) -> None:
        self.room -= job.next_cost()
        self.slots.append((job, job.take()))


class EncoderScheduler:
    def __init__(self, *, max_tokens: int, quantum: int) -> None:
        if quantum < 1 or max_tokens < quantum:
            raise ValueError("quantum must be at least 1 and max_tokens at least quantum")
        self.max_tokens = max_tokens
        self.quantum = quantum  # at least the longest input, so every visit takes one
        self._queues: dict[bytes, deque[EncodeJob]] = {}
        self._ring: deque[bytes] = deque()  # tenants with waiting jobs; the first leads the next step
        self._credit: dict[bytes, int] = {}

    def add(self, job: EncodeJob) -> None:
        if not job.order:
            return
        if job.tenant not in self._queues:
            self._queues[job.tenant] = deque()
            self._ring.append(job.tenant)
            self._credit[job.tenant] = 0
        self._queues[job.tenant].append(job)

    def has_work(self) -> bool:
        self._drop_finished()
        return bool(self._ring)

    def next_step(self) -> list[Slot]:
        """The inputs of the next step: the leading tenant's first job sets the lane, then rounds
        over the tenants in ring order fill it; the leader goes to the back of the ring."""
        if not self.has_work():
            return []
        lane = self._queues[self._ring[0]][0].lane
        step = _Step(self.max_tokens)
        progress = True
        while progress:
            progress = False
            for tenant in list(self._ring):
                progress |= self._visit(tenant, lane, step)
        self._ring.rotate(-1)
        self._drop_finished()
        return step.slots

    def _visit(self, tenant: bytes, lane: Hashable, step: _Step) -> bool:
        """One deficit-round-robin visit: credit for a quantum, then inputs of `lane` while it lasts."""
        jobs = [job for job in self._queues[tenant] if job.waiting and job.lane == lane]
        if not jobs or step.room <= 0:
            return False
        credit = self._credit[tenant] + self.quantum
        took = False
        for job in jobs:
            while job.waiting and job.next_cost() <= min(credit, step.room):
                credit -= job.next_cost()
                step.add(job)
                took = True
        # Credit left over when the step filled carries to the next visit, at most one quantum.
        self._credit[tenant] = min(credit, self.quantum)
        return took

    def _drop_finished(self) -> None:
        for tenant in list(self._ring):
            queue = self._queues[tenant]
            while queue and not queue[0].waiting:
                queue.popleft()
            if not queue:
                self._ring.remove(tenant)
                del self._queues[tenant], self._credit[tenant]
