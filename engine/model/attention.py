"""Attention over the paged KV pool, in plain PyTorch ops.

Each layer first writes the step's new keys and values into their slots, then reads
every sequence's context back through its block table. Decodes (one query each) run as
one padded batch; prefill chunks run one sequence at a time, so a long prompt never
pads the decodes beside it. Steps that hold a deterministic request take the
fixed-shape variants in engine/model/invariant.py instead.

On CUDA the model runner fills AttentionMetadata.paged instead of the masks and padded
tables: a Triton kernel (engine/model/triton_attention.py) then reads each context in
place from the pool, with no gathered copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F

from engine.model import invariant


@dataclass
class ChunkKeys:
    """Rows [start, end) of a prefill chunk whose queries all see num_keys keys (invariant.key_length)."""

    start: int
    end: int
    num_keys: int
    mask: torch.Tensor  # invariant.tile_mask()


@dataclass
class DecodeKeys:
    """The decodes whose queries all see num_keys keys (invariant.key_length)."""

    rows: torch.Tensor  # [n] their rows of the step
    block_tables: torch.Tensor  # [n, blocks covering num_keys], padded with block 0
    num_keys: int
    mask: torch.Tensor  # invariant.tile_mask()


@dataclass
class PrefillSpan:
    start: int  # first row of this sequence in the step's flattened tokens
    end: int
    context_len: int
    block_table: torch.Tensor  # [blocks covering the context]
    mask: torch.Tensor | None  # [q_len, context_len] bool, None = plain causal from position 0
    key_groups: list[ChunkKeys] | None = None  # the invariant path's: the chunk by key length


@dataclass
class PagedLaunch:
    """One launch of the Triton kernel: each sequence's rows of the step, its context and block table."""

    q_start: torch.Tensor  # [n] int32, first row of each sequence in the step
    q_len: torch.Tensor  # [n] int32, its new tokens (0: a padded row of a CUDA graph, skipped)
    context_lens: torch.Tensor  # [n] int32, cached prefix plus new tokens
    block_tables: torch.Tensor  # [n, max_blocks] int32
    max_q_len: int
    sliding_window: int | None
    invariant: bool = False  # the deterministic lane: one tile shape for every launch


@dataclass
class AttentionMetadata:
    """Built once per step by the model runner and shared by every layer."""

    slot_mapping: torch.Tensor  # [num_tokens] where each new token's K/V goes
    decode_rows: torch.Tensor | None  # [num_decodes] rows of the decode tokens
    decode_block_tables: torch.Tensor | None  # [num_decodes, max_blocks], padded with block 0
    decode_mask: torch.Tensor | None  # [num_decodes, 1, 1, max_blocks * block_size] bool, True = attend
    prefills: list[PrefillSpan]
    # Set for steps that hold a deterministic request: every row goes through the
    # batch-invariant path (engine/model/invariant.py), row-wise work on calls of these sizes.
    row_sizes: tuple[int, ...] | None = None
    decode_groups: list[DecodeKeys] | None = None  # the invariant path's decodes, by key length
    # CUDA: the Triton kernel's launches (decodes, then prefill chunks); the fields above go unused.
    paged: list[PagedLaunch] | None = None


def build_mask(q_positions: torch.Tensor, k_positions: torch.Tensor, sliding_window: int | None) -> torch.Tensor:
    """Causal (and optionally sliding-window) mask: True where a query may see a key."""
    q = q_positions[:, None]
    k = k_positions[None, :]
    mask = k <= q
    if sliding_window is not None:
        mask &= q - k < sliding_window
    return mask


def paged_attention(
    q: torch.Tensor,  # [T, H, D]
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    cpu_kernels: bool = False,  # decodes through the CPU kernels' decode_attention (engine/model/kernels)
) -> torch.Tensor:
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    decodes_only = meta.decode_rows is not None and not meta.prefills and meta.row_sizes is None
    if cpu_kernels and decodes_only and meta.paged is None:
        # Every row is a decode: the step's K/V written and each row's context read in place, one op.
        return torch.ops.tenantgate_quant.decode_attention(
            q, k_cache, v_cache, meta.decode_block_tables, meta.decode_mask, scale, k, v, meta.slot_mapping)
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, meta.slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, meta.slot_mapping, v)
    enable_gqa = q.shape[1] != num_kv_heads

    if meta.paged is not None:
        from engine.model import triton_attention  # triton comes with CUDA builds of torch only

        out = torch.empty_like(q)
        for launch in meta.paged:
            triton_attention.paged_attention(
                q, k_cache, v_cache, out, launch.q_start, launch.q_len, launch.context_lens, launch.block_tables,
                launch.max_q_len, scale, launch.sliding_window, launch.invariant,
            )
        return out
    if meta.row_sizes is not None:
        out = torch.empty_like(q)
        _invariant_attention(q, k_cache, v_cache, meta, scale, out)
        return out
    decode = _decode_attention if not cpu_kernels else _kernel_decode_attention
    if decodes_only:  # every row is a decode, in order
        return decode(q, k_cache, v_cache, meta, scale)
    out = torch.empty_like(q)
    if meta.decode_rows is not None:
        out.index_copy_(0, meta.decode_rows, decode(q.index_select(0, meta.decode_rows), k_cache, v_cache, meta, scale))
    for span in meta.prefills:
        qp = q[span.start : span.end].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        kp = _gather(k_cache, span.block_table).view(-1, num_kv_heads, head_dim)
        vp = _gather(v_cache, span.block_table).view(-1, num_kv_heads, head_dim)
        kp = kp[: span.context_len].transpose(0, 1).unsqueeze(0)  # [1, Hkv, L, D]
        vp = vp[: span.context_len]
        vp = vp.transpose(0, 1).unsqueeze(0)
        op = _sdpa(qp, kp, vp, attn_mask=span.mask, is_causal=span.mask is None, scale=scale, enable_gqa=enable_gqa)
        out[span.start : span.end] = op.squeeze(0).transpose(0, 1)
    return out


