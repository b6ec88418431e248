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
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from engine import CacheScope, EngineConfig, ExecutionEnvelope, Isolation, LLMEngine, SamplingParams, keyed_digest

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", default="all-shared,all-tenant,all-exclusive,all-deterministic")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every mode, in rotating order")
    parser.add_argument("--prompt-len", default="64-256", help="prompt lengths, MIN-MAX tokens")
    args = parser.parse_args()

    engine = LLMEngine(EngineConfig(model=args.model, kv_cache_memory_bytes=512 << 20), progress=True)
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
    shared = statistics.median(rates["all-shared"])
    for name in selected:
        rate = statistics.median(rates[name])
        rounds = " ".join(f"{r / s:.2f}" for r, s in zip(rates[name], rates["all-shared"]))
        print(f"{name:>18}: median {rate:7.1f} output tok/s  {rate / shared:.2f}x of all-shared  "
              f"(per round: {rounds})")
    if "all-deterministic" in rates:
        cost = 1 - statistics.median(rates["all-deterministic"]) / shared
        print(f"deterministic lane cost: {cost:.0%} (target <= 20%)")

if __name__ == "__main__":
    main()
