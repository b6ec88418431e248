"""Per-request decode settings, validated at the edge so the engine never sees nonsense."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from engine.errors import SamplingParamsError

MAX_TOP_LOGPROBS = 20
MAX_CHOICES = 128  # OpenAI's bound on n
# OpenAI's ranges: penalties in [-2, 2], logit_bias values in [-100, 100] on at most 300 tokens.
MAX_PENALTY = 2.0
MAX_LOGIT_BIAS = 100.0
MAX_LOGIT_BIAS_TOKENS = 300
# Below this a temperature only overflows the logits; it means greedy (as in vLLM).
GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    # Choices sampled from one prompt. With a seed, choice i samples with seed + i (mod 2**63),
    # as vLLM's parallel sampling does: it draws what n=1 with that seed draws.
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    min_p: float = 0.0  # 0 = disabled; else drop tokens below min_p x the top token's probability
    # OpenAI's, over the tokens generated so far: logit[j] -= count[j] * frequency + (count[j] > 0) * presence
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # (token id, bias) pairs, sorted by id: added to the logits before any penalty, temperature or truncation.
    # A mapping {id: bias} is accepted too (ids as ints or decimal strings, as OpenAI's JSON has them).
    logit_bias: tuple[tuple[int, float], ...] = ()
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None = no logprobs; k >= 0 = chosen token plus top-k alternatives
    skip_special_tokens: bool = True
    # Structured outputs: a JSON schema (as JSON text) the output must match, enforced token by token
    # (engine/grammar.py); {"type": "object"} is OpenAI's json_object. None = unconstrained.
    json_schema: str | None = None
    # Tests and the deterministic-lane checks compare raw logits; never set by the gateway.
    keep_logits: bool = False

    def __post_init__(self) -> None:
        if not _is_int(self.max_tokens) or self.max_tokens <= 0:
            raise SamplingParamsError("max_tokens", f"must be a positive integer, got {self.max_tokens!r}")
        if not _is_int(self.n) or not 1 <= self.n <= MAX_CHOICES:
            raise SamplingParamsError("n", f"must be an integer from 1 to {MAX_CHOICES}, got {self.n!r}")
        if not _is_number(self.temperature) or self.temperature < 0:
            raise SamplingParamsError("temperature", f"must be >= 0, got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise SamplingParamsError("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise SamplingParamsError("top_k", f"must be a non-negative integer (0 disables it), got {self.top_k!r}")
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise SamplingParamsError("min_p", f"must be in [0, 1], got {self.min_p!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise SamplingParamsError(name,
                                          f"must be a number from -{MAX_PENALTY:g} to {MAX_PENALTY:g}, got {value!r}")
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**63):
            raise SamplingParamsError("seed", f"must be an integer in [0, 2**63), got {self.seed!r}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise SamplingParamsError("logprobs",
                                      f"must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {self.logprobs!r}")
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, (list, tuple)) or any(not isinstance(s, str) or not s for s in stop):
            raise SamplingParamsError("stop", "must be a non-empty string or a list of them")
        stop_ids = self.stop_token_ids
        if not isinstance(stop_ids, (list, tuple)) or not all(_is_int(t) and t >= 0 for t in stop_ids):
            raise SamplingParamsError("stop_token_ids", "must be a list of non-negative integers")
        if self.json_schema is not None and (not isinstance(self.json_schema, str) or not self.json_schema):
            raise SamplingParamsError("json_schema", "must be a JSON schema as JSON text")
        object.__setattr__(self, "stop", tuple(stop))
        object.__setattr__(self, "stop_token_ids", tuple(stop_ids))

    def for_choice(self, choice: int) -> SamplingParams:
        """The settings choice `choice` of n samples with: one choice, and its own seed."""
        seed = None if self.seed is None else (self.seed + choice) % 2**63
        return dataclasses.replace(self, n=1, seed=seed)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def penalized(self) -> bool:
        """Whether sampling reads the tokens generated so far."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0


def _logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    items = list(value.items()) if isinstance(value, Mapping) else value
    if not isinstance(items, (list, tuple)):
        raise SamplingParamsError("logit_bias", "must map token ids to biases")
    pairs = {}
    for item in items:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise SamplingParamsError("logit_bias", "must map token ids to biases")
        token, bias = item
        if isinstance(token, str) and token.isascii() and token.isdigit():
            token = int(token)
        if not _is_int(token) or token < 0:
            raise SamplingParamsError("logit_bias", f"keys must be non-negative token ids, got {str(token)[:32]!r}")
        if not _is_number(bias) or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise SamplingParamsError("logit_bias", f"biases must be numbers from -{MAX_LOGIT_BIAS:g} to "
                                                    f"{MAX_LOGIT_BIAS:g}, got {bias!r} for token {token}")
        pairs[token] = float(bias)
    if len(pairs) > MAX_LOGIT_BIAS_TOKENS:
        raise SamplingParamsError("logit_bias", f"may bias at most {MAX_LOGIT_BIAS_TOKENS} tokens, got {len(pairs)}")
    return tuple(sorted(pairs.items()))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
