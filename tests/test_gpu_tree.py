"""A tree's verify pass on the GPU (shaders/attention.wgsl, matmul.wgsl's RoPE epilogue,
qk_norm.wgsl under Step.tree): every node's logits are bit-identical to those of its path fed
as a chain, on a llama (RoPE in the product's epilogue) and a gemma3 (per-head norms, then
RoPE, and a sliding window that counts positions along the path, not cache rows). Then tree
cycles end to end (gpu/tree.py, gpu/treedraft.py): champion-only's output, what a cycle reads
back and submits, a draft model's trees grown on the device equal to the host's growth, and
n-gram's trees going ahead."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from conftest import gpu_device, requires_gpu
from pyspec.rules.tree import ROOT, Tree
from pyspec.testmodels import write_family_model

pytestmark = requires_gpu

TREE = Tree((5, 6, 7, 8, 9, 10, 11), (ROOT, 0, 1, 0, ROOT, 4, 5))


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def gpu_model(request, tiny, tmp_path_factory):
    if request.param == "llama":
        return tiny.on("gpu")
    from pyspec.formats.gguf import GGUFFile
    from pyspec.gpu import load_model
    path = tmp_path_factory.mktemp("gpu_tree") / "gemma3.gguf"
    write_family_model(path, "gemma3", seed=3)   # window 8 < the positions used
    return load_model(gpu_device(), GGUFFile.open(str(path)))


@pytest.fixture(params=["gpu", "cpu"])
def adapter_kind(request, gpu_model, monkeypatch):
    """Plans built as on a GPU (attention_tree) or a software adapter (attention_tree_cpu),
    whichever this adapter is; the plans are dropped before and after."""
    gpu_model.forget_plans()
    monkeypatch.setattr(gpu_model.dev, "is_cpu", request.param == "cpu")
    yield request.param
    gpu_model.forget_plans()


def _prefilled(model, prompt: list[int]) -> None:
    model.limit_context(64)
    model.prefill(prompt, 0)


def test_a_node_scores_as_its_path_fed_as_a_chain(gpu_model, adapter_kind):
    vocab = gpu_model.config.vocab_size
    prompt = np.random.default_rng(0).integers(0, vocab, 9).tolist()
    _prefilled(gpu_model, prompt)
    tree = (gpu_model.kv.length, TREE.row_parents())
    logits = asyncio.run(gpu_model.read_logits([prompt[-1], *TREE.tokens], 0, tree=tree))
    for node in range(len(TREE)):
        path = [TREE.tokens[i] for i in TREE.path(node)]
        _prefilled(gpu_model, prompt)
        ref = asyncio.run(gpu_model.read_logits([prompt[-1], *path], 0))[-1]
        assert np.array_equal(logits[node + 1].view(np.uint32), ref.view(np.uint32)), \
            f"node {node} differs from its chain"


def test_a_tree_grown_a_depth_a_pass_scores_as_its_paths(gpu_model):
    """A draft's tree (drafters/tree.py's growth on the GPU): the root fed as a chain, then one
    pass per depth whose rows hang under rows of the passes before (the Step's table from the
    root): each node's logits are its path's as a chain."""
    vocab = gpu_model.config.vocab_size
    prompt = np.random.default_rng(2).integers(0, vocab, 9).tolist()
    # entries from the root: 1, 2 at depth 1; 3, 4, 5 at depth 2 (under 1, 2, 1); 6 under 4
    tokens, parents = [None, 20, 21, 22, 23, 24, 25], [-1, 0, 0, 1, 2, 1, 4]
    _prefilled(gpu_model, prompt)
    base = gpu_model.kv.length
    asyncio.run(gpu_model.read_logits(prompt[-1:], 0))
    got = {}
    for lo, hi in ((1, 3), (3, 6), (6, 7)):
        rows = asyncio.run(gpu_model.read_logits(tokens[lo:hi], 0, tree=(base, parents[:hi])))
        got |= {lo + j: row for j, row in enumerate(rows)}
    for entry, row in got.items():
        path, a = [], entry
        while a > 0:
            path, a = [tokens[a]] + path, parents[a]
        _prefilled(gpu_model, prompt)
        ref = asyncio.run(gpu_model.read_logits([prompt[-1], *path], 0))[-1]
        assert np.array_equal(row.view(np.uint32), ref.view(np.uint32)), f"entry {entry}"


def test_the_compacted_path_continues_as_a_chain(gpu_model):
    """Node 5's path (nodes 4, 5: rows 5, 6) moved after the root by kv_compact, then two more
    tokens: bit-identical to the path fed as a chain in the same split."""
    from pyspec.gpu.tree import Compaction

    vocab = gpu_model.config.vocab_size
    prompt = np.random.default_rng(1).integers(0, vocab, 9).tolist()
    _prefilled(gpu_model, prompt)
    start = gpu_model.kv.length
    tree = (start, TREE.row_parents())
    asyncio.run(gpu_model.read_logits([prompt[-1], *TREE.tokens], 0, tree=tree))
    moves = Compaction(gpu_model)
    moves.move([start] + [start + 1 + i for i in TREE.path(5)])
    assert gpu_model.kv.committed == start + 3 and gpu_model.kv.pending == 0
    gpu_model.dev.submit(moves.take())
    after = asyncio.run(gpu_model.read_logits([12, 13], 0))

    _prefilled(gpu_model, prompt)
    asyncio.run(gpu_model.read_logits([prompt[-1], 9, 10], 0))
    gpu_model.kv.commit(3)
    ref = asyncio.run(gpu_model.read_logits([12, 13], 0))
    assert np.array_equal(after.view(np.uint32), ref.view(np.uint32))


def test_malformed_parent_rows_are_refused(tiny):
    model = tiny.on("gpu")
    model.limit_context(64)
    with pytest.raises(ValueError, match="parent rows"):
        model.feed([1, 2, 3], 0, tree=(0, [-1, 0, 2]))


# --- tree cycles end to end (gpu/tree.py, gpu/treedraft.py) --------------------------------------
def _engine(tiny, draft, **paths):
    from pyspec.cpu.model import Model
    from pyspec.engine import Engine
    from pyspec.load import backend as backend_for

    spec = {"close": tiny.close_path}.get(draft, draft)
    return Engine(backend_for(tiny.on("gpu"), spec, load_draft=Model.load, **paths),
                  tiny.tokenizer)


def _generate(engine, tiny, n=24, **opts):
    from pyspec.options import Options

    return engine.generate(tiny.prompt, Options(max_tokens=n, k="fixed:3", stop_at_eos=False,
                                                **opts))


def _greedy(tiny, n=24):
    from conftest import greedy_pick, reference_decode

    return reference_decode(tiny.champion, tiny.prompt, n, greedy_pick)


@pytest.mark.parametrize("draft", ["ngram", "close"])
def test_a_greedy_tree_cycle_reads_back_words_not_logits(tiny, draft):
    """Greedy: the pass's rows are reduced on the device (argmax_rows) and walked there
    (tree_walk.wgsl), so a tree cycle reads back O(rows) words (the accept words and the path's
    moves), never its (1 + N, vocab) logits; one readback a cycle. Rejection still reads the
    rows (its walk needs them): the counter's teeth."""
    from pyspec.gpu.constants import ACCEPT_WORDS
    from pyspec.gpu.tree import MOVES_WORDS

    engine = _engine(tiny, draft)
    vocab = tiny.champion.config.vocab_size
    r = _generate(engine, tiny, tree="2,2,1")
    timing = r.stats["backend_timing"]
    assert r.tokens == _greedy(tiny)
    assert r.stats["schedule"]["trees"] > 0 and r.stats["champion_passes"] < 24
    assert timing["readbacks"] == timing["cycles"], timing
    # the most a cycle without its logits reads: the accept words and a tree's moves, less
    # than two logits rows
    words = ACCEPT_WORDS + MOVES_WORDS
    assert timing["readback_bytes"] <= 4 * words * timing["cycles"], timing
    assert words < 2 * vocab
    if draft == "ngram":
        r = _generate(engine, tiny, tree="2,2,1", temperature=1.0, seed=3, verify="rejection")
        timing = r.stats["backend_timing"]
        assert timing["readback_bytes"] > 4 * words * timing["cycles"], timing


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_draft_models_tree_grows_on_the_device_in_one_submission(tiny, temperature,
                                                                   monkeypatch):
    """A draft model's fixed-width tree (gpu/treedraft.py): every depth's frontier drafted in one
    batched pass, all in the cycle's one submission, one readback a cycle; the output is
    champion-only's (greedy, and replay for the seed), and under greedy every cycle's tree is
    the one the host grows a depth a pass (device_trees=False), node for node."""
    from conftest import reference_decode
    from pyspec.rules import rng, verify

    seed = 5

    def pick(logits, position):
        return (int(np.argmax(logits)) if temperature == 0 else verify.sample_replay(
            logits, temperature, rng.gumbel(seed, position, len(logits))))

    want = reference_decode(tiny.champion, tiny.prompt, 24, pick)
    opts = dict(tree="2,2,1", temperature=temperature, seed=seed)
    device = _generate(_engine(tiny, "close"), tiny, **opts)
    timing = device.stats["backend_timing"]
    assert device.tokens == want
    assert device.stats["schedule"]["trees"] >= timing["cycles"] - 1 > 3, device.stats
    assert timing["submissions"] == timing["readbacks"] == timing["cycles"], timing
    assert timing["drafted_on_device"] >= timing["cycles"] - 1, timing
    assert max(device.stats["schedule"]["k_histogram"]) == 3   # the walk's depth: 2,2,1's
    host = _generate(_engine(tiny, "close", device_trees=False), tiny, **opts)
    assert host.tokens == want
    assert host.stats["backend_timing"]["readbacks"] > host.stats["backend_timing"]["cycles"]
    if temperature == 0:
        trees = [_trees(tiny, monkeypatch, device_trees=on) for on in (True, False)]
        assert trees[0] == trees[1] and len(trees[0]) > 3


