"""The GPU kernels' features for the model families beyond Llama (issue 44) against numpy
computations written here, on a native adapter, and their batch invariance, bit for bit:
attention with a sliding window, a score scale and head sizes 64/128/256; per-head Q/K RMSNorm
then RoPE (qk_norm); Q/K/V biases in the product's epilogue; the GELU-tanh gate epilogue; the
embedding scale; the residual add of a normed output (Gemma 3's post-norms).

The helpers (Pass, garbage, assert_batch_invariant, ...) are test_gpu_ops.py's. Float
tolerances are atol + rtol * |ref|, stated at each check.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_gpu_ops import (LAYOUTS, Pass, assert_batch_invariant,  # noqa: F401 (dev: fixture)
                          dev, garbage, read, use_layout, write_rows)

from pyspec import testmodels
from pyspec.cpu.model import Model, matmul, rms_norm
from pyspec.formats import ggufwrite, quant
from pyspec.formats.gguf import GGUFFile
from pyspec.gpu import ops, weights
from pyspec.gpu.device import ROWS_MAX

pytestmark = pytest.mark.usefixtures("gpu")   # a native adapter (root conftest.py)

F32 = np.float32


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama model (hd 64, 3 query heads on 1 KV head) and a GGUF of a Q8_0 (gate, up)."""
    root = tmp_path_factory.mktemp("gpu_family_ops")
    testmodels.write_model(root / "tiny.gguf", n_layers=1, d=192, n_heads=3, n_kv=1, d_ff=64)
    rng = np.random.default_rng(0)
    ggufwrite.write(root / "ops.gguf", {"general.architecture": "test"},
               {"gate": (rng.standard_normal((40, 96)).astype(F32), quant.Q8_0.type_id),
                "up": (rng.standard_normal((40, 96)).astype(F32), quant.Q8_0.type_id),
                "norm": (rng.standard_normal(96).astype(F32), quant.F32.type_id)})
    return Model.load(root / "tiny.gguf"), GGUFFile.open(root / "ops.gguf")


