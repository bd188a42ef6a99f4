"""Block formats of GGML tensors: layouts, reference dequantization and quantization.

Scope: F32, F16, Q8_0, Q4_0 and Q4_1, the types the champion (Q4_1 with a Q8_0 embedding) and our
test models use. Dequantization follows the layouts of llama.cpp's `ggml-common.h` and is checked
for exact equality against the `gguf` package (tests/test_quant.py), so the float32 operation order
below matters: `d * q` for Q8_0 / Q4_0 and `d * q + m` for Q4_1, all in float32, never fused.

Quantization exists only to write test models; it is a plain round-to-nearest and makes no claim of
matching llama.cpp's quantizer bit for bit. Kernels for the GPU live in `shaders/`, not here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BlockFormat:
    name: str
    type_id: int          # the ggml_type id stored in GGUF tensor infos
    block_elems: int      # elements per block
    block_bytes: int      # bytes per block

    def nbytes(self, n_elems: int) -> int:
        return n_elems // self.block_elems * self.block_bytes


# ggml_type ids from the GGUF spec (ggml.h enum ggml_type).
F32 = BlockFormat("F32", 0, 1, 4)
F16 = BlockFormat("F16", 1, 1, 2)
Q4_0 = BlockFormat("Q4_0", 2, 32, 18)   # f16 d, 16 bytes of nibbles
Q4_1 = BlockFormat("Q4_1", 3, 32, 20)   # f16 d, f16 m, 16 bytes of nibbles
Q8_0 = BlockFormat("Q8_0", 8, 32, 34)   # f16 d, 32 int8

FORMATS = {f.type_id: f for f in (F32, F16, Q4_0, Q4_1, Q8_0)}
BY_NAME = {f.name: f for f in FORMATS.values()}


def _blocks(raw: np.ndarray, fmt: BlockFormat) -> np.ndarray:
    """View raw bytes as (n_blocks, block_bytes) uint8."""
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    return raw.reshape(-1, fmt.block_bytes)


def _scale(blocks: np.ndarray, at: int) -> np.ndarray:
    """The f16 at byte `at` of every block, as float32: (n_blocks, 1)."""
    return blocks[:, at:at + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n_blocks, 16) packed bytes -> (n_blocks, 32) values: element j is the low nibble of byte j,
    element j + 16 the high nibble (llama.cpp block_q4_0 / block_q4_1 layout)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _float_nibbles(qs: np.ndarray) -> np.ndarray:
    """_nibbles(qs) as float32, written straight into the result."""
    out = np.empty((qs.shape[0], 2 * qs.shape[1]), np.float32)
    half = qs.shape[1]
    out[:, :half] = qs & 0x0F
    out[:, half:] = qs >> 4
    return out


# Faster dequantizers a host lends (by type id): kernel(raw uint8, out float32) fills `out`, bit for
# bit as dequantize below would. The page lends web/dequant.js's (pyspec/apps/session.py); natively none.
_KERNELS: dict[int, Callable[[np.ndarray, np.ndarray], None]] = {}


def use_kernels(kernels: dict[str, Callable[[np.ndarray, np.ndarray], None]]) -> None:
    """Dequantize the named block formats ("Q4_1", ...) with these kernels from now on."""
    _KERNELS.update({BY_NAME[name].type_id: k for name, k in kernels.items()})


def dequantize(raw: np.ndarray, type_id: int, shape: tuple[int, ...]) -> np.ndarray:
    """Raw tensor bytes -> float32 array of `shape` (numpy order, last axis = GGUF ne[0])."""
    fmt = FORMATS[type_id]
    kernel = _KERNELS.get(type_id)
    if kernel is not None:
        blocks = _blocks(raw, fmt)
        out = np.empty(blocks.shape[0] * fmt.block_elems, np.float32)
        kernel(blocks.reshape(-1), out)
        return out.reshape(shape)
    if fmt is F32:
        out = np.ascontiguousarray(raw).view(np.float32)
    elif fmt is F16:
        out = np.ascontiguousarray(raw).view(np.float16).astype(np.float32)
    elif fmt is Q8_0:
        b = _blocks(raw, fmt)
        out = b[:, 2:].view(np.int8).astype(np.float32)
        out *= _scale(b, 0)
    elif fmt is Q4_0:
        b = _blocks(raw, fmt)
        q = _nibbles(b[:, 2:]).astype(np.int8) - np.int8(8)
        out = _scale(b, 0) * q.astype(np.float32)
    else:  # Q4_1: d * q + m, in place (the model loads 100M+ of these; fewer temporaries)
        b = _blocks(raw, fmt)
        out = _float_nibbles(b[:, 4:])
        out *= _scale(b, 0)
        out += _scale(b, 2)
    return out.reshape(shape)


def quantize(values: np.ndarray, type_id: int) -> np.ndarray:
    """float array (..., n) with n % block_elems == 0 -> raw bytes (uint8, flat). For test models."""
    fmt = FORMATS[type_id]
    x = np.asarray(values, dtype=np.float32).reshape(-1)
    if fmt is F32:
        return x.view(np.uint8).copy()
    if fmt is F16:
        return x.astype(np.float16).view(np.uint8).copy()
    if x.size % fmt.block_elems:
        raise ValueError(f"{fmt.name} needs a multiple of {fmt.block_elems} elements, got {x.size}")
    x = x.reshape(-1, fmt.block_elems)
    if fmt is Q8_0:
        d = (np.abs(x).max(axis=1, keepdims=True) / 127).astype(np.float16)
        inv = np.divide(1, d.astype(np.float32), out=np.zeros_like(x[:, :1]), where=d != 0)
        q = np.clip(np.rint(x * inv), -127, 127).astype(np.int8)
        return np.concatenate([d.view(np.uint8), q.view(np.uint8)], axis=1).reshape(-1)
    if fmt is Q4_0:
        amax_idx = np.abs(x).argmax(axis=1)
        signed_max = x[np.arange(len(x)), amax_idx][:, None]
        d = (signed_max / -8).astype(np.float16)
        inv = np.divide(1, d.astype(np.float32), out=np.zeros_like(x[:, :1]), where=d != 0)
        q = np.clip(np.rint(x * inv) + 8, 0, 15).astype(np.uint8)
        packed = q[:, :16] | (q[:, 16:] << 4)
        return np.concatenate([d.view(np.uint8), packed], axis=1).reshape(-1)
    lo = x.min(axis=1, keepdims=True)
    d = ((x.max(axis=1, keepdims=True) - lo) / 15).astype(np.float16)
    m = lo.astype(np.float16)
    inv = np.divide(1, d.astype(np.float32), out=np.zeros_like(x[:, :1]), where=d != 0)
    q = np.clip(np.rint((x - m.astype(np.float32)) * inv), 0, 15).astype(np.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)
    return np.concatenate([d.view(np.uint8), m.view(np.uint8), packed], axis=1).reshape(-1)
