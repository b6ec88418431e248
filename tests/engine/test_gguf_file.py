"""engine.model.gguf_file against the gguf package's GGUFReader: the same metadata and tensors for
SmolLM2's file and for files gguf's writer lays out (each tensor type, odd shapes, every value type,
big-endian, another alignment), and GGUFError for files it cannot read."""

import os
from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.model.gguf import GGUFError, _open, ensure_converted
from engine.model.gguf_file import GGUFFile
from tests.utils.gguf_files import K_QUANTS, write_tiny_gguf

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", *K_QUANTS]
ODD = {"hidden": 96, "heads": 3, "kv_heads": 1, "intermediate": 160, "layers": 1}
ODD_K = {"hidden": 256, "heads": 4, "kv_heads": 2, "intermediate": 768, "layers": 1}


def assert_same_as_gguf(path: Path) -> GGUFFile:
    ours, ref = GGUFFile(path), gguf.GGUFReader(path)
    assert ours.version == ref.fields["GGUF.version"].contents()
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]  # gguf's own entries for the header
    assert list(ours.fields) == keys
    for key in keys:
        mine, theirs = ours.fields[key].contents(), ref.fields[key].contents()
        assert mine == theirs, key
        for a, b in zip(mine if isinstance(mine, list) else [mine], theirs if isinstance(theirs, list) else [theirs]):
            assert type(a) is type(b), key  # an int stays an int, a bool a bool, a float32 the same float
    assert (ours.alignment, ours.data_offset) == (ref.alignment, ref.data_offset)
    assert len(ours.tensors) == len(ref.tensors)
    for mine, theirs in zip(ours.tensors, ref.tensors):
        assert (mine.name, mine.tensor_type, mine.n_elements, mine.n_bytes, mine.data_offset) == (
            theirs.name, theirs.tensor_type, theirs.n_elements, theirs.n_bytes, theirs.data_offset)
        assert list(mine.shape) == theirs.shape.tolist()
        assert mine.data.dtype == theirs.data.dtype and mine.data.shape == theirs.data.shape, mine.name
        assert mine.data.tobytes() == theirs.data.tobytes(), mine.name
        assert not mine.data.flags.writeable
    return ours


def test_smollm2_reads_as_gguf_reads_it(smollm2_gguf):
    ours = assert_same_as_gguf(smollm2_gguf)
    assert len(ours.fields["tokenizer.ggml.tokens"].contents()) == 49152


@pytest.mark.parametrize("qtype", TYPES)
def test_each_tensor_type_and_odd_shapes(tmp_path, demo_model_dir, qtype):
    shape = ODD_K if qtype in K_QUANTS else ODD
    assert_same_as_gguf(write_tiny_gguf(tmp_path / f"{qtype}.gguf", demo_model_dir, qtype=qtype, shape=shape,
                                        arch="qwen2", tied=qtype == "Q4_1"))


def write(path: Path, fill, **writer_args) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama", **writer_args)
    fill(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def every_value_type(writer: gguf.GGUFWriter) -> None:
    writer.add_uint8("t.u8", 250)
    writer.add_int8("t.i8", -7)
    writer.add_uint16("t.u16", 65000)
    writer.add_int16("t.i16", -30000)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -2_000_000_000)
    writer.add_float32("t.f32", 1e-5)  # read back as the float32 nearest, as gguf reads it
    writer.add_uint64("t.u64", 2**63 + 5)
    writer.add_int64("t.i64", -(2**62))
    writer.add_float64("t.f64", 0.1)
    writer.add_bool("t.true", True)
    writer.add_bool("t.false", False)
    writer.add_string("t.str", "héllo ✓ 🙂")
    writer.add_string("t.empty", "")
    writer.add_array("t.strs", ["a", "", "ü" * 300, " space", "\n"])
    writer.add_array("t.ints", [1, -2, 3])
    writer.add_array("t.floats", [0.5, 1e-3])
    writer.add_array("t.bools", [True, False, True])
    writer.add_key_value("t.u8s", [1, 2, 255], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT8)
    rng = np.random.default_rng(0)
    writer.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    writer.add_tensor("f16", rng.standard_normal((7,)).astype(np.float16))
    writer.add_tensor("i32", np.arange(24, dtype=np.int32).reshape(2, 3, 4))
    q8 = gguf.GGMLQuantizationType.Q8_0
    writer.add_tensor("q8", gguf.quantize(rng.standard_normal((2, 64)).astype(np.float32), q8), raw_dtype=q8)


