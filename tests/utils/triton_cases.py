"""Cases for the Triton paged-attention kernel, run by tests/engine/test_triton_attention.py in a
child process whose environment sets TRITON_INTERPRET=1 (see there why).

Both sides read the same paged KV pool in float32: the reference (engine/model/attention.py)
gathers each context through its block table and runs scaled_dot_product_attention; the
kernel loads the slots in place and runs an online softmax 32 keys at a time. The
summation orders differ, so outputs agree to rounding: atol=rtol=1e-5 (the largest
difference measured on these shapes is 4.8e-7, for outputs up to magnitude 3).

Every block table here has holes and runs out of order (random block ids from a larger
pool), and the first two sequences share their leading prefix blocks, as prefix-cache
hits do.

`python -m tests.utils.triton_cases CHECKPOINT [cuda]` prints one JSON line per case: {"case",
"error"} (CHECKPOINT: a small Llama checkpoint directory, for the engine-level case). With
`cuda` (bench/gpu_check.py) the same cases run the compiled kernel on the GPU.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from engine.model.attention import AttentionMetadata, PrefillSpan, build_mask, paged_attention

ATOL = RTOL = 1e-5
NUM_BLOCKS = 48
HEAD_DIM = 24  # not a power of two: the kernel pads it to 32 and masks the rest
SCALE = HEAD_DIM**-0.5
GQA = {"1:1": (2, 2), "3:1": (6, 2), "4:1": (4, 1)}  # (query heads, KV heads)
WINDOWS = {"full": None, "window20": 20}
DEVICE = torch.device("cpu")  # main() sets cuda for the compiled kernel on a GPU


def _tensor(values, dtype=None) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=DEVICE)


class Step:
    """One step's sequences, (cached tokens, new tokens) each, over a random paged pool."""

    def __init__(self, lengths, num_heads, num_kv_heads, block_size, seed=0, shared_blocks=1):
        g = torch.Generator().manual_seed(seed)
        self.lengths, self.block_size = lengths, block_size
        shape = (NUM_BLOCKS, block_size, num_kv_heads, HEAD_DIM)
        self.k_cache = torch.randn(shape, generator=g).to(DEVICE)
        self.v_cache = torch.randn(shape, generator=g).to(DEVICE)
        total = sum(new for _, new in lengths)
        self.q = torch.randn(total, num_heads, HEAD_DIM, generator=g).to(DEVICE)
        self.k = torch.randn(total, num_kv_heads, HEAD_DIM, generator=g).to(DEVICE)
        self.v = torch.randn(total, num_kv_heads, HEAD_DIM, generator=g).to(DEVICE)
        free = torch.randperm(NUM_BLOCKS, generator=g).tolist()
        self.tables: list[list[int]] = []
        for i, (cached, new) in enumerate(lengths):
            needed = -(-(cached + new) // block_size)
            table = self.tables[0][:shared_blocks] if i == 1 else []
            self.tables.append(table + [free.pop() for _ in range(needed - len(table))])
        if len(lengths) > 1 and min(lengths[0][0], lengths[1][0]) < shared_blocks * block_size:
            raise ValueError("shared prefix blocks must be cached by both sequences")

    def reference(self, window: int | None) -> torch.Tensor:
        """The engine's torch attention, which also writes the new K/V into the pool."""
        bs, slots, prefills = self.block_size, [], []
        decode_rows, decode_tables, decode_lens = [], [], []
        for (cached, new), table in zip(self.lengths, self.tables):
            row, end = len(slots), cached + new
            slots += [table[p // bs] * bs + p % bs for p in range(cached, end)]
            if new == 1:
                decode_rows.append(row)
                decode_tables.append(table)
                decode_lens.append(end)
            else:
                mask = build_mask(torch.arange(cached, end), torch.arange(end), window).to(DEVICE)
                prefills.append(PrefillSpan(row, row + new, end, _tensor(table), mask))
        meta = AttentionMetadata(_tensor(slots), None, None, None, prefills)
        if decode_rows:
            width = max(len(t) for t in decode_tables)
            meta.decode_rows = _tensor(decode_rows)
            meta.decode_block_tables = _tensor([t + [0] * (width - len(t)) for t in decode_tables])
            lengths = torch.tensor(decode_lens)[:, None]
            keys = torch.arange(width * bs)[None, :]
            mask = keys < lengths
            if window is not None:
                mask &= lengths - 1 - keys < window
            meta.decode_mask = mask[:, None, None, :].to(DEVICE)
        return paged_attention(self.q, self.k, self.v, self.k_cache, self.v_cache, meta, SCALE)

    def block_tables(self) -> torch.Tensor:
        """Padded with the pool's last block id: the kernel must never read past a context."""
        width = max(len(t) for t in self.tables)
        return _tensor([t + [NUM_BLOCKS - 1] * (width - len(t)) for t in self.tables], torch.int32)

    def context_lens(self) -> torch.Tensor:
        return _tensor([c + n for c, n in self.lengths], torch.int32)

    def cu_seqlens(self) -> torch.Tensor:
        return _tensor([0] + [n for _, n in self.lengths]).cumsum(0).to(torch.int32)


def decode(kernels, gqa: str, window: int | None) -> None:
    step = Step([(40, 1), (37, 1), (5, 1), (70, 1)], *GQA[gqa], block_size=16)
    expected = step.reference(window)
    got = kernels.decode_attention(step.q, step.k_cache, step.v_cache, step.block_tables(), step.context_lens(),
                                   SCALE, window)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=RTOL)


def extend(kernels, gqa: str, window: int | None) -> None:
    # A cached prefix with new tokens, a shared-prefix neighbour, a fresh prompt, a prompt
    # longer than one query tile; block size 8, so one 32-key tile spans four blocks.
    step = Step([(24, 9), (19, 20), (0, 13), (3, 70)], *GQA[gqa], block_size=8, shared_blocks=2)
    expected = step.reference(window)
    got = kernels.extend_attention(step.q, step.k_cache, step.v_cache, step.cu_seqlens(), step.block_tables(),
                                   step.context_lens(), 70, SCALE, window)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=RTOL)


def extend_bfloat16(kernels) -> None:
    """bfloat16 pool and queries, the CUDA default: tensor-core dots, probabilities rounded to
    bfloat16 for P·V, so agreement is to bfloat16 rounding: atol=rtol=2e-2 (measured 7.8e-3, one
    bfloat16 step at magnitude 2)."""
    step = Step([(24, 9), (17, 1), (3, 40)], *GQA["3:1"], block_size=16)
    for name in ("k_cache", "v_cache", "q", "k", "v"):
        setattr(step, name, getattr(step, name).to(torch.bfloat16))
    expected = step.reference(20)
    got = kernels.extend_attention(step.q, step.k_cache, step.v_cache, step.cu_seqlens(), step.block_tables(),
                                   step.context_lens(), 40, SCALE, 20)
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)


