"""Drafters in isolation (pyspec/drafters): proposals, and a cache that stays in sync."""

from __future__ import annotations

import numpy as np
import pytest

from pyspec.cpu.model import Model
from pyspec.cycle import Rule
from pyspec.drafters import (
    DraftSpec,
    DraftSpecError,
    Proposal,
    parse_draft,
)
from pyspec.drafters.model_draft import STEADY_FEED, ModelDrafter
from pyspec.drafters.ngram import NgramDrafter
from pyspec.load import make_drafter

GREEDY = Rule("greedy")   # argmax drafts; threshold 0 never stops


def test_ngram_proposes_what_followed_the_latest_match():
    d = NgramDrafter()
    seq = [5, 6, 7, 8, 9, 1, 2, 6, 7, 3, 4, 6, 7]
    # suffix [6, 7] last occurred followed by 3, 4, 6
    assert d.propose(seq, 3, GREEDY).tokens == [3, 4, 6]
    assert d.propose([1, 2, 3], 4, GREEDY).tokens == []
    assert d.propose([9, 1, 9], 5, GREEDY).tokens == [1], "a 1-token match drafts one"
    assert d.propose([4, 9, 1, 4, 9], 5, GREEDY).tokens == [1, 4, 9], "2 tokens: three"
    p = d.propose(seq, 2, GREEDY)
    assert np.array_equal(p.q_matrix(10)[0], np.eye(10)[3]), "n-gram drafts are one-hot"


def test_ngram_prefers_longer_suffixes():
    d = NgramDrafter()
    seq = [1, 2, 3, 9, 8, 2, 3, 7, 1, 2, 3]
    # [1, 2, 3] matched at 0 (followed by 9); the shorter [2, 3] would propose 7
    assert d.propose(seq, 1, GREEDY).tokens == [9]


def _latest_match_oracle(seq: list[int], k: int) -> list[int]:
    """The lookup by brute force: for n = 4..1, the latest earlier window equal to the last n
    tokens that has a token after it; at most 1, 3, 7, 15 drafts for n = 1, 2, 3, 4."""
    for n in range(min(4, len(seq) - 1), 0, -1):
        for start in range(len(seq) - n - 1, -1, -1):
            if seq[start:start + n] == seq[-n:]:
                return seq[start + n:start + n + min(k, 2 ** n - 1)]
    return []