def _trees(tiny, monkeypatch, **paths) -> list:
    """Every tree cycle's tree (depth-first) of a greedy 2,2,1 request with the draft model, as
    its pass carried it (the champion's token list and Step, read after the cycle). Each
    cycle's `chain` (the device walk's tests of the first branch, tree_walk.wgsl) must be what
    rules/tree.first_branch says of that tree and its accepted path; some walk must have left
    the first branch for a sibling, and some first branch must have had a draft rejected (the
    cases where the first branch's tests differ from the path's)."""
    from pyspec.gpu.backend import GPUBackend
    from pyspec.rules.tree import depth_first_order, first_branch, reorder

    seen, commit, told = [], GPUBackend.commit, []

    def spy(backend, outcome, drafter):
        if outcome.rows is not None:
            rows = 1 + outcome.nodes
            readback = backend.dev.stage(backend.champion.tokens, 4 * rows)
            backend.dev.submit([readback.copy])
            tokens = np.frombuffer(backend.dev.redeem_now(readback), np.uint32)
            table = backend.champion.steps._host[0, 12:12 + rows]
            parents = [int(w >> 16) - 1 for w in table[1:]]   # entry 0 (the root): ROOT
            order = depth_first_order(parents)
            seen.append(reorder(tokens[1:], parents, order))
            path = [order.index(r - outcome.rows[0] - 1) for r in outcome.rows[1:]]
            assert outcome.chain == first_branch(seen[-1], path), (seen[-1], path)
            told.append((outcome.verdict.n_accepted > outcome.chain[1],
                         outcome.chain[0] > outcome.chain[1]))
        commit(backend, outcome, drafter)

    monkeypatch.setattr(GPUBackend, "commit", spy)
    _generate(_engine(tiny, "close", **paths), tiny, tree="2,2,1")
    monkeypatch.undo()
    assert all(map(any, zip(*told))), told
    return seen


