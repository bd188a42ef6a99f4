"""The forward's GPU kernels (pyspec/gpu/ops.py, shaders/*.wgsl) against the numpy reference
(pyspec/cpu/model.py), and their batch invariance, bit for bit.

References: model.matmul, model.rms_norm, Model.rope, Model.attention and the forward's SiLU gate
expression; embeddings against quant.dequantize (exact). Weights come from real GGUF files written
by pyspec.formats.ggufwrite / testmodels, so Weight.upload (gpu/weights.py) and its Q8_0
repacking are exercised.
Float tolerances are atol + rtol * |ref|, stated at each check.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from pyspec import testmodels
from pyspec.cpu.model import Model, matmul, rms_norm
from pyspec.formats import ggufwrite, quant
from pyspec.formats.gguf import GGUFFile
from pyspec.gpu import native, ops, weights
from pyspec.gpu.device import ROWS_MAX
from pyspec.gpu.step import Steps

pytestmark = pytest.mark.usefixtures("gpu")   # a native adapter (root conftest.py)

F32 = np.float32
POS = 5  # a nonzero start position for the invariance passes

# Awkward shapes: 33 and 32001 outputs, n_in a multiple of the block size (of 4 for F16 / F32 /
# BF16). The formats of a Q4_K_M file and its fallbacks (formats/mixes.py), Q5_K, BF16 and Q4_0:
# 33 outputs and 2 or 3 super-blocks, or 257 and 4 (so that the split path has idle lanes); rows
# of 1024 (q4_k.257x1024, q5_0.40x1024, q6_k.40x1024) take 64 lanes in matmul_coalesced.wgsl,
# the others 32 (ops._coalesced_lanes).
NEW_FORMATS = ["q4_0.33x64", "q5_0.33x96", "q5_1.40x64", "q4_k.33x512", "q4_k.257x1024",
               "q5_k.33x768", "q6_k.33x512", "bf16.33x36", "q5_0.40x1024", "q6_k.40x1024"]
WIDE = ("q4_k.257x1024", "q5_0.40x1024", "q6_k.40x1024")   # 64 lanes where coalesced
MATRICES = {"q4_1.33x64": ((33, 64), quant.Q4_1), "q4_1.257x512": ((257, 512), quant.Q4_1),
            "q8_0.33x96": ((33, 96), quant.Q8_0), "q8_0.32001x64": ((32001, 64), quant.Q8_0),
            "f32.33x36": ((33, 36), quant.F32), "f16.40x100": ((40, 100), quant.F16),
            "norm.576": ((576,), quant.F32), "norm.64": ((64,), quant.F32),
            "norm.1024": ((1024,), quant.F32),
            "bf16.vector": ((64,), quant.BF16),
            **{name: (tuple(int(n) for n in name.split(".")[1].split("x")),
                      quant.BY_NAME[name.split(".")[0].upper()]) for name in NEW_FORMATS}}


@pytest.fixture(scope="module")
def dev():
    d = native.NativeDevice()
    yield d
    d.destroy()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(a GGUF of awkward matrices, a tiny Llama model: hd 64, 3 query heads on 1 KV head)."""
    root = tmp_path_factory.mktemp("gpu_ops")
    rng = np.random.default_rng(0)
    ggufwrite.write(root / "ops.gguf", {"general.architecture": "test"},
               {name: (rng.standard_normal(shape).astype(F32), fmt.type_id)
                for name, (shape, fmt) in MATRICES.items()})
    testmodels.write_model(root / "tiny.gguf", n_layers=1, d=192, n_heads=3, n_kv=1, d_ff=64)
    return GGUFFile.open(root / "ops.gguf"), Model.load(root / "tiny.gguf")


def read(dev, buffer, shape):
    return asyncio.run(dev.read_array(buffer, F32, shape))


def garbage(rng, shape):
    """Stand-in for whatever unused rows hold: large values and NaNs."""
    g = (rng.standard_normal(shape) * 1e3).astype(F32)
    g.reshape(-1)[::7] = np.nan
    return g


def write_rows(dev, buf, rows_src, src, rng):
    """Rows rows_src[src] into the first rows of buf (ROWS_MAX, n), garbage in the rest."""
    host = garbage(rng, (ROWS_MAX, rows_src.shape[1]))
    host[:len(src)] = rows_src[src]
    dev.write(buf, host)


