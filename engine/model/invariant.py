"""The batch-invariant execution path behind the deterministic lane.

A row's result must not depend on what else is in the step, on how its prompt was
chunked, or on whether its prefix KV came from the cache. Matmul kernels pick their
blocking (and so their summation order) from the shapes they are given, so every
reduction here runs on fixed shapes:

- Row-wise work (norms, projections, the MLP, logits) runs on tiles of exactly
  ROW_TILE rows, zero-padded; a row's value then depends only on that row.
- Attention runs on query tiles of exactly QUERY_TILE positions (a decode is a tile of
  one real query and padding) against key chunks of exactly KEY_CHUNK positions, as
  one batched matmul per step for all decodes and per sequence for prefill chunks.
  Scores are masked, the row maximum is taken over all chunks (max is exact in any
  order), then exp-weights and their sums are accumulated chunk by chunk in position
  order. Chunks past a row's own context contribute exact zeros, so a token's attention
  is the same whether it is computed in a whole prefill, a chunk of one, or a decode.
  Batched matmuls compute each fixed-shape product the same way whatever the batch
  around it (measured, and proven end to end by tests/engine/test_deterministic.py).

The lane costs throughput (smaller matmuls, no fused attention kernel); see
docs/engine.md and bench/isolation_cost.py for the measured cost.
"""

from __future__ import annotations

from typing import Callable

import torch

ROW_TILE = 64
QUERY_TILE = 4
KEY_CHUNK = 256


def apply_rows(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, tile: int | None) -> torch.Tensor:
    """fn(x), computed on fixed tiles of `tile` rows when tile is set."""
    if tile is None:
        return fn(x)
    n = x.shape[0]
    pad = -n % tile
    if pad:
        x = torch.cat([x, x.new_zeros(pad, *x.shape[1:])])
    return torch.cat([fn(chunk) for chunk in x.split(tile)])[:n]


