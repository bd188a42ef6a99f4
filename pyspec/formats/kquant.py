"""K-quant super-blocks (Q4_K, Q5_K, Q6_K): reference dequantization and a simple quantizer.

Layouts (llama.cpp ggml/src/ggml-common.h, block_q4_K / block_q5_K / block_q6_K; the value
formulas from ggml-quants.c's dequantize_row_q*_K), 256 values per super-block:
- Q4_K, 144 bytes: f16 d | f16 dmin | 12 bytes of 6-bit scales and mins | 128 bytes of nibbles.
  Sub-block s (0..7) holds values 32s..32s+31: value l is nibble (s % 2) (low first) of byte
  32 (s // 2) + l of the nibbles; w = (d sc_s) q - (dmin m_s).
  Scales and mins, 6 bits each (get_scale_min_k4): for s < 4, sc_s = byte s & 63 and m_s =
  byte s + 4 & 63; for s >= 4, sc_s = (byte s + 4 & 15) | (byte s - 4 >> 6) << 4 and
  m_s = (byte s + 4 >> 4) | (byte s >> 6) << 4.
- Q5_K, 176 bytes: Q4_K's head (d, dmin, scales), 32 bytes qh, then Q4_K's 128 bytes of
  nibbles; the fifth bit of value l of sub-block s is bit s of qh byte l.
- Q6_K, 210 bytes: 128 bytes ql (low 4 bits) | 64 bytes qh (high 2 bits) | 16 int8 scales |
  f16 d. Half h (0, 1) holds values 128h..128h+127; group g (0..3) of it values 32g..32g+31 of
  the half: value l (0..31) is nibble (g // 2) of ql byte 64h + 32 (g % 2) + l, its high bits
  are bits 2g, 2g+1 of qh byte 32h + l, and its scale is int8 8h + 2g + l // 16;
  w = (d sc) (q - 32).
The float32 operation order (`d * sc` first, then `* q`, then `- dmin * m`) is the gguf package's
and llama.cpp's, so the results are bit for bit the `gguf` package's (tests/test_quant.py).

The quantizer is for test models only: it is no port of llama.cpp's rounding search
(make_qkx2_quants); it takes each sub-block's range, rounds the 6-bit (or int8) scales up so
that every value is in range, and rounds each value to the nearest level. Not here: the 32-value
formats and the format table (quant.py), GPU kernels (shaders/blocks.wgsl, slices.wgsl).
"""

from __future__ import annotations

import numpy as np

QK_K = 256


def f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The f16 at byte `at` of every block (n_blocks, block_bytes), as float32: (n_blocks, 1)."""
    return blocks[:, at:at + 2].copy().view(np.float16).astype(np.float32)


# --- dequantization -----------------------------------------------------------------------------

def scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 12) packed bytes -> (sc, m), each (n, 8) uint8 (get_scale_min_k4's rule, above)."""
    lo, mid, hi = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = np.concatenate([lo & 63, (hi & 15) | ((lo >> 6) << 4)], axis=1)
    m = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=1)
    return sc, m


