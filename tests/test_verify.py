"""Tests for pyspec/rules/verify.py: exactness of the rejection rule in distribution (Monte Carlo with the
real pyspec.rules.rng uniforms), the deterministic rules' exact decisions, and the edge cases.

Statistical bounds: an empirical frequency f of a token with probability p over n draws must lie
within 4 standard errors, |f - p| <= 4 sqrt(p (1 - p) / n); a token with p = 0 must never appear.
The uniforms are keyed by fixed seeds, so every test is deterministic: it passes or fails the same
way on every run.
"""

from __future__ import annotations

import numpy as np
import pytest

from pyspec.rules import rng, verify
from pyspec.rules.verify import Verdict, VerifyInputError

SEED = 20240917


def _assert_follows(counts: np.ndarray, probs: np.ndarray, label: str) -> None:
    """counts (cells,) of n draws against probs (cells,): 4 standard errors, p == 0 never seen."""
    n = counts.sum()
    freq = counts / n
    se = np.sqrt(probs * (1 - probs) / n)
    assert np.all(counts[probs == 0] == 0), f"{label}: a p = 0 token was emitted: {counts}"
    worst = np.abs(freq - probs) - 4 * se
    assert np.all(worst <= 1e-12), f"{label}: freq {freq.round(5)} vs p {probs.round(5)}, n {n}"


# ---------------------------------------------------------------------------------------------
# Monte Carlo: rejection sampling emits the target distribution
# ---------------------------------------------------------------------------------------------
def _speculate_rows(p_rows: np.ndarray, q_rows: np.ndarray, start: np.ndarray, seed: int):
    """One rejection cycle for each of B trials, with the uniforms the engine would use.

    p_rows: (K+1, vocab) and q_rows: (K, vocab) are the same for every trial; start: (B,) the
    committed position of each trial (distinct, so every trial gets its own uniforms).
    Returns n_accepted (B,), tokens (B, K+1), drafts (B, K).
    """
    k, vocab = q_rows.shape
    batch = len(start)
    positions = start[:, None] + np.arange(k)[None, :]  # (B, K)
    drafts = np.empty((batch, k), dtype=np.int64)  # (B, K); q_rows do not depend on the prefix
    for i in range(k):
        u_draft = rng.uniforms(seed, positions[:, i], rng.STREAM_DRAFT, 0)  # (B,)
        drafts[:, i] = verify.sample_categorical_rows(np.broadcast_to(q_rows[i], (batch, vocab)),
                                                      u_draft)
    n_accepted, tokens = verify.verify_rejection_rows(
        np.broadcast_to(p_rows, (batch, k + 1, vocab)),
        np.broadcast_to(q_rows, (batch, k, vocab)),
        drafts,
        rng.uniforms(seed, positions, rng.STREAM_ACCEPT, 0),
        rng.uniforms(seed, positions, rng.STREAM_RESIDUAL, 0),
        rng.uniforms(seed, start + k, rng.STREAM_BONUS, 0),
    )
    return n_accepted, tokens, drafts


_GENERIC_P = np.array([0.30, 0.25, 0.20, 0.10, 0.10, 0.05])
_GENERIC_Q = np.array([0.10, 0.10, 0.20, 0.30, 0.20, 0.10])
_WOBBLE = np.array([1, -1, 2, -2, 1, -1]) * 1e-3
K1_CASES = {  # name: (p_target row 0, q_draft row 0), vocab 6
    "generic": (_GENERIC_P, _GENERIC_Q),
    "q has zeros": (_GENERIC_P, np.array([0.0, 0.0, 0.5, 0.5, 0.0, 0.0])),
    "p has zeros": (np.array([0.4, 0.0, 0.3, 0.0, 0.3, 0.0]), _GENERIC_Q),
    "p one-hot": (np.eye(6)[3], _GENERIC_Q),
    "q one-hot (n-gram drafter)": (_GENERIC_P, np.eye(6)[1]),
    "near-uniform": (np.full(6, 1 / 6) + _WOBBLE, np.full(6, 1 / 6) - _WOBBLE),
    "p equals q": (_GENERIC_P, _GENERIC_P),
}
K1_DRAWS = 200_000  # per case; 7 cases = 1.4 million draws


