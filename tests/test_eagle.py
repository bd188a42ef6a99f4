"""The EAGLE-style draft (drafters/eagle.py): a head over the champion's own states.

Exactness as for every drafter, on the tiny champion with a tiny random head of each trained
shape (testmodels.write_eagle_head: W_f, W_e, one layer, the champion's embedding, norm and head
shared; testmodels.write_fed_draft: a draft model's layers, embedding and norm with W_f, W_e in
front): greedy output equal to champion-only for every K and for the guarded policies,
replay identity for a seed, and the rejection-mode distribution of the first two tokens over
10,000 seeded runs (bounds as in tests/test_engine.py). Then the head's own contract: it reads the
champion's states (KVCache.keep_states) and keeps only rows fed with true states, and a head is
refused for a champion it was not trained on. train/check_eagle.py checks (with PyTorch) that
training computes what this drafter drafts.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_engine import N_RUNS, assert_two_token_distribution, replay_reference

from conftest import greedy_pick, reference_decode
from pyspec import testmodels
from pyspec.cpu.model import Model, ModelError
from pyspec.cycle import Rule
from pyspec.drafters import DraftSpecError
from pyspec.drafters.eagle import EagleDrafter
from pyspec.drafters.pairing import IncompatiblePairError
from pyspec.engine import Engine
from pyspec.load import backend as backend_for
from pyspec.load import load_draft_checked
from pyspec.options import Options

BACKENDS = ["cpu", "fastcpu"]


# "head": one layer over the champion's embedding, norm and head (train/eagle.py's first head);
# "fed": a draft model's layers, embedding and norm fed with the champion's states
# (train/eagle.py --init-draft), here tiny-close's two layers with W_f at 0.3 x noise.
ARCHITECTURES = ["head", "fed"]


@pytest.fixture(scope="module", params=ARCHITECTURES)
def head_path(request, tiny, tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("eagle") / f"{request.param}.gguf")
    if request.param == "head":
        testmodels.write_eagle_head(path, tiny.champion_path, noise=0.1, seed=3)
    else:
        testmodels.write_fed_draft(path, tiny.champion_path, tiny.close_path, feed=0.3,
                                   noise=0.05, seed=3)
    return path


def engine_for(tiny, head_path, backend="cpu") -> Engine:
    return Engine(backend_for(tiny.on(backend), head_path), tiny.tokenizer)


@pytest.fixture(scope="module")
def greedy_reference(tiny):
    return reference_decode(tiny.champion, tiny.prompt, 40, greedy_pick)


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_with_an_eagle_head_equals_champion_only(tiny, head_path, greedy_reference,
                                                        backend):
    engine = engine_for(tiny, head_path, backend)
    assert isinstance(engine.backend.drafter, EagleDrafter)
    drafted = accepted = 0
    for k in ("fixed:1", "fixed:2", "fixed:4", "fixed:7", "heuristic", "confidence:0.3"):
        r = engine.generate(tiny.prompt, Options(max_tokens=40, k=k, stop_at_eos=False))
        assert r.tokens == greedy_reference, k
        assert r.stats["drafter"].startswith("eagle:")
        drafted, accepted = drafted + r.stats["drafted"], accepted + r.stats["accepted"]
    assert drafted > 0 and 0 < accepted < drafted, (accepted, drafted)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature", [0.6, 1.0])
def test_replay_with_an_eagle_head_equals_champion_only_sampling(tiny, head_path, temperature,
                                                                 backend):
    seed = 1234
    expected = replay_reference(tiny, temperature, seed)
    engine = engine_for(tiny, head_path, backend)
    for k in range(1, 6):
        r = engine.generate(tiny.prompt, Options(max_tokens=30, temperature=temperature,
                                                 seed=seed, k=f"fixed:{k}", stop_at_eos=False))
        assert r.tokens == expected, f"K={k}, T={temperature}"
        assert r.stats["drafted"] > 0


# test_engine's N_RUNS, on the test's own seed block. This test ran 30,000 runs while every
# distribution test drew seeds 0..9,999: on them this head's TV landed at the null's 0.999
# quantile (0.0685 against 0.0684), as an exact inverse-CDF sampler's does on those seeds
# (0.0685: the block's luck, test_engine.seed_block); 30,000 runs gave 0.0392 against a null
# median of 0.0377, as a draft model of its own cache does (0.0375). Since each test has its own
# block, the 3x only cost time (two tests of 30,000 runs: 705 s of test time on the loaded VM).
RUNS = N_RUNS


def test_rejection_with_an_eagle_head_matches_the_champion(tiny, head_path):
    prefix = tiny.tokenizer.encode("the cat. the cat. the")
    assert_two_token_distribution(engine_for(tiny, head_path), tiny.champion, prefix, "fixed:2",
                                  runs=RUNS)


def test_the_head_reads_the_champions_states_and_keeps_only_true_rows(tiny, head_path):
    engine = engine_for(tiny, head_path)
    champion_kv, drafter = engine.backend.kv, engine.backend.drafter
    r = engine.generate(tiny.prompt, Options(max_tokens=20, k="fixed:3", stop_at_eos=False))
    n = champion_kv.committed
    # The states kept are the champion's final residual rows: a fresh pass over the same tokens
    # gives them again.
    fresh = tiny.champion.new_cache()
    fresh.keep_states(tiny.champion.config.d_model)
    tiny.champion.forward((tiny.prompt + r.tokens)[:n], fresh)
    np.testing.assert_allclose(champion_kv.states[:n], fresh.states[:n], rtol=1e-5, atol=1e-5)
    # The head's rows all came from true states: at most the rows the last cycle committed are
    # still to be fed, and no guess row is left behind.
    assert n - 1 - 4 <= drafter.kv.committed <= n and drafter.kv.pending == 0
    head = drafter.head
    if head.own_head:   # its draft's weights and the two input products
        draft = Model.load(tiny.close_path)
        assert drafter.weight_bytes == draft.weight_bytes + head.fc_feat.nbytes + \
            head.fc_embd.nbytes
    else:               # the embedding, norm and head are the champion's
        assert drafter.weight_bytes < tiny.champion.weight_bytes


def test_the_head_catches_up_apart_from_its_steps(tiny, head_path):
    """The prompt's rows, and the rows of cycles the head sat out (the guard had it off), are
    fed ahead of its steps and timed apart (catch_up_s, not the guard's time per draft token);
    after a cycle it drafted, the accepted rows and the champion's are its steady feed. The
    drafts and cache rows are those of a head fed the same rows in one pass."""
    champion, greedy = tiny.champion, Rule("greedy")
    head = load_draft_checked(champion)(head_path)
    ckv = champion.new_cache()
    d = EagleDrafter(head, ckv)
    seq = list(tiny.prompt) + [int(t) for t in np.random.default_rng(2).integers(3, 300, 12)]
    p = len(tiny.prompt)
    champion.forward(seq[:p - 1], ckv)
    ckv.commit(p - 1)
    d.reset(seq[:p])
    d.propose(seq[:p], 2, greedy)
    assert d.catch_up_s > 0.0                      # the prompt's rows
    d.confirm(1)                                   # a cycle it drafted, one accepted
    champion.forward(seq[p - 1:p + 1], ckv)
    ckv.commit(2)
    d.propose(seq[:p + 2], 2, greedy)
    assert d.catch_up_s == 0.0 and d.fed == 2      # the steady feed: accepted + 1
    d.confirm(0)                                   # a cycle it drafted, none accepted
    for i in range(6):                             # its champion row, then five cycles sat out
        champion.forward(seq[p + 1 + i:p + 2 + i], ckv)
        ckv.commit(1)
        if i:
            d.confirm(0)
    n = p + 8
    out = d.propose(seq[:n], 3, greedy)
    assert d.catch_up_s > 0.0 and d.fed == 6       # 5 caught up, 1 with the steps
    fresh = EagleDrafter(head, ckv)
    fresh.steady = n                               # everything in one pass
    again = fresh.propose(seq[:n], 3, greedy)
    assert fresh.catch_up_s == 0.0 and out.tokens == again.tokens
    d.confirm(len(out.tokens))
    fresh.confirm(len(again.tokens))
    assert d.kv.committed == fresh.kv.committed == n
    np.testing.assert_allclose(d.kv.k[:, :n], fresh.kv.k[:, :n], rtol=1e-4, atol=1e-4)


def test_a_one_token_prompt_drafts_from_row_zero(tiny, head_path):
    """Row 0 reads no state (zeros): a prompt of one token still drafts, and the tokens are
    champion-only's."""
    reference = reference_decode(tiny.champion, tiny.prompt[:1], 12, greedy_pick)
    r = engine_for(tiny, head_path).generate(tiny.prompt[:1], Options(max_tokens=12, k="fixed:3",
                                                                      stop_at_eos=False))
    assert r.tokens == reference and r.stats["drafted"] > 0


def test_a_fed_draft_that_reads_nothing_drafts_what_its_draft_drafts(tiny, tmp_path):
    """W_f = 0, W_e = I over a draft's own layers, embedding and norm (train/eagle.py
    --init-draft's starting point): every block drafted is the draft model's, so the counts of
    drafted and accepted tokens are the same; the champion's output either way."""
    path = str(tmp_path / "fed0.gguf")
    testmodels.write_fed_draft(path, tiny.champion_path, tiny.close_path)
    for k in ("fixed:1", "fixed:3", "fixed:5"):
        options = Options(max_tokens=40, k=k, stop_at_eos=False)
        fed = engine_for(tiny, path).generate(tiny.prompt, options)
        plain = Engine(backend_for(tiny.champion, tiny.close_path), tiny.tokenizer).generate(
            tiny.prompt, options)
        assert fed.tokens == plain.tokens
        assert (fed.stats["drafted"], fed.stats["accepted"]) == \
            (plain.stats["drafted"], plain.stats["accepted"]), k
        assert 0 < fed.stats["accepted"] < fed.stats["drafted"], k


def test_a_head_for_another_champion_is_refused(tiny, tmp_path):
    path = str(tmp_path / "other.gguf")
    testmodels.write_eagle_head(path, tiny.champion_path, champion_sha256="0" * 64)
    with pytest.raises(IncompatiblePairError, match="trained on the champion"):
        engine_for(tiny, path)
    narrow = str(tmp_path / "narrow.gguf")
    testmodels.write_eagle_head(narrow, tiny.far_path)   # another width (d = 32)
    with pytest.raises(IncompatiblePairError, match="d_model"):
        engine_for(tiny, narrow)


def test_an_incomplete_head_is_a_clear_error(tiny, tmp_path):
    from pyspec.formats import gguf, ggufwrite
    src = gguf.GGUFFile.open(tiny_head(tiny, tmp_path))
    tensors = {n: (src.dequantize(n), 0) for n in src.tensors if "fc_embd" not in n}
    path = str(tmp_path / "incomplete.gguf")
    ggufwrite.write(path, dict(src.metadata), tensors)
    with pytest.raises(ModelError, match="not a complete EAGLE-style head"):
        engine_for(tiny, path)


def tiny_head(tiny, tmp_path) -> str:
    path = str(tmp_path / "head.gguf")
    testmodels.write_eagle_head(path, tiny.champion_path)
    return path


def test_the_gpu_engine_says_it_cannot_run_a_head_yet(tiny, tmp_path, request):
    request.getfixturevalue("gpu")
    with pytest.raises(DraftSpecError, match="numpy"):
        engine_for(tiny, tiny_head(tiny, tmp_path), "gpu")


def test_check_pair_says_whether_a_head_serves_this_champion(tiny, tmp_path, capsys):
    from test_cli import run
    code, out, _ = run(capsys, "check-pair", "--champion", tiny.champion_path, "--draft",
                       tiny_head(tiny, tmp_path))
    assert code == 0 and "EAGLE-style head" in out, out
    other = str(tmp_path / "other.gguf")
    testmodels.write_eagle_head(other, tiny.champion_path, champion_sha256="0" * 64)
    code, out, _ = run(capsys, "check-pair", "--champion", tiny.champion_path, "--draft", other)
    assert code == 1 and "NOT compatible" in out and "trained on the champion" in out, out


def test_ngram_with_an_eagle_head_equals_champion_only_and_names_the_head(tiny, head_path,
                                                                         greedy_reference):
    """`ngram+HEAD`: n-gram where the context repeats, the head elsewhere; the output is the
    champion's, and the receipt names the head's weights."""
    from pyspec.formats.gguf import GGUFFile

    engine = engine_for(tiny, f"ngram+{head_path}")
    r = engine.generate(tiny.prompt, Options(max_tokens=40, k="fixed:2", stop_at_eos=False))
    assert r.tokens == greedy_reference
    assert r.stats["drafted"] > 0
    assert r.receipt["draft"]["kind"] == "combo"
    assert r.receipt["draft"]["sha256"] == GGUFFile.open(head_path).sha256()
    alone = engine_for(tiny, head_path).generate(tiny.prompt, Options(max_tokens=8))
    assert alone.receipt["draft"]["kind"] == "eagle"     # the head alone is named as well
    assert alone.receipt["draft"]["sha256"] == GGUFFile.open(head_path).sha256()