def _low_bits(qs: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K nibbles (n, 128) -> (n, 8, 32) values of sub-blocks 0..7."""
    pairs = qs.reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (pairs & 15).reshape(-1, 8, 32)


def _affine(blocks: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(d sc) q - (dmin m) for Q4_K / Q5_K blocks and their (n, 8, 32) values q -> (n, 256)."""
    sc, m = scales_mins(blocks[:, 4:16])
    d = (f16(blocks, 0) * sc.astype(np.float32))[:, :, None]              # (n, 8, 1)
    dm = (f16(blocks, 2) * m.astype(np.float32))[:, :, None]
    return (d * q.astype(np.float32) - dm).reshape(-1, QK_K)


def dequantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    """(n, 144) uint8 -> (n, 256) float32."""
    return _affine(blocks, _low_bits(blocks[:, 16:144]))


def dequantize_q5_k(blocks: np.ndarray) -> np.ndarray:
    """(n, 176) uint8 -> (n, 256) float32."""
    qh = blocks[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    return _affine(blocks, _low_bits(blocks[:, 48:176]) | ((qh & 1) << 4))


def _q6_values(blocks: np.ndarray) -> np.ndarray:
    """Q6_K blocks (n, 210) -> their 6-bit values minus 32 as (n, 16, 16) int8."""
    ql = blocks[:, 0:128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    ql = (ql & 15).reshape(-1, 2, 4, 32)                                  # (n, half, group, l)
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(
        1, 1, 4, 1)
    q = (ql | ((qh & 3) << 4)).astype(np.int8) - np.int8(32)
    return q.reshape(-1, 16, 16)


def dequantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    """(n, 210) uint8 -> (n, 256) float32."""
    d = f16(blocks, 208) * blocks[:, 192:208].view(np.int8).astype(np.float32)   # (n, 16)
    return (d[:, :, None] * _q6_values(blocks).astype(np.float32)).reshape(-1, QK_K)


# Where each format keeps its f16 super-block scales (d, and dmin for Q4_K / Q5_K).
SCALE_OFFSETS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def first_bad_scale(blocks: np.ndarray, name: str) -> int | None:
    """The index of the first super-block whose d or dmin is NaN or infinite, else None."""
    ok = np.ones(blocks.shape[0], bool)
    for at in SCALE_OFFSETS[name]:
        ok &= np.isfinite(blocks[:, at:at + 2].copy().view(np.float16)[:, 0])
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if bad.size else None


# --- quantization (test models) -----------------------------------------------------------------

def _f16_above(v: np.ndarray) -> np.ndarray:
    """The least float16 >= v (float32, non-negative), for super-block scales."""
    d = v.astype(np.float16)
    return np.where(d.astype(np.float32) < v, np.nextafter(d, np.float16(np.inf)), d)


def _six_bit(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-sub-block non-negative values (n, 8) -> (f16 super-block scale (n, 1), 6-bit codes
    (n, 8)) with scale * code >= value (rounded up, so the range stays covered)."""
    d = _f16_above(values.max(axis=1, keepdims=True) / 63)
    d32 = d.astype(np.float32)
    codes = np.ceil(np.divide(values, d32, out=np.zeros_like(values), where=d32 > 0))
    return d, np.clip(codes, 0, 63).astype(np.uint8)


def pack_scales_mins(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """(n, 8) 6-bit scales and mins -> (n, 12) bytes, the inverse of scales_mins."""
    out = np.zeros((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    return out


def _quantize_affine(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, 256) float32 -> (head (n, 16): d, dmin, packed scales; values (n, 8, 32) uint8 in
    0..levels-1) for w = (d sc) q - (dmin m), with m for -min(0, sub-block minimum)."""
    sub = x.reshape(-1, 8, 32)
    lo = np.minimum(sub.min(axis=2), 0)                                    # (n, 8) <= 0
    d, sc = _six_bit((sub.max(axis=2) - lo) / (levels - 1))
    dmin, m = _six_bit(-lo)
    step = (d.astype(np.float32) * sc)[:, :, None]                        # (n, 8, 1)
    offset = (dmin.astype(np.float32) * m)[:, :, None]
    q = np.rint(np.divide(sub + offset, step, out=np.zeros_like(sub), where=step > 0))
    head = np.concatenate([d.view(np.uint8), dmin.view(np.uint8), pack_scales_mins(sc, m)], axis=1)
    return head, np.clip(q, 0, levels - 1).astype(np.uint8)


def _pack_low_bits(q: np.ndarray) -> np.ndarray:
    """(n, 8, 32) values -> (n, 128) nibbles (sub-blocks 2k, 2k + 1 share bytes 32k..32k+31)."""
    lo = q & 15
    return (lo[:, 0::2] | (lo[:, 1::2] << 4)).reshape(-1, 128)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """(n, 256) float32 -> (n, 144) uint8."""
    head, q = _quantize_affine(x, 16)
    return np.concatenate([head, _pack_low_bits(q)], axis=1)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """(n, 256) float32 -> (n, 176) uint8."""
    head, q = _quantize_affine(x, 32)
    high = (q >> 4).astype(np.uint8) << np.arange(8, dtype=np.uint8).reshape(1, 8, 1)  # (n, 8, 32)
    qh = np.bitwise_or.reduce(high, axis=1)                                # (n, 32)
    return np.concatenate([head, qh, _pack_low_bits(q)], axis=1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """(n, 256) float32 -> (n, 210) uint8: 16 sub-blocks of 16, each with an int8 scale."""
    sub = x.reshape(-1, 16, 16)
    idx = np.abs(sub).argmax(axis=2)[:, :, None]
    extreme = np.take_along_axis(sub, idx, axis=2)[:, :, 0]               # (n, 16) signed
    want = extreme / -32                                                   # the extreme -> -32
    d = _f16_above(np.abs(want).max(axis=1, keepdims=True) / 127)
    d32 = d.astype(np.float32)
    mag = np.ceil(np.divide(np.abs(want), d32, out=np.zeros_like(want), where=d32 > 0))
    sc = (np.sign(want) * np.clip(mag, 0, 127)).astype(np.int8)            # (n, 16)
    step = (d32 * sc)[:, :, None]
    q = np.rint(np.divide(sub, step, out=np.zeros_like(sub), where=step != 0))
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # (n, half, group, l)
    ql = (q[:, :, 0:2] & 15) | ((q[:, :, 2:4] & 15) << 4)                  # (n, half, 2, 32)
    qh = np.bitwise_or.reduce((q >> 4) << np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1),
                              axis=2)                                      # (n, half, 32)
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8),
                           d.view(np.uint8)], axis=1)