class Pass:
    """One kernel dispatch with its own Step slot: `run(rows, pos)` sets the step and submits."""

    def __init__(self, dev):
        self.dev = dev
        self.steps = Steps(dev, 1)
        self.dispatches = []

    @property
    def step(self):
        return self.steps.binding(0)

    def run(self, rows, pos):
        self.steps.set(0, rows=rows, pos=pos)
        self.steps.upload(1)
        self.dev.submit(self.dispatches)


def assert_batch_invariant(run, pos=POS, ms=range(1, ROWS_MAX + 1)):
    """run(rows, pos, src) fills pass rows r < rows from source rows src[r] (garbage elsewhere),
    runs one pass and returns its output rows. Row i of every m-row pass must equal, byte for
    byte, the one-row pass at position pos + i."""
    single = [run(1, pos + i, [i])[0] for i in range(ROWS_MAX)]
    for m in ms:
        out = run(m, pos, list(range(m)))
        for i in range(m):
            assert out[i].tobytes() == single[i].tobytes(), f"row {i} of a {m}-row pass differs"


# --- matmul -----------------------------------------------------------------------------------

# The products' work splits: "one", a CPU adapter's (lanes 1, matmul.wgsl); "coalesced", a GPU's
# for quantized weights (matmul_coalesced.wgsl); "blocks", a GPU's lanes of whole blocks
# (matmul.wgsl; PYSPEC_MATMUL=blocks, the A/B's old side; dense weights always take it on a GPU).
LAYOUTS = ["one", "blocks", "coalesced"]


def use_layout(dev, monkeypatch, layout):
    """Make the next plans take `layout` on this adapter (lavapipe is a CPU one): the GPU layouts
    through Device.is_cpu = False, the tests' way to run a GPU's kernels here (ops picks the work
    split by adapter), and ops.GPU_MATMUL, the A/B switch."""
    monkeypatch.setattr(dev, "is_cpu", layout == "one")
    monkeypatch.setattr(ops, "GPU_MATMUL", "blocks" if layout == "blocks" else "coalesced")


def matmul_runner(dev, w, rng, accumulate, ctx=POS + 2 * ROWS_MAX):
    """A pass of y[pos + r] (+)= W x[r] into a (ctx, n_out) cache (out_at_pos)."""
    n_out, n_in = w.shape
    xs = rng.standard_normal((ROWS_MAX, n_in)).astype(F32)
    y0 = rng.standard_normal((ROWS_MAX, n_out)).astype(F32)
    x, y = dev.buffer(ROWS_MAX * n_in * 4), dev.buffer(ctx * n_out * 4)
    p = Pass(dev)
    p.dispatches = [ops.matmul(dev, w, x, y, p.step, out_at_pos=True, accumulate=accumulate)]

    def run(rows, pos, src):
        x_in = garbage(rng, (ROWS_MAX, n_in))
        x_in[:rows] = xs[src]
        y_in = garbage(rng, (ctx, n_out))
        y_in[pos:pos + rows] = y0[src]
        dev.write(x, x_in)
        dev.write(y, y_in)
        p.run(rows, pos)
        return read(dev, y, (ctx, n_out))[pos:pos + rows]
    return run


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ["q4_1.33x64", "q4_1.257x512", "q8_0.33x96", "q8_0.32001x64",
                                  "f32.33x36", "f16.40x100", *NEW_FORMATS])
