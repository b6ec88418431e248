"""Prompt-lookup speculation on SmolLM2-135M: acceptance and single-stream decode speed, with and without.

Two workloads, one request at a time (speculation runs for a lone decode only), greedy:
- copy: edit or summarise a given text, so the answer repeats runs of the prompt;
- chat: free questions, where little of the answer is in the prompt.

One engine serves both arms; the envelope turns speculation on or off per request, so both
arms share the warm-up, the threads and the weights. Rounds alternate (on, off, off, on, …);
each round runs every prompt of both workloads once, and prints the load average
(os.getloadavg) beside it: on a shared machine compare rounds of like load. Reported per
workload and arm: decode tok/s ((output tokens - 1) / (last token time - first token time),
summed over the prompts of a round), the acceptance rate (accepted / drafted tokens) and the
tokens each decode step yields; medians over rounds, and the median of the on/off ratio of
paired rounds. Outputs of the two arms are compared token for token (see docs/engine.md on
bfloat16 near-ties).

    .venv/bin/python bench/speculation.py                  # 6 rounds, k = 3
    .venv/bin/python bench/speculation.py --rounds 2 --k 5 --max-tokens 64
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEXT = (
    "The gateway authenticates every request with Microsoft Entra ID, evaluates a Rego policy, and only then "
    "runs the model. Each tenant has its own prefix cache namespace, so one tenant never reuses another "
    "tenant's cached blocks. Requests of tenants that ask for isolation never share a batch with others, and "
    "every step leaves a record that holds hashes and numbers, never text."
)
CODE = (
    "def total(items):\n    result = 0\n    for item in items:\n        if item.price > 0:\n"
    "            result += item.price * item.quantity\n    return result\n"
)
WORKLOADS = {
    "copy": [
        "Repeat the following text exactly, fixing any typos:\n\n" + TEXT.replace("policy", "polcy"),
        "Rewrite this text, replacing 'tenant' with 'customer' and changing nothing else:\n\n" + TEXT,
        "Rename the function total to order_total in this Python code and return the whole code:\n\n" + CODE,
        "Summarise this text in two sentences, reusing its wording:\n\n" + TEXT,
    ],
    "chat": [
        "What is the capital of France?",
        "Write a short story about a robot who learns to paint.",
        "Explain what a hash function is, in a short paragraph.",
        "Give me three tips for sleeping better.",
    ],
}


@dataclass
class Run:
    tokens: int
    decode_s: float
    drafted: int
    accepted: int
    steps: int
    output: list[int]


def run_one(engine, prompt: list[int], params, envelope, request_id: str) -> Run:
    scheduler = engine.scheduler
    drafted, accepted = scheduler.num_draft_tokens, scheduler.num_accepted_tokens
    engine.add_request(request_id, prompt, params, envelope)
    first = last = None
    output: list[int] = []
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.new_token_ids:
                last = time.perf_counter()
                first = first or last
                output += out.new_token_ids
                steps += 1
    assert first is not None and last is not None
    return Run(len(output), last - first, scheduler.num_draft_tokens - drafted,
               scheduler.num_accepted_tokens - accepted, steps, output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    import dataclasses

    from engine import (
        CacheScope,
        EngineConfig,
        ExecutionEnvelope,
        Isolation,
        LLMEngine,
        SamplingParams,
        keyed_digest,
        packaged_model_file,
    )

    engine = LLMEngine(EngineConfig(model=str(packaged_model_file("smollm2-135m-instruct")), dtype=args.dtype,
                                    weights=args.weights, threads=args.threads, num_speculative_tokens=args.k,
                                    kv_cache_memory_bytes=128 << 20, max_model_len=2048))
    # No prefix cache: every round computes every prompt.
    off = ExecutionEnvelope(None, CacheScope.NONE, Isolation.SHARED, keyed_digest(b"bench", "tenant"))
    on = dataclasses.replace(off, speculative=True)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0)
    prompts = {name: [engine.tokenizer.encode_chat([{"role": "user", "content": text}]) for text in texts]
               for name, texts in WORKLOADS.items()}
    print(f"SmolLM2-135M-Instruct, {engine.runner.weights}, {str(engine.runner.dtype).removeprefix('torch.')}, "
          f"{engine.runner.threads} threads, k = {args.k}, max_tokens {args.max_tokens}, {os.cpu_count()} CPUs")
    for name, batch in prompts.items():  # warm-up: every prompt shape, both arms
        for i, prompt in enumerate(batch):
            run_one(engine, prompt, params, on, f"warm-{name}-{i}-on")
            run_one(engine, prompt, params, off, f"warm-{name}-{i}-off")

    results: dict[tuple[str, bool], list[tuple[float, float, float, float]]] = {}
    outputs: dict[tuple[str, int, bool], list[int]] = {}
    for r in range(args.rounds):
        arm = r % 4 in (0, 3)  # on, off, off, on: each arm as often first as second
        for speculative in (arm, not arm):
            load = os.getloadavg()
            line = []
            for name, batch in prompts.items():
                runs = [run_one(engine, prompt, params, on if speculative else off, f"r{r}-{name}-{i}-{speculative}")
                        for i, prompt in enumerate(batch)]
                for i, run in enumerate(runs):
                    outputs[name, i, speculative] = run.output
                tokens = sum(run.tokens - 1 for run in runs)
                rate = tokens / sum(run.decode_s for run in runs)
                drafted, accepted = sum(run.drafted for run in runs), sum(run.accepted for run in runs)
                acceptance = accepted / drafted if drafted else 0.0
                per_step = sum(run.tokens for run in runs) / sum(run.steps for run in runs)
                results.setdefault((name, speculative), []).append((rate, acceptance, per_step, load[0]))
                line.append(f"{name} {rate:6.1f} tok/s" + (f" (accept {acceptance:4.0%}, {per_step:.2f} tok/step)"
                                                           if speculative else ""))
            print(f"round {r + 1} {'on ' if speculative else 'off'}  load {load[0]:.2f} {load[1]:.2f}  "
                  + "  ".join(line), flush=True)

    print("\nmedians over rounds (load average 1 min: median, range)")
    for name in prompts:
        on_rates = [x[0] for x in results[name, True]]
        off_rates = [x[0] for x in results[name, False]]
        ratios = [a / b for a, b in zip(on_rates, off_rates)]
        loads = [x[3] for arm in (True, False) for x in results[name, arm]]
        same = sum(outputs[name, i, True] == outputs[name, i, False] for i in range(len(prompts[name])))
        print(f"  {name}: on {statistics.median(on_rates):.1f} tok/s, off {statistics.median(off_rates):.1f} tok/s, "
              f"ratio {statistics.median(ratios):.2f}x (paired rounds {min(ratios):.2f}-{max(ratios):.2f}), "
              f"acceptance {statistics.median(x[1] for x in results[name, True]):.0%}, "
              f"{statistics.median(x[2] for x in results[name, True]):.2f} tokens per step; "
              f"load {statistics.median(loads):.2f} ({min(loads):.2f}-{max(loads):.2f}); "
              f"last round's outputs equal on/off: {same}/{len(prompts[name])}")


if __name__ == "__main__":
    main()
