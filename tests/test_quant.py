"""Tests for pyspec/formats/quant.py: dequantization bit for bit against the `gguf` package (the outside
oracle, `gguf.quants`), the block layouts, and quantization error bounds.

- Champion (required): `GGUFFile.dequantize` equals `gguf.quants.dequantize` of the data that
  `gguf.GGUFReader` reads, bit for bit, on every one of its 272 tensors (Q4_1, Q8_0, F32).
- Random data, every format: quantized by pyspec, and where the gguf package can quantize it
  (all but the K-quants) by `gguf.quants.quantize` too, each dequantized by both
  implementations: bitwise equal. Random raw bytes (any scale, NaN and infinity included)
  dequantize bitwise equal too. The two quantizers share their scales and differ by at most one
  step per element (rounding ties and the Q4_1 / Q5_1 minimum are handled differently).
- Round trip bounds per block, with d the stored scale (float16) and m the stored minimum:
  Q8_0 |x - x'| <= max(d/2, amax - 127 d); Q4_0 / Q5_0 <= |d|/2, or amax - (h-1)|d| at the
  clipped +h end (h = 8, 16); Q4_1 / Q5_1 <= max(d/2, m - min, max - m - (L-1) d) (L = 16, 32
  levels); F16 <= max(2^-11 |x|, 2^-25); F32 exact. Each gets a slack of 2^-20 of the block's
  magnitude for float32 rounding. K-quants (pyspec's own quantizer), per sub-block with its
  stored step s = d sc and offset o = dmin m: Q4_K / Q5_K <= s/2 + o' where o' is how far the
  offset was rounded past -min(0, min), s at most one super-block d above range / (L-1);
  Q6_K <= |s| (the extreme lands on -32, +32 clips to 31), |s| at most d above amax / 32.
"""

from __future__ import annotations

import gguf as gguf_ref
import numpy as np
import pytest

from pyspec.formats import kquant, quant

SEED = 1129
Q_FORMATS = (quant.Q8_0, quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1)   # 32-value blocks
ALL_FORMATS = (quant.F16, quant.BF16, *Q_FORMATS, *quant.K_QUANTS)
GGUF_QUANTIZES = (quant.F16, quant.BF16, *Q_FORMATS)   # the gguf package has no K quantizer


