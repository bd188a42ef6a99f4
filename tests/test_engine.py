"""End to end on tiny random GGUF models: the speculative loop is exact for every drafter, on
the CPU backend and on the GPU backend (native WebGPU; lavapipe on CI).

Oracles: `reference_decode` in conftest.py (a plain champion-only loop that shares no code with
engine.py beyond the model forward), and, for rejection sampling, the champion's exact two-token
distribution computed by enumeration.
"""

from __future__ import annotations

import asyncio
import hashlib
import os

import numpy as np
import pytest

from conftest import greedy_pick, reference_decode, requires_gpu
from pyspec import schedule
from pyspec.cpu.model import Model
from pyspec.drafters import Proposal
from pyspec.engine import Engine
from pyspec.errors import OptionsError, PromptTooLongError
from pyspec.load import backend as backend_for
from pyspec.options import Options
from pyspec.rules import rng, verify

DRAFTS = ["none", "ngram", "self:1", "close", "far"]


def engine_for(tiny, draft, backend: str = "cpu", **kw) -> Engine:
    spec = {"close": tiny.close_path, "far": tiny.far_path,
            "ngram+close": "ngram+" + tiny.close_path}.get(draft, draft)
    return Engine(backend_for(tiny.on(backend), spec, load_draft=Model.load, **kw),
                  tiny.tokenizer)


@pytest.fixture(scope="module")
def greedy_reference(tiny):
    return reference_decode(tiny.champion, tiny.prompt, 40, greedy_pick)


@requires_gpu
def test_gpu_champion_only_equals_the_cpu_reference(tiny, greedy_reference):
    """On the tiny model the GPU's champion-only greedy output is the CPU reference's (its top-2
    margins are far above float32 noise), so every GPU test below is also judged against it."""
    r = engine_for(tiny, "none", "gpu").generate(tiny.prompt, Options(max_tokens=40,
                                                                      stop_at_eos=False))
    assert r.tokens == greedy_reference
    assert r.stats["adapter"] != "cpu-numpy"


@pytest.mark.parametrize("draft", DRAFTS)
def test_greedy_equals_champion_only_for_every_k(tiny, greedy_reference, draft, backend):
    engine = engine_for(tiny, draft, backend)
    for k in range(0, 9):
        r = engine.generate(tiny.prompt, Options(max_tokens=40, k=f"fixed:{k}",
                                                 stop_at_eos=False))
        assert r.tokens == greedy_reference, f"draft {draft}, K={k}"
        assert r.stats["champion_passes"] <= 40
        if k == 0 or draft == "none":
            assert r.stats["drafted"] == 0 and r.stats["champion_passes"] == 40
        else:
            assert r.stats["schedule"]["k_histogram"].get(0, 0) < 40
    for policy in ("heuristic", "confidence:0.3"):
        r = engine.generate(tiny.prompt, Options(max_tokens=40, k=policy, stop_at_eos=False))
        assert r.tokens == greedy_reference, f"draft {draft}, {policy}"


def test_previews_are_scored_against_the_tokens_that_follow():
    """request.score_previews: a preview is scored once the tokens decide it (a disagreement, or
    all of its drafts reached), with how many leading drafts agree; the rest wait."""
    from pyspec.request import score_previews
    seen = []

    class Sched:
        def shadow(self, k, n, cls):
            seen.append((k, n, cls))

    tokens = [1, 2, 3, 4]
    waiting = score_previews([(2, [3, 9], 1), (2, [3, 4, 5], 4), (4, [], 0), (3, [4], None)],
                              tokens, Sched())
    assert seen == [(2, 1, 1), (0, 0, 0), (1, 1, None)] and waiting == [(2, [3, 4, 5], 4)]
    assert score_previews(waiting, tokens + [5], Sched()) == [] and seen[-1] == (3, 3, 4)


def test_a_guarded_ngram_request_learns_from_previews(tiny, greedy_reference, backend):
    """With a guarded policy the n-gram drafter is previewed at champion-only cycles (it is free
    to ask), and the output stays the champion's."""
    engine = engine_for(tiny, "ngram", backend)
    for _ in range(2):
        r = engine.generate(tiny.prompt, Options(max_tokens=40, k="heuristic",
                                                 stop_at_eos=False))
        assert r.tokens == greedy_reference
        sched = r.stats["schedule"]
        assert sched["previews"] > 0 and sched["probes"] == 0, sched
        assert sched["previews"] <= sched["k_histogram"].get(0, 0)


