"""`tenantgate cache audit` against a real llama.cpp llama-server on SmolLM2: one cache for every
request (no namespace knob), so the audit must report the leak, its positive control significant.

llama-server keeps the last prompt's KV in its slot and, with its host-memory prompt cache
(--cache-ram, on by default), the earlier prompts' too: a probe of the victim's prefix is served
from there whichever probe ran before it, and whichever namespace the audit meant it for. The
fixture's one slot (-np 1) makes every request meet that cache; with several slots llama-server
picks the slot whose prompt shares the most with the request, which is the victim's. One thread
(-t 1): on a loaded machine two of ggml's threads wait for each other at every graph node, and a
4-token hit then takes as long as a miss (seen here: 2-3 s for either).

Skips without a built llama-server, as the other `upstream` tests do (`make test-upstream`).
"""

from __future__ import annotations

import pytest

from gateway.cache import AuditBudget, OpenAITarget, Verdict, run_audit, text_prefixes

pytestmark = pytest.mark.upstream

# 64 common words: a miss prefills 68 tokens, a hit 4 (the fresh suffix). Ten trials: full
# separation gives p = 1.1e-5.
PREFIX_WORDS = 64


async def test_the_audit_finds_llama_servers_shared_cache(llama_server_one_thread: str) -> None:
    target = OpenAITarget(llama_server_one_thread, "smollm2", timeout_s=120)
    try:
        result = await run_audit(target, text_prefixes(PREFIX_WORDS),
                                 budget=AuditBudget(trials=10, max_requests=44, max_seconds=300))
    finally:
        await target.aclose()
    assert result.control.p_value < result.alpha, result.as_dict()
    assert result.verdict is Verdict.LEAK, result.as_dict()
    assert result.cross.probe_median_s < result.cross.baseline_median_s / 2, result.as_dict()
    assert result.trials == 10 and result.cross.n_probe == result.cross.n_baseline == 10
