"""What the engine hands back after each step: per-request deltas, never whole texts twice."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the outputs' types import no torch, so the wire format and the CLI load without it
    import torch


@dataclass(frozen=True)
class TokenLogprobs:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, logprob), best first


@dataclass
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    new_text: str
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    finished: bool = False
    finish_reason: str | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    index: int = 0  # which of the request's n choices (counts and finished are that choice's own)


@dataclass
class CompletedRequest:
    """A whole request's result, assembled from its deltas (LLMEngine.generate)."""

    request_id: str
    token_ids: list[int]
    text: str
    num_prompt_tokens: int
    num_cached_tokens: int
    finish_reason: str | None
    logprobs: list[TokenLogprobs]
    logits: list[torch.Tensor]
    index: int = 0

    @classmethod
    def from_deltas(cls, deltas: list[RequestOutput]) -> CompletedRequest:
        last = deltas[-1]
        return cls(
            request_id=last.request_id,
            token_ids=[t for d in deltas for t in d.new_token_ids],
            text="".join(d.new_text for d in deltas),
            num_prompt_tokens=last.num_prompt_tokens,
            num_cached_tokens=last.num_cached_tokens,
            finish_reason=last.finish_reason,
            logprobs=[lp for d in deltas for lp in d.logprobs],
            logits=[row for d in deltas for row in d.logits],
            index=last.index,
        )
