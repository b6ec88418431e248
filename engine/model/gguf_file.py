"""A reader of GGUF files (llama.cpp's format, versions 2 and 3): header, metadata, tensor table.

The layout (little-endian, or big-endian throughout where the version field reads so):

    magic "GGUF" | version u32 | tensor count u64 | metadata count u64
    metadata: key (string) | value type u32 | value             (string: length u64 + UTF-8 bytes;
                                                                  array: item type u32 + count u64 + items)
    tensor infos: name (string) | dims u32 | dim u64 * dims (innermost first) | type u32 | offset u64
    padding to `general.alignment` (32 unless set) | tensor data, each at its offset from here

It answers what the gguf package's GGUFReader answers for the same file (tests/engine/test_gguf_file.py
holds it to that): the same metadata values, and tensors of the same names, types, shapes and data,
numpy arrays over one memory map of the file. It parses the metadata with `struct` over that map
instead of one numpy view per value, which keeps a 49k-token vocabulary from costing seconds; the
gguf package still dequantizes. A file it cannot read raises ValueError saying where and why.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# The metadata value types (the gguf package's enum) and the scalar ones' struct codes (numpy
# reads the same codes for arrays).
V = GGUFValueType
_SCALARS: dict[int, str] = {
    V.UINT8: "B", V.INT8: "b", V.UINT16: "H", V.INT16: "h", V.UINT32: "I", V.INT32: "i", V.FLOAT32: "f",
    V.BOOL: "?", V.UINT64: "Q", V.INT64: "q", V.FLOAT64: "d",
}
# Tensor types stored as plain numbers; every other type is stored as bytes of blocks.
_PLAIN_TENSORS = {
    GGMLQuantizationType.F16: "f2", GGMLQuantizationType.F32: "f4", GGMLQuantizationType.F64: "f8",
    GGMLQuantizationType.I8: "i1", GGMLQuantizationType.I16: "i2", GGMLQuantizationType.I32: "i4",
    GGMLQuantizationType.I64: "i8",
}


@dataclass(frozen=True)
class Tensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # innermost dimension first, as GGUF lists them
    n_elements: int
    n_bytes: int
    data_offset: int  # from the start of the file
    # Read-only, over the file's memory map: numbers shaped outermost first, or for block types
    # uint8 [..., bytes per row].
    data: np.ndarray


class Field:
    """One metadata value; strings are decoded from UTF-8 when first asked for."""

    __slots__ = ("type", "item_type", "_raw", "_value")

    def __init__(self, type_: int, raw: Any, item_type: int | None = None) -> None:
        self.type = type_
        self.item_type = item_type  # an array's item type; None for scalars and strings
        self._raw = raw
        self._value: Any = _UNSET

    def contents(self) -> Any:
        """The value as Python: str, int, float, bool or a list of them. UnicodeDecodeError for a bad string."""
        if self._value is _UNSET:
            self._value = _decode(self._raw)
        return self._value


_UNSET = object()


def _decode(raw: Any) -> Any:
    if isinstance(raw, bytes):
        return raw.decode("utf-8")
    if isinstance(raw, list):
        return [_decode(item) for item in raw] if raw and isinstance(raw[0], (bytes, list)) else raw
    return raw


class GGUFFile:
    """A GGUF file's version, metadata fields (key -> Field, in file order) and tensors (in file order)."""

    def __init__(self, path: str | Path) -> None:
        with open(path, "rb") as f:
            size = _file_size(f)
            if size == 0:
                raise ValueError("the file is empty")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        reader = _Cursor(self._map, size)
        if reader.take(4, "the magic number") != MAGIC:
            raise ValueError("no GGUF magic number at its start")
        version = reader.scalar(V.UINT32, "the version")
        if version & 0xFFFF == 0:  # written by a machine of the other byte order: big-endian throughout
            reader.order = ">"
            version = int.from_bytes(version.to_bytes(4, "little"), "big")
        self.byte_order = reader.order
        self.version = version
        if self.version not in SUPPORTED_VERSIONS:
            raise ValueError(f"GGUF version {self.version}, which this reader does not read (it reads 2 and 3)")
        tensor_count = reader.scalar(V.UINT64, "the tensor count")
        kv_count = reader.scalar(V.UINT64, "the metadata count")
        self.fields: dict[str, Field] = {}
        reader.expect(kv_count, 12, "metadata entries")  # a key's length and a value's type at least
        for _ in range(kv_count):
            key = reader.string("a metadata key").decode("utf-8")
            if key in self.fields:
                raise ValueError(f"metadata key {key!r} appears twice")
            self.fields[key] = reader.field(key)
        infos: list[tuple[str, tuple[int, ...], int, int]] = []
        reader.expect(tensor_count, 24, "tensor infos")  # a name's length, a dimension count, type and offset
        for _ in range(tensor_count):
            name = reader.string("a tensor name").decode("utf-8")
            n_dims = reader.scalar(V.UINT32, f"tensor {name!r}'s dimension count")
            dims = tuple(reader.array(V.UINT64, n_dims, f"tensor {name!r}'s dimensions"))
            kind = reader.scalar(V.UINT32, f"tensor {name!r}'s type")
            offset = reader.scalar(V.UINT64, f"tensor {name!r}'s offset")
            infos.append((name, dims, kind, offset))
        self.alignment = DEFAULT_ALIGNMENT
        if (align := self.fields.get("general.alignment")) is not None:
            if align.type != V.UINT32:
                raise ValueError("general.alignment is not a uint32")
            self.alignment = align.contents()
            if self.alignment == 0 or self.alignment & (self.alignment - 1):
                raise ValueError(f"general.alignment {self.alignment} is not a power of two")
        self.data_offset = -(-reader.pos // self.alignment) * self.alignment
        self.tensors: list[Tensor] = []
        names: set[str] = set()
        for name, shape, kind, offset in infos:
            if name in names:
                raise ValueError(f"tensor {name!r} appears twice")
            names.add(name)
            self.tensors.append(self._tensor(name, shape, kind, self.data_offset + offset, size))

    def _tensor(self, name: str, dims: tuple[int, ...], kind: int, start: int, size: int) -> Tensor:
        tensor_type = GGMLQuantizationType(kind)  # ValueError for a type gguf does not know
        n_elements = math.prod(dims)
        block_size, type_size = GGML_QUANT_SIZES[tensor_type]
        n_bytes = n_elements * type_size // block_size
        shape = tuple(reversed(dims))
        if (code := _PLAIN_TENSORS.get(tensor_type)) is not None:
            dtype, count = np.dtype(self.byte_order + code), n_elements
        else:
            if shape and shape[-1] % block_size:
                raise ValueError(f"tensor {name!r}: rows of {shape[-1]} elements are not whole "
                                 f"{tensor_type.name} blocks of {block_size}")
            dtype, count = np.dtype(np.uint8), n_bytes
            shape = (*shape[:-1], shape[-1] // block_size * type_size) if shape else shape
        if start + count * dtype.itemsize > size:
            raise ValueError(f"tensor {name!r}'s data (bytes {start} to {start + count * dtype.itemsize}) "
                             f"runs past the end of the file ({size} bytes)")
        data = np.frombuffer(self._map, dtype=dtype, count=count, offset=start).reshape(shape)
        return Tensor(name, tensor_type, dims, n_elements, n_bytes, start, data)


def _file_size(f: Any) -> int:
    f.seek(0, 2)
    size = f.tell()
    f.seek(0)
    return size


class _Cursor:
    """Reads values in order from the map, checking that each one lies inside the file."""

    def __init__(self, buf: mmap.mmap, size: int) -> None:
        self.buf, self.size, self.pos, self.order = buf, size, 0, "<"

    def expect(self, count: int, min_bytes: int, what: str) -> None:
        if count * min_bytes > self.size - self.pos:
            raise ValueError(f"{count} {what} at byte {self.pos} cannot fit in a file of {self.size} bytes")

    def take(self, n: int, what: str) -> bytes:
        end = self.pos + n
        if end > self.size:
            raise ValueError(f"{what} at byte {self.pos} runs past the end of the file ({self.size} bytes)")
        data = self.buf[self.pos:end]
        self.pos = end
        return data

    def scalar(self, kind: int, what: str) -> Any:
        fmt = self.order + _SCALARS[kind]
        width = struct.calcsize(fmt)
        if self.pos + width > self.size:
            raise ValueError(f"{what} at byte {self.pos} runs past the end of the file ({self.size} bytes)")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += width
        return value

    def string(self, what: str) -> bytes:
        return self.take(self.scalar(V.UINT64, f"the length of {what}"), what)

    def array(self, kind: int, count: int, what: str) -> list:
        dtype = np.dtype(self.order + _SCALARS[kind])
        self.expect(count, dtype.itemsize, what)
        values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).tolist()
        self.pos += count * dtype.itemsize
        return values

    def strings(self, count: int, what: str) -> list[bytes]:
        self.expect(count, 8, what)
        buf, size, pos, out = self.buf, self.size, self.pos, []
        length = struct.Struct(self.order + "Q")
        for _ in range(count):
            (n,) = length.unpack_from(buf, pos)
            start, pos = pos + 8, pos + 8 + n
            if pos > size:
                raise ValueError(f"a string of {what} at byte {start} runs past the end of the file ({size} bytes)")
            out.append(buf[start:pos])
        self.pos = pos
        return out

    def field(self, key: str) -> Field:
        kind = self.scalar(V.UINT32, f"the type of {key!r}")
        if kind == V.ARRAY:
            item = self.scalar(V.UINT32, f"the item type of {key!r}")
            count = self.scalar(V.UINT64, f"the length of {key!r}")
            return Field(V.ARRAY, self.items(item, count, key), item)
        return Field(kind, self.value(kind, key))

    def value(self, kind: int, key: str) -> Any:
        if kind == V.STRING:
            return self.string(f"{key!r}")
        if kind in _SCALARS:
            return self.scalar(kind, f"{key!r}")
        raise ValueError(f"{key!r} has value type {kind}, which GGUF does not define")

    def items(self, kind: int, count: int, key: str) -> list:
        if kind in _SCALARS:
            return self.array(kind, count, f"{key!r}")
        if kind == V.STRING:
            return self.strings(count, f"{key!r}")
        if kind == V.ARRAY:  # arrays of arrays: each its own item type and length
            self.expect(count, 12, f"{key!r}")
            out = []
            for _ in range(count):
                item = self.scalar(V.UINT32, f"an item type of {key!r}")
                out.append(self.items(item, self.scalar(V.UINT64, f"a length in {key!r}"), key))
            return out
        raise ValueError(f"{key!r} has item type {kind}, which GGUF does not define")
