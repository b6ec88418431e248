"""What each isolation policy costs: one mixed workload, four ways, same run.

The same requests (4 tenants, prompts of 64-256 tokens, 16-64 output tokens, greedy)
run all-shared, all-tenant, all-exclusive and all-deterministic (shared isolation, the
batch-invariant path). Printed: output tokens/s of each and the ratio to all-shared, so
an operator sees what a policy choice costs. Target for the deterministic lane: at most
20% below all-shared.

    .venv/bin/python bench/isolation_cost.py [--model demo] [--requests 48]
"""

from __future__ import annotations

import argparse
import random
import time

from engine.config import EngineConfig
from engine.envelope import CacheScope, ExecutionEnvelope, Isolation, keyed_digest
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

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
    args = parser.parse_args()

    engine = LLMEngine(EngineConfig(model=args.model, kv_cache_memory_bytes=512 << 20), progress=True)
    vocab = engine.model_config.vocab_size
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(16, vocab) for _ in range(rng.randint(64, 256))] for _ in range(args.requests)]
    params = [SamplingParams(temperature=0, max_tokens=rng.randint(16, 64), ignore_eos=True) for _ in prompts]
    output_tokens = sum(p.max_tokens for p in params)
    engine.generate(prompts[:2], params[:2], envelope(0, Isolation.SHARED, False, "warm-up"))

    runs = {
        "all-shared": (Isolation.SHARED, False),
        "all-tenant": (Isolation.TENANT, False),
        "all-exclusive": (Isolation.EXCLUSIVE, False),
        "all-deterministic": (Isolation.SHARED, True),
    }
    print(f"model {args.model}, {engine.runner.device}: {len(prompts)} requests from {TENANTS} tenants, "
          f"{sum(map(len, prompts))} prompt tokens, {output_tokens} output tokens")
    rates = {}
    selected = args.runs.split(",")
    if selected[0] != "all-shared":
        raise SystemExit("--runs must start with all-shared, the baseline")
    for name in selected:
        isolation, deterministic = runs[name]
        envelopes = [envelope(i % TENANTS, isolation, deterministic, name) for i in range(len(prompts))]
        start = time.perf_counter()
        engine.generate(prompts, params, envelopes)
        elapsed = time.perf_counter() - start
        rates[name] = output_tokens / elapsed
        print(f"{name:>18}: {elapsed:6.1f}s  {rates[name]:7.1f} output tok/s  "
              f"{rates[name] / rates['all-shared']:.2f}x of all-shared")
    if "all-deterministic" in rates:
        cost = 1 - rates["all-deterministic"] / rates["all-shared"]
        print(f"deterministic lane cost: {cost:.0%} (target <= 20%)")


if __name__ == "__main__":
    main()
