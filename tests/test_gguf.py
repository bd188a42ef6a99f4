"""Tests for pyspec/formats/gguf.py: the reader against the `gguf` package (the outside oracle), the
writer's round trip in both directions, and malformed input.

- Champion: metadata equals `gguf.GGUFReader`'s field contents key by key (same order); tensor
  names, shapes, types, offsets and raw bytes are equal.
- Round trip: a file with every supported tensor type (F32, F16, Q8_0, Q4_0, Q4_1; 1-4 dims) and
  every metadata value kind our writer emits reads back equal (floats as float32), with tensors
  equal bit for bit to quant.dequantize(quant.quantize(x)). The `gguf` package reads our file to
  the same values, and we read a file the `gguf` package wrote with all 13 metadata value types.
- Malformed input must raise GGUFError (never IndexError, struct.error, UnicodeDecodeError,
  MemoryError or RecursionError), quickly: truncation at every byte up to the end of the data,
  hand-built headers with one defect each (huge counts and lengths included), and a seeded random
  byte-mutation fuzz. The message names the byte offset and says what to do.
"""

from __future__ import annotations

import hashlib
import struct
import tracemalloc

import gguf as gguf_ref
import numpy as np
import pytest

from pyspec.formats import gguf, ggufwrite, kquant, quant
from pyspec.formats.gguf import ARRAY, BOOL, STRING, UINT8, UINT32, GGUFError, GGUFFile

FUZZ_SEED = 20241129
FUZZ_MUTATIONS = 3000
ALL_TYPES = tuple(quant.FORMATS.values())


def _bits(a: np.ndarray) -> np.ndarray:
    """float32 array -> its bit patterns: equality is bitwise (NaN payloads and -0.0 included)."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _ref_metadata(reader: gguf_ref.GGUFReader) -> dict:
    """The `gguf` package's key -> contents(), without its synthetic GGUF.* header fields."""
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


# ---------------------------------------------------------------------------------------------
# The champion, against the gguf package
# ---------------------------------------------------------------------------------------------
def test_champion_metadata_equals_reference(champion_gguf_pair):
    ours, ref = champion_gguf_pair
    expected = _ref_metadata(ref)
    assert list(ours.metadata) == list(expected)
    for key, value in expected.items():
        assert ours.metadata[key] == value, key
        assert type(ours.metadata[key]) is type(value), key
    assert ours.metadata["general.architecture"] == "llama"
    assert len(ours.metadata["tokenizer.ggml.tokens"]) == 49152


def test_champion_tensors_equal_reference(champion_gguf_pair):
    ours, ref = champion_gguf_pair
    assert list(ours.tensors) == [t.name for t in ref.tensors]
    assert ours.alignment == ref.alignment
    assert ours.data_offset == ref.data_offset
    for t in ref.tensors:
        info = ours.tensors[t.name]
        assert info.shape == tuple(int(d) for d in reversed(t.shape)), t.name
        assert info.type_id == int(t.tensor_type), t.name
        assert info.offset == t.data_offset, t.name
        assert info.nbytes == t.n_bytes, t.name
        assert np.array_equal(ours.raw(t.name), t.data.view(np.uint8).reshape(-1)), t.name
    kinds = {quant.FORMATS[i].name for i in {t.type_id for t in ours.tensors.values()}}
    assert kinds == {"F32", "Q8_0", "Q4_1"}


# ---------------------------------------------------------------------------------------------
# Writer round trip
# ---------------------------------------------------------------------------------------------
def _f32(x: float) -> float:
    return float(np.float32(x))


