"""The oracle side of the engine's correctness tests: small random checkpoints, their HF greedy
paths and logits, and the check an engine's results must pass (tests/engine/test_model_oracle.py
states the tolerance; bench/gpu_check.py runs the same check on a GPU)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from devkit.checkpoints import load_reference, reference_greedy
from engine import SamplingParams

NEW_TOKENS = 32
NUM_PROMPTS = 16
ATOL = 2e-4
MIN_DISTINCT_TOKENS = 8


@dataclass
class Reference:
    path: Path
    prompts: list[list[int]]
    tokens: list[list[int]]
    logits: list[torch.Tensor]


def random_prompts(vocab: int, seed: int, count: int = NUM_PROMPTS, max_len: int = 60) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, max_len, (count,), generator=g).tolist()
    return [torch.randint(2, vocab, (n,), generator=g).tolist() for n in lengths]


def build_reference(path: Path, seed: int, max_len: int = 60, count: int = NUM_PROMPTS) -> Reference:
    model = load_reference(path)
    prompts = random_prompts(model.config.vocab_size, seed, count, max_len)
    tokens, logits = zip(*(reference_greedy(model, p, NEW_TOKENS) for p in prompts))
    reference = Reference(path, prompts, list(tokens), list(logits))
    assert_clear_greedy_paths(reference)
    return reference


def assert_clear_greedy_paths(reference: Reference) -> None:
    """The oracle's greedy paths are decided by clear margins and do not repeat one token."""
    for tokens, logits in zip(reference.tokens, reference.logits):
        top2 = logits.topk(2, dim=-1).values
        assert (top2[:, 0] - top2[:, 1]).min() > 2 * ATOL
        assert len(set(tokens)) >= MIN_DISTINCT_TOKENS


CHECKPOINTS = {
    "llama-untied": dict(arch="llama", tie_word_embeddings=False, seed=1),
    "qwen2-tied": dict(arch="qwen2", tie_word_embeddings=True, seed=1),
    "qwen2-untied": dict(arch="qwen2", tie_word_embeddings=False, seed=1, num_heads=8, num_kv_heads=2),
}


def greedy(**overrides) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, keep_logits=True, **overrides)


def assert_matches(reference: Reference, results) -> None:
    for i, result in enumerate(results):
        assert result.token_ids == reference.tokens[i], f"prompt {i} diverged"
        torch.testing.assert_close(torch.stack(result.logits), reference.logits[i], rtol=0, atol=ATOL)