def test_drafts_are_actually_accepted(tiny, backend):
    """The exactness tests above mean something only if drafts get accepted and rejected."""
    engine = engine_for(tiny, "close", backend)
    engine.generate(tiny.prompt, Options(max_tokens=10, k="fixed:4", stop_at_eos=False))
    r = engine.generate(tiny.prompt, Options(max_tokens=40, k="fixed:4", stop_at_eos=False))
    # draft calls are counted per request: a cycle makes at most k = 4 draft forwards
    assert 0 < r.stats["draft_calls"] <= 4 * r.stats["champion_passes"]
    assert 0.3 < r.stats["acceptance_rate"] < 1.0, r.stats
    assert r.stats["champion_passes"] < 30


def replay_reference(tiny, temperature: float, seed: int, n: int = 30) -> list[int]:
    """Champion-only replay sampling written plainly (conftest.reference_decode): at each
    position the Gumbel-max sample with the noise rng.py keys by (seed, position)."""
    def pick(logits, position):
        return verify.sample_replay(logits, temperature, rng.gumbel(seed, position, len(logits)))

    return reference_decode(tiny.champion, tiny.prompt, n, pick)


@pytest.mark.parametrize("temperature", [0.6, 1.0])
def test_replay_equals_champion_only_sampling(tiny, temperature, backend):
    seed = 1234
    expected = replay_reference(tiny, temperature, seed)
    if backend == "gpu":  # champion-only replay on the GPU is the reference there
        gpu_alone = engine_for(tiny, "none", "gpu").generate(
            tiny.prompt, Options(max_tokens=30, temperature=temperature, seed=seed,
                                 stop_at_eos=False)).tokens
        # and it is the plain loop's on this model (its Gumbel keys and positions too)
        assert gpu_alone == expected
        expected = gpu_alone
    for draft in DRAFTS:
        engine = engine_for(tiny, draft, backend)
        for k in range(1, 7):
            r = engine.generate(tiny.prompt, Options(max_tokens=30, temperature=temperature,
                                                     seed=seed, k=f"fixed:{k}",
                                                     stop_at_eos=False))
            assert r.tokens == expected, f"draft {draft}, K={k}, T={temperature}"
    other = engine_for(tiny, "none", backend).generate(
        tiny.prompt, Options(max_tokens=30, temperature=temperature, seed=seed + 1,
                             stop_at_eos=False))
    assert other.tokens != expected, "a different seed must give a different sample"


# --- rejection sampling: distribution of the next two tokens ---------------------------------
N_RUNS = 10_000
PREFIX_TEMPERATURE = 1.0


def seed_block(runs: int, part: int = 0) -> range:
    """The seeds of one distribution test: `runs` consecutive seeds from a base of the test's own
    (its pytest node id hashed; `part` numbers the blocks of a test that samples twice), so no
    two tests share their uniforms and a block's luck is a test's alone. Until 2026-12-04 every
    test drew seeds 0..9,999: an exact inverse-CDF sampler scores the joint TV of the prefix
    "the cat. the cat. the" on them at 0.0685, the null's 0.9996 quantile (3.4 standard
    deviations above its median; blocks 10,000 on score -1.5 to +0.6), so all the tests sat
    near their bounds together. Each check's stated bound stays the 99.9th percentile of the
    null; a test's several checks make its chance of failing an exact sampler at most 0.6%."""
    node = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    digest = hashlib.sha256(f"{node}#{part}".encode()).digest()
    base = int.from_bytes(digest[:5], "big") << 20        # < 2^60; blocks of 2^20 seeds apart
    return range(base, base + runs)


def exact_two_token_distribution(model: Model, prefix: list[int], temperature: float):
    """P(t1, t2 | prefix) = p(t1 | prefix) p(t2 | prefix, t1), by enumeration over t1."""
    kv = model.new_cache()
    p1 = verify.softmax(model.forward(prefix, kv)[-1], temperature)
    kv.commit(len(prefix))
    joint = np.zeros((len(p1), len(p1)))
    for t1 in range(len(p1)):
        kv.rollback()
        joint[t1] = p1[t1] * verify.softmax(model.forward([t1], kv)[-1], temperature)
    return joint


def total_variation(counts: np.ndarray, probs: np.ndarray) -> float:
    return 0.5 * np.abs(counts / counts.sum() - probs).sum()