def inv_freq(hd: int, base: float = 10000.0, factors=None) -> np.ndarray:
    """(hd/2,) float64: base^(-2i/hd) / factor_i (Llama 3's rope_freqs divide the frequency)."""
    f = base ** (-np.arange(hd // 2, dtype=np.float64) * 2 / hd)
    return f if factors is None else f / np.asarray(factors, np.float64)


def rope_adjacent(x: np.ndarray, positions: np.ndarray, freq: np.ndarray) -> np.ndarray:
    """x (m, heads, hd) with pairs (2i, 2i+1) rotated by position * freq_i, in f32."""
    ang = positions[:, None].astype(np.float64) * freq[None, :]             # (m, hd/2)
    cos, sin = np.cos(ang).astype(F32)[:, None], np.sin(ang).astype(F32)[:, None]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


# --- attention: window, scale, head sizes -------------------------------------------------------

def attention_ref(q, kc, vc, positions, scale, window):
    """q (m, nh, hd); kc, vc (ctx, nkv, hd) -> (m, nh*hd): row i over positions
    max(0, p + 1 - window)..p (all of 0..p without a window), scores q.k * f32(scale)."""
    m, nh, hd = q.shape
    group = nh // kc.shape[1]
    out = np.empty((m, nh * hd), F32)
    for i, p in enumerate(positions):
        lo = max(0, p + 1 - window) if window else 0
        for h in range(nh):
            k, v = kc[lo:p + 1, h // group], vc[lo:p + 1, h // group]      # (t, hd)
            s = (k @ q[i, h]) * F32(scale)
            e = np.exp(s - s.max())
            out[i, h * hd:(h + 1) * hd] = (e / e.sum()) @ v
    return out


@pytest.mark.parametrize("entry", ["attention", "attention_cpu"])
@pytest.mark.parametrize("hd,window", [(64, 5), (128, 0), (256, 40)])
def test_attention_window_scale_and_head_sizes(dev, entry, hd, window, monkeypatch):
    """Sliding windows across their edge (rows before, at and past the window) and beyond the
    threads' stride; a score scale that is not 1/sqrt(hd); cache rows outside the window hold
    NaN, so reading them would show. Batch-invariant."""
    monkeypatch.setattr(dev, "is_cpu", entry == "attention_cpu")
    nh, nkv, ctx, scale = 4, 2, 160, 0.3
    rng = np.random.default_rng(hd + window)
    kc = rng.standard_normal((ctx, nkv, hd)).astype(F32)
    vc = rng.standard_normal((ctx, nkv, hd)).astype(F32)
    qs = (rng.standard_normal((ROWS_MAX, nh, hd)) * 0.5).astype(F32)
    q, out = dev.buffer(ROWS_MAX * nh * hd * 4), dev.buffer(ROWS_MAX * nh * hd * 4)
    kbuf, vbuf = dev.buffer(kc.nbytes), dev.buffer(vc.nbytes)
    scratch = dev.buffer(ops.attention_scratch_bytes(nh, ctx))
    p = Pass(dev)
    p.dispatches = [ops.attention(dev, q, kbuf, vbuf, scratch, out, p.step, n_heads=nh,
                                  n_kv_heads=nkv, head_dim=hd, max_ctx=ctx, scale=scale,
                                  window=window)]

    def fill_cache(first, last):
        """Cache rows first..last valid, NaN elsewhere."""
        k, v = kc.copy(), vc.copy()
        for a in (k, v):
            a[:first], a[last + 1:] = np.nan, np.nan
        dev.write(kbuf, k)
        dev.write(vbuf, v)

    def run(rows, pos, src):
        q_in = garbage(rng, (ROWS_MAX, nh * hd))
        q_in[:rows] = qs[src].reshape(rows, -1)
        dev.write(q, q_in)
        p.run(rows, pos)
        return read(dev, out, (ROWS_MAX, nh * hd))[:rows]

    for pos, rows in ((0, ROWS_MAX), (window or 3, 7), (ctx - ROWS_MAX, ROWS_MAX)):
        fill_cache(max(0, pos + 1 - window) if window else 0, pos + rows - 1)
        positions = np.arange(pos, pos + rows)
        ref = attention_ref(qs[:rows], kc, vc, positions, scale, window)
        # exp and a different summation order: atol 1e-5 + rtol 1e-4 (outputs are O(1)).
        np.testing.assert_allclose(run(rows, pos, list(range(rows))), ref, rtol=1e-4, atol=1e-5,
                                   err_msg=f"pos {pos}")
    fill_cache(max(0, 100 - window) if window else 0, 100 + ROWS_MAX - 1)
    assert_batch_invariant(run, pos=100)


# --- per-head Q/K norm, then RoPE ---------------------------------------------------------------

@pytest.mark.parametrize("hd", [64, 256])
def test_qk_norm(dev, hd):
    """qk_norm vs rope(rms_norm(head, w)) per Q head (in q) and K head (cache rows pos..), with
    Llama 3-style frequency factors in the table; rows outside the pass untouched;
    batch-invariant."""
    nh, nkv, ctx, eps = 3, 1, 64, 1e-6
    rng = np.random.default_rng(hd)
    qs = (rng.standard_normal((ROWS_MAX, nh, hd)) * 3).astype(F32)
    ks = (rng.standard_normal((ROWS_MAX, nkv, hd)) * 0.1).astype(F32)
    g = rng.standard_normal((2, hd)).astype(F32)                          # q_norm, k_norm
    freq = inv_freq(hd, 1e6, rng.uniform(1, 8, hd // 2))
    weight = weights.Weight.vector(dev, g, "qk norms")
    table = ops.rope_table(dev, freq, ctx)
    q, kc = dev.buffer(ROWS_MAX * nh * hd * 4), dev.buffer(ctx * nkv * hd * 4)
    p = Pass(dev)
    p.dispatches = [ops.qk_norm(dev, q, kc, weight, table, p.step, n_heads=nh, n_kv_heads=nkv,
                                head_dim=hd, max_ctx=ctx, eps=eps)]

    def run(rows, pos, src):
        q_in = garbage(rng, (ROWS_MAX, nh * hd))
        q_in[:rows] = qs[src].reshape(rows, -1)
        k_in = np.full((ctx, nkv * hd), 7.0, F32)
        k_in[pos:pos + rows] = ks[src].reshape(rows, -1)
        dev.write(q, q_in)
        dev.write(kc, k_in)
        p.run(rows, pos)
        got_k = read(dev, kc, (ctx, nkv * hd))
        assert (np.delete(got_k, range(pos, pos + rows), 0) == 7).all()
        return np.concatenate([read(dev, q, (ROWS_MAX, nh * hd))[:rows], got_k[pos:pos + rows]], 1)

    pos = 9
    positions = np.arange(pos, pos + ROWS_MAX)
    ref = np.concatenate([
        rope_adjacent(rms_norm(qs, g[0], eps), positions, freq).reshape(ROWS_MAX, -1),
        rope_adjacent(rms_norm(ks, g[1], eps), positions, freq).reshape(ROWS_MAX, -1)], 1)
    # a sum of squares in another order, then a rotation: atol 1e-5 * |w| + rtol 1e-5
    atol = 1e-5 * np.abs(g).max()
    np.testing.assert_allclose(run(ROWS_MAX, pos, list(range(ROWS_MAX))), ref, rtol=1e-5,
                               atol=atol)
    assert_batch_invariant(run, pos=pos)
    with pytest.raises(ops.ShapeError, match="qk_norm"):
        ops.qk_norm(dev, q, kc, weights.Weight.vector(dev, g[0], "q only"), table, p.step,
                    n_heads=nh, n_kv_heads=nkv, head_dim=hd, max_ctx=ctx, eps=eps)


# --- the Q/K/V product with biases ----------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rope", [True, False])   # Qwen2 rotates in the epilogue; Qwen3 does not
def test_matmul_qkv_bias(dev, tiny, layout, rope, monkeypatch):
    """One product over stacked Q, K, V rows plus their stacked biases, then (with rope) the
    rotation, vs the reference's products + bias; batch-invariant."""
    use_layout(dev, monkeypatch, layout)
    model = tiny[0]
    cfg, f = model.config, model.file
    names = [f"blk.0.attn_{n}.weight" for n in "qkv"]
    w = weights.Weight.upload_stack(dev, f, names)
    refs = [f.dequantize(n) for n in names]                               # (n_out_i, n_in)
    (nq, n_in), nk, nv = refs[0].shape, refs[1].shape[0], refs[2].shape[0]
    hd, ctx = cfg.head_dim, 48
    rng = np.random.default_rng(12)
    b = rng.standard_normal(nq + nk + nv).astype(F32) * 4                 # (n_out,)
    bias = weights.Weight.vector(dev, b, "qkv bias")
    xs = rng.standard_normal((ROWS_MAX, n_in)).astype(F32)
    freq = inv_freq(hd)
    table = ops.rope_table(dev, freq, ctx)
    x, q = dev.buffer(ROWS_MAX * n_in * 4), dev.buffer(ROWS_MAX * nq * 4)
    kc, vc = dev.buffer(ctx * nk * 4), dev.buffer(ctx * nv * 4)
    p = Pass(dev)
    rope_args = {"rope": table, "head_dim": hd, "max_ctx": ctx} if rope else {}
    p.dispatches = [ops.matmul(dev, w, x, q, p.step, qkv=(kc, vc, nq, nk), bias=bias,
                               **rope_args)]

    def run(rows, pos, src):
        write_rows(dev, x, xs, src, rng)
        p.run(rows, pos)
        return np.concatenate([read(dev, q, (ROWS_MAX, nq))[:rows],
                               read(dev, kc, (ctx, nk))[pos:pos + rows],
                               read(dev, vc, (ctx, nv))[pos:pos + rows]], 1)

    pos = 5
    positions = np.arange(pos, pos + ROWS_MAX)
    parts = [matmul(xs, r) + bb for r, bb in zip(refs, np.split(b, [nq, nq + nk]))]
    if rope:
        parts[:2] = [rope_adjacent(a.reshape(ROWS_MAX, -1, hd), positions, freq)
                     .reshape(ROWS_MAX, -1) for a in parts[:2]]
    ref = np.concatenate(parts, 1)
    scale = np.abs(xs) @ np.abs(np.concatenate(refs)).T + np.abs(b)      # (ROWS_MAX, n_out)
    got = run(ROWS_MAX, pos, list(range(ROWS_MAX)))
    assert (np.abs(got - ref) <= 4e-6 * scale.max(axis=1, keepdims=True)
            + 1e-5 * np.abs(ref)).all()
    assert_batch_invariant(run, pos=pos)
    with pytest.raises(ops.ShapeError, match="bias"):
        ops.matmul(dev, w, x, q, p.step, qkv=(kc, vc, nq, nk), bias=weights.Weight.vector(
            dev, b[:nq], "short"))


# --- the GELU-tanh gate ---------------------------------------------------------------------------

def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in f32 (ggml_gelu's formula)."""
    c = F32(np.sqrt(2 / np.pi))
    return F32(0.5) * x * (1 + np.tanh(c * (x + F32(0.044715) * x * x * x)))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_matmul_gelu_gate_epilogue(dev, tiny, layout, monkeypatch):
    """y = gelu_tanh(W_gate x) * (W_up x) from one product over the interleaved pair, with the
    norm folded in (Gemma's gate and up follow its pre-FFN norm); inputs up to |g| ~ 30, where
    a naive tanh overflows; batch-invariant."""
    use_layout(dev, monkeypatch, layout)
    f = tiny[1]
    w = weights.Weight.upload_pair(dev, f, "gate", "up")
    norm = weights.Weight.upload(dev, f, "norm")
    ref_g, ref_u, ref_n = f.dequantize("gate"), f.dequantize("up"), f.dequantize("norm")
    d_ff, n_in = ref_g.shape
    eps = 1e-6
    rng = np.random.default_rng(8)
    xs = (rng.standard_normal((ROWS_MAX, n_in))
          * np.geomspace(1e-2, 1e2, ROWS_MAX)[:, None]).astype(F32)
    x, y = dev.buffer(ROWS_MAX * n_in * 4), dev.buffer(ROWS_MAX * d_ff * 4)
    p = Pass(dev)
    p.dispatches = [ops.matmul(dev, w, x, y, p.step, gate="gelu_tanh", norm=norm, eps=eps)]

    def run(rows, pos, src):
        write_rows(dev, x, xs, src, rng)
        p.run(rows, pos)
        return read(dev, y, (ROWS_MAX, d_ff))[:rows]

    h = rms_norm(xs, ref_n, eps)
    g, u = matmul(h, ref_g), matmul(h, ref_u)
    assert np.abs(g).max() > 20
    ref = gelu_tanh(g) * u
    # the products' rounding (4e-6 * sum_k |w_k h_k|) times the gate's slope (<= 1.13)
    scale = np.abs(h) @ np.abs(np.concatenate([ref_g, ref_u])).T          # (ROWS_MAX, 2 d_ff)
    atol = 4e-6 * np.maximum(scale[:, :d_ff], scale[:, d_ff:]) * (1 + np.abs(g) + np.abs(u))
    got = run(ROWS_MAX, 0, list(range(ROWS_MAX)))
    assert np.isfinite(got).all() and (np.abs(got - ref) <= atol + 1e-5 * np.abs(ref)).all()
    assert_batch_invariant(run)
    with pytest.raises(ops.ShapeError, match="gate"):
        ops.matmul(dev, w, x, y, p.step, gate="relu")


# --- the embedding scale and the normed residual add ----------------------------------------------

def test_embed_scale_is_exact(dev, tiny):
    """x = table[token] * f32(sqrt(d)), bit for bit (Gemma 3's scaled embeddings)."""
    model = tiny[0]
    w = weights.Weight.upload(dev, model.file, "token_embd.weight")
    vocab, d = w.shape
    scale = float(np.sqrt(F32(d)))
    rng = np.random.default_rng(3)
    ids = rng.integers(0, vocab, ROWS_MAX).astype(np.uint32)
    tokens, x = dev.upload(ids), dev.buffer(ROWS_MAX * d * 4)
    p = Pass(dev)
    p.dispatches = [ops.embed(dev, w, tokens, x, p.step, scale=scale)]
    p.run(ROWS_MAX, 0)
    want = model.tok_embd[ids].astype(F32) * F32(scale)
    assert read(dev, x, (ROWS_MAX, d)).tobytes() == want.tobytes()


def test_rmsnorm_accumulate(dev, tiny):
    """y += rms_norm(x, w): the residual add of Gemma 3's post-attention / post-FFN norms;
    batch-invariant."""
    f = tiny[1]
    w = weights.Weight.upload(dev, f, "norm")
    (d,) = w.shape
    eps = 1e-6
    rng = np.random.default_rng(4)
    xs = (rng.standard_normal((ROWS_MAX, d)) * 3).astype(F32)
    y0 = rng.standard_normal((ROWS_MAX, d)).astype(F32)
    x, y = dev.buffer(ROWS_MAX * d * 4), dev.buffer(ROWS_MAX * d * 4)
    p = Pass(dev)
    p.dispatches = [ops.rmsnorm(dev, x, w, y, p.step, eps=eps, accumulate=True)]

    def run(rows, pos, src):
        write_rows(dev, x, xs, src, rng)
        y_in = garbage(rng, (ROWS_MAX, d))
        y_in[:rows] = y0[src]
        dev.write(y, y_in)
        p.run(rows, pos)
        return read(dev, y, (ROWS_MAX, d))[:rows]

    ref = y0 + rms_norm(xs, f.dequantize("norm"), eps)
    np.testing.assert_allclose(run(ROWS_MAX, 0, list(range(ROWS_MAX))), ref,
                               rtol=1e-5, atol=1e-5)                      # atol 1e-5 + rtol 1e-5
    assert_batch_invariant(run)


# --- a 262,144-token vocabulary (Gemma 3) through argmax, softmax and sampling ------------------

@pytest.mark.parametrize("split", [False, True], ids=["one-workgroup", "split"])
def test_sampling_over_262144_ids(dev, split):
    """argmax_rows, softmax_rows and sample_rows over Gemma 3's vocabulary (256 parts of
    ARGMAX_CHUNK ids when split) against verify.py, with the winner in the last part and a tie
    across parts; test_gpu_sampling.py's passes and tolerances."""
    from test_gpu_sampling import (POS, SEED, argmax_pass, random_logits, sample_pass,
                                   softmax_pass)

    from pyspec.gpu.constants import ARGMAX_CHUNK
    from pyspec.rules import rng, verify

    vocab, rows = 262144, 4
    gen = np.random.default_rng(262144)
    logits = random_logits(gen, rows, vocab)
    logits[1, vocab - 1] = 100.0                                   # the last id
    logits[2, [3, vocab - ARGMAX_CHUNK]] = logits[2].max() + 1.0   # a tie: the lowest id wins
    tokens, _ = argmax_pass(dev, logits, rows, "greedy", 0.0, split=split)
    np.testing.assert_array_equal(tokens, np.argmax(logits.astype(np.float64), axis=-1))
    assert tokens[1] == vocab - 1 and tokens[2] == 3
    probs, conf = softmax_pass(dev, logits, rows, 0.7, split=split)
    ref = verify.softmax(logits, 0.7)
    assert (np.abs(probs - ref) <= 1e-9 + 2e-5 * ref).all()
    u = rng.uniforms(SEED, POS + 1 + np.arange(rows), rng.STREAM_DRAFT, 0)
    drawn = sample_pass(dev, probs, rows, split=split)
    np.testing.assert_array_equal(drawn, verify.sample_categorical_rows(
        probs.astype(np.float64), u))
