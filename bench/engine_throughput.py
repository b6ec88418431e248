"""Output tokens/s of tenantgate's engine against Hugging Face `generate`, one workload, one run.

Workload: N requests (default 64) with prompts of 64-512 random tokens and 32-256 output
tokens each, greedy, EOS ignored so both sides produce exactly the requested tokens.

- tenantgate: every request is added at once; continuous batching does the rest.
- HF: static padded batches in arrival order (left padding), greedy, at each batch size
  in --hf-batch-sizes; a batch runs until its longest request is done, and only the
  requested tokens count. The best batch size is the peer.

Also printed: KV waste at peak (allocated but unused slots), decode FLOP/s against this
machine's fp32 matmul rate measured in the same run, and on CUDA the decode tokens/s
against the memory-bandwidth roofline (weights + KV bytes per step / copy bandwidth).

    .venv/bin/python bench/engine_throughput.py            # the full workload (minutes on CPU)
    .venv/bin/python bench/engine_throughput.py --requests 8 --hf-batch-sizes 8   # a smoke run
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass

import torch

from engine import EngineConfig, ExecutionEnvelope, LLMEngine, SamplingParams, local_envelope


@dataclass
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)


def make_workload(num_requests: int, vocab_size: int, seed: int) -> Workload:
    rng = random.Random(seed)
    prompts = [[rng.randrange(16, vocab_size) for _ in range(rng.randint(64, 512))] for _ in range(num_requests)]
    return Workload(prompts, [rng.randint(32, 256) for _ in range(num_requests)])


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_flops(device: torch.device, dtype: torch.dtype, n: int = 2048, iters: int = 5) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    sync(device)
    return 2 * n**3 * iters / (time.perf_counter() - start)


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, iters: int = 10) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src)
    sync(device)
    return 2 * nbytes * iters / (time.perf_counter() - start)  # read + write


class StepRecorder:
    """Wraps the model runner to time decode-only steps and count their work."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.decode_time = 0.0
        self.decode_tokens = 0
        self.decode_steps = 0
        self.decode_flops = 0.0
        self.decode_bytes = 0.0
        self._run = engine.runner.run
        engine.runner.run = self._timed_run  # until close()
        mc = engine.model_config
        runner = engine.runner
        self.elem = torch.empty((), dtype=runner.dtype).element_size()
        embed = mc.vocab_size * mc.hidden_size
        params = sum(p.numel() for p in runner.model.parameters())
        matmul_params = params - (0 if mc.tie_word_embeddings else embed)  # the embedding lookup is no matmul
        self.weight_bytes = params * self.elem
        self.flops_per_token = 2 * matmul_params
        self.attn_flops_per_ctx = 4 * mc.num_hidden_layers * mc.num_attention_heads * mc.head_dim
        self.kv_bytes_per_ctx = 2 * mc.num_hidden_layers * mc.num_key_value_heads * mc.head_dim * self.elem

    def close(self) -> None:
        self.engine.runner.run = self._run

    def _timed_run(self, batch):
        device = self.engine.runner.device
        decode_only = all(n == 1 for n in batch.num_new_tokens)
        sync(device)
        start = time.perf_counter()
        result = self._run(batch)
        sync(device)
        if decode_only:
            contexts = sum(seq.num_computed_tokens + 1 for seq in batch.seqs)
            self.decode_time += time.perf_counter() - start
            self.decode_tokens += len(batch.seqs)
            self.decode_steps += 1
            self.decode_flops += len(batch.seqs) * self.flops_per_token + contexts * self.attn_flops_per_ctx
            self.decode_bytes += self.weight_bytes + contexts * self.kv_bytes_per_ctx
        return result


def run_tenantgate(engine: LLMEngine, work: Workload, envelope: ExecutionEnvelope | None = None,
                   warm_up: bool = True) -> tuple[float, StepRecorder]:
    envelope = envelope or local_envelope()
    if warm_up:
        warm = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        engine.generate([p[:64] for p in work.prompts[:4]], warm, envelope)
    recorder = StepRecorder(engine)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in work.output_lens]
    sync(engine.runner.device)
    start = time.perf_counter()
    results = engine.generate(work.prompts, params, envelope)
    sync(engine.runner.device)
    elapsed = time.perf_counter() - start
    recorder.close()
    produced = sum(len(r.token_ids) for r in results)
    if produced != work.output_tokens:
        raise SystemExit(f"tenantgate produced {produced} tokens, expected {work.output_tokens}")
    return elapsed, recorder


