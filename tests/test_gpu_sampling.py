"""Tests for the sampling and accept kernels (shaders/sample.wgsl, shaders/accept.wgsl,
pyspec/gpu/sampling.py) against the references they must equal: pyspec/rules/rng.py for the random
numbers and pyspec/rules/verify.py for every token choice and accept decision.

Tokens, ids and accept decisions must match exactly. Floats use atol + rtol * |ref|:
Gumbel noise 1e-6 + 1e-6 |g| (f32 logs), probabilities and confidences 1e-9 + 2e-5 |p| (f32 exp
and sums over up to 49152 entries). The one allowed token difference is a replay argmax whose two
best float64 scores lie within 1e-5 (the GPU scores in float32); the seeds here hit none.
Skipped where no WebGPU adapter exists.
"""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from pyspec.gpu import native, sampling
from pyspec.gpu.device import ROWS_MAX, load_shader, shader_dir
from pyspec.gpu.step import Steps
from pyspec.rules import rng, verify

ARGMAX_CHUNK = sampling.ARGMAX_CHUNK

pytestmark = pytest.mark.usefixtures("gpu")   # a native adapter (root conftest.py)

SEED = 0x1234_5678_9ABC_DEF0  # >= 2^32: both seed words matter
POS = 4_000_000_000 - 40       # near the top of the u32 range: positions up to POS + 16 still fit


@pytest.fixture(scope="module")
def dev():
    device = native.NativeDevice()
    yield device
    device.destroy()


def run(dev, commands, buffer, dtype, shape, offset: int = 0) -> np.ndarray:
    dev.submit(commands)
    return asyncio.run(dev.read_array(buffer, dtype, shape, offset))


def one_step(dev, **fields):
    steps = Steps(dev, 1)
    steps.set(0, **fields)
    steps.upload()
    return steps.binding(0)


def random_logits(gen, rows: int, vocab: int, scale: float = 3.0) -> np.ndarray:
    return (gen.standard_normal((rows, vocab)) * scale).astype(np.float32)  # (rows, vocab)


# ---------------------------------------------------------------------------------------------
# rng.wgsl
# ---------------------------------------------------------------------------------------------
def test_rng_bits_equal_rng_py(dev):
    gen = np.random.default_rng(1)
    n = 4096
    seeds = [int(s) for s in gen.integers(0, 2**63, n)]
    seeds[:4] = [0, 2**64 - 1, 2**32, SEED]
    keys = np.zeros((n, 2, 4), np.uint32)  # ((seed_lo, seed_hi, position, stream), (index, ...))
    keys[:, 0, 0] = [s & 0xFFFFFFFF for s in seeds]
    keys[:, 0, 1] = [s >> 32 for s in seeds]
    keys[:, 0, 2] = gen.integers(0, 2**32, n)
    keys[:, 0, 3] = gen.integers(0, 8, n)
    keys[:, 1, 0] = gen.integers(0, 2**32, n)
    keys[1, 0, 2:] = keys[1, 1, 0] = 2**32 - 1
    out = dev.buffer(16 * n)
    got = run(dev, [sampling.rng_fill(dev, dev.upload(keys), out, one_step(dev, rows=1, pos=0),
                                      n=n)], out, np.uint32, (n, 4))
    key = [(seeds[i], int(keys[i, 0, 2]), int(keys[i, 0, 3]), int(keys[i, 1, 0])) for i in range(n)]
    np.testing.assert_array_equal(got[:, 0], [rng.hash_u32(*k) for k in key])
    np.testing.assert_array_equal(got[:, 1].view(np.float32), [rng.uniform(*k) for k in key])
    u = np.array([rng.uniform(s, p, rng.STREAM_GUMBEL, i) for s, p, _, i in key])
    g_ref = -np.log(-np.log(u + 2.0**-25))
    g = got[:, 2].view(np.float32).astype(np.float64)
    assert np.isfinite(g).all()
    assert (np.abs(g - g_ref) <= 1e-6 + 1e-6 * np.abs(g_ref)).all()


# ---------------------------------------------------------------------------------------------
# argmax_rows, softmax_rows, sample_rows
# ---------------------------------------------------------------------------------------------
def argmax_pass(dev, logits, rows, mode, temperature, pos=POS, want_conf=True, split=None):
    """argmax_rows over the first `rows` rows of logits (rows_cap, vocab); returns tokens, conf."""
    rows_cap, vocab = logits.shape
    tokens = dev.upload(np.full(rows_cap, 7777, np.uint32))
    conf = dev.upload(np.full(rows_cap, -1.0, np.float32))
    step = one_step(dev, rows=rows, pos=pos, seed=SEED, temperature=temperature, mode=mode)
    d = sampling.argmax_rows(dev, dev.upload(logits), tokens, conf, step, vocab=vocab,
                             rows_cap=rows_cap, want_conf=want_conf, split=split)
    return (run(dev, d, tokens, np.uint32, (rows_cap,)),
            asyncio.run(dev.read_array(conf, np.float32, (rows_cap,))))


