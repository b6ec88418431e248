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

--segments probes public prefix segments (issue 29) instead. The --prefix-tokens prefix is a
public segment that tenants A and B are given; A's prompts go on with a private --secret-tokens
suffix. Three probes, each against a baseline sent in the same iteration, in alternating order:
1. public: B sends the segment (cached by A) vs a prefix nobody cached. Distinguishable by
   design: that is what public means (tiny p).
2. private: B sends the segment and A's secret suffix vs the segment and a fresh suffix: both
   read the public blocks, and the secret must not show (large p). A sending its own secret again
   is the positive control (tiny p).
3. no segment in the policy: C (not given the segment) sends it vs a fresh prefix (large p).

    .venv/bin/python bench/prefix_cache.py --segments [--model demo] [--samples 20]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import time

from engine import (
    CacheScope,
    EngineConfig,
    ExecutionEnvelope,
    Isolation,
    LLMEngine,
    PublicSegment,
    SamplingParams,
    keyed_digest,
    segment_digest,
)

SECRET = b"bench-secret"
PARAMS = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)


def tenant_envelope(tenant: str, segments: tuple[PublicSegment, ...] = ()) -> ExecutionEnvelope:
    return ExecutionEnvelope(
        cache_namespace=keyed_digest(SECRET, f"tenant:{tenant}"),
        cache_scope=CacheScope.TENANT,
        isolation=Isolation.SHARED,
        isolation_key=keyed_digest(SECRET, f"tenant:{tenant}"),
        public_segments=segments,
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


def pair(rng: random.Random, first, second) -> tuple[float, float]:
    """Both probes' TTFTs, sent in random order so drift in machine load favours neither."""
    if rng.random() < 0.5:
        return first(), second()
    b, a = second(), first()
    return a, b


def segments(args: argparse.Namespace, engine: LLMEngine, tokens) -> None:
    rng = random.Random(1)
    bs = engine.config.block_size
    segment = tokens(args.prefix_tokens)
    public_tokens = len(segment) // bs * bs
    given = (PublicSegment(segment_digest(segment), len(segment), keyed_digest(SECRET, "segment:platform")),)
    ttft_ms(engine, segment + tokens(16), tenant_envelope("warm-up", given), "warm-up")  # the segment is cached
    public, public_base, private, private_base, control, none, none_base = [], [], [], [], [], [], []
    for i in range(args.samples):
        # Fresh tenants each sample: A and B are given the segment, C is not.
        a, b, c = tenant_envelope(f"a-{i}", given), tenant_envelope(f"b-{i}", given), tenant_envelope(f"c-{i}")
        secret = tokens(args.secret_tokens)
        _, cached = ttft_ms(engine, segment + secret + tokens(16), a, f"victim-{i}")
        assert cached == public_tokens, "the victim did not read the public blocks"

        def probe(prompt, envelope, name, expect):
            def send() -> float:
                t, cached = ttft_ms(engine, prompt, envelope, name)
                assert cached == expect, f"{name}: {cached} tokens from the cache, expected {expect}"
                return t
            return send

        x, y = pair(rng, probe(segment + tokens(16), b, f"public-{i}", public_tokens),
                    probe(tokens(args.prefix_tokens) + tokens(16), b, f"public-base-{i}", 0))
        public.append(x)
        public_base.append(y)
        x, y = pair(rng, probe(segment + secret + tokens(16), b, f"private-{i}", public_tokens),
                    probe(segment + tokens(args.secret_tokens) + tokens(16), b, f"private-base-{i}", public_tokens))
        private.append(x)
        private_base.append(y)
        control.append(probe(segment + secret + tokens(16), a, f"control-{i}",
                             (len(segment) + len(secret)) // bs * bs)())
        x, y = pair(rng, probe(segment + tokens(16), c, f"none-{i}", 0),
                    probe(tokens(args.prefix_tokens) + tokens(16), c, f"none-base-{i}", 0))
        none.append(x)
        none_base.append(y)
    med = statistics.median
    print(f"model {args.model}, {engine.runner.device}: a {len(segment)}-token public segment ({public_tokens} "
          f"tokens in whole blocks), {args.secret_tokens}-token private suffixes, {args.samples} samples each, "
          f"load {os.getloadavg()[0]:.2f}")
    rows = [("public segment, by design", public, public_base, "tiny p"),
            ("private suffix, cross-tenant", private, private_base, "p > 0.05"),
            ("private suffix, same tenant (control)", control, private_base, "tiny p"),
            ("segment not in the policy", none, none_base, "p > 0.05")]
    for name, probe_ms, base_ms, want in rows:
        print(f"{name:>38}: median {med(probe_ms):7.1f} ms vs {med(base_ms):7.1f} ms, "
              f"Mann-Whitney p = {mann_whitney_p(probe_ms, base_ms):.3g} (want {want})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--prefix-tokens", type=int, default=1024)
    parser.add_argument("--segments", action="store_true", help="probe public prefix segments instead")
    parser.add_argument("--secret-tokens", type=int, default=512, help="--segments: the private suffix's tokens")
    args = parser.parse_args()

    engine = LLMEngine(EngineConfig(model=args.model, kv_cache_memory_bytes=512 << 20), progress=True)
    vocab = engine.model_config.vocab_size
    rng = random.Random(0)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(16, vocab) for _ in range(n)]

    if args.segments:
        segments(args, engine, tokens)
        return

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
