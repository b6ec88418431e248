"""Quantized weights read in place: the packed layout, the kernels, and the engine on GGUF files.

The bound. A packed weight dequantizes to exactly the gguf package's values (checked with
torch.equal for every type and instruction set), so a product with it differs from the
dequantized path only in the order of its fp32 sums. Any order of summing K products has an
error of at most gamma_K * sum_k |x_k w_k|, gamma_K = K u / (1 - K u), u = 2^-24 (Higham, Accuracy
and Stability of Numerical Algorithms, 3.1); each output is held to that bound against a float64
reference, per type, so the bound is the same whatever the type: the type only changes the weights.
Through a whole model the two paths then differ as two fp32 implementations do, which the HF oracle
tests already hold to LOGIT_ATOL; the engine tests below hold the quantized path to the dequantized
one with that tolerance, and require identical greedy tokens.
"""

from __future__ import annotations

import json
import logging

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from engine.config import EngineConfig
from engine.envelope import local_envelope
from engine.errors import ConfigError
from engine.llm_engine import LLMEngine
from engine.model import gguf as gguf_module
from engine.model import invariant, kernels
from engine.model.quant import (
    AMX_CHUNK_ROWS,
    AMX_MAX_ROWS,
    BF16_MIN_ROWS,
    DENSE_MIN_ROWS,
    PACKED_TYPES,
    QUANTIZED_FILE,
    TILED_MIN_ROWS,
    PackedWeight,
    QuantizedEmbedding,
    QuantizedLinear,
    dequantize,
    pack,
)
from engine.model_runner import available_cpus
from engine.paths import default_cache_dir
from engine.sampling_params import SamplingParams
from tests.utils.gguf_files import K_QUANTS, random_blocks, write_tiny_gguf

LOGIT_ATOL = 2e-4  # as tests/engine/test_gguf.py holds the fp32 path to transformers
U = 2.0**-24


@pytest.fixture(scope="module")
def loaded() -> kernels.Kernels:
    found = kernels.load(default_cache_dir())
    assert found is not None, "the quantized kernels did not build (see the log)"
    return found


def isas(loaded: kernels.Kernels) -> list[int]:
    return list(range(loaded.isa + 1))  # every instruction set this CPU runs, the scalar path included


