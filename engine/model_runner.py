"""The only module that touches torch devices: weights, the KV pool, one forward per step."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from pathlib import Path

import torch

from engine.config import ConfigError, EngineConfig, ModelConfig
from engine.model.attention import AttentionMetadata, ChunkKeys, DecodeKeys, PrefillSpan, build_mask
from engine.model.llama import LlamaForCausalLM
from engine.model.invariant import KEY_UNIT, ROW_SIZES, ROW_TILE, key_length, rows_are_invariant, tile_mask
from engine.model.loader import load_weights
from engine.grammar import Grammars
from engine.sampler import SampleResult, Sampler
from engine.scheduler import ScheduledBatch

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' requested but no CUDA device is available")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    # bfloat16 matmuls are 3-3.6x faster than float32 where the CPU has bf16 instructions,
    # and emulated (two orders of magnitude slower) where it has not.
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


# The CPU flags (x86: /proc/cpuinfo "flags"; Arm: "Features") that mean bf16 dot products in hardware.
_BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


@functools.cache
def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU reports bf16 instructions; False where it does not say (macOS, no /proc)."""
    try:
        text = Path(cpuinfo).read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return not _BF16_CPU_FLAGS.isdisjoint(value.split())
    return False


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_cpu_memory_mapped() -> bool:
    """Stop glibc from handing large freed buffers back to the kernel after every op.

    Each step allocates and frees activation and KV-gather buffers of megabytes. By
    default glibc serves those with fresh mmaps (or trims them off the heap), so every
    step page-faults them in again: in a VM that made the KV gather ten times slower
    than the copy itself. Keeping them in the heap is what jemalloc/tcmalloc would do.
    """
    path = ctypes.util.find_library("c")
    if path is None:
        return False
    try:
        libc = ctypes.CDLL(path)
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20) == 1
        return libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1 and ok
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False