@pytest.mark.parametrize("case", list(K1_CASES))
def test_rejection_first_token_follows_p_target(case):
    p0, q0 = K1_CASES[case]
    p_rows = np.stack([p0, _GENERIC_P[::-1]])  # (2, 6): row 1 is the bonus row
    start = np.arange(K1_DRAWS) * 2  # each trial uses positions start, start + 1
    n_accepted, tokens, drafts = _speculate_rows(p_rows, q0[None, :], start, SEED)

    _assert_follows(np.bincount(tokens[:, 0], minlength=6), p0, f"{case}: first token")
    _assert_follows(np.bincount(drafts[:, 0], minlength=6), q0, f"{case}: drafts")
    # The rule must also accept as often as theory says, P(accept) = sum min(p, q): a rule that
    # always rejected and sampled p_target would pass the checks above and be useless.
    alpha = np.minimum(p0, q0).sum()
    accepted = np.bincount(n_accepted, minlength=2)
    _assert_follows(accepted[::-1], np.array([alpha, 1 - alpha]), f"{case}: acceptance")
    assert np.array_equal(tokens[n_accepted == 1, 0], drafts[n_accepted == 1, 0])


JOINT_DRAWS = 150_000  # per K


@pytest.mark.parametrize("k", [2, 3])
def test_rejection_first_two_tokens_follow_p_target_jointly(k):
    # Test simplification: the target rows depend on the position only, not on the emitted
    # prefix, so the exact joint of the first two tokens is outer(P[0], P[1]). The drafter's rows
    # likewise depend on the position only.
    vocab = 4
    gen = np.random.default_rng(k)
    p_by_position = gen.dirichlet(np.full(vocab, 0.7), size=k + 2)  # (K+2, vocab)
    q_by_position = gen.dirichlet(np.full(vocab, 0.7), size=k + 1)  # (K+1, vocab)
    p_by_position[0, 1] = 0.0  # a token the champion never emits first
    p_by_position[0] /= p_by_position[0].sum()
    q_by_position[0] = [0.5, 0.5, 0.0, 0.0]  # and one the drafter never proposes

    start = np.arange(JOINT_DRAWS) * 2 * (k + 1)  # each trial owns 2 (K+1) positions
    n_accepted, tokens, _ = _speculate_rows(p_by_position[: k + 1], q_by_position[:k], start, SEED)
    first, second = tokens[:, 0], tokens[:, 1].copy()  # (B,); second is -1 where n_accepted == 0
    # Trials that emitted one token go on with a second cycle at position 1, as the engine would.
    again = n_accepted == 0
    _, tokens2, _ = _speculate_rows(p_by_position[1 : k + 2], q_by_position[1 : k + 1],
                                    start[again] + 1, SEED)
    second[again] = tokens2[:, 0]

    joint = np.bincount(first * vocab + second, minlength=vocab * vocab)  # (vocab * vocab,)
    expected = np.outer(p_by_position[0], p_by_position[1]).ravel()
    _assert_follows(joint, expected, f"K={k}: joint of the first two tokens")
    assert 0.05 < again.mean() < 0.95  # both paths (one cycle, two cycles) are well exercised


# ---------------------------------------------------------------------------------------------
# The rule itself: exact decisions against the textbook loop, one cycle and batched
# ---------------------------------------------------------------------------------------------
def _textbook_rejection(p_target, q_draft, draft_tokens, u_accept, u_residual, u_bonus):
    """Leviathan et al. 2023 Algorithm 1 as a plain loop: the test's oracle for exact decisions."""
    out = []
    for i, d in enumerate(draft_tokens):
        if q_draft[i, d] > 0 and u_accept[i] < p_target[i, d] / q_draft[i, d]:
            out.append(int(d))
            continue
        residual = np.maximum(p_target[i] - q_draft[i], 0)
        probs = residual if residual.sum() > 0 else p_target[i]
        cumulative = np.cumsum(probs)
        out.append(int(np.flatnonzero(cumulative > u_residual[i] * cumulative[-1])[0]))
        return Verdict(i, tuple(out))
    cumulative = np.cumsum(p_target[len(draft_tokens)])
    out.append(int(np.flatnonzero(cumulative > u_bonus * cumulative[-1])[0]))
    return Verdict(len(draft_tokens), tuple(out))


