"""Block formats of GGML tensors: layouts, reference dequantization and quantization.

Scope: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 here, and the K-quants Q4_K, Q5_K, Q6_K
(kquant.py): the champion's types (Q4_1 with a Q8_0 embedding) and those of Q4_K_M / Q5_K_M /
Q8_0 files of the families pyspec runs (mixes.py picks them as llama.cpp does). Every other ggml
type is known by name only (TYPE_NAMES), so that a file using one is refused naming it.
Dequantization follows the layouts of llama.cpp's `ggml-common.h` and is checked for exact
equality against the `gguf` package (tests/test_quant.py), so the float32 operation order below
matters: `d * q` for Q8_0 / Q4_0 / Q5_0 and `d * q + m` for Q4_1 / Q5_1, all in float32, never
fused. Q5_0 / Q5_1 (block_q5_0 / block_q5_1): f16 d (| f16 m), 4 bytes qh, 16 bytes of nibbles as
Q4_0's; bit j of qh (little-endian u32) is the fifth bit of value j; Q5_0 subtracts 16. BF16 is
the top half of a float32.

Quantization exists only to write test models; it is a plain round-to-nearest and makes no claim of
matching llama.cpp's quantizer bit for bit. Kernels for the GPU live in `shaders/`, not here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import kquant


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
Q5_0 = BlockFormat("Q5_0", 6, 32, 22)   # f16 d, 4 bytes qh, 16 bytes of nibbles
Q5_1 = BlockFormat("Q5_1", 7, 32, 24)   # f16 d, f16 m, 4 bytes qh, 16 bytes of nibbles
Q8_0 = BlockFormat("Q8_0", 8, 32, 34)   # f16 d, 32 int8
Q4_K = BlockFormat("Q4_K", 12, 256, 144)
Q5_K = BlockFormat("Q5_K", 13, 256, 176)
Q6_K = BlockFormat("Q6_K", 14, 256, 210)
BF16 = BlockFormat("BF16", 30, 1, 2)

FORMATS = {f.type_id: f for f in (F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16)}
BY_NAME = {f.name: f for f in FORMATS.values()}
K_QUANTS = (Q4_K, Q5_K, Q6_K)

# Every ggml_type of ggml.h by id, for the error that refuses one pyspec does not read.
TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
              9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K",
              16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S",
              22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
              29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4", 40: "NVFP4",
              41: "Q1_0", 42: "Q2_0"}


def type_name(type_id: int) -> str:
    """A ggml type's name ("IQ2_XS"), or "unknown type N" for an id ggml does not define."""
    return TYPE_NAMES.get(type_id, f"unknown type {type_id}")


def _blocks(raw: np.ndarray, fmt: BlockFormat) -> np.ndarray:
    """View raw bytes as (n_blocks, block_bytes) uint8."""
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    return raw.reshape(-1, fmt.block_bytes)