def null_tv_quantile(probs: np.ndarray, n: int, q: float, trials: int = 2000) -> float:
    """The q-quantile of TV(empirical of n exact draws, probs): what sampling noise alone gives.
    2,000 trials put the 99.9th percentile between the second and third largest simulated TV;
    400 made it the largest of them, a bound that moved with the simulation's own noise."""
    gen = np.random.default_rng(0)
    flat = probs.reshape(-1)
    tvs = [total_variation(gen.multinomial(n, flat).astype(float), flat) for _ in range(trials)]
    return float(np.quantile(tvs, q))


def ngram_friendly_prefix(model: Model, tokenizer) -> list[int]:
    """A prefix `A u v B u v` whose n-gram proposal (B, what followed u v before: a two-token
    match drafts up to three) starts with a token of champion probability in [0.2, 0.8], so
    one-hot drafts are both accepted and rejected often."""
    gen = np.random.default_rng(5)
    base = tokenizer.encode("the cat. the")
    for _ in range(500):
        u, v, b0, b1 = (int(t) for t in gen.integers(3, model.config.vocab_size, 4))
        prefix = base + [u, v, b0, b1, u, v]
        kv = model.new_cache()
        p = verify.softmax(model.forward(prefix, kv)[-1], PREFIX_TEMPERATURE)
        if 0.2 <= p[b0] <= 0.8:
            return prefix
    raise AssertionError("no n-gram friendly prefix found")


@pytest.mark.parametrize("backend,draft,k,temperature", [
    ("cpu", "close", "fixed:2", 1.0), ("cpu", "close", "fixed:2", 0.6),
    ("cpu", "close", "fixed:2", 1.3), ("cpu", "close", "fixed:1", 1.0),
    ("cpu", "ngram", "fixed:2", 1.0), ("cpu", "ngram", "fixed:2", 0.6),
    ("cpu", "self:1", "confidence:0.5", 1.0), ("cpu", "ngram+close", "fixed:2", 1.0),
    ("fastcpu", "close", "fixed:2", 1.0), ("fastcpu", "close", "fixed:1", 0.6),
    ("gpu", "ngram", "fixed:1", 1.0)])
# On the GPU (the draft's samples, its q_draft rows, the residual and the bonus all kernels) the
# same test runs with a draft model of the trained draft's shape: tests/test_draft_architecture.py;
# here the device's n-gram lookup (one-hot drafts, FLAG_ONE_HOT: q is not read) with the per-row
# kernels split as on a real GPU, at K = 1, so the bonus is measured.
def test_rejection_matches_champion_distribution(tiny, backend, draft, k, temperature,
                                                 monkeypatch, request):
    """The first two emitted tokens over 10,000 seeded runs (max_tokens=3, so a cycle may draft
    2 tokens and reach the residual after an accepted draft, or the bonus after two; at fixed:1
    the second token is the bonus whenever the one draft is accepted), at temperatures below,
    at and above 1 (the request's temperature reaches the verdict, not only the draft).

    Stated bounds (assert_two_token_distribution): the TV of the joint, of the first token, of
    the second token's marginal and of the second token given each of the three likeliest first
    tokens, each below the 99.9th percentile of the TV that as many exact draws give (2,000
    simulated trials). Teeth: the draft's own distribution is further than the bound."""
    # The confidence stop is under test, not the break-even guard: on a busy machine the guard's
    # timings can switch drafting off for the whole run, leaving nothing to check.
    monkeypatch.setattr(schedule.Confidence, "guarded", False)
    paths = {}
    if backend == "gpu":
        request.getfixturevalue("gpu")
        paths = dict(split_rows=True)
    # Short, so that 10,000 runs stay fast.
    prefix = (ngram_friendly_prefix(tiny.champion, tiny.tokenizer) if draft == "ngram"
              else tiny.tokenizer.encode("the cat. the cat. the"))
    exact, bound = assert_two_token_distribution(
        engine_for(tiny, draft, backend, **paths), tiny.champion, prefix, k,
        # guarded policies spend the first cycle measuring k = 0
        two_drafts=k == "fixed:2", temperature=temperature,
        # (The combination ran 30,000 runs while every test drew seeds 0..9,999, where its joint
        # TV read 0.0696 against a bound of 0.0684 and an exact sampler's 0.0685; at 30,000:
        # 0.0399, the null median 0.0377. Each test now has its own block: see seed_block.)
        runs=N_RUNS)
    if draft == "close":  # teeth: sampling from the draft instead would fail the same bound
        draft_model = Model.load(tiny.close_path)
        assert 0.5 * np.abs(exact_two_token_distribution(draft_model, prefix, temperature)
                            - exact).sum() > bound
    if temperature != 1.0:   # teeth: the champion at temperature 1 would fail it too
        assert 0.5 * np.abs(exact_two_token_distribution(tiny.champion, prefix, 1.0)
                            - exact).sum() > bound