def test_ngram_index_equals_a_brute_force_lookup_as_the_context_grows():
    """The incremental index against the brute-force search: lists grown in place over small
    vocabularies (many repeats), a fresh list, a shorter one and one changed in place."""
    rng = np.random.default_rng(7)
    for trial in range(200):
        d, seq = NgramDrafter(), []
        vocab = int(rng.choice([2, 3, 5, 40]))
        for _ in range(int(rng.integers(1, 60))):
            seq.extend(int(t) for t in rng.integers(0, vocab, int(rng.integers(1, 4))))
            k = int(rng.integers(1, 9))
            assert d.preview(seq, k) == _latest_match_oracle(seq, k), (seq, k)
        other = list(seq[: len(seq) // 2])
        assert d.preview(other, 4) == _latest_match_oracle(other, 4)
        seq[-1] = (seq[-1] + 1) % vocab
        assert d.preview(seq, 4) == _latest_match_oracle(seq, 4)
    assert d.calls == 0, "a preview is not a call"
    d.propose(seq, 2, GREEDY)
    assert d.calls == 1


def test_draft_specs(tiny):
    assert make_drafter("none", tiny.champion) is None
    for bad in ("self:0", "self:2", "self:x", "bogus"):
        with pytest.raises(DraftSpecError):
            make_drafter(bad, tiny.champion, tiny.champion.new_cache())


def test_model_drafter_cache_follows_the_sequence(tiny):
    """After proposals, partial acceptance and catch-up, the draft's committed rows equal a
    fresh prefill of the committed sequence (its own rows, its own arithmetic)."""
    model = Model.load(tiny.close_path)
    d = ModelDrafter(model)
    seq = list(tiny.prompt)
    d.reset(seq)
    gen = np.random.default_rng(0)
    for _ in range(12):
        p = d.propose(seq, int(gen.integers(1, 6)), GREEDY)
        keep = int(gen.integers(0, len(p.tokens) + 1))
        seq = seq + p.tokens[:keep] + [int(gen.integers(3, 300))]
        d.confirm(keep)
        assert d.kv.committed <= len(seq) - 1
    fresh = model.new_cache()
    model.forward(seq[:d.kv.committed], fresh, exact=False)
    n = d.kv.committed
    # The fast path is not batch-invariant, so compare with a tolerance.
    np.testing.assert_allclose(d.kv.k[:, :n], fresh.k[:, :n], rtol=1e-4, atol=1e-4)
    assert n > len(tiny.prompt)


def test_model_drafter_catches_up_apart_from_its_steps(tiny):
    """Tokens committed while the draft sat out (the guard had it off) are fed and committed
    ahead of its steps and timed apart (catch_up_s, not the guard's time per draft token); the
    steps see the steady feed, and the cache still follows the sequence."""
    model = Model.load(tiny.close_path)
    d = ModelDrafter(model)
    seq = list(tiny.prompt)
    d.reset(seq)
    d.propose(seq, 2, GREEDY)
    assert d.catch_up_s == 0.0
    d.confirm(0)
    seq = seq + [7] + [int(t) for t in np.random.default_rng(1).integers(3, 300, 9)]
    p = d.propose(seq, 3, GREEDY)
    assert len(p.tokens) == 3
    assert d.catch_up_s > 0.0
    assert d.kv.committed == len(seq) - STEADY_FEED and d.fed_before == STEADY_FEED
    d.confirm(len(p.tokens))
    seq = seq + p.tokens + [5]
    assert d.kv.committed == len(seq) - 2
    fresh = model.new_cache()
    model.forward(seq[:d.kv.committed], fresh, exact=False)
    n = d.kv.committed
    np.testing.assert_allclose(d.kv.k[:, :n], fresh.k[:, :n], rtol=1e-4, atol=1e-4)


def test_proposal_q_matrix_mixes_rows():
    p = Proposal([2, 0], [None, np.array([0.5, 0.25, 0.25])])
    assert np.array_equal(p.q_matrix(3), [[0, 0, 1], [0.5, 0.25, 0.25]])


def test_parse_draft_reads_every_kind():
    assert parse_draft("none") == DraftSpec("none")
    assert parse_draft("ngram") == DraftSpec("ngram")
    assert parse_draft("self:3", n_layers=4) == DraftSpec("self", layers=3)
    assert parse_draft("model") == DraftSpec("model")
    assert parse_draft("model:d.gguf") == DraftSpec("model", path="d.gguf")
    assert parse_draft("drafts/d.gguf") == DraftSpec("model", path="drafts/d.gguf")
    for spec in ("none", "ngram", "self:3", "model", "model:d.gguf"):
        assert str(parse_draft(spec)) == spec
    assert [parse_draft(s).needs_weights for s in ("none", "ngram", "self:2", "model")] == [
        False, False, False, True]
    for bad in ("self:0", "self:4", "self:x", "self:", "bogus", "", "model:"):
        with pytest.raises(DraftSpecError):
            parse_draft(bad, n_layers=4)


def test_confidence_stop_ends_drafting_at_the_first_low_confidence(tiny):
    """The one confidence stop (cycle.Rule.stops) ends a model draft's block early."""
    d = ModelDrafter(Model.load(tiny.close_path))
    d.reset(list(tiny.prompt))
    full = d.propose(list(tiny.prompt), 6, GREEDY)
    assert len(full.tokens) == 6
    d.reset(list(tiny.prompt))
    assert d.propose(list(tiny.prompt), 6, Rule("greedy", conf_threshold=1.01)).tokens == []


@pytest.mark.parametrize("name", ["cpu", "fastcpu"])
def test_a_broken_draft_costs_speed_not_the_request(tiny, tmp_path, name):
    """A draft whose logits are NaN (corrupt weights) fails its first proposal: the request
    goes on champion-only with the champion's tokens, the receipt records the fault
    (bad_draft), and the engine's later requests decode without it."""
    from pyspec import testmodels
    from pyspec.cpu.model import Model
    from pyspec.engine import Engine
    from pyspec.load import backend
    from pyspec.options import Options

    weights = testmodels.random_weights(tiny.tokenizer.vocab_size, 2, 64, 4, 2, 128, seed=5)
    weights["output_norm.weight"] = np.full_like(weights["output_norm.weight"], np.nan)
    broken = tmp_path / "broken.gguf"
    testmodels.write_model(broken, weights=weights)
    opts = Options(max_tokens=16, stop_at_eos=False, k="fixed:2")
    alone = Engine(backend(tiny.on(name), "none"), tiny.tokenizer).generate(tiny.prompt, opts)
    engine = Engine(backend(tiny.on(name), str(broken), load_draft=Model.load), tiny.tokenizer)
    r = engine.generate(tiny.prompt, opts)
    assert r.tokens == alone.tokens and r.stats["drafted"] == 0
    assert [f["kind"] for f in r.receipt["faults"]] == ["bad_draft"]
    again = engine.generate(tiny.prompt, opts)
    assert again.tokens == alone.tokens and again.receipt["faults"] == []