def _bits(a: np.ndarray) -> np.ndarray:
    """float32 array -> its bit patterns: equality is bitwise (NaN payloads and -0.0 included)."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _qtype(fmt: quant.BlockFormat) -> gguf_ref.GGMLQuantizationType:
    return gguf_ref.GGMLQuantizationType(fmt.type_id)


def _ref_dequantize(raw: np.ndarray, fmt: quant.BlockFormat, shape) -> np.ndarray:
    """gguf.quants.dequantize of flat raw bytes, reshaped to numpy `shape`."""
    rows = np.ascontiguousarray(raw).view(np.uint8).reshape(-1, fmt.nbytes(shape[-1]))
    return gguf_ref.quants.dequantize(rows, _qtype(fmt)).reshape(shape)


def _ref_quantize(x: np.ndarray, fmt: quant.BlockFormat) -> np.ndarray:
    """gguf.quants.quantize -> flat raw bytes (uint8)."""
    return np.ascontiguousarray(gguf_ref.quants.quantize(x, _qtype(fmt))).view(np.uint8).reshape(-1)


# ---------------------------------------------------------------------------------------------
# The champion: every tensor, bit for bit (required)
# ---------------------------------------------------------------------------------------------
def test_champion_dequantize_bitwise_equal_to_gguf_package(champion_gguf_pair):
    ours, ref = champion_gguf_pair
    assert len(ref.tensors) == len(ours.tensors) == 272
    seen = {}
    for t in ref.tensors:
        expected = gguf_ref.quants.dequantize(t.data, t.tensor_type)
        got = ours.dequantize(t.name)
        assert got.dtype == np.float32 and expected.dtype == np.float32, t.name
        assert got.shape == tuple(int(d) for d in reversed(t.shape)), t.name
        assert np.array_equal(_bits(got), _bits(expected.reshape(got.shape))), t.name
        fmt = quant.FORMATS[ours.tensors[t.name].type_id].name
        seen[fmt] = seen.get(fmt, 0) + 1
    assert seen == {"Q4_1": 210, "F32": 61, "Q8_0": 1}


# ---------------------------------------------------------------------------------------------
# Random data: both quantizers x both dequantizers
# ---------------------------------------------------------------------------------------------
def _blocks_of_every_kind(rows: int, cols: int, seed: int) -> np.ndarray:
    """(rows, cols) float32 whose 32-element blocks have varied scales and offsets, plus the edge
    cases: all zero, constant, one spike, all negative, tiny (float16 subnormal scales), large."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)) * np.exp(rng.uniform(-6, 6, (rows, cols // 32))).repeat(
        32, axis=1)
    x += rng.standard_normal((rows, cols // 32)).repeat(32, axis=1) * (rng.random((rows, 1)) < .3)
    b = x.reshape(-1, 32)   # a view: the edge cases overwrite whole blocks
    b[0] = 0.0
    b[1] = 0.7
    b[2] = 0.0
    b[2, 5] = -3.0
    b[3] = -np.abs(b[3]) - 1
    b[4] *= 1e-9 / np.abs(b[4]).max()
    b[5] *= 1e4 / np.abs(b[5]).max()
    b[6] = np.linspace(-8, 7, 32)
    b[7] = 5.0 - np.arange(32) * 1e-3   # narrow range far from zero (Q4_1 minimum rounding)
    return x.astype(np.float32)


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    return _blocks_of_every_kind(48, 256, SEED)


@pytest.mark.parametrize("fmt,quantizer", [(f, "pyspec") for f in ALL_FORMATS]
                         + [(f, "gguf") for f in GGUF_QUANTIZES],
                         ids=lambda v: getattr(v, "name", v))
def test_dequantize_equals_gguf_package_on_random_data(data, fmt, quantizer):
    raw = quant.quantize(data, fmt.type_id) if quantizer == "pyspec" else _ref_quantize(data, fmt)
    assert raw.dtype == np.uint8 and raw.size == fmt.nbytes(data.size)
    ours = quant.dequantize(raw, fmt.type_id, data.shape)
    ref = _ref_dequantize(raw, fmt, data.shape)
    assert ours.dtype == np.float32 and ours.shape == data.shape
    assert np.array_equal(_bits(ours), _bits(ref))


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=lambda f: f.name)
def test_dequantize_equals_gguf_package_on_random_bytes(fmt):
    """Any bytes at all, scales that are NaN, infinite or subnormal included."""
    rng = np.random.default_rng(SEED + fmt.type_id)
    shape = (64, 8 * max(32, fmt.block_elems))
    raw = rng.integers(0, 256, fmt.nbytes(shape[0] * shape[1]), dtype=np.uint8)
    with np.errstate(invalid="ignore", over="ignore"):   # NaN / inf scales are the point here
        ours = quant.dequantize(raw, fmt.type_id, shape)
        ref = _ref_dequantize(raw, fmt, shape)
    assert np.isnan(ours).any() or fmt is quant.F16
    assert np.array_equal(_bits(ours), _bits(ref))


def test_f16_bf16_and_f32_quantize_like_gguf_package(data):
    assert np.array_equal(quant.quantize(data, quant.F16.type_id), _ref_quantize(data, quant.F16))
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1 + 2**-8, 1 + 3 * 2**-8,
                         3.4e38, 1e-40], np.float32)       # ties to even, overflow, subnormal
    for x in (data, specials):
        assert np.array_equal(quant.quantize(x, quant.BF16.type_id), _ref_quantize(x, quant.BF16))
    assert np.array_equal(quant.quantize(data, quant.F32.type_id), _ref_quantize(data, quant.F32))
    back = quant.dequantize(quant.quantize(data, quant.F32.type_id), quant.F32.type_id, data.shape)
    assert np.array_equal(_bits(back), _bits(data))


@pytest.mark.parametrize("fmt", Q_FORMATS, ids=lambda f: f.name)
def test_quantizers_agree_within_one_step(data, fmt):
    """Same scale (and Q4_1 minimum) bytes; each value at most one step d apart."""
    ours, ref = quant.quantize(data, fmt.type_id), _ref_quantize(data, fmt)
    head = 4 if fmt in (quant.Q4_1, quant.Q5_1) else 2
    assert np.array_equal(ours.reshape(-1, fmt.block_bytes)[:, :head],
                          ref.reshape(-1, fmt.block_bytes)[:, :head])
    d = np.abs(_scales(ours, fmt)[0])                                      # (n_blocks, 1)
    a = quant.dequantize(ours, fmt.type_id, data.shape).reshape(-1, 32)
    b = quant.dequantize(ref, fmt.type_id, data.shape).reshape(-1, 32)
    assert np.all(np.abs(a.astype(np.float64) - b) <= d * (1 + 2**-20) + 1e-30)
    assert np.mean(a == b) > 0.9   # the rounding rules differ only near ties


