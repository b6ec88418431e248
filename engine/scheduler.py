"""Continuous batching under isolation, fairness and KV quotas.

Each step serves one *lane*: all shared requests together, the tenant-isolated requests
of one tenant, or one exclusive request of one tenant (see Sequence.lane). Lanes take
turns by least service (tokens processed so far; a lane that goes idle and comes back
starts level with the least-served active lane), so a tenant with a deep queue cannot
starve the others. Inside the shared lane, waiting requests are admitted tenant by
tenant, again by least service, and within a tenant by priority, then arrival.

Within the lane, running decodes go first (one token each), then prompt tokens: running
prefills take what is left of their prompt up to the budget, and waiting sequences are
admitted into whatever budget and KV remains, starting from their longest cached prefix.
While more than one tenant has work, the budget is the contended one and each tenant with
prompt tokens in the lane gets an equal part of it first (see step_budget), so one tenant's
long prompt adds a bounded step, not a whole one, to each of another tenant's tokens.
Inside the shared lane, tenants served less than LIGHT_SHARE of the most served tenant's
engine time lately take steps of their own (see _light_tenants): a step's time grows with
its rows, so a small request batched with a heavy tenant's decodes would pay for all of them.
KV shares (see BlockManager). When a sequence cannot grow, a victim is preempted: the
latest arrival of the tenant furthest over its share, if that tenant is further over
than the growing sequence's tenant will be; otherwise the growing tenant's own latest
arrival (the growing sequence itself, last). A tenant at its quota only preempts its
own. A waiting sequence whose tenant stays within its share may preempt running
sequences of tenants over theirs to be admitted, so a burst that filled the pool while
a tenant was idle gives its share back. A tenant at or under its share is never
preempted for another. A victim's blocks are freed (its full blocks stay in the prefix
cache, still charged to it) and it is recomputed from its tokens later. When nothing
runs and nothing waiting fits, cached blocks within others' shares give way (a request
larger than its share must not wait forever behind idle caches).
"""

from __future__ import annotations

import bisect
import math
import time
from collections import Counter
from dataclasses import dataclass, field

from engine.block_manager import BlockManager, KVStats, TenantKV
from engine.config import EngineConfig
from engine.envelope import Isolation
from engine.sequence import SHARED_LANE, FinishReason, Lane, Sequence, SequenceStatus
from engine.speculation import may_speculate, propose_draft