def gguf_tensor(kind: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind in K_QUANTS:
        return random_blocks(kind, rows, cols, rng)
    values = rng.standard_normal((rows, cols), dtype=np.float32)
    values[rows // 2] *= 100  # rows of very different scales
    return gguf.quantize(values, gguf.GGMLQuantizationType[kind])


def packed(kind: str, rows: int, cols: int, seed: int = 0) -> tuple[PackedWeight, torch.Tensor]:
    raw = gguf_tensor(kind, rows, cols, seed)
    codes, scales, mins, fmt = pack(kind, raw, rows, cols)
    weight = PackedWeight(torch.from_numpy(codes), torch.from_numpy(scales), torch.from_numpy(mins), cols, fmt)
    expected = torch.from_numpy(np.ascontiguousarray(gguf.dequantize(raw, gguf.GGMLQuantizationType[kind])))
    return weight, expected.reshape(rows, cols)


def odd_shape(kind: str) -> tuple[int, int]:
    """An odd row count, and columns that end in half a 64-element run where the type allows it."""
    return (37, 768) if kind in K_QUANTS else (37, 96)


@pytest.mark.parametrize("kind", PACKED_TYPES)
def test_packed_weights_dequantize_to_the_gguf_values_exactly(loaded, kind):
    rows, cols = odd_shape(kind)
    weight, expected = packed(kind, rows, cols)
    for isa in isas(loaded):
        assert torch.equal(dequantize(weight, isa), expected), f"{kind}, {kernels.ISA_NAMES[isa]}"


def mins_per_element(weight: PackedWeight) -> torch.Tensor:
    return weight.mins.repeat_interleave(weight.format.block, dim=1)[:, : weight.cols]


@pytest.mark.parametrize("kind", PACKED_TYPES)
def test_fp32_products_are_within_the_bound_and_row_local(loaded, kind):
    rows, cols = odd_shape(kind)
    weight, dense = packed(kind, rows, cols, seed=1)
    x = torch.randn(11, cols, generator=torch.Generator().manual_seed(2))
    reference = x.double() @ dense.double().T
    # |scale * c| + |min| <= |w| + 2 |min|: the terms the kernel sums (module docstring).
    magnitude = x.double().abs() @ (dense.double().abs() + 2 * mins_per_element(weight).double().abs()).T
    bound = ((cols + 2) * U / (1 - (cols + 2) * U) + 2 * U) * magnitude
    for isa in isas(loaded):
        layer = QuantizedLinear([weight], None, isa, threads=2)  # the caller and a helper
        # From TILED_MIN_ROWS rows on, AVX2 and up take the tiled kernel (the next test).
        direct = 11 if isa < kernels.AVX2 else TILED_MIN_ROWS - 1
        for m in sorted({1, 3, 4, 5, direct}):  # tiles of 1 to 4 rows
            y = layer(x[:m])
            assert y.dtype == torch.float32 and y.shape == (m, rows)
            err = (y.double() - reference[:m]).abs()
            worst = (err / bound[:m]).max()
            assert (err <= bound[:m]).all(), f"{kind}, {kernels.ISA_NAMES[isa]}, M={m}: {worst:.2f}x the bound"
        # A row's result is the same whatever else the call holds (the deterministic lane needs it).
        alone = torch.cat([layer(x[i : i + 1]) for i in range(direct)])
        assert torch.equal(alone, layer(x[:direct])), f"{kind}, {kernels.ISA_NAMES[isa]}"


def tiled(kernel: str, x: torch.Tensor, weight: PackedWeight, chunk_rows: int = 4) -> torch.Tensor:
    """One call of a tiled kernel (qlinear_tiled, qlinear_bf16) on 2 threads."""
    fmt = weight.format
    return getattr(torch.ops.tenantgate_quant, kernel)(x.contiguous(), weight.codes, weight.scales, weight.mins,
                                                       weight.cols, fmt.bits, fmt.block, fmt.offset, chunk_rows, 2)


def qlinear_tiled(x: torch.Tensor, weight: PackedWeight, chunk_rows: int = 4) -> torch.Tensor:
    return tiled("qlinear_tiled", x, weight, chunk_rows)


@pytest.mark.parametrize("kind", PACKED_TYPES)
def test_tiled_fp32_products_use_the_dequantized_weights_and_give_a_row_the_same_bits_in_any_call(loaded, kind):
    if loaded.isa < kernels.AVX2:
        pytest.skip("this CPU has no AVX2: fp32 products read the codes directly at every size")
    rows, cols = odd_shape(kind)
    weight, dense = packed(kind, rows, cols, seed=11)
    x = torch.randn(70, cols, generator=torch.Generator().manual_seed(12))
    # The kernel multiplies x into the dequantized weights (exactly the gguf values): any order of
    # summing cols fp32 products is within gamma_cols of the exact sum.
    reference = x.double() @ dense.double().T
    bound = cols * U / (1 - cols * U) * (x.double().abs() @ dense.double().abs().T)
    alone = torch.cat([qlinear_tiled(x[i : i + 1], weight) for i in range(x.shape[0])])
    err = (alone.double() - reference).abs()
    assert (err <= bound).all(), f"{kind}: {(err / bound).max():.2f}x the bound"
    layer = QuantizedLinear([weight], None, loaded.isa, threads=2)
    for m in (TILED_MIN_ROWS, 9, 13, 16, 31, 64, 70):  # whole and partial register tiles, rows at every place
        assert torch.equal(layer(x[:m]), alone[:m]), f"{kind}, M={m}: the layer did not take the tiled kernel"
        for start in (0, 3):
            for chunk_rows in (4, 16):
                call = qlinear_tiled(x[start : start + m], weight, chunk_rows)
                assert torch.equal(call, alone[start : start + m]), f"{kind}, M={m}, rows from {start}"


def qlinear_bf16(x: torch.Tensor, weight: PackedWeight, chunk_rows: int = 4) -> torch.Tensor:
    return tiled("qlinear_bf16", x, weight, chunk_rows)


@pytest.mark.parametrize("kind", PACKED_TYPES)
def test_bf16_products_use_the_bf16_weights_and_are_row_local(loaded, kind):
    if loaded.isa < kernels.BF16:
        pytest.skip("this CPU has no AVX512-BF16: bfloat16 activations take the fp32 path")
    rows, cols = odd_shape(kind)
    weight, dense = packed(kind, rows, cols, seed=7)
    x = torch.randn(DENSE_MIN_ROWS + 8, cols, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    w16 = dense.to(torch.bfloat16).double()  # what a dense bf16 copy of the dequantized weights holds
    reference = x.double() @ w16.T
    bound = cols * U / (1 - cols * U) * (x.double().abs() @ w16.abs().T)  # bf16 products are exact in fp32
    layer = QuantizedLinear([weight], None, loaded.isa, threads=2)
    # The tiled kernel: register tiles of 4 weight rows by 4 activation rows, and every partial one.
    for m in (BF16_MIN_ROWS, 8, 13, DENSE_MIN_ROWS - 1, DENSE_MIN_ROWS + 8):
        for chunk_rows in (4, 16):
            y = qlinear_bf16(x[:m], weight, chunk_rows)
            err = (y.double() - reference[:m]).abs()
            assert (err <= bound[:m]).all(), f"{kind}, M={m}: {(err / bound[:m]).max():.2f}x the bound"
        if m < DENSE_MIN_ROWS:
            assert torch.equal(layer(x[:m]), y.to(torch.bfloat16))
    # From DENSE_MIN_ROWS rows on: torch's matmul over the weights dequantized to bf16, which are
    # the dequantized weights rounded to nearest even.
    fmt = weight.format
    w_bf16 = torch.ops.tenantgate_quant.qdequantize_bf16(weight.codes, weight.scales, weight.mins, cols, fmt.bits,
                                                         fmt.block, fmt.offset, 2)
    assert torch.equal(w_bf16, dense.to(torch.bfloat16))
    with invariant.lane():  # where the CPU has AMX, only the deterministic lane takes it at these sizes
        assert torch.equal(layer(x[:DENSE_MIN_ROWS + 2]), F.linear(x[:DENSE_MIN_ROWS + 2], w_bf16))


@pytest.mark.parametrize("kind", PACKED_TYPES)
def test_a_bf16_row_has_the_same_bits_in_a_call_of_any_size(loaded, kind):
    if loaded.isa < kernels.BF16:
        pytest.skip("this CPU has no AVX512-BF16: bfloat16 activations take the fp32 path")
    rows, cols = odd_shape(kind)
    weight, _ = packed(kind, rows, cols, seed=9)
    x = torch.randn(70, cols, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    alone = torch.cat([qlinear_bf16(x[i : i + 1], weight) for i in range(x.shape[0])])
    for m in (2, 4, 5, 8, 9, 16, 31, 64, 70):  # whole and partial register tiles, rows at every place
        for start in (0, 3):
            for chunk_rows in (4, 16):
                call = qlinear_bf16(x[start : start + m], weight, chunk_rows)
                assert torch.equal(call, alone[start : start + m]), f"{kind}, M={m}, rows from {start}"


def qlinear_amx(x: torch.Tensor, weight: PackedWeight, chunk_rows: int = AMX_CHUNK_ROWS) -> torch.Tensor:
    return tiled("qlinear_amx", x, weight, chunk_rows)


@pytest.mark.parametrize("kind", PACKED_TYPES)
def test_amx_products_use_the_bf16_weights_and_give_a_row_the_same_bits_in_any_call(loaded, kind):
    if loaded.isa < kernels.AMX:
        pytest.skip("this CPU (or its kernel) offers no AMX-BF16: bfloat16 calls of 32 rows and more run oneDNN")
    rows, cols = 77, odd_shape(kind)[1]  # two whole 32-row weight tiles and a partial one
    weight, dense = packed(kind, rows, cols, seed=13)
    x = torch.randn(AMX_MAX_ROWS + 6, cols, generator=torch.Generator().manual_seed(14)).to(torch.bfloat16)
    w16 = dense.to(torch.bfloat16).double()
    reference = x.double() @ w16.T
    # fp32 sums of exact bf16 products (within gamma_cols), then one rounding to bf16 (2^-8 relative).
    bound = cols * U / (1 - cols * U) * (x.double().abs() @ w16.abs().T)
    bound = bound + 2.0**-8 * (reference.abs() + bound)
    alone = torch.cat([qlinear_amx(x[i : i + 1], weight) for i in range(x.shape[0])])
    assert alone.dtype == torch.bfloat16
    err = (alone.double() - reference).abs()
    assert (err <= bound).all(), f"{kind}: {(err / bound).max():.2f}x the bound"
    for m in (2, 16, 31, 32, 33, 64, 70):  # whole and partial 32-row activation tiles, rows at every place
        for start in (0, 3):
            for chunk_rows in (32, 64, 96):
                call = qlinear_amx(x[start : start + m], weight, chunk_rows)
                assert torch.equal(call, alone[start : start + m]), f"{kind}, M={m}, rows from {start}"
    layer = QuantizedLinear([weight], None, loaded.isa, threads=2)
    for m in (DENSE_MIN_ROWS, 45, AMX_MAX_ROWS):
        assert torch.equal(layer(x[:m]), alone[:m]), f"{kind}, M={m}: the layer did not take the AMX kernel"
    # Wider calls, and the deterministic lane at every size, keep the dense path they were checked on.
    fmt = weight.format
    w_bf16 = torch.ops.tenantgate_quant.qdequantize_bf16(weight.codes, weight.scales, weight.mins, cols, fmt.bits,
                                                         fmt.block, fmt.offset, 2)
    wide = x[: AMX_MAX_ROWS + 6]
    assert torch.equal(layer(wide), F.linear(wide, w_bf16))
    with invariant.lane():
        assert torch.equal(layer(x[:DENSE_MIN_ROWS]), F.linear(x[:DENSE_MIN_ROWS], w_bf16))


def test_a_fused_projection_of_mixed_formats_keeps_its_parts(loaded):
    q, q_dense = packed("Q4_1", 64, 96, seed=3)
    k, k_dense = packed("Q8_0", 32, 96, seed=4)
    v, v_dense = packed("Q4_1", 32, 96, seed=5)
    layer = QuantizedLinear([q, k, v], None, loaded.isa)
    assert len(layer.parts) == 3 and layer.out_features == 128
    x = torch.randn(2, 96)
    expected = x.double() @ torch.cat([q_dense, k_dense, v_dense]).double().T
    torch.testing.assert_close(layer(x).double(), expected, atol=1e-4, rtol=1e-5)
    merged = QuantizedLinear([q, v], None, loaded.isa)
    assert len(merged.parts) == 1  # one format: one kernel call


def test_adjacent_rows_of_one_tensor_are_joined_without_a_copy():
    whole, _ = packed("Q4_1", 96, 64, seed=7)
    parts = [whole.select_rows(slice(a, b)) for a, b in ((0, 64), (64, 80), (80, 96))]
    joined = PackedWeight.cat(parts)
    for field in ("codes", "scales", "mins"):
        assert getattr(joined, field).data_ptr() == getattr(whole, field).data_ptr()  # a view
        assert torch.equal(getattr(joined, field), getattr(whole, field))
    apart = PackedWeight.cat([parts[0], parts[2]])  # not adjacent: copied, in order
    assert apart.codes.data_ptr() != whole.codes.data_ptr()
    assert torch.equal(apart.codes, torch.cat([whole.codes[:64], whole.codes[80:]]))


def mapped_ranges(path) -> list[tuple[int, int]]:
    ranges = []
    with open("/proc/self/maps") as maps:
        lines = maps.read().splitlines()
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[5] == str(path):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


def test_fused_projections_are_stored_as_one_tensor_and_served_from_the_files_pages(tmp_path, demo_model_dir,
                                                                                    loaded):
    path = write_tiny_gguf(tmp_path / "fused.gguf", demo_model_dir, qtype="Q4_1", shape=ODD, seed=9)
    engine = engine_for(path, "quantized")
    file = engine.model_path / QUANTIZED_FILE
    with safe_open(str(file), "pt") as f:
        names = set(f.keys())
        fused = json.loads(f.metadata()["fused"])
    assert "model.layers.1.self_attn.qkv.codes" in names and "model.layers.1.mlp.gate_up.mins" in names
    assert not any(".q_proj." in n or ".up_proj." in n for n in names)  # the members live only in their group
    assert fused["model.layers.0.mlp.gate_up"] == ["model.layers.0.mlp.gate_proj.weight",
                                                  "model.layers.0.mlp.up_proj.weight"]
    ranges = mapped_ranges(file)
    layers = [layer for block in engine.runner.model.layers
              for layer in (block.self_attn.qkv_proj, block.mlp.gate_up_proj)]
    for layer in layers:
        assert isinstance(layer, QuantizedLinear) and len(layer.parts) == 1
        for tensor in (layer.parts[0].codes, layer.parts[0].scales, layer.parts[0].mins):
            assert any(start <= tensor.data_ptr() < end for start, end in ranges), "copied out of the file"


def test_a_group_whose_members_differ_in_format_stays_in_parts():
    formats = {"model.layers.0.self_attn.q_proj.weight": "Q4_K:4:256:0:256",
               "model.layers.0.self_attn.k_proj.weight": "Q4_K:4:256:0:256",
               "model.layers.0.self_attn.v_proj.weight": "Q6_K:6:16:32:256",
               "model.layers.0.mlp.gate_proj.weight": "Q4_K:4:256:0:256",
               "model.layers.0.mlp.up_proj.weight": "Q4_K:4:256:0:256"}
    tensors = {f"{name}.{field}": torch.full((2, 1), i, dtype=torch.uint8)
               for i, name in enumerate(formats) for field in ("codes", "scales", "mins")}
    fused = gguf_module._fuse(tensors, formats, layers=1)
    assert fused == {"model.layers.0.mlp.gate_up": ["model.layers.0.mlp.gate_proj.weight",
                                                    "model.layers.0.mlp.up_proj.weight"]}
    assert torch.equal(tensors["model.layers.0.mlp.gate_up.codes"].flatten(), torch.tensor([3, 3, 4, 4]).byte())
    assert "model.layers.0.self_attn.v_proj.weight.codes" in tensors
    assert "model.layers.0.self_attn.qkv.codes" not in tensors


def test_embedding_rows_are_the_dequantized_rows(loaded):
    table, dense = packed("Q8_0", 50, 96, seed=6)
    layer = QuantizedEmbedding(table, torch.float32, loaded.isa)
    ids = torch.tensor([[3, 49, 3], [0, 7, 12]])
    assert torch.equal(layer(ids), dense[ids])


# -- the engine on GGUF files ----------------------------------------------------------------------

PROMPTS = [[5, 17, 99, 3, 250, 41, 8], [300, 2, 2, 77], list(range(40, 90))]
# Odd shapes: 3 query heads of 32 over 1 KV head, 96 wide (a half run of 64 at the end of each row)
# and a 160-wide MLP; the K-quants need rows that are whole 256-element super-blocks.
ODD = {"hidden": 96, "heads": 3, "kv_heads": 1, "intermediate": 160, "layers": 2}
ODD_K = {"hidden": 256, "heads": 4, "kv_heads": 2, "intermediate": 768, "layers": 2}


def engine_for(path, weights: str, **config) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), dtype="float32", kv_cache_memory_bytes=16 << 20, weights=weights,
                                  **config))


def greedy(engine: LLMEngine, n: int = 12):
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, keep_logits=True)
    return engine.generate(PROMPTS, params, local_envelope())