def mixed_step(kernels) -> None:
    """Decodes and a chunk at any rows of the step, as the model runner lays them out; no other row written."""
    step = Step([(33, 1), (40, 6), (2, 1)], *GQA["3:1"], block_size=16)
    expected = step.reference(None)
    rows = _tensor([0, 1, 7], torch.int32)
    lens = _tensor([1, 6, 1], torch.int32)
    out = torch.full_like(step.q, float("nan"))
    kernels.paged_attention(step.q, step.k_cache, step.v_cache, out, rows, lens, step.context_lens(),
                            step.block_tables(), 6, SCALE, None)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)


def decode_batch_invariant(kernels) -> None:
    """The same query over the same blocks gets the same bits alone or in a batch of others."""
    step = Step([(52, 1), (30, 1), (9, 1)], *GQA["4:1"], block_size=16)
    step.reference(None)  # writes the new K/V
    tables, lens = step.block_tables(), step.context_lens()
    batch = kernels.decode_attention(step.q, step.k_cache, step.v_cache, tables, lens, SCALE)
    alone = kernels.decode_attention(step.q[:1], step.k_cache, step.v_cache, tables[:1, :4], lens[:1], SCALE)
    if not torch.equal(batch[:1], alone):
        raise AssertionError("a decode's output changed with the batch beside it")


