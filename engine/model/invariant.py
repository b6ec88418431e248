"""The batch-invariant execution path behind the deterministic lane.

A row's result must not depend on what else is in the step, on how its prompt was
chunked, or on whether its prefix KV came from the cache. Kernels pick their blocking
(and so their summation order) from the shapes they are given, so every reduction here
runs on fixed shapes:

- Row-wise work (norms, projections, the MLP, logits) runs on tiles of exactly
  ROW_TILE rows, zero-padded; a row's value then depends only on that row.
- Attention runs on tiles of exactly QUERY_TILE query positions (a decode is a tile of
  one real query and copies of it) against keys padded to a multiple of KEY_PAD with
  the padding masked. PyTorch's CPU attention kernel splits keys into blocks of 512 once
  there are at least 512, and runs its online softmax block by block in order; blocks
  past a row's context are fully masked and leave its result untouched (the running max
  does not move, the rescale factor is exactly 1, the added weights are exactly 0). With
  the query tile fixed too, a token gets the same attention in a whole prefill, a chunk
  of one, or a decode step, alone or beside any batch.

These are measured properties of the kernels this engine runs (CPU, MKL, PyTorch
2.13), proven end to end by tests/engine/test_deterministic.py: 50 random requests
under random load, torch.equal on every logit. A new backend must pass that test before
its deterministic lane can be trusted.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

ROW_TILE = 64
QUERY_TILE = 4
KEY_PAD = 512


def apply_rows(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, tile: int | None) -> torch.Tensor:
    """fn(x), computed on fixed tiles of `tile` rows when tile is set."""
    if tile is None:
        return fn(x)
    n = x.shape[0]
    pad = -n % tile
    if pad:
        x = torch.cat([x, x.new_zeros(pad, *x.shape[1:])])
    return torch.cat([fn(chunk) for chunk in x.split(tile)])[:n]


def _pad_keys(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad dim -3 (positions) of [..., L, Hkv, D] to a multiple of KEY_PAD (callers usually gather whole chunks)."""
    pad = -k.shape[-3] % KEY_PAD
    if pad:
        shape = (*k.shape[:-3], pad, *k.shape[-2:])
        k = torch.cat([k, k.new_zeros(shape)], dim=-3)
        v = torch.cat([v, v.new_zeros(shape)], dim=-3)
    return k, v


def _attend(q: torch.Tensor, q_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int | None):
    """q [N, H, QUERY_TILE, D] at positions q_pos [N, QUERY_TILE]; k, v [N, Hkv, Lp, D]."""
    k_pos = torch.arange(k.shape[2], device=q.device)[None, None, :]
    rows = q_pos[:, :, None]
    visible = k_pos <= rows
    if window is not None:
        visible &= rows - k_pos < window
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=visible[:, None], scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )


def sequence_attention(
    q: torch.Tensor,  # [n, H, D] one sequence's queries at positions [L - n, L)
    k: torch.Tensor,  # [>= L, Hkv, D] its context, oldest first (anything past L is masked)
    v: torch.Tensor,
    context_len: int,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    n, num_heads, head_dim = q.shape
    positions = torch.arange(context_len - n, context_len, device=q.device)
    pad = -n % QUERY_TILE
    if pad:  # pad with copies of the last query: valid rows, dropped below
        q = torch.cat([q, q[-1:].expand(pad, -1, -1)])
        positions = torch.cat([positions, positions[-1:].expand(pad)])
    tiles = q.view(-1, QUERY_TILE, num_heads, head_dim).transpose(1, 2)  # [t, H, T, D]
    k, v = _pad_keys(k, v)
    num_tiles = tiles.shape[0]
    k = k.transpose(0, 1)[None].expand(num_tiles, -1, -1, -1)
    v = v.transpose(0, 1)[None].expand(num_tiles, -1, -1, -1)
    out = _attend(tiles, positions.view(num_tiles, QUERY_TILE), k, v, scale, sliding_window)
    return out.transpose(1, 2).reshape(-1, num_heads, head_dim)[:n]


def decode_attention(
    q: torch.Tensor,  # [B, H, D] one query per sequence, at position lengths[i] - 1
    k: torch.Tensor,  # [B, L, Hkv, D] each sequence's context, padded to a common length
    v: torch.Tensor,
    lengths: torch.Tensor,  # [B]
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    num_seqs, num_heads, head_dim = q.shape
    # A decode is a tile of one real query and copies: the shape of a prefill tile.
    tiles = q[:, :, None].expand(num_seqs, num_heads, QUERY_TILE, head_dim).contiguous()
    q_pos = (lengths - 1)[:, None].expand(num_seqs, QUERY_TILE)
    k, v = _pad_keys(k, v)
    out = _attend(tiles, q_pos, k.transpose(1, 2), v.transpose(1, 2), scale, sliding_window)
    return out[:, :, 0]