def test_every_value_type(tmp_path):
    ours = assert_same_as_gguf(write(tmp_path / "values.gguf", every_value_type))
    assert ours.fields["t.strs"].contents()[2] == "ü" * 300 and ours.fields["t.u64"].contents() == 2**63 + 5


def test_big_endian_files(tmp_path):
    ours = assert_same_as_gguf(write(tmp_path / "be.gguf", every_value_type, endianess=gguf.GGUFEndian.BIG))
    assert ours.byte_order == ">" and ours.version == 3


def test_another_alignment(tmp_path):
    def fill(writer):
        writer.add_custom_alignment(64)
        writer.add_string("t.s", "x" * 13)
        writer.add_tensor("a", np.ones(3, dtype=np.float32))
        writer.add_tensor("b", np.arange(5, dtype=np.float32))

    ours = assert_same_as_gguf(write(tmp_path / "aligned.gguf", fill))
    assert ours.alignment == 64 and ours.data_offset % 64 == 0


def test_strings_are_decoded_when_asked_for(tmp_path):
    def fill(writer):
        writer.add_string("t.good", "fine")
        writer.add_key_value("t.bad", b"\xff\xfe", gguf.GGUFValueType.STRING)

    ours = GGUFFile(write(tmp_path / "bad-utf8.gguf", fill))
    assert ours.fields["t.good"].contents() == "fine"  # as gguf: a bad value unread does not stop the file
    with pytest.raises(UnicodeDecodeError):
        ours.fields["t.bad"].contents()


def test_truncated_files_are_refused_at_every_cut(tmp_path, demo_model_dir):
    whole = write_tiny_gguf(tmp_path / "whole.gguf", demo_model_dir, qtype="Q4_1").read_bytes()
    header_end = GGUFFile(tmp_path / "whole.gguf").data_offset
    cut = tmp_path / "cut.gguf"
    # Every few bytes of the header and tensor table, then through the tensor data.
    for size in [*range(0, 64), *range(64, header_end, 997), header_end, *range(header_end, len(whole) - 1, 9973),
                 len(whole) - 1]:
        cut.write_bytes(whole[:size])
        with pytest.raises(GGUFError, match="cut.gguf is not a readable GGUF file"):
            _open(cut)


@pytest.mark.parametrize("content", [
    b"", b"GGU", b"GGUF", b"GGUF\x03\x00", b"NOPE" + bytes(60), b"GGUF" + os.urandom(64),
    b"GGUF\x01\x00\x00\x00" + bytes(16),  # version 1
    b"GGUF\x03\x00\x00\x00" + (1).to_bytes(8, "little") + (2**62).to_bytes(8, "little"),  # absurd counts
    b"GGUF\x03\x00\x00\x00" + (2**60).to_bytes(8, "little") + bytes(8),
])
def test_garbage_is_refused(tmp_path, content):
    bad = tmp_path / "garbage.gguf"
    bad.write_bytes(content)
    with pytest.raises(GGUFError, match="garbage.gguf is not a readable GGUF file"):
        ensure_converted(bad, tmp_path / "cache", progress=False)


def test_random_corruption_never_escapes_as_another_error(tmp_path, demo_model_dir):
    whole = bytearray(write_tiny_gguf(tmp_path / "whole.gguf", demo_model_dir, qtype="Q8_0").read_bytes())
    header_end = GGUFFile(tmp_path / "whole.gguf").data_offset
    rng = np.random.default_rng(1)
    bad = tmp_path / "flipped.gguf"
    for _ in range(200):
        data = bytearray(whole)
        for at in rng.integers(0, header_end, size=4):
            data[at] = int(rng.integers(0, 256))
        bad.write_bytes(data)
        try:
            _open(bad)
        except GGUFError as exc:
            assert "flipped.gguf is not a readable GGUF file" in str(exc)


def test_bad_alignment_is_refused(tmp_path):
    def fill(writer):
        writer.add_uint32("general.alignment", 48)
        writer.add_tensor("a", np.ones(3, dtype=np.float32))

    path = write(tmp_path / "align48.gguf", fill)
    with pytest.raises(GGUFError, match="power of two"):
        _open(path)
    with pytest.raises(ValueError):
        gguf.GGUFReader(path)  # the oracle refuses it too