@pytest.mark.parametrize("qtype", PACKED_TYPES)
def test_quantized_gguf_matches_the_dequantized_path(tmp_path, demo_model_dir, loaded, qtype):
    shape = ODD_K if qtype in K_QUANTS else ODD
    # (Untied: a random tied table makes the model repeat one token; SmolLM2's tied Q8_0 table is
    # tested in tests/engine/test_smollm2.py.)
    path = write_tiny_gguf(tmp_path / f"odd-{qtype}.gguf", demo_model_dir, qtype=qtype, shape=shape)
    quantized, dense = engine_for(path, "quantized"), engine_for(path, "dequantized")
    assert quantized.runner.weights == f"quantized-{loaded.isa_name}" and dense.runner.weights == "dequantized"
    layers = [m for m in quantized.runner.model.modules() if isinstance(m, (QuantizedLinear, QuantizedEmbedding))]
    assert len(layers) == 4 * shape["layers"] + 2  # every projection, the embedding and the lm_head
    assert quantized.fingerprint != dense.fingerprint
    for q, d in zip(greedy(quantized), greedy(dense)):
        assert q.token_ids == d.token_ids
        torch.testing.assert_close(torch.stack(q.logits), torch.stack(d.logits), atol=LOGIT_ATOL, rtol=0)
        assert len(set(d.token_ids)) > 1  # a model that repeats one token would prove little


