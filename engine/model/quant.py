"""GGUF-quantized weights kept quantized: the packed layout, its conversion, and the layers that use it.

Every GGUF type the converter knows dequantizes to `scale * (code - offset) + min` with one
scale and one min per block of 16 or 32 elements (the K-quants' super-block scales folded in,
as the gguf package folds them). `pack()` rewrites a tensor's blocks into that form, the form
engine/model/kernels/qmatmul.cpp reads: codes of up to 4 bits two to a byte, wider codes a byte
each, fp32 scales and mins, each row padded to a multiple of 64 elements. The conversion writes
packed tensors beside the dequantized checkpoint (`quantized.safetensors`), and the model runner
swaps the decoder's linear layers and embedding for the ones below.

A packed weight dequantizes to exactly the values of the dequantized checkpoint (the kernels
multiply and add in the gguf package's order, without fused multiply-adds), so a product with it
differs from the dequantized path only in the order of its fp32 sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from engine.model import invariant

QUANTIZED_FILE = "quantized.safetensors"
BF16_ISA = 3  # engine/model/kernels ISA_NAMES: avx512-bf16
# Types packed for the kernels; F32/F16/BF16 tensors stay dense.
PACKED_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
RUN = 64  # rows are padded to whole runs of 64 elements
# bfloat16 calls (where the CPU has AVX512-BF16) of at least BF16_MIN_ROWS rows dequantize a chunk
# of weight rows to bfloat16 once, into a buffer that stays in cache, and run bf16 dot products over
# every activation row in register tiles; from DENSE_MIN_ROWS rows on, the whole weight is
# dequantized to bfloat16 and torch's dense matmul (oneDNN) runs, faster there; fewer rows run in
# fp32, reading the codes directly (measured in docs/engine.md). Each path is row-local, but the
# tiled and dense paths sum in different orders: the deterministic lane calls only sizes of at
# least DENSE_MIN_ROWS (engine/model_runner.py, invariant_row_sizes).
BF16_MIN_ROWS = 5
DENSE_MIN_ROWS = 32
# Where the CPU also has AMX-BF16 (and the kernel lets this process use it), bfloat16 calls of
# DENSE_MIN_ROWS up to AMX_MAX_ROWS rows (a concurrency-32 decode step) take qlinear_amx instead: a
# chunk of weight rows dequantized to bf16 into a buffer that stays in cache and multiplied with
# AMX tiles, so the whole weight is never written out. Wider calls (prefill) read the dequantized
# weight faster through oneDNN (docs/engine.md, "Quantized weights"). The deterministic lane keeps
# the dense path at every size it was checked on (invariant.in_lane).
AMX_ISA = 4  # engine/model/kernels ISA_NAMES: avx512-bf16-amx
AMX_MAX_ROWS = 64
AMX_CHUNK_ROWS = 64
# fp32 calls (every CPU without AVX512-BF16) of at least TILED_MIN_ROWS rows, where the CPU has AVX2,
# take the fp32 analogue of the tiled kernel: a chunk of weight rows dequantized to fp32 once, then
# fp32 dot products over every activation row. Fewer rows read the codes directly, once per row,
# which wins only while there are few rows (docs/engine.md, "Quantized weights"). The smallest of
# the deterministic lane's call sizes (invariant.ROW_SIZES) is 8: all of them take the tiled path.
AVX2_ISA = 1  # engine/model/kernels ISA_NAMES: avx2
TILED_MIN_ROWS = 8
# Weight rows per work item that torch's threads take from a shared counter.
CHUNK_ROWS = 16
_CAST_DTYPES = (torch.float32, torch.bfloat16)  # what qlinear_cast takes


@dataclass(frozen=True)
class Format:
    bits: int  # 4 (two codes a byte) or 8
    block: int  # elements per scale and min: 16 or 32
    offset: int  # subtracted from the GGUF code; non-zero: a signed format, stored as code - offset, no mins


@dataclass
class PackedWeight:
    """A [rows, cols] weight: codes [rows, padded_cols * bits / 8] uint8, scales and mins
    [rows, padded_cols / block]."""

    codes: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor
    cols: int
    format: Format

    @property
    def rows(self) -> int:
        return self.codes.shape[0]

    def select_rows(self, index: torch.Tensor | slice) -> PackedWeight:
        return PackedWeight(self.codes[index], self.scales[index], self.mins[index], self.cols, self.format)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.mins))

    @staticmethod
    def cat(parts: list[PackedWeight]) -> PackedWeight:
        first = parts[0]
        return PackedWeight(_join_rows([p.codes for p in parts]), _join_rows([p.scales for p in parts]),
                            _join_rows([p.mins for p in parts]), first.cols, first.format)


def _join_rows(tensors: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat of rows; a view instead of a copy where the tensors are adjacent rows of one storage
    (a fused projection the converter stored as one tensor: its pages stay the mapped file's)."""
    first = tensors[0]
    end = first.data_ptr()
    for t in tensors:
        if (not t.is_contiguous() or t.data_ptr() != end or t.dtype != first.dtype or t.shape[1:] != first.shape[1:]
                or t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()):
            return torch.cat(tensors)
        end += t.numel() * t.element_size()
    return first.as_strided((sum(t.shape[0] for t in tensors), *first.shape[1:]), first.stride())


