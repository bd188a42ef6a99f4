"""GGUF v3 reader: the container's constants, its errors and `GGUFFile`.

The reader parses the header, metadata and tensor infos of a GGUF file held in any buffer (bytes,
mmap, a numpy memmap) and hands out zero-copy numpy views of the aligned tensor data. A file read
through a `read(offset, nbytes)` callable instead (`GGUFFile.from_reader`: the page's weights,
read from OPFS a tensor at a time) holds only its header, and `raw` reads each tensor when
asked. Every length, count and offset is checked against the buffer before it is used, so a
malformed, truncated or unsupported file raises `GGUFError` with the byte offset and the reason;
it never raises IndexError and never loops on a huge count.

A draft may *borrow* tensors from the champion it was trained beside instead of holding copies
(the token embedding, 30 MB of this champion's 98): its metadata lists them under
`pyspec.borrowed.*` (names, ggml types, the sha256 of each tensor's bytes), and
`lend(champion_file)` makes them readable from the champion's buffer. Until then reading one
says that the file is a draft to load beside its champion. Which champion may lend is the
pairing's question (`compat.bind_borrowed`).

A tensor in a type pyspec does not read (quant.FORMATS) is refused by name when the file is
parsed (UnsupportedTypeError), one whose data runs past the end too (TruncatedTensorError), and a
K-quant tensor with a non-finite super-block scale when its bytes are read (NonFiniteScaleError).

Spec: github.com/ggml-org/ggml/blob/master/docs/gguf.md. Not here: the writer (ggufwrite.py,
for test models and drafts), dequantization (quant.py).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import NO_SUCH_FILE, PyspecError
from . import quant

MAGIC = b"GGUF"
VERSION = 3
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4

# GGUF metadata value types (gguf.md, "gguf_metadata_value_type").
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALARS = {
    UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
    FLOAT32: "<f", BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d",
}
_NUMPY = {
    UINT8: np.uint8, INT8: np.int8, UINT16: np.uint16, INT16: np.int16, UINT32: np.uint32,
    INT32: np.int32, FLOAT32: np.float32, UINT64: np.uint64, INT64: np.int64, FLOAT64: np.float64,
}


ADVICE = ("The file is corrupt, truncated or not a GGUF v3 model; download it again or pick "
          "another file.")


class GGUFError(PyspecError, ValueError):
    """A GGUF file is malformed, truncated or uses something pyspec does not support."""

    code = "bad_model"

    def __init__(self, reason: str, offset: int | None = None, source: str = "GGUF file",
                 advice: str | None = ADVICE):
        """`advice` follows the reason: by default what to do with a file that cannot be read
        as a model; an error about the path, not the file's bytes, says its own in `reason`."""
        where = f" at byte {offset}" if offset is not None else ""
        super().__init__(f"{source}: {reason}{where}." + (f" {advice}" if advice else ""))
        self.offset = offset
        self.reason = reason


class UnsupportedTypeError(GGUFError):
    """A tensor is in a ggml type pyspec does not read (IQ*, Q2_K, Q3_K, TQ*, ...)."""


class TruncatedTensorError(GGUFError):
    """A tensor's data runs past the end of the file (a cut download, or dims that lie)."""


class HeaderIncompleteError(GGUFError):
    """Header-only mode: the header runs past the bytes given; `needed` is the least that would
    get further (the page's worker reads a larger range and parses again)."""

    def __init__(self, needed: int, source: str):
        super().__init__(f"the header continues past the {needed} bytes read", None, source,
                         "Read more of the file's start.")
        self.needed = needed