def _random_distribution(gen, vocab, zero_fraction):  # -> (vocab,)
    probs = gen.dirichlet(np.full(vocab, 0.5)) * (gen.random(vocab) >= zero_fraction)
    if probs.sum() == 0:
        probs[gen.integers(vocab)] = 1.0
    return probs / probs.sum()


def test_rejection_matches_the_textbook_loop_and_the_batched_rows():
    gen = np.random.default_rng(1)
    for trial in range(1500):
        k, vocab = int(gen.integers(0, 5)), int(gen.choice([3, 7, 33]))
        p = np.stack([_random_distribution(gen, vocab, 0.3) for _ in range(k + 1)])  # (K+1, V)
        q = np.array([_random_distribution(gen, vocab, 0.3) for _ in range(k)]).reshape(k, vocab)
        if trial % 3 == 0 and k:
            q[-1] = p[-2]  # p == q rows: the all-zero residual path is reachable in the batch
        drafts = gen.integers(0, vocab, k)  # (K,): some have q = 0 on purpose
        u_accept = rng.uniforms(SEED, trial * 8 + np.arange(k), rng.STREAM_ACCEPT, 0)  # (K,)
        u_residual = rng.uniforms(SEED, trial * 8 + np.arange(k), rng.STREAM_RESIDUAL, 0)  # (K,)
        u_bonus = rng.uniform(SEED, trial * 8 + k, rng.STREAM_BONUS)
        verdict = verify.verify_rejection(p, q, drafts, u_accept, u_residual, u_bonus)
        assert verdict == _textbook_rejection(p, q, drafts, u_accept, u_residual, u_bonus)
        assert len(verdict.tokens) == verdict.n_accepted + 1
        # The correction or bonus always has p_target > 0 (residual > 0 implies p_target > 0).
        assert p[verdict.n_accepted, verdict.tokens[-1]] > 0


def test_batched_rows_do_not_leak_between_trials():
    gen = np.random.default_rng(2)
    batch, k, vocab = 64, 3, 5
    p = np.stack([np.stack([_random_distribution(gen, vocab, 0.2) for _ in range(k + 1)])
                  for _ in range(batch)])  # (B, K+1, V)
    q = np.stack([np.stack([_random_distribution(gen, vocab, 0.2) for _ in range(k)])
                  for _ in range(batch)])  # (B, K, V)
    drafts = gen.integers(0, vocab, (batch, k))  # (B, K)
    u_accept, u_residual = gen.random((batch, k)), gen.random((batch, k))  # (B, K) each
    u_bonus = gen.random(batch)  # (B,)
    n_accepted, tokens = verify.verify_rejection_rows(p, q, drafts, u_accept, u_residual, u_bonus)
    for b in range(batch):
        one = verify.verify_rejection(p[b], q[b], drafts[b], u_accept[b], u_residual[b], u_bonus[b])
        assert one.n_accepted == n_accepted[b]
        assert one.tokens == tuple(tokens[b, : one.n_accepted + 1])
        assert np.all(tokens[b, one.n_accepted + 1 :] == -1)


# ---------------------------------------------------------------------------------------------
# Rejection edge cases
# ---------------------------------------------------------------------------------------------
P3 = np.array([0.5, 0.3, 0.2])
Q3 = np.array([0.2, 0.2, 0.6])


def test_rejection_k0_emits_only_the_bonus():
    # cumulative of P3 = 0.5, 0.8, 1.0: u = 0.79 -> token 1, u = 0.81 -> token 2
    empty = np.zeros((0, 3))
    none = np.zeros(0)
    assert verify.verify_rejection(P3[None], empty, [], none, none, 0.79) == Verdict(0, (1,))
    assert verify.verify_rejection(P3[None], empty, [], none, none, 0.81) == Verdict(0, (2,))


def test_rejection_full_acceptance_adds_the_bonus():
    p = np.stack([Q3, Q3, P3])  # rows 0, 1 equal q_draft: always accepted; row 2 is the bonus row
    verdict = verify.verify_rejection(p, np.stack([Q3, Q3]), [2, 0], [0.999, 0.999], [0.0, 0.0],
                                      0.0)
    assert verdict == Verdict(2, (2, 0, 0))  # bonus: u = 0 -> the first positive token of P3