def test_a_fixed_tree_layout_is_the_host_growths():
    """treedraft.layout: grow_model_tree's shape for fixed widths, its caps included."""
    from pyspec.gpu.treedraft import layout

    full = layout((2, 2, 1), 3, 15, 100)
    assert full.parents == (ROOT, ROOT, 0, 0, 1, 1, 2, 3, 4, 5) and full.levels == (2, 4, 4)
    assert layout((2, 2, 1), 2, 15, 100).levels == (2, 4)            # the cycle's depth
    assert layout((2, 2, 1), 3, 5, 100).levels == (2, 3)             # the pass's rows
    assert layout((2, 2, 1), 3, 15, 3).levels == (2, 4)              # the draft's cache
    assert layout((3,), 4, 15, 100).levels == (3,)


def test_an_adapter_that_reads_back_later_takes_a_draft_models_device_trees(tiny, monkeypatch):
    """The page's adapter reads back only asynchronously: a draft model's fixed-width trees
    under greedy and replay grow on the device there and equal champion-only; `auto` and
    rejection trees, which grow a depth a pass read back at once, are refused by name."""
    from pyspec.errors import TreeUnsupportedError

    engine = _engine(tiny, "close")
    dev = engine.backend.dev
    monkeypatch.setattr(dev, "reads_now", False)
    monkeypatch.setattr(dev, "redeem_now", lambda readback: pytest.fail("read back at once"))
    assert _generate(engine, tiny, tree="2,2,1").tokens == _greedy(tiny)
    for opts in (dict(tree="auto"), dict(tree="2,1", temperature=1.0, verify="rejection")):
        with pytest.raises(TreeUnsupportedError, match="fixed widths"):
            _generate(engine, tiny, 4, **opts)


