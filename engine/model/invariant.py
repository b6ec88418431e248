"""The batch-invariant execution path behind the deterministic lane.

A row's result must not depend on what else is in the step, on how its prompt was
chunked, or on whether its prefix KV came from the cache. Matmul kernels pick their
blocking (and so their summation order) from the shapes they are given, so every
reduction here runs on fixed shapes:

- Row-wise work (norms, projections, the MLP, logits) runs on tiles of exactly
  ROW_TILE rows, zero-padded; a row's value then depends only on that row.
- Attention runs per sequence on query tiles of exactly QUERY_TILE positions against
  key chunks of exactly KEY_CHUNK positions. Scores are masked, the row maximum is
  taken over all chunks (max is exact in any order), then exp-weights and their sums
  are accumulated chunk by chunk in position order. Chunks past a row's own context
  contribute exact zeros, so a token's attention is the same whether it is computed in
  a whole prefill, a chunk of one, or a decode step.

The lane costs throughput (smaller matmuls, no fused attention kernel); see
docs/engine.md and bench/isolation_cost.py for the measured cost.
"""

from __future__ import annotations

from typing import Callable

import torch

ROW_TILE = 32
QUERY_TILE = 16
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


def sequence_attention(
    q: torch.Tensor,  # [n, H, D] the sequence's queries at positions [L - n, L)
    k: torch.Tensor,  # [L, Hkv, D] its whole context, oldest first
    v: torch.Tensor,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    n, num_heads, head_dim = q.shape
    context_len, num_kv_heads = k.shape[0], k.shape[1]
    group = num_heads // num_kv_heads
    first_pos = context_len - n
    key_pad = -context_len % KEY_CHUNK
    if key_pad:
        k = torch.cat([k, k.new_zeros(key_pad, num_kv_heads, head_dim)])
        v = torch.cat([v, v.new_zeros(key_pad, num_kv_heads, head_dim)])
    keys = k.permute(1, 2, 0)  # [Hkv, D, Lp]
    values = v.transpose(0, 1)  # [Hkv, Lp, D]
    chunk_pos = torch.arange(KEY_CHUNK, device=q.device)

    out = torch.empty_like(q)
    for t0 in range(0, n, QUERY_TILE):
        rows = min(QUERY_TILE, n - t0)
        tile = q[t0 : t0 + rows]
        positions = torch.arange(first_pos + t0, first_pos + t0 + rows, device=q.device)
        if rows < QUERY_TILE:  # pad with copies of the last query: valid rows, dropped below
            tile = torch.cat([tile, tile[-1:].expand(QUERY_TILE - rows, -1, -1)])
            positions = torch.cat([positions, positions[-1:].expand(QUERY_TILE - rows)])
        # [T, H, D] -> [Hkv, T * G, D]: the query heads that share a KV head side by side.
        qt = tile.view(QUERY_TILE, num_kv_heads, group, head_dim).permute(1, 0, 2, 3).reshape(num_kv_heads, -1, head_dim)
        q_pos = positions.repeat_interleave(group)[None, :, None]
        num_chunks = int(positions[-1]) // KEY_CHUNK + 1
        scores = []
        for c in range(num_chunks):
            s = torch.bmm(qt, keys[:, :, c * KEY_CHUNK : (c + 1) * KEY_CHUNK]) * scale
            k_pos = (c * KEY_CHUNK + chunk_pos)[None, None, :]
            visible = k_pos <= q_pos
            if sliding_window is not None:
                visible &= q_pos - k_pos < sliding_window
            scores.append(s.masked_fill(~visible, float("-inf")))
        row_max = torch.stack([s.amax(dim=-1) for s in scores]).amax(dim=0)[..., None]
        acc = torch.zeros(num_kv_heads, QUERY_TILE * group, head_dim, dtype=torch.float32, device=q.device)
        norm = torch.zeros(num_kv_heads, QUERY_TILE * group, dtype=torch.float32, device=q.device)
        for c, s in enumerate(scores):
            weights = torch.exp(s.float() - row_max.float())
            norm += weights.sum(dim=-1)
            acc += torch.bmm(weights, values[:, c * KEY_CHUNK : (c + 1) * KEY_CHUNK].float())
        o = (acc / norm[..., None]).to(q.dtype)
        o = o.view(num_kv_heads, QUERY_TILE, group, head_dim).permute(1, 0, 2, 3).reshape(QUERY_TILE, num_heads, head_dim)
        out[t0 : t0 + rows] = o[:rows]
    return out
