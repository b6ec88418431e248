"""Prefix cache: TTFT with a cached 1,024-token prefix versus without, and what another tenant sees.

1. Hit vs miss: the same 1,024-token system prompt plus a short question, in one
   namespace (after a warm-up request cached it) versus in a fresh namespace each time.
   Printed: median TTFTs and the ratio (target >= 5x).
2. The cross-tenant probe: tenant A has the prefix cached. Tenant B sends the same
   prefix; its TTFT distribution is compared with an uncached baseline (B sending a
   prefix nobody has cached) by a two-sample Mann-Whitney U test. If namespaces hold,
   the two are indistinguishable (large p). The same probe from tenant A, which does hit,
   is printed beside it and should differ (tiny p).

    .venv/bin/python bench/prefix_cache.py [--model demo] [--samples 20]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time

from engine import CacheScope, EngineConfig, ExecutionEnvelope, Isolation, LLMEngine, SamplingParams, keyed_digest

SECRET = b"bench-secret"
PARAMS = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)


def tenant_envelope(tenant: str) -> ExecutionEnvelope:
    return ExecutionEnvelope(
        cache_namespace=keyed_digest(SECRET, f"tenant:{tenant}"),
        cache_scope=CacheScope.TENANT,
        isolation=Isolation.SHARED,
        isolation_key=keyed_digest(SECRET, f"tenant:{tenant}"),
    )


def ttft_ms(engine: LLMEngine, prompt: list[int], envelope: ExecutionEnvelope, request_id: str) -> tuple[float, int]:
    start = time.perf_counter()
    engine.add_request(request_id, prompt, PARAMS, envelope)
    cached = engine.scheduler.find(request_id)
    while engine.has_unfinished_requests():
        if engine.step():
            break
    elapsed = (time.perf_counter() - start) * 1000
    while engine.has_unfinished_requests():
        engine.step()
    return elapsed, cached.num_cached_tokens


def mann_whitney_p(a: list[float], b: list[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation, tie-corrected)."""
    pooled = sorted((v, i) for i, v in enumerate(a + b))
    ranks = [0.0] * len(pooled)
    i = 0
    ties = 0.0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[pooled[k][1]] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    n1, n2 = len(a), len(b)
    u = sum(ranks[:n1]) - n1 * (n1 + 1) / 2
    n = n1 + n2
    sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))))
    z = (u - n1 * n2 / 2) / sigma if sigma else 0.0
    return math.erfc(abs(z) / math.sqrt(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--prefix-tokens", type=int, default=1024)
    args = parser.parse_args()

    engine = LLMEngine(EngineConfig(model=args.model, kv_cache_memory_bytes=512 << 20), progress=True)
    vocab = engine.model_config.vocab_size
    rng = random.Random(0)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(16, vocab) for _ in range(n)]

    prefix = tokens(args.prefix_tokens)
    a = tenant_envelope("a")
    ttft_ms(engine, prefix + tokens(16), a, "warm-up")  # tenant A caches the prefix (and warms the kernels)

    hit, miss, cross, baseline, same = [], [], [], [], []
    for i in range(args.samples):
        t, cached = ttft_ms(engine, prefix + tokens(16), a, f"hit-{i}")
        assert cached >= args.prefix_tokens - engine.config.block_size
        hit.append(t)
        t, cached = ttft_ms(engine, prefix + tokens(16), tenant_envelope(f"fresh-{i}"), f"miss-{i}")
        assert cached == 0
        miss.append(t)
        # The probes, interleaved so drift in machine load hits both sides alike.
        b = tenant_envelope(f"b-{i}")
        t, cached = ttft_ms(engine, prefix + tokens(16), b, f"cross-{i}")
        assert cached == 0, "a cross-tenant probe hit another tenant's cache"
        cross.append(t)
        t, _ = ttft_ms(engine, tokens(args.prefix_tokens) + tokens(16), b, f"base-{i}")
        baseline.append(t)
        t, _ = ttft_ms(engine, prefix + tokens(16), a, f"same-{i}")
        same.append(t)

    med = statistics.median
    print(f"model {args.model}, {engine.runner.device}, prefix {args.prefix_tokens} tokens + 16, "
          f"{args.samples} samples each")
    print(f"TTFT miss: median {med(miss):.1f} ms   hit: median {med(hit):.1f} ms   "
          f"ratio {med(miss) / med(hit):.1f}x (target >= 5x)")
    print(f"cross-tenant probe: median {med(cross):.1f} ms vs uncached baseline {med(baseline):.1f} ms, "
          f"Mann-Whitney p = {mann_whitney_p(cross, baseline):.3f} (large p: indistinguishable)")
    print(f"same-tenant probe:  median {med(same):.1f} ms vs uncached baseline {med(baseline):.1f} ms, "
          f"Mann-Whitney p = {mann_whitney_p(same, baseline):.2g} (tiny p: the hit shows)")


if __name__ == "__main__":
    main()
