"""The CPU kernels' small ops (engine/model/kernels/qmatmul.cpp) against the eager ops they replace.

The residual add and rotary are PyTorch's bit for bit; the norm, SiLU and decode attention are
fp32 evaluations of their own order, within a rounding of PyTorch's. Every op is row-local: a
row's result is the same in a call of any size (the deterministic lane relies on it).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.model import kernels
from engine.model.attention import AttentionMetadata, _decode_attention
from engine.model.llama import RMSNorm
from engine.model.rope import apply_rotary
from engine.paths import default_cache_dir

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module")
def ops():
    found = kernels.load(default_cache_dir())
    assert found is not None, "the quantized kernels did not build (see the log)"
    return found.ops


def ulps(dtype: torch.dtype) -> float:
    return 2.0**-7 if dtype == torch.bfloat16 else 2.0**-20


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_and_norm_match_the_eager_ops_and_are_row_local(ops, dtype) -> None:
    torch.manual_seed(0)
    rows, width = 37, 576
    x, delta = torch.randn(rows, width).to(dtype), torch.randn(rows, width).to(dtype)
    norm = RMSNorm(width, 1e-5).to(dtype)
    norm.weight.data = torch.randn(width).to(dtype)
    stream = x + delta
    expected = norm(stream)
    got_stream = x.clone()
    got = ops.rms_norm(got_stream, delta, norm.weight, 1e-5)
    assert torch.equal(got_stream, stream)  # the residual add: one rounding, as x + delta
    torch.testing.assert_close(got, expected, rtol=2 * ulps(dtype), atol=1e-6)
    for row in (0, 17, rows - 1):
        alone = ops.rms_norm(stream[row : row + 1].clone(), None, norm.weight, 1e-5)
        assert torch.equal(alone[0], got[row])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_in_place_is_the_eager_rotary_bit_for_bit(ops, dtype) -> None:
    torch.manual_seed(0)
    tokens, heads, kv_heads, head_dim = 5, 9, 3, 64
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim).to(dtype)
    cos, sin = torch.randn(tokens, 1, head_dim).to(dtype), torch.randn(tokens, 1, head_dim).to(dtype)
    rotated = (heads + kv_heads) * head_dim
    expected = apply_rotary(qkv[:, :rotated].view(tokens, heads + kv_heads, head_dim), (cos, sin))
    got = qkv.clone()
    ops.rotary_(got, cos, sin, heads + kv_heads, head_dim)
    assert torch.equal(got[:, :rotated].view_as(expected), expected)
    assert torch.equal(got[:, rotated:], qkv[:, rotated:])  # v untouched


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_times_up_matches_the_eager_ops_and_is_row_local(ops, dtype) -> None:
    torch.manual_seed(0)
    x = (torch.randn(9, 2 * 1536) * 6).to(dtype)
    gate, up = x.split(1536, dim=-1)
    got = ops.silu_mul(x)
    torch.testing.assert_close(got, F.silu(gate) * up, rtol=2 * ulps(dtype), atol=1e-6)
    assert torch.equal(ops.silu_mul(x[4:5])[0], got[4])


def paged_context(dtype: torch.dtype, lengths: list[int], block_size: int = 16, heads: int = 9, kv_heads: int = 3):
    generator = torch.Generator().manual_seed(0)
    blocks, head_dim = 128, 64
    k_cache = torch.randn(blocks, block_size, kv_heads, head_dim, generator=generator).to(dtype)
    v_cache = torch.randn(blocks, block_size, kv_heads, head_dim, generator=generator).to(dtype)
    width = max(-(-n // block_size) for n in lengths)
    tables = torch.zeros(len(lengths), width, dtype=torch.long)
    order = torch.randperm(blocks, generator=generator)
    for i, n in enumerate(lengths):
        used = -(-n // block_size)
        tables[i, :used] = order[i * 20 : i * 20 + used]
    mask = (torch.arange(width * block_size)[None] < torch.tensor(lengths)[:, None])[:, None, None, :]
    q = torch.randn(len(lengths), heads, head_dim, generator=generator).to(dtype)
    return q, k_cache, v_cache, tables, mask


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_matches_sdpa_over_the_pool_and_is_row_local(ops, dtype) -> None:
    lengths = [300, 17, 64, 1, 129]
    q, k_cache, v_cache, tables, mask = paged_context(dtype, lengths)
    scale = 64**-0.5
    meta = AttentionMetadata(torch.zeros(len(lengths), dtype=torch.long), None, tables, mask, [])
    expected = _decode_attention(q, k_cache, v_cache, meta, scale)
    got = ops.decode_attention(q, k_cache, v_cache, tables, mask, scale, None, None, None)
    # PyTorch's bfloat16 kernel rounds the probabilities to bfloat16; this one keeps them in fp32.
    torch.testing.assert_close(got, expected, rtol=0, atol=8e-3 if dtype == torch.bfloat16 else 1e-5)
    for row in range(len(lengths)):
        alone = ops.decode_attention(q[row : row + 1], k_cache, v_cache, tables[row : row + 1], mask[row : row + 1],
                                     scale, None, None, None)
        assert torch.equal(alone[0], got[row])
    scalar = ops.decode_attention(q, k_cache, v_cache, tables, mask, scale, None, None, None, 0)  # any CPU's path
    torch.testing.assert_close(scalar, got, rtol=0, atol=8e-3 if dtype == torch.bfloat16 else 1e-6)


def test_decode_attention_writes_every_rows_kv_before_reading(ops) -> None:
    lengths = [40, 40]
    q, k_cache, v_cache, tables, mask = paged_context(torch.bfloat16, lengths)
    k, v = torch.randn(2, 3, 64).to(torch.bfloat16), torch.randn(2, 3, 64).to(torch.bfloat16)
    slots = torch.stack([tables[0, 2] * 16 + 7, tables[1, 2] * 16 + 7])  # position 39 of each row
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    expected_k.view(-1, 3, 64).index_copy_(0, slots, k)
    expected_v.view(-1, 3, 64).index_copy_(0, slots, v)
    expected = ops.decode_attention(q, expected_k, expected_v, tables, mask, 0.125, None, None, None)
    got = ops.decode_attention(q, k_cache, v_cache, tables, mask, 0.125, k, v, slots)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)
    assert torch.equal(got, expected)


def test_decode_attention_refuses_a_block_outside_the_pool(ops) -> None:
    q, k_cache, v_cache, tables, mask = paged_context(torch.float32, [20])
    tables[0, 0] = k_cache.shape[0]
    with pytest.raises(RuntimeError, match="block out of range"):
        ops.decode_attention(q, k_cache, v_cache, tables, mask, 0.125, None, None, None)