_scale = kquant.f16   # the f16 at byte `at` of every block, as float32: (n_blocks, 1)


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


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """(n_blocks, 4) qh bytes -> (n_blocks, 32) uint8: bit j of the little-endian u32 is the
    fifth bit of value j (block_q5_0 / block_q5_1)."""
    word = qh.copy().view("<u4")                                           # (n_blocks, 1)
    return ((word >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _five_bits(b: np.ndarray, qh_at: int) -> np.ndarray:
    """Q5_0 / Q5_1 blocks -> their 5-bit values (n_blocks, 32) uint8."""
    return _nibbles(b[:, qh_at + 4:]) | (_fifth_bits(b[:, qh_at:qh_at + 4]) << 4)


def _dequantize_blocks(b: np.ndarray, fmt: BlockFormat) -> np.ndarray:
    """(n_blocks, block_bytes) of a block format -> (n_blocks, block_elems) float32."""
    if fmt is Q8_0:
        out = b[:, 2:].view(np.int8).astype(np.float32)
        out *= _scale(b, 0)
        return out
    if fmt is Q4_0:
        return _scale(b, 0) * (_nibbles(b[:, 2:]).astype(np.int8) - np.int8(8)).astype(np.float32)
    if fmt is Q4_1:   # d * q + m, in place (the model loads 100M+ of these; fewer temporaries)
        out = _float_nibbles(b[:, 4:])
        out *= _scale(b, 0)
        out += _scale(b, 2)
        return out
    if fmt is Q5_0:
        return _scale(b, 0) * (_five_bits(b, 2).astype(np.int8) - np.int8(16)).astype(np.float32)
    if fmt is Q5_1:
        return _scale(b, 0) * _five_bits(b, 4).astype(np.float32) + _scale(b, 2)
    return {Q4_K: kquant.dequantize_q4_k, Q5_K: kquant.dequantize_q5_k,
            Q6_K: kquant.dequantize_q6_k}[fmt](b)


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
    elif fmt is BF16:
        out = (np.ascontiguousarray(raw).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        out = _dequantize_blocks(_blocks(raw, fmt), fmt)
    return out.reshape(shape)


def first_bad_scale(raw: np.ndarray, type_id: int) -> int | None:
    """For a K-quant tensor, the index of its first super-block whose f16 scale d (or dmin) is
    NaN or infinite; None when all are finite or the format is not a K-quant."""
    fmt = FORMATS[type_id]
    if fmt not in K_QUANTS:
        return None
    return kquant.first_bad_scale(_blocks(raw, fmt), fmt.name)


# --- quantization (test models) -----------------------------------------------------------------

def _inverse(d: np.ndarray) -> np.ndarray:
    """1 / d of f16 scales (n, 1) in float32, 0 where d is 0."""
    d32 = d.astype(np.float32)
    return np.divide(1, d32, out=np.zeros_like(d32), where=d != 0)


def _symmetric(x: np.ndarray, half: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, 32) -> (f16 d (n, 1), codes (n, 32) in 0..2 half - 1) for w = d (q - half): d takes
    the signed extreme to -half (Q4_0: half 8, Q5_0: 16)."""
    signed_max = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)
    d = (signed_max / -half).astype(np.float16)
    q = np.clip(np.rint(x * _inverse(d)) + half, 0, 2 * half - 1).astype(np.uint8)
    return d, q


def _minimum(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(n, 32) -> (f16 d, f16 m (n, 1), codes (n, 32) in 0..levels-1) for w = d q + m
    (Q4_1: 16 levels, Q5_1: 32)."""
    lo = x.min(axis=1, keepdims=True)
    d = ((x.max(axis=1, keepdims=True) - lo) / (levels - 1)).astype(np.float16)
    m = lo.astype(np.float16)
    q = np.clip(np.rint((x - m.astype(np.float32)) * _inverse(d)), 0, levels - 1)
    return d, m, q.astype(np.uint8)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) codes -> (n, 16) bytes: the low 4 bits of value j in byte j, of j + 16 above."""
    return (q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)


def _pack_fifth_bits(q: np.ndarray) -> np.ndarray:
    """(n, 32) 5-bit codes -> (n, 4) qh bytes (the inverse of _fifth_bits)."""
    return np.packbits(q >> 4, axis=1, bitorder="little")


def _quantize_blocks(x: np.ndarray, fmt: BlockFormat) -> np.ndarray:
    """(n_blocks, block_elems) float32 -> (n_blocks, block_bytes) uint8."""
    if fmt is Q8_0:
        d = (np.abs(x).max(axis=1, keepdims=True) / 127).astype(np.float16)
        q = np.clip(np.rint(x * _inverse(d)), -127, 127).astype(np.int8)
        return np.concatenate([d.view(np.uint8), q.view(np.uint8)], axis=1)
    if fmt in (Q4_0, Q5_0):
        d, q = _symmetric(x, 8 if fmt is Q4_0 else 16)
        head = [d.view(np.uint8)]
    elif fmt in (Q4_1, Q5_1):
        d, m, q = _minimum(x, 16 if fmt is Q4_1 else 32)
        head = [d.view(np.uint8), m.view(np.uint8)]
    else:
        return {Q4_K: kquant.quantize_q4_k, Q5_K: kquant.quantize_q5_k,
                Q6_K: kquant.quantize_q6_k}[fmt](x)
    fifth = [_pack_fifth_bits(q)] if fmt in (Q5_0, Q5_1) else []
    return np.concatenate(head + fifth + [_pack_nibbles(q)], axis=1)


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> BF16 bytes, rounded to nearest even; NaN stays a (quiet) NaN."""
    n = x.view(np.uint32).astype(np.uint64)
    nan = (n & 0x7FFFFFFF) > 0x7F800000
    n = np.where(nan, (n & 0xFFFF0000) | (64 << 16), n + 0x7FFF + ((n >> 16) & 1))
    return (n >> 16).astype(np.uint16).view(np.uint8)


def quantize(values: np.ndarray, type_id: int) -> np.ndarray:
    """float array (..., n) with n % block_elems == 0 -> raw bytes (uint8, flat). For test models."""
    fmt = FORMATS[type_id]
    x = np.asarray(values, dtype=np.float32).reshape(-1)
    if fmt is F32:
        return x.view(np.uint8).copy()
    if fmt is F16:
        return x.astype(np.float16).view(np.uint8).copy()
    if fmt is BF16:
        return _bf16(x)
    if x.size % fmt.block_elems:
        raise ValueError(f"{fmt.name} needs a multiple of {fmt.block_elems} elements, got {x.size}")
    return _quantize_blocks(x.reshape(-1, fmt.block_elems), fmt).reshape(-1)