RECENT_SERVICE_S = 10.0  # the time constant of a tenant's recent engine time (see _light_tenants)
LIGHT_SHARE = 0.5  # a tenant served less than this share of the most served one's recent time is light
FORGET_AFTER_TENANTS = 1024  # past this many tenants' recent times, those long unserved are dropped
MEASURED_MIN_TOKENS = 16  # steps the cost per token is measured on (see Scheduler.observe_step)


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)  # came from the waiting queue this step
    lane: Lane = SHARED_LANE
    # Speculation: draft tokens in num_new_tokens, and (once it ran) those the model agreed with
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def deterministic(self) -> bool:
        """One deterministic request puts the whole step on the batch-invariant path."""
        return any(seq.envelope.deterministic for seq in self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __bool__(self) -> bool:
        return bool(self.seqs)


def _arrival(seq: Sequence) -> tuple[int, int]:
    # A request's choices arrived together; the later choice counts as the later arrival (the
    # one preempted first), so choice 0, which computed the shared prompt, goes last.
    return (seq.arrival_index, seq.choice_index)


def _need(seq: Sequence) -> int:
    """Tokens a running seq still needs before it samples (1: a decode)."""
    return seq.prefill_end(seq.num_computed_tokens) - seq.num_computed_tokens


def _queue_key(seq: Sequence) -> tuple[int, int]:
    return (-seq.envelope.priority, seq.arrival_index)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.contended_batched_tokens = config.contended_batched_tokens
        self.contended_step_ms = config.contended_step_ms
        self.contention_window_s = config.contention_window_s
        self.ms_per_token: float | None = None  # measured on steps of MEASURED_MIN_TOKENS or more
        self._last_work: dict[bytes, float] = {}  # tenant -> when it last had work here
        self._recent: dict[bytes, tuple[float, float]] = {}  # tenant -> (decayed service, as of when)
        self.chunked_prefill = config.enable_chunked_prefill
        self.block_manager = block_manager
        self.waiting: list[Sequence] = []  # arrival order
        self.running: list[Sequence] = []  # arrival order
        self.lane_service: Counter[Lane] = Counter()
        self.tenant_service: Counter[bytes] = Counter()
        self.num_preemptions = 0
        self.num_chunked_prefills = 0
        self.num_prefix_hit_tokens = 0
        self.num_speculative_tokens = config.num_speculative_tokens
        self.num_draft_tokens = 0  # drafted and verified so far (engine/speculation.py)
        self.num_accepted_tokens = 0  # of those, the ones the model agreed with
        self._peak_kv = block_manager.stats()

    def add(self, seq: Sequence) -> None:
        bisect.insort(self.waiting, seq, key=_arrival)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def live_sequences(self) -> list[Sequence]:
        return [*self.running, *self.waiting]

    # -- choosing the lane ----------------------------------------------------------------

    def _candidate_lanes(self) -> set[Lane]:
        lanes = {seq.lane for seq in self.running}
        running_exclusive = {seq.tenant for seq in self.running if seq.envelope.isolation is Isolation.EXCLUSIVE}
        for seq in self.waiting:
            # One exclusive request per tenant at a time: many of them are not many turns.
            if seq.envelope.isolation is Isolation.EXCLUSIVE and seq.tenant in running_exclusive:
                continue
            lanes.add(seq.lane)
        return lanes

    def _lanes_in_turn(self) -> list[Lane]:
        """Lanes with work, least served first (ties: the lane with the oldest request)."""
        lanes = self._candidate_lanes()
        known = [self.lane_service[lane] for lane in lanes if lane in self.lane_service]
        floor = min(known) if known else 0
        for lane in lanes:  # a returning lane starts level with the least served, not ahead
            self.lane_service[lane] = max(self.lane_service[lane], floor)
        oldest: dict[Lane, int] = {}
        for seq in (*self.running, *self.waiting):
            oldest.setdefault(seq.lane, seq.arrival_index)
        return sorted(lanes, key=lambda lane: (self.lane_service[lane], oldest[lane]))

    # -- one step -------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch:
        # The least-served lane may be unable to run (no sequence slot or KV left while
        # other lanes hold them): then the next lane gets the step, so nothing livelocks.
        lanes = self._lanes_in_turn()
        for lane in lanes:
            batch = self._schedule_lane(lane)
            if batch or batch.preempted:
                return batch
        if not self.running:
            # Nothing runs and nothing waiting fits: the pool is free or cached, and a request
            # larger than its share would wait forever behind idle caches. They give way.
            for lane in lanes:
                batch = self._schedule_lane(lane, last_resort=True)
                if batch:
                    return batch
        return ScheduledBatch()

    def step_budget(self) -> int:
        """The step's token budget: all of max_num_batched_tokens while one tenant has work and no
        other had any within contention_window_s; otherwise the contended budget, so another
        tenant's next token never waits behind a whole step of one tenant's long prompt (chunked
        prefill only: unchunked, a prompt must fit). The contended budget is contended_batched_tokens,
        less where the measured cost per token would make such a step longer than contended_step_ms."""
        if not self.chunked_prefill:
            return self.max_num_batched_tokens
        if not self._contended():
            return self.max_num_batched_tokens
        budget = self.contended_batched_tokens
        if self.contended_step_ms and self.ms_per_token:
            budget = min(budget, int(self.contended_step_ms / self.ms_per_token))
        # Never below max_num_seqs: every decode gets its token, and a prefill beside them at least one.
        return min(max(budget, self.max_num_seqs), self.max_num_batched_tokens)

    def _contended(self) -> bool:
        now = time.monotonic()
        for seq in (*self.running, *self.waiting):
            self._last_work[seq.tenant] = now
        for tenant, seen in list(self._last_work.items()):
            if now - seen > self.contention_window_s:
                del self._last_work[tenant]
        return len(self._last_work) > 1

    def observe_step(self, num_tokens: int, step_ms: float) -> None:
        """A step of num_tokens took step_ms: the cost per token the contended budget is sized by
        (a moving average over steps big enough that the step's fixed cost does not dominate; it
        includes a share of that cost, so it errs toward smaller contended steps)."""
        if num_tokens < MEASURED_MIN_TOKENS or step_ms <= 0:
            return
        cost = step_ms / num_tokens
        self.ms_per_token = cost if self.ms_per_token is None else 0.8 * self.ms_per_token + 0.2 * cost

    def _schedule_lane(self, lane: Lane, last_resort: bool = False) -> ScheduledBatch:
        step_budget = self.step_budget()

        in_lane = [seq for seq in self.running if seq.lane == lane]
        if lane[0] == Isolation.EXCLUSIVE.value:  # one request alone, with all of its choices
            in_lane = [seq for seq in in_lane if seq.choices is in_lane[0].choices]
        light = self._light_tenants(lane, in_lane)
        if light:
            # The light tenants' work alone; the others' decodes wait this one step. If none of it
            # can run (no seat or KV for it), the step serves everyone as usual.
            batch = self._schedule_tenants(lane, [s for s in in_lane if s.tenant in light], step_budget, light,
                                           last_resort)
            if batch or batch.preempted:
                return batch
        return self._schedule_tenants(lane, in_lane, step_budget, None, last_resort)

    def _light_tenants(self, lane: Lane, in_lane: list[Sequence]) -> set[bytes]:
        """The tenants of the lane's work served less than LIGHT_SHARE of the most served one's recent
        engine time, when there are such tenants and others. A heavy tenant's steps then lose at most
        the light tenants' own, which stay under that share of its time, or they would not be light."""
        tenants = {seq.tenant for seq in in_lane} | {seq.tenant for seq in self.waiting if seq.lane == lane}
        if len(tenants) < 2:
            return set()
        now = time.monotonic()
        served = {tenant: self._recent_service(tenant, now) for tenant in tenants}
        most = max(served.values())
        light = {tenant for tenant, ms in served.items() if ms < LIGHT_SHARE * most}
        return light if light != tenants else set()

    def _schedule_tenants(self, lane: Lane, in_lane: list[Sequence], step_budget: int, only: set[bytes] | None,
                          last_resort: bool) -> ScheduledBatch:
        """A step of the lane's running seqs in_lane and its waiting ones (only those of `only`'s
        tenants, if given)."""
        batch = ScheduledBatch(lane=lane)
        # Decodes first: a decode costs one token, and no prompt may hold back another's next token.
        decodes = [seq for seq in in_lane if _need(seq) == 1]
        prefills = [seq for seq in in_lane if _need(seq) > 1]
        self._grow_into(decodes, batch, step_budget, None)

        # Prompt tokens: each tenant with prompt work in the lane gets an equal part of what is
        # left first (its running prefills, then its waiting requests), then the leftover goes
        # to whoever still has prompt left.
        tenants = {seq.tenant for seq in prefills} | {seq.tenant for seq in self.waiting if seq.lane == lane}
        if only is not None:
            tenants &= only
        part = (step_budget - batch.num_tokens) // max(1, len(tenants))
        allowance = Counter(dict.fromkeys(tenants, part))
        if len(tenants) > 1:
            # The tenant served least lately may take up to half of each other tenant's part, so a
            # small request beside a heavy tenant's prompts is not split over several steps; what
            # it leaves goes back to the others as leftover.
            served = sorted((self._recent_service(t), t) for t in tenants)
            if served[0][0] < served[1][0]:  # strictly: tenants served alike keep equal parts
                light = served[0][1]
                for tenant in tenants - {light}:
                    allowance[tenant] -= part // 2
                    allowance[light] += part // 2
        self._grow_into(prefills, batch, step_budget, allowance)
        self._admit_waiting(lane, batch, step_budget, allowance, last_resort, only)
        if len(tenants) > 1:  # the leftover: only what free and cached blocks allow, never a preemption
            self._grow_into([*prefills, *batch.admitted], batch, step_budget, None, spare=True)
            self._admit_waiting(lane, batch, step_budget, None, last_resort, only)
        self._draft(batch, step_budget)

        self.lane_service[lane] += batch.num_tokens
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            self.tenant_service[seq.tenant] += n
        return batch

    def _draft(self, batch: ScheduledBatch, step_budget: int) -> None:
        """A lone decode (a single stream: the step is one sequence's one token) that may speculate
        verifies a draft from its own context beside its next token. Only when the step is alone:
        beside other rows the draft's rows would slow everyone's step for one sequence's gain. The
        draft never makes the sequence outgrow max_tokens or its context, and it gets blocks only
        where they are to be had without preempting anyone."""
        if self.num_speculative_tokens <= 0 or len(batch.seqs) != 1 or batch.preempted:
            return
        seq = batch.seqs[0]
        if batch.num_new_tokens[0] != 1 or seq.num_computed_tokens + 1 != seq.num_tokens or not may_speculate(seq):
            return
        # The draft and the token after it are all output if accepted: k + 1 more tokens at most.
        k = min(self.num_speculative_tokens, step_budget - 1, seq.params.max_tokens - seq.num_output_tokens - 1,
                seq.max_total_tokens - seq.num_tokens - 1)
        draft = propose_draft(seq.token_ids, k)
        if not draft or not self.block_manager.allocate(seq, seq.num_tokens + len(draft)):
            return
        seq.draft_token_ids = draft
        batch.num_new_tokens[0] += len(draft)
        batch.num_draft_tokens += len(draft)

    def charge(self, batch: ScheduledBatch, step_ms: float) -> None:
        """Charge each tenant in the batch its share of the step's time, by its tokens in it: the
        recent service that decides which tenants are light (_light_tenants) and which one takes a
        larger part of a contended step."""
        if not batch.num_tokens:
            return
        now = time.monotonic()
        per_token = step_ms / batch.num_tokens
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            self._recent[seq.tenant] = (self._recent_service(seq.tenant, now) + n * per_token, now)
        if len(self._recent) > FORGET_AFTER_TENANTS:  # tenants not served for 20 time constants weigh < 3e-9
            self._recent = {t: v for t, v in self._recent.items() if now - v[1] < 20 * RECENT_SERVICE_S}

    def _recent_service(self, tenant: bytes, now: float | None = None) -> float:
        """The tenant's engine time (ms, see charge), each step's weighted by exp(-age / RECENT_SERVICE_S)."""
        value, at = self._recent.get(tenant, (0.0, 0.0))
        if not value:
            return 0.0
        now = time.monotonic() if now is None else now
        return value * math.exp(-max(0.0, now - at) / RECENT_SERVICE_S)

    def _grow_into(self, seqs: list[Sequence], batch: ScheduledBatch, step_budget: int,
                   allowance: Counter[bytes] | None, spare: bool = False) -> None:
        """Schedule (more of) each running seq's next tokens, within the step's budget and its
        tenant's allowance, if given. spare: only into blocks to be had without preempting (a seq
        already in the batch must not preempt itself, or anyone, for more of the leftover)."""
        for seq in seqs:
            # Counted from the batch: a sequence preempted out of it gives its tokens back.
            budget = step_budget - batch.num_tokens
            if budget <= 0:
                break
            if seq not in self.running:  # preempted earlier in this step
                continue
            i = batch.seqs.index(seq) if seq in batch.seqs else None
            scheduled = 0 if i is None else batch.num_new_tokens[i]
            start = seq.num_computed_tokens + scheduled
            num_new = min(seq.prefill_end(start) - start, budget)
            if allowance is not None:
                num_new = min(num_new, allowance[seq.tenant])
            if num_new <= 0:
                continue
            if spare:
                if not self.block_manager.allocate(seq, start + num_new):
                    continue
            elif not self._grow(seq, start + num_new, batch):
                continue
            if allowance is not None:
                allowance[seq.tenant] -= num_new
            if i is None:
                batch.seqs.append(seq)
                batch.num_new_tokens.append(num_new)
            else:
                batch.num_new_tokens[batch.seqs.index(seq)] += num_new  # (a preemption may have moved it)

    def _admit_waiting(self, lane: Lane, batch: ScheduledBatch, step_budget: int,
                       allowance: Counter[bytes] | None, last_resort: bool, only: set[bytes] | None = None) -> None:
        """Admit waiting seqs of the lane into what is left of the budget (and of their tenant's
        allowance, if given), starting from their longest cached prefix."""
        # Admitting new work right after a preemption would only thrash the pool.
        while not batch.preempted and self._num_seats() < self.max_num_seqs:
            budget = step_budget - batch.num_tokens
            if budget <= 0:
                break
            if lane[0] == Isolation.EXCLUSIVE.value and batch.seqs:
                break
            seq = self._next_waiting(lane, allowance, only)
            if seq is None or self._num_seats() + seq.num_seats > self.max_num_seqs:
                break
            prefix, hashes = self.block_manager.match_prefix(seq)
            num_cached = len(prefix) * self.block_manager.block_size
            remaining = seq.prefill_end(num_cached) - num_cached
            num_new = min(remaining, budget)
            if allowance is not None:
                num_new = min(num_new, allowance[seq.tenant])
            if num_new < remaining and not self.chunked_prefill:
                break
            self.block_manager.set_quota(seq.tenant, seq.envelope.kv_block_quota)
            if not self._admit(seq, num_cached + num_new, prefix, batch, last_resort):
                break
            if allowance is not None:
                allowance[seq.tenant] -= num_new
            self.waiting.remove(seq)
            self.num_prefix_hit_tokens += num_cached
            seq.block_hashes = hashes
            seq.num_computed_tokens = num_cached
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = num_cached
            if num_new < remaining:
                self.num_chunked_prefills += 1
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.monotonic()
            batch.admitted.append(seq)
            bisect.insort(self.running, seq, key=_arrival)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)

    def advance(self, batch: ScheduledBatch, start: float, end: float, num_accepted: list[int] | None = None) -> None:
        """The batch ran from start to end: meter its KV and engine time, count its computed
        tokens, publish the blocks they filled to the prefix cache, and fork the choices of a
        request whose shared prompt is now computed. num_accepted: per sequence, the draft tokens
        the model agreed with (see _draft); they join the sequence, and the KV of the rest is
        given up: not counted as computed, its blocks past the next token's freed, never cached."""
        step_ms = (end - start) * 1000
        self.observe_step(batch.num_tokens, step_ms)
        self.charge(batch, step_ms)
        for i, (seq, num_new) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            seq.charge_kv(start)  # until the step began at the old count; from then with this step's blocks
            if seq.draft_token_ids:
                accepted = num_accepted[i] if num_accepted is not None else 0
                num_new -= len(seq.draft_token_ids) - accepted
                seq.token_ids.extend(seq.draft_token_ids[:accepted])
                self._count_draft(seq, accepted)
                batch.num_accepted_tokens += accepted
                # Blocks for the tokens computed and the one the model chose next; rejected rows' KV
                # past them goes, and what stays of it is overwritten before anything reads it.
                self.block_manager.free_tail(seq, seq.num_computed_tokens + num_new + 1)
            seq.charge_kv(end)
            seq.engine_ms += step_ms
            seq.num_computed_tokens += num_new
            self.block_manager.register_full_blocks(seq)
            if seq.num_pending_forks and seq.num_computed_tokens >= seq.fork_at:
                self.fork(seq)
        stats = self.block_manager.stats()  # the peak, before finished sequences give their blocks back
        if stats.num_used_blocks >= self._peak_kv.num_used_blocks:
            self._peak_kv = stats

    def _count_draft(self, seq: Sequence, accepted: int) -> None:
        seq.num_draft_tokens += len(seq.draft_token_ids)
        seq.num_accepted_tokens += accepted
        self.num_draft_tokens += len(seq.draft_token_ids)
        self.num_accepted_tokens += accepted
        seq.draft_token_ids = []

    def _num_seats(self) -> int:
        return sum(seq.num_seats for seq in self.running)

    def fork(self, seq: Sequence) -> None:
        """Fork a running choice 0 that has computed its fork point into the request's other choices:
        they hold its full prompt blocks and compute the rest of the prompt themselves."""
        bm = self.block_manager
        num_blocks = seq.fork_at // bm.block_size
        seq.num_shared_blocks = num_blocks
        for child in seq.choices[1:]:
            bm.fork(seq, child, num_blocks)
            child.num_borrowed_blocks = num_blocks
            child.num_computed_tokens = seq.fork_at
            child.num_cached_tokens = seq.num_cached_tokens
            child.status = SequenceStatus.RUNNING
            child.first_scheduled_time = seq.first_scheduled_time
            bisect.insort(self.running, child, key=_arrival)
        seq.num_pending_forks = 0

    def _next_waiting(self, lane: Lane, allowance: Counter[bytes] | None = None,
                      only: set[bytes] | None = None) -> Sequence | None:
        candidates = [seq for seq in self.waiting if seq.lane == lane and (only is None or seq.tenant in only)]
        if allowance is not None:
            candidates = [seq for seq in candidates if allowance[seq.tenant] > 0]
        if not candidates:
            return None
        if lane[0] == Isolation.SHARED.value:
            tenants = {seq.tenant for seq in candidates}
            tenant = min(tenants, key=lambda t: self.tenant_service[t])
            candidates = [seq for seq in candidates if seq.tenant == tenant]
        return min(candidates, key=_queue_key)

    def _grow(self, seq: Sequence, num_tokens: int, batch: ScheduledBatch) -> bool:
        """Allocate for seq, preempting others as needed; False if seq itself had to go."""
        bm = self.block_manager
        # Another tenant's running work over its share gives way before a tenant's own cached
        # blocks do: a flood that fills the pool must not cost a neighbour its prefix cache.
        while not bm.allocate(seq, num_tokens, keep_own_cache=True):
            victim = self._over_share_victim(seq.tenant, 1, batch) if bm.below_quota(seq.tenant) else None
            if victim is None:
                break
            self._preempt(victim, batch)
        else:
            return True
        while not bm.allocate(seq, num_tokens):
            victim = None
            if bm.below_quota(seq.tenant):  # at its quota, others' blocks are no use to it
                victim = self._over_share_victim(seq.tenant, 1, batch)
            if victim is None:
                victim = max((s for s in self.running if s.tenant == seq.tenant), key=_arrival)
            self._preempt(victim, batch)
            if victim is seq:
                return False
        return True

    def _admit(
        self, seq: Sequence, num_tokens: int, prefix: list[int], batch: ScheduledBatch, last_resort: bool
    ) -> bool:
        """Allocate for a waiting seq; a tenant that stays within its share preempts those over theirs."""
        bm = self.block_manager
        if bm.allocate(seq, num_tokens, prefix, last_resort):
            return True
        needed = bm.blocks_needed(seq, num_tokens) - len(prefix)
        if bm.excess(seq.tenant, bm.shares(seq.tenant)) + needed > 0:
            return False
        while (victim := self._over_share_victim(seq.tenant, needed, batch)) is not None:
            self._preempt(victim, batch)
            if bm.allocate(seq, num_tokens, prefix):
                return True
        return False

    def _over_share_victim(self, tenant: bytes, gain: int, batch: ScheduledBatch) -> Sequence | None:
        """The latest running arrival of the tenant furthest over its share, if that tenant is
        over it by more than tenant will be once it gains `gain` blocks (and by more than 0)."""
        bm = self.block_manager
        shares = bm.shares(tenant)
        floor = max(0, bm.excess(tenant, shares) + gain)
        candidates = [s for s in self.running if s.tenant != tenant and bm.excess(s.tenant, shares) > floor]
        return max(candidates, key=lambda s: (bm.excess(s.tenant, shares), *_arrival(s)), default=None)

    def _preempt(self, seq: Sequence, batch: ScheduledBatch | None = None) -> None:
        self.num_preemptions += 1
        if batch is not None:
            batch.preempted.append(seq)
            if seq in batch.seqs:  # scheduled earlier in this step: it gives its tokens back too
                i = batch.seqs.index(seq)
                del batch.seqs[i], batch.num_new_tokens[i]
                if seq in batch.admitted:
                    batch.admitted.remove(seq)
        self.running.remove(seq)
        seq.charge_kv(time.monotonic())  # what it held until now; nothing until it is scheduled again
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=_arrival)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        seq.finish(reason)
        seq.charge_kv(time.monotonic())
        self.block_manager.free(seq)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def find(self, request_id: str) -> Sequence | None:
        """A live sequence of the request (any of its choices)."""
        for seq in self.live_sequences():
            if seq.request_id == request_id:
                return seq
        return None

    # -- the KV pool, as the engine reports it ------------------------------------------

    def kv_stats(self) -> KVStats:
        return self.block_manager.stats()

    def peak_kv_stats(self) -> KVStats:
        """The pool at the step that held the most blocks so far."""
        return self._peak_kv

    def kv_usage(self) -> float:
        """The share of KV blocks held by requests (free and evictable cached blocks are not). Safe to
        read from another thread while the engine steps (BlockManager.num_held_blocks)."""
        return self.block_manager.num_held_blocks / self.block_manager.num_blocks

    def tenant_kv_usage(self) -> dict[bytes, TenantKV]:
        """Every tenant charged with KV: the blocks it holds, those it keeps cached, its share."""
        return self.block_manager.tenant_usage()

    def take_evictions(self) -> Counter[bytes]:
        """Cached blocks evicted per owner since the last call."""
        return self.block_manager.take_evictions()

    def check_invariants(self) -> None:
        """Raise AllocatorError unless the pool's bookkeeping agrees with the live sequences."""
        self.block_manager.check_invariants(self.live_sequences())
