"""The sampling controls (pyspec/rules/processors.py): their semantics on hand-made rows, and exactness
of speculative decoding under them on the tiny models: greedy and replay equal processed
champion-only decoding (a plain loop that applies the same processors row by row), and rejection
sampling follows the processed distribution.

Oracle: `processed_reference`, a champion-only loop sharing nothing with engine.py or cycle.py
beyond the model forward and the processors themselves.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_engine import (
    N_RUNS,
    check_two_token_counts,
    null_tv_quantile,
    sample_two_tokens,
    seed_block,
)

from conftest import requires_gpu
from pyspec.cpu.model import Model
from pyspec.engine import Engine
from pyspec.gpu.processors import KINDS
from pyspec.load import backend as backend_for
from pyspec.options import Options
from pyspec.rules import rng, verify
from pyspec.rules.processors import (
    N_CANDIDATES,
    Chain,
    Filters,
    Penalties,
    Sampling,
    SamplingError,
    keep_top_k,
    keep_top_p,
)

DRAFTS = ["ngram", "self:1", "close", "far"]

# Each control alone, and combinations (the temperature-only filters matter under sampling).
CONTROLS = {
    "logit_bias": dict(logit_bias={101: 5.0, 32: -100.0}),
    "repetition": dict(repetition_penalty=1.8),
    "presence": dict(presence_penalty=1.5),
    "frequency": dict(frequency_penalty=1.2),
    "top_k": dict(top_k=5),
    "top_p": dict(top_p=0.6),
    "min_p": dict(min_p=0.2),
    "all": dict(logit_bias={101: 2.0}, repetition_penalty=1.3, presence_penalty=0.5,
                frequency_penalty=0.4, top_k=20, top_p=0.8, min_p=0.05),
    "penalties+top_p": dict(repetition_penalty=1.5, frequency_penalty=0.7, top_p=0.7),
    "penalties": dict(logit_bias={101: 2.0, 65: -3.0}, repetition_penalty=1.4,
                      presence_penalty=0.6, frequency_penalty=0.5),
}


# --- semantics on hand-made rows ---------------------------------------------------------------
def test_penalties_follow_hf_and_openai():
    logits = np.array([[2.0, -1.0, 0.5, 3.0, -2.0]] * 2)       # (2, 5)
    before = logits.copy()
    prefix, drafts = [0, 1, 3, 3], [2]     # prompt [0, 1], output [3, 3]; row 1 adds draft 2
    p = Penalties(5, prompt_len=2, logit_bias={4: 1.0}, repetition_penalty=2.0,
                  presence_penalty=0.5, frequency_penalty=0.25)
    out = p.apply(logits, prefix, drafts)
    np.testing.assert_array_equal(logits, before)   # the input is not written
    # bias first (token 4: -2 + 1 = -1, unseen); repetition over 0, 1, 3 (positive / 2, negative
    # * 2); presence + 2 * frequency on 3 (the output's only token, twice)
    np.testing.assert_allclose(out[0], [1.0, -2.0, 0.5, 1.5 - 0.5 - 0.5, -1.0])
    # row 1's context has the draft 2 as an output token too
    np.testing.assert_allclose(out[1], [1.0, -2.0, 0.25 - 0.5 - 0.25, 1.5 - 0.5 - 0.5, -1.0])


def test_top_k_and_top_p_break_ties_by_the_lower_id():
    row = np.array([1.0, 3.0, 3.0, 0.0, 3.0])
    assert keep_top_k(row, 2).tolist() == [False, True, True, False, False]
    p = np.array([0.1, 0.3, 0.3, 0.0, 0.3])
    # mass in order (ids 1, 2, 4, 0): 0.3, 0.6, 0.9, 1.0; top_p = 0.6 keeps {1, 2} (>= 0.6)
    assert keep_top_p(p, 0.6).tolist() == [False, True, True, False, False]
    assert keep_top_p(p, 0.61).tolist() == [False, True, True, False, True]
    assert keep_top_p(p, 0.05).tolist() == [False, True, False, False, False]
    assert keep_top_p(p, 1.0).tolist() == [True, True, True, False, True]  # never p = 0


def test_top_k_equals_a_stable_sort():
    gen = np.random.default_rng(4)
    for vocab, k in ((50, 1), (50, 7), (3000, 40), (3000, 2999)):
        row = np.round(gen.normal(0, 2, vocab), 1)          # many ties
        row[gen.integers(0, vocab, 5)] = -np.inf
        want = np.zeros(vocab, bool)
        want[np.argsort(-row, kind="stable")[:k]] = True
        assert (keep_top_k(row, k) == want).all(), (vocab, k)


def test_top_p_shortcut_equals_the_full_sort():
    gen = np.random.default_rng(3)
    for scale in (0.5, 3.0, 8.0):
        logits = gen.normal(0, scale, 5 * N_CANDIDATES)
        logits[gen.integers(0, logits.size, 300)] = 1.0     # ties across the candidate floor
        p = verify.softmax(logits, 1.0)
        order = np.argsort(-p, kind="stable")
        for top_p in (0.1, 0.5, 0.9, 0.999, 0.9999999):
            full = np.zeros(p.size, bool)
            full[order[:np.flatnonzero(np.cumsum(p[order]) >= top_p)[0] + 1]] = True
            assert (keep_top_p(p, top_p) == full).all(), (scale, top_p)


def test_filters_at_temperature_keep_unscaled_logits_and_min_p():
    row = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    out = Filters(1.0, min_p=0.2).apply(row, [], [])            # keeps p >= 0.1
    assert np.isneginf(out[0, 3]) and (out[0, :3] == row[0, :3]).all()
    # at T = 2 the flattened probabilities all pass min_p = 0.2
    assert np.isfinite(Filters(2.0, min_p=0.2).apply(row, [], [])).all()
    assert np.isfinite(Filters(0.0, top_k=1).apply(row, [], [])).all()   # greedy: a no-op
    p = verify.softmax(Filters(1.0, top_k=2).apply(row, [], [])[0], 1.0)
    np.testing.assert_allclose(p, [0.625, 0.375, 0, 0])


def test_bad_controls_are_refused_by_name():
    for bad, name in [(dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
                      (dict(top_k=-1), "top_k"), (dict(top_k=2.5), "top_k"),
                      (dict(min_p=2), "min_p"), (dict(repetition_penalty=0), "repetition"),
                      (dict(presence_penalty=3), "presence"),
                      (dict(frequency_penalty=float("nan")), "frequency"),
                      (dict(logit_bias={"x": 1}), "logit_bias"),
                      (dict(logit_bias={5: 101}), "logit_bias"),
                      (dict(logit_bias={999: 1}), "logit_bias")]:
        with pytest.raises(SamplingError, match=name) as e:
            Sampling(**bad).check(vocab=300)
        assert e.value.code == "bad_config"
    Sampling(logit_bias={"5": 1.0}).check(vocab=300)    # JSON keys are strings (OpenAI)


# --- exactness on the tiny models ----------------------------------------------------------------
def engine_for(tiny, draft, backend="cpu", **paths) -> Engine:
    spec = {"close": tiny.close_path, "far": tiny.far_path}.get(draft, draft)
    return Engine(backend_for(tiny.on(backend), spec, load_draft=Model.load, **paths),
                  tiny.tokenizer)


def processed_reference(model, prompt, n, controls, temperature=0.0, seed=0):
    """Champion-only decoding with the processors, as plainly as possible: one pass per token,
    each row processed with the tokens before it."""
    chain = Chain(Sampling(**controls).chain(model.config.vocab_size, len(prompt), temperature))
    kv = model.new_cache()
    logits = model.forward(prompt, kv)[-1]
    kv.commit(len(prompt))
    tokens = list(prompt)
    for _ in range(n):
        row = chain.apply(logits[None, :], tokens, [])[0]
        if temperature == 0:
            token = int(np.argmax(row))
        else:
            token = verify.sample_replay(row, temperature,
                                         rng.gumbel(seed, len(tokens), len(row)))
        tokens.append(token)
        logits = model.forward([token], kv)[-1]
        kv.commit(1)
    return tokens[len(prompt):]


GREEDY_CONTROLS = ["logit_bias", "repetition", "presence", "frequency", "all", "penalties"]


# Both numpy engines: the reference (model.Model) and the one the CLI and the page run
# (fastcpu.FastModel), each against its own champion-only reference.
CPU_ENGINES = ["cpu", "fastcpu"]


@pytest.mark.parametrize("backend", CPU_ENGINES)
@pytest.mark.parametrize("name", GREEDY_CONTROLS)
def test_greedy_equals_processed_champion_only(tiny, name, backend):
    controls, champion = CONTROLS[name], tiny.on(backend)
    expected = processed_reference(champion, tiny.prompt, 30, controls)
    plain = processed_reference(champion, tiny.prompt, 30, {})
    assert expected != plain, f"{name} must change the greedy text to test anything"
    for draft in DRAFTS:
        engine = engine_for(tiny, draft, backend)
        for k in (1, 3, 6):
            r = engine.generate(tiny.prompt, Options(max_tokens=30, k=f"fixed:{k}",
                                                     stop_at_eos=False, **controls))
            assert r.tokens == expected, f"{name}, draft {draft}, K={k}"
    assert engine.generate(tiny.prompt, Options(max_tokens=30, stop_at_eos=False)).tokens == plain


@pytest.mark.parametrize("backend", CPU_ENGINES)
@pytest.mark.parametrize("name", list(CONTROLS))
def test_replay_equals_processed_champion_only(tiny, name, backend):
    controls, temperature, seed, champion = CONTROLS[name], 0.9, 77, tiny.on(backend)
    expected = processed_reference(champion, tiny.prompt, 24, controls, temperature, seed)
    plain = processed_reference(champion, tiny.prompt, 24, {}, temperature, seed)
    assert expected != plain, f"{name} must change the sampled text to test anything"
    for draft in DRAFTS:
        engine = engine_for(tiny, draft, backend)
        for k in (2, 5):
            r = engine.generate(tiny.prompt, Options(max_tokens=24, k=f"fixed:{k}",
                                                     temperature=temperature, seed=seed,
                                                     stop_at_eos=False, **controls))
            assert r.tokens == expected, f"{name}, draft {draft}, K={k}"


def processed_two_token_distribution(model, prefix, temperature, controls):
    """P(t1, t2 | prefix) under the processors, by enumeration over t1 (t1 is an output token:
    the output-only penalties apply to the second row)."""
    chain = Chain(Sampling(**controls).chain(model.config.vocab_size, len(prefix), temperature))
    kv = model.new_cache()
    p1 = verify.softmax(chain.apply(model.forward(prefix, kv)[-1:], prefix, []), temperature)[0]
    kv.commit(len(prefix))
    joint = np.zeros((len(p1), len(p1)))
    for t1 in np.flatnonzero(p1):
        kv.rollback()
        row = chain.apply(model.forward([int(t1)], kv)[-1:], prefix + [int(t1)], [])
        joint[t1] = p1[t1] * verify.softmax(row, temperature)[0]
    return joint


@pytest.mark.parametrize("backend", CPU_ENGINES)
def test_rejection_follows_the_processed_distribution(tiny, backend):
    """10,000 seeded runs of 3 tokens with top_p 0.8 + repetition 1.5 + frequency 1.0 and the
    close draft (which drafts from the processed distribution: its q rows are processed too):
    the first two tokens checked as every drafter's are (test_engine.check_two_token_counts:
    the joint, both marginals, the second token given each of the three likeliest first, each
    within the 99.9th percentile of the TV that as many exact draws give). Teeth: the
    unprocessed distribution lies
    further than three times the bound. (One drafter only, to keep it fast.)"""
    controls, temperature = dict(top_p=0.8, repetition_penalty=1.5, frequency_penalty=1.0), 1.0
    prefix, champion = tiny.tokenizer.encode("the cat. the cat. the"), tiny.on(backend)
    exact = processed_two_token_distribution(champion, prefix, temperature, controls)
    bound = null_tv_quantile(exact, N_RUNS, 0.999)
    plain = processed_two_token_distribution(champion, prefix, temperature, {})
    assert 0.5 * np.abs(plain - exact).sum() > 3 * bound
    engine = engine_for(tiny, "close", backend)
    counts, accepted, drafted, _ = sample_two_tokens(engine, prefix, temperature, "fixed:2",
                                                     exact.shape[0], **controls)
    check_two_token_counts(counts, exact, "processed, fixed:2")
    assert drafted > 0 and 0 < accepted < drafted, (accepted, drafted)


# --- the GPU executor: processors on the device, host accept as the fallback -------------------
GPU_DRAFTS = ["ngram", "self:1", "close"]


def on_device(tiny, draft: str) -> Engine:
    """Every control on the device, the filters too where the adapter is a software one."""
    return engine_for(tiny, draft, "gpu", device_processors=KINDS)


@requires_gpu
@pytest.mark.parametrize("name", ["all", "penalties+top_p", "logit_bias", "penalties"])
def test_gpu_equals_gpu_champion_only_under_processors(tiny, name):
    """GPU drafts (self:1, close: sampled on the device, raw distribution) and the n-gram draft
    under processors equal champion-only on the GPU with the same processors, greedy and replay;
    and champion-only on the GPU equals the CPU's processed reference (the tiny model's margins
    are far above float32 noise). Every control runs on the device (penalize.wgsl, filter.wgsl:
    no logits readback; the filters asked for on the device also on a software adapter, whose
    default for them is the host accept); the host accept (the rows read back, numpy's
    processors), which the backend falls back to, gives the same tokens, and so does the
    default (the filters on the host on a software adapter only). At T = 0 the filters are off
    (each keeps the argmax), so only the penalties are left."""
    controls = CONTROLS[name]
    for temperature, seed in ((0.0, 0), (0.9, 77)):
        opts = dict(max_tokens=24, temperature=temperature, seed=seed, stop_at_eos=False,
                    **controls)
        base = on_device(tiny, "none").generate(tiny.prompt, Options(**opts))
        assert base.tokens == processed_reference(tiny.champion, tiny.prompt, 24, controls,
                                                  temperature, seed)
        assert base.stats["backend_timing"]["readbacks"] == base.stats["champion_passes"]
        fallback = engine_for(tiny, "ngram", "gpu", device_processors=())   # host accept
        host = fallback.generate(tiny.prompt, Options(k="fixed:3", **opts))
        assert host.tokens == base.tokens and "host_accept_s" in host.stats["backend_timing"]
        auto = engine_for(tiny, "ngram", "gpu")   # the default: filters on the host on software
        r = auto.generate(tiny.prompt, Options(k="fixed:3", **opts))
        filtered = temperature > 0 and bool({"top_k", "top_p", "min_p"} & set(controls))
        assert r.tokens == base.tokens
        assert ("host_accept_s" in r.stats["backend_timing"]) == (
            filtered and auto.backend.dev.is_cpu)
        for draft in GPU_DRAFTS:
            engine = on_device(tiny, draft)
            # confidence:0.5: on GPU drafts the host applies the confidence stop
            for k in ("fixed:2", "fixed:5", "confidence:0.5"):
                r = engine.generate(tiny.prompt, Options(k=k, **opts))
                assert r.tokens == base.tokens, f"{name}, T={temperature}, {draft}, {k}"
                assert r.stats["backend_timing"]["readbacks"] == r.stats["champion_passes"]
                assert r.stats["drafted"] > 0 or k.startswith("confidence")
                assert "host_accept_s" not in r.stats["backend_timing"]


@requires_gpu
@pytest.mark.parametrize("name", ["penalties", "filters"])
def test_gpu_rejection_follows_the_processed_distribution(tiny, name):
    """As test_rejection_follows_the_processed_distribution, on the GPU with the self:1 draft
    sampled on the device, every control on the device: logit_bias and the penalties
    (penalize.wgsl with counts on the device), or top_k, top_p and min_p with a penalty (the
    filters set per request, then the accept kernel's residual and bonus samples). 10,000 runs,
    the same bound (TV of the joint under the 99.9th percentile of 10,000 exact draws); teeth:
    the unprocessed distribution is further; and no pair the controls rule out (probability 0)
    is ever emitted."""
    temperature, prefix = 1.0, tiny.tokenizer.encode("the cat. the cat. the")
    plain = processed_two_token_distribution(tiny.champion, prefix, temperature, {})
    controls = CONTROLS.get(name, {})
    if name == "penalties":   # penalties alone barely move this flat distribution: the bias
        top = [int(t) for t in np.argsort(-plain.sum(axis=1))[:3]]   # excludes its top tokens
        controls = {**controls, "logit_bias": {top[0]: -100.0, top[1]: -100.0, top[2]: 3.0}}
    if name == "filters":
        controls = dict(top_k=20, top_p=0.7, min_p=0.05, repetition_penalty=1.3)
    exact = processed_two_token_distribution(tiny.champion, prefix, temperature, controls)
    bound = null_tv_quantile(exact, N_RUNS, 0.999)
    assert 0.5 * np.abs(plain - exact).sum() > 3 * bound
    engine = on_device(tiny, "self:1")
    counts = np.zeros_like(exact)
    accepted = drafted = 0
    for seed in seed_block(N_RUNS):
        r = engine.generate(prefix, Options(max_tokens=3, temperature=temperature, seed=seed,
                                            verify="rejection", k="fixed:2", stop_at_eos=False,
                                            **controls))
        counts[r.tokens[0], r.tokens[1]] += 1
        accepted += r.stats["accepted"]
        drafted += r.stats["drafted"]
    check_two_token_counts(counts, exact, f"{name} on the GPU, fixed:2")
    assert counts[exact == 0].sum() == 0, "a pair the controls rule out was emitted"
    if name == "filters":
        assert (exact == 0).mean() > 0.5   # the filters leave out most pairs
    assert drafted > 0 and 0 < accepted < drafted, (accepted, drafted)
    assert "host_accept_s" not in r.stats["backend_timing"]