@pytest.mark.parametrize("shape", ["2,2,1", "auto"])
def test_ngram_trees_go_ahead_as_its_chains_do(tiny, shape):
    """n-gram's trees under greedy and replay are looked up on the device (ngram.wgsl's
    advance_tree) and walked there (tree_walk.wgsl), so a tree cycle needs nothing from the
    host and is submitted while the one before is in flight: the output is champion-only's, the
    trees are the host's (device_ngram=False: the same drafts accepted by position), and no
    tree is drafted on the host."""
    engine = _engine(tiny, "ngram")
    ahead = _generate(engine, tiny, 40, tree=shape)
    timing = ahead.stats["backend_timing"]
    assert ahead.tokens == _greedy(tiny, 40)
    assert ahead.stats["schedule"]["trees"] > 5 and timing["drafted_on_host"] == 0, ahead.stats
    assert timing["ahead"] > 5 and timing["readbacks"] == timing["cycles"], timing
    host = _generate(_engine(tiny, "ngram", device_ngram=False), tiny, 40, tree=shape)
    assert host.tokens == ahead.tokens and host.stats["backend_timing"]["ahead"] == 0
    assert ahead.stats["accepted_by_position"] == host.stats["accepted_by_position"]
    assert ahead.stats["schedule"]["k_histogram"] == host.stats["schedule"]["k_histogram"]


@pytest.mark.parametrize("draft, path", [("ngram", "device_ngram"), ("close", "draft_ahead")])
@pytest.mark.parametrize("end", ["max_tokens", "end_token", "stop_string", "cancel", "sampled"])
def test_a_request_of_trees_gone_ahead_ends_where_one_read_cycle_by_cycle_does(tiny, end, draft,
                                                                                path):
    """A request of trees going ahead (n-gram's, a draft model's fed on the device) that ends
    mid-pipeline (its last cycle submitted, never read: dropped with its moves and its feed's
    record) ends where the same request drafted on the host does, and leaves the caches so that
    the next turn reuses them and goes on exactly."""
    from test_pipelined import ends, run

    from pyspec.options import Options

    reference = _greedy(tiny, 40)
    opts, cancel_after = ends(tiny, reference)[end]
    opts = dataclasses.replace(opts, k="fixed:3", tree="2,2,1")
    results = {}
    for on_device in (True, False):
        engine = _engine(tiny, draft, **{path: on_device})
        report, _ = run(engine, tiny.prompt, opts, cancel_after)
        assert (report["stats"]["backend_timing"]["ahead"] > 0) == on_device
        follow = tiny.prompt + report["tokens"]
        assert engine.backend.kv.pending == 0 and engine.reusable(follow) == len(follow) - 1
        more = engine.generate(follow, Options(max_tokens=9, stop_at_eos=False, k="fixed:3",
                                               tree="2,2,1"))
        results[on_device] = (report["tokens"], report["finish_reason"], more.tokens)
    assert results[True] == results[False]
    if end != "sampled":
        assert results[True][0] == reference[:len(results[True][0])]


