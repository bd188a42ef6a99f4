"""The fast CPU engine: model.py's forward with every matrix product computed one row at a time.

model.py keeps batch invariance by zero-padded tiles of 8 rows, so a one-token pass pays for 8
rows. Here each row of a product is its own matrix-vector product, made by the same call on the
same shapes whatever the pass carries, so row i of a pass over m tokens is bit-identical to a
one-token pass by construction (tests/test_fastcpu.py), and a one-token pass costs one row. The
kernel is chosen per numpy build (`choose_kernel`), once, never per call:

  - "blas": `np.matmul(w, x_row)`, BLAS sgemv, where numpy has a BLAS (CPython from PyPI: its
    OpenBLAS). Run on one OpenBLAS thread (`one_blas_thread`): on the 2 shared cores the default
    two threads made a (1536, 576) product 50x slower under load (docs/cpu-engine.md).
  - "einsum": `np.einsum("oi,i->o", w, x_row)`, where numpy has no BLAS (Pyodide): its matmul
    falls back to a plain loop that einsum's unrolled dot product beats 2.5x in wasm
    (docs/cpu-engine.md).

The row is copied into a 64-byte-aligned buffer first, so a kernel that branches on alignment
sees the same alignment for every row. Everything else (norms, RoPE, attention, the cache) is
model.Model's, but for RoPE's cos / sin, kept in tables: attention there already runs row by row.

Measured and not taken (docs/cpu-engine.md): scipy's OpenBLAS sgemm in Pyodide (no faster than
numpy's own loop, 2.7 s to import), a fixed 8-row sgemm tile natively (a one-row pass costs ~8 rows),
block-format weights dequantized a block of rows at a time for models over the memory budget
(memory.py: such models are refused instead).
Not here: the reference forward and its tiles (model.py), the executor's cycle (cpu.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import math
import os

import numpy as np

from ..errors import UsageError
from ..formats.gguf import GGUFFile
from . import memory
from .model import Model

KERNELS = ("blas", "einsum")


def numpy_has_blas() -> bool:
    """Whether this numpy was built with a BLAS (Pyodide's is not)."""
    try:
        return bool(np.show_config(mode="dicts")["Build Dependencies"]["blas"].get("found"))
    except Exception:   # noqa: BLE001 - an older numpy without the dict form: assume not
        return False


def choose_kernel() -> str:
    """The row kernel for this numpy: "blas" where it has a BLAS, else "einsum";
    PYSPEC_CPU_KERNEL overrides (tests run the page's kernel in CPython with it)."""
    forced = os.environ.get("PYSPEC_CPU_KERNEL")
    if forced:
        if forced not in KERNELS:
            raise UsageError(f"PYSPEC_CPU_KERNEL={forced!r} is not a row kernel: set it to one "
                             f"of {KERNELS}, or unset it for this numpy's own choice")
        return forced
    return "blas" if numpy_has_blas() else "einsum"


# --- OpenBLAS threads ---------------------------------------------------------------------------
def _openblas_threads():
    """(get, set) of numpy's bundled OpenBLAS thread count, or None where there is none to find
    (Pyodide, a system numpy): then the BLAS's own setting stands."""
    libs = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    for path in glob.glob(os.path.join(libs, "libscipy_openblas*.so")):
        lib = ctypes.CDLL(path)   # the library numpy already loaded: same handle
        for suffix in ("64_", ""):
            get = getattr(lib, f"scipy_openblas_get_num_threads{suffix}", None)
            put = getattr(lib, f"scipy_openblas_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                put.argtypes = [ctypes.c_int]
                return get, put
    return None


_THREADS = _openblas_threads() if numpy_has_blas() else None


@contextlib.contextmanager
def one_blas_thread():
    """OpenBLAS on one thread for the body. A row's result does not depend on it (each output
    of a sgemv is one dot product, made by one thread); the speed does."""
    if _THREADS is None:
        yield
        return
    get, put = _THREADS
    before = get()
    put(1)
    try:
        yield
    finally:
        put(before)


# --- the row product ----------------------------------------------------------------------------
def _aligned(n: int, dtype) -> np.ndarray:
    """An uninitialised (n,) array whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    raw = np.empty(n + 64 // dtype.itemsize, dtype)
    skip = (-raw.__array_interface__["data"][0] % 64) // dtype.itemsize
    return raw[skip:skip + n]


# Rows of w per call, per kernel; fixed per kernel and matrix shape, so every row still sees the
# same calls. "blas": 256 rows, a (256, 576) float32 block is 0.6 MB and (256, 1536) 1.6 MB, so a
# block stays in a core's L2 cache while every row of a verify pass reads it. On this 2-core VM a
# pass over 5 rows of the champion then costs 1.92 one-row passes instead of 2.77 with blocks of
# 4,096 (up to 9 MB, L3), over 8 rows 2.46 instead of 3.91, one row the same
# (bench/results/cpu-rows.json (legacy), experiments/bench_cpu_rows.py).
# "einsum" (Pyodide, bound by arithmetic, not by loads): 4,096, fewer calls.
BLOCK_ROWS = {"blas": 256, "einsum": 4096}


def rows_product(x: np.ndarray, w: np.ndarray, kernel: str, row: np.ndarray) -> np.ndarray:
    """x (m, n_in) @ w.T for w (n_out, n_in) -> (m, n_out), one matrix-vector product per row
    and block of BLOCK_ROWS[kernel] rows of w, each row fed through `row` (an aligned (n_in,)
    buffer): the same calls, on the same shapes, for every row whatever m is."""
    m, n_out = x.shape[0], w.shape[0]
    out = np.empty((m, n_out), x.dtype)                                    # (m, n_out)
    block = BLOCK_ROWS[kernel]
    for b in range(0, n_out, block):
        wb = w[b:b + block]                                                # (<= block, n_in)
        for i in range(m):
            row[:] = x[i]
            if kernel == "blas":
                np.matmul(wb, row, out=out[i, b:b + block])
            else:
                np.einsum("oi,i->o", wb, row, out=out[i, b:b + block])
    return out


class FastModel(Model):
    """model.Model with row-at-a-time products (the forward, cache and weights are Model's:
    float32, dequantized once at load, in the GGUF's (n_out, n_in) layout). A model whose float32
    weights exceed the memory budget is refused first, naming the largest that fits (memory.py)."""

    def __init__(self, f: GGUFFile, kernel: str | None = None):
        memory.check_fits(sum(math.prod(t.shape) for t in f.tensors.values()), f.source)
        super().__init__(f, np.float32)
        self.kernel = kernel or choose_kernel()
        if self.kernel not in KERNELS:
            raise UsageError(f"kernel {self.kernel!r} is not a row kernel: use one of {KERNELS}")
        self._rows: dict[int, np.ndarray] = {}   # n_in -> its aligned row buffer
        empty = np.zeros((0, self.config.head_dim // 2), self.dtype)
        # [global, local] layers' (cos, sin) tables, (positions, hd/2) each
        self._tables = [(empty, empty), (empty, empty)]

    @classmethod
    def load(cls, path, kernel: str | None = None) -> FastModel:
        return cls(GGUFFile.open(path), kernel)

    def product(self, x: np.ndarray, w: np.ndarray, exact: bool = True) -> np.ndarray:
        """x (m, n_in) @ w.T -> (m, n_out); batch-invariant whatever `exact` says."""
        n_in = x.shape[1]
        row = self._rows.get(n_in)
        if row is None:
            row = self._rows[n_in] = _aligned(n_in, self.dtype)
        return rows_product(x, w, self.kernel, row)

    def rope_angles(self, positions: np.ndarray, local: bool) -> tuple[np.ndarray, np.ndarray]:
        """Model.rope_angles looked up in tables instead of recomputed for every layer (a tenth
        of a one-token pass in Pyodide): the tables hold the same float32 values Model computes,
        element by element. -> (cos, sin), (m, hd/2) each."""
        need = int(positions.max()) + 1
        cos, sin = self._tables[local]
        if need > len(cos):
            size = max(need, 2 * len(cos), 256)
            ang = np.arange(size, dtype=np.float64)[:, None] * self.inv_freq[local][None, :]
            cos, sin = np.cos(ang).astype(self.dtype), np.sin(ang).astype(self.dtype)  # (size, hd/2)
            self._tables[local] = cos, sin
        return cos[positions], sin[positions]

    def forward(self, *args, **kw) -> np.ndarray:
        with one_blas_thread():
            return super().forward(*args, **kw)