def _exact_after(model: Model, tokens: list[int], temperature: float) -> np.ndarray:
    """p(next | tokens) at `temperature`, one pass from an empty cache."""
    return verify.softmax(model.forward(tokens, model.new_cache(), last_only=True)[0],
                          temperature)


# The test below's prompt: "the cat. the cat. the" and two tokens found by a search over random
# ones (tiny model, T = 1) for a likely first pair: 89.4% of runs begin with the likeliest pair,
# so 11,500 runs give about 10,280 samples of the third and fourth tokens (the floor of 10,000
# is 8 standard deviations under that), where "the cat. the cat. the" alone (55%) took 19,000;
# the draft's joint at positions 3 and 4 stays 0.33 from the champion's (the test asserts it
# is further than the bound).
PROMPT_3_4 = ("the cat. the cat. the", [145, 34])
RUNS_3_4 = 11_500


@pytest.mark.parametrize("backend", ["cpu", "fastcpu", "gpu"])
def test_rejection_at_draft_positions_three_and_four(tiny, backend, monkeypatch, request):
    """The two-token tests judge the first two drafts of a block; this one the third and the
    fourth. 11,500 seeded requests at fixed:4 (max_tokens=5: the first cycle drafts positions
    1-4), T = 1. Among the runs whose first two tokens are the likeliest pair (t1*, t2*), at
    least 10,000, the tokens at positions 3 and 4 against the champion's exact
    p(t3, t4 | prefix, t1*, t2*), as
    TV of the joint, of t3, and of t4 given the likeliest t3; each below the 99.9th percentile
    of the TV that as many exact draws give (check_two_token_counts). Some of those runs must
    have had a draft at position 4 accepted and some rejected. Teeth: the draft's own
    distribution at those positions is further than the bound. On the GPU with a real GPU's
    defaults (the draft fed on the device, the per-row kernels split over each row): there the
    draft's samples, its q rows and the accept kernel's tests at rows 3 and 4 are the device's."""
    monkeypatch.setattr(schedule.Confidence, "guarded", False)
    paths = {}
    if backend == "gpu":
        request.getfixturevalue("gpu")
        paths = dict(split_rows=True, draft_ahead=True)
    text, tail = PROMPT_3_4
    prefix = tiny.tokenizer.encode(text) + tail
    engine = engine_for(tiny, "close", backend, **paths)
    p1 = _exact_after(tiny.champion, prefix, 1.0)
    t1 = int(np.argmax(p1))
    t2 = int(np.argmax(_exact_after(tiny.champion, prefix + [t1], 1.0)))
    vocab = len(p1)

    def joint(model):
        first = _exact_after(model, prefix + [t1, t2], 1.0)
        out = np.zeros((vocab, vocab))
        for t3 in np.flatnonzero(first > 0):
            out[t3] = first[t3] * _exact_after(model, prefix + [t1, t2, int(t3)], 1.0)
        return out

    counts = np.zeros((vocab, vocab))
    fourth_accepted = fourth_drafted = 0
    for seed in seed_block(RUNS_3_4):
        r = engine.generate(prefix, Options(max_tokens=5, temperature=1.0, seed=seed,
                                            verify="rejection", k="fixed:4", stop_at_eos=False))
        if r.tokens[:2] != [t1, t2]:
            continue
        counts[r.tokens[2], r.tokens[3]] += 1
        fourth_drafted += r.stats["drafted_by_position"][3]
        fourth_accepted += r.stats["accepted_by_position"][3]
    assert counts.sum() >= N_RUNS, f"only {counts.sum():.0f} runs began with the likeliest pair"
    assert 0 < fourth_accepted < fourth_drafted, (fourth_accepted, fourth_drafted)
    exact = joint(tiny.champion)
    bound = check_two_token_counts(counts, exact, f"positions 3 and 4, {backend}")
    assert 0.5 * np.abs(joint(Model.load(tiny.close_path)) - exact).sum() > bound


