from __future__ import annotations

from pathlib import Path

import pytest

from devkit.checkpoints import write_checkpoint
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine


@pytest.fixture
def make_engine():
    """Build engines whose allocator invariants are checked after every step and at teardown."""
    engines: list[LLMEngine] = []

    def factory(**kwargs) -> LLMEngine:
        kwargs.setdefault("kv_cache_memory_bytes", 16 << 20)
        kwargs.setdefault("dtype", "float32")  # the HF oracles run in float32; "auto" may pick bfloat16 here
        engine = LLMEngine(EngineConfig(**kwargs))
        step = engine.step

        def checked_step():
            outputs = step()
            engine.check_invariants()
            return outputs

        engine.step = checked_step
        engines.append(engine)
        return engine

    yield factory
    for engine in engines:
        engine.check_invariants()
        if not engine.has_unfinished_requests():
            assert engine.kv_stats().num_used_blocks == 0, "blocks leaked"


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("llama"), "llama", tie_word_embeddings=False)


@pytest.fixture(scope="session")
def qwen2_tied_dir(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("qwen2"), "qwen2", tie_word_embeddings=True, seed=1)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A small Llama checkpoint with a real BPE tokenizer, for behaviour (not oracle) tests."""
    return write_checkpoint(tmp_path_factory.mktemp("tiny"), "llama", seed=1)