@pytest.mark.parametrize("shape, draft, temperature", [
    ("2,2,1", "close", 0.0), ("2,2,1", "champion", 0.8), ("2,2,1", "far", 0.0),
    ("3,1", "close", 0.8), ("3,1", "champion", 0.0), ("3,1", "far", 0.8)])
def test_a_draft_models_trees_go_ahead_as_its_chains_do(tiny, shape, draft, temperature,
                                                        monkeypatch):
    """A draft model's fixed-width trees fed on the device (gpu/ahead.py, sources.FedTree):
    every tree cycle but the first is submitted while the one before is in flight, its first
    pass fed the D + 1 tokens after the root of the tree before from the walk's words, and
    writes nothing from the host. The output is champion-only's (greedy, and replay for the
    seed) and that of the same trees read cycle by cycle (draft_ahead=False), for drafts whose
    trees are accepted whole (the champion itself), mostly (close) and never (far); the draft's
    kept cache rows are those of the tokens fed as a chain. A draft's first request builds its
    plans as they are first used (their uniforms written once), so the engine serves one
    request first."""
    from conftest import reference_decode
    from test_pipelined import watch

    from pyspec.rules import rng, verify

    seed = 5

    def pick(logits, position):
        return (int(np.argmax(logits)) if temperature == 0 else verify.sample_replay(
            logits, temperature, rng.gumbel(seed, position, len(logits))))

    spec = {"champion": tiny.champion_path, "far": tiny.far_path}.get(draft, draft)
    opts = dict(tree=shape, temperature=temperature, seed=seed)
    engine = _engine(tiny, spec, draft_ahead=True)
    _generate(engine, tiny, 40, **opts)   # builds the plans (their uniforms) as first used
    seen = watch(engine, monkeypatch)
    ahead = _generate(engine, tiny, 40, **opts)
    timing, trees = ahead.stats["backend_timing"], ahead.stats["schedule"]["trees"]
    assert ahead.tokens == reference_decode(tiny.champion, tiny.prompt, 40, pick)
    assert trees >= timing["cycles"] - 1 > 8, ahead.stats
    assert timing["ahead"] >= timing["cycles"] - 2 and timing["drafted_on_host"] == 0, timing
    assert timing["submissions"] == timing["readbacks"] == timing["cycles"], timing
    gone = [c for c in seen if c.ahead]
    assert sum(c.tree for c in gone) >= len(gone) - 1, seen
    assert all(c.writes == 0 for c in gone), [(i, c) for i, c in enumerate(seen) if c.writes]
    read = _engine(tiny, spec, draft_ahead=False)
    host = _generate(read, tiny, 40, **opts)
    assert host.tokens == ahead.tokens and host.stats["backend_timing"]["ahead"] == 0
    # The draft's kept rows are those of the same tokens fed as a chain (its rows after each
    # tree's root fed again, D + 1 of them: a wrong m keeps a tree's row, the output still
    # exact but the drafts not)
    models = [e.backend.drafter.model for e in (engine, read)]
    kept = min(model.kv.committed for model in models)
    rows = [asyncio.run(model.read_kv(kept)) for model in models]
    assert kept > len(tiny.prompt) + 30
    assert all(np.array_equal(a, h) for a, h in zip(*rows))
    # accepted alike but near the budget's end, where a tree gone ahead is cut for the most
    # tokens the cycle in flight may emit, one read first for the tokens it did
    accepted = ahead.stats["accepted_by_position"]
    assert all(abs(a - h) <= 1 for a, h in zip(accepted, host.stats["accepted_by_position"]))
    depth = len(shape.split(","))
    if draft == "champion":   # every tree accepted whole, but one the budget cut at the end
        assert accepted[depth - 1] >= trees - 1, accepted
    if draft == "far":
        assert sum(accepted) <= 2, accepted
