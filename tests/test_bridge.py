"""Drafts with another vocabulary (pyspec/drafters/bridge.py over compat.Bridge): the id map round
trip, the draft's view of the context, and exactness through the engine: greedy and replay equal
champion-only, on numpy and on the GPU (where a bridged draft runs on the host), and rejection
sampling under the token-level intersection follows the champion's distribution.

The rejection bound is test_engine.py's: TV(empirical, exact) of the first two tokens over
10,000 seeded runs below the 99.9th percentile of the TV that 10,000 exact draws give."""

from __future__ import annotations

import numpy as np
import pytest
from test_engine import (
    N_RUNS,
    check_two_token_counts,
    exact_two_token_distribution,
    null_tv_quantile,
    sample_two_tokens,
    seed_block,
)

from conftest import requires_gpu
from pyspec import receipts
from pyspec.cpu.model import Model
from pyspec.cycle import Rule
from pyspec.drafters.bridge import BridgedDrafter, DraftView, bridged_choice
from pyspec.drafters.pairing import check_pair
from pyspec.engine import Engine
from pyspec.formats.gguf import GGUFFile
from pyspec.load import backend as backend_for
from pyspec.options import Options
from pyspec.rules import verify
from pyspec.rules.processors import Processor

TEXTS = ["the cat sat on the mat. the dog ate the bone.",
         "a fish swam in the deep sea; def f(x): return x + 1\n",
         "caf\u00e9 \u00fcber na\u00efve \U0001F600 the bird flew over the wall"]


@pytest.fixture(scope="module", params=["perm", "tli"])
def pair(request, tiny, foreign):
    path = foreign.perm_path if request.param == "perm" else foreign.tli_path
    report = check_pair(tiny.champion.metadata, GGUFFile.open(path).metadata)
    assert report.kind == {"perm": "idmap", "tli": "tli"}[request.param]
    return path, report.bridge


def test_every_shared_token_round_trips(pair):
    _, b = pair
    shared = np.flatnonzero(b.to_draft >= 0)
    assert len(shared) == b.size > 0
    assert np.array_equal(b.to_champion[b.to_draft[shared]], shared)
    assert np.count_nonzero(b.to_champion >= 0) == b.size, "one to one"
    for c in shared:
        d = int(b.to_draft[c])
        assert b.champion.token_bytes(int(c)) == b.draft.token_bytes(d)   # text, or the name
        assert b.champion.token_types[c] == b.draft.token_types[d]


@pytest.mark.parametrize("text", TEXTS)
def test_the_drafts_view_is_its_own_encoding_of_the_text(pair, tiny, text):
    """Fed the champion's tokens in uneven steps (a multi-byte character split across them
    included), the view ends as the draft tokenizer's own encoding of the whole chat."""
    _, b = pair
    prompt = tiny.tokenizer.encode_chat([{"role": "user", "content": text}])
    tokens = prompt + tiny.tokenizer.encode(text)
    view = DraftView(b)
    gen = np.random.default_rng(0)
    n = 1
    while n < len(tokens):
        view.ids(tokens[:n])
        n += int(gen.integers(1, 5))
    expected = b.draft.encode(tiny.tokenizer.decode(tokens, special=True), special=True)
    assert view.ids(tokens) == expected
    assert view.ids(tokens[:3]) == b.draft.encode(tiny.tokenizer.decode(tokens[:3], True), True)


def engine_for(tiny, path, backend="cpu"):
    return Engine(backend_for(tiny.on(backend), path), tiny.tokenizer)


@pytest.mark.parametrize("temperature, seeds", [(0.0, [0]), (0.9, [0, 1, 2])])
def test_greedy_and_replay_equal_champion_only(tiny, pair, backend, temperature, seeds):
    path, b = pair
    alone, bridged = engine_for(tiny, "none", backend), engine_for(tiny, path, backend)
    assert isinstance(bridged.drafter, BridgedDrafter)   # on the GPU too: a host drafter
    accepted = 0
    for seed in seeds:
        opts = Options(max_tokens=40, temperature=temperature, seed=seed, stop_at_eos=False,
                       k="fixed:4")
        ref = alone.generate(tiny.prompt, opts)
        r = bridged.generate(tiny.prompt, opts)
        assert r.tokens == ref.tokens and r.text == ref.text, f"seed {seed}"
        accepted += r.stats["accepted"]
        assert r.stats["bridge"]["kind"] == b.kind
        assert r.stats["bridge"]["shared_tokens"] == b.size
        assert r.receipt["draft"]["bridge"] == r.stats["bridge"]
        receipts.check(r.receipt)
    assert accepted > 0, "the bridge never proposed an accepted token"