# ---------------------------------------------------------------------------------------------
# Layout and round-trip error bounds
# ---------------------------------------------------------------------------------------------
def _scales(raw: np.ndarray, fmt: quant.BlockFormat) -> tuple[np.ndarray, np.ndarray]:
    """Stored (d, m) per block as float64 (n_blocks, 1); m = 0 for Q8_0 and Q4_0."""
    b = raw.reshape(-1, fmt.block_bytes)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
    with_min = fmt in (quant.Q4_1, quant.Q5_1)
    m = b[:, 2:4].copy().view(np.float16).astype(np.float64) if with_min else 0 * d
    return d, m


def test_q4_layout_low_nibbles_first():
    """llama.cpp block_q4_0 / block_q4_1: element j is the low nibble of byte j, element j + 16
    its high nibble; Q4_0 subtracts 8, Q4_1 adds the minimum m."""
    qs = np.array([(j % 16) | ((15 - j % 16) << 4) for j in range(16)], dtype=np.uint8)
    lo, hi = np.arange(16), 15 - np.arange(16)
    one, half = (np.array([v], dtype=np.float16).view(np.uint8) for v in (1, 0.5))
    q4_0 = np.concatenate([half, qs])
    expected = 0.5 * (np.concatenate([lo, hi]) - 8)
    assert np.array_equal(quant.dequantize(q4_0, quant.Q4_0.type_id, (32,)), expected)
    q4_1 = np.concatenate([one, np.array([-2], dtype=np.float16).view(np.uint8), qs])
    assert np.array_equal(quant.dequantize(q4_1, quant.Q4_1.type_id, (32,)),
                          np.concatenate([lo, hi]) - 2.0)
    q8_0 = np.concatenate([half, np.arange(-16, 16, dtype=np.int8).view(np.uint8)])
    assert np.array_equal(quant.dequantize(q8_0, quant.Q8_0.type_id, (32,)),
                          0.5 * np.arange(-16, 16))
    for fmt in (quant.Q4_0, quant.Q4_1, quant.Q8_0):
        raw = {quant.Q4_0: q4_0, quant.Q4_1: q4_1, quant.Q8_0: q8_0}[fmt]
        assert np.array_equal(quant.dequantize(raw, fmt.type_id, (32,)),
                              _ref_dequantize(raw, fmt, (32,)))


@pytest.mark.parametrize("fmt", Q_FORMATS, ids=lambda f: f.name)
def test_round_trip_error_bound_per_block(data, fmt):
    raw = quant.quantize(data, fmt.type_id)
    x = data.reshape(-1, 32).astype(np.float64)                          # (n_blocks, 32)
    err = np.abs(x - quant.dequantize(raw, fmt.type_id, data.shape).reshape(-1, 32))
    d, m = _scales(raw, fmt)
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    amax = np.abs(x).max(axis=1, keepdims=True)
    slack = 2**-20 * (amax + np.abs(m))
    half = {quant.Q4_0: 8, quant.Q5_0: 16}.get(fmt)
    levels = {quant.Q4_1: 16, quant.Q5_1: 32}.get(fmt)
    if fmt is quant.Q8_0:
        bound = np.maximum(d / 2, amax - 127 * d)
    elif half:
        # d = -(signed extreme) / half, so x / d lies in about [-half, half]; codes run
        # -half..half-1, so values with x / d above half - 1/2 are clipped (to (half-1) d). A
        # scale that underflows float16 (d = 0) maps the whole block to 0.
        ratio = np.divide(x, d, out=np.full_like(x, np.inf), where=d != 0)
        clipped = (ratio > half - 0.5) | (ratio < -half - 0.5)
        bound = np.where(clipped, amax - (half - 1) * np.abs(d), np.abs(d) / 2)
        assert np.all((d != 0) | (amax < half * 2**-25)), "a scale became 0 without underflow"
    else:
        bound = np.maximum(d / 2, np.maximum(m - lo, hi - m - (levels - 1) * d))
    excess = err - (bound + slack)
    assert np.all(excess <= 0), f"{fmt.name}: worst block {np.argmax(excess.max(axis=1))}"
    # The bound is tight: a step is about range / (levels - 1), amax / half or amax / 127.
    steps = (hi - lo) / (levels - 1) if levels else amax / (half or 127)
    assert np.allclose(np.abs(d), steps, rtol=2**-10, atol=2**-24)