def invariant_tiles(kernels) -> None:
    """With invariant tiles a token's attention has the same bits in a whole prefill, in a
    chunk over a cached prefix, and in a decode step beside other sequences."""
    step = Step([(0, 50), (10, 1), (30, 1)], *GQA["3:1"], block_size=8, shared_blocks=0)
    step.reference(20)  # writes the new K/V: the first sequence's whole prompt
    tables, lens = step.block_tables(), step.context_lens()

    def prefill(first: int) -> torch.Tensor:  # the first sequence's positions first..49, over a cached prefix
        out = torch.zeros_like(step.q)
        kernels.paged_attention(step.q, step.k_cache, step.v_cache, out, _tensor([first], torch.int32),
                                _tensor([50 - first], torch.int32), lens[:1], tables[:1], 50 - first, SCALE, 20,
                                invariant=True)
        return out

    whole, chunk = prefill(0), prefill(23)
    if not torch.equal(chunk[23:50], whole[23:50]):
        raise AssertionError("a chunk over a cached prefix changed the bits of its tokens")
    for position in (0, 17, 49):
        decode = torch.zeros_like(step.q)
        rows = _tensor([position, 50, 51], torch.int32)
        kernels.paged_attention(step.q, step.k_cache, step.v_cache, decode, rows, _tensor([1, 1, 1], torch.int32),
                                torch.cat([_tensor([position + 1], torch.int32), lens[1:]]), tables, 1, SCALE, 20,
                                invariant=True)
        if not torch.equal(decode[position], whole[position]):
            raise AssertionError(f"position {position}: a decode step changed the bits of the prefill's attention")


def engine_paged_path(kernels, checkpoint: Path) -> None:
    """The model runner's kernel path (its launches and block tables, as on CUDA) gives the
    torch path's greedy tokens and logits: decodes beside chunked prefills, a cached prefix,
    and (on CPU) decode steps through the graph buffers; and its deterministic lane gives a
    request the same logits alone and in company."""
    from engine.config import EngineConfig
    from engine.envelope import local_envelope
    from engine.llm_engine import LLMEngine
    from engine.sampling_params import SamplingParams

    rng = torch.Generator().manual_seed(3)
    prefix = torch.randint(2, 500, (21,), generator=rng).tolist()
    rounds = [[prefix + [7, 8]], [prefix + [9], torch.randint(2, 500, (40,), generator=rng).tolist(), [5, 6, 7]]]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, keep_logits=True)
    runs = []
    for paged in (False, True):  # on CUDA: torch eager against the kernel with decode graphs
        engine = LLMEngine(EngineConfig(model=str(checkpoint), dtype="float32", device=DEVICE.type, block_size=8,
                                        kv_cache_memory_bytes=4 << 20, max_num_batched_tokens=32,
                                        enforce_eager=not paged))
        engine.runner.paged_kernel = paged
        runs.append([r for prompts in rounds for r in engine.generate(prompts, params, local_envelope())])
    torch_run, kernel_run = runs
    if DEVICE.type == "cpu":
        runs.append(graph_plumbing_run(checkpoint, rounds, params))
    # The deterministic lane on the kernel path: the same logits alone and beside others.
    lane = dataclasses.replace(local_envelope(), deterministic=True)
    prompt = torch.randint(2, 500, (30,), generator=rng).tolist()
    alone = engine.generate([prompt], params, lane)[0]
    crowded = engine.generate([[3, 4, 5, 6, 7], prompt, [9] * 40], params, [local_envelope(b"other"), lane, lane])[1]
    if not all(torch.equal(a, b) for a, b in zip(alone.logits, crowded.logits)):
        raise AssertionError("the deterministic lane's logits changed beside other requests on the kernel path")
    if not any(r.num_cached_tokens for r in kernel_run):
        raise AssertionError("no prefix-cache hit: the case does not cover a cached prefix")
    for other in runs[1:]:
        for expected, got in zip(torch_run, other):
            if got.token_ids != expected.token_ids:
                raise AssertionError(f"greedy tokens differ: {got.token_ids} != {expected.token_ids}")
            torch.testing.assert_close(torch.stack(got.logits), torch.stack(expected.logits), atol=1e-4, rtol=0)


class EagerReplay:
    """Stands in for a captured CUDA graph on CPU: replay() runs the forward it would have captured."""

    def __init__(self, forward) -> None:
        self.forward, self.replays = forward, 0

    def replay(self) -> None:
        self.replays += 1
        self.forward()


