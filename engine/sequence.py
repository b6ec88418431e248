"""Request state as the scheduler and block manager see it: token ids, KV blocks, progress."""

from __future__ import annotations

import enum
import time
from typing import Any, NamedTuple

from engine.envelope import ExecutionEnvelope, Isolation, PublicSegment
from engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):  # noqa: UP042 - StrEnum changes str() and f-strings of a member
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


class Lane(NamedTuple):
    """Who a sequence may share a step with: every shared request (no tenant), or one tenant's
    tenant-isolated requests, or one tenant's exclusive ones (see Scheduler)."""

    isolation: str  # Isolation's value
    tenant: bytes | None = None  # the isolation key, for a lane of one tenant


SHARED_LANE = Lane("shared")


class Sequence:
    """One choice of a request. Its KV covers token_ids[:num_computed_tokens]; the rest still has to run.

    After preemption the blocks are freed and num_computed_tokens drops to zero, so the
    prompt and the output generated so far are recomputed as one prefill.

    A request for n > 1 choices starts as choice 0 alone. It prefills the prompt's full
    blocks up to fork_at (the blocks the prefix cache would match), then forks into n
    sequences that hold those blocks together (Scheduler.fork); each computes the rest of
    the prompt (less than a block and one token) in blocks of its own and samples on.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        max_total_tokens: int,
        arrival_index: int,
        envelope: ExecutionEnvelope,
        choice_index: int = 0,
    ) -> None:
        self.request_id = request_id  # the request's: every choice of it has the same
        self.choice_index = choice_index
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.max_total_tokens = max_total_tokens
        self.arrival_index = arrival_index
        self.arrival_time = time.monotonic()
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.block_table: list[int] = []
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.envelope = envelope
        # Chain hashes of the full blocks registered (or matched) so far, in order.
        self.block_hashes: list[bytes] = []
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache at admission
        # The public segment the prompt starts with (block_manager.public_prefix) and the blocks
        # wholly inside it, which are keyed in the segment's namespace: set once, before admission.
        self.public_segment: PublicSegment | None = None
        self.num_public_blocks = 0
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.top_margins: list[float] = []  # top-1 minus top-2 logit of the first steps
        # Metering: KV blocks held integrated over time, and time spent in the steps it ran in.
        self.kv_block_seconds = 0.0
        self.engine_ms = 0.0
        self._kv_held = 0  # blocks held since _kv_since
        self._kv_since = self.arrival_time
        self.raw_prompt_digest = ""
        # Set by the engine: the incremental detokenizer for stop strings and text deltas, and for
        # structured outputs the grammar matcher that says which tokens may come next.
        self.detokenizer: Any = None
        # Choices: the request's sequences in choice order (this one alone until it forks),
        # the choices still to fork off it, the prompt tokens they will share, and the blocks
        # of this sequence's table that another choice computed (not metered here).
        self.choices: list[Sequence] = [self]
        self.num_pending_forks = params.n - 1 if choice_index == 0 else 0
        self.fork_at = 0
        self.num_borrowed_blocks = 0
        self.num_shared_blocks = 0  # choice 0: the blocks the choices shared at the fork
        self.grammar: Any = None
        # Speculation (engine/speculation.py): the draft this step verifies after the next token,
        # and the drafted and accepted tokens so far.
        self.draft_token_ids: list[int] = []
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, status={self.status.value})"
        )

    @property
    def seq_id(self) -> str:
        """Unique among live sequences: the sampler's and the block manager's key."""
        return self.request_id if self.choice_index == 0 else f"{self.request_id}#{self.choice_index}"

    @property
    def num_seats(self) -> int:
        """Batch slots this sequence takes, with the choices it will fork into."""
        return 1 + self.num_pending_forks

    def prefill_end(self, num_computed: int) -> int:
        """Where a step starting at num_computed stops: the fork point while the choices wait for it."""
        if self.num_pending_forks and num_computed < self.fork_at:
            return self.fork_at
        return self.num_tokens

    @property
    def tenant(self) -> bytes:
        return self.envelope.isolation_key

    @property
    def lane(self) -> Lane:
        """Who this sequence may share a step with (see Scheduler)."""
        isolation = self.envelope.isolation
        if isolation is Isolation.SHARED:
            return SHARED_LANE
        return Lane(isolation.value, self.tenant)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def charge_kv(self, now: float) -> None:
        """Adds the blocks held since the last charge times the time since; called wherever the
        block table changes (a step, a preemption, the end), so each interval has one count."""
        self.kv_block_seconds += self._kv_held * (now - self._kv_since)
        self._kv_held = len(self.block_table) - self.num_borrowed_blocks
        self._kv_since = now

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def finish(self, reason: FinishReason) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason

    def release_choices(self) -> None:
        """Once every choice of the request has ended (and its x-record is made): the choices let go
        of their shared list. Each is in it, a reference cycle that would leave every request's
        sequences, detokenizers and envelopes to the cyclic collector instead of going at once."""
        choices = self.choices
        if all(choice.is_finished for choice in choices):
            for choice in choices:
                choice.choices = []