def test_wide_decode_steps_match_the_dequantized_path(tmp_path, demo_model_dir, loaded):
    """Steps of more than a few decodes read each context in place (the CPU kernel's attention; PyTorch
    runs the rest): the same greedy tokens as the dequantized path, logits within its tolerance."""
    path = write_tiny_gguf(tmp_path / "wide.gguf", demo_model_dir, qtype="Q4_1", shape=ODD)
    prompts = [[(7 * i + j) % 250 + 3 for j in range(5 + i % 23)] for i in range(36)]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, keep_logits=True)
    quantized = engine_for(path, "quantized", max_num_seqs=36).generate(prompts, params, local_envelope())
    dense = engine_for(path, "dequantized", max_num_seqs=36).generate(prompts, params, local_envelope())
    for q, d in zip(quantized, dense):
        assert q.token_ids == d.token_ids
        torch.testing.assert_close(torch.stack(q.logits), torch.stack(d.logits), atol=LOGIT_ATOL, rtol=0)


def test_auto_serves_dequantized_weights_where_the_kernels_cannot_build(tmp_path, demo_model_dir, monkeypatch, caplog):
    path = write_tiny_gguf(tmp_path / "q.gguf", demo_model_dir, qtype="Q4_1")
    monkeypatch.setattr(kernels, "load", lambda cache_dir: None)
    with caplog.at_level(logging.INFO, logger="engine.model_runner"):
        engine = engine_for(path, "auto")
    assert engine.runner.weights == "dequantized"
    assert any("serving dequantized weights" in r.getMessage() for r in caplog.records)
    with pytest.raises(ConfigError, match="could not be built"):
        engine_for(path, "quantized")


