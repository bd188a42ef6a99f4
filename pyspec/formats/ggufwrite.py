"""GGUF v3 writer: `write` a file from metadata and tensors, `RawTensor` for bytes copied as
they are, `borrowed_metadata` for a draft that borrows its champion's tensors.

It exists to make small test models and drafts (testmodels.py, tests, scripts, train/) and
writes the layout gguf.py reads (spec: github.com/ggml-org/ggml/blob/master/docs/gguf.md),
refusing what the reader would refuse rather than write an unreadable file. Not here: the
reader, the container's constants and errors (gguf.py), quantization (quant.py).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import quant
from .gguf import (ARRAY, BOOL, BORROWED_NAMES, BORROWED_SHA256, BORROWED_TYPES,
                   DEFAULT_ALIGNMENT, FLOAT32, INT32, INT64, MAGIC, MAX_DIMS, STRING, UINT32,
                   UINT64, VERSION, GGUFFile)


def _pack_string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _pack_value(v) -> tuple[int, bytes]:
    """Python value -> (GGUF type, bytes). ints become INT32/UINT64/INT64 by range, floats FLOAT32;
    a numpy uint32 stays UINT32 (the type llama.cpp's loader insists on for counts and lengths)."""
    if isinstance(v, bool):
        return BOOL, struct.pack("<?", v)
    if isinstance(v, np.uint32):
        return UINT32, struct.pack("<I", int(v))
    if isinstance(v, int):
        if -(1 << 31) <= v < (1 << 31):
            return INT32, struct.pack("<i", v)
        return (UINT64, struct.pack("<Q", v)) if v >= 0 else (INT64, struct.pack("<q", v))
    if isinstance(v, float):
        return FLOAT32, struct.pack("<f", v)
    if isinstance(v, str):
        return STRING, _pack_string(v)
    if isinstance(v, (list, tuple)):
        items = [_pack_value(x) for x in v]
        etype = items[0][0] if items else INT32
        if any(t != etype for t, _ in items):
            raise TypeError("GGUF arrays must hold one type")
        return ARRAY, struct.pack("<IQ", etype, len(items)) + b"".join(b for _, b in items)
    raise TypeError(f"cannot store {type(v).__name__} in GGUF metadata")


@dataclass(frozen=True)
class RawTensor:
    """Tensor bytes written as they are (already in `type_id`'s blocks), e.g. copied from
    another file with GGUFFile.raw."""
    data: np.ndarray     # uint8
    shape: tuple         # numpy order
    type_id: int


def borrowed_metadata(lender: GGUFFile, names: list[str]) -> dict[str, list]:
    """The metadata that makes a file borrow tensors `names` from `lender` (its champion)."""
    infos = [lender.tensor(n) for n in names]
    return {BORROWED_NAMES: list(names),
            BORROWED_TYPES: [t.type_id for t in infos],
            BORROWED_SHA256: [lender.tensor_sha256(n) for n in names]}


def write(path: str | os.PathLike, metadata: dict[str, Any],
          tensors: dict[str, tuple[np.ndarray, int] | RawTensor],
          alignment: int | None = None) -> None:
    """Write a GGUF v3 file. `tensors` maps name -> (float values in numpy order, ggml type id),
    values quantized with quant.quantize, or -> a RawTensor, written byte for byte. `alignment`
    defaults to metadata's general.alignment, else 32; any other value is stored as
    general.alignment so that readers find the data (as UINT32: the spec's type, which the gguf
    package insists on)."""
    md_alignment = metadata.get("general.alignment")
    if alignment is None:
        alignment = DEFAULT_ALIGNMENT if md_alignment is None else md_alignment
    elif md_alignment is not None and md_alignment != alignment:
        raise ValueError(f"alignment={alignment} disagrees with general.alignment={md_alignment}")
    if type(alignment) is not int or alignment <= 0 or alignment % 8:
        raise ValueError(f"alignment must be a positive multiple of 8, got {alignment!r}")
    if alignment != DEFAULT_ALIGNMENT:
        metadata = {**metadata, "general.alignment": alignment}
    head = [MAGIC, struct.pack("<IQQ", VERSION, len(tensors), len(metadata))]
    for key, v in metadata.items():
        vtype, blob = ((UINT32, struct.pack("<I", v)) if key == "general.alignment"
                       else _pack_value(v))
        head += [_pack_string(key), struct.pack("<I", vtype), blob]
    blobs, rel = [], 0
    for name, spec in tensors.items():
        if isinstance(spec, RawTensor):
            shape, type_id = tuple(spec.shape), spec.type_id
        else:
            values, type_id = np.asarray(spec[0]), spec[1]
            shape = values.shape
        dims = tuple(reversed(shape))
        # Why: refuse here what the reader would refuse, rather than write an unreadable file.
        if type_id not in quant.FORMATS:
            raise ValueError(f"tensor {name!r}: unsupported ggml type {type_id}")
        fmt = quant.FORMATS[type_id]
        if not 1 <= len(dims) <= MAX_DIMS or 0 in dims or dims[0] % fmt.block_elems:
            raise ValueError(f"tensor {name!r}: shape {shape} cannot be stored as "
                             f"{fmt.name} (1..{MAX_DIMS} non-empty dims, the last a multiple "
                             f"of {fmt.block_elems})")
        head += [_pack_string(name), struct.pack("<I", len(dims)),
                 struct.pack(f"<{len(dims)}Q", *dims), struct.pack("<IQ", type_id, rel)]
        if isinstance(spec, RawTensor):
            blob = np.asarray(spec.data, dtype=np.uint8).tobytes()
            n = int(np.prod(shape))
            if len(blob) != fmt.nbytes(n):
                raise ValueError(f"tensor {name!r}: {len(blob)} bytes, but {shape} as "
                                 f"{fmt.name} takes {fmt.nbytes(n)}")
        else:
            blob = quant.quantize(values, type_id).tobytes()
        pad = -len(blob) % alignment
        blobs.append(blob + b"\0" * pad)
        rel += len(blob) + pad
    header = b"".join(head)
    header += b"\0" * (-len(header) % alignment)
    with open(path, "wb") as f:
        f.write(header)
        for b in blobs:
            f.write(b)
