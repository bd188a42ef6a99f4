"""A tree's verify pass on the CPU engines (cpu/model.py, cpu/fastcpu.py) and its KV transaction
(kv.py: append_tree, lineage, compact).

A node's logits must be bit-identical to those of its path fed as a chain (batch invariance
across shapes), and after the accepted path's rows are compacted the cache must continue as if
the path had been fed as a chain. Tiny random models from pyspec.testmodels; a gemma3 model
adds a sliding-window layer (its window counts positions along the path, not slots).
"""

from __future__ import annotations

import numpy as np
import pytest

from pyspec.cpu import fastcpu
from pyspec.cpu.model import Model
from pyspec.kv import KVCache
from pyspec.rules.tree import ROOT, Tree
from pyspec.testmodels import write_family_model, write_model

ENGINES = {"numpy": lambda p: Model.load(p), "fast": lambda p: fastcpu.FastModel.load(p)}


def _slots(tree: Tree, start: int) -> np.ndarray:
    """(1 + N,) the parent slot of each row of a tree pass whose first row is at `start`."""
    rows = tree.row_parents()
    return np.where(rows == ROOT, start - 1, start + rows)


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def model_path(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("tree") / f"{request.param}.gguf"
    if request.param == "llama":
        write_model(path, seed=3, n_layers=2)
    else:
        write_family_model(path, "gemma3", seed=3)   # window 8 < the positions used
    return path


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_node_scores_as_its_path_fed_as_a_chain(model_path, engine):
    model = ENGINES[engine](model_path)
    vocab = model.config.vocab_size
    prompt = np.random.default_rng(0).integers(0, vocab, 9).tolist()
    tree = Tree((5, 6, 7, 8, 9, 10, 11), (ROOT, 0, 1, 0, ROOT, 4, 5))

    kv = model.new_cache(64)
    model.forward(prompt[:-1], kv)
    kv.commit(len(prompt) - 1)
    start = kv.length
    logits = model.forward([prompt[-1], *tree.tokens], kv, parents=_slots(tree, start))
    for node in range(len(tree)):
        path = [tree.tokens[i] for i in tree.path(node)]
        chain = model.new_cache(64)
        model.forward(prompt[:-1], chain)
        chain.commit(len(prompt) - 1)
        ref = model.forward([prompt[-1], *path], chain)[-1]
        assert np.array_equal(logits[node + 1], ref), f"node {node} differs from its chain"

    # The verdict keeps node 2's path: its rows compacted, the cache goes on as a chain's.
    kv.compact([start] + [start + 1 + i for i in tree.path(2)])
    assert kv.committed == len(prompt) + 3 and kv.pending == 0
    after = model.forward([12, 13], kv)
    chain = model.new_cache(64)
    ref = model.forward(prompt + [5, 6, 7, 12, 13], chain)[-2:]
    fresh = model.new_cache(64)   # the same rows fed in the same split, for the exact compare
    model.forward(prompt[:-1], fresh)
    fresh.commit(len(prompt) - 1)
    model.forward([prompt[-1], 5, 6, 7], fresh)
    fresh.commit(4)
    assert np.array_equal(after, model.forward([12, 13], fresh))
    assert np.allclose(after, ref, atol=1e-4)


def test_append_tree_refuses_parents_outside_the_pending_rows():
    kv = KVCache(1, 16, 1, 2)
    kv.append(4)
    kv.commit(4)
    with pytest.raises(ValueError, match="earlier pending rows"):
        kv.append_tree([2, 4])        # slot 2 is committed, not the last committed row
    kv.append_tree([3, 4, 4, 6])
    assert kv.lineage(7).tolist() == [0, 1, 2, 3, 4, 6, 7]
    assert kv.lineage(6).tolist() == [0, 1, 2, 3, 4, 6]
