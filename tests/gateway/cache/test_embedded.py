"""The audit against the embedded engine: two tenants' namespaces do not leak, one shared namespace
does, and in both runs the positive control (the same namespace) is significant.

The demo model on one CPU thread, 256-token prefixes (16 blocks): a miss prefills 260 tokens, a hit
4, about 50 ms against 13 ms on an AMX Xeon, so 16 trials separate hits from misses completely
(p ~ 1e-8) while a run stays near 5 s. (With 64-token prefixes a miss took 200 ms against 50 on
the CPUs these tests first ran on, but 17 ms against 11 where oneDNN's bf16 matmuls use AMX: the
hit's fixed cost then came within half a miss, which the magnitude checks below require.) The
tests use alpha 0.001: when namespaces hold, the cross probes and the misses are exchangeable, so
the no-leak test fails by chance in at most 0.1% of runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import AsyncLLMEngine, EngineConfig, LLMEngine
from gateway.cache import AuditBudget, TokenTarget, Verdict, audit_envelopes, run_audit, token_prefixes

PREFIX_TOKENS = 256
BUDGET = AuditBudget(trials=16, max_requests=80, max_seconds=120)
ALPHA = 0.001


@pytest.fixture
def engine(demo_model_dir: Path) -> Iterator[AsyncLLMEngine]:
    engine = AsyncLLMEngine(LLMEngine(EngineConfig(model=str(demo_model_dir), kv_cache_memory_bytes=32 << 20,
                                                   threads=1, max_num_seqs=4)))
    yield engine
    engine.shutdown()
    engine.engine.check_invariants()
    assert engine.engine.kv_stats().num_used_blocks == 0, "blocks leaked"


async def _audit(engine: AsyncLLMEngine, *, shared: bool):
    vocab = engine.engine.model_config.vocab_size
    target = TokenTarget(engine.generate, audit_envelopes(shared=shared), vocab_size=vocab)
    return await run_audit(target, token_prefixes(PREFIX_TOKENS, vocab), budget=BUDGET, alpha=ALPHA)


async def test_tenant_scope_does_not_leak_and_the_control_sees_hits(engine: AsyncLLMEngine) -> None:
    result = await _audit(engine, shared=False)
    assert result.control.p_value < result.alpha, result.as_dict()
    assert result.control.probe_median_s < result.control.baseline_median_s / 2, result.as_dict()
    assert result.verdict is Verdict.NO_LEAK, result.as_dict()
    assert result.cross.p_value >= result.alpha
    assert result.trials == 16 and result.cross.n_probe == result.cross.n_baseline == 16


async def test_a_shared_namespace_leaks_and_the_control_sees_hits(engine: AsyncLLMEngine) -> None:
    result = await _audit(engine, shared=True)
    assert result.control.p_value < result.alpha, result.as_dict()
    assert result.verdict is Verdict.LEAK, result.as_dict()
    assert result.cross.probe_median_s < result.cross.baseline_median_s / 2, result.as_dict()
