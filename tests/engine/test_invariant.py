"""The self-check that lets the deterministic lane run row-wise work on a few call sizes."""

from __future__ import annotations

import pytest
import torch

from engine.model.invariant import ROW_SIZES, ROW_TILE, apply_rows, rows_are_invariant


def test_apply_rows_calls_fn_only_with_the_given_sizes() -> None:
    seen = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.shape[0])
        return x * 2

    x = torch.randn(1300, 3)
    assert torch.equal(apply_rows(fn, x, ROW_SIZES), x * 2)
    assert seen == [512, 512, 384]


def test_a_row_local_function_passes_the_check() -> None:
    weight = torch.randn(24, 16)
    assert rows_are_invariant([(lambda x: x @ weight.T, 16)], (8, 16, 64, 128), torch.float32, "cpu")


@pytest.mark.parametrize("depends_on", ["call size", "other rows"])
def test_a_function_that_is_not_row_local_fails_the_check(depends_on) -> None:
    if depends_on == "call size":
        def fn(x):
            return x * x.shape[0]
    else:
        def fn(x):
            return x - x.mean(0)
    assert not rows_are_invariant([(fn, 16)], (8, 16, 64, 128), torch.float32, "cpu")


def test_the_runner_falls_back_to_fixed_tiles_when_the_check_fails(tiny_dir, monkeypatch) -> None:
    from engine import model_runner
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(model=str(tiny_dir), kv_cache_memory_bytes=8 << 20))
    monkeypatch.setattr(model_runner, "rows_are_invariant", lambda *args: False)
    assert engine.runner.invariant_row_sizes() == (ROW_TILE,)