# (value written, value expected back): floats are stored as FLOAT32.
ROUND_TRIP_METADATA = {
    "general.architecture": ("llama", "llama"),
    "test.bool_true": (True, True),
    "test.bool_false": (False, False),
    "test.int32": (-7, -7),
    "test.int32_max": (2**31 - 1, 2**31 - 1),
    "test.int32_min": (-2**31, -2**31),
    "test.uint64": (2**31, 2**31),
    "test.uint64_max": (2**64 - 1, 2**64 - 1),
    "test.int64_min": (-2**63, -2**63),
    "test.float": (0.1, _f32(0.1)),
    "test.float_inf": (float("-inf"), float("-inf")),
    "test.string": ("héllo ✓ 世界 \n\0 end", "héllo ✓ 世界 \n\0 end"),
    "test.string_empty": ("", ""),
    "test.array_int": ([1, -2, 3], [1, -2, 3]),
    "test.array_uint64": ([2**40, 2**63], [2**40, 2**63]),
    "test.array_float": ([0.5, -1.1], [0.5, _f32(-1.1)]),
    "test.array_bool": ([True, False, True], [True, False, True]),
    "test.array_string": (["a", "", "ü"], ["a", "", "ü"]),
    "test.array_empty": ([], []),
    "test.array_nested": ([[1, 2], [3]], [[1, 2], [3]]),
}
NESTED_KEYS = {"test.array_nested"}   # the gguf package flattens nested arrays; compared by us only