# split: argmax_parts + argmax_merge (a GPU's argmax_rows), forced here on the software adapter.
# 32001 and 49152 ids are 32 and 48 parts of ARGMAX_CHUNK (the last one short for 32001); 33
# and 1500 are one part and two.
@pytest.mark.parametrize("vocab", [33, 1500, 32001, 49152])
@pytest.mark.parametrize("mode, temperature", [("greedy", 0.0), ("replay", 0.8)])
@pytest.mark.parametrize("split", [False, True], ids=["one-workgroup", "split"])
def test_argmax_rows(dev, vocab, mode, temperature, split):
    gen = np.random.default_rng(vocab)
    logits = random_logits(gen, ROWS_MAX, vocab)
    logits[1, [5, 17, vocab - 1]] = logits[1].max() + 1.0  # planted tie: the lowest id wins
    logits[2, :] = 0.5                                       # all tied
    logits[3, vocab - 1] = 100.0                             # the last id
    if vocab > 2 * ARGMAX_CHUNK:   # a tie across parts: the lower part's id wins
        logits[4, [ARGMAX_CHUNK + 3, 2 * ARGMAX_CHUNK + 1]] = logits[4].max() + 2.0
    tokens, conf = argmax_pass(dev, logits, ROWS_MAX, mode, temperature, split=split)
    x = logits.astype(np.float64)
    if mode == "greedy":
        expected = np.argmax(x, axis=-1)
        probs = verify.softmax(x, 1.0)
        assert tokens[1] == 5 and tokens[2] == 0 and tokens[3] == vocab - 1
        if vocab > 2 * ARGMAX_CHUNK:
            assert tokens[4] == ARGMAX_CHUNK + 3
    else:
        positions = POS + 1 + np.arange(ROWS_MAX)  # pos_shift = 1: row r predicts pos + r + 1
        noise = rng.gumbel(SEED, positions, vocab)  # (rows, vocab)
        expected = verify.sample_replay_rows(x, temperature, noise)
        scores = np.sort(x / temperature + noise, axis=-1)
        assert (scores[:, -1] - scores[:, -2] > 1e-5).all(), "near tie: pick another seed"
        probs = verify.softmax(x, temperature)
    np.testing.assert_array_equal(tokens, expected)
    ref = probs.max(axis=-1)
    assert (np.abs(conf - ref) <= 1e-9 + 2e-5 * ref).all()

    # Without the confidence (the champion's rows): the same tokens, conf left as it was.
    tokens_nc, conf_nc = argmax_pass(dev, logits, ROWS_MAX, mode, temperature, want_conf=False,
                                     split=split)
    np.testing.assert_array_equal(tokens_nc, tokens)
    assert (conf_nc == -1.0).all()

    # Batch invariance and early exit: rows r < m of an m-row pass equal a 1-row pass at r.
    m = 5
    tokens_m, conf_m = argmax_pass(dev, logits, m, mode, temperature, split=split)
    assert (tokens_m[m:] == 7777).all() and (conf_m[m:] == -1.0).all()
    for r in (0, 3):
        tokens_1, conf_1 = argmax_pass(dev, logits[r:r + 1], 1, mode, temperature, pos=POS + r,
                                       split=split)
        assert tokens_1[0] == tokens_m[r] == tokens[r]
        assert conf_1[0].tobytes() == conf_m[r].tobytes() == conf[r].tobytes()


def topk_pass(dev, logits, rows, width, mode, temperature, split, tree=None):
    rows_cap, vocab = logits.shape
    tokens = dev.upload(np.full(rows_cap * width, 7777, np.uint32))
    step = one_step(dev, rows=rows, pos=POS, seed=SEED, temperature=temperature, mode=mode,
                    tree=tree)
    plan = sampling.topk_rows(dev, dev.upload(logits), tokens, step, vocab=vocab, width=width,
                              rows_cap=rows_cap, split=split)
    return run(dev, plan, tokens, np.uint32, (rows_cap, width))


# topk_rows: drafters/tree.py's children (greedy: a stable argsort; replay: Gumbel-top-k), a
# tie across parts, a row with fewer ids than the width; one workgroup and split alike.
@pytest.mark.parametrize("split", [False, True], ids=["one-workgroup", "split"])
@pytest.mark.parametrize("vocab", [5, 2100])
@pytest.mark.parametrize("mode, temperature", [("greedy", 0.0), ("replay", 0.8)])
def test_topk_rows(dev, vocab, mode, temperature, split):
    gen = np.random.default_rng(vocab + 7)
    logits = random_logits(gen, 4, vocab)
    logits[1, [3, vocab - 1, 1]] = logits[1].max() + 1.0   # a tie (across parts at 2100 ids)
    logits[2, :] = 0.5                                      # all tied
    width = 7 if vocab == 5 else 3
    got = topk_pass(dev, logits, 4, width, mode, temperature, split)
    x = logits.astype(np.float64)
    if mode == "replay":
        noise = rng.gumbel(SEED, POS + 1 + np.arange(4), vocab)
        x = x / temperature + noise
    for r in range(4):
        ref = np.argsort(-x[r], kind="stable")[:width].tolist()
        ref += [sampling.NONE] * (width - len(ref))   # 5 ids, 7 picks: NONE after the fifth
        assert got[r].tolist() == ref, (r, got[r], ref)
    if mode == "greedy":
        assert got[1, :3].tolist() == [1, 3, vocab - 1] and got[2, :3].tolist() == [0, 1, 2]


def test_a_tree_rows_replay_noise_is_its_depths(dev):
    """argmax_rows and topk_rows key a tree pass's replay noise by each row's depth (the root's
    position + depth + 1: rules/tree.walk_replay), not by its row."""
    vocab, temperature = 40, 0.7
    logits = random_logits(np.random.default_rng(5), 4, vocab)
    tree = (POS, [-1, 0, 0, 2])                    # depths 0, 1, 1, 2
    step = one_step(dev, rows=4, pos=POS, seed=SEED, temperature=temperature, mode="replay",
                    tree=tree)
    tokens, conf = dev.upload(np.zeros(4, np.uint32)), dev.buffer(16)
    plan = sampling.argmax_rows(dev, dev.upload(logits), tokens, conf, step, vocab=vocab,
                                rows_cap=4, want_conf=False)
    got = run(dev, plan, tokens, np.uint32, (4,))
    noise = rng.gumbel(SEED, POS + 1 + np.array([0, 1, 1, 2]), vocab)
    x = logits.astype(np.float64) / temperature + noise
    np.testing.assert_array_equal(got, np.argmax(x, axis=-1))
    picks = topk_pass(dev, logits, 4, 2, "replay", temperature, None, tree=tree)
    np.testing.assert_array_equal(picks, np.argsort(-x, axis=-1, kind="stable")[:, :2])


def softmax_pass(dev, logits, rows, temperature, pos=POS, split=None):
    rows_cap, vocab = logits.shape
    probs = dev.upload(np.full((rows_cap, vocab), -1.0, np.float32))
    conf = dev.buffer(4 * rows_cap)
    step = one_step(dev, rows=rows, pos=pos, temperature=temperature, mode="rejection")
    plan = sampling.softmax_rows(dev, dev.upload(logits), probs, conf, step, vocab=vocab,
                                 rows_cap=rows_cap, split=split)
    return (run(dev, plan, probs, np.float32, (rows_cap, vocab)),
            asyncio.run(dev.read_array(conf, np.float32, (rows_cap,))))