def test_rejection_at_the_first_position_samples_the_residual():
    # p/q at token 2 = 0.2 / 0.6 = 1/3: u = 0.4 rejects. residual max(P3 - Q3, 0) = [0.3, 0.1, 0]
    # (total 0.4, cumulative 0.3, 0.4): u = 0.7 -> 0.28 -> token 0; u = 0.8 -> 0.32 -> token 1.
    p = np.stack([P3, P3])
    assert verify.verify_rejection(p, Q3[None], [2], [0.4], [0.7], 0.5) == Verdict(0, (0,))
    assert verify.verify_rejection(p, Q3[None], [2], [0.4], [0.8], 0.5) == Verdict(0, (1,))
    # u = 0.3 accepts (0.3 < 1/3); the bonus from P3 with u = 0.4 -> 0.4 < 0.5 -> token 0.
    assert verify.verify_rejection(p, Q3[None], [2], [0.3], [0.8], 0.4) == Verdict(1, (2, 0))
    # Token 2 has no residual mass, so however u_residual falls, it is not the correction.
    for u in (0.0, 0.5, 0.999999, 1 - 2.0**-24):
        assert verify.verify_rejection(p, Q3[None], [2], [0.4], [u], 0.5).tokens != (2,)


def test_rejection_at_the_last_position():
    p = np.stack([P3, P3, np.array([0.0, 0.5, 0.5]), P3])  # (4, 3); row 2 gives token 0 p = 0
    q = np.stack([Q3, Q3, Q3])  # (3, 3)
    verdict = verify.verify_rejection(p, q, [0, 0, 0], [0.0, 0.0, 0.0], [0.9, 0.9, 0.0], 0.0)
    # rows 0, 1: p/q(0) = 2.5 >= 1, accepted; row 2: p = 0, rejected whatever u. Residual
    # max([0, .5, .5] - Q3, 0) = [0, 0.3, 0]: only token 1 can come out.
    assert verdict == Verdict(2, (0, 0, 1))


def test_rejection_of_a_draft_that_q_draft_calls_impossible():
    # q_draft(0) = 0 but the drafter proposed 0: a drafter bug. p_target(0) = 0.5 > 0, and even
    # u = 0 does not accept it; the residual decides instead (documented in verify_rejection_rows).
    q = np.array([[0.0, 0.5, 0.5]])
    p = np.stack([P3, P3])
    verdict = verify.verify_rejection(p, q, [0], [0.0], [0.0], 0.0)
    assert verdict.n_accepted == 0
    assert verdict == Verdict(0, (0,))  # residual [0.5, 0, 0] happens to give token 0


def test_rejection_with_p_equal_q_always_accepts():
    p = np.stack([P3, P3])
    for d in range(3):
        for u in (0.0, 0.5, 1 - 2.0**-24):
            assert verify.verify_rejection(p, P3[None], [d], [u], [0.0], 0.0).n_accepted == 1


def test_rejection_refuses_bad_inputs():
    p = np.stack([P3, P3])
    with pytest.raises(VerifyInputError, match="q_draft has shape"):
        verify.verify_rejection(p, np.stack([Q3, Q3]), [0], [0.1], [0.1], 0.1)
    with pytest.raises(VerifyInputError, match="not logits"):
        verify.verify_rejection(np.log(p), Q3[None], [0], [0.1], [0.1], 0.1)
    with pytest.raises(VerifyInputError, match="sum to 1"):
        verify.verify_rejection(p * 2, Q3[None], [0], [0.1], [0.1], 0.1)
    with pytest.raises(VerifyInputError, match=r"\[0, 1\)"):
        verify.verify_rejection(p, Q3[None], [0], [1.0], [0.1], 0.1)
    with pytest.raises(VerifyInputError, match="ids in"):
        verify.verify_rejection(p, Q3[None], [3], [0.1], [0.1], 0.1)