def _k_steps(raw: np.ndarray, fmt: quant.BlockFormat) -> tuple[np.ndarray, ...]:
    """Per sub-block (n_blocks, 8 or 16) float64: the step s = d sc, the offset o = dmin m (0 for
    Q6_K) and the super-block d (and dmin), read back from the stored bytes."""
    b = raw.reshape(-1, fmt.block_bytes)
    if fmt is quant.Q6_K:
        d = kquant.f16(b, 208).astype(np.float64)
        return d * b[:, 192:208].view(np.int8), 0 * d, d, 0 * d
    sc, m = kquant.scales_mins(b[:, 4:16])
    d, dmin = kquant.f16(b, 0).astype(np.float64), kquant.f16(b, 2).astype(np.float64)
    return d * sc, dmin * m, d, dmin


@pytest.mark.parametrize("fmt", quant.K_QUANTS, ids=lambda f: f.name)
def test_k_quant_round_trip_error_bound_per_sub_block(data, fmt):
    """pyspec's K quantizer (no llama.cpp rounding search): every value within its sub-block's
    bound (module docstring), scales no coarser than they need be, and a Gaussian matrix within
    a few percent (RMS) of itself."""
    raw = quant.quantize(data, fmt.type_id)
    sub = 16 if fmt is quant.Q6_K else 32
    n_sub = 256 // sub
    x = data.reshape(-1, n_sub, sub).astype(np.float64)                  # (n_blocks, n_sub, sub)
    err = np.abs(x - quant.dequantize(raw, fmt.type_id, data.shape).reshape(x.shape))
    s, o, d, dmin = _k_steps(raw, fmt)
    lo, hi = np.minimum(x.min(axis=2), 0), x.max(axis=2)
    amax = np.abs(x).max(axis=2)
    slack = 2**-20 * (amax + o)
    if fmt is quant.Q6_K:
        bound, tight = np.abs(s), np.abs(s) <= amax / 32 + d + slack
    else:
        levels = 16 if fmt is quant.Q4_K else 32
        assert np.all(o >= -lo - slack) and np.all(o <= -lo + dmin + slack)
        bound = s / 2 + (o + lo)
        tight = s <= (hi - lo) / (levels - 1) + d + slack
    excess = err.max(axis=2) - (bound + slack)
    assert np.all(excess <= 0), f"{fmt.name}: worst block {np.argmax(excess.max(axis=1))}"
    assert np.all(tight)
    g = np.random.default_rng(SEED).standard_normal((64, 512)).astype(np.float32)
    back = quant.dequantize(quant.quantize(g, fmt.type_id), fmt.type_id, g.shape)
    rms = np.sqrt(np.mean((back - g) ** 2))
    assert rms < {quant.Q4_K: 0.1, quant.Q5_K: 0.05, quant.Q6_K: 0.025}[fmt]


def test_k_scale_packing_round_trips():
    """The 6-bit scales and mins of Q4_K / Q5_K (get_scale_min_k4): every value 0..63 in every
    slot comes back from pack_scales_mins through scales_mins."""
    rng = np.random.default_rng(SEED)
    sc, m = (rng.integers(0, 64, (4096, 8), dtype=np.uint8) for _ in range(2))
    sc[:64, :], m[:64, :] = np.arange(64)[:, None], 63 - np.arange(64)[:, None]
    back = kquant.scales_mins(kquant.pack_scales_mins(sc, m))
    assert np.array_equal(back[0], sc) and np.array_equal(back[1], m)


def test_first_bad_scale_finds_non_finite_d_and_dmin(data):
    for fmt in quant.K_QUANTS:
        raw = quant.quantize(data, fmt.type_id).reshape(-1, fmt.block_bytes).copy()
        assert quant.first_bad_scale(raw, fmt.type_id) is None
        for at, value in zip(kquant.SCALE_OFFSETS[fmt.name], (np.inf, np.nan)):
            bad = raw.copy()
            bad[5, at:at + 2] = np.array([value], np.float16).view(np.uint8)
            bad[9, at:at + 2] = bad[5, at:at + 2]
            assert quant.first_bad_scale(bad, fmt.type_id) == 5, fmt.name
    q4_1 = quant.quantize(data, quant.Q4_1.type_id).reshape(-1, quant.Q4_1.block_bytes).copy()
    q4_1[:, 0:2] = np.array([np.nan], np.float16).view(np.uint8)
    assert quant.first_bad_scale(q4_1, quant.Q4_1.type_id) is None   # only K-quants are checked