class NonFiniteScaleError(GGUFError):
    """A K-quant super-block's f16 scale (d or dmin) is NaN or infinite."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]     # numpy order: GGUF dims reversed, the last axis is ne[0]
    type_id: int
    offset: int                # absolute byte offset of the data in the buffer
    nbytes: int

    @property
    def format(self) -> quant.BlockFormat:
        return quant.FORMATS[self.type_id]


_U64 = struct.Struct("<Q")

# Metadata keys of borrowed tensors: parallel arrays, one entry per borrowed tensor.
BORROWED_NAMES = "pyspec.borrowed.tensors"
BORROWED_TYPES = "pyspec.borrowed.types"
BORROWED_SHA256 = "pyspec.borrowed.sha256"


@dataclass(frozen=True)
class Borrowed:
    """A tensor a draft reads from its champion's file: its name, ggml type and bytes' sha256."""
    name: str
    type_id: int
    sha256: str


class _Cursor:
    """Bounds-checked little-endian reads over a buffer; `total` is the file's size where the
    buffer holds only its start (header-only mode), else the buffer's own."""

    def __init__(self, buf, source: str, total: int | None = None):
        self.buf = buf
        self.size = len(buf)
        self.total = self.size if total is None else total
        self.pos = 0
        self.source = source

    def fail(self, reason: str, at: int | None = None):
        raise GGUFError(reason, self.pos if at is None else at, self.source)

    def take(self, n: int, what: str) -> memoryview:
        if 0 <= n and self.size < self.pos + n <= self.total:
            raise HeaderIncompleteError(self.pos + n, self.source)
        if n < 0 or self.pos + n > self.size:
            self.fail(f"truncated while reading {what} ({n} bytes needed, "
                      f"{self.size - self.pos} left)")
        out = memoryview(self.buf)[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        start = self.pos
        n = self.scalar("<Q", f"{what} length")
        raw = bytes(self.take(n, what))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} is not valid UTF-8", start)

    def strings(self, n: int, what: str) -> list[str]:
        """n strings in a row (a vocabulary: 49,152 and its merges), sliced in one tight loop and
        decoded in one comprehension (the page parses 98,000 of them on every start). If any is
        truncated or not UTF-8, they are read again one by one by `string`, which says which."""
        buf, start, pos = self.buf, self.pos, self.pos
        length = _U64.unpack_from
        raw = []
        append = raw.append
        try:
            for _ in range(n):
                at = pos + 8
                pos = at + length(buf, pos)[0]
                append(buf[at:pos])
            if pos <= self.size:   # else: read one by one, `take` says where it ends
                self.pos = pos
                return [str(b, "utf-8") for b in raw]
        except (struct.error, OverflowError, UnicodeDecodeError):   # read one by one: the error
            pass
        self.pos = start
        return [self.string(what) for _ in range(n)]   # raises at the bad string

    def count(self, what: str, min_item_bytes: int) -> int:
        """A u64 count, refused when its items could not fit in the rest of the buffer."""
        start = self.pos
        n = self.scalar("<Q", what)
        if n * min_item_bytes > self.total - self.pos:
            self.fail(f"{what} {n} is larger than the file can hold", start)
        return n

    def value(self, vtype: int, what: str, depth: int = 0):
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype], what)
        if vtype == STRING:
            return self.string(what)
        if vtype == ARRAY:
            start = self.pos
            etype = self.scalar("<I", f"{what} element type")
            if etype in _NUMPY:
                n = self.count(f"{what} array length", np.dtype(_NUMPY[etype]).itemsize)
                raw = self.take(n * np.dtype(_NUMPY[etype]).itemsize, what)
                return np.frombuffer(raw, dtype=_NUMPY[etype]).tolist()
            if etype == BOOL:
                n = self.count(f"{what} array length", 1)
                return [b != 0 for b in bytes(self.take(n, what))]
            if etype == STRING:
                n = self.count(f"{what} array length", 8)
                return self.strings(n, what)
            if etype == ARRAY and depth < 2:
                n = self.count(f"{what} array length", 12)
                return [self.value(ARRAY, what, depth + 1) for _ in range(n)]
            self.fail(f"unsupported array element type {etype} in {what}", start)
        self.fail(f"unknown metadata value type {vtype} in {what}")