# name -> (numpy shape, format): every supported type, 1 to 4 dims.
ROUND_TRIP_TENSORS = {
    "f32.1d": ((40,), quant.F32),
    "f16.2d": ((3, 5), quant.F16),
    "q8_0.2d": ((4, 64), quant.Q8_0),
    "q4_0.3d": ((2, 3, 32), quant.Q4_0),
    "q4_1.4d": ((2, 1, 2, 64), quant.Q4_1),
    "f32.4d": ((1, 2, 3, 4), quant.F32),
    "q5_0.2d": ((2, 64), quant.Q5_0),
    "q5_1.1d": ((96,), quant.Q5_1),
    "q4_k.2d": ((2, 256), quant.Q4_K),
    "q5_k.3d": ((1, 2, 256), quant.Q5_K),
    "q6_k.2d": ((3, 512), quant.Q6_K),
    "bf16.2d": ((3, 7), quant.BF16),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    rng = np.random.default_rng(7)
    values = {n: rng.standard_normal(shape).astype(np.float32) * 3 for n, (shape, _) in
              ROUND_TRIP_TENSORS.items()}
    values["q8_0.2d"][0] = 0.0   # an all-zero block: scale 0 must not divide by zero
    path = tmp_path_factory.mktemp("gguf") / "round_trip.gguf"
    ggufwrite.write(path, {k: v for k, (v, _) in ROUND_TRIP_METADATA.items()},
               {n: (values[n], fmt.type_id) for n, (_, fmt) in ROUND_TRIP_TENSORS.items()})
    return path, values


def test_writer_round_trip_metadata(written):
    path, _ = written
    f = GGUFFile.open(path)
    assert list(f.metadata) == list(ROUND_TRIP_METADATA)
    for key, (_, expected) in ROUND_TRIP_METADATA.items():
        assert f.metadata[key] == expected, key
        assert type(f.metadata[key]) is type(expected), key


def test_writer_keeps_numpy_uint32_as_uint32(tmp_path):
    """A numpy uint32 is written as UINT32 (what llama.cpp's loader requires for counts), a
    plain int as INT32, as the reference reader sees them."""
    path = tmp_path / "u32.gguf"
    ggufwrite.write(path, {"general.architecture": "llama", "llama.block_count": np.uint32(30),
                           "llama.other": 30}, {})
    fields = gguf_ref.GGUFReader(path).fields
    assert fields["llama.block_count"].types == [gguf_ref.GGUFValueType.UINT32]
    assert fields["llama.other"].types == [gguf_ref.GGUFValueType.INT32]
    assert GGUFFile.open(path).metadata["llama.block_count"] == 30


def test_writer_round_trip_tensors(written):
    path, values = written
    f = GGUFFile.open(path)
    assert list(f.tensors) == list(ROUND_TRIP_TENSORS)
    assert {f.tensors[n].type_id for n in f.tensors} == {fmt.type_id for fmt in ALL_TYPES}
    for name, (shape, fmt) in ROUND_TRIP_TENSORS.items():
        info = f.tensors[name]
        assert info.shape == shape and info.type_id == fmt.type_id, name
        assert info.offset % f.alignment == 0, name
        packed = quant.quantize(values[name], fmt.type_id)
        assert np.array_equal(f.raw(name), packed), name
        expected = quant.dequantize(packed, fmt.type_id, shape)
        got = f.dequantize(name)
        assert got.dtype == np.float32 and got.shape == shape, name
        assert np.array_equal(_bits(got), _bits(expected)), name


def test_reference_reads_our_file(written):
    path, _ = written
    ours, ref = GGUFFile.open(path), gguf_ref.GGUFReader(path)
    ref_md = _ref_metadata(ref)
    assert list(ref_md) == list(ours.metadata)
    for key, value in ref_md.items():
        if key not in NESTED_KEYS:
            assert ours.metadata[key] == value, key
    assert [t.name for t in ref.tensors] == list(ours.tensors)
    for t in ref.tensors:
        info = ours.tensors[t.name]
        assert int(t.tensor_type) == info.type_id, t.name
        deq = gguf_ref.quants.dequantize(t.data, t.tensor_type).reshape(info.shape)
        assert np.array_equal(_bits(deq), _bits(ours.dequantize(t.name))), t.name


# All 13 value types, written by the gguf package: (writer type, value, expected back).
REF_SCALARS = {
    "t.u8": (gguf_ref.GGUFValueType.UINT8, 200), "t.i8": (gguf_ref.GGUFValueType.INT8, -100),
    "t.u16": (gguf_ref.GGUFValueType.UINT16, 60000),
    "t.i16": (gguf_ref.GGUFValueType.INT16, -30000),
    "t.u32": (gguf_ref.GGUFValueType.UINT32, 4_000_000_000),
    "t.i32": (gguf_ref.GGUFValueType.INT32, -2_000_000_000),
    "t.f32": (gguf_ref.GGUFValueType.FLOAT32, 1.5), "t.bool": (gguf_ref.GGUFValueType.BOOL, True),
    "t.str": (gguf_ref.GGUFValueType.STRING, "ünïcode"),
    "t.u64": (gguf_ref.GGUFValueType.UINT64, 2**64 - 2),
    "t.i64": (gguf_ref.GGUFValueType.INT64, -2**62), "t.f64": (gguf_ref.GGUFValueType.FLOAT64, 0.1),
}


def test_we_read_reference_written_file(tmp_path):
    path = tmp_path / "ref.gguf"
    w = gguf_ref.GGUFWriter(path, "llama")
    w.add_custom_alignment(64)
    for key, (vtype, value) in REF_SCALARS.items():
        w.add_key_value(key, value, vtype)
        if vtype != gguf_ref.GGUFValueType.STRING:
            w.add_key_value(key + ".array", [value, value], gguf_ref.GGUFValueType.ARRAY,
                            sub_type=vtype)
    w.add_array("t.strs", ["a", "bc", "ü"])
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    tensors = {"f32": (x, quant.F32), "f16": (x.astype(np.float16), quant.F16)}
    for fmt in (quant.Q8_0, quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1, quant.BF16):
        qtype = gguf_ref.GGMLQuantizationType(fmt.type_id)
        tensors[fmt.name.lower()] = (gguf_ref.quants.quantize(x, qtype), fmt)
    for name, (data, fmt) in tensors.items():
        raw = None if fmt in (quant.F32, quant.F16) else gguf_ref.GGMLQuantizationType(fmt.type_id)
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    ours, ref = GGUFFile.open(path), gguf_ref.GGUFReader(path)
    assert ours.alignment == 64
    ref_md = _ref_metadata(ref)
    assert list(ours.metadata) == list(ref_md)
    for key, value in ref_md.items():
        assert ours.metadata[key] == value, key
    for key, (vtype, value) in REF_SCALARS.items():
        expected = _f32(value) if vtype == gguf_ref.GGUFValueType.FLOAT32 else value
        assert ours.metadata[key] == expected, key
    for name, (_, fmt) in tensors.items():
        info = ours.tensors[name]
        assert info.shape == (3, 64) and info.type_id == fmt.type_id and info.offset % 64 == 0
        t = next(t for t in ref.tensors if t.name == name)
        deq = gguf_ref.quants.dequantize(t.data, t.tensor_type).reshape(info.shape)
        assert np.array_equal(_bits(ours.dequantize(name)), _bits(deq)), name


def test_writer_custom_alignment(tmp_path):
    path = tmp_path / "aligned.gguf"
    x = np.arange(40, dtype=np.float32)
    ggufwrite.write(path, {"general.architecture": "llama"},
               {"a": (x[:8], quant.F32.type_id), "b": (x, quant.F32.type_id)}, alignment=64)
    f = GGUFFile.open(path)
    assert f.alignment == 64 and f.metadata["general.alignment"] == 64
    assert all(t.offset % 64 == 0 for t in f.tensors.values())
    assert np.array_equal(f.dequantize("b"), x)
    ref = gguf_ref.GGUFReader(path)   # insists on a UINT32 general.alignment
    assert ref.alignment == 64
    assert np.array_equal(next(t for t in ref.tensors if t.name == "b").data, x)


@pytest.mark.parametrize("tensors, alignment, error", [
    ({"t": (np.zeros((2, 48)), quant.Q8_0.type_id)}, None, ValueError),   # row not whole blocks
    ({"t": (np.float32(1.0), quant.F32.type_id)}, None, ValueError),      # 0 dims
    ({"t": (np.zeros((1,) * 5), quant.F32.type_id)}, None, ValueError),   # 5 dims
    ({"t": (np.zeros(256), 11)}, None, ValueError),                       # unsupported type
    ({"t": (np.zeros(128), quant.Q4_K.type_id)}, None, ValueError),       # half a super-block
    ({}, 12, ValueError),                                                 # not a multiple of 8
], ids=["partial-block", "0-dims", "5-dims", "q3_k", "partial-q4_k", "alignment-12"])
def test_writer_refuses_what_the_reader_would_refuse(tmp_path, tensors, alignment, error):
    with pytest.raises(error):
        ggufwrite.write(tmp_path / "x.gguf", {}, tensors, alignment=alignment)


def test_writer_refuses_mixed_arrays_and_conflicting_alignment(tmp_path):
    with pytest.raises(TypeError):
        ggufwrite.write(tmp_path / "x.gguf", {"k": [1, "a"]}, {})
    with pytest.raises(TypeError):
        ggufwrite.write(tmp_path / "x.gguf", {"k": object()}, {})
    with pytest.raises(ValueError):
        ggufwrite.write(tmp_path / "x.gguf", {"general.alignment": 64}, {}, alignment=128)


def test_buffers_of_any_kind(written):
    path, _ = written
    blob = path.read_bytes()
    from_file = GGUFFile.open(path)
    for buf in (blob, bytearray(blob), np.frombuffer(blob, dtype=np.uint8), from_file.buf):
        f = GGUFFile(buf)
        assert f.metadata == from_file.metadata and f.tensors == from_file.tensors
        assert np.array_equal(f.dequantize("q4_1.4d"), from_file.dequantize("q4_1.4d"))
        # Zero-copy: every tensor's bytes are a view of the buffer (the mmap for open()).
        whole = np.frombuffer(buf, dtype=np.uint8)
        for name in f.tensors:
            assert np.shares_memory(f.raw(name), whole), name
    assert from_file.sha256() == hashlib.sha256(blob).hexdigest()
    with pytest.raises(GGUFError, match="missing"):
        from_file.tensor("no.such.tensor")


def test_a_file_read_through_a_reader_holds_one_tensor_at_a_time(written):
    """from_reader (the page's weights, streamed from OPFS): the header in growing reads, then
    each tensor in one read of its own bytes, equal to the whole buffer's; a given sha256 is
    trusted (no read), a short read is named."""
    path, _ = written
    blob = path.read_bytes()
    whole = GGUFFile(blob)
    reads = []

    def reader(offset, nbytes):
        reads.append((offset, nbytes))
        return bytearray(blob[offset:offset + nbytes])

    f = GGUFFile.from_reader(reader, len(blob), "streamed", first=64)
    assert f.metadata == whole.metadata and f.tensors == whole.tensors
    assert all(off == 0 for off, _ in reads) and len(reads) > 1      # the header, grown
    assert reads[-1][1] < len(blob)                                   # never the whole file
    reads.clear()
    for name, t in whole.tensors.items():
        assert np.array_equal(f.raw(name), whole.raw(name))
        assert reads[-1] == (t.offset, t.nbytes)
    assert f.sha256() == hashlib.sha256(blob).hexdigest()            # read in blocks
    trusted = GGUFFile.from_reader(reader, len(blob), "streamed", sha256="ab" * 32)
    reads.clear()
    assert trusted.sha256() == "ab" * 32 and not reads
    cut = GGUFFile.from_reader(lambda off, n: reader(off, n)[:n - 1] if off else reader(off, n),
                               len(blob), "cut")
    with pytest.raises(gguf.TruncatedTensorError, match="the file changed or was cut"):
        cut.raw("q8_0.2d")


# ---------------------------------------------------------------------------------------------
# Malformed input
# ---------------------------------------------------------------------------------------------
def _parse_quickly(blob) -> GGUFFile:
    """GGUFFile(blob); any GGUFError propagates. A huge count or length in a few-KB buffer must be
    refused by a bounds check before anything is allocated for it: the parse's peak allocation
    stays within 1 MiB plus a few times the buffer, whatever the header claims."""
    tracemalloc.start()
    try:
        return GGUFFile(blob)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < (1 << 20) + 8 * len(blob), f"parsing {len(blob)} bytes allocated {peak}"


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A small valid file: (bytes, parsed, end of the last tensor's data)."""
    rng = np.random.default_rng(3)
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    ggufwrite.write(path, {"general.architecture": "llama", "general.name": "tiny", "test.ints": [1, 2],
                      "test.words": ["a", "bc"], "test.flag": True, "test.pi": 3.25,
                      "test.nested": [[1], [2, 3]]},
               {"a": (rng.standard_normal(8), quant.F32.type_id),
                "b": (rng.standard_normal((2, 32)), quant.Q8_0.type_id),
                "c": (rng.standard_normal(32), quant.Q4_1.type_id),
                "d": (rng.standard_normal(4), quant.F16.type_id),
                "e": (rng.standard_normal(256), quant.Q4_K.type_id),
                "f": (rng.standard_normal(256), quant.Q6_K.type_id)})
    blob = path.read_bytes()
    f = GGUFFile(blob)
    return blob, f, max(t.offset + t.nbytes for t in f.tensors.values())


def test_truncated_at_every_byte(small):
    """Every prefix that cuts the header, its padding or any tensor's data is refused."""
    blob, f, end = small
    assert f.data_offset < end <= len(blob)
    for n in range(end):
        with pytest.raises(GGUFError):
            _parse_quickly(blob[:n])
    _parse_quickly(blob[:end])   # the last tensor's padding is not needed


def test_truncated_file_on_disk(small, tmp_path):
    blob, f, _ = small
    for n in (0, 3, 20, f.data_offset - 1, f.data_offset + 5):
        path = tmp_path / f"cut{n}.gguf"
        path.write_bytes(blob[:n])
        with pytest.raises(GGUFError) as e:
            GGUFFile.open(path)
        assert path.name in str(e.value)


def _s(text) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def _kv(key, vtype: int, payload: bytes) -> bytes:
    return _s(key) + struct.pack("<I", vtype) + payload


def _ti(name, dims, type_id: int = 0, offset: int = 0) -> bytes:
    return (_s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
            + struct.pack("<IQ", type_id, offset))


def _file(kvs=(), tis=(), data: bytes = b"", *, magic=b"GGUF", version=3, n_tensors=None,
          n_kv=None) -> bytes:
    """A hand-built GGUF: header, metadata, tensor infos, padding to 32, data."""
    head = (magic + struct.pack("<IQQ", version, len(tis) if n_tensors is None else n_tensors,
                                len(kvs) if n_kv is None else n_kv)
            + b"".join(kvs) + b"".join(tis))
    return head + b"\0" * (-len(head) % 32) + data


KV_U32 = _kv("a", UINT32, struct.pack("<I", 5))
KV_AT = 24   # the first metadata key starts after magic, version and the two counts


def test_hand_built_file_is_valid():
    """The builder makes valid files, so the defects below are the only thing wrong."""
    f = _parse_quickly(_file([KV_U32, _kv("s", STRING, _s("x"))],
                             [_ti("t", [8]), _ti("u", [32], 8, 32)], bytes(32 + 34)))
    assert f.metadata == {"a": 5, "s": "x"}
    assert f.tensors["t"].shape == (8,) and f.tensors["u"].type_id == 8


HUGE = 2**64 - 1
# id -> (bytes, a word of the reason, the byte offset in the message or None)
MALFORMED = {
    "bad-magic": (_file(magic=b"GGUX"), "magic", 0),
    "ggml-magic": (b"lmgg" + bytes(40), "magic", 0),
    "version-2": (_file(version=2), "version", 4),
    "version-4": (_file(version=4), "version", 4),
    "tensor-count-huge": (_file(n_tensors=HUGE), "tensor count", 8),
    "tensor-count-too-big": (_file([KV_U32], n_tensors=100), "tensor count", 8),
    "kv-count-huge": (_file(n_kv=2**63), "metadata count", 16),
    "kv-cut-in-second-key": (b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + KV_U32 + _s("b") + bytes(2),
                             "truncated", KV_AT + len(KV_U32) + 9),
    "key-length-huge": (_file([struct.pack("<Q", HUGE) + b"abc" + bytes(20)]), "metadata key",
                        KV_AT + 8),
    "string-length-huge": (_file([_kv("k", STRING, struct.pack("<Q", 2**63) + b"x")]),
                           "truncated", None),
    "array-length-huge": (_file([_kv("k", ARRAY, struct.pack("<IQ", UINT32, 2**62))]),
                          "array length", KV_AT + 8 + 1 + 4 + 4),
    "string-array-length-huge": (_file([_kv("k", ARRAY, struct.pack("<IQ", STRING, HUGE))]),
                                 "array length", None),
    "nested-array-length-huge": (_file([_kv("k", ARRAY, struct.pack("<IQ", ARRAY, 2**60))]),
                                 "array length", None),
    "deeply-nested-array": (_file([_kv("k", ARRAY, struct.pack("<IQ", ARRAY, 1) * 200
                                       + struct.pack("<IQ", UINT8, 0))]), "element type", None),
    "unknown-value-type": (_file([_kv("k", 13, bytes(8))]), "value type", None),
    "unknown-value-type-max": (_file([_kv("k", 2**32 - 1, bytes(8))]), "value type", None),
    "unknown-array-type": (_file([_kv("k", ARRAY, struct.pack("<IQ", 13, 1) + bytes(8))]),
                           "element type", None),
    "duplicate-key": (_file([KV_U32, KV_U32]), "duplicate", KV_AT + len(KV_U32)),
    "non-utf8-key": (_file([_kv(b"\xff\xfekey", UINT8, b"\0")]), "UTF-8", KV_AT),
    "non-utf8-value": (_file([_kv("k", STRING, _s(b"ok\xc3("))]), "UTF-8", KV_AT + 8 + 1 + 4),
    "non-utf8-array-item": (_file([_kv("k", ARRAY, struct.pack("<IQ", STRING, 2) + _s("a")
                                       + _s(b"\xed\xa0\x80"))]), "UTF-8",
                            KV_AT + 8 + 1 + 4 + 4 + 8 + 8 + 1),   # the second item's start
    "non-utf8-tensor-name": (_file([], [_ti(b"w\x80", [8])], bytes(32)), "UTF-8", KV_AT),
    "n-dims-0": (_file([], [_ti("t", [])], bytes(32)), "dims", KV_AT),
    "n-dims-5": (_file([], [_ti("t", [1] * 5)], bytes(32)), "dims", KV_AT),
    "n-dims-huge": (_file([], [_s("t") + struct.pack("<I", 2**32 - 1) + bytes(40)]), "dims", KV_AT),
    "unknown-tensor-type": (_file([], [_ti("t", [32], 99)], bytes(160)), "unknown type 99",
                            KV_AT),
    "unsupported-iq2_xs": (_file([], [_ti("t", [256], 17)], bytes(160)), "IQ2_XS", KV_AT),
    "unsupported-q3_k": (_file([], [_ti("t", [256], 11)], bytes(160)), "Q3_K", KV_AT),
    "unsupported-tq1_0": (_file([], [_ti("t", [256], 34)], bytes(160)), "TQ1_0", KV_AT),
    "q4_k-past-eof": (_file([], [_ti("t", [256], 12)], bytes(100)), "past the end", 64 + 100),
    "q4_k-partial-super-block": (_file([], [_ti("t", [128], 12)], bytes(160)), "block size",
                                 KV_AT),
    "misaligned-offset": (_file([], [_ti("t", [8], 0, 4)], bytes(64)), "aligned", KV_AT),
    # (the offset of data past the end is where the file ends)
    "data-past-eof": (_file([], [_ti("t", [8], 0, 32)], bytes(32)), "past the end", 96),
    "data-past-eof-huge-dims": (_file([], [_ti("t", [2**40] * 4)], bytes(32)), "past the end",
                                128),
    "dim-0": (_file([], [_ti("t", [8, 0])], bytes(32)), "dim 0", KV_AT),
    "dim-huge": (_file([], [_ti("t", [2**63])], bytes(32)), "dim", KV_AT),
    "partial-block": (_file([], [_ti("t", [16], 8)], bytes(64)), "block size", KV_AT),
    "duplicate-tensor": (_file([], [_ti("t", [8]), _ti("t", [8], 0, 32)], bytes(64)),
                         "duplicate tensor", None),
    "alignment-0": (_file([_kv("general.alignment", UINT32, struct.pack("<I", 0))]),
                    "alignment", None),
    "alignment-12": (_file([_kv("general.alignment", UINT32, struct.pack("<I", 12))]),
                     "alignment", None),
    "alignment-string": (_file([_kv("general.alignment", STRING, _s("32"))]), "alignment", None),
    "alignment-bool": (_file([_kv("general.alignment", BOOL, b"\1")]), "alignment", None),
    "empty": (b"", "truncated", 0),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_raises_gguf_error(name):
    blob, word, offset = MALFORMED[name]
    with pytest.raises(GGUFError) as e:
        _parse_quickly(blob)
    message = str(e.value)
    assert word.lower() in e.value.reason.lower(), message
    assert e.value.offset is not None and 0 <= e.value.offset <= len(blob), message
    assert f"at byte {e.value.offset}" in message
    if offset is not None:
        assert e.value.offset == offset, message
    assert "download it again or pick another file" in message   # says what to do


def test_error_is_a_value_error_with_source():
    with pytest.raises(ValueError, match="model.gguf: bad magic"):
        GGUFFile(b"XXXX" + bytes(28), "model.gguf")


def test_open_missing_or_unreadable(tmp_path):
    """A path that names no file, or a folder, is said to be so, with no advice about corrupt
    bytes: the file is not corrupt, the path is wrong."""
    with pytest.raises(GGUFError, match="no such file; check the path") as e:
        GGUFFile.open(tmp_path / "missing.gguf")
    assert str(tmp_path / "missing.gguf") in str(e.value)
    assert "corrupt" not in str(e.value) and "download" not in str(e.value)
    with pytest.raises(GGUFError, match="is a folder, not a GGUF file") as e:
        GGUFFile.open(tmp_path)
    assert "corrupt" not in str(e.value) and "download" not in str(e.value)


def test_truncated_data_names_where_the_file_ends(small, tmp_path):
    """A file cut inside a tensor's data says the file ends at its size, not at the byte of
    that tensor's entry in the header (which it once named as where the file was cut)."""
    blob, f, end = small
    path = tmp_path / "cut.gguf"
    path.write_bytes(blob[:end - 3])
    with pytest.raises(GGUFError) as e:
        GGUFFile.open(path)
    assert e.value.offset == end - 3
    assert f"runs past the end of the file at byte {end - 3}." in str(e.value)
    assert "download it again" in str(e.value)


def test_random_mutations_parse_or_raise_gguf_error(small):
    """FUZZ_MUTATIONS seeded mutations (1-4 bytes each, 90% in the header): each parses, within
    _parse_quickly's allocation bound, and then dequantizes every tensor, or raises GGUFError."""
    blob, f, _ = small
    rng = np.random.default_rng(FUZZ_SEED)
    outcomes = {"parsed": 0, "refused": 0}
    for i in range(FUZZ_MUTATIONS):
        buf = bytearray(blob)
        edits = []
        for _ in range(rng.integers(1, 5)):
            pos = int(rng.integers(0, f.data_offset if rng.random() < 0.9 else len(buf)))
            op = rng.integers(3)
            buf[pos] = (buf[pos] ^ (1 << int(rng.integers(8))) if op == 0 else
                        int(rng.integers(256)) if op == 1 else 0xFF)
            edits.append((pos, buf[pos]))
        try:
            parsed = _parse_quickly(bytes(buf))
            for name in parsed.tensors:
                parsed.dequantize(name)
            outcomes["parsed"] += 1
        except GGUFError:
            outcomes["refused"] += 1
        except Exception as e:  # anything else is a reader bug: report the mutation
            pytest.fail(f"mutation {i} {edits}: {type(e).__name__}: {e}")
    assert outcomes["parsed"] > 100 and outcomes["refused"] > 100, outcomes


def test_refused_types_name_the_tensor_and_the_type():
    """IQ*, Q2_K, Q3_K, TQ* ...: refused when the file is parsed, by name, with what to do."""
    with pytest.raises(gguf.UnsupportedTypeError) as e:
        GGUFFile(_file([], [_ti("blk.0.ffn_down.weight", [256, 4], 16)], bytes(1024)), "m.gguf")
    message = str(e.value)
    assert "'blk.0.ffn_down.weight' is IQ2_XXS (ggml type 16)" in message
    assert "Q4_K_M" in message and "llama-quantize" in message and message.startswith("m.gguf: ")


def test_truncated_k_quant_tensor_is_a_named_error(tmp_path):
    path = tmp_path / "k.gguf"
    ggufwrite.write(path, {}, {"w": (np.ones((4, 256), np.float32), quant.Q5_K.type_id)})
    blob = path.read_bytes()
    end = len(blob)
    with pytest.raises(gguf.TruncatedTensorError, match="tensor 'w' data .* runs past the end"):
        GGUFFile(blob[:end - 1])


@pytest.mark.parametrize("fmt", quant.K_QUANTS, ids=lambda f: f.name)
def test_non_finite_k_quant_scale_is_a_named_error(tmp_path, fmt):
    """A super-block whose d (or dmin) is NaN or infinite: reading the tensor (to dequantize
    or to upload it) says which tensor and which super-block; other tensors still read."""
    path = tmp_path / "k.gguf"
    rng = np.random.default_rng(5)
    ggufwrite.write(path, {}, {"ok": (rng.standard_normal(256), fmt.type_id),
                          "blk.1.attn_k.weight": (rng.standard_normal((3, 512)), fmt.type_id)})
    blob = bytearray(path.read_bytes())
    info = GGUFFile(bytes(blob)).tensors["blk.1.attn_k.weight"]
    for at, value in zip(kquant.SCALE_OFFSETS[fmt.name], (np.inf, np.nan)):
        bad = bytearray(blob)
        where = info.offset + 4 * fmt.block_bytes + at                  # super-block 4
        bad[where:where + 2] = np.array([value], np.float16).tobytes()
        f = GGUFFile(bytes(bad), "m.gguf")
        with pytest.raises(gguf.NonFiniteScaleError) as e:
            f.dequantize("blk.1.attn_k.weight")
        assert "tensor 'blk.1.attn_k.weight' (" + fmt.name + "): super-block 4" in str(e.value)
        assert e.value.offset == info.offset + 4 * fmt.block_bytes
        assert np.isfinite(f.dequantize("ok")).all()