@torch.inference_mode()
def run_hf(model, work: Workload, batch_size: int, device: torch.device) -> float:
    model.generation_config.eos_token_id = None  # run every request to its requested length

    def generate(prompts: list[list[int]], max_new: int) -> None:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new, min_new_tokens=max_new,
            do_sample=False, pad_token_id=0,
        )

    generate([p[:64] for p in work.prompts[:2]], 4)  # warm-up
    sync(device)
    start = time.perf_counter()
    for i in range(0, len(work.prompts), batch_size):
        generate(work.prompts[i : i + batch_size], max(work.output_lens[i : i + batch_size]))
    sync(device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hf-batch-sizes", default="8,16,32,64")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--kv-cache-memory", type=int, default=1 << 30)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()

    engine = LLMEngine(
        EngineConfig(
            model=args.model,
            dtype=args.dtype,
            kv_cache_memory_bytes=args.kv_cache_memory,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
        ),
        progress=True,
    )
    device, dtype = engine.runner.device, engine.runner.dtype
    mc = engine.model_config
    work = make_workload(args.requests, mc.vocab_size, args.seed)
    num_params = sum(p.numel() for p in engine.runner.model.parameters())
    print(f"model {args.model}: {mc.architecture}, {num_params / 1e6:.1f}M parameters, {dtype}, {device}, "
          f"threads={torch.get_num_threads()}")
    print(f"workload: {len(work.prompts)} requests, prompt tokens {sum(map(len, work.prompts))}, "
          f"output tokens {work.output_tokens}")

    tg_time, rec = run_tenantgate(engine, work)
    tg_rate = work.output_tokens / tg_time
    peak = engine.peak_kv_stats()
    print(f"tenantgate: {tg_time:.1f}s, {tg_rate:.1f} output tok/s; preemptions {engine.scheduler.num_preemptions}")
    print(f"KV at peak: {peak.num_used_blocks}/{peak.num_blocks} blocks, {peak.used_slots}/{peak.allocated_slots} "
          f"slots used, waste {peak.waste:.2%}")

    from transformers import AutoModelForCausalLM

    hf_model = AutoModelForCausalLM.from_pretrained(engine.model_path, dtype=dtype).to(device).eval()
    best_rate, best_bs = 0.0, 0
    for bs in (int(x) for x in args.hf_batch_sizes.split(",")):
        hf_time = run_hf(hf_model, work, bs, device)
        rate = work.output_tokens / hf_time
        print(f"HF generate, batch {bs}: {hf_time:.1f}s, {rate:.1f} output tok/s")
        if rate > best_rate:
            best_rate, best_bs = rate, bs
    print(f"ratio tenantgate / HF (best batch {best_bs}): {tg_rate / best_rate:.2f}x")

    peak_flops = matmul_flops(device, dtype)
    decode_flops = rec.decode_flops / rec.decode_time
    print(f"decode: {rec.decode_tokens / rec.decode_time:.1f} tok/s in decode-only steps, "
          f"{decode_flops / 1e9:.1f} GFLOP/s = {decode_flops / peak_flops:.1%} of measured matmul rate "
          f"({peak_flops / 1e9:.1f} GFLOP/s, {dtype})")
    if device.type == "cuda":
        bandwidth = copy_bandwidth(device)
        roofline = rec.decode_tokens / (rec.decode_bytes / bandwidth)
        print(f"decode roofline: {rec.decode_tokens / rec.decode_time:.1f} tok/s vs {roofline:.1f} tok/s "
              f"(weights + KV bytes per step / {bandwidth / 1e9:.0f} GB/s copy bandwidth) = "
              f"{rec.decode_tokens / rec.decode_time / roofline:.1%}")


if __name__ == "__main__":
    main()