def test_matmul_matches_reference(dev, files, name, layout, monkeypatch):
    use_layout(dev, monkeypatch, layout)
    f, _ = files
    w = weights.Weight.upload(dev, f, name)
    kind = name.split(".")[0]
    assert w.kind == ("f32" if kind == "f16" else kind)
    n_out, n_in = w.shape
    ref_w = f.dequantize(name)                                            # (n_out, n_in)
    rng = np.random.default_rng(1)
    x, y = dev.buffer(ROWS_MAX * n_in * 4), dev.buffer(ROWS_MAX * n_out * 4)
    p = Pass(dev)
    plain = ops.matmul(dev, w, x, y, p.step)
    residual = ops.matmul(dev, w, x, y, p.step, accumulate=True)
    for rows in (1, 7, ROWS_MAX):
        xs = rng.standard_normal((ROWS_MAX, n_in)).astype(F32)
        y0 = rng.standard_normal((ROWS_MAX, n_out)).astype(F32)
        ref = matmul(xs[:rows], ref_w)                                    # (rows, n_out)
        # f32 dot products in another order: atol 1e-6 * sum_k |w_k x_k| (the scale of the
        # rounding error of a dot product), rtol 1e-5.
        atol = 1e-6 * (np.abs(xs[:rows]) @ np.abs(ref_w).T)
        dev.write(x, xs)
        for dispatch, expect in ((plain, ref), (residual, y0[:rows] + ref)):
            dev.write(y, y0)
            p.dispatches = [dispatch]
            p.run(rows, 3)
            got = read(dev, y, (ROWS_MAX, n_out))
            np.testing.assert_array_less(np.abs(got[:rows] - expect), atol + 1e-5 * np.abs(expect))
            assert np.array_equal(got[rows:], y0[rows:]), "rows past step.rows were written"


@pytest.mark.parametrize("name", ["q4_1.257x512", "q8_0.33x96", "f16.40x100"])
def test_a_tensor_streamed_in_parts_holds_the_bytes_of_a_whole_upload(dev, files, name,
                                                                       monkeypatch):
    """stream_rows writes a tensor STREAM_BYTES of the file at a time (3 rows here, so the
    last part is short; Q8_0 padded, F16 widened per part): the buffer equals host_bytes, also
    for a row range (upload_rows' parts)."""
    f = files[0]
    t = f.tensor(name)
    monkeypatch.setattr(weights, "STREAM_BYTES", 3 * t.nbytes // t.shape[0])
    whole = weights.Weight.host_bytes(f, name)[0].view(np.uint8).reshape(t.shape[0], -1)
    for a, b in ((0, t.shape[0]), (5, 18)):
        buf = weights.stream_rows(dev, f, name, a, b, name)
        got = asyncio.run(dev.read_array(buf, np.uint8, ((b - a) * whole.shape[1],)))
        assert np.array_equal(got, whole[a:b].reshape(-1)), (a, b)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name,accumulate", [("q4_1.33x64", False), ("q4_1.257x512", True),
                                             ("q8_0.33x96", True), ("f16.40x100", False),
                                             *((n, i % 2 == 0) for i, n in enumerate(NEW_FORMATS))])
def test_matmul_batch_invariant(dev, files, name, accumulate, layout, monkeypatch):
    """Rows 1..16, bit for bit; split across lanes, each row tile of a pass in a workgroup layer
    of its own (matmul.wgsl, matmul_coalesced.wgsl; a CPU adapter's one layer loops over them)."""
    use_layout(dev, monkeypatch, layout)
    w = weights.Weight.upload(dev, files[0], name)
    assert_batch_invariant(matmul_runner(dev, w, np.random.default_rng(2), accumulate))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_matmul_kernel_by_adapter_kind_and_shape(dev, files, layout, monkeypatch):
    """The kernel and lanes each product takes, so that a layout's tests run the kernel they
    name: a CPU adapter lanes 1 of matmul.wgsl; a GPU matmul_coalesced.wgsl for the quantized
    kinds (32 lanes, 64 for rows of 1024), unless PYSPEC_MATMUL=blocks; dense kinds matmul.wgsl."""
    use_layout(dev, monkeypatch, layout)
    p = Pass(dev)
    for name in ["q4_1.33x64", "q8_0.33x96", "f32.33x36", *NEW_FORMATS]:
        w = weights.Weight.upload(dev, files[0], name)
        n_out, n_in = w.shape
        d = ops.matmul(dev, w, dev.buffer(ROWS_MAX * n_in * 4), dev.buffer(ROWS_MAX * n_out * 4),
                       p.step)
        if layout == "one":
            expect = ("matmul", 1)
        elif layout == "coalesced" and w.kind in ops.COALESCED_KINDS:
            expect = ("matmul_coalesced", 64 if name in WIDE else 32)
        else:
            expect = ("matmul", ops._lanes(n_in // 4 if w.kind in weights.DENSE else n_in // 32,
                                           n_out))
        assert ops.matmul_kernel(dev, w) == expect, name
        assert d.kernel == f"{expect[0]}.{expect[0]}_{w.kind}", name
    monkeypatch.setattr(ops, "GPU_MATMUL", "tiles")
    with pytest.raises(ValueError, match="PYSPEC_MATMUL='tiles'"):
        ops.matmul_kernel(dev, weights.Weight.upload(dev, files[0], "q4_1.33x64"))