# ---------------------------------------------------------------------------------------------
# softmax and inverse-CDF sampling
# ---------------------------------------------------------------------------------------------
def test_softmax_temperature():
    logits = np.array([2.0, 1.0, -0.5, 0.0])
    for t in (0.25, 1.0, 3.0):
        expected = np.exp(logits / t) / np.exp(logits / t).sum()
        np.testing.assert_allclose(verify.softmax(logits, t), expected, rtol=1e-12, atol=1e-15)
    assert verify.softmax(logits, 0.25).max() > verify.softmax(logits, 3.0).max()  # sharper
    # Max-subtracted: huge logits do not overflow, and a constant shift changes nothing.
    np.testing.assert_allclose(verify.softmax(logits + 1e4, 0.5), verify.softmax(logits, 0.5),
                               rtol=1e-12, atol=1e-15)
    # A tiny T sends the other logits to -inf (p = 0) rather than overflowing to NaN.
    np.testing.assert_array_equal(verify.softmax(np.array([1e300, 0.0, -np.inf]), 1e-10),
                                  [1.0, 0.0, 0.0])
    for bad in (0.0, -1.0):
        with pytest.raises(VerifyInputError, match="temperature"):
            verify.softmax(logits, bad)


def test_masked_logits_give_one_token():
    logits = np.full(7, -np.inf)
    logits[4] = -3.0
    probs = verify.softmax(logits, 0.8)
    np.testing.assert_array_equal(probs, np.eye(7)[4])
    for u in (0.0, 0.5, 1 - 2.0**-24):
        assert verify.sample_categorical(probs, u) == 4
    assert verify.sample_replay(logits, 0.8, rng.gumbel(SEED, 0, 7)) == 4
    assert verify.verify_greedy(np.stack([logits, logits]), [4]) == Verdict(1, (4, 4))
    assert verify.verify_replay(np.stack([logits, logits]), [3], 1.0,
                                np.stack([rng.gumbel(SEED, i, 7) for i in range(2)])) == \
        Verdict(0, (4,))
    with pytest.raises(VerifyInputError, match="-inf everywhere"):
        verify.softmax(np.full(7, -np.inf), 1.0)
    with pytest.raises(VerifyInputError, match="NaN"):
        verify.verify_greedy(np.array([[0.0, np.nan]]), [])


def test_sample_categorical_never_returns_a_zero_probability_token():
    probs = np.array([0.0, 0.25, 0.0, 0.0, 0.5, 0.25, 0.0])
    cumulative = np.cumsum(probs)
    # Every cell boundary, a hair either side of it, the ends, and a fine grid.
    edges = np.concatenate([cumulative, np.nextafter(cumulative, 0), np.nextafter(cumulative, 1)])
    us = np.concatenate([edges[(edges >= 0) & (edges < 1)], [0.0, 1 - 2.0**-24, 1 - 2.0**-53],
                         np.arange(10_000) / 10_000])
    samples = verify.sample_categorical_rows(np.broadcast_to(probs, (len(us), 7)), us)
    assert np.all(probs[samples] > 0)
    assert verify.sample_categorical(probs, 0.0) == 1
    assert verify.sample_categorical(probs, 0.25) == 4  # cumulative 0.25 is not > 0.25
    assert verify.sample_categorical(probs, 1 - 2.0**-53) == 5
    # Unnormalised rows (a residual) use u * total.
    assert verify.sample_categorical(probs * 0.4, 0.75) == 5
    # Rounding that leaves nothing above u * total still yields a positive token, the last one.
    tiny = np.array([0.0, 1e-300, 0.0])
    assert verify.sample_categorical(tiny, 1 - 2.0**-53) == 1


# ---------------------------------------------------------------------------------------------
# Greedy and replay
# ---------------------------------------------------------------------------------------------
def test_greedy_accepts_the_argmax_prefix_with_ties_to_the_lowest_id():
    logits = np.array([
        [0.0, 3.0, 3.0, 1.0],  # tie between 1 and 2: argmax is 1
        [5.0, 5.0, 5.0, 5.0],  # all tied: 0
        [0.0, 0.0, 1.0, 9.0],  # 3
    ])
    assert verify.verify_greedy(logits, [1, 0]) == Verdict(2, (1, 0, 3))  # full accept + bonus
    assert verify.verify_greedy(logits, [2, 0]) == Verdict(0, (1,))  # reject at the first
    assert verify.verify_greedy(logits, [1, 3]) == Verdict(1, (1, 0))  # reject at the last
    assert verify.verify_greedy(logits[:1], []) == Verdict(0, (1,))  # K = 0: just the bonus
    with pytest.raises(VerifyInputError, match="K\\+1"):
        verify.verify_greedy(logits, [1])