# split: softmax_parts + softmax_write (a GPU's softmax_rows), forced here on the software adapter.
@pytest.mark.parametrize("split", [False, True], ids=["one-workgroup", "split"])
@pytest.mark.parametrize("vocab", [33, 32001])
def test_softmax_rows(dev, vocab, split):
    gen = np.random.default_rng(vocab + 1)
    logits = random_logits(gen, ROWS_MAX, vocab, scale=4.0)
    logits[0, :3] = -np.inf  # masked entries give exactly 0
    masked = min(2 * ARGMAX_CHUNK, vocab - 1)   # whole parts masked: their sums are 0, not NaN
    logits[1, :masked] = -np.inf
    for temperature in (1.0, 0.6):
        probs, conf = softmax_pass(dev, logits, ROWS_MAX, temperature, split=split)
        ref = verify.softmax(logits, temperature)
        assert (np.abs(probs - ref) <= 1e-9 + 2e-5 * ref).all()
        assert (probs[0, :3] == 0).all() and (probs[1, :masked] == 0).all()
        np.testing.assert_array_equal(conf, probs.max(axis=-1))
    # Batch invariance: row r of a 16-row pass equals the 1-row pass, bit for bit.
    for r in (0, 9):
        one, _ = softmax_pass(dev, logits[r:r + 1], 1, 0.6, split=split)
        assert one.tobytes() == probs[r].tobytes()


def test_softmax_rows_output_row_offset(dev):
    """A draft step i writes its q_draft row at row i of a (K, vocab) buffer."""
    vocab, i = 33, 3
    logits = random_logits(np.random.default_rng(5), 1, vocab)
    q = dev.upload(np.full((ROWS_MAX, vocab), -1.0, np.float32))
    conf = dev.upload(np.full(ROWS_MAX, -1.0, np.float32))
    step = one_step(dev, rows=1, pos=POS, temperature=0.9, mode="rejection")
    d = sampling.softmax_rows(dev, dev.upload(logits), (q, i * vocab), (conf, i), step,
                              vocab=vocab, rows_cap=1)
    got = run(dev, [d], q, np.float32, (ROWS_MAX, vocab))
    conf_got = asyncio.run(dev.read_array(conf, np.float32, (ROWS_MAX,)))
    assert (np.delete(got, i, axis=0) == -1.0).all() and (np.delete(conf_got, i) == -1.0).all()
    assert np.allclose(got[i], verify.softmax(logits[0], 0.9), rtol=2e-5, atol=1e-9)
    assert conf_got[i] == got[i].max()


def sample_pass(dev, probs, rows, pos=POS, stream=rng.STREAM_DRAFT, split=None):
    rows_cap, vocab = probs.shape
    tokens = dev.upload(np.full(rows_cap, 7777, np.uint32))
    step = one_step(dev, rows=rows, pos=pos, seed=SEED, mode="rejection")
    plan = sampling.sample_rows(dev, dev.upload(probs), tokens, step, vocab=vocab, stream=stream,
                                rows_cap=rows_cap, split=split)
    return run(dev, plan, tokens, np.uint32, (rows_cap,))