def test_matmul_kv_rows_past_the_cache_are_skipped(dev, files):
    w = weights.Weight.upload(dev, files[0], "q4_1.33x64")
    y = dev.buffer(10 * 33 * 4)                                           # a 10-row cache
    x = dev.upload(np.ones((ROWS_MAX, 64), F32))
    p = Pass(dev)
    p.dispatches = [ops.matmul(dev, w, x, y, p.step, out_at_pos=True)]
    dev.write(y, np.zeros((10, 33), F32))
    p.run(4, 8)                                              # rows 8, 9 fit; 10, 11 do not
    got = read(dev, y, (10, 33))
    assert np.all(got[8:] != 0) and np.all(got[:8] == 0)


# --- embed ------------------------------------------------------------------------------------

@pytest.mark.parametrize("source,name", [("model", "token_embd.weight"), ("ops", "q8_0.32001x64"),
                                         ("ops", "q4_1.257x512"), ("ops", "f32.33x36"),
                                         *(("ops", n) for n in NEW_FORMATS)])
def test_embed_exact_and_batch_invariant(dev, files, source, name):
    f = files[0] if source == "ops" else files[1].file
    w = weights.Weight.upload(dev, f, name)
    vocab, d = w.shape
    table = files[1].tok_embd if source == "model" else f.dequantize(name)  # (vocab, d)
    rng = np.random.default_rng(3)
    ids = rng.integers(0, vocab, ROWS_MAX).astype(np.uint32)
    ids[:2] = [0, vocab - 1]
    tokens, x = dev.buffer(ROWS_MAX * 4), dev.buffer(ROWS_MAX * d * 4)
    p = Pass(dev)
    p.dispatches = [ops.embed(dev, w, tokens, x, p.step)]

    def run(rows, pos, src):
        t = rng.integers(0, 2**32, ROWS_MAX, dtype=np.uint32)             # garbage ids, clamped
        t[:rows] = ids[src]
        dev.write(tokens, t)
        dev.write(x, garbage(rng, (ROWS_MAX, d)))
        p.run(rows, pos)
        return read(dev, x, (ROWS_MAX, d))[:rows]

    got = run(ROWS_MAX, 0, list(range(ROWS_MAX)))
    assert got.tobytes() == table[ids].astype(F32).tobytes()             # exact: same roundings
    assert_batch_invariant(run)


# --- rmsnorm ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["norm.576", "norm.64", "bf16.vector"])
def test_rmsnorm(dev, files, name):
    f = files[0]
    w = weights.Weight.upload(dev, f, name)
    assert w.kind == "f32"    # a BF16 vector is widened (weights._KINDS)
    (d,) = w.shape
    eps = 1e-5
    rng = np.random.default_rng(4)
    xs = (rng.standard_normal((ROWS_MAX, d)) * 3).astype(F32)
    x, y = dev.buffer(ROWS_MAX * d * 4), dev.buffer(ROWS_MAX * d * 4)
    p = Pass(dev)
    p.dispatches = [ops.rmsnorm(dev, x, w, y, p.step, eps=eps)]

    def run(rows, pos, src):
        x_in = garbage(rng, (ROWS_MAX, d))
        x_in[:rows] = xs[src]
        dev.write(x, x_in)
        p.run(rows, pos)
        return read(dev, y, (ROWS_MAX, d))[:rows]

    ref = rms_norm(xs, f.dequantize(name), eps)
    np.testing.assert_allclose(run(ROWS_MAX, 0, list(range(ROWS_MAX))), ref,
                               rtol=1e-5, atol=1e-6)                      # atol 1e-6 + rtol 1e-5
    assert_batch_invariant(run)