def test_round_trip_edge_blocks(data):
    """A zero block comes back exactly 0 in every format. Q4_1 returns a constant block as its
    float16 value (d = 0, m = the constant); Q4_0 returns a lone spike of -3 exactly (d = 3/8
    is exact in float16) and Q8_0 within float16 rounding of its scale 3/127."""
    back = {fmt: quant.dequantize(quant.quantize(data, fmt.type_id), fmt.type_id,
                                  data.shape).reshape(-1, 32) for fmt in Q_FORMATS}
    for fmt, blocks in back.items():
        assert np.all(blocks[0] == 0), fmt.name
        assert np.all(np.abs(blocks[1] - np.float32(0.7)) <= 0.7 * 2**-11), fmt.name
    assert np.all(back[quant.Q4_1][1] == np.float32(np.float16(0.7)))
    for fmt in (quant.Q4_0, quant.Q8_0):
        assert np.all(np.delete(back[fmt][2], 5) == 0), fmt.name
    assert back[quant.Q4_0][2, 5] == np.float32(-3.0)
    assert abs(back[quant.Q8_0][2, 5] + 3.0) <= 3 * 2**-11


def test_f16_round_trip_bound(data):
    back = quant.dequantize(quant.quantize(data, quant.F16.type_id), quant.F16.type_id, data.shape)
    err = np.abs(back.astype(np.float64) - data)
    assert np.all(err <= np.maximum(np.abs(data) * 2**-11, 2**-25))


def test_formats_table_and_sizes():
    """ggml_type ids and block sizes from ggml.h / ggml-common.h, as the gguf package has them;
    the names of the types pyspec refuses too."""
    assert set(quant.FORMATS) == {0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30}
    for qtype in gguf_ref.GGMLQuantizationType:
        assert quant.type_name(int(qtype)) == qtype.name
    assert quant.type_name(4) == "unknown type 4"
    for fmt in quant.FORMATS.values():
        assert (fmt.block_elems, fmt.block_bytes) == gguf_ref.GGML_QUANT_SIZES[_qtype(fmt)]
        assert _qtype(fmt).name == fmt.name and quant.BY_NAME[fmt.name] is fmt
        assert fmt.nbytes(64) == 64 // fmt.block_elems * fmt.block_bytes


@pytest.mark.parametrize("fmt", Q_FORMATS + quant.K_QUANTS, ids=lambda f: f.name)
def test_quantize_refuses_partial_blocks(fmt):
    with pytest.raises(ValueError, match=f"multiple of {fmt.block_elems}"):
        quant.quantize(np.zeros(fmt.block_elems + 16, dtype=np.float32), fmt.type_id)


def test_lent_kernels_are_used_and_their_output_is_returned():
    """quant.use_kernels (the page lends web/dequant.js's; e2e/test_browser_dequant.py checks those
    bit for bit): dequantize hands each lent format's blocks to its kernel and returns its out."""
    rng = np.random.default_rng(3)
    raw = quant.quantize(rng.standard_normal(64 * 32).astype(np.float32), quant.Q4_1.type_id)
    want = quant.dequantize(raw, quant.Q4_1.type_id, (64, 32))
    calls = []

    def kernel(blocks, out):
        calls.append((blocks.dtype, blocks.shape, out.dtype, out.shape))
        out[:] = want.reshape(-1) + 1     # visibly not numpy's own result

    saved = dict(quant._KERNELS)
    try:
        quant.use_kernels({"Q4_1": kernel})
        got = quant.dequantize(raw, quant.Q4_1.type_id, (64, 32))
        untouched = quant.dequantize(quant.quantize(want, quant.Q8_0.type_id),
                                     quant.Q8_0.type_id, (64, 32))
        # The page lends Q4_1 and Q8_0 only (session.py); every other format is numpy's.
        k = quant.quantize(want.reshape(8, 256), quant.Q4_K.type_id)
        assert np.array_equal(quant.dequantize(k, quant.Q4_K.type_id, (8, 256)),
                              kquant.dequantize_q4_k(k.reshape(-1, 144)))
    finally:
        quant._KERNELS.clear()
        quant._KERNELS.update(saved)
    assert calls == [(np.uint8, (64 * 20,), np.float32, (64 * 32,))]
    np.testing.assert_array_equal(got, want + 1)
    assert untouched.shape == (64, 32) and len(calls) == 1