# --- edge cases --------------------------------------------------------------------------------
class ScriptedDrafter:
    """Proposes the true greedy continuation, corrupted at chosen draft positions."""

    kind = name = "scripted"
    weight_bytes = kv_bytes = 0

    def __init__(self, truth: list[int], prompt_len: int, wrong_at=(), vocab=0, q_zero=False):
        self.truth, self.prompt_len, self.wrong_at = truth, prompt_len, set(wrong_at)
        self.vocab, self.q_zero, self.calls = vocab, q_zero, 0

    def reset(self, tokens):
        pass

    def confirm(self, n_accepted):
        pass

    def propose(self, tokens, k, rule):
        self.calls += 1
        start = len(tokens) - self.prompt_len
        out = list(self.truth[start:start + k])
        for i in self.wrong_at:
            if i < len(out):
                out[i] = (out[i] + 1) % self.vocab
        rows = [None] * len(out)
        if self.q_zero:  # claims q = 0 for the token it proposes (a buggy drafter)
            rows = [np.full(self.vocab, 1.0 / (self.vocab - 1)) for _ in out]
            for row, t in zip(rows, out):
                row[t] = 0.0
        return Proposal(out, rows)


def scripted(tiny, truth, backend="cpu", **kw):
    drafter = ScriptedDrafter(truth, len(tiny.prompt), vocab=tiny.tokenizer.vocab_size, **kw)
    return Engine(backend_for(tiny.on(backend), drafter), tiny.tokenizer)


def test_full_acceptance_gives_bonus_token(tiny, greedy_reference, backend):
    r = scripted(tiny, greedy_reference, backend).generate(
        tiny.prompt, Options(max_tokens=25, k="fixed:4", stop_at_eos=False))
    assert r.tokens == greedy_reference[:25]
    assert r.stats["champion_passes"] == 5            # 5 tokens per pass: 4 drafts + bonus
    assert r.stats["acceptance_rate"] == 1.0
    assert r.stats["accepted_by_position"][:4] == [5, 5, 5, 5]


@pytest.mark.parametrize("wrong_at,passes,accepted", [(0, 20, 0), (3, 5, 15)])
def test_rejection_at_first_and_last_position(tiny, greedy_reference, wrong_at, passes,
                                              accepted, backend):
    """K=4 with the draft wrong at position 0 (nothing accepted, one token per pass) or at
    position 3, the last (three accepted plus the correction: four tokens per pass)."""
    r = scripted(tiny, greedy_reference, backend, wrong_at=[wrong_at]).generate(
        tiny.prompt, Options(max_tokens=20, k="fixed:4", stop_at_eos=False))
    assert r.tokens == greedy_reference[:20]
    assert (r.stats["champion_passes"], r.stats["accepted"]) == (passes, accepted)
    assert r.stats["accepted_by_position"][wrong_at] == 0


def test_draft_token_with_q_zero_is_rejected(tiny, greedy_reference, backend):
    r = scripted(tiny, greedy_reference, backend, q_zero=True).generate(
        tiny.prompt, Options(max_tokens=10, temperature=1.0, verify="rejection", k="fixed:3",
                             stop_at_eos=False))
    assert r.stats["accepted"] == 0 and r.stats["drafted"] > 0
    assert len(r.tokens) == 10


def test_max_tokens_in_the_middle_of_a_block(tiny, greedy_reference, backend):
    """A fully accepting draft with K=4 and budgets that end inside a block: the engine drafts
    at most budget - 1 tokens, so the last block is shortened rather than cut."""
    for n in (1, 2, 3, 6, 7):
        r = scripted(tiny, greedy_reference, backend).generate(
            tiny.prompt, Options(max_tokens=n, k="fixed:4", stop_at_eos=False))
        assert r.tokens == greedy_reference[:n] and r.finish_reason == "length"


def test_eos_inside_the_proposals(tiny, greedy_reference, backend):
    """Make the greedy continuation's 6th token an end-of-generation token: the speculative run
    stops exactly where champion-only stops, even when the drafts run past it."""
    eos_at = next(i for i in range(5, 40) if greedy_reference[i] not in greedy_reference[:i])
    stop = (greedy_reference[eos_at],)
    base = engine_for(tiny, "none", backend).generate(tiny.prompt,
                                                      Options(max_tokens=40, stop_ids=stop))
    spec = scripted(tiny, greedy_reference, backend).generate(
        tiny.prompt, Options(max_tokens=40, k="fixed:8", stop_ids=stop))
    assert base.tokens == greedy_reference[:eos_at] and base.finish_reason == "stop"
    assert spec.tokens == base.tokens and spec.finish_reason == "stop"
    assert spec.text == base.text


