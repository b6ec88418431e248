"""Constrained decoding: JSON schemas compiled by llguidance into per-request matchers, and one
bitmask for the whole batch each step.

llguidance (guidance-ai's Rust parser) computes the set of tokens that keep a request's output
a valid prefix of its grammar; the sampler sets every other logit to -inf. Why llguidance and
not xgrammar or outlines-core: docs/api.md, "Structured outputs" (bench/constrained.py).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance
import torch

from engine.tokenizer import Tokenizer

BITS = 32
MAX_ERROR_CHARS = 200
# Compact JSON (no whitespace between tokens): what OpenAI's strict mode produces, and what a small
# model finishes soonest.
JSON_DEFAULTS = {"whitespace_flexible": False}


class GrammarError(ValueError):
    """A schema the grammar library refuses; the message is the library's, cut short."""


class Grammars:
    """The engine's grammar compiler: one llguidance tokenizer for the model (built on first use:
    it takes a quarter of a second and most engines never need it), matchers per request, and one
    bitmask per step for all constrained rows, filled on a thread pool."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_id: int | None) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos = eos_token_id
        self._lock = threading.Lock()
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._executor: llguidance.LLExecutor | None = None
        self._filler: ThreadPoolExecutor | None = None  # one thread that hands each step's masks to llguidance

    def _ll(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = llguidance.LLTokenizer(
                    self._tokenizer.backend_json(), n_vocab=self.vocab_size, eos_token=self._eos)
                self._executor = llguidance.LLExecutor(os.cpu_count() or 1)
                self._filler = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
            return self._ll_tokenizer

    def matchers(self, json_schema: str, count: int) -> list[llguidance.LLMatcher]:
        """Fresh matchers for a request's outputs (one per choice: each walks the grammar on its own),
        from one compilation of the schema; GrammarError if it cannot be compiled."""
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json_schema, defaults=JSON_DEFAULTS)
        tokenizer = self._ll()
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if error:
            raise GrammarError(error[:MAX_ERROR_CHARS])
        matchers = [llguidance.LLMatcher(tokenizer, grammar) for _ in range(count)]
        if matchers[0].is_error():
            raise GrammarError(matchers[0].get_error()[:MAX_ERROR_CHARS])
        return matchers

    def bitmask_async(self, matchers: Sequence[llguidance.LLMatcher]) -> Future[torch.Tensor]:
        """bitmask(matchers), computed on a thread of its own, so it overlaps the step's forward pass."""
        self._ll()
        return self._filler.submit(self.bitmask, list(matchers))

    def bitmask(self, matchers: Sequence[llguidance.LLMatcher]) -> torch.Tensor:
        """[len(matchers), words] int32: the tokens each matcher allows next (see apply_bitmask)."""
        self._ll()
        words = bitmask_words(self.vocab_size)
        bitmask = torch.empty(len(matchers), words, dtype=torch.int32)
        # llguidance writes into the tensor's memory (what llguidance.torch does, without importing it:
        # that module compiles a kernel with torch.compile at import, which the engine never uses).
        if len(matchers) == 1:
            matchers[0].unsafe_compute_mask_ptr(bitmask.data_ptr(), words * 4)
        else:
            self._executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], bitmask.data_ptr(),
                                                   words * 4, len(matchers))
        return bitmask


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + BITS - 1) // BITS


# Per byte of a bitmask, what to add to its 8 tokens' logits: 0 where the bit is set, -inf where not.
_BYTE_TO_ADDEND = torch.where(((torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1).bool(), 0.0, float("-inf"))


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Set logits[row, token] to -inf wherever bit token of bitmask[row] (int32 words, llguidance's
    layout: token t is bit t % 32 of word t // 32) is 0, in place, for the whole batch in one op.
    Allowed logits get + 0.0, which leaves them bit for bit as they were; each row reads only its
    own mask, so a row's result does not depend on its batch (the deterministic lane relies on it).

    One lookup per mask byte (a little-endian int32 word's bytes hold its tokens in order) and one
    add: five times faster at 32 rows than unpacking the bits with shifts."""
    vocab = logits.shape[-1]
    table = _BYTE_TO_ADDEND.to(device=logits.device, dtype=logits.dtype)
    mask_bytes = bitmask.to(logits.device).contiguous().view(torch.uint8).flatten().int()
    addend = torch.index_select(table, 0, mask_bytes).view(logits.shape[0], -1)[:, :vocab]
    return logits.add_(addend)
