"""What each isolation policy costs: one mixed workload, four ways, same run.

The same requests (4 tenants, prompts of 64-256 tokens by default, 16-64 output tokens, greedy)
run all-shared, all-tenant, all-exclusive and all-deterministic (shared isolation, the
batch-invariant path). Printed: output tokens/s of each and the ratio to all-shared, so
an operator sees what a policy choice costs. Target for the deterministic lane: at most
20% below all-shared.

One 7-second run swings by 30% on a shared 2-core VM, so every mode is first warmed up
(the deterministic lane's one-time kernel check included), then the modes run --repeat
times in rotating order; the medians and the per-round ratios are printed.

    .venv/bin/python bench/isolation_cost.py [--model demo] [--requests 48] [--repeat 3]

--workload segments: what public prefix segments buy (issue 29). --tenants tenants (32) each send
--per-tenant requests made of one --system-tokens platform system prompt (1,024) and a private
question of 16-64 tokens, 16-32 output tokens, --concurrency (8) of them in flight at a time (a
closed loop: each finished request lets the next one in, tenants interleaved), as clients would
send them; all at once, every tenant would prefill the cold prompt side by side in the contended
steps, and nobody could read anybody's blocks. Three ways, alternating, each round in fresh namespaces:
all-shared (one namespace for everyone), tenant (a namespace per tenant: the system prompt is
prefilled once per tenant) and tenant+segment (a namespace per tenant, the system prompt a public
segment: its whole blocks are prefilled once and shared). Printed: output tokens/s, the ratio to
all-shared per round with the load average, and the medians. Target: tenant+segment >= 0.9x.

    .venv/bin/python bench/isolation_cost.py --workload segments [--model demo] [--repeat 3]
"""

from __future__ import annotations

import argparse
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
TENANTS = 4


def envelope(tenant: int, isolation: Isolation, deterministic: bool, run: str) -> ExecutionEnvelope:
    return ExecutionEnvelope(
        # A fresh namespace per run: no run profits from another's cached prefixes.
        cache_namespace=keyed_digest(SECRET, f"{run}:tenant:{tenant}"),
        cache_scope=CacheScope.TENANT,
        isolation=isolation,
        isolation_key=keyed_digest(SECRET, f"tenant:{tenant}"),
        deterministic=deterministic,
    )


SEGMENT_MODES = ("all-shared", "tenant", "tenant+segment")


def segment_envelope(tenant: int, mode: str, tag: str, system: list[int]) -> ExecutionEnvelope:
    shared = mode == "all-shared"
    segments = ()
    if mode == "tenant+segment":
        segments = (PublicSegment(segment_digest(system), len(system), keyed_digest(SECRET, f"{tag}:segment")),)
    return ExecutionEnvelope(
        cache_namespace=keyed_digest(SECRET, f"{tag}:shared" if shared else f"{tag}:tenant:{tenant}"),
        cache_scope=CacheScope.SHARED if shared else CacheScope.TENANT,
        isolation=Isolation.SHARED,
        isolation_key=keyed_digest(SECRET, f"tenant:{tenant}"),
        public_segments=segments,
    )


def print_medians(rates: dict[str, list[float]], names, width: int) -> float:
    """Each run's median output tok/s and its ratio to all-shared, per round too; returns all-shared's."""
    shared = statistics.median(rates["all-shared"])
    for name in names:
        rate = statistics.median(rates[name])
        rounds = " ".join(f"{r / s:.2f}" for r, s in zip(rates[name], rates["all-shared"]))
        print(f"{name:>{width}}: median {rate:7.1f} output tok/s  {rate / shared:.2f}x of all-shared  "
              f"(per round: {rounds})")
    return shared


def closed_loop(engine: LLMEngine, prompts, params, envelopes, concurrency: int) -> None:
    """Every request run, at most `concurrency` in flight: the next is added as one finishes."""
    pending = list(range(len(prompts)))[::-1]
    in_flight = 0
    while pending or in_flight:
        while pending and in_flight < concurrency:
            i = pending.pop()
            engine.add_request(f"r{i}", prompts[i], params[i], envelopes[i])
            in_flight += 1
        in_flight -= sum(1 for output in engine.step() if output.finished)