def test_a_draft_cache_that_follows_re_encoding(tiny, foreign):
    """After many cycles with partial acceptance, the draft's committed rows are a fresh
    prefill of its own ids for the committed text (kv_ids is what the rows hold)."""
    model = Model.load(foreign.tli_path)
    b = check_pair(tiny.champion.metadata, model.metadata).bridge
    d = BridgedDrafter(model, b)
    seq = list(tiny.prompt)
    d.reset(seq)
    gen = np.random.default_rng(1)
    for _ in range(15):
        p = d.propose(seq, int(gen.integers(1, 5)), Rule("greedy"))
        keep = int(gen.integers(0, len(p.tokens) + 1))
        seq = seq + p.tokens[:keep] + [int(gen.integers(3, 300))]
        d.confirm(keep)
        n = d.kv.committed
        assert n == len(d.kv_ids) and d.kv_ids == d.view.ids(seq)[:n]
    fresh = model.new_cache()
    model.forward(d.kv_ids, fresh, exact=False)
    np.testing.assert_allclose(d.kv.k[:, :n], fresh.k[:, :n], rtol=1e-4, atol=1e-4)


def test_choices_stay_in_the_intersection_and_q_is_renormalised(tiny, foreign):
    model = Model.load(foreign.tli_path)
    b = check_pair(tiny.champion.metadata, model.metadata).bridge
    ids = DraftView(b).ids(list(tiny.prompt))
    logits = model.forward(ids, model.new_cache(), last_only=True)[0]           # (draft vocab,)
    # Make the draft's favourite a shared token, so that the block does not end.
    logits[np.flatnonzero(b.to_champion >= 0)[0]] = logits.max() + 1
    context = list(tiny.prompt)
    token, q, _ = bridged_choice(b, logits, context, Rule("rejection", 1.0, seed=3))
    assert b.to_draft[token] >= 0 and abs(q.sum() - 1) < 1e-12
    assert np.all(q[b.to_draft < 0] == 0)
    inside = verify.softmax(logits, 1.0)[b.to_draft[b.to_draft >= 0]]
    np.testing.assert_allclose(q[b.to_draft >= 0], inside / inside.sum(), rtol=1e-12)
    greedy, _, _ = bridged_choice(b, logits, context, Rule("greedy"))
    assert b.to_draft[greedy] == int(np.argmax(logits))
    # A processor (a JSON-schema mask, say) that allows only tokens the draft lacks.
    only_outside = MaskProcessor(b.to_draft < 0)
    assert bridged_choice(b, logits, context, Rule("greedy", processors=(only_outside,))) is None
    logits[np.flatnonzero(b.to_champion < 0)[0]] = logits.max() + 1   # favourite outside
    assert bridged_choice(b, logits, context, Rule("greedy")) is None


class MaskProcessor(Processor):
    def __init__(self, allowed):
        self.allowed = allowed                                             # (champion vocab,)

    def apply(self, logits, prefix, drafts):
        return np.where(self.allowed, logits, -np.inf)


@pytest.mark.parametrize("kind", ["perm", "tli"])
def test_rejection_under_the_intersection_follows_the_champion(tiny, foreign, kind):
    """The first two emitted tokens over 10,000 seeded runs with a bridged draft (k = 2, so the
    residual after an accepted draft and the bonus after two are both reached): the id map
    ("perm", every id renamed) and the intersection ("tli"). Teeth: the bridged draft's own
    two-token distribution is further from the champion's than the bound."""
    # A prefix both vocabularies cut alike, so that the draft is often right.
    prefix = tiny.tokenizer.encode("speculative decoding is exact. the")
    path = foreign.perm_path if kind == "perm" else foreign.tli_path
    exact = exact_two_token_distribution(tiny.champion, prefix, 1.0)
    bound = null_tv_quantile(exact, N_RUNS, 0.999)
    engine = engine_for(tiny, path)
    counts, accepted, drafted, two_drafts = sample_two_tokens(
        engine, prefix, 1.0, "fixed:2", exact.shape[0])
    check_two_token_counts(counts, exact, f"{kind}, fixed:2")
    assert drafted > 0 and 0 < accepted < drafted and two_drafts > 0, (accepted, drafted)
    own = bridged_two_token_distribution(tiny, path, prefix)
    assert 0.5 * np.abs(own - exact).sum() > bound
    check_first_acceptance(engine, bridged_q(tiny, path), prefix, exact)


def bridged_q(tiny, path):
    """q_after(tokens): the bridged draft's q row after `tokens`, over the champion's ids (at
    T = 1)."""
    model = Model.load(path)
    b = check_pair(tiny.champion.metadata, model.metadata).bridge

    def q_after(tokens):
        ids = DraftView(b).ids(tokens)
        logits = model.forward(ids, model.new_cache(), last_only=True)[0]
        champion_logits = np.full(len(b.to_draft), -np.inf)
        champion_logits[b.pairs[0]] = logits[b.pairs[1]]
        return verify.softmax(champion_logits, 1.0)
    return q_after


