"""The batch-invariant execution path behind the deterministic lane.

A row's result must not depend on what else is in the step, on how its prompt was
chunked, or on whether its prefix KV came from the cache. Kernels pick their blocking
(and so their summation order) from the shapes they are given, so every reduction here
runs on a few known shapes:

- Row-wise work (norms, projections, the MLP, logits) runs on calls of exactly one of
  ROW_SIZES rows, zero-padded; inputs longer than the largest are split into calls of
  that size. Within a call a row's value depends only on that row; that it is also the
  same in a call of any other size is checked once per model when the lane is first
  used (rows_are_invariant: every row position of every size against fixed ROW_TILE
  tiles). If the check fails, every call uses tiles of exactly ROW_TILE rows, which
  needs no such assumption.
- Attention runs on tiles of exactly QUERY_TILE query rows, each tile one token's query
  heads that share a KV head (grouped-query attention; copies of the last head fill a
  tile the group leaves short), against exactly key_length(position) keys: the context
  rounded up to a multiple of KEY_UNIT, the rest masked. Every shape the kernel sees is
  then a function of the token's position alone, so its blocking (PyTorch's CPU kernel
  splits keys into blocks of up to 512 and runs its online softmax block by block) and
  its summation order are too: a token gets the same attention in a whole prefill, a
  chunk of one, or a decode step, alone or beside any batch. Queries with the same key
  length run in one call.

These are measured properties of the kernels this engine runs (CPU, MKL, PyTorch
2.13), proven end to end by tests/engine/test_deterministic.py: 50 random requests
under random load, torch.equal on every logit. A new backend must pass that test before
its deterministic lane can be trusted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F

ROW_TILE = 64
ROW_SIZES = (8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)
QUERY_TILE = 4
KEY_UNIT = 64

RowFn = Callable[[torch.Tensor], torch.Tensor]

# Set while row-wise work runs for this path (apply_rows with sizes, rows_are_invariant): kernels
# that have a faster path for some call sizes (engine/model/quant.py's AMX product) keep the one
# this path was checked on, so the lane's bits stay what they were.
_in_lane: ContextVar[bool] = ContextVar("tenantgate_invariant_lane", default=False)


def in_lane() -> bool:
    return _in_lane.get()


@contextmanager
def lane() -> Iterator[None]:
    token = _in_lane.set(True)
    try:
        yield
    finally:
        _in_lane.reset(token)


def apply_rows(fn: RowFn, x: torch.Tensor, sizes: tuple[int, ...] | None) -> torch.Tensor:
    """fn(x), computed on calls of exactly one of `sizes` rows (ascending) when sizes is set."""
    if sizes is None:
        return fn(x)
    n, largest = x.shape[0], sizes[-1]
    outs = []
    with lane():
        for start in range(0, n, largest):
            chunk = x[start : start + largest]
            rows = chunk.shape[0]
            size = next(s for s in sizes if s >= rows)
            if size > rows:
                chunk = torch.cat([chunk, chunk.new_zeros(size - rows, *chunk.shape[1:])])
            outs.append(fn(chunk)[:rows])
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def rows_are_invariant(fns: Iterable[tuple[RowFn, int]], sizes: tuple[int, ...], dtype: torch.dtype, device) -> bool:
    """Whether each (fn, width) gives a row the same bits at any position of a call of any of `sizes` rows.

    Every position of every size is compared with the same row in ROW_TILE tiles.
    Kernels choose their summation order from shapes and positions, not from values, so
    one random row per (size, position) exposes a size or position that differs.
    """
    generator = torch.Generator().manual_seed(0)
    with lane():
        for fn, width in fns:
            x = torch.randn(sizes[-1], width, generator=generator).to(device=device, dtype=dtype)
            reference = apply_rows(fn, x, (ROW_TILE,))
            for size in sizes:
                if not torch.equal(fn(x[:size]), reference[:size]):
                    return False
    return True


def key_length(position: int) -> int:
    """How many keys a query at `position` attends over (the keys past it are masked)."""
    return (position // KEY_UNIT + 1) * KEY_UNIT


def tile_mask(
    positions: torch.Tensor,  # [n] the positions of n queries that all see key_length() keys
    group: int,  # query heads per KV head
    num_keys: int,
    sliding_window: int | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The additive mask [n * tiles per token, 1, 1, num_keys] of attention()'s query tiles."""
    rows = positions.repeat_interleave(-(-group // QUERY_TILE))[:, None]
    keys = torch.arange(num_keys, device=positions.device)
    visible = keys <= rows
    if sliding_window is not None:
        visible &= rows - keys < sliding_window
    mask = torch.zeros(visible.shape, dtype=dtype, device=positions.device)
    return mask.masked_fill_(~visible, float("-inf"))[:, None, None]


def attention(
    q: torch.Tensor,  # [n, H, D] n queries
    k: torch.Tensor,  # [1 or n, key_length, Hkv, D] their context (one shared, or one each), oldest first
    v: torch.Tensor,
    mask: torch.Tensor,  # tile_mask() of the queries' positions
    scale: float,
) -> torch.Tensor:
    n, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[2]
    group = num_heads // num_kv_heads
    # A token's tiles hold its query heads, a KV head's group per tile row block; copies
    # of its last head pad the group to whole tiles and are dropped below.
    rows = q.view(n, num_kv_heads, group, head_dim)
    pad = -group % QUERY_TILE
    if pad:
        rows = torch.cat([rows, rows[:, :, -1:].expand(-1, -1, pad, -1)], dim=2)
    per_token = rows.shape[2] // QUERY_TILE
    tiles = rows.view(n, num_kv_heads, per_token, QUERY_TILE, head_dim).transpose(1, 2)
    tiles = tiles.reshape(n * per_token, num_kv_heads, QUERY_TILE, head_dim)
    k, v = k.transpose(1, 2), v.transpose(1, 2)
    if k.shape[0] == 1:
        k, v = k.expand(n * per_token, -1, -1, -1), v.expand(n * per_token, -1, -1, -1)
    elif per_token > 1:
        k, v = k.repeat_interleave(per_token, dim=0), v.repeat_interleave(per_token, dim=0)
    out = F.scaled_dot_product_attention(tiles, k, v, attn_mask=mask, scale=scale)
    out = out.view(n, per_token, num_kv_heads, QUERY_TILE, head_dim).transpose(1, 2)
    return out.reshape(n, num_kv_heads, -1, head_dim)[:, :, :group].reshape(n, num_heads, head_dim)