def test_prompt_longer_than_context(tiny, backend):
    engine = engine_for(tiny, "ngram", backend, max_ctx=64)
    with pytest.raises(PromptTooLongError, match="context"):
        engine.generate(list(range(10, 80)), Options(max_tokens=4))


def test_generation_stops_at_the_context_end(tiny, backend):
    engine = engine_for(tiny, "ngram", backend, max_ctx=64)
    prompt = tiny.prompt[:60]
    r = engine.generate(prompt, Options(max_tokens=50, k="fixed:4", stop_at_eos=False))
    assert len(prompt) + len(r.tokens) <= 65 and r.finish_reason == "context"
    ref = reference_decode(tiny.champion, prompt, len(r.tokens), greedy_pick)
    assert r.tokens == ref


def test_bad_options_raise_clear_errors(tiny):
    engine = engine_for(tiny, "ngram")
    for bad in (Options(max_tokens=0), Options(temperature=-1), Options(verify="bogus"),
                Options(temperature=0.5, verify="greedy"), Options(seed=-3)):
        with pytest.raises(OptionsError):
            engine.generate(tiny.prompt, bad)
    with pytest.raises(ValueError, match="speculation policy"):
        engine.generate(tiny.prompt, Options(k="sometimes"))


def committed_rows(engine, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first n K and V rows of the champion's cache, from the host or the GPU."""
    if engine.kv.k is not None:
        return engine.kv.k[:, :n], engine.kv.v[:, :n]
    return asyncio.run(engine.champion.read_kv(n))


def test_kv_rows_match_a_fresh_champion_only_run(tiny, greedy_reference, backend):
    """After a run full of commits and rollbacks, the committed cache rows equal a fresh run's
    (on the GPU: a fresh prefill of the same tokens, in 16-row passes)."""
    for draft in ("close", "self:1", "ngram"):
        engine = engine_for(tiny, draft, backend)
        r = engine.generate(tiny.prompt, Options(max_tokens=30, k="heuristic",
                                                 stop_at_eos=False))
        seq = tiny.prompt + r.tokens
        n = engine.kv.committed
        assert n == len(seq) - 1
        k_rows, v_rows = (np.copy(a) for a in committed_rows(engine, n))
        if backend == "cpu":
            fresh = tiny.champion.new_cache()
            tiny.champion.forward(seq[:n], fresh)
            k_ref, v_ref = fresh.k[:, :n], fresh.v[:, :n]
        else:
            fresh = engine_for(tiny, "none", backend)
            asyncio.run(fresh.backend.prefill(seq[:n + 1]))
            k_ref, v_ref = committed_rows(fresh, n)
        assert np.array_equal(k_rows, k_ref), draft
        assert np.array_equal(v_rows, v_ref), draft


def test_streamed_text_is_the_decoded_output(tiny, backend):
    engine = engine_for(tiny, "ngram", backend)
    report, chunks = {}, []

    async def run():
        async for c in engine.stream(tiny.prompt, Options(max_tokens=30, stop_at_eos=False),
                                     report):
            chunks.append(c)

    asyncio.run(run())
    text = "".join(c.text for c in chunks)
    assert text == report["text"] == tiny.tokenizer.decode(report["tokens"])
    offsets = [c.offset for c in chunks]
    assert offsets == sorted(offsets) and offsets[0] == 0


def test_draft_with_a_shorter_context_only_stops_drafting(tiny, greedy_reference, tmp_path,
                                                          backend):
    """A draft whose context is shorter than the sequence stops proposing; the champion goes on."""
    from pyspec import testmodels
    path = str(tmp_path / "short.gguf")
    testmodels.write_model(path, seed=1, ctx=80)   # same weights as the champion, 80 positions
    # on a GPU, fed on the device where the adapter would (it is not: its context)
    engine = Engine(backend_for(tiny.on(backend), path, load_draft=Model.load,
                                draft_ahead=True), tiny.tokenizer)
    r = engine.generate(tiny.prompt, Options(max_tokens=40, k="fixed:3", stop_at_eos=False))
    assert r.tokens == greedy_reference
    assert 0 < r.stats["drafted"] < 30  # drafts until position 80, then none


def test_head_and_tokenizer_must_agree(tiny, tmp_path):
    from pyspec import testmodels
    from pyspec.cpu.model import ModelError
    from pyspec.text.tokenizer import Tokenizer
    path = str(tmp_path / "other.gguf")
    testmodels.write_model(path, tokenizer=testmodels.tokenizer_metadata(n_merges=40))
    with pytest.raises(ModelError, match="tokenizer"):
        Engine(backend_for(tiny.champion, "none"), Tokenizer.from_metadata(Model.load(path).metadata))


class FailingBackend:
    """Wraps a backend and raises a GPU fault at one cycle, as a lost device would."""

    def __init__(self, inner, fail_at: int, error):
        self.inner, self.fail_at, self.error, self.cycles = inner, fail_at, error, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def read(self, handle):
        self.cycles += 1
        if self.cycles == self.fail_at:
            raise self.error
        return await self.inner.read(handle)


@pytest.mark.parametrize("fail_at", [1, 4])
def test_a_gpu_fault_finishes_the_request_on_the_recovery_backend(tiny, greedy_reference,
                                                                     backend, fail_at):
    """A fault mid-request: the cycle in flight is dropped, the committed tokens are re-prefilled
    on the recovery backend (champion-only), and the text goes on without a repeat or a gap."""
    from pyspec.cpu.executor import CPUBackend
    from pyspec.gpu.device import DeviceLostError

    engine = engine_for(tiny, "ngram", backend)
    engine.backend = FailingBackend(engine.backend, fail_at, DeviceLostError("device lost"))
    engine.recover = lambda: CPUBackend(tiny.champion)
    report, chunks = {}, []

    async def run():
        async for c in engine.stream(tiny.prompt, Options(max_tokens=30, k="fixed:3",
                                                          stop_at_eos=False), report):
            chunks.append(c)

    asyncio.run(run())
    assert report["tokens"] == greedy_reference[:30]
    text = "".join(c.text for c in chunks)
    assert text == report["text"] == tiny.tokenizer.decode(report["tokens"])
    assert [c.offset for c in chunks] == [sum(len(c.text) for c in chunks[:i])
                                          for i in range(len(chunks))]
    assert report["receipt"]["faults"][0]["kind"] == "device_lost"
    assert report["stats"]["adapter"] == "cpu-numpy"
    # Without a recovery backend the fault reaches the caller.
    engine = engine_for(tiny, "ngram", backend)
    engine.backend = FailingBackend(engine.backend, 2, DeviceLostError("device lost"))
    with pytest.raises(DeviceLostError):
        engine.generate(tiny.prompt, Options(max_tokens=10))


def test_a_gpu_failing_again_and_again_stops_at_the_retry_limit_keeping_its_text(
        tiny, greedy_reference):
    """Each recovery backend fails again (a device lost three times in one request): the engine
    recovers MAX_RECOVERIES times, then stops with RecoveryLimitError (code
    gpu_unrecoverable); the chunks shown before it are a prefix of the undisturbed text."""
    from pyspec.cpu.executor import CPUBackend
    from pyspec.engine import MAX_RECOVERIES, RecoveryLimitError
    from pyspec.gpu.device import DeviceLostError

    engine = engine_for(tiny, "ngram", "cpu")
    engine.backend = FailingBackend(engine.backend, 3, DeviceLostError("device lost"))
    recoveries = []

    async def recover():   # an awaitable backend, as the page's new-device search gives
        recoveries.append(1)
        return FailingBackend(CPUBackend(tiny.champion), 3, DeviceLostError("again"))

    engine.recover = recover
    chunks = []

    async def run():
        async for c in engine.stream(tiny.prompt, Options(max_tokens=30, k="fixed:3",
                                                          stop_at_eos=False)):
            chunks.append(c)

    with pytest.raises(RecoveryLimitError) as e:
        asyncio.run(run())
    assert e.value.code == "gpu_unrecoverable" and "at most 2 times" in str(e.value)
    assert len(recoveries) == MAX_RECOVERIES == 2
    assert len(engine.faults) == MAX_RECOVERIES
    text = "".join(c.text for c in chunks)
    assert chunks and tiny.tokenizer.decode(greedy_reference[:30]).startswith(text)


def test_a_cancelled_request_shows_a_prefix_of_the_full_text(tiny, backend):
    """should_stop ends a request between cycles with its stats; its text is a prefix of the
    full request's text even when the cut falls inside a multi-byte character."""
    engine = engine_for(tiny, "ngram", backend)
    full = engine.generate(tiny.prompt, Options(max_tokens=40, k="fixed:3", stop_at_eos=False))
    for cycles in range(1, 8):
        report, seen = {}, []

        async def run():
            async for _ in engine.stream(tiny.prompt, Options(max_tokens=40, k="fixed:3",
                                                              stop_at_eos=False), report,
                                         should_stop=lambda: len(seen) >= cycles):
                seen.append(1)

        asyncio.run(run())
        assert report["finish_reason"] == "cancelled"
        assert full.text.startswith(report["text"]), cycles
        assert full.tokens[:len(report["tokens"])] == report["tokens"]
        assert report["stats"]["generated_tokens"] == len(report["tokens"]) < 40


def assert_two_token_distribution(engine, champion: Model, prefix: list[int], k: str,
                                  runs: int = N_RUNS, two_drafts: bool = True,
                                  temperature: float = PREFIX_TEMPERATURE):
    """The rejection-mode check every drafter gets: the first two tokens of `runs` seeded
    requests (sample_two_tokens) against the champion's exact joint at `temperature`, as TV
    of the joint, of the first token, of the second token's marginal, and of the second token
    given each of the three likeliest first tokens (the joint's sparse cells see little of the
    second token), each below the 99.9th percentile of the TV that as many exact draws give;
    drafts must be both accepted and rejected, and (two_drafts) some cycle must draft two.
    Returns (exact joint, joint bound) for the caller's teeth."""
    exact = exact_two_token_distribution(champion, prefix, temperature)
    counts, accepted, drafted, n_two = sample_two_tokens(
        engine, prefix, temperature, k, exact.shape[0], runs)
    bound = check_two_token_counts(counts, exact, f"{k}, T={temperature}")
    assert drafted > 0 and 0 < accepted < drafted, (accepted, drafted)
    if two_drafts:
        assert n_two > 0, "no cycle drafted two tokens: the bonus after K=2 went untested"
    return exact, bound


def check_two_token_counts(counts: np.ndarray, exact: np.ndarray, what: str = "") -> float:
    """Counts of the first two tokens (vocab, vocab) against the exact joint: the TV of the
    joint, of the first token, of the second token's marginal and of the second token given
    each of the three likeliest first tokens, each below the 99.9th percentile of the TV that
    as many exact draws give (a first token is conditioned on when 100 runs or more are expected
    to begin with it). Returns the joint's bound."""
    runs = int(counts.sum())
    bound = null_tv_quantile(exact, runs, 0.999)
    tv = total_variation(counts, exact)
    assert tv < bound, f"TV {tv:.4f} >= bound {bound:.4f} ({what})"
    parts = [("first token", counts.sum(axis=1), exact.sum(axis=1)),
             ("second token", counts.sum(axis=0), exact.sum(axis=0))]
    first = exact.sum(axis=1)
    for t1 in np.argsort(-first)[:3]:
        if first[t1] * runs >= 100:   # (filters may leave fewer likely first tokens than three)
            parts.append((f"second token after {t1}", counts[t1], exact[t1] / exact[t1].sum()))
    for part, seen, want in parts:
        n = int(seen.sum())
        assert n > 0, f"no run began with the likely token of {part}"
        part_tv, part_bound = total_variation(seen, want), null_tv_quantile(want, n, 0.999)
        # (a point mass, e.g. the one token a schema allows next, has bound 0: then TV 0 only)
        assert part_tv < part_bound or part_tv == 0, \
            f"{part}: TV {part_tv:.4f} >= {part_bound:.4f} ({n} runs, {what})"
    return bound


def sample_two_tokens(engine, prefix, temperature, k, vocab, runs=N_RUNS, **opts):
    """The first two tokens of `runs` seeded rejection-mode requests (max_tokens=3, so a cycle may
    draft 2 tokens and reach the residual after an accepted draft, or the bonus after two), with
    `opts` as further Options: counts (vocab, vocab), and the drafts accepted, drafted, and
    cycles that drafted two."""
    def one(seed):
        r = engine.generate(prefix, Options(max_tokens=3, temperature=temperature, seed=seed,
                                            verify="rejection", k=k, stop_at_eos=False, **opts))
        return (r.tokens[0], r.tokens[1], r.stats["accepted"], r.stats["drafted"],
                r.stats["drafted_by_position"][1] > 0)

    counts = np.zeros((vocab, vocab))
    accepted = drafted = two_drafts = 0
    for t0, t1, a, d, two in map(one, seed_block(runs)):
        counts[t0, t1] += 1
        accepted, drafted, two_drafts = accepted + a, drafted + d, two_drafts + two
    return counts, accepted, drafted, two_drafts
