"""Weights on the GPU: `Weight` (a tensor uploaded in the GPU layout of its GGUF block format,
alone or fused: gate+up pairs, Q/K/V stacks), `RowParts` (a table larger than one binding,
as parts of whole rows), and the upload that streams a tensor from its file a part at a time
(stream_rows, upload_rows).

Blocks stay quantized: the layout per GGUF type is shaders/blocks.wgsl's (a few formats get
two zero bytes per block to be u32-aligned). Not here: the kernels that read them (ops.py),
which tensors a model uploads and how it fuses them (model.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..formats import quant
from ..formats.gguf import GGUFFile
from .device import ShapeError


# GPU layout per GGUF type (shaders/blocks.wgsl): the kind names the matmul_<kind> and
# embed_<kind> entry points. Blocks whose size is not a multiple of 4 bytes get 2 zero bytes at
# _PADS' offset so that they are u32-aligned: Q4_0 18 -> 20, Q8_0 34 -> 36 and Q5_0 22 -> 24
# after their f16 d, Q6_K 210 -> 212 at the end; the values stay in their block format. F16
# (tiny test models) is widened to f32, and so are BF16 vectors (norms); BF16 matrices stay BF16.
_KINDS = {quant.Q4_0.type_id: "q4_0", quant.Q4_1.type_id: "q4_1", quant.Q8_0.type_id: "q8_0",
          quant.Q5_0.type_id: "q5_0", quant.Q5_1.type_id: "q5_1", quant.Q4_K.type_id: "q4_k",
          quant.Q5_K.type_id: "q5_k", quant.Q6_K.type_id: "q6_k", quant.BF16.type_id: "bf16",
          quant.F32.type_id: "f32", quant.F16.type_id: "f32"}
_PADS = {quant.Q4_0.type_id: 2, quant.Q8_0.type_id: 2, quant.Q5_0.type_id: 2,
         quant.Q6_K.type_id: 210}
DENSE = ("f32", "bf16")   # kinds read 4 values at a time (n_in % 4 == 0), not in blocks
# A Q, K, V stack may hold V in another format than Q and K, as K-quant mixes do (formats/mixes.py:
# attn_v in Q6_K on some layers, Q8_0 where the width falls back): matmul_io.wgsl's params.v_kind.
MIXED_V = {"q5_0": ("q8_0",), "q5_1": ("q8_0",), "q4_k": ("q6_k", "q8_0"),
           "q5_k": ("q6_k", "q8_0")}


def repack(raw: np.ndarray, fmt: quant.BlockFormat, at: int) -> np.ndarray:
    """Blocks of `fmt` (n_blocks * block_bytes,) -> (n_blocks, block_bytes + 2) uint8, with two
    zero bytes inserted at byte `at` of each block."""
    blocks = np.asarray(raw, np.uint8).reshape(-1, fmt.block_bytes)
    out = np.zeros((blocks.shape[0], fmt.block_bytes + 2), np.uint8)
    out[:, :at] = blocks[:, :at]
    out[:, at + 2:] = blocks[:, at:]
    return out


@dataclass(frozen=True)
class Weight:
    """A tensor on the GPU: `kind` one of _KINDS' ('q4_k', 'f32', ...), `shape` (n_out, n_in)
    or (n,). A Q, K, V stack whose last `v_rows` rows (V) are in another format `v_kind` has
    them from word `v_at` of the buffer (upload_stack)."""
    buffer: object
    kind: str
    shape: tuple[int, ...]
    name: str = ""
    v_kind: str = ""
    v_rows: int = 0
    v_at: int = 0

    @classmethod
    def upload(cls, dev, f: GGUFFile, name: str) -> "Weight":
        """Upload tensor `name` of a GGUF file, STREAM_BYTES of it at a time (stream_rows)."""
        t = f.tensor(name)
        kind, shape = _gpu_kind(t), tuple(t.shape)
        _check_binding(dev, name, gpu_nbytes(t))
        return cls(stream_rows(dev, f, name, 0, shape[0], name), kind, shape, name)

    @staticmethod
    def host_bytes(f: GGUFFile, name: str) -> tuple[np.ndarray, str, tuple]:
        """(the bytes the GPU gets, kind, shape) of tensor `name`, whole on the host (the parts of
        a fused weight, which are stacked there)."""
        t = f.tensor(name)
        kind = _gpu_kind(t)
        return _gpu_bytes(f.raw(name), t, len(t.shape)), kind, tuple(t.shape)

    @classmethod
    def upload_pair(cls, dev, f: GGUFFile, gate: str, up: str) -> "Weight":
        """Two matrices of one type and shape as one, their rows interleaved (gate row i, then
        up row i): the weight of matmul(silu_gate=True), whose output pairs are (g_i, u_i).
        Rows are whole blocks, so interleaving moves bytes and changes no value."""
        a, b = (cls.host_bytes(f, n) for n in (gate, up))
        if a[1:] != b[1:]:
            raise ShapeError(f"{gate!r} and {up!r} differ in type or shape; they cannot be paired")
        (da, kind, shape), db = a, b[0]
        rows = np.stack([da.reshape(shape[0], -1), db.reshape(shape[0], -1)], axis=1)
        data = rows.reshape(2 * shape[0], -1)                       # (2 n_out, row bytes)
        _check_binding(dev, f"{gate}+{up}", data.nbytes)
        return cls(dev.upload(data, label=f"{gate}+{up}"), kind, (2 * shape[0], shape[1]),
                   f"{gate}+{up}")

    @classmethod
    def upload_stack(cls, dev, f: GGUFFile, names: list[str], orders=None) -> "Weight":
        """Matrices of one width as one, rows of the first, then the second, ...: the weight of
        matmul(qkv=...), names = (Q, K, V). Rows are whole blocks, so stacking changes no value.
        All of one type, or V alone in another where MIXED_V allows it (a K-quant mix).
        `orders`: per matrix, None or the order to take its rows in (model.py's NEOX rows)."""
        parts = [cls.host_bytes(f, n) for n in names]
        kind, n_in = parts[0][1], parts[0][2][1]
        v_kind = parts[-1][1] if parts[-1][1] in MIXED_V.get(kind, ()) else ""
        if any(p[1] not in (kind, v_kind) or len(p[2]) != 2 or p[2][1] != n_in for p in parts) \
                or any(p[1] != kind for p in parts[:-1]):
            raise ShapeError(f"{names} differ in type or width; they cannot be stacked")
        rows = [p[0].reshape(p[2][0], -1) for p in parts]              # (n_out_i, row words)
        rows = [r if o is None else r[o] for r, o in zip(rows, orders or [None] * len(rows))]
        data = np.concatenate([np.ascontiguousarray(r).view(np.uint8).reshape(-1)
                               for r in rows])                          # the rows' bytes
        name = "+".join(names)
        _check_binding(dev, name, data.nbytes)
        n_out = sum(p[2][0] for p in parts)
        mixed = dict(v_kind=v_kind, v_rows=parts[-1][2][0],
                     v_at=(data.nbytes - parts[-1][0].nbytes) // 4) if v_kind else {}
        return cls(dev.upload(data, label=name), kind, (n_out, n_in), name, **mixed)

    @classmethod
    def vector(cls, dev, values: np.ndarray, name: str) -> "Weight":
        """An f32 vector made on the host (model.py's stacked biases and Q/K norm pair)."""
        data = np.ascontiguousarray(values, np.float32).reshape(-1)   # (n,)
        return cls(dev.upload(data, label=name), "f32", data.shape, name)

    @property
    def nbytes(self) -> int:
        """Bytes of the GPU copy."""
        if self.v_kind:
            return self.v_at * 4 + _kind_bytes(self.v_kind, self.v_rows * self.shape[1])
        return _kind_bytes(self.kind, int(np.prod(self.shape)))


def _gpu_kind(t) -> str:
    """The GPU kind of a tensor (a gguf.TensorInfo): _KINDS', F16 and BF16 vectors widened."""
    if len(t.shape) not in (1, 2):
        raise ShapeError(f"tensor {t.name!r} has shape {t.shape}; expected a matrix or vector")
    kind = _KINDS[t.type_id]   # every format quant.py reads (gguf.py refuses the rest)
    return "f32" if kind == "bf16" and len(t.shape) == 1 else kind


def _gpu_bytes(raw: np.ndarray, t, dims: int) -> np.ndarray:
    """The bytes the GPU gets for `raw`, whole rows of tensor `t`: blocks padded (_PADS), F16
    and BF16 vectors widened to f32; the rest as is (blocks of 20, 24, 144 or 176 bytes, F32 and
    BF16 are u32-aligned)."""
    if t.type_id in _PADS:
        return repack(raw, t.format, _PADS[t.type_id])
    if t.type_id == quant.F16.type_id or (t.type_id == quant.BF16.type_id and dims == 1):
        n_in = t.shape[-1]
        return quant.dequantize(raw, t.type_id, (raw.size // (t.nbytes // t.shape[0]), n_in)
                                if dims == 2 else t.shape)
    return raw


# A tensor goes to its buffer this many bytes of the file at a time (stream_rows): with the
# page's weights read from OPFS as they go, the host holds one such part, never the tensor.
STREAM_BYTES = 4 << 20


def stream_rows(dev, f: GGUFFile, name: str, a: int, b: int, label: str):
    """A buffer holding rows [a, b) of tensor `name` (all of a vector) as the GPU takes them,
    read from the file and written STREAM_BYTES of the file at a time."""
    t = f.tensor(name)
    if len(t.shape) == 1:
        return dev.upload(_gpu_bytes(f.raw(name), t, 1), label=label)
    row = gpu_nbytes(t) // t.shape[0]                      # GPU bytes per row
    buf = dev.buffer((b - a) * row, "storage", label)
    step = max(1, STREAM_BYTES // (t.nbytes // t.shape[0]))
    for r in range(a, b, step):
        part = _gpu_bytes(f.raw(name, (r, min(r + step, b))), t, 2)
        dev.write(buf, np.ascontiguousarray(part).view(np.uint8).reshape(-1), (r - a) * row)
    return buf


def gpu_nbytes(t) -> int:
    """Bytes of a tensor (a gguf.TensorInfo) uploaded alone: its blocks padded, F16 widened."""
    kind = _KINDS[t.type_id]
    return _kind_bytes("f32" if kind == "bf16" and len(t.shape) == 1 else kind,
                       int(np.prod(t.shape)))


def _kind_bytes(kind: str, n: int) -> int:
    """Bytes of n values of a kind on the GPU."""
    if kind in DENSE:
        return n * (4 if kind == "f32" else 2)
    fmt = quant.BY_NAME[kind.upper()]
    return n // fmt.block_elems * (fmt.block_bytes + (2 if fmt.type_id in _PADS else 0))


# A part's first row of a table split by rows is a multiple of this, so that the logits columns
# a head part writes start at a multiple of 256 bytes: WebGPU's largest
# minStorageBufferOffsetAlignment (a device may ask less, none more).
PART_ROWS = 64


@dataclass(frozen=True)
class RowParts:
    """A (rows, n_in) table larger than one storage binding (a 262,144-token vocabulary's
    embedding or head on a device that binds 128 MiB), as parts of whole rows, each a Weight:
    `parts` ((first row, Weight), ...). ops.embed and matmul take a part at a time."""
    parts: tuple
    kind: str
    shape: tuple[int, ...]
    name: str

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for _, w in self.parts)


def upload_rows(dev, f: GGUFFile, name: str) -> "Weight | RowParts":
    """Tensor `name` (rows, n_in) as one Weight where it fits one binding, else as RowParts of
    as few parts as fit, their rows balanced and their first rows multiples of PART_ROWS; each
    streamed to its buffer (stream_rows)."""
    t = f.tensor(name)
    kind, shape, nbytes = _gpu_kind(t), tuple(t.shape), gpu_nbytes(t)
    limit = min(getattr(dev, "limits", {}).get(k, nbytes)
                for k in ("max-storage-buffer-binding-size", "max-buffer-size"))
    if nbytes <= limit:
        return Weight(stream_rows(dev, f, name, 0, shape[0], name), kind, shape, name)
    fit = limit // (nbytes // shape[0]) // PART_ROWS * PART_ROWS if len(shape) == 2 else 0
    if fit < PART_ROWS:
        raise ShapeError(f"tensor {name!r} needs {nbytes} bytes on the GPU, and this device "
                         f"binds at most {limit} per buffer, less than {PART_ROWS} of its rows")
    n_parts = -(-shape[0] // fit)
    per = -(-(-(-shape[0] // n_parts)) // PART_ROWS) * PART_ROWS   # balanced, still <= fit
    parts = []
    for a in range(0, shape[0], per):
        b = min(a + per, shape[0])
        label = f"{name}[{a}:{b}]"
        parts.append((a, Weight(stream_rows(dev, f, name, a, b, label), kind,
                                (b - a, shape[1]), label)))
    return RowParts(tuple(parts), kind, shape, name)


def _check_binding(dev, name: str, nbytes: int) -> None:
    limit = getattr(dev, "limits", {}).get("max-storage-buffer-binding-size")
    if limit is not None and nbytes > limit:
        raise ShapeError(f"tensor {name!r} needs {nbytes} bytes on the GPU; this device binds at "
                         f"most {limit} per buffer")
