"""Per-request decode settings, validated at the edge so the engine never sees nonsense."""

from __future__ import annotations

from dataclasses import dataclass


class SamplingParamsError(ValueError):
    """A decode setting outside its valid range; the message names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None = no logprobs; k >= 0 = chosen token plus top-k alternatives
    skip_special_tokens: bool = True
    # Tests and the deterministic-lane checks compare raw logits; never set by the gateway.
    keep_logits: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens <= 0:
            raise SamplingParamsError("max_tokens", f"must be a positive integer, got {self.max_tokens!r}")
        if not _is_number(self.temperature) or self.temperature < 0:
            raise SamplingParamsError("temperature", f"must be >= 0, got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise SamplingParamsError("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise SamplingParamsError("top_k", f"must be a non-negative integer (0 disables it), got {self.top_k!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise SamplingParamsError("seed", f"must be an integer, got {self.seed!r}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise SamplingParamsError("logprobs", f"must be between 0 and {MAX_TOP_LOGPROBS}, got {self.logprobs!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise SamplingParamsError("stop", "stop strings must be non-empty strings")
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