class GGUFFile:
    """A parsed GGUF file: `metadata` (key -> Python value), `tensors` (name -> TensorInfo).

    Header-only mode (`total_size` given): `buf` holds only the file's first bytes, the tensor
    data is checked against `total_size` and cannot be read; a header longer than `buf` raises
    HeaderIncompleteError with the bytes it needs (the page's model card reads a URL's header
    this way, by HTTP Range requests)."""

    def __init__(self, buf, source: str = "GGUF file", total_size: int | None = None,
                 reader=None, sha256: str | None = None):
        """`reader(offset, nbytes)` -> a bytes-like (with `total_size` and the header in `buf`):
        tensors are read through it (from_reader). `sha256`: the file's, where the caller has
        checked it (the page hashes its weights as they stream), so sha256() reads nothing."""
        self.buf = buf
        self.source = source
        self.reader = reader
        self.header_only = total_size is not None and reader is None
        self._sha256 = sha256
        cur = _Cursor(buf, source, total_size)
        if bytes(cur.take(4, "magic")) != MAGIC:
            cur.fail("bad magic (not a GGUF file)", 0)
        version = cur.scalar("<I", "version")
        if version != VERSION:
            cur.fail(f"unsupported GGUF version {version} (pyspec reads version 3)", 4)
        n_tensors = cur.count("tensor count", 24)
        n_kv = cur.count("metadata count", 12)

        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            start = cur.pos
            key = cur.string("metadata key")
            vtype = cur.scalar("<I", f"type of {key!r}")
            if key in self.metadata:
                cur.fail(f"duplicate metadata key {key!r}", start)
            self.metadata[key] = cur.value(vtype, repr(key))

        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment % 8:
            cur.fail(f"bad general.alignment {alignment!r}")
        self.alignment = alignment

        infos = []
        for _ in range(n_tensors):
            start = cur.pos
            name = cur.string("tensor name")
            n_dims = cur.scalar("<I", f"dims of {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                cur.fail(f"tensor {name!r} has {n_dims} dims (1..{MAX_DIMS} allowed)", start)
            dims = [cur.scalar("<Q", f"dim of {name!r}") for _ in range(n_dims)]
            type_id = cur.scalar("<I", f"type of {name!r}")
            rel = cur.scalar("<Q", f"offset of {name!r}")
            if type_id not in quant.FORMATS:
                raise UnsupportedTypeError(
                    f"tensor {name!r} is {quant.type_name(type_id)} (ggml type {type_id}), a "
                    f"block format pyspec does not read; it reads "
                    f"{', '.join(f.name for f in quant.FORMATS.values())} (a Q4_K_M, Q5_K_M or "
                    "Q8_0 file of the model, from llama-quantize, will do)", start, source)
            fmt = quant.FORMATS[type_id]
            n = 1
            for d in dims:
                if d == 0 or d > 1 << 40:
                    cur.fail(f"tensor {name!r} has an impossible dim {d}", start)
                n *= d
            if dims[0] % fmt.block_elems:
                cur.fail(f"tensor {name!r}: first dim {dims[0]} is not a multiple of the "
                         f"{fmt.name} block size {fmt.block_elems}", start)
            if rel % alignment:
                cur.fail(f"tensor {name!r} data offset {rel} is not {alignment}-aligned", start)
            infos.append((start, name, tuple(reversed(dims)), type_id, rel, fmt.nbytes(n)))

        self.data_offset = -(-cur.pos // alignment) * alignment
        self.size = cur.total   # the file's bytes
        self.tensors: dict[str, TensorInfo] = {}
        for start, name, shape, type_id, rel, nbytes in infos:
            if name in self.tensors:
                cur.fail(f"duplicate tensor {name!r}", start)
            off = self.data_offset + rel
            if off + nbytes > cur.total:
                # Why the file's size as the offset: the message then reads "... the end of
                # the file at byte <size>", true whether the file was cut or the dims are bad
                # (the tensor's entry itself, earlier, is whole).
                raise TruncatedTensorError(f"tensor {name!r} data [{off}, {off + nbytes}) runs "
                                           "past the end of the file", cur.total, source)
            self.tensors[name] = TensorInfo(name, shape, type_id, off, nbytes)
        self.borrowed = self._read_borrowed(cur)
        self._lender: GGUFFile | None = None
        self._tensor_sha256: dict[str, str] = {}

    def _read_borrowed(self, cur: "_Cursor") -> dict[str, Borrowed]:
        md = self.metadata
        names, types, hashes = (md.get(k, []) for k in (BORROWED_NAMES, BORROWED_TYPES,
                                                        BORROWED_SHA256))
        if not (isinstance(names, list) and isinstance(types, list) and isinstance(hashes, list)
                and len(names) == len(types) == len(hashes)):
            cur.fail(f"{BORROWED_NAMES}, {BORROWED_TYPES} and {BORROWED_SHA256} must be arrays "
                     "of one length")
        out = {}
        for name, type_id, sha in zip(names, types, hashes):
            if not (isinstance(name, str) and isinstance(sha, str) and len(sha) == 64
                    and type_id in quant.FORMATS):
                cur.fail(f"malformed borrowed-tensor entry {name!r}")
            if name in self.tensors or name in out:
                cur.fail(f"tensor {name!r} is both held and borrowed")
            out[name] = Borrowed(name, int(type_id), sha)
        return out

    def lend(self, lender: "GGUFFile") -> None:
        """Read the borrowed tensors from `lender`'s buffer from now on. Checks only that it
        holds them; compat.bind_borrowed checks that they are the very bytes (sha256)."""
        missing = [n for n in self.borrowed if n not in lender.tensors]
        if missing:
            raise GGUFError(f"borrows {', '.join(missing)} from its champion, and "
                            f"{lender.source} has no such tensor", None, self.source)
        self._lender = lender

    @classmethod
    def from_reader(cls, reader, total_size: int, source: str = "GGUF file",
                    sha256: str | None = None, first: int = 1 << 20) -> "GGUFFile":
        """A file of `total_size` bytes read through `reader(offset, nbytes)`: its header read
        first (`first` bytes, more where it runs on), its tensors each when asked (raw), so no
        more than one tensor's bytes are held at a time."""
        n = min(first, total_size)
        while True:
            try:
                return cls(reader(0, n), source, total_size, reader, sha256)
            except HeaderIncompleteError as e:
                n = min(max(e.needed, 2 * n), total_size)

    @classmethod
    def open(cls, path: str | os.PathLike) -> "GGUFFile":
        """Memory-map a file (read-only); raises GGUFError for missing or unreadable files."""
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        except FileNotFoundError as e:   # the path, not the file: no advice about its bytes
            raise GGUFError(NO_SUCH_FILE, None, os.fspath(path),
                            None) from e
        except IsADirectoryError as e:
            raise GGUFError("is a folder, not a GGUF file; name the model's .gguf file", None,
                            os.fspath(path), None) from e
        except OSError as e:
            raise GGUFError(f"cannot read the file ({e.strerror}); check that it is a file you "
                            "may read", None, os.fspath(path), None) from e
        return cls(buf, os.path.basename(os.fspath(path)))

    def raw(self, name: str, rows: tuple[int, int] | None = None) -> np.ndarray:
        """Zero-copy uint8 view of a tensor's bytes (a borrowed one's in its lender's buffer);
        `rows` (a, b): only rows [a, b) of a matrix (a tensor streamed a part at a time).
        A K-quant tensor is checked first: a non-finite super-block scale raises
        NonFiniteScaleError (it would make every value of its 256 NaN or infinite)."""
        t = self.tensor(name)
        owner = self if name in self.tensors else self._lender
        start, nbytes = t.offset, t.nbytes
        if rows is not None:
            row_bytes = t.nbytes // t.shape[0]
            start, nbytes = t.offset + rows[0] * row_bytes, (rows[1] - rows[0]) * row_bytes
        raw = np.frombuffer(owner.read(start, nbytes), dtype=np.uint8)
        bad = quant.first_bad_scale(raw, t.type_id)
        if bad is not None:
            at = start + bad * t.format.block_bytes
            raise NonFiniteScaleError(f"tensor {name!r} ({t.format.name}): super-block {bad} has "
                                      "a NaN or infinite scale (d or dmin)", at, self.source)
        return raw

    def read(self, offset: int, nbytes: int):
        """The file's bytes [offset, offset + nbytes): a view of the buffer, or the reader's."""
        if self.header_only:
            raise GGUFError(f"bytes [{offset}, {offset + nbytes}): only the header was read",
                            None, self.source, "Open the whole file to read tensors.")
        if self.reader is not None:
            data = self.reader(offset, nbytes)
            if len(data) != nbytes:
                raise TruncatedTensorError(f"{len(data)} bytes read at {offset}, {nbytes} "
                                           "asked (the file changed or was cut)", offset,
                                           self.source)
            return data
        return memoryview(self.buf)[offset:offset + nbytes]

    def tensor(self, name: str) -> TensorInfo:
        if name in self.tensors:
            return self.tensors[name]
        if name in self.borrowed:
            if self._lender is None:
                raise GGUFError(f"tensor {name!r} is borrowed from the champion this draft was "
                                "trained beside: load the file as a draft with that champion "
                                "(draft PATH), not on its own", None, self.source)
            return self._lender.tensors[name]
        raise GGUFError(f"tensor {name!r} is missing", None, self.source)

    def has(self, name: str) -> bool:
        """Whether the file holds or borrows tensor `name`."""
        return name in self.tensors or name in self.borrowed

    def dequantize(self, name: str) -> np.ndarray:
        """A tensor as float32 in numpy order (shape = GGUF dims reversed)."""
        t = self.tensor(name)
        return quant.dequantize(self.raw(name), t.type_id, t.shape)

    def tensor_sha256(self, name: str) -> str:
        """The sha256 of a tensor's bytes (computed once per file object)."""
        if name not in self._tensor_sha256:
            self._tensor_sha256[name] = hashlib.sha256(self.raw(name)).hexdigest()
        return self._tensor_sha256[name]

    def sha256(self) -> str:
        """The sha256 of the file's bytes (computed once, or given where the caller checked it)."""
        if self._sha256 is None:
            h = hashlib.sha256()
            for i in range(0, self.size, 1 << 24):
                h.update(self.read(i, min(1 << 24, self.size - i)))
            self._sha256 = h.hexdigest()
        return self._sha256
