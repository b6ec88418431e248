"""Matrix products with SmolLM2-135M's weight shapes: the candidates for reading quantized weights.

Each candidate multiplies M activation rows by one of the model's weights (q/k/v fused 960x576,
o 576x576, gate/up fused 3072x576, down 576x1536, the tied lm_head 49152x576) and the figure is the
time of one decoder step's worth (30 layers of the four projections plus the lm_head), median of
--repeats, so a figure is directly "ms of weight products per token" at M = 1.

- dense bfloat16 / float32: F.linear, what the engine ran before (oneDNN / MKL);
- int8pack: torch's `_weight_int8pack_mm` (int8 per output channel, bfloat16 activations);
- int4pack: torch's `_weight_int4pack_mm_for_cpu` (int4, groups of 32, bfloat16 activations);
- inductor int8: torch.compile of an int8 weight-only product (dequantize then matmul, fused by
  inductor's CPU code generator);
- torchao: `quantize_` with Int8WeightOnlyConfig / Int4WeightOnlyConfig(Int4CPULayout) where
  torchao is importable (it is not a dependency: PYTHONPATH a `pip install --target` copy);
- tenantgate Q4_1 / Q8_0: engine/model/kernels (qmatmul.cpp) on the GGUF blocks packed by
  engine/model/quant.py, with the instruction set the CPU reports.

    .venv/bin/python bench/quant_kernels.py                  # M = 1, 4, 16, 32
    .venv/bin/python bench/quant_kernels.py --rows 1 --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYERS = 30
# (rows, cols, times per token)
SHAPES = [(960, 576, LAYERS), (576, 576, LAYERS), (3072, 576, LAYERS), (576, 1536, LAYERS), (49152, 576, 1)]


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def step_ms(make, rows_m: int, repeats: int) -> float:
    """ms for one token's worth of products: each shape's call, times its count per token."""
    total = 0.0
    for n, k, count in SHAPES:
        call = make(n, k, rows_m)
        if call is None:
            return float("nan")
        reps = max(3, repeats // (1 if count == 1 else 4))
        total += timed(call, reps) * count
    return total * 1000


def dense(dtype):
    def make(n, k, m):
        w = torch.randn(n, k).to(dtype)
        x = torch.randn(m, k).to(dtype)
        return lambda: F.linear(x, w)
    return make


def int8pack(n, k, m):
    w = torch.randint(-127, 127, (n, k), dtype=torch.int8)
    s = torch.rand(n, dtype=torch.bfloat16)
    x = torch.randn(m, k, dtype=torch.bfloat16)
    return lambda: torch.ops.aten._weight_int8pack_mm(x, w, s)


def int4pack(n, k, m):
    try:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (n, k), dtype=torch.int32), 1)
    except (RuntimeError, AttributeError) as exc:
        print(f"  int4pack: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
        return None
    scales_zeros = torch.rand(k // 32, n, 2, dtype=torch.bfloat16)
    x = torch.randn(m, k, dtype=torch.bfloat16)
    return lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32, scales_zeros)


def inductor_int8(n, k, m):
    w = torch.randint(-127, 127, (n, k), dtype=torch.int8)
    s = torch.rand(n, 1, dtype=torch.bfloat16)
    x = torch.randn(m, k, dtype=torch.bfloat16)

    @torch.compile(dynamic=False)
    def product(x):
        return F.linear(x, w.to(torch.bfloat16) * s)

    return lambda: product(x)


def torchao(config_name: str):
    def make(n, k, m):
        try:
            from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
        except ImportError:
            return None
        layer = torch.nn.Linear(k, n, bias=False).to(torch.bfloat16)
        if config_name == "int8":
            config = Int8WeightOnlyConfig()
        else:
            from torchao.dtypes import Int4CPULayout

            config = Int4WeightOnlyConfig(group_size=32, layout=Int4CPULayout())
        try:
            quantize_(layer, config)
        except Exception as exc:  # noqa: BLE001 - a candidate that does not run here is reported as such
            print(f"  torchao {config_name}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            return None
        x = torch.randn(m, k, dtype=torch.bfloat16)
        return lambda: layer(x)
    return make


def ours(kind: str, threads: int, dtype=torch.bfloat16):
    def make(n, k, m):
        import gguf

        from engine.model import kernels
        from engine.model.quant import PackedWeight, QuantizedLinear, pack
        from engine.paths import default_cache_dir

        loaded = kernels.load(default_cache_dir())
        if loaded is None:
            return None
        values = np.random.default_rng(0).standard_normal((n, k), dtype=np.float32)
        raw = gguf.quantize(values, gguf.GGMLQuantizationType[kind])
        codes, scales, mins, fmt = pack(kind, raw, n, k)
        weight = PackedWeight(torch.from_numpy(codes), torch.from_numpy(scales), torch.from_numpy(mins), k, fmt)
        layer = QuantizedLinear([weight], None, loaded.isa, threads)
        x = torch.randn(m, k).to(dtype)
        return lambda: layer(x)
    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,4,16,32", help="activation rows M")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--candidates", default="all")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    candidates = {
        "dense bfloat16": dense(torch.bfloat16),
        "dense float32": dense(torch.float32),
        "int8pack (aten)": int8pack,
        "int4pack (aten)": int4pack,
        "inductor int8": inductor_int8,
        "torchao int8": torchao("int8"),
        "torchao int4 cpu": torchao("int4"),
        "tenantgate Q4_1": ours("Q4_1", args.threads),
        "tenantgate Q8_0": ours("Q8_0", args.threads),
    }
    if args.candidates != "all":
        wanted = args.candidates.split(",")
        candidates = {name: make for name, make in candidates.items() if any(w in name for w in wanted)}
    rows = [int(r) for r in args.rows.split(",")]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"weight products of one SmolLM2-135M token (ms), {args.threads} threads, load average {load}")
    print(f"  {'candidate':<20}" + "".join(f"{'M=' + str(m):>10}" for m in rows))
    with torch.inference_mode():
        for name, make in candidates.items():
            figures = []
            for m in rows:
                try:
                    figures.append(step_ms(make, m, args.repeats))
                except Exception as exc:  # noqa: BLE001
                    print(f"  {name}: M={m}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                    figures.append(float("nan"))
            print(f"  {name:<20}" + "".join(f"{f:>10.2f}" for f in figures), flush=True)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average at the end {load}")


if __name__ == "__main__":
    main()