# --- matmul with RMSNorm folded in -------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pair", ["model", "q4_1.33x64", "q4_k.257x1024"])
def test_matmul_folds_rmsnorm(dev, files, pair, layout, monkeypatch):
    """matmul(x, norm=g) vs the reference's W rms_norm(x, g): rows of very different scales (the
    norm matters), batch-invariant."""
    use_layout(dev, monkeypatch, layout)
    if pair == "model":   # the tiny Llama's Q product and its attention norm
        f, name, norm = files[1].file, "blk.0.attn_q.weight", "blk.0.attn_norm.weight"
    else:
        f, name = files[0], pair
        norm = f"norm.{f.tensor(name).shape[1]}"
    w, g = weights.Weight.upload(dev, f, name), weights.Weight.upload(dev, f, norm)
    ref_w, ref_g = f.dequantize(name), f.dequantize(norm)
    n_out, n_in = w.shape
    eps = 1e-5
    rng = np.random.default_rng(4)
    xs = (rng.standard_normal((ROWS_MAX, n_in))
          * np.geomspace(1e-2, 1e2, ROWS_MAX)[:, None]).astype(F32)
    x, y = dev.buffer(ROWS_MAX * n_in * 4), dev.buffer(ROWS_MAX * n_out * 4)
    p = Pass(dev)
    p.dispatches = [ops.matmul(dev, w, x, y, p.step, norm=g, eps=eps)]

    def run(rows, pos, src):
        write_rows(dev, x, xs, src, rng)
        p.run(rows, pos)
        return read(dev, y, (ROWS_MAX, n_out))[:rows]

    h = rms_norm(xs, ref_g, eps)                                          # (ROWS_MAX, n_in)
    ref = matmul(h, ref_w)
    atol = 4e-6 * (np.abs(h) @ np.abs(ref_w).T)      # a dot product's rounding, as for matmul
    got = run(ROWS_MAX, 0, list(range(ROWS_MAX)))
    assert (np.abs(got - ref) <= atol + 1e-5 * np.abs(ref)).all()
    assert_batch_invariant(run)


# --- matmul with the RoPE epilogue -----------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("at_pos", [False, True])     # Q into activations, K into a KV cache
def test_matmul_rope_epilogue(dev, files, at_pos, layout, monkeypatch):
    """The Q and K products with RoPE fused into their store vs rope(W x) of the reference, at
    positions 0, 3 and the end of an 8192-row table, and batch-invariant."""
    model = files[1]
    cfg = model.config
    use_layout(dev, monkeypatch, layout)   # lanes > 1: the reduction across lanes
    f = model.file
    name = "blk.0.attn_k.weight" if at_pos else "blk.0.attn_q.weight"
    w = weights.Weight.upload(dev, f, name)
    n_out, n_in = w.shape
    hd, ctx = cfg.head_dim, 8192
    y_rows = ctx if at_pos else ROWS_MAX
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((ROWS_MAX, n_in)).astype(F32)
    table = ops.rope_table(dev, model.inv_freq[0], ctx)
    x, y = dev.buffer(ROWS_MAX * n_in * 4), dev.buffer(y_rows * n_out * 4)
    p = Pass(dev)
    p.dispatches = [ops.matmul(dev, w, x, y, p.step, out_at_pos=at_pos, rope=table,
                               head_dim=hd, max_ctx=ctx)]

    def run(rows, pos, src):
        base = pos if at_pos else 0
        write_rows(dev, x, xs, src, rng)
        dev.write(y, np.zeros((y_rows, n_out), F32))
        p.run(rows, pos)
        return read(dev, y, (y_rows, n_out))[base:base + rows]

    ref_w = f.dequantize(name)                                            # (n_out, n_in)
    # f32 dot products in another order, then a rotation mixing two of them: atol scaled by
    # sum_k |w_k x_k| of the pair's larger member, rtol 1e-5.
    scale = np.abs(xs) @ np.abs(ref_w).T                                  # (ROWS_MAX, n_out)
    scale = np.maximum(scale, scale.reshape(ROWS_MAX, -1, 2)[..., ::-1].reshape(ROWS_MAX, -1))
    for pos in (0, 3, ctx - ROWS_MAX):
        ref = model.rope(matmul(xs, ref_w).reshape(ROWS_MAX, -1, hd),
                         np.arange(pos, pos + ROWS_MAX)).reshape(ROWS_MAX, n_out)
        got = run(ROWS_MAX, pos, list(range(ROWS_MAX)))
        assert (np.abs(got - ref) <= 2e-6 * scale + 1e-5 * np.abs(ref)).all(), pos
    assert_batch_invariant(run, pos=1000)
    with pytest.raises(ops.ShapeError, match="RoPE"):
        ops.matmul(dev, w, x, y, p.step, out_at_pos=at_pos, rope=table, head_dim=hd - 1,
                   max_ctx=ctx)