def _decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                      scale: float) -> torch.Tensor:
    """One query per sequence (q: [B, H, D]) over its blocks, masked past its length."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    tables = cast(torch.Tensor, meta.decode_block_tables)  # set with decode_rows
    num_seqs = tables.shape[0]
    # Gathering whole blocks (contiguous block_size x heads x dim runs) is several times
    # faster than gathering single slots.
    kd = _gather(k_cache, tables).view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)
    vd = _gather(v_cache, tables).view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)
    # In the serving dtype, not _sdpa's float32: with one query per sequence PyTorch's bfloat16
    # kernel is the faster one (docs/engine.md, "Paged KV cache").
    out = F.scaled_dot_product_attention(q.unsqueeze(2), kd, vd, attn_mask=meta.decode_mask, scale=scale,
                                         enable_gqa=q.shape[1] != num_kv_heads)
    return out.squeeze(2)


def _kernel_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                             scale: float) -> torch.Tensor:
    """_decode_attention by the CPU kernels (each row's result the same as in an all-decode step)."""
    return torch.ops.tenantgate_quant.decode_attention(q, k_cache, v_cache, meta.decode_block_tables, meta.decode_mask,
                                                       scale, None, None, None)


def _invariant_attention(q, k_cache, v_cache, meta: AttentionMetadata, scale: float, out: torch.Tensor) -> None:
    """Each query over exactly invariant.key_length(position) keys, one call per key length."""
    kv_shape = k_cache.shape[2:]
    for group in meta.decode_groups or ():
        n = group.block_tables.shape[0]
        kd = _gather(k_cache, group.block_tables).view(n, -1, *kv_shape)[:, : group.num_keys]
        vd = _gather(v_cache, group.block_tables).view(n, -1, *kv_shape)[:, : group.num_keys]
        od = invariant.attention(q.index_select(0, group.rows), kd, vd, group.mask, scale)
        out.index_copy_(0, group.rows, od)
    for span in meta.prefills:
        kp = _gather(k_cache, span.block_table).view(1, -1, *kv_shape)
        vp = _gather(v_cache, span.block_table).view(1, -1, *kv_shape)
        for chunk in span.key_groups:  # type: ignore[union-attr]  # invariant mode: spans have key groups
            out[chunk.start : chunk.end] = invariant.attention(
                q[chunk.start : chunk.end], kp[:, : chunk.num_keys], vp[:, : chunk.num_keys], chunk.mask, scale
            )


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """scaled_dot_product_attention of a prefill chunk, computed in float32 on CPU whatever the serving dtype.

    PyTorch's CPU kernel is slower in bfloat16 than in float32 over many queries (it converts
    block by block): upcasting first cuts a 256-token prefill's attention by a third at one thread
    (1.5 ms against 2.3; 1,024 tokens 25 ms against 38). The gathered K/V are copies already, so
    the upcast (which also makes them contiguous) costs about what the kernel's strided reads did.
    Decodes (one query each) are the other way round and skip it (_decode_attention).
    """
    if q.device.type != "cpu" or q.dtype == torch.float32:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    fp32: dict[str, Any] = dict(dtype=torch.float32, memory_format=torch.contiguous_format)
    return F.scaled_dot_product_attention(q.to(**fp32), k.to(**fp32), v.to(**fp32), **kwargs).to(q.dtype)


def _gather(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    # index_select over rows of a 2-D view is a plain row copy; over the 4-D cache it walks
    # every element (six times slower, measured).
    rows = cache.view(cache.shape[0], -1).index_select(0, block_ids.reshape(-1))
    return rows.view(-1, *cache.shape[1:])