def graph_plumbing_run(checkpoint: Path, rounds, params) -> list:
    """The engine's decode-graph path without CUDA: its fixed buffers, padded rows and scratch
    block, each step replayed eagerly."""
    from engine.config import EngineConfig
    from engine.envelope import local_envelope
    from engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(model=str(checkpoint), dtype="float32", device="cpu", block_size=8,
                                    kv_cache_memory_bytes=4 << 20, max_num_batched_tokens=32))
    runner = engine.runner
    runner.paged_kernel = True
    runner.kv_caches = runner._allocate_kv(engine.model_config, runner.num_blocks + 1)  # + the scratch block
    runner._allocate_graph_inputs(engine.config.max_num_seqs)
    runner._graphs = {size: EagerReplay(runner.graph_forward(size)) for size in runner._graph_sizes}
    results = [r for prompts in rounds for r in engine.generate(prompts, params, local_envelope())]
    if not runner._graphs[1].replays or not runner._graphs[4].replays:
        raise AssertionError("no decode step replayed the graph buffers (batch 1, and 3 padded to 4)")
    return results


CASES: dict[str, Callable] = {
    **{f"decode-{g}-{w}": (lambda k, g=g, w=w: decode(k, g, WINDOWS[w])) for g in GQA for w in WINDOWS},
    **{f"extend-{g}-{w}": (lambda k, g=g, w=w: extend(k, g, WINDOWS[w])) for g in GQA for w in WINDOWS},
    "extend-bfloat16": extend_bfloat16,
    "mixed-step": mixed_step,
    "decode-batch-invariant": decode_batch_invariant,
    "invariant-tiles": invariant_tiles,
}
ENGINE_CASES: dict[str, Callable] = {"engine-paged-path": engine_paged_path}  # these take a checkpoint too


def exact_bfloat16_dots() -> None:
    """Make the interpreter multiply bfloat16 operands by value, as a GPU's tensor cores do.

    Triton 3.7's interpreter holds bfloat16 as raw 16-bit integers and, converting only
    fp8 operands, multiplies those integers in tl.dot (garbage). A bfloat16's bits are the
    top half of a float32's, so widening them gives the exact operands; products then add
    up (in float64, rounded once to float32), so a tile's bits depend on its operands alone,
    as on the GPU.
    """
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    dot = interpreter.InterpreterBuilder.create_dot

    def widen(x):
        if x.dtype.scalar != tl.bfloat16:
            return x
        data = (x.data.astype(np.uint32) << 16).view(np.float32)
        return interpreter.TensorHandle(data, tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a, b = widen(a), widen(b)
        if d.data.dtype != np.float32 or not (a.dtype.scalar.is_floating() and b.dtype.scalar.is_floating()):
            return dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        # float32 and narrower products are exact in float64, and their float64 sum rounds to the
        # same float32 wherever a row sits in its tile; numpy's float32 matmul does not promise that
        # (on an AVX2 OpenBLAS a row's bits change with its place), which no GPU tile does.
        exact = np.matmul(a.data.astype(np.float64), b.data.astype(np.float64)).astype(np.float32)
        return interpreter.TensorHandle(exact + d.data, d.dtype.scalar)

    interpreter.InterpreterBuilder.create_dot = create_dot


def main() -> None:
    global DEVICE
    from engine.model import triton_attention as kernels

    if sys.argv[2:] == ["cuda"]:
        DEVICE = torch.device("cuda")
    elif type(kernels._paged_attention_kernel).__name__ != "InterpretedFunction":
        raise SystemExit("run with TRITON_INTERPRET=1: the kernel was compiled for a GPU, not interpreted")
    else:
        exact_bfloat16_dots()
    checkpoint = Path(sys.argv[1])
    cases = {**CASES, **{name: (lambda k, case=case: case(k, checkpoint)) for name, case in ENGINE_CASES.items()}}
    for name, case in cases.items():
        try:
            case(kernels)
            error = None
        except Exception:  # noqa: BLE001 - reported to the parent test, which fails on it
            error = traceback.format_exc(limit=-3)
        print(json.dumps({"case": name, "error": error}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