# --- attention --------------------------------------------------------------------------------

@pytest.mark.parametrize("entry", ["attention", "attention_cpu"])
def test_attention(dev, files, entry, monkeypatch):
    """Both entry points vs Model.attention from position 0 to an 8192-long context, around
    every split the kernel makes (its threads' stride and its position groups); cache rows past
    the last position hold NaN, so reading the future would show. Batch-invariant near and far."""
    monkeypatch.setattr(dev, "is_cpu", entry == "attention_cpu")
    model = files[1]
    cfg = model.config
    hd, nh, nkv, ctx = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, 8192
    threads = ops.ATTN_WG_CPU if entry == "attention_cpu" else ops.ATTN_WG
    groups = ops.attention_groups(hd, threads)
    assert 1 < groups < threads          # both splits are exercised
    rng = np.random.default_rng(6)
    kc = rng.standard_normal((ctx, nkv, hd)).astype(F32)                  # (ctx, n_kv, hd)
    vc = rng.standard_normal((ctx, nkv, hd)).astype(F32)
    qs = (rng.standard_normal((ROWS_MAX, nh, hd)) * 2).astype(F32)        # peaked softmaxes
    q, out = dev.buffer(ROWS_MAX * nh * hd * 4), dev.buffer(ROWS_MAX * nh * hd * 4)
    kbuf, vbuf = dev.buffer(kc.nbytes), dev.buffer(vc.nbytes)
    scratch = dev.buffer(ops.attention_scratch_bytes(nh, ctx))
    p = Pass(dev)
    p.dispatches = [ops.attention(dev, q, kbuf, vbuf, scratch, out, p.step, n_heads=nh,
                                  n_kv_heads=nkv, head_dim=hd, max_ctx=ctx)]
    assert p.dispatches[0].kernel == f"attention.{entry}"

    def fill_cache(last):
        """Cache rows 0..last valid, NaN after."""
        k, v = kc.copy(), vc.copy()
        k[last + 1:], v[last + 1:] = np.nan, np.nan
        dev.write(kbuf, k)
        dev.write(vbuf, v)

    def run(rows, pos, src):
        q_in = garbage(rng, (ROWS_MAX, nh * hd))
        q_in[:rows] = qs[src].reshape(rows, -1)
        dev.write(q, q_in)
        dev.write(out, garbage(rng, (ROWS_MAX, nh * hd)))
        p.run(rows, pos)
        return read(dev, out, (ROWS_MAX, nh * hd))[:rows]

    # Rows cover p = 0, 1, groups - 1, groups, groups + 1, threads - 1, threads, threads + 1,
    # ~1000, ~2000 and the end of the cache.
    passes = ((0, ROWS_MAX), (groups - 1, 3), (threads - 2, 4), (37, 5), (999, 3), (1998, 4),
              (ctx - ROWS_MAX, ROWS_MAX))
    for pos, rows in passes:
        fill_cache(pos + rows - 1)
        ref = model.attention(qs[:rows], kc, vc, np.arange(pos, pos + rows))
        # exp and a different summation order: atol 1e-5 + rtol 1e-4 (outputs are O(1)).
        np.testing.assert_allclose(run(rows, pos, list(range(rows))), ref, rtol=1e-4, atol=1e-5,
                                   err_msg=f"pos {pos}")
    for pos in (300, 1000):
        fill_cache(pos + ROWS_MAX - 1)
        assert_batch_invariant(run, pos=pos)


# --- Q, K and V as one product --------------------------------------------------------------

