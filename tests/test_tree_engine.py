"""`--tree` end to end on the CPU engines (cpu/executor.py with drafters/tree.py), on the tiny
models of conftest.py: greedy output equals champion-only greedy, replay equals champion-only
sampling for the seed, whatever the tree shape and drafter; rejection's first two tokens follow
the champion's joint over 10,000 seeded requests (the engine's own tree, walk and keying; the
walk alone on a toy model: tests/test_tree.py); a tree the engine cannot verify is refused by
name.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import greedy_pick, reference_decode
from pyspec import testmodels
from pyspec.cpu.model import Model
from pyspec.engine import Engine
from pyspec.errors import OptionsError, TreeUnsupportedError
from pyspec.load import backend as backend_for
from pyspec.options import Options
from pyspec.rules import rng, verify
from test_engine import check_two_token_counts, exact_two_token_distribution, seed_block

SHAPES = ["2,2,1", "3,1", "auto"]


def engine_for(tiny, draft, backend="cpu") -> Engine:
    spec = {"close": tiny.close_path, "far": tiny.far_path}.get(draft, draft)
    return Engine(backend_for(tiny.on(backend), spec, load_draft=Model.load), tiny.tokenizer)


@pytest.mark.parametrize("backend, draft", [("cpu", "ngram"), ("cpu", "close"),
                                            ("fastcpu", "far")])
def test_tree_greedy_and_replay_equal_champion_only(tiny, draft, backend):
    greedy = reference_decode(tiny.champion, tiny.prompt, 30, greedy_pick)
    seed, temperature = 99, 0.8

    def pick(logits, position):
        return verify.sample_replay(logits, temperature, rng.gumbel(seed, position, len(logits)))

    replay = reference_decode(tiny.champion, tiny.prompt, 30, pick)
    engine = engine_for(tiny, draft, backend)
    for shape in SHAPES:
        r = engine.generate(tiny.prompt, Options(max_tokens=30, k="fixed:3", tree=shape,
                                                 stop_at_eos=False))
        assert r.tokens == greedy, f"greedy, tree {shape}"
        if draft != "far":
            assert r.stats["champion_passes"] < 30, f"tree {shape} accepted nothing"
        r = engine.generate(tiny.prompt, Options(max_tokens=30, k="fixed:3", tree=shape,
                                                 temperature=temperature, seed=seed,
                                                 stop_at_eos=False))
        assert r.tokens == replay, f"replay, tree {shape}"
    r = engine.generate(tiny.prompt, Options(max_tokens=30, k="fixed:3", tree="2,2,1",
                                             temperature=1.0, seed=3, verify="rejection",
                                             stop_at_eos=False))
    assert len(r.tokens) == 30
    # behind the guard, which drafts a tree or a chain each cycle by its cost model (schedule.py)
    r = engine.generate(tiny.prompt, Options(max_tokens=30, k="heuristic", tree="2,2,1",
                                             stop_at_eos=False))
    assert r.tokens == greedy
    sched = r.stats["schedule"]
    assert sched["trees"] + sched["tree_off"] > 0 or sched["guard_off"] > 0
    # and chains after trees, on the same engine: unchanged
    r = engine.generate(tiny.prompt, Options(max_tokens=30, k="fixed:3", stop_at_eos=False))
    assert r.tokens == greedy


TREE_RUNS = 10_000


@pytest.fixture(scope="module")
def middling_draft(tiny, tmp_path_factory) -> str:
    """The champion + 20% noise: its trees of shape 3,2 accept nothing at the first position in
    about 28% of requests, one draft in 54%, two in 18% (close.gguf, 4% noise: 1%, 16%, 84%;
    far.gguf: 92%, 7%, 1%), so siblings are rejected and accepted at both depths."""
    path = str(tmp_path_factory.mktemp("middling") / "middling.gguf")
    weights = testmodels.random_weights(tiny.champion.config.vocab_size, 2, 64, 4, 2, 128, seed=1)
    testmodels.write_model(path, weights=testmodels.perturb(weights, 0.2, 11))
    return path


def test_tree_rejection_matches_champion_distribution(tiny, middling_draft):
    """The engine's tree rejection on the CPU: a draft model's tree of shape 3,2
    (drafters/tree.py: three siblings drawn without replacement, two under each), walked by
    cycle.tree_verdict; max_tokens=3, so a first cycle emits one to three tokens and a second
    cycle (a one-deep tree) follows a first that emitted one. The first two tokens of 10,000
    requests, one seed each from the test's own block (test_engine.seed_block), against the
    champion's exact joint at T = 1.

    Stated bounds (test_engine.check_two_token_counts): the TV of the joint, of the first
    token, of the second token's marginal and of the second given each of the three likeliest
    first tokens, each below the 99.9th percentile of the TV that as many exact draws give.
    Every request drafts a tree; paths of both depths are accepted and first cycles that accept
    nothing are common. Teeth: the draft's own joint is further than the bound."""
    engine = engine_for(tiny, middling_draft)
    prefix = tiny.tokenizer.encode("the cat. the cat. the")
    exact = exact_two_token_distribution(tiny.champion, prefix, 1.0)          # (vocab, vocab)
    counts = np.zeros_like(exact)
    first_accepted = np.zeros(3, dtype=np.int64)   # requests by drafts accepted at positions 1-2
    for seed in seed_block(TREE_RUNS):
        r = engine.generate(prefix, Options(max_tokens=3, temperature=1.0, seed=seed,
                                            verify="rejection", k="fixed:2", tree="3,2",
                                            stop_at_eos=False))
        counts[r.tokens[0], r.tokens[1]] += 1
        assert r.stats["schedule"]["trees"] >= 1, "a cycle drafted no tree"
        first_accepted[sum(r.stats["accepted_by_position"][:2])] += 1
    bound = check_two_token_counts(counts, exact, "tree 3,2")
    assert np.all(first_accepted > 1000), first_accepted
    draft_joint = exact_two_token_distribution(Model.load(middling_draft), prefix, 1.0)
    assert 0.5 * np.abs(draft_joint - exact).sum() > bound


