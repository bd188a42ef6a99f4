"""Rejection sampling with a draft of the trained draft's architecture stays exact.

models/draft-l4.gguf is a Llama at the champion's width with fewer layers (a subset of the
champion's, retrained), its head tied to its token embedding and both in Q4_1, the layer
matrices in Q4_1 (train/distill.py). Here a tiny random draft of that shape (1 of the tiny
champion's 2 layers, perturbed; the champion's head as its tied Q4_1 embedding) drafts for the
tiny champion, and the first two emitted tokens over 10,000 seeded runs must follow the champion's
own distribution, on numpy and on native WebGPU. Bounds and teeth as in
tests/test_engine.py::test_rejection_matches_champion_distribution, whose helpers this reuses.
The WebGPU case is also the suite's GPU rejection test with a draft model of its own cache (the
draft's samples, its q_draft rows, the residual and the bonus all kernels).
"""

from __future__ import annotations

import numpy as np
import pytest

from pyspec import quant, testmodels
from pyspec.engine import Engine
from pyspec.load import backend as backend_for
from pyspec.model import Model
from test_engine import (PREFIX_TEMPERATURE, assert_two_token_distribution,
                         exact_two_token_distribution)


@pytest.fixture(scope="module")
def draft_path(tiny, tmp_path_factory) -> str:
    champion = testmodels.write_model(tmp_path_factory.mktemp("arch") / "c.gguf", seed=1)
    noisy = testmodels.perturb(champion, 0.1, 11)
    weights = {"token_embd.weight": champion["output.weight"],   # tied head, the champion's
               "output_norm.weight": champion["output_norm.weight"]}
    weights |= {k.replace("blk.1.", "blk.0."): v for k, v in noisy.items()
                if k.startswith("blk.1.")}
    path = str(tmp_path_factory.mktemp("arch") / "draft-l1.gguf")
    testmodels.write_model(path, weights=weights, n_layers=1, embd_type=quant.Q4_1.type_id)
    model = Model.load(path)
    assert model.config.n_layers == 1 and model.config.d_model == tiny.champion.config.d_model
    return path


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_rejection_with_a_trained_shape_draft_matches_the_champion(tiny, draft_path, backend,
                                                                   request):
    if backend == "gpu":
        request.getfixturevalue("gpu")
    prefix = tiny.tokenizer.encode("the cat. the cat. the")
    engine = Engine(backend_for(tiny.on(backend), draft_path, load_draft=Model.load),
                    tiny.tokenizer)
    exact, bound = assert_two_token_distribution(engine, tiny.champion, prefix, "fixed:2")
    # teeth: the draft's own distribution is further from the champion's than the bound
    draft_joint = exact_two_token_distribution(Model.load(draft_path), prefix, PREFIX_TEMPERATURE)
    assert 0.5 * np.abs(draft_joint - exact).sum() > bound