def test_replay_temperature_zero_is_greedy_and_shift_invariant():
    gen = np.random.default_rng(3)
    for trial in range(200):
        logits = gen.normal(size=(4, 11)) * 3  # (K+1, vocab)
        drafts = gen.integers(0, 11, 3)  # (K,)
        noise = np.stack([rng.gumbel(SEED, trial * 4 + i, 11) for i in range(4)])  # (K+1, V)
        assert verify.verify_replay(logits, drafts, 0.0, noise) == \
            verify.verify_greedy(logits, drafts)
        for t in (0.5, 1.3):
            assert verify.verify_replay(logits + 7.0, drafts, t, noise) == \
                verify.verify_replay(logits, drafts, t, noise)
    with pytest.raises(VerifyInputError, match="temperature"):
        verify.sample_replay(np.zeros(3), -1.0, np.zeros(3))


def test_replay_samples_follow_softmax():
    # Gumbel-max with pyspec.rules.rng noise, one position per draw: 40,000 draws, 4 standard errors.
    logits = np.array([1.0, 0.0, -1.0, 2.0, -np.inf, 0.5])
    t = 0.7
    noise = rng.gumbel(SEED, np.arange(40_000), 6)  # (40000, 6), one position per row
    samples = verify.sample_replay_rows(np.broadcast_to(logits, noise.shape), t, noise)
    _assert_follows(np.bincount(samples, minlength=6), verify.softmax(logits, t), "replay")


def _toy_logits(prefix: tuple[int, ...], vocab: int, salt: int) -> np.ndarray:
    """A deterministic toy model: logits (vocab,) that depend on the whole prefix."""
    return np.random.default_rng([salt, len(prefix), *prefix]).normal(size=vocab) * 2.5


@pytest.mark.parametrize("temperature", [0.0, 0.8, 1.5])
def test_replay_is_drafter_invariant(temperature):
    # Speculative replay decoding, with drafts from three kinds of drafter and a random K each
    # cycle, must emit exactly the tokens of champion-only replay sampling with the same seed.
    vocab, length = 13, 20
    gen = np.random.default_rng(4)
    for trial in range(60):
        seed = SEED + trial
        noise = [rng.gumbel(seed, pos, vocab) for pos in range(length + 8)]  # (vocab,) each

        def champion(prefix):  # the champion's replay sample after prefix
            return verify.sample_replay(_toy_logits(prefix, vocab, 0), temperature,
                                        noise[len(prefix)])

        reference: tuple[int, ...] = ()
        while len(reference) < length:
            reference += (champion(reference),)

        drafter = trial % 3  # 0: random tokens, 1: a Gumbel-coupled draft model, 2: mostly right
        out: tuple[int, ...] = ()
        while len(out) < length:
            k = int(gen.integers(0, 6))
            drafts: list[int] = []
            for _ in range(k):
                prefix = out + tuple(drafts)
                if drafter == 0:
                    drafts.append(int(gen.integers(vocab)))
                elif drafter == 1:
                    drafts.append(verify.sample_replay(_toy_logits(prefix, vocab, 1),
                                                       temperature, noise[len(prefix)]))
                else:
                    right = champion(prefix)
                    drafts.append(right if gen.random() < 0.8 else (right + 1) % vocab)
            rows = [out + tuple(drafts[:i]) for i in range(k + 1)]  # prefix of each of K+1 rows
            target_logits = np.stack([_toy_logits(r, vocab, 0) for r in rows])  # (K+1, vocab)
            gumbel_rows = np.stack([noise[len(r)] for r in rows])  # (K+1, vocab)
            verdict = verify.verify_replay(target_logits, drafts, temperature, gumbel_rows)
            assert verdict.tokens[: verdict.n_accepted] == tuple(drafts[: verdict.n_accepted])
            out += verdict.tokens
        assert out[:length] == reference, f"trial {trial}, drafter {drafter}"
