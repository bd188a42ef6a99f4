"""Counter-based random numbers, identical in Python and WGSL.

Every random number pyspec uses is a pure function of a key
``(seed, position, stream, index)``: there is no generator state to carry, save, or keep in
step between the CPU and the GPU. ``position`` is the absolute token position, ``stream`` names
what the number is for (the ``STREAM_*`` constants) and ``index`` numbers the draws within one
(position, stream): 0 for the single uniforms of rejection sampling, the token id for Gumbel
noise.

The hash uses only u32 operations (wrapping multiply, xor, shifts), so the WGSL copy in
``shaders/`` gives the same bits; ``tests/test_rng.py`` pins known answers that both must match.
This module draws numbers only. It does not decide anything with them (``verify.py`` does), and
it holds no global generator.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import PyspecError

# ---------------------------------------------------------------------------------------------
# Streams: one per use, so no two decisions ever share a number.
# A cycle that starts at committed position c and drafts K tokens uses
#   draft i:          (c + i, STREAM_DRAFT,    0)          the drafter's own sampling
#   accept test i:    (c + i, STREAM_ACCEPT,   0)          rejection mode
#   residual at i:    (c + i, STREAM_RESIDUAL, 0)          rejection mode, first rejection only
#   bonus:            (c + K, STREAM_BONUS,    0)          rejection mode, all accepted
#   Gumbel noise:     (pos,   STREAM_GUMBEL,   token id)   replay mode, champion and drafter alike
# ---------------------------------------------------------------------------------------------
STREAM_ACCEPT = 1
STREAM_RESIDUAL = 2
STREAM_BONUS = 3
STREAM_DRAFT = 4
STREAM_GUMBEL = 5

_U32 = 0xFFFFFFFF
_IV = 0x9E3779B9  # initial state (2^32 / golden ratio); nonzero, so an all-zero key is not 0
_TWO_POW_M24 = 2.0**-24
_TWO_POW_M25 = 2.0**-25


class RngKeyError(PyspecError, ValueError):
    """A key component is outside its range; the message says which and what the range is."""

    code = "bad_config"


# The WGSL copy (shaders/rng.wgsl) must stay exactly this (WGSL names the uniform rng_uniform,
# since `uniform` is reserved there):
#
#   fn mix32(x_in: u32) -> u32 {                 // "lowbias32", C. Wellons, hash-prospector
#       var x = x_in;
#       x ^= x >> 16u;  x *= 0x7feb352du;
#       x ^= x >> 15u;  x *= 0x846ca68bu;
#       x ^= x >> 16u;
#       return x;
#   }
#   fn hash_u32(seed_lo: u32, seed_hi: u32, position: u32, stream: u32, index: u32) -> u32 {
#       var h = 0x9e3779b9u;
#       h = mix32(h ^ seed_lo);
#       h = mix32(h ^ seed_hi);
#       h = mix32(h ^ position);
#       h = mix32(h ^ stream);
#       h = mix32(h ^ index);
#       return h;
#   }
#   fn rng_uniform(...) -> f32 { return f32(hash_u32(...) >> 8u) * 5.9604644775390625e-8; }  // 2^-24
#
# WGSL u32 multiplication wraps mod 2^32, as `& _U32` does here. mix32 is a bijection, so for a
# fixed prefix (seed, position, stream) distinct indices never collide.


def _mix32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _U32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _U32
    x ^= x >> 16
    return x


def _check_key(seed: int, position: int, stream: int, index: int) -> None:
    if not 0 <= seed < 2**64:
        raise RngKeyError(f"seed {seed} is outside [0, 2^64); reduce it mod 2^64 first")
    for name, value in (("position", position), ("stream", stream), ("index", index)):
        if not 0 <= value <= _U32:
            raise RngKeyError(f"{name} {value} is outside [0, 2^32); it must fit in a u32")


def hash_u32(seed: int, position: int, stream: int, index: int) -> int:
    """The u32 hash of one key: the reference that the numpy and WGSL versions must match."""
    _check_key(seed, position, stream, index)
    h = _IV
    for word in (seed & _U32, seed >> 32, position, stream, index):
        h = _mix32(h ^ word)
    return h


def uniform(seed: int, position: int, stream: int, index: int = 0) -> float:
    """One uniform in [0, 1 - 2^-24]: the top 24 bits of the hash (exact in f32 and f64)."""
    return (hash_u32(seed, position, stream, index) >> 8) * _TWO_POW_M24


# ---------------------------------------------------------------------------------------------
# Vectorised (numpy uint32) versions; bit-identical to the scalar reference above.
# ---------------------------------------------------------------------------------------------
def _mix32_np(x: np.ndarray) -> np.ndarray:  # (n,) uint32; array ufuncs wrap silently mod 2^32
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    x = x ^ (x >> np.uint32(16))
    return x


def _as_u32(name: str, values) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype.kind not in "iu":
        raise RngKeyError(f"{name} must be integers, got dtype {arr.dtype}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > _U32):
        raise RngKeyError(f"{name} has values outside [0, 2^32); they must fit in a u32")
    return arr.astype(np.uint32)


def hash_u32_array(seed: int, position, stream, indices) -> np.ndarray:
    """hash_u32 over arrays: position, stream and indices broadcast together; returns uint32."""
    _check_key(seed, 0, 0, 0)
    h = _mix32(_mix32(_IV ^ (seed & _U32)) ^ (seed >> 32))
    words = [("position", position), ("stream", stream), ("indices", indices)]
    # Leading scalar words are shared by every draw: absorb them once with the scalar code.
    while words and np.ndim(words[0][1]) == 0:
        name, word = words.pop(0)
        if np.asarray(word).dtype.kind not in "iu" or not 0 <= int(word) <= _U32:
            raise RngKeyError(f"{name} {word!r} must be an integer in [0, 2^32)")
        h = _mix32(h ^ int(word))
    arrays = [_as_u32(name, word) for name, word in words]
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    hv = np.full(max(1, math.prod(shape)), h, dtype=np.uint32)  # (n,); 1-d so ufuncs wrap silently
    for word in arrays:
        hv = _mix32_np(hv ^ np.broadcast_to(word, shape).reshape(-1))
    return hv.reshape(shape)


def uniforms(seed: int, position, stream, indices) -> np.ndarray:
    """uniform() over arrays (float64, same shape as the broadcast keys), bit-identical to it.

    ``indices`` is usually an array; ``position`` (and ``stream``) may be arrays too, which lets a
    test or a batched caller draw for many positions in one call.
    """
    h = hash_u32_array(seed, position, stream, indices)
    return (h >> np.uint32(8)).astype(np.float64) * _TWO_POW_M24


def gumbel(seed: int, position, vocab_size: int) -> np.ndarray:
    """Standard Gumbel noise, one value per token id: (vocab,) float64 for one position, or
    (n, vocab) for positions given as an (n,) array.

    g = -log(-log(u')) with u' = u + 2^-25 in [2^-25, 1 - 2^-25], so u' is never 0 or 1 and g is
    always finite (between about -2.85 and 17.33). The shift is half a 24-bit step, i.e. each u is
    moved to the middle of its cell. Replay mode samples argmax(logits / T + g); a drafter that
    uses the same g at the same position agrees with the champion as often as possible.
    """
    if vocab_size <= 0:
        raise RngKeyError(f"vocab_size must be positive, got {vocab_size}")
    if np.ndim(position):
        position = np.asarray(position)[:, None]  # (n, 1), broadcast against the token ids
    u = uniforms(seed, position, STREAM_GUMBEL, np.arange(vocab_size, dtype=np.uint32))
    return -np.log(-np.log(u + _TWO_POW_M25))