def segments_workload(args: argparse.Namespace, engine: LLMEngine) -> None:
    vocab = engine.model_config.vocab_size
    rng = random.Random(args.seed)
    system = [rng.randrange(16, vocab) for _ in range(args.system_tokens)]
    tenants = [t for t in range(args.tenants) for _ in range(args.per_tenant)]
    rng.shuffle(tenants)  # arrivals interleave the tenants
    prompts = [system + [rng.randrange(16, vocab) for _ in range(rng.randint(16, 64))] for _ in tenants]
    params = [SamplingParams(temperature=0, max_tokens=rng.randint(16, 32), ignore_eos=True) for _ in prompts]
    output_tokens = sum(p.max_tokens for p in params)
    print(f"model {args.model}, {engine.runner.device}: {len(prompts)} requests from {args.tenants} tenants, "
          f"a {len(system)}-token system prompt each, {sum(map(len, prompts))} prompt tokens, "
          f"{output_tokens} output tokens, {args.concurrency} in flight")
    engine.generate(prompts[:2], params[:2], [segment_envelope(0, "tenant+segment", "warm-up", system)] * 2)
    rates: dict[str, list[float]] = {mode: [] for mode in SEGMENT_MODES}
    hits: dict[str, int] = {}
    for round_ in range(args.repeat):
        order = SEGMENT_MODES[round_ % 3:] + SEGMENT_MODES[: round_ % 3]
        for mode in order:
            tag = f"{mode}-{round_}"
            envelopes = [segment_envelope(t, mode, tag, system) for t in tenants]
            load = os.getloadavg()[0]
            before = engine.scheduler.num_prefix_hit_tokens
            start = time.perf_counter()
            closed_loop(engine, prompts, params, envelopes, args.concurrency)
            rates[mode].append(output_tokens / (time.perf_counter() - start))
            hits[mode] = engine.scheduler.num_prefix_hit_tokens - before
            print(f"round {round_} {mode:>15}: {rates[mode][-1]:7.1f} output tok/s, "
                  f"{hits[mode]} prompt tokens from the cache, load {load:.2f}", flush=True)
    print_medians(rates, SEGMENT_MODES, 15)
    ratios = [r / s for r, s in zip(rates["tenant+segment"], rates["all-shared"])]
    print(f"tenant+segment / all-shared, median of rounds: {statistics.median(ratios):.2f}x (target >= 0.9x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--workload", choices=["mixed", "segments"], default="mixed")
    parser.add_argument("--tenants", type=int, default=32, help="segments: tenants")
    parser.add_argument("--per-tenant", type=int, default=2, help="segments: requests per tenant")
    parser.add_argument("--system-tokens", type=int, default=1024, help="segments: the system prompt's tokens")
    parser.add_argument("--concurrency", type=int, default=8, help="segments: requests in flight at a time")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", default="all-shared,all-tenant,all-exclusive,all-deterministic")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every mode, in rotating order")
    parser.add_argument("--prompt-len", default="64-256", help="prompt lengths, MIN-MAX tokens")
    args = parser.parse_args()

    engine = LLMEngine(EngineConfig(model=args.model, kv_cache_memory_bytes=512 << 20), progress=True)
    if args.workload == "segments":
        segments_workload(args, engine)
        return
    vocab = engine.model_config.vocab_size
    rng = random.Random(args.seed)
    low, high = map(int, args.prompt_len.split("-"))
    prompts = [[rng.randrange(16, vocab) for _ in range(rng.randint(low, high))] for _ in range(args.requests)]
    params = [SamplingParams(temperature=0, max_tokens=rng.randint(16, 64), ignore_eos=True) for _ in prompts]
    output_tokens = sum(p.max_tokens for p in params)
    runs = {
        "all-shared": (Isolation.SHARED, False),
        "all-tenant": (Isolation.TENANT, False),
        "all-exclusive": (Isolation.EXCLUSIVE, False),
        "all-deterministic": (Isolation.SHARED, True),
    }
    print(f"model {args.model}, {engine.runner.device}: {len(prompts)} requests from {TENANTS} tenants, "
          f"{sum(map(len, prompts))} prompt tokens, {output_tokens} output tokens")
    selected = args.runs.split(",")
    if selected[0] != "all-shared":
        raise SystemExit("--runs must start with all-shared, the baseline")
    for name in selected:  # first uses (the invariant lane's kernel check, buffers) are not throughput
        isolation, deterministic = runs[name]
        engine.generate(prompts[:2], params[:2], envelope(0, isolation, deterministic, f"warm-up-{name}"))
    rates: dict[str, list[float]] = {name: [] for name in selected}
    for round_ in range(args.repeat):
        order = selected[round_ % len(selected):] + selected[: round_ % len(selected)]
        for name in order:
            isolation, deterministic = runs[name]
            tag = f"{name}-{round_}"  # a fresh namespace per run: no run profits from another's prefixes
            envelopes = [envelope(i % TENANTS, isolation, deterministic, tag) for i in range(len(prompts))]
            start = time.perf_counter()
            engine.generate(prompts, params, envelopes)
            rates[name].append(output_tokens / (time.perf_counter() - start))
    shared = print_medians(rates, selected, 18)
    if "all-deterministic" in rates:
        cost = 1 - statistics.median(rates["all-deterministic"]) / shared
        print(f"deterministic lane cost: {cost:.0%} (target <= 20%)")

if __name__ == "__main__":
    main()