@pytest.fixture(scope="module")
def mixes(tmp_path_factory):
    """Q4_K_M tiny models (formats/mixes.py) of one layer, whose attn_v has more bits than
    attn_q / attn_k: width 256 (Q4_K with V in Q6_K) and 192 (the fallbacks: Q5_0, V in Q8_0)."""
    root = tmp_path_factory.mktemp("mixes")
    out = {}
    for d, heads, kv in ((256, 4, 2), (192, 3, 1)):
        testmodels.write_model(root / f"{d}.gguf", n_layers=1, d=d, n_heads=heads, n_kv=kv,
                               d_ff=256, matrix_type="Q4_K_M", seed=d)
        out[f"q4_k_m.{d}"] = Model.load(root / f"{d}.gguf")
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("source,kinds", [("model", ("q4_1", "")), ("q4_k_m.256", ("q4_k", "q6_k")),
                                          ("q4_k_m.192", ("q5_0", "q8_0"))])
def test_matmul_qkv_routes_rotates_and_caches(dev, files, mixes, source, kinds, layout,
                                               monkeypatch):
    """One product over the stacked Q, K, V rows: Q (rotated) into activations, K (rotated) and V
    into cache rows pos.., vs the reference's three products and RoPE; batch-invariant. Also for
    a K-quant mix whose V rows are in another format than Q and K (matmul.wgsl's quantized_v,
    matmul_coalesced.wgsl's coalesced)."""
    use_layout(dev, monkeypatch, layout)
    model = files[1] if source == "model" else mixes[source]
    cfg, f = model.config, model.file
    names = [f"blk.0.attn_{n}.weight" for n in "qkv"]
    w = weights.Weight.upload_stack(dev, f, names)
    assert (w.kind, w.v_kind) == kinds
    assert w.nbytes == sum(weights.Weight.host_bytes(f, n)[0].nbytes for n in names)
    refs = [f.dequantize(n) for n in names]                               # (n_out_i, n_in)
    (nq, n_in), nk, nv = refs[0].shape, refs[1].shape[0], refs[2].shape[0]
    assert w.shape == (nq + nk + nv, n_in)
    hd, ctx = cfg.head_dim, 64
    rng = np.random.default_rng(11)
    xs = rng.standard_normal((ROWS_MAX, n_in)).astype(F32)
    table = ops.rope_table(dev, model.inv_freq[0], ctx)
    x, q = dev.buffer(ROWS_MAX * n_in * 4), dev.buffer(ROWS_MAX * nq * 4)
    kc, vc = dev.buffer(ctx * nk * 4), dev.buffer(ctx * nv * 4)
    p = Pass(dev)
    p.dispatches = [ops.matmul(dev, w, x, q, p.step, qkv=(kc, vc, nq, nk), rope=table,
                               head_dim=hd, max_ctx=ctx)]

    def run(rows, pos, src):
        write_rows(dev, x, xs, src, rng)
        for buf, n in ((q, ROWS_MAX * nq), (kc, ctx * nk), (vc, ctx * nv)):
            dev.write(buf, np.full(n, 7.0, F32))
        p.run(rows, pos)
        got_q = read(dev, q, (ROWS_MAX, nq))
        got_k, got_v = read(dev, kc, (ctx, nk)), read(dev, vc, (ctx, nv))
        # nothing outside this pass's rows was written
        assert (got_q[rows:] == 7).all() and (np.delete(got_k, range(pos, pos + rows), 0) == 7).all()
        return np.concatenate([got_q[:rows], got_k[pos:pos + rows], got_v[pos:pos + rows]], 1)

    pos = 5
    positions = np.arange(pos, pos + ROWS_MAX)
    ref = np.concatenate([
        model.rope(matmul(xs, refs[0]).reshape(ROWS_MAX, -1, hd), positions).reshape(ROWS_MAX, nq),
        model.rope(matmul(xs, refs[1]).reshape(ROWS_MAX, -1, hd), positions).reshape(ROWS_MAX, nk),
        matmul(xs, refs[2])], 1)
    scale = np.abs(xs) @ np.abs(np.concatenate(refs)).T                  # (ROWS_MAX, n_out)
    got = run(ROWS_MAX, pos, list(range(ROWS_MAX)))
    assert (np.abs(got - ref) <= 4e-6 * scale.max(axis=1, keepdims=True)
            + 1e-5 * np.abs(ref)).all()
    assert_batch_invariant(run, pos=pos)
    with pytest.raises(ops.ShapeError, match="Q, K and V"):
        ops.matmul(dev, w, x, q, p.step, qkv=(kc, vc, nq, nk), accumulate=True)