def kv_bytes_per_block(model_config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    per_token = 2 * model_config.num_hidden_layers * model_config.num_key_value_heads * model_config.head_dim
    return per_token * block_size * torch.empty((), dtype=dtype).element_size()


class ModelRunner:
    def __init__(
        self,
        model_config: ModelConfig,
        config: EngineConfig,
        model_path: Path,
        max_model_len: int,
        num_blocks: int,
        progress: bool = False,
        grammars: Grammars | None = None,
    ) -> None:
        self.grammars = grammars  # fills the grammar masks of structured outputs; None: none are asked for
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        if self.device.type == "cpu" and not keep_cpu_memory_mapped():
            logger.info("could not tune the C allocator; CPU steps may page-fault their buffers")
        self.block_size = config.block_size
        self.sliding_window = model_config.sliding_window
        self._group = model_config.num_attention_heads // model_config.num_key_value_heads
        self._max_num_seqs = config.max_num_seqs
        self._row_sizes: tuple[int, ...] | None = None  # of the invariant path, chosen at its first step
        self._logit_row_sizes: tuple[int, ...] | None = None
        prev_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                self.model = LlamaForCausalLM(model_config, max_positions=max_model_len)
        finally:
            torch.set_default_dtype(prev_dtype)
        self.model.eval()
        load_weights(self.model, model_path, progress=progress)
        shape = (num_blocks, config.block_size, model_config.num_key_value_heads, model_config.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=self.dtype, device=self.device), torch.zeros(shape, dtype=self.dtype, device=self.device))
            for _ in range(model_config.num_hidden_layers)
        ]
        self.sampler = Sampler(config.seed)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> list[SampleResult | None]:
        """Run one step; returns, per scheduled sequence, its new token or None (mid-prefill)."""
        input_ids, positions, meta, sample_rows, sampling = self._prepare(batch)
        seqs = [batch.seqs[i] for i in sampling]
        constrained = [i for i, s in enumerate(seqs) if s.grammar is not None]
        # The grammar masks are filled on llguidance's threads while the model runs (it releases the GIL).
        pending = self.grammars.bitmask_async([seqs[i].grammar for i in constrained]) if constrained else None
        hidden = self.model(input_ids, positions, meta, self.kv_caches)
        results: list[SampleResult | None] = [None] * len(batch.seqs)
        if sample_rows:
            rows = hidden[torch.tensor(sample_rows, device=self.device)]
            logits = self.model.compute_logits(rows, self._logit_row_sizes if meta.row_sizes else None)
            outputs = [s.output_token_ids if s.params.penalized else [] for s in seqs]
            masks = (constrained, pending.result()) if pending is not None else None
            samples = self.sampler.sample(logits, [s.request_id for s in seqs], [s.params for s in seqs], outputs, masks)
            for i, sample in zip(sampling, samples):
                results[i] = sample
        return results

    def invariant_row_sizes(self) -> tuple[int, ...]:
        """The row counts the invariant path calls row-wise work with: ROW_SIZES if this model's kernels
        give a row the same bits in all of them, else the fixed ROW_TILE, which needs no such check."""
        if self._row_sizes is None:
            # Logits are taken for at most one row per sequence: check the lm_head (the widest
            # matmul) only up to the first size that holds max_num_seqs rows.
            logit_sizes = ROW_SIZES[: next((i + 1 for i, s in enumerate(ROW_SIZES) if s >= self._max_num_seqs), None)]
            hidden = self.model.config.hidden_size
            with torch.inference_mode():
                ok = rows_are_invariant(self.model.row_functions(), ROW_SIZES, self.dtype, self.device)
                ok = ok and rows_are_invariant([(self.model.lm_head, hidden)], logit_sizes, self.dtype, self.device)
            if not ok:
                logger.warning("row-wise kernels are not invariant across call sizes here; "
                               "the deterministic lane falls back to %d-row tiles", ROW_TILE)
            self._row_sizes = ROW_SIZES if ok else (ROW_TILE,)
            self._logit_row_sizes = logit_sizes if ok else (ROW_TILE,)
        return self._row_sizes

    def release(self, request_id: str) -> None:
        self.sampler.release(request_id)

    def _prepare(self, batch: ScheduledBatch):
        bs, dev = self.block_size, self.device
        invariant = batch.deterministic  # the fixed-shape path of model/invariant.py
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        decode_rows: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillSpan] = []
        sample_rows: list[int] = []
        sampling: list[int] = []
        for i, (seq, num_new) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + num_new
            row = len(input_ids)
            table = seq.block_table
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            if num_new == 1:
                decode_rows.append(row)
                decode_tables.append(table)
                decode_lens.append(end)
            else:
                mask = None
                # (the invariant path builds its own masks)
                if not invariant and (start > 0 or (self.sliding_window is not None and end > self.sliding_window)):
                    mask = build_mask(torch.arange(start, end), torch.arange(end), self.sliding_window).to(dev)
                blocks = table[: -(-end // bs)]
                key_groups = None
                if invariant:  # blocks for the longest key length (the extra ones are masked)
                    blocks = blocks + [0] * (-(-key_length(end - 1) // bs) - len(blocks))
                    key_groups = self._chunk_keys(row, start, end)
                blocks = torch.tensor(blocks, device=dev)
                prefills.append(PrefillSpan(row, row + num_new, end, blocks, mask, key_groups))
            if end == seq.num_tokens:
                sample_rows.append(row + num_new - 1)
                sampling.append(i)

        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, device=dev),
            decode_rows=None,
            decode_block_tables=None,
            decode_mask=None,
            prefills=prefills,
            row_sizes=self.invariant_row_sizes() if invariant else None,
        )
        if decode_rows and invariant:
            meta.decode_groups = self._decode_keys(decode_rows, decode_tables, decode_lens)
        elif decode_rows:
            max_blocks = max(-(-n // bs) for n in decode_lens)
            tables = torch.zeros(len(decode_rows), max_blocks, dtype=torch.long)
            for j, (table, n) in enumerate(zip(decode_tables, decode_lens)):
                used = -(-n // bs)
                tables[j, :used] = torch.tensor(table[:used])
            lengths = torch.tensor(decode_lens)
            key_pos = torch.arange(max_blocks * bs)[None, :]
            mask = key_pos < lengths[:, None]
            if self.sliding_window is not None:
                mask &= (lengths[:, None] - 1) - key_pos < self.sliding_window
            meta.decode_rows = torch.tensor(decode_rows, device=dev)
            meta.decode_block_tables = tables.to(dev)
            meta.decode_mask = mask[:, None, None, :].to(dev)
        return (
            torch.tensor(input_ids, device=dev),
            torch.tensor(positions, device=dev),
            meta,
            sample_rows,
            sampling,
        )

    def _tile_mask(self, positions: list[int] | range, num_keys: int) -> torch.Tensor:
        return tile_mask(torch.tensor(positions), self._group, num_keys, self.sliding_window, self.dtype).to(self.device)

    def _chunk_keys(self, row: int, start: int, end: int) -> list[ChunkKeys]:
        """The chunk of positions [start, end) at step rows from `row`, split where the key length changes."""
        groups = []
        first = start
        while first < end:
            num_keys = key_length(first)
            last = min(end, num_keys)
            mask = self._tile_mask(range(first, last), num_keys)
            groups.append(ChunkKeys(row + first - start, row + last - start, num_keys, mask))
            first = last
        return groups

    def _decode_keys(self, rows: list[int], tables: list[list[int]], lengths: list[int]) -> list[DecodeKeys]:
        """The decodes grouped by the key length of their position."""
        by_keys: dict[int, list[int]] = {}
        for j, n in enumerate(lengths):
            by_keys.setdefault(key_length(n - 1), []).append(j)
        groups = []
        for num_keys, members in sorted(by_keys.items()):
            num_blocks = -(-num_keys // self.block_size)
            block_tables = torch.zeros(len(members), num_blocks, dtype=torch.long)
            for i, j in enumerate(members):
                used = -(-lengths[j] // self.block_size)
                block_tables[i, :used] = torch.tensor(tables[j][:used])
            groups.append(DecodeKeys(
                torch.tensor([rows[j] for j in members], device=self.device),
                block_tables.to(self.device),
                num_keys,
                self._tile_mask([lengths[j] - 1 for j in members], num_keys),
            ))
        return groups
