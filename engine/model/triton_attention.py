"""Attention that reads the paged KV pool in place, as one Triton kernel (the CUDA path).

attention.py gathers every sequence's context into a contiguous copy before attending;
here each program walks its sequence's block table and loads keys and values straight
from their slots, as vLLM's and SGLang's paged kernels do. One kernel serves both kinds
of step:

- decode: one query row per sequence (decode_attention);
- extend: a run of new tokens per sequence, against its cached prefix and itself,
  causal, sequences of different lengths in one launch (extend_attention, cu_seqlens).

A program takes one sequence, one KV head and BLOCK_M of its new tokens, with all the
query heads that share that KV head (grouped-query attention) as the rows of one tile,
and runs an online softmax over the keys BLOCK_N at a time, oldest first. A query at
position p sees keys in [0, p], or in (p - sliding_window, p] with a window (Mistral).

The key order a query's softmax runs in depends only on its own position (tiles start
at multiples of BLOCK_N from key 0, and there is no split across programs), never on
which other sequences share the launch; key tiles wholly masked for a query leave its
sums exactly as they were. With `invariant` (the deterministic lane) extends use the
decode's tile shape too, so every launch runs one compiled kernel and a token's
attention has the same bits in a whole prefill, a chunk of one, or a decode step.

Triton's interpreter (TRITON_INTERPRET=1 before this module is imported) runs the same
kernel on CPU tensors; tests/engine/test_triton_attention.py checks it that way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 32  # keys per iteration
MIN_DOT_ROWS = 16  # tl.dot's smallest M (and K) on NVIDIA GPUs


# The block table's width changes from step to step: one compiled kernel serves every width.
@triton.jit(do_not_specialize=["stride_bt"])
def _paged_attention_kernel(
    Q, K_cache, V_cache, Out,
    block_tables, q_start, q_len, context_lens,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_bt,
    scale,
    WINDOW: tl.constexpr, PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    tile = tl.program_id(2)
    num_new = tl.load(q_len + seq)
    if tile * BLOCK_M < num_new:
        first_row = tl.load(q_start + seq)
        num_keys = tl.load(context_lens + seq)
        prefix = num_keys - num_new  # keys cached before this step's tokens

        # Tile rows: BLOCK_M tokens x GROUP_PAD heads (heads past GROUP are padding).
        rows = tl.arange(0, BLOCK_M * GROUP_PAD)
        token = tile * BLOCK_M + rows // GROUP_PAD
        head = kv_head * GROUP + rows % GROUP_PAD
        row_ok = (token < num_new) & (rows % GROUP_PAD < GROUP)
        position = prefix + token
        dims = tl.arange(0, HEAD_PAD)
        dim_ok = dims < HEAD_DIM

        q_ptrs = Q + (first_row + token)[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :]
        q = tl.load(q_ptrs, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

        last = tl.minimum(prefix + (tile + 1) * BLOCK_M, num_keys)  # one past the tile's last position
        lo = 0
        if WINDOW > 0:  # skip the tiles wholly before the first query's window
            lo = tl.maximum(prefix + tile * BLOCK_M - WINDOW + 1, 0) // BLOCK_N * BLOCK_N

        # A finite floor keeps exp() of fully masked tiles at 0 instead of NaN.
        m_i = tl.full([BLOCK_M * GROUP_PAD], -1.0e30, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M * GROUP_PAD], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M * GROUP_PAD, HEAD_PAD], dtype=tl.float32)
        table = block_tables + seq * stride_bt
        for start in range(lo, last, BLOCK_N):
            keys = start + tl.arange(0, BLOCK_N)
            key_ok = keys < last
            page = tl.load(table + keys // PAGE_SIZE, mask=key_ok, other=0).to(tl.int64)
            offsets = page * stride_kb + (keys % PAGE_SIZE) * stride_ks + kv_head * stride_kh
            kv_mask = key_ok[:, None] & dim_ok[None, :]
            k = tl.load(K_cache + offsets[:, None] + dims[None, :], mask=kv_mask, other=0.0)
            v = tl.load(V_cache + offsets[:, None] + dims[None, :], mask=kv_mask, other=0.0)

            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            visible = key_ok[None, :] & (keys[None, :] <= position[:, None])
            if WINDOW > 0:
                visible = visible & (position[:, None] - keys[None, :] < WINDOW)
            scores = tl.where(visible, scores, float("-inf"))

            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            p = tl.exp(scores - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new

        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_ptrs = Out + (first_row + token)[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :]
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def paged_attention(
    q: torch.Tensor,  # [T, H, D] this step's queries
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], the step's new keys already written
    v_cache: torch.Tensor,
    out: torch.Tensor,  # [T, H, D], written at the rows the sequences own
    q_start: torch.Tensor,  # [n] int32: each sequence's first row in q
    q_len: torch.Tensor,  # [n] int32: its new tokens this step (0: none, the program exits)
    context_lens: torch.Tensor,  # [n] int32: its keys, cached prefix plus the new tokens
    block_tables: torch.Tensor,  # [n, max_blocks] int32, covering context_lens
    max_q_len: int,
    scale: float,
    sliding_window: int | None,
    invariant: bool = False,
) -> torch.Tensor:
    """Attention of each sequence's new rows over its paged context; returns out."""
    num_seqs = q_start.shape[0]
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    if num_seqs == 0 or max_q_len == 0:
        return out
    if q.stride(2) != 1 or out.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride() != k_cache.stride():
        raise ValueError("paged attention needs the head dimension contiguous and K/V caches of one layout")
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    # A tile is block_m tokens x group_pad heads: 16 rows for decodes (one token each, tl.dot's
    # least), 64 for extends (64 tokens of one head, down to 8 tokens of 8 heads sharing a KV head).
    block_m = max((MIN_DOT_ROWS if max_q_len == 1 or invariant else 4 * MIN_DOT_ROWS) // group_pad, 1)
    grid = (num_seqs, num_kv_heads, triton.cdiv(max_q_len, block_m))
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, out,
        block_tables, q_start, q_len, context_lens,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        scale,
        WINDOW=sliding_window or 0, PAGE_SIZE=k_cache.shape[1], GROUP=group, GROUP_PAD=group_pad,
        HEAD_DIM=head_dim, HEAD_PAD=max(triton.next_power_of_2(head_dim), MIN_DOT_ROWS),
        BLOCK_M=block_m, BLOCK_N=BLOCK_N,
        # float32 caches multiply in full float32 (a GPU would round to TF32); 16-bit ones on tensor cores
        PRECISION="ieee" if k_cache.dtype == torch.float32 else "tf32",
    )
    return out


def decode_attention(
    q: torch.Tensor,  # [B, H, D] one query per sequence
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    context_lens: torch.Tensor,  # [B] int32, the query's own key included
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    batch = q.shape[0]
    rows = torch.arange(batch, dtype=torch.int32, device=q.device)
    ones = torch.ones(batch, dtype=torch.int32, device=q.device)
    return paged_attention(q, k_cache, v_cache, torch.empty_like(q), rows, ones, context_lens, block_tables,
                           1, scale, sliding_window)


def extend_attention(
    q: torch.Tensor,  # [total new tokens, H, D], sequence after sequence
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens: torch.Tensor,  # [n + 1] int32: sequence i's rows are cu_seqlens[i]:cu_seqlens[i + 1]
    block_tables: torch.Tensor,  # [n, max_blocks] int32
    context_lens: torch.Tensor,  # [n] int32: cached prefix plus new tokens
    max_q_len: int,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    q_start = cu_seqlens[:-1].contiguous()
    q_len = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int32)
    return paged_attention(q, k_cache, v_cache, torch.empty_like(q), q_start, q_len, context_lens, block_tables,
                           max_q_len, scale, sliding_window)