def test_quantized_weights_are_refused_for_a_checkpoint_without_packed_weights(demo_model_dir):
    with pytest.raises(ConfigError, match="no packed weights"):
        engine_for(demo_model_dir, "quantized")
    assert engine_for(demo_model_dir, "auto").runner.weights == "dequantized"


def test_the_config_refuses_unknown_weights_and_threads():
    with pytest.raises(ConfigError, match="weights"):
        EngineConfig(weights="int4")
    with pytest.raises(ConfigError, match="threads"):
        EngineConfig(threads=0)


# -- threads -----------------------------------------------------------------------------------------


def write_cgroup(tmp_path, cpu_max: str | None):
    tmp_path.mkdir()
    (tmp_path / "proc").write_text("0::/job/task\n")
    folder = tmp_path / "fs" / "job" / "task"
    folder.mkdir(parents=True)
    if cpu_max is not None:
        (tmp_path / "fs" / "job" / "cpu.max").write_text(cpu_max)
    (folder / "cpu.max").write_text("max 100000\n")
    return str(tmp_path / "proc"), str(tmp_path / "fs")


def test_threads_follow_the_cgroup_quota_and_the_affinity_mask(tmp_path, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    proc, root = write_cgroup(tmp_path / "a", "150000 100000\n")  # 1.5 CPUs on an ancestor
    assert available_cpus(proc, root) == 1
    proc, root = write_cgroup(tmp_path / "b", "800000 100000\n")  # more quota than CPUs in the mask
    assert available_cpus(proc, root) == 4
    proc, root = write_cgroup(tmp_path / "c", None)
    assert available_cpus(proc, root) == 4
    assert available_cpus(str(tmp_path / "missing"), root) == 4


def test_the_threads_setting_overrides_the_choice(demo_model_dir):
    before = torch.get_num_threads()
    try:
        LLMEngine(EngineConfig(model=str(demo_model_dir), kv_cache_memory_bytes=16 << 20, threads=1))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_quantized_fingerprint_covers_the_weight_files(tmp_path, demo_model_dir, loaded):
    # Two checkpoints alike in all but their weights (one tensor's blocks drawn from another seed):
    # engines serving them quantized compute different functions, so they must not share a
    # fingerprint, and with it a prefix cache.
    first = write_tiny_gguf(tmp_path / "first.gguf", demo_model_dir, qtype="Q8_0", shape=ODD)
    second = write_tiny_gguf(tmp_path / "second.gguf", demo_model_dir, qtype="Q8_0", shape=ODD, seed=1)
    assert first.read_bytes() != second.read_bytes()
    a, b = engine_for(first, "quantized"), engine_for(second, "quantized")
    assert a.runner.weights == b.runner.weights == f"quantized-{loaded.isa_name}"
    assert a.fingerprint != b.fingerprint
    assert engine_for(first, "quantized").fingerprint == a.fingerprint  # and it is stable