def check_first_acceptance(engine, q_after, prefix, exact, runs=N_RUNS):
    """The first draft's acceptance over `runs` seeded requests of two tokens (one cycle drafts
    one token) against its exact rate, sum_t min(p(t), q(t)) = 1 - TV(p, q), within 3.3
    standard errors (99.9%, two-sided). A drafter whose q rows were dropped (one-hot rows of
    the drafted token: still exact, as rejection sampling is for any q the draft samples from)
    would accept at sum_t p(t) q(t); the check requires that rate to lie outside the bound."""
    p1, q1 = exact.sum(axis=1), q_after(prefix)
    want, dropped = np.minimum(p1, q1).sum(), (p1 * q1).sum()
    bound = 3.3 * np.sqrt(want * (1 - want) / runs)
    assert abs(dropped - want) > bound, "no teeth: one-hot q rows would accept as often"
    hits = 0
    for seed in seed_block(runs, part=1):   # seeds the distribution test did not use
        r = engine.generate(prefix, Options(max_tokens=2, temperature=1.0, seed=seed,
                                            verify="rejection", k="fixed:2",
                                            stop_at_eos=False))
        assert r.stats["drafted_by_position"][0] == 1, r.stats
        hits += r.stats["accepted_by_position"][0]
    assert abs(hits / runs - want) < bound, \
        f"first-draft acceptance {hits / runs:.4f}, exact {want:.4f} +- {bound:.4f} " \
        f"(one-hot q rows: {dropped:.4f})"


def bridged_two_token_distribution(tiny, path, prefix):
    """q(t1, t2): the bridged draft's own distribution over two champion tokens (its q rows)."""
    q_after = bridged_q(tiny, path)
    q1 = q_after(prefix)
    joint = np.zeros((len(q1), len(q1)))
    for t1 in np.flatnonzero(q1 > 1e-4):
        joint[t1] = q1[t1] * q_after(prefix + [int(t1)])
    return joint


def test_the_browser_session_drafts_through_the_bridge(tiny, foreign):
    """session.Session given a draft with another vocabulary at init (the page's path): the same
    greedy text as champion-only, the class and intersection in the stats."""
    import asyncio
    import json
    from pathlib import Path

    from pyspec.apps import session

    async def no_device():
        raise AssertionError("the cpu backend opens no device")

    s = session.Session(no_device)
    info = json.loads(asyncio.run(s.load(json.dumps({"backend": "cpu"}),
                                         Path(tiny.champion_path).read_bytes(),
                                         Path(foreign.tli_path).read_bytes())))
    assert info["draft"] == "model", info
    messages = json.dumps([{"role": "user", "content": "speculative decoding is exact."}])
    out = {}
    for draft in ("none", "model"):
        config = json.dumps({"max_tokens": 24, "draft": draft, "k": "fixed:3"})
        out[draft] = json.loads(asyncio.run(s.generate(1, messages, config, lambda *a: None)))
    assert out["model"]["tokens"] == out["none"]["tokens"]
    assert out["model"]["stats"]["bridge"]["kind"] == "tli"
    assert out["model"]["stats"]["drafted"] > 0


def test_rejection_runs_the_bridged_q_rows_on_every_backend(tiny, foreign, backend):
    """On the GPU a bridged draft is a host drafter whose q rows (champion ids) go up with its
    tokens: it runs there and gets drafts accepted. (Its distribution: the test above on numpy,
    the one below on the GPU.)"""
    engine = engine_for(tiny, foreign.tli_path, backend)
    accepted = drafted = 0
    for seed in range(3):
        r = engine.generate(tiny.prompt, Options(max_tokens=24, temperature=0.9, seed=seed,
                                                 verify="rejection", k="fixed:3",
                                                 stop_at_eos=False))
        assert len(r.tokens) == 24
        accepted, drafted = accepted + r.stats["accepted"], drafted + r.stats["drafted"]
    assert 0 < accepted < drafted


@requires_gpu
def test_rejection_under_the_intersection_follows_the_champion_on_the_gpu(tiny, foreign):
    """The distribution test above for the intersection ("tli") on the GPU engine, where the
    accept kernel reads the q rows the host drafter uploads: 10,000 seeded runs, k = 2, the same
    stated bounds (check_two_token_counts); then the first draft's acceptance against its exact
    rate (check_first_acceptance). Teeth, measured once by patching bridged_choice: q rows
    shifted by one id fail the first (TV 0.398 against the bound 0.058); one-hot rows of the
    drafted token, which stay exact, fail the second (at 2,000 runs then: 0.908 exact against
    0.759)."""
    prefix = tiny.tokenizer.encode("speculative decoding is exact. the")
    exact = exact_two_token_distribution(tiny.champion, prefix, 1.0)
    engine = engine_for(tiny, foreign.tli_path, "gpu")
    counts, accepted, drafted, two_drafts = sample_two_tokens(
        engine, prefix, 1.0, "fixed:2", exact.shape[0])
    check_two_token_counts(counts, exact, "tli on the GPU, fixed:2")
    assert drafted > 0 and 0 < accepted < drafted and two_drafts > 0, (accepted, drafted)
    check_first_acceptance(engine, bridged_q(tiny, foreign.tli_path), prefix, exact)
