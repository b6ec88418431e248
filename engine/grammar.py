"""Constrained decoding: JSON schemas compiled by llguidance into per-request matchers, and one
bitmask for the whole batch each step.

llguidance (guidance-ai's Rust parser) computes the set of tokens that keep a request's output
a valid prefix of its grammar; the sampler sets every other logit to -inf. Why llguidance and
not xgrammar or outlines-core: docs/api.md, "Structured outputs" (bench/constrained.py).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import cast

import llguidance
import torch

from engine.envelope import ExecutionEnvelope
from engine.errors import RequestError
from engine.grammar_compiler import GrammarCompiler, GrammarError
from engine.grammar_probe import ProbeWorker
from engine.tokenizer import Tokenizer

BITS = 32


class Grammars:
    """The engine's grammars: one llguidance tokenizer for the model (built on first use: it takes a
    quarter of a second and most engines never need it), schemas compiled off the caller's thread
    within a time bound (GrammarCompiler), matchers per request, and one bitmask per step for all
    constrained rows, filled on a thread pool."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_id: int | None, *,
                 compile_timeout_s: float = 2.0, compile_workers: int = 2, cache_size: int = 256) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos = eos_token_id
        self._lock = threading.Lock()
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._executor: llguidance.LLExecutor | None = None
        self._filler: ThreadPoolExecutor | None = None  # one thread that hands each step's masks to llguidance
        self.compiler = GrammarCompiler(self._ll, self._probe_worker, compile_timeout_s, compile_workers, cache_size)

    def _ll(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = llguidance.LLTokenizer(
                    self._tokenizer.backend_json(), n_vocab=self.vocab_size, eos_token=self._eos)
                self._executor = llguidance.LLExecutor(os.cpu_count() or 1)
                self._filler = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
            return self._ll_tokenizer

    def _probe_worker(self) -> ProbeWorker:
        return ProbeWorker(self._tokenizer.backend_json(), self.vocab_size, self._eos)

    def compile(self, json_schema: str, envelope: ExecutionEnvelope) -> llguidance.LLMatcher:
        """The schema's compiled grammar (see matchers), waiting here for it; RequestError if it
        cannot be compiled, or not within the time bound."""
        try:
            return self.compiler.submit(json_schema, envelope).result()
        except GrammarError as exc:
            raise _refusal(exc) from None

    async def compile_async(self, json_schema: str, envelope: ExecutionEnvelope) -> llguidance.LLMatcher:
        """compile(), awaited: the event loop runs on meanwhile. A caller that leaves while its
        schema waits for a worker takes it out of the queue."""
        try:
            return await asyncio.wrap_future(self.compiler.submit(json_schema, envelope))
        except GrammarError as exc:
            raise _refusal(exc) from None

    def matchers(self, grammar: llguidance.LLMatcher, count: int) -> list[llguidance.LLMatcher]:
        """Fresh matchers for a request's outputs (one per choice: each walks the grammar on its own),
        copies of one compiled grammar."""
        return [grammar.deep_copy() for _ in range(count)]

    def close(self) -> None:
        self.compiler.close()

    def bitmask_async(self, matchers: Sequence[llguidance.LLMatcher]) -> Future[torch.Tensor]:
        """bitmask(matchers), computed on a thread of its own, so it overlaps the step's forward pass."""
        self._ll()
        return self._filler.submit(self.bitmask, list(matchers))  # type: ignore[union-attr]  # _ll() has set it

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
            executor = cast("llguidance.LLExecutor", self._executor)  # _ll() has set it
            executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], bitmask.data_ptr(),
                                             words * 4, len(matchers))
        return bitmask


def _refusal(exc: GrammarError) -> RequestError:
    return RequestError(f"the JSON schema cannot be enforced: {exc}", param="response_format",
                        code="invalid_json_schema")


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
