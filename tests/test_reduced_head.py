"""A reduced draft head on the numpy engine (issue 10's third candidate): the draft's logits
outside its kept ids are model.OUTSIDE_HEAD, so it never proposes them and its q is 0 there.

Greedy output stays champion-only's for every K (both numpy engines), rejection sampling keeps
the champion's distribution (10,000 seeded runs, the bounds and helpers of
tests/test_engine.py), and a draft's sidecar (load.vocab_sidecar: DRAFT.vocab.json) is read, or
refused with a ModelError that says what to do. The kept ids here leave out a third of the tiny
vocabulary, the champion's greedy tokens among them, so that the cut is felt.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from test_engine import (
    PREFIX_TEMPERATURE,
    assert_two_token_distribution,
    exact_two_token_distribution,
)

from pyspec.cpu.model import OUTSIDE_HEAD, Model, ModelError
from pyspec.engine import Engine
from pyspec.load import VOCAB_SCHEMA, load_draft_checked, vocab_sidecar
from pyspec.load import backend as backend_for
from pyspec.options import Options


def kept_ids(vocab: int) -> list[int]:
    """Every id but those divisible by 3, ranked in a shuffled order (the sidecar's ranking)."""
    ids = [i for i in range(vocab) if i % 3]
    return [int(i) for i in np.random.default_rng(4).permutation(ids)]


def write_sidecar(draft_path: str, ids: list[int], head_rows: int, **extra) -> None:
    with open(vocab_sidecar(draft_path), "w") as f:
        json.dump({"schema": VOCAB_SCHEMA, "head_rows": head_rows, "ids": ids, **extra}, f)


@pytest.fixture(scope="module")
def reduced_path(tiny, tmp_path_factory) -> str:
    """The tiny close draft with a sidecar keeping every id not divisible by 3."""
    path = str(tmp_path_factory.mktemp("reduced") / "close.gguf")
    shutil.copy(tiny.close_path, path)
    ids = kept_ids(tiny.champion.config.vocab_size)
    write_sidecar(path, ids, len(ids))
    return path


def test_a_reduced_head_keeps_its_rows_and_shuts_out_the_rest(tiny, reduced_path):
    full, reduced = Model.load(tiny.close_path), load_draft_checked(tiny.champion)(reduced_path)
    ids = np.array(sorted(kept_ids(tiny.champion.config.vocab_size)))
    assert np.array_equal(reduced.head_ids, ids)
    tokens = tiny.prompt[:12]
    a = full.forward(tokens, full.new_cache(), exact=False)                  # (12, vocab)
    b = reduced.forward(tokens, reduced.new_cache(), exact=False)
    np.testing.assert_allclose(b[:, ids], a[:, ids], rtol=1e-5, atol=1e-5)
    outside = np.setdiff1d(np.arange(a.shape[1]), ids)
    assert np.all(b[:, outside] == np.float32(OUTSIDE_HEAD))
    assert reduced.weight_bytes > full.weight_bytes    # the kept rows are a copy


def test_the_ranking_is_cut_at_head_rows(tiny, tmp_path):
    path = str(tmp_path / "d.gguf")
    shutil.copy(tiny.close_path, path)
    ids = kept_ids(tiny.champion.config.vocab_size)
    write_sidecar(path, ids, 50)
    assert np.array_equal(load_draft_checked(tiny.champion)(path).head_ids, sorted(ids[:50]))
    shutil.copy(tiny.close_path, tmp_path / "plain.gguf")            # no sidecar: the full head
    assert load_draft_checked(tiny.champion)(str(tmp_path / "plain.gguf")).head_ids is None


@pytest.mark.parametrize("backend", ["cpu", "fastcpu"])
def test_greedy_with_a_reduced_head_equals_champion_only(tiny, reduced_path, backend):
    engine = Engine(backend_for(tiny.on(backend), reduced_path), tiny.tokenizer)
    reference = engine.generate(tiny.prompt, Options(max_tokens=40, k="fixed:0",
                                                     stop_at_eos=False)).tokens
    cut = [t for t in reference if t % 3 == 0]
    assert cut, "the champion's greedy tokens must include ids the head cut"
    for k in ("fixed:1", "fixed:3", "fixed:6", "heuristic"):
        r = engine.generate(tiny.prompt, Options(max_tokens=40, k=k, stop_at_eos=False))
        assert r.tokens == reference, k
        if k.startswith("fixed"):
            assert 0 < r.stats["accepted"] < r.stats["drafted"], (k, r.stats["accepted"])


@pytest.mark.parametrize("backend", ["cpu", "fastcpu"])   # fastcpu: where the cut head ships
def test_rejection_with_a_reduced_head_matches_the_champion(tiny, reduced_path, backend):
    prefix, champion = tiny.tokenizer.encode("the cat. the cat. the"), tiny.on(backend)
    engine = Engine(backend_for(champion, reduced_path), tiny.tokenizer)
    exact, bound = assert_two_token_distribution(engine, champion, prefix, "fixed:2")
    # teeth: the cut draft's own distribution (q = 0 on a third of the ids) is far from it
    draft = load_draft_checked(tiny.champion)(reduced_path)
    draft_joint = exact_two_token_distribution(draft, prefix, PREFIX_TEMPERATURE)
    assert draft_joint[:, ::3].sum() == 0.0 and draft_joint[::3].sum() == 0.0
    assert 0.5 * np.abs(draft_joint - exact).sum() > bound


@pytest.mark.parametrize("doc,what", [
    ("{", "Expecting"),
    (json.dumps({"schema": "other/1", "head_rows": 2, "ids": [1, 2]}), "schema"),
    (json.dumps({"schema": VOCAB_SCHEMA, "head_rows": 0, "ids": [1, 2]}), "head_rows 0"),
    (json.dumps({"schema": VOCAB_SCHEMA, "head_rows": 3, "ids": [1, 2]}), "head_rows 3"),
    (json.dumps({"schema": VOCAB_SCHEMA, "head_rows": 2, "ids": [1, 1]}), "each once"),
    (json.dumps({"schema": VOCAB_SCHEMA, "head_rows": 2, "ids": [1, 99999]}), "outside"),
    (json.dumps({"schema": VOCAB_SCHEMA, "ids": [1, 2]}), "head_rows"),
])
def test_a_bad_sidecar_is_a_model_error_that_says_what_to_do(tiny, tmp_path, doc, what):
    path = str(tmp_path / "d.gguf")
    shutil.copy(tiny.close_path, path)
    with open(vocab_sidecar(path), "w") as f:
        f.write(doc)
    with pytest.raises(ModelError, match="delete it") as e:
        load_draft_checked(tiny.champion)(path)
    assert what in str(e.value) and "d.vocab.json" in str(e.value)