# --- gate and up as one product, with the SiLU-gate epilogue ---------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pair", ["model", "q8_0.33x96", "f32.33x36"])
def test_matmul_silu_gate_epilogue(dev, files, pair, layout, monkeypatch):
    """y = silu(W_gate x) * (W_up x) from one product over the interleaved pair, vs the
    reference's two products and gate; batch-invariant."""
    use_layout(dev, monkeypatch, layout)
    if pair == "model":   # the tiny Llama's own gate and up (Q4_1, 64 x 192)
        f, gate, up = files[1].file, "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"
    else:                 # a matrix paired with itself: g = u
        f, gate, up = files[0], pair, pair
    w = weights.Weight.upload_pair(dev, f, gate, up)
    ref_g, ref_u = f.dequantize(gate), f.dequantize(up)                  # (d_ff, n_in) each
    d_ff, n_in = ref_g.shape
    assert w.shape == (2 * d_ff, n_in) and w.nbytes == 2 * weights.Weight.upload(dev, f, up).nbytes
    rng = np.random.default_rng(7)
    xs = rng.standard_normal((ROWS_MAX, n_in)).astype(F32)
    x, y = dev.buffer(ROWS_MAX * n_in * 4), dev.buffer(ROWS_MAX * d_ff * 4)
    p = Pass(dev)
    p.dispatches = [ops.matmul(dev, w, x, y, p.step, gate="silu")]

    def run(rows, pos, src):
        write_rows(dev, x, xs, src, rng)
        p.run(rows, pos)
        return read(dev, y, (ROWS_MAX, d_ff))[:rows]

    g, u = matmul(xs, ref_g), matmul(xs, ref_u)
    ref = g / (1 + np.exp(-g)) * u
    # The products' rounding (atol 1e-6 * sum_k |w_k x_k|, as for matmul) times the gate's slope.
    scale = np.abs(xs) @ np.abs(np.concatenate([ref_g, ref_u])).T         # (ROWS_MAX, 2 d_ff)
    atol = 2e-6 * np.maximum(scale[:, :d_ff], scale[:, d_ff:]) * (1 + np.abs(g) + np.abs(u))
    got = run(ROWS_MAX, 0, list(range(ROWS_MAX)))
    assert (np.abs(got - ref) <= atol + 1e-5 * np.abs(ref)).all()
    assert_batch_invariant(run)
    with pytest.raises(ops.ShapeError, match="gate"):
        ops.matmul(dev, w, x, y, p.step, gate="silu", accumulate=True)


def test_shape_errors(dev, files):
    w = weights.Weight.upload(dev, files[0], "q4_1.33x64")
    p = Pass(dev)
    small = dev.buffer(64)
    with pytest.raises(ops.ShapeError, match="matmul x"):
        ops.matmul(dev, w, small, dev.buffer(ROWS_MAX * 33 * 4), p.step)
    with pytest.raises(ops.ShapeError, match="folded RMSNorm"):
        ops.matmul(dev, w, dev.buffer(ROWS_MAX * 64 * 4), dev.buffer(ROWS_MAX * 33 * 4), p.step,
                   norm=w)
    with pytest.raises(ops.ShapeError, match="divide"):
        ops.attention(dev, small, small, small, small, small, p.step, n_heads=3, n_kv_heads=2,
                      head_dim=64, max_ctx=16)
    with pytest.raises(ops.ShapeError, match="multiple of 4"):
        ops.attention(dev, small, small, small, small, small, p.step, n_heads=2, n_kv_heads=1,
                      head_dim=6, max_ctx=16)
    with pytest.raises(ops.ShapeError, match="attention scratch"):
        width = 2 * 64 * 4
        ops.attention(dev, dev.buffer(ROWS_MAX * width), dev.buffer(16 * width // 2),
                      dev.buffer(16 * width // 2), dev.buffer(ROWS_MAX * 2 * 16 * 4 // 2),
                      dev.buffer(ROWS_MAX * width), p.step, n_heads=2, n_kv_heads=1,
                      head_dim=64, max_ctx=16)
