"""Weights kept in their block format on the fast CPU engine (fastcpu.py), dequantized a chunk of
rows at a time, for a model whose float32 weights do not fit the memory budget.

A `BlockMatrix` keeps a (n_out, n_in) weight as its block format's parts (formats/quant.affine:
integer codes, a float32 scale and offset per group of 32 values, 16 for Q6_K) in chunks of
`rows` rows. `chunk(c, out)` writes chunk c's float32 rows into a scratch buffer, which the row
product (fastcpu.rows_product) reads before the next chunk overwrites it; `rows` is the
product's block of rows (fastcpu.BLOCK_ROWS), so each matrix-vector call is the float32 mode's.
The values are bit for bit the float32 weights': the same parts and the same `scale_in_place`
that quant.dequantize runs, each group on its own (tests/test_fastcpu_blocks.py: logits
bit-identical to float32 mode on tiny models of every format).

Layout, for speed: numpy pays per call and per broadcast group, so a chunk's codes unpack by
whole-array operations. 4-bit codes (Q4_0, Q4_1, Q4_K) go two a byte, the first half of the
chunk's values in the low nibbles, the second half in the high ones; other codes one byte each;
F16 and BF16 keep their own bytes (dequantize casts a chunk). Bytes a parameter: Q4_0 0.625,
Q4_1 and Q4_K 0.75, Q5_0 and Q8_0 1.125, Q5_1, Q5_K and Q6_K 1.25, F16 and BF16 2 (float32: 4).

Which mode (`weights_mode`): float32 where 4 bytes a parameter fit `float32_budget` (natively
HOST_FRACTION of the machine's memory; in the page the wasm heap less the runtime and the file,
which the worker holds there), else blocks. Its speed, measured against float32 on the champion
and the Qwen3-0.6B shape: docs/cpu-engine.md (bench/results/cpu-blocks.json).
Not here: the product loop (fastcpu.py), the model card's rule (apps/info.py uses this one).
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

from ..formats import kquant, quant
from ..formats.quant import BlockFormat

# The least code of each 4-bit format, subtracted before packing two codes a byte.
NIBBLES = {"Q4_0": -8, "Q4_1": 0, "Q4_K": 0}
PLAIN = ("F16", "BF16")   # kept as their own bytes

# Pyodide, numpy and pyspec in the wasm heap before any weight (measured: 778 MB after loading
# the 135M champion, whose float32 weights and cache take about 600 MB; README "CPU engine").
PAGE_RUNTIME_BYTES = 300 << 20
WASM_HEAP_BYTES = 4 << 30
# Natively, float32 weights may take this share of the machine's memory; the rest is the cache's,
# the file's page cache and everything else the machine runs.
HOST_FRACTION = 0.5


def memory_host() -> int | None:
    """Bytes of memory on this machine, where the OS says (None in the page)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def in_page() -> bool:
    """Whether this is Pyodide in the page (its heap is the limit, not the machine's memory)."""
    return sys.platform == "emscripten"


def float32_budget(file_bytes: int, page: bool | None = None) -> int | None:
    """Bytes float32 weights may take: in the page (default: when running there) the wasm heap
    less the runtime and the file; natively HOST_FRACTION of this machine's memory (None where
    unknown: no limit)."""
    if in_page() if page is None else page:
        return WASM_HEAP_BYTES - PAGE_RUNTIME_BYTES - file_bytes
    host = memory_host()
    return None if host is None else int(HOST_FRACTION * host)


def weights_mode(n_params: int, budget: int | None) -> str:
    """"float32" where 4 bytes a parameter fit `budget`, else "blocks"."""
    return "float32" if budget is None or 4 * n_params <= budget else "blocks"


def packed_bytes(fmt: BlockFormat, n_elems: int) -> int:
    """Bytes a tensor of `n_elems` values in `fmt` takes in block mode (the module docstring);
    an F32 tensor stays float32. For the model card, from the header alone."""
    if fmt is quant.F32 or fmt.name in PLAIN:
        return fmt.nbytes(n_elems)
    group = 16 if fmt is quant.Q6_K else 32
    code = 0.5 if fmt.name in NIBBLES else 1
    offsets = 2 if fmt in (quant.Q4_1, quant.Q5_1, quant.Q4_K, quant.Q5_K) else 1
    return math.ceil(n_elems * code) + n_elems // group * 4 * offsets