def tile_queries(q: torch.Tensor, first_pos: int, num_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, H, D] queries at positions first_pos.. -> ([tiles, Hkv, QUERY_TILE * G, D], positions per row).

    The last tile is padded with copies of the last query (valid rows, dropped later).
    """
    n, num_heads, head_dim = q.shape
    group = num_heads // num_kv_heads
    positions = torch.arange(first_pos, first_pos + n, device=q.device)
    pad = -n % QUERY_TILE
    if pad:
        q = torch.cat([q, q[-1:].expand(pad, -1, -1)])
        positions = torch.cat([positions, positions[-1:].expand(pad)])
    tiles = q.view(-1, QUERY_TILE, num_kv_heads, group, head_dim).permute(0, 2, 1, 3, 4)
    return tiles.reshape(-1, num_kv_heads, QUERY_TILE * group, head_dim), positions.view(-1, QUERY_TILE).repeat_interleave(group, dim=1)


def untile(out: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[tiles, Hkv, QUERY_TILE * G, D] -> [tiles * QUERY_TILE, H, D]."""
    tiles, num_kv_heads, _, head_dim = out.shape
    out = out.view(tiles, num_kv_heads, QUERY_TILE, num_heads // num_kv_heads, head_dim).permute(0, 2, 1, 3, 4)
    return out.reshape(tiles * QUERY_TILE, num_heads, head_dim)


def chunk_keys(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., L, Hkv, D] -> keys [..., chunks, Hkv, D, KEY_CHUNK] and values [..., chunks, Hkv, KEY_CHUNK, D].

    Keys past a row's position are masked, so callers may pass garbage there (whole
    blocks gathered past the context) instead of paying for a padded copy.
    """
    length = k.shape[-3]
    pad = -length % KEY_CHUNK
    if pad:
        shape = (*k.shape[:-3], pad, *k.shape[-2:])
        k = torch.cat([k, k.new_zeros(shape)], dim=-3)
        v = torch.cat([v, v.new_zeros(shape)], dim=-3)
    shape = (*k.shape[:-3], -1, KEY_CHUNK, *k.shape[-2:])
    k, v = k.reshape(shape), v.reshape(shape)  # [..., chunks, C, Hkv, D]
    return k.movedim(-3, -1), v.movedim(-3, -2)


def attend_tiles(
    q_tiles: torch.Tensor,  # [N, Hkv, TG, D]
    q_pos: torch.Tensor,  # [N, TG] position of each query row
    keys: torch.Tensor,  # [N or 1, chunks, Hkv, D, C]
    values: torch.Tensor,  # [N or 1, chunks, Hkv, C, D]
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """Attention of fixed-shape query tiles over fixed-shape key chunks; [N, Hkv, TG, D]."""
    num_chunks = keys.shape[1]
    # Every (tile, chunk, head) product is one fixed-shape matmul; bmm computes each the
    # same way whatever the batch around it (checked by tests/engine/test_deterministic.py).
    scores = torch.matmul(q_tiles[:, None] * scale, keys)  # [N, chunks, Hkv, TG, C]
    k_pos = torch.arange(num_chunks * KEY_CHUNK, device=q_tiles.device).view(1, num_chunks, 1, 1, KEY_CHUNK)
    rows = q_pos[:, None, None, :, None]
    visible = k_pos <= rows
    if sliding_window is not None:
        visible &= rows - k_pos < sliding_window
    scores = scores.float().masked_fill(~visible, float("-inf"))
    weights = torch.exp(scores - scores.amax(dim=(1, 4), keepdim=True))
    sums = weights.sum(dim=-1)  # [N, chunks, Hkv, TG], each over exactly C keys
    partial = torch.matmul(weights, values.float())  # [N, chunks, Hkv, TG, D]
    # Accumulate chunk by chunk in position order; chunks past a row's context add zeros.
    norm, acc = sums[:, 0], partial[:, 0]
    for c in range(1, num_chunks):
        norm = norm + sums[:, c]
        acc = acc + partial[:, c]
    return (acc / norm[..., None]).to(q_tiles.dtype)


def sequence_attention(
    q: torch.Tensor,  # [n, H, D] one sequence's queries at positions [L - n, L)
    k: torch.Tensor,  # [>= L, Hkv, D] its context, oldest first (anything past L is ignored)
    v: torch.Tensor,
    context_len: int,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    n, num_heads = q.shape[0], q.shape[1]
    tiles, q_pos = tile_queries(q, context_len - n, k.shape[1])
    keys, values = chunk_keys(k, v)
    out = attend_tiles(tiles, q_pos, keys[None], values[None], scale, sliding_window)
    return untile(out, num_heads)[:n]


def decode_attention(
    q: torch.Tensor,  # [B, H, D] one query per sequence, at position lengths[i] - 1
    k: torch.Tensor,  # [B, L, Hkv, D] each sequence's context, padded to a common length
    v: torch.Tensor,
    lengths: torch.Tensor,  # [B]
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[2]
    group = num_heads // num_kv_heads
    # Each decode is a tile of one real query and QUERY_TILE - 1 copies: the same shapes
    # as a prefill tile, so a token's attention does not depend on how it was scheduled.
    tiles = q[:, None].expand(num_seqs, QUERY_TILE, num_heads, head_dim)
    tiles = tiles.reshape(num_seqs, QUERY_TILE, num_kv_heads, group, head_dim).permute(0, 2, 1, 3, 4)
    tiles = tiles.reshape(num_seqs, num_kv_heads, QUERY_TILE * group, head_dim)
    q_pos = (lengths - 1)[:, None].expand(num_seqs, QUERY_TILE * group)
    keys, values = chunk_keys(k, v)
    out = attend_tiles(tiles, q_pos, keys, values, scale, sliding_window)
    return untile(out, num_heads).view(num_seqs, QUERY_TILE, num_heads, head_dim)[:, 0]