# split: sample_parts + sample_pick (a GPU's sample_rows), forced here on the software adapter.
@pytest.mark.parametrize("split", [False, True], ids=["one-workgroup", "split"])
@pytest.mark.parametrize("vocab", [33, 32001, 49152])
def test_sample_rows(dev, vocab, split):
    gen = np.random.default_rng(vocab + 2)
    u = rng.uniforms(SEED, POS + 1 + np.arange(ROWS_MAX), rng.STREAM_DRAFT, 0)  # (rows,)
    probs = verify.softmax(random_logits(gen, ROWS_MAX, vocab, scale=2.0), 1.0)
    probs[gen.random(probs.shape) < 0.3] = 0.0  # zero-probability entries everywhere
    probs[1, -vocab // 2:] = 0.0                # a zero tail: the last positive may be taken
    probs[2, :] = 0.0
    probs[2, vocab // 3] = 0.25                 # one token only, not normalised
    probs[3, :] = 0.0                           # an exact boundary: cum[0] == u * total, so
    probs[3, 0], probs[3, 2] = u[3], 1.0 - u[3]  # the first index *exceeding* it is 2
    probs[4, :-1], probs[4, -1] = 0.0, 0.5      # only the last id: the last part is taken
    probs[5, :] = 0.0                           # all zero: token 0 (the reference raises)
    probs = probs.astype(np.float32)
    tokens = sample_pass(dev, probs, ROWS_MAX, split=split)
    assert tokens[4] == vocab - 1 and tokens[5] == 0
    probs[5, 0] = 1.0                           # (for the reference, which needs a positive)
    expected = verify.sample_categorical_rows(probs.astype(np.float64), u)
    np.testing.assert_array_equal(tokens, expected)
    assert tokens[2] == vocab // 3 and tokens[3] == 2
    assert (probs[np.arange(ROWS_MAX), tokens] > 0).all()
    # Batch invariance: a 1-row pass at row r's position draws the same token.
    for r in (0, 7):
        assert sample_pass(dev, probs[r:r + 1], 1, pos=POS + r, split=split)[0] == tokens[r]


@pytest.mark.parametrize("split", [False, True], ids=["one-workgroup", "split"])
def test_sample_rows_exact_where_float32_is_not(dev, split):
    """Flat rows (vocab 49152, all equal or nearly): a float32 cumulative sum lands on the
    neighbouring token in most of these draws; the exact sampler must equal float64 in all."""
    gen = np.random.default_rng(11)
    vocab, flips = 49152, 0
    for trial in range(3):
        logits = random_logits(gen, ROWS_MAX, vocab, scale=0.01)
        logits[::2] = 0.0  # exactly uniform rows: the answer is floor(u * vocab)
        probs = verify.softmax(logits, 1.0).astype(np.float32)
        pos = 1000 + 16 * trial
        u = rng.uniforms(SEED, pos + 1 + np.arange(ROWS_MAX), rng.STREAM_DRAFT, 0)
        expected = verify.sample_categorical_rows(probs.astype(np.float64), u)
        np.testing.assert_array_equal(sample_pass(dev, probs, ROWS_MAX, pos=pos, split=split),
                                      expected)
        np.testing.assert_array_equal(expected[::2], np.floor(u[::2] * vocab))
        cumulative = np.cumsum(probs, axis=-1, dtype=np.float32)  # what float32 would do
        naive = (cumulative <= (u[:, None] * cumulative[:, -1:]).astype(np.float32)).sum(-1)
        flips += int((naive != expected).sum())
    assert flips > 0  # the data can tell an inexact sampler from an exact one


def test_draft_step_outputs(dev):
    """Draft step i: its token goes to slot 1 + i of the champion's token list (which starts
    with the last committed token) and nowhere else (the backend copies it on)."""
    vocab, i, pos = 33, 2, POS + 2
    gen = np.random.default_rng(9)
    logits = random_logits(gen, 1, vocab)
    probs = verify.softmax(logits, 0.9).astype(np.float32)
    for kind in ("argmax", "sample"):
        token_list = dev.upload(np.full(ROWS_MAX, 7777, np.uint32))
        step = one_step(dev, rows=1, pos=pos, seed=SEED, temperature=0.9, mode="rejection")
        if kind == "argmax":
            d = sampling.argmax_rows(dev, dev.upload(logits), (token_list, 1 + i),
                                     dev.buffer(64), step, vocab=vocab, rows_cap=1)
            expected = int(np.argmax(logits[0]))  # rejection mode: argmax_rows is plain argmax
        else:
            d = sampling.sample_rows(dev, dev.upload(probs), (token_list, 1 + i), step,
                                     vocab=vocab, rows_cap=1)
            expected = verify.sample_categorical(
                probs[0].astype(np.float64), rng.uniform(SEED, pos + 1, rng.STREAM_DRAFT))
        got = run(dev, [d], token_list, np.uint32, (ROWS_MAX,))
        assert got[1 + i] == expected, kind
        assert (np.delete(got, 1 + i) == 7777).all(), kind


# ---------------------------------------------------------------------------------------------
# accept
# ---------------------------------------------------------------------------------------------
class AcceptCase:
    """One cycle's inputs on the host, the reference verdict, and the K_eff it implies."""

    def __init__(self, gen, mode: str, k: int, vocab: int, kind: str = "random",
                 one_hot: bool = False, conf_threshold: float = 0.0):
        self.mode, self.k, self.vocab, self.one_hot = mode, k, vocab, one_hot
        self.conf_threshold, self.pos = conf_threshold, int(gen.integers(0, 2**31))
        self.temperature = 0.0 if mode == "greedy" else 0.9
        logits = random_logits(gen, k + 1, vocab, scale=float(gen.choice([0.5, 2.0, 6.0])))
        self.conf = gen.random(k).astype(np.float32)  # (K,) draft confidences
        self.k_eff = next((i for i in range(k) if self.conf[i] < conf_threshold), k)
        ke = self.k_eff
        if mode == "rejection":
            self._rejection(gen, logits, kind)
        else:
            gumbel = (np.stack([rng.gumbel(SEED, self.pos + i, vocab) for i in range(k + 1)])
                      if mode == "replay" else np.zeros((k + 1, vocab)))
            self.champion = verify.sample_replay_rows(logits, self.temperature, gumbel)
            match = gen.random(k) < {"random": 0.7, "all": 1.0, "first": 0.0}[kind]
            other = (self.champion[:k] + 1 + gen.integers(0, vocab - 1, k)) % vocab
            self.drafts = np.where(match, self.champion[:k], other)
            ref = (verify.verify_greedy(logits[:ke + 1], self.drafts[:ke]) if mode == "greedy"
                   else verify.verify_replay(logits[:ke + 1], self.drafts[:ke], self.temperature,
                                             gumbel[:ke + 1]))
            self.p = np.zeros((k + 1, vocab), np.float32)
            self.q = np.zeros((k, vocab), np.float32)
            self.expected = (ref.n_accepted, ref.tokens)
            self.tests = tuple(int(t) for t in self.drafts[:ke] == self.champion[:ke])

    def _rejection(self, gen, logits, kind):
        k, vocab, ke = self.k, self.vocab, self.k_eff
        p = verify.softmax(logits, self.temperature).astype(np.float32)  # (K+1, vocab)
        noise = random_logits(gen, k, vocab, scale=float(gen.choice([0.1, 1.0])))
        q = verify.softmax(logits[:k] + noise, self.temperature).astype(np.float32)  # (K, vocab)
        drafts = np.array([verify.sample_categorical(q[i], gen.random()) for i in range(k)],
                          dtype=np.int64)
        if k and kind in ("q_zero", "p_eq_q"):  # the draft claims its token impossible: rejected
            q[0, drafts[0]] = 0.0
            q[0] /= q[0].sum(dtype=np.float32)
        if k and kind == "p_zero":    # the champion cannot produce the draft: rejected
            p[0, drafts[0]] = 0.0
            p[0] /= p[0].sum(dtype=np.float32)
        if k and kind == "p_eq_q":  # rejected at 0 with p == q: the residual is all zero, so
            p[:k] = q               # p_target itself is sampled
        if k and kind == "all":       # one-hot q, p == q: every test passes (u < 1)
            q[:, :] = 0.0
            q[np.arange(k), drafts] = 1.0
            p[:k] = q
        if self.one_hot:
            q = np.zeros((k, vocab), np.float32)
            q[np.arange(k), drafts] = 1.0
        c = self.pos
        u_accept = rng.uniforms(SEED, c + np.arange(ke), rng.STREAM_ACCEPT, 0)
        if kind == "boundary":  # p(d) = u q(d) rounded to f32: above, equal or below the exact
            for i in range(k):  # product, which an f32 product u * q could not tell apart
                u = rng.uniform(SEED, c + i, rng.STREAM_ACCEPT)
                at = np.float32(u * np.float64(q[i, drafts[i]]))
                p[i] *= (1 - at) / (1 - p[i, drafts[i]])  # the others take the rest
                p[i, drafts[i]] = at
        self.p, self.q, self.drafts = p, q, drafts
        self.champion = np.zeros(k + 1, np.int64)
        u_residual = rng.uniforms(SEED, c + np.arange(ke), rng.STREAM_RESIDUAL, 0)
        ref = verify.verify_rejection(p[:ke + 1], q[:ke], drafts[:ke], u_accept, u_residual,
                                      rng.uniform(SEED, c + ke, rng.STREAM_BONUS))
        self.expected = (ref.n_accepted, ref.tokens)
        p_d = p[np.arange(ke), drafts[:ke]].astype(np.float64)  # every test, also after the
        q_d = q[np.arange(ke), drafts[:ke]].astype(np.float64)  # first failure (diagnostics)
        self.tests = tuple(int(t) for t in (q_d > 0) & (u_accept * q_d < p_d))


def run_accept(dev, cases: list[AcceptCase], split: bool = False) -> list[dict]:
    """All cases in one submission, each with its own step slot and output words. split: the
    rejection kernels of a GPU (accept_parts + accept_pick), forced on the software adapter."""
    steps = Steps(dev, len(cases))
    out = dev.buffer(4 * sampling.ACCEPT_WORDS * len(cases))
    commands = []
    for j, case in enumerate(cases):
        vocab, k = case.vocab, case.k
        pad = np.zeros((ROWS_MAX, vocab), np.float32)
        p, q = pad.copy(), pad.copy()
        p[:k + 1], q[:k] = case.p, case.q
        if case.one_hot:
            q[:] = np.nan  # FLAG_ONE_HOT: q_draft must not be read
        champion, drafts, conf = (np.zeros(ROWS_MAX, np.uint32) for _ in range(3))
        champion[:k + 1], drafts[:k] = case.champion, case.drafts
        conf = np.ones(ROWS_MAX, np.float32)
        conf[:k] = case.conf
        steps.set(j, rows=k + 1, pos=case.pos, seed=SEED, temperature=case.temperature,
                  n_draft=k, mode=case.mode, one_hot=case.one_hot)
        commands += sampling.accept(
            dev, dev.upload(champion), dev.upload(p), dev.upload(q), dev.upload(drafts),
            dev.upload(conf), (out, j * sampling.ACCEPT_WORDS), steps.binding(j), vocab=vocab,
            conf_threshold=case.conf_threshold, split=split)
    steps.upload()
    words = run(dev, commands, out, np.uint32, (len(cases), sampling.ACCEPT_WORDS))
    return [sampling.decode_accept(w) for w in words]


def check_accept(dev, cases, split=False):
    for case, got in zip(cases, run_accept(dev, cases, split)):
        what = f"{case.mode} K={case.k} K_eff={case.k_eff} vocab={case.vocab}"
        assert got["k_eff"] == case.k_eff, what
        assert (got["n_accepted"], got["tokens"]) == case.expected, what
        assert got["tests"] == case.tests, what
        if case.mode == "rejection":  # diagnostics: the exact f32 inputs of each test
            at = (np.arange(case.k_eff), case.drafts[:case.k_eff])
            np.testing.assert_array_equal(got["p_of_draft"], case.p[at], err_msg=what)
            np.testing.assert_array_equal(got["q_of_draft"], case.q[at], err_msg=what)


@pytest.mark.parametrize("mode, split", [("greedy", False), ("replay", False),
                                         ("rejection", False), ("rejection", True)],
                         ids=["greedy", "replay", "rejection", "rejection-split"])
def test_accept_random(dev, mode, split):
    gen = np.random.default_rng({"greedy": 1, "replay": 2, "rejection": 3}[mode])
    cases = []
    for j in range(96):
        k = j % ROWS_MAX
        kind = ["random", "random", "all", "first"][j % 4] if mode != "rejection" else "random"
        vocab = 33 if j % 8 else (1000 if j % 16 else 32001)
        cases.append(AcceptCase(gen, mode, k, vocab, kind,
                                one_hot=mode == "rejection" and j % 3 == 0,
                                conf_threshold=0.2 if j % 5 == 0 else 0.0))
    check_accept(dev, cases, split)


@pytest.mark.parametrize("split", [False, True], ids=["one-workgroup", "split"])
def test_accept_rejection_edge_cases(dev, split):
    gen = np.random.default_rng(7)
    cases = []
    for kind in ("q_zero", "p_zero", "p_eq_q", "all", "boundary"):
        for k in (0, 1, 4, 15):
            for one_hot in (False, True):
                cases.append(AcceptCase(gen, "rejection", k, 33, kind, one_hot=one_hot))
        for k in (1, 4):   # rows of three parts (the split kernels' sums cross between parts)
            cases.append(AcceptCase(gen, "rejection", k, 3 * ARGMAX_CHUNK - 5, kind))
    check_accept(dev, cases, split)
    results = run_accept(dev, cases, split)
    for case, got in zip(cases, results):
        if case.k == 0:
            assert got["how"] == "bonus" and got["n_accepted"] == 0
    # p_eq_q without one-hot: an empty residual at the first rejection, so p_target is sampled.
    assert any(got["how"] == "p_target (empty residual)" for got in results)
    assert any(got["n_accepted"] == 15 for got in results)  # "all" at K = 15


def test_wrappers_check_shapes(dev):
    step = one_step(dev, rows=1, pos=0)
    small = dev.buffer(64)
    with pytest.raises(sampling.ShapeError, match="logits holds 64 bytes"):
        sampling.argmax_rows(dev, small, dev.buffer(64), dev.buffer(64), step, vocab=33)
    with pytest.raises(sampling.ShapeError, match="rows_cap"):
        sampling.sample_rows(dev, small, small, step, vocab=4, rows_cap=ROWS_MAX + 1)
    with pytest.raises(sampling.ShapeError, match="out holds"):
        big = dev.buffer(4 * ROWS_MAX * 33)
        sampling.accept(dev, big, big, big, big, big, (small, 8), step, vocab=33)


# ---------------------------------------------------------------------------------------------
# penalize.wgsl: the device penalties against processors.Penalties
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("vocab", [33, 1000, 2 * ARGMAX_CHUNK + 7])
def test_penalize_rows_and_count_tokens_equal_the_host_processor(dev, vocab):
    """Rows r = 0..k with the drafts before each (repeats and a draft equal to a prompt token
    included), bias, repetition, presence and frequency: within 1e-6 + 1e-6 |ref| of
    processors.Penalties in float64; then count_tokens adds an accept output's emitted tokens."""
    from pyspec.gpu.constants import ACCEPT_N_EMITTED, ACCEPT_TOKENS, ACCEPT_WORDS
    from pyspec.rules.processors import Penalties
    gen = np.random.default_rng(vocab)
    k, prompt_len = 6, 20
    prefix = [int(t) for t in gen.integers(0, vocab, 30)]
    drafts = [prefix[3], 5, 5, prefix[25], 7, 5]
    logits = random_logits(gen, k + 1, vocab)                                  # (k+1, vocab)
    bias = {1: 2.5, 5: -1.0, vocab - 1: 0.75}
    pen = Penalties(vocab, prompt_len, bias, repetition_penalty=1.7, presence_penalty=0.4,
                    frequency_penalty=0.3)
    ref = pen.apply(logits.astype(np.float64), prefix, drafts)
    seq = np.asarray(prefix)
    counts = np.stack([np.bincount(seq, minlength=vocab),
                       np.bincount(seq[prompt_len:], minlength=vocab)]).astype(np.uint32)
    params = sampling.penalty_params(dev, vocab)
    sampling.set_penalties(dev, params, vocab, 1.7, 0.4, 0.3, True)
    logits_buf = dev.buffer(4 * ROWS_MAX * vocab)
    dev.write(logits_buf, logits)
    counts_buf, bias_buf = dev.upload(counts), dev.upload(pen.bias.astype(np.float32))
    context = dev.upload(np.array([prefix[-1]] + drafts + [0] * (ROWS_MAX - 1 - k), np.uint32))
    step = one_step(dev, rows=k + 1, pos=0)
    got = run(dev, [sampling.penalize_rows(dev, params, logits_buf, counts_buf, bias_buf,
                                           context, step, vocab=vocab)],
              logits_buf, np.float32, (k + 1, vocab)).astype(np.float64)
    assert (np.abs(got - ref) <= 1e-6 + 1e-6 * np.abs(ref)).all()
    assert (got != logits).any(axis=1).all()
    words = np.zeros(ACCEPT_WORDS, np.uint32)
    emitted = [5, 5, 9]
    words[ACCEPT_N_EMITTED] = len(emitted)
    words[ACCEPT_TOKENS:ACCEPT_TOKENS + 3] = emitted
    after = run(dev, [sampling.count_tokens(dev, params, dev.upload(words), counts_buf, step,
                                            vocab=vocab)], counts_buf, np.uint32, (2, vocab))
    seq = np.asarray(prefix + emitted)
    np.testing.assert_array_equal(after[0], np.bincount(seq, minlength=vocab))
    np.testing.assert_array_equal(after[1], np.bincount(seq[prompt_len:], minlength=vocab))


# ---------------------------------------------------------------------------------------------
# filter.wgsl: the JSON-schema mask and top_k, top_p, min_p against the host's and a numpy mirror
# ---------------------------------------------------------------------------------------------
F32_LOWEST = np.float32(-np.finfo(np.float32).max)   # filter.wgsl's "excluded"


def mask_rows(allowed: np.ndarray) -> np.ndarray:
    """(rows, vocab) bool as filter.wgsl's mask rows (rows, mask_words) u32: jsonmask.Mask's
    packed bits, padded to whole words."""
    rows, vocab = allowed.shape
    bits = np.packbits(allowed, axis=1, bitorder="little")
    pad = np.zeros((rows, 4 * sampling.mask_words(vocab) - bits.shape[1]), np.uint8)
    return np.ascontiguousarray(np.concatenate([bits, pad], axis=1)).view("<u4")


def filter_pass(dev, logits, temperature, allowed=None, top_k=0, top_p=1.0, min_p=0.0,
                split=None, rows=None):
    """filter_rows over logits (rows_cap, vocab), step.rows = rows (default all); returns the
    rows and the weights scratch (-1 where not written)."""
    rows_cap, vocab = logits.shape
    params = sampling.filter_params(dev, vocab, rows_cap)
    sampling.set_filters(dev, params, vocab, allowed is not None, top_k, top_p, min_p, rows_cap)
    words = mask_rows(np.ones_like(logits, bool) if allowed is None else allowed)
    buf, weights = dev.upload(logits), dev.upload(np.full(logits.shape, -1.0, np.float32))
    step = one_step(dev, rows=rows or rows_cap, pos=0, temperature=temperature,
                    mode="replay" if temperature > 0 else "greedy")
    out = run(dev, [sampling.filter_rows(dev, params, buf, dev.upload(words), weights, step,
                                         vocab=vocab, rows_cap=rows_cap, split=split)],
              buf, np.float32, logits.shape)
    return out, asyncio.run(dev.read_array(weights, np.float32, logits.shape))


def fixed(e: np.ndarray) -> list[int]:
    """categorical.wgsl's fixed point of f32 weights in [0, 1]: floor(e 2^80), exactly."""
    return [int(np.ldexp(float(v), 80)) for v in e]


def mirror_top_p(e: np.ndarray, top_p: float) -> np.ndarray:
    """filter.wgsl's top_p on weights e (vocab,) f32, by a stable sort and Python integers: keep
    each token of the order (e descending, ties to the lower id) while the exact mass before it
    is short of top_p (as floor(top_p 2^24) 2^-24) of the exact total."""
    w = fixed(e)
    target = sum(w) * max(1, int(top_p * 2**24))
    keep, cum = np.zeros(len(e), bool), 0
    for i in np.argsort(-e, kind="stable"):
        if cum * 2**24 >= target:
            break
        keep[i], cum = True, cum + w[i]
    return keep


def cut_at_rounding(row: np.ndarray, t: float, case: dict) -> bool:
    """Whether the host's top_p cut on row (vocab,) float64 falls where its float64 cumsum is
    within 1e-9 of top_p (an exact fraction such as 257 of 514 equal tokens at 0.5): there the
    host's answer is its rounding's, and the device's is the exact one (the mirror's)."""
    if case.get("top_p", 1.0) >= 1.0:
        return False
    from pyspec.rules.processors import keep_top_k
    if case.get("top_k"):
        row = np.where(keep_top_k(row, case["top_k"]), row, -np.inf)
    p = np.exp((row - row.max()) / t)
    mass = np.cumsum(np.sort(p / p.sum())[::-1])
    return bool((np.abs(mass - case["top_p"]) < 1e-9).any())


# split: filter_split.wgsl's kernels (a GPU's filter_rows), forced here on the software adapter.
SPLIT = pytest.mark.parametrize("split", [False, True], ids=["one-workgroup", "split"])


@pytest.mark.parametrize("vocab", [33, 49152])
@SPLIT
def test_filter_rows_mask(dev, vocab, split):
    """The mask alone, greedy and at T > 0 with no filter: allowed logits unchanged bit for
    bit, the rest -FLT_MAX; argmax equals the host's argmax over the -inf-masked row (one row
    allows a single token, one allows all, one only the last id)."""
    gen = np.random.default_rng(vocab)
    logits = random_logits(gen, ROWS_MAX, vocab)
    allowed = gen.random((ROWS_MAX, vocab)) < 0.3
    allowed[1] = False
    allowed[1, 17 % vocab] = True
    allowed[2] = True
    allowed[3] = False
    allowed[3, vocab - 1] = True
    for temperature in (0.0, 0.7):
        out, _ = filter_pass(dev, logits, temperature, allowed, split=split)
        np.testing.assert_array_equal(out, np.where(allowed, logits, F32_LOWEST))
        host = np.where(allowed, logits.astype(np.float64), -np.inf)   # jsonmask.JsonMask
        np.testing.assert_array_equal(np.argmax(out, axis=1), np.argmax(host, axis=1))


FILTER_CASES = [dict(top_k=5), dict(top_p=0.6), dict(min_p=0.3),
                dict(top_k=7, top_p=0.8, min_p=0.05), dict(top_p=0.5, min_p=1.0),
                dict(top_k=1), dict(top_p=1e-6)]


@pytest.mark.parametrize("vocab", [33, 1000])
@SPLIT
def test_filter_rows_equal_the_host_filters_and_the_mirror(dev, vocab, split):
    """top_k, top_p, min_p (and with the mask) at T = 0.7 on rows with planted ties: the kept
    set equals processors.Filters' (float64) on the same masked row (except on a row whose top_p
    cut is an exact fraction, e.g. 257 of 514 equal tokens at 0.5, where the host's float64
    cumsum decides by its rounding: at most one row per case), and the numpy mirror of
    filter.wgsl's rules from the kernel's own weights on every row; kept logits unchanged bit
    for bit.
    Ties: top_k and top_p cut inside a run of equal logits (lower ids kept), -0 equals +0, an
    all-equal row. Off and edge values change nothing: top_k 0 or >= vocab, top_p 1, min_p 0;
    a row with one allowed token keeps only it."""
    from pyspec.rules.processors import Filters
    gen, t = np.random.default_rng(vocab + 7), 0.7
    logits = random_logits(gen, 8, vocab)
    top = np.sort(logits[1])[::-1]
    logits[1, gen.choice(vocab, 6, replace=False)] = top[3]     # ties across the k-th value
    logits[2] = 0.25                                            # all equal
    logits[3, :] = -1.0
    logits[3, ::2], logits[3, 1::4] = 0.0, -0.0                 # -0 ties +0 at the top
    logits[4, :10] = logits[4].max() + 1.0                      # ties at the top
    allowed = gen.random((8, vocab)) < 0.5
    allowed[5] = False
    allowed[5, 3] = True                                        # all masked but one
    allowed[6] = True
    for masked in (False, True):
        x = logits if not masked else np.where(allowed, logits, F32_LOWEST)
        host_in = x.astype(np.float64) if not masked else \
            np.where(allowed, logits.astype(np.float64), -np.inf)
        # the weights after the mask (and top_k), from a pass with the smallest min_p
        for case in FILTER_CASES:
            out, _ = filter_pass(dev, logits, t, allowed if masked else None, **case,
                                 split=split)
            kept = out > F32_LOWEST
            np.testing.assert_array_equal(out[kept], logits[kept])
            host = Filters(t, case.get("top_k", 0), case.get("top_p", 1.0),
                           case.get("min_p", 0.0)).apply(host_in, [], [])
            sure = [r for r in range(len(x)) if not cut_at_rounding(host_in[r], t, case)]
            assert len(sure) >= len(x) - 1
            np.testing.assert_array_equal(kept[sure], np.isfinite(host[sure]),
                                          err_msg=f"{case} {masked}")
            # min_p = the smallest normal f32, not a denormal: a GPU that flushes denormals (the
            # H200) reads a denormal min_p as 0, "off", and would not compute the weights. This
            # min_p drops the tokens whose weight is below it (0 there, denormal here); the mirror
            # puts back those that top_k alone keeps.
            tiny = float(np.finfo(np.float32).tiny)
            k_only, e = filter_pass(dev, logits, t, allowed if masked else None,
                                    top_k=case.get("top_k", 0), min_p=tiny, split=split)
            plain, _ = filter_pass(dev, logits, t, allowed if masked else None,
                                   top_k=case.get("top_k", 0), split=split)
            mirror = (k_only > F32_LOWEST) | ((plain > F32_LOWEST) & (e < tiny))
            for r in range(len(x)):
                if case.get("top_p", 1.0) < 1.0:
                    mirror[r] &= mirror_top_p(e[r], case["top_p"])
                mirror[r] &= e[r] >= np.float32(case.get("min_p", 0.0))
            np.testing.assert_array_equal(kept, mirror, err_msg=f"{case} {masked}")
            assert kept[5].sum() == 1 if masked else kept.any(axis=1).all()
        ref = np.exp((host_in - host_in.max(axis=1, keepdims=True)) / t)
        assert (np.abs(e - ref) <= 1e-6 + 2e-6 * ref).all()
    # ties: the lower ids win
    out, _ = filter_pass(dev, logits, t, top_k=3, split=split)
    assert list(np.flatnonzero(out[2] > F32_LOWEST)) == [0, 1, 2]
    assert list(np.flatnonzero(out[4] > F32_LOWEST)) == [0, 1, 2]
    out, _ = filter_pass(dev, logits, t, top_p=0.5, split=split)
    assert list(np.flatnonzero(out[2] > F32_LOWEST)) == list(range(-(-vocab // 2)))
    for off in (dict(), dict(top_k=vocab), dict(top_k=2**40), dict(top_p=1.0),
                dict(min_p=0.0), dict(top_k=0, top_p=1.0, min_p=0.0)):
        out, _ = filter_pass(dev, logits, t, **off, split=split)
        np.testing.assert_array_equal(out, logits)
    out, _ = filter_pass(dev, logits, 0.0, top_k=1, top_p=0.1, min_p=0.9,   # T = 0: filters off
                         split=split)
    np.testing.assert_array_equal(out, logits)


EQUAL_CASES = [dict(), dict(top_k=1), dict(top_k=5), dict(top_k=30), dict(top_k=-1),
               dict(top_p=0.5), dict(top_p=0.9), dict(top_p=1e-6), dict(min_p=0.3),
               dict(min_p=float(np.finfo(np.float32).tiny)),
               dict(top_k=7, top_p=0.8, min_p=0.05), dict(top_k=50, min_p=0.1),
               dict(top_p=0.95, min_p=0.02), dict(t=0.0), dict(t=0.0, top_k=1, top_p=0.1)]


@pytest.mark.parametrize("vocab", [33, 3000, 49152])
def test_filter_split_equals_one_workgroup(dev, vocab):
    """filter_split.wgsl's kernels give filter_rows' logits and weights bit for bit (and so its
    excluded set), masked and not, at T = 0.7 and at T = 0 (the mask only), on rows with
    planted ties: runs of equal values across every part boundary (top_k 30 cuts inside one, the
    lower ids kept whatever part they lie in), a run at the k-th value, an all-equal row (top_p
    0.5 keeps the lower half), -0 with +0, rows with one allowed token, a row whose weights are
    mostly 0, a flat row; top_k -1 stands for vocab - 1. step.rows = 13 of 16: rows 13.. stay
    untouched (logits and weights). 3000 ids are three parts, the last one short; 33, one."""
    gen, rows = np.random.default_rng(vocab + 1), 13
    logits = random_logits(gen, ROWS_MAX, vocab)
    top = np.sort(logits[0])[::-1]
    runs = [(b - 20, b + 20) for b in range(ARGMAX_CHUNK, vocab, ARGMAX_CHUNK)] or [(5, 25)]
    for lo, hi in runs:
        logits[1, lo:hi] = top[0] + 1.0                         # ties at the top, across parts
        logits[7, lo:hi] = top[3]                               # ties at the k-th value
    logits[2] = 0.25                                            # all equal
    logits[3, :] = -1.0
    logits[3, ::2], logits[3, 1::4] = 0.0, -0.0                 # -0 ties +0 at the top
    logits[4, :10] = logits[4].max() + 1.0
    logits[8] = -1000.0
    logits[8, [0, vocab // 2, vocab - 1]] = 0.0                 # weights 0 but for three
    logits[9, ::2], logits[9, 1::2] = 1.0, 0.0                  # two values, half each
    logits[10] *= 30.0
    logits[11] *= 0.01                                          # flat: top_p cuts deep
    allowed = gen.random((ROWS_MAX, vocab)) < 0.5
    allowed[5] = False
    allowed[5, 3] = True                                        # all masked but one
    allowed[6] = False
    allowed[6, vocab - 1] = True
    allowed[[1, 2, 7]] = True
    for spec in EQUAL_CASES:
        case = dict(spec)
        t, k = case.pop("t", 0.7), case.pop("top_k", 0)
        case["top_k"] = vocab + k if k < 0 else k
        for masked in (False, True):
            msg = f"{spec} masked {masked}"
            (one, e_one), (parts, e_parts) = [
                filter_pass(dev, logits, t, allowed if masked else None, **case, split=split,
                            rows=rows) for split in (False, True)]
            np.testing.assert_array_equal(parts.view(np.uint32), one.view(np.uint32), msg)
            np.testing.assert_array_equal(e_parts.view(np.uint32), e_one.view(np.uint32), msg)
            np.testing.assert_array_equal(parts[rows:], logits[rows:], msg)
            assert (e_parts[rows:] == -1.0).all(), msg
            kept = parts[:rows] > F32_LOWEST
            if masked:
                assert kept[5].sum() == 1 and kept[6].sum() == 1, msg
                assert (kept <= allowed[:rows]).all(), msg
            if t == 0.0:
                expected = np.where(allowed, logits, F32_LOWEST) if masked else logits
                np.testing.assert_array_equal(parts[:rows], expected[:rows], msg)
            if spec == dict(top_k=30) and vocab > ARGMAX_CHUNK:
                assert list(np.flatnonzero(kept[1])) == list(range(1004, 1034)), msg
            if spec == dict(top_p=0.5):
                assert list(np.flatnonzero(kept[2])) == list(range(-(-vocab // 2))), msg


def test_filter_split_layout_is_the_shaders():
    """sampling sizes filter_split's scratch by FILTER_RADIX and FILTER_ROW_WORDS, the shaders'
    RADIX and ROW_WORDS (filter_split.wgsl asserts that its row layout fits ROW_WORDS), and
    FILTER_SPLIT dispatches every entry point of filter_split.wgsl once, in file order."""
    text = load_shader("filter_split")
    consts = {name: int(v) for name, v in re.findall(r"^const (\w+): u32 = (\d+)u;", text, re.M)}
    assert (consts["RADIX"], consts["ROW_WORDS"]) == (sampling.FILTER_RADIX,
                                                      sampling.FILTER_ROW_WORDS)
    own = (shader_dir() / "filter_split.wgsl").read_text()   # without filter.wgsl's
    assert tuple(re.findall(r"@compute @workgroup_size\(WG_ROW\)\s*fn (\w+)", own)) == \
        sampling.FILTER_SPLIT


@pytest.mark.parametrize("controls", [dict(top_k=4), dict(top_p=0.7), dict(min_p=0.2),
                                      dict(top_k=12, top_p=0.85, min_p=0.05)],
                         ids=["top_k", "top_p", "min_p", "all"])
@SPLIT
def test_filtered_sampling_follows_the_host_distribution(dev, controls, split):
    """10,240 draws from the device's filtered target (filter_rows, then softmax_rows) by its
    exact sampler (sample_rows; the accept kernel's bonus and residual draws use the same
    categorical.wgsl) at T = 0.9 on one 33-token row that each filter cuts to 4-11 tokens: the
    empirical distribution is within the 99.9th percentile of the TV that 10,240 exact draws
    from processors.Filters' distribution (float64) give (2,000 simulated trials), and no
    excluded token is drawn. Teeth: the unfiltered distribution lies more than ten times the
    bound away. The row is filtered once; 64 sampling dispatches of 16 rows per submission, each
    row at its own position (its own key)."""
    from test_engine import null_tv_quantile, total_variation

    from pyspec.rules.processors import Filters
    vocab, t, groups, rounds = 33, 0.9, 64, 10
    row = random_logits(np.random.default_rng(4), 1, vocab, scale=0.8)[0]   # (vocab,)
    exact = verify.softmax(Filters(t, **controls).apply(row[None].astype(np.float64), [], [])[0],
                           t)
    n = groups * ROWS_MAX * rounds
    bound = null_tv_quantile(exact, n, 0.999)
    assert 4 <= (exact > 0).sum() < vocab
    assert total_variation(verify.softmax(row.astype(np.float64), t) * n, exact) > 10 * bound
    logits = dev.upload(np.tile(row, (ROWS_MAX, 1)))                        # (R, vocab)
    weights, probs = dev.buffer(4 * ROWS_MAX * vocab), dev.buffer(4 * ROWS_MAX * vocab)
    tokens = dev.buffer(4 * groups * ROWS_MAX)                              # (groups * R,) u32
    params = sampling.filter_params(dev, vocab)
    sampling.set_filters(dev, params, vocab, False, **controls)
    step = one_step(dev, rows=ROWS_MAX, pos=0, temperature=t, mode="rejection")
    run(dev, [sampling.filter_rows(dev, params, logits, dev.upload(mask_rows(
                  np.ones((ROWS_MAX, vocab), bool))), weights, step, vocab=vocab, split=split),
              sampling.softmax_rows(dev, logits, probs, dev.buffer(4 * ROWS_MAX), step,
                                    vocab=vocab)], probs, np.float32, (ROWS_MAX, vocab))
    steps = Steps(dev, groups)
    plan = [sampling.sample_rows(dev, probs, (tokens, g * ROWS_MAX), steps.binding(g),
                                 vocab=vocab) for g in range(groups)]
    counts = np.zeros(vocab)
    for j in range(rounds):
        for g in range(groups):
            steps.set(g, rows=ROWS_MAX, pos=(j * groups + g) * ROWS_MAX, seed=SEED,
                      temperature=t, mode="rejection")
        steps.upload()
        counts += np.bincount(run(dev, plan, tokens, np.uint32, (groups * ROWS_MAX,)),
                              minlength=vocab)
    assert counts.sum() == n and counts[exact == 0].sum() == 0
    assert total_variation(counts, exact) < bound