class BlockMatrix:
    """A (n_out, n_in) weight kept as its block format's parts, in chunks of `rows` rows."""

    dtype = np.dtype(np.float32)   # its values'

    def __init__(self, raw: np.ndarray, fmt: BlockFormat, shape: tuple[int, int], rows: int):
        """raw: the tensor's bytes (uint8), in the GGUF's row order."""
        self.fmt, self.shape, self.rows = fmt, tuple(shape), rows
        n_out = shape[0]
        by_row = raw.reshape(n_out, -1)                                     # (n_out, row bytes)
        self._parts = [self._pack(by_row[a:a + rows]) for a in range(0, n_out, rows)]
        self.nbytes = sum(p.codes.nbytes + p.scale.nbytes
                          + (0 if p.offset is None else p.offset.nbytes) for p in self._parts)
        self._own = None   # __getitem__'s scratch

    def _pack(self, raw: np.ndarray) -> kquant.Affine:
        """A chunk's bytes (rows, row bytes) -> its parts, 4-bit codes packed (module docstring);
        F16 / BF16: the bytes themselves as codes, no scale."""
        fmt = self.fmt
        if fmt.name in PLAIN:
            return kquant.Affine(np.ascontiguousarray(raw).reshape(-1), np.empty(0, np.float32),
                                 None)
        a = quant.affine(np.ascontiguousarray(raw).reshape(-1, fmt.block_bytes), fmt)
        codes = a.codes.reshape(-1)
        if fmt.name in NIBBLES:
            c = (codes - NIBBLES[fmt.name]).astype(np.uint8)              # 0..15
            half = c.size // 2
            codes = c[:half] | (c[half:] << 4)                              # (values / 2,)
        return a._replace(codes=np.ascontiguousarray(codes))

    @property
    def n_chunks(self) -> int:
        return len(self._parts)

    def scratch(self) -> tuple[np.ndarray, np.ndarray]:
        """New buffers for `chunk`: (values float32, nibbles uint8), flat."""
        n = self.rows * self.shape[1]
        return np.empty(n, np.float32), np.empty(n // 2, np.uint8)

    def chunk(self, c: int, out: np.ndarray, nibbles: np.ndarray) -> np.ndarray:
        """Chunk c's rows as float32 (<= rows, n_in), written into `out` (a flat float32 buffer
        of at least rows * n_in values; `nibbles` a uint8 one of half that) and returned as a
        view of `out`."""
        p, n_in = self._parts[c], self.shape[1]
        n = min(self.rows, self.shape[0] - c * self.rows) * n_in
        flat = out[:n]
        if self.fmt.name in PLAIN:
            flat[:] = quant.dequantize(p.codes, self.fmt.type_id, (n,))
            return flat.reshape(-1, n_in)
        if self.fmt.name in NIBBLES:   # uint8 first: a ufunc casting into float32 is 3x slower
            half, low = n // 2, nibbles[:n // 2]
            np.bitwise_and(p.codes, 15, out=low)
            flat[:half] = low
            np.right_shift(p.codes, 4, out=low)
            flat[half:] = low
            if NIBBLES[self.fmt.name]:
                flat += np.float32(NIBBLES[self.fmt.name])   # small integers: exact
        else:
            flat[:] = p.codes
        kquant.scale_in_place(flat.reshape(p.scale.size, -1), p, expand=True)
        return flat.reshape(-1, n_in)

    def __getitem__(self, ids) -> np.ndarray:
        """Rows `ids` (k,) as float32 (k, n_in): the embedding's lookup, a chunk per row."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if self._own is None:
            self._own = self.scratch()
        out = np.empty((ids.size, self.shape[1]), np.float32)
        for c in np.unique(ids // self.rows):
            rows = self.chunk(int(c), *self._own)
            here = ids // self.rows == c
            out[here] = rows[ids[here] - c * self.rows]
        return out