# -- packing GGUF blocks -------------------------------------------------------------------------


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def _bits(raw: np.ndarray, count: int) -> np.ndarray:
    """Bits 0..count-1 of each little-endian byte row, as [n, count] uint8 (bit i of byte i // 8)."""
    return np.unpackbits(np.ascontiguousarray(raw), axis=-1, bitorder="little")[:, :count]


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: the 6-bit scales and mins of 8 sub-blocks from 12 bytes."""
    n = scales.shape[0]
    d, m, m_d = np.split(scales.reshape(n, 3, 4), 3, axis=1)
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.reshape(n, 8), mn.reshape(n, 8)


def _unpack_blocks(kind: str, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, Format]:
    """One GGUF type's blocks [n, type_size] -> codes [n, elements], scales and mins [n, sub-blocks]."""
    n = blocks.shape[0]
    zeros = lambda shape: np.zeros(shape, dtype=np.float32)  # noqa: E731
    if kind == "Q8_0":
        d, q = _f16(blocks[:, :2]), blocks[:, 2:].view(np.int8)
        return (q.astype(np.int16) + 128).astype(np.uint8), d, zeros(d.shape), Format(8, 32, 128)
    if kind in ("Q4_0", "Q4_1"):
        head = 2 if kind == "Q4_0" else 4
        qs = blocks[:, head:]
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=1)
        d = _f16(blocks[:, :2])
        if kind == "Q4_0":
            return codes, d, zeros(d.shape), Format(4, 32, 8)
        return codes, d, _f16(blocks[:, 2:4]), Format(4, 32, 0)
    if kind in ("Q5_0", "Q5_1"):
        head = 2 if kind == "Q5_0" else 4
        qh, qs = blocks[:, head : head + 4], blocks[:, head + 4 :]
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=1) | (_bits(qh, 32) << 4)
        d = _f16(blocks[:, :2])
        if kind == "Q5_0":
            return codes, d, zeros(d.shape), Format(8, 32, 16)
        return codes, d, _f16(blocks[:, 2:4]), Format(8, 32, 0)
    if kind == "Q2_K":
        scales, qs = blocks[:, :16], blocks[:, 16:80]
        d, dmin = _f16(blocks[:, 80:82]), _f16(blocks[:, 82:84])
        dl = d * (scales & 0x0F).astype(np.float32)
        ml = dmin * (scales >> 4).astype(np.float32)
        codes = (qs.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
        return codes.reshape(n, 256), dl, -ml, Format(4, 16, 0)
    if kind == "Q3_K":
        hmask, qs, packed, d = blocks[:, :32], blocks[:, 32:96], blocks[:, 96:108], _f16(blocks[:, 108:110])
        lo = (packed[:, :8].reshape(n, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)).reshape(n, 16)
        hi = (packed[:, 8:].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)).reshape(n, 16)
        sc = ((lo & 0x0F) | ((hi & 0x03) << 4)).astype(np.int8) - np.int8(32)
        dl = d * sc.astype(np.float32)
        low = (qs.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
        high = (hmask.reshape(n, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1
        # gguf: q = low - 4 * (1 - high); the code low + 4 * high less an offset of 4 is the same.
        codes = low.reshape(n, 256) + (high.reshape(n, 256) << 2)
        return codes, dl, zeros(dl.shape), Format(4, 16, 4)
    if kind in ("Q4_K", "Q5_K"):
        d, dmin = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
        sc, mn = _k_scale_min(blocks[:, 4:16])
        dd, dm = d * sc.astype(np.float32), dmin * mn.astype(np.float32)
        qs = blocks[:, 16:144] if kind == "Q4_K" else blocks[:, 48:176]
        codes = ((qs.reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F).reshape(n, 256)
        if kind == "Q4_K":
            return codes, dd, -dm, Format(4, 32, 0)
        high = (blocks[:, 16:48].reshape(n, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1
        return codes | (high.reshape(n, 256) << 4), dd, -dm, Format(8, 32, 0)
    if kind == "Q6_K":
        ql, qh, scales, d = blocks[:, :128], blocks[:, 128:192], blocks[:, 192:208], _f16(blocks[:, 208:210])
        dd = d * scales.view(np.int8).astype(np.float32)
        low = ((ql.reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F).reshape(n, 256)
        high = ((qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3).reshape(n, 256)
        return low | (high << 4), dd, zeros(dd.shape), Format(8, 16, 32)
    raise ValueError(f"no packed layout for GGUF type {kind}")


def pack(kind: str, raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, Format]:
    """A GGUF tensor's raw bytes (rows x cols elements of `kind`) -> codes, scales, mins and format.

    Rows come out in GGUF order; the caller permutes them as it permutes dequantized rows.
    """
    import gguf

    block_elems, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, type_size)
    if blocks.shape[0] * block_elems != rows * cols:
        raise ValueError(f"{kind}: {blocks.shape[0]} blocks do not hold {rows}x{cols} elements")
    codes, scales, mins, fmt = _unpack_blocks(kind, blocks)
    # Signed formats store code - offset in two's complement (the kernels sign-extend it).
    codes = ((codes.astype(np.int16) - fmt.offset) & (0x0F if fmt.bits == 4 else 0xFF)).astype(np.uint8)
    codes = codes.reshape(rows, cols)
    scales = np.asarray(scales, np.float32).reshape(rows, cols // fmt.block)
    mins = np.asarray(mins, np.float32).reshape(rows, cols // fmt.block)
    padded = -(-cols // RUN) * RUN
    if padded != cols:  # padding elements have scale 0 and min 0: they dequantize to 0 and are never read
        codes = np.pad(codes, ((0, 0), (0, padded - cols)))
        scales = np.pad(scales, ((0, 0), (0, (padded - cols) // fmt.block)))
        mins = np.pad(mins, ((0, 0), (0, (padded - cols) // fmt.block)))
    if fmt.bits == 4:  # in each run of 64, byte j: element j (low nibble) and element 32 + j (high)
        runs = codes.reshape(rows, padded // RUN, 2, RUN // 2)
        codes = runs[:, :, 0] | (runs[:, :, 1] << 4)
    return np.ascontiguousarray(codes.reshape(rows, -1)), scales, mins, fmt


def format_to_str(fmt: Format, cols: int, kind: str) -> str:
    return f"{kind}:{fmt.bits}:{fmt.block}:{fmt.offset}:{cols}"


def format_from_str(text: str) -> tuple[Format, int, str]:
    kind, bits, block, offset, cols = text.split(":")
    return Format(int(bits), int(block), int(offset)), int(cols), kind


# -- layers ---------------------------------------------------------------------------------------


class QuantizedLinear(nn.Module):
    """y = x W^T (+ bias) over packed weights, the output rows in parts (a fused q/k/v may mix formats)."""

    def __init__(self, parts: list[PackedWeight], bias: nn.Parameter | None, isa: int, threads: int = 1) -> None:
        super().__init__()
        self.threads = threads  # the kernels' own: the caller and threads - 1 helpers
        self.parts = _merge(parts)
        self.in_features = parts[0].cols
        self.out_features = sum(p.rows for p in parts)
        self.bias = bias  # the dense layer's own parameter, which the loader fills
        self.isa = isa

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.dim() == 2 and x.shape[0] < BF16_MIN_ROWS and x.dtype in _CAST_DTYPES and len(self.parts) == 1
                and self.bias is None):
            # A decode step's few rows: qlinear with the casts to and from fp32 in the op, one
            # dispatch instead of five (the same bits).
            p = self.parts[0]
            fmt = p.format
            return torch.ops.tenantgate_quant.qlinear_cast(x, p.codes, p.scales, p.mins, p.cols, fmt.bits, fmt.block,
                                                           fmt.offset, self.isa, CHUNK_ROWS, self.threads)
        shape, dtype = x.shape, x.dtype
        x = x.reshape(-1, shape[-1])
        # Parts come back in fp32 or, from the bf16 matmuls, already in bf16 (then the cast is none).
        outs = [self._part(x, p).to(dtype) for p in self.parts]
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def _part(self, x: torch.Tensor, p: PackedWeight) -> torch.Tensor:
        fmt, ops = p.format, torch.ops.tenantgate_quant
        if (x.dtype == torch.bfloat16 and DENSE_MIN_ROWS <= x.shape[0] <= AMX_MAX_ROWS and self.isa >= AMX_ISA
                and not invariant.in_lane()):
            return ops.qlinear_amx(x.contiguous(), p.codes, p.scales, p.mins, p.cols, fmt.bits, fmt.block, fmt.offset,
                                   AMX_CHUNK_ROWS, self.threads)
        if x.dtype == torch.bfloat16 and x.shape[0] >= DENSE_MIN_ROWS and self.isa >= BF16_ISA:
            weight = ops.qdequantize_bf16(p.codes, p.scales, p.mins, p.cols, fmt.bits, fmt.block, fmt.offset,
                                          self.threads)
            return F.linear(x, weight)  # bf16, as a dense bf16 layer's output
        if x.dtype == torch.bfloat16 and x.shape[0] >= BF16_MIN_ROWS and self.isa >= BF16_ISA:
            return ops.qlinear_bf16(x.contiguous(), p.codes, p.scales, p.mins, p.cols, fmt.bits, fmt.block,
                                    fmt.offset, CHUNK_ROWS, self.threads)
        x = x.float().contiguous()
        if x.shape[0] >= TILED_MIN_ROWS and self.isa >= AVX2_ISA:
            return ops.qlinear_tiled(x, p.codes, p.scales, p.mins, p.cols, fmt.bits, fmt.block, fmt.offset,
                                     CHUNK_ROWS, self.threads)
        return ops.qlinear(x, p.codes, p.scales, p.mins, p.cols, fmt.bits, fmt.block, fmt.offset, self.isa,
                           CHUNK_ROWS, self.threads)

    def nbytes(self) -> int:
        return sum(p.nbytes() for p in self.parts)


class QuantizedEmbedding(nn.Module):
    """Token embeddings looked up in a packed table: the selected rows are dequantized."""

    def __init__(self, table: PackedWeight, dtype: torch.dtype, isa: int) -> None:
        super().__init__()
        self.table = table
        self.dtype = dtype
        self.isa = isa

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = dequantize(self.table.select_rows(ids.reshape(-1)), self.isa)
        return rows.to(self.dtype).reshape(*ids.shape, self.table.cols)


def dequantize(p: PackedWeight, isa: int) -> torch.Tensor:
    fmt = p.format
    return torch.ops.tenantgate_quant.qdequantize(p.codes, p.scales, p.mins, p.cols, fmt.bits, fmt.block, fmt.offset,
                                                  isa)


def _merge(parts: list[PackedWeight]) -> list[PackedWeight]:
    """Adjacent parts of one format become one weight, so a fused projection is one kernel call."""
    merged: list[list[PackedWeight]] = []
    for part in parts:
        if merged and merged[-1][0].format == part.format and merged[-1][0].cols == part.cols:
            merged[-1].append(part)
        else:
            merged.append([part])
    return [group[0] if len(group) == 1 else PackedWeight.cat(group) for group in merged]