def test_bad_trees_are_refused_by_name(tiny):
    engine = engine_for(tiny, "ngram")
    for bad in ("2,0", "x", "8,8"):
        with pytest.raises(OptionsError, match="tree"):
            engine.generate(tiny.prompt, Options(max_tokens=4, tree=bad))
    with pytest.raises(TreeUnsupportedError, match="sampling controls"):
        engine.generate(tiny.prompt, Options(max_tokens=4, tree="2", top_k=5, temperature=1.0))
    with pytest.raises(TreeUnsupportedError, match="drafter of kind"):
        engine_for(tiny, "self:1").generate(tiny.prompt, Options(max_tokens=4, tree="2"))
    engine.backend.takes_trees = False    # as the GPU backend: no tree pass, never ignored
    with pytest.raises(TreeUnsupportedError, match="backend does not have"):
        engine.generate(tiny.prompt, Options(max_tokens=4, tree="2"))


@pytest.mark.usefixtures("gpu")
@pytest.mark.parametrize("draft", ["ngram", "close"])
def test_trees_on_the_gpu_equal_champion_only(tiny, draft):
    """The GPU backend's tree cycles (gpu/tree.py): n-gram's tree or a draft model's grown on
    the GPU, one pass under the Step's tree table, the walk on the host, the accepted rows
    moved into place; greedy and replay equal champion-only, and a chain after them is
    unchanged."""
    greedy = reference_decode(tiny.champion, tiny.prompt, 24, greedy_pick)
    seed, temperature = 99, 0.8

    def pick(logits, position):
        return verify.sample_replay(logits, temperature, rng.gumbel(seed, position, len(logits)))

    replay = reference_decode(tiny.champion, tiny.prompt, 24, pick)
    engine = engine_for(tiny, draft, "gpu")
    for shape in ("2,2,1", "auto"):
        r = engine.generate(tiny.prompt, Options(max_tokens=24, k="fixed:3", tree=shape,
                                                 stop_at_eos=False))
        assert r.tokens == greedy, f"greedy, tree {shape}"
        assert r.stats["champion_passes"] < 24, f"tree {shape} accepted nothing"
        r = engine.generate(tiny.prompt, Options(max_tokens=24, k="fixed:3", tree=shape,
                                                 temperature=temperature, seed=seed,
                                                 stop_at_eos=False))
        assert r.tokens == replay, f"replay, tree {shape}"
    r = engine.generate(tiny.prompt, Options(max_tokens=24, k="fixed:3", stop_at_eos=False))
    assert r.tokens == greedy
    with pytest.raises(TreeUnsupportedError, match="verifies at most 15"):
        engine.generate(tiny.prompt, Options(max_tokens=4, tree="4,4"))


@pytest.mark.usefixtures("gpu")
def test_a_tree_that_does_not_pay_drafts_its_chain_on_the_chains_path(tiny, monkeypatch):
    """--tree never drafts less than its chain: where the guard says a tree does not pay
    (schedule.tree_pays; tests/test_guard_sim.py drives the guard itself on a machine where the
    chain pays), the cycle drafts the chain on the chain's own path, n-gram looked up on the
    device with the cycles going ahead, never nothing and never a host tree. Tokens are
    champion-only's, under a fixed policy and under the guard."""
    from pyspec import schedule

    greedy = reference_decode(tiny.champion, tiny.prompt, 24, greedy_pick)
    engine = engine_for(tiny, "ngram", "gpu")
    opts = dict(max_tokens=24, stop_at_eos=False)
    tree = engine.generate(tiny.prompt, Options(k="heuristic", tree="auto", **opts))
    assert tree.tokens == greedy
    monkeypatch.setattr(schedule.Schedule, "tree_pays", lambda self, *a, **kw: False)
    for k in ("fixed:3", "heuristic"):
        r = engine.generate(tiny.prompt, Options(k=k, tree="auto", **opts))
        timing = r.stats["backend_timing"]
        assert r.tokens == greedy, k
        assert timing["drafted_on_host"] == 0 and timing["ahead"] > 0, (k, timing)
        if k == "fixed:3":
            assert r.stats["draft_path"] == "device" and r.stats["drafted"] > 0, r.stats
