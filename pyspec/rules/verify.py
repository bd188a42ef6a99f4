"""The exact acceptance rules of speculative decoding, as pure functions.

Given the champion's (target's) logits or probabilities for the K+1 positions of one cycle, the K
drafted tokens and, for the stochastic rules, the random numbers, each rule returns a `Verdict`:
how many drafts are accepted, and the tokens to emit (the accepted drafts plus exactly one
correction or bonus token). Three rules:

- `verify_greedy`     T = 0: accept while the draft equals the champion's argmax.
- `verify_replay`     Gumbel-max sampling with noise keyed by (seed, position): the output is
                      exactly champion-only sampling with the same seed, whatever the drafts.
- `verify_rejection`  Leviathan et al. 2023 / Chen et al. 2023: accept with probability
                      min(1, p_target / q_draft), else sample the residual
                      max(p_target - q_draft, 0).

Nothing here draws random numbers, reads files or keeps state: the uniforms and the Gumbel noise
come from `pyspec.rules.rng` through the caller, so the GPU accept kernel, fed the same numbers, must
make the same decisions. Running models, KV rollback and choosing K live elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import PyspecError


class VerifyInputError(PyspecError, ValueError):
    """Inputs that no rule can use (wrong shapes, non-distributions, uniforms outside [0, 1))."""

    code = "bad_input"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one verification cycle.

    tokens = the first n_accepted drafts, then one token from the champion: the correction at the
    first rejected position, or the bonus token from row K when every draft was accepted. So
    len(tokens) == n_accepted + 1 always, and a cycle never emits fewer than one token.
    """

    n_accepted: int
    tokens: tuple[int, ...]


# ---------------------------------------------------------------------------------------------
# Distributions and sampling
# ---------------------------------------------------------------------------------------------
def _check_logits(logits: np.ndarray) -> None:  # (..., vocab)
    if np.isnan(logits).any() or np.isposinf(logits).any():
        # Why these words: the rules judge the champion's rows (a draft's are refused in
        # cycle.Rule.choose), and the command line and the page both show this message.
        raise VerifyInputError("the champion model's logits are NaN or +inf (its weights may "
                               "be corrupt): download the model again or pick another")
    if not np.isfinite(logits).any(axis=-1).all():
        raise VerifyInputError("a logits row is -inf everywhere; a mask must leave one token open")


def softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    """p = softmax(logits / T) over the last axis, float64, max-subtracted; -inf entries give 0.

    logits: (..., vocab). T must be > 0 (T = 0 is greedy: use argmax, not a distribution).
    """
    if not temperature > 0:
        raise VerifyInputError(f"temperature must be > 0 for softmax, got {temperature}")
    logits = np.asarray(logits, dtype=np.float64)  # (..., vocab)
    _check_logits(logits)
    # Subtract the max before dividing: the max becomes 0 and everything else <= 0, so exp never
    # overflows; a division by a tiny T may reach -inf, which is the right answer (p = 0).
    with np.errstate(over="ignore"):
        z = (logits - logits.max(axis=-1, keepdims=True)) / temperature
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log softmax(logits) at T = 1 over the last axis, float64: logits (..., vocab) -> same."""
    logits = np.asarray(logits, dtype=np.float64)
    _check_logits(logits)
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def sample_categorical_rows(probs: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF sampling per row: the first index whose cumulative sum exceeds u * total.

    probs: (rows, vocab), non-negative, need not be normalised. u: (rows,) in [0, 1).
    Returns (rows,) int64. A zero-probability token is never returned: its cumulative sum equals
    its predecessor's, so it can never be the *first* to exceed the threshold; and when rounding
    leaves no entry above u * total, the last positive-probability token is taken.
    """
    cumulative = np.cumsum(probs, axis=-1)  # (rows, vocab), non-decreasing
    total = cumulative[:, -1:]  # (rows, 1); the same sum the comparison uses, not a re-summation
    if not (total > 0).all():
        raise VerifyInputError("a probability row sums to 0; nothing can be sampled from it")
    first_above = (cumulative <= u[:, None] * total).sum(axis=-1)  # (rows,)
    vocab = probs.shape[-1]
    last_positive = vocab - 1 - np.argmax(probs[:, ::-1] > 0, axis=-1)  # (rows,)
    return np.minimum(first_above, last_positive)


def sample_categorical(probs: np.ndarray, u: float) -> int:
    """One inverse-CDF sample from probs (vocab,) with the uniform u in [0, 1)."""
    probs = np.asarray(probs, dtype=np.float64)
    _check_probs("probs", probs[None, :])
    _check_uniforms("u", np.array([u]))
    return int(sample_categorical_rows(probs[None, :], np.array([u], dtype=np.float64))[0])


def sample_replay_rows(logits: np.ndarray, temperature: float, gumbel: np.ndarray) -> np.ndarray:
    """Gumbel-max per row: argmax(logits / T + gumbel), ties to the lowest id; T == 0 -> argmax.

    logits, gumbel: (rows, vocab). Returns (rows,) int64. With standard Gumbel noise this samples
    softmax(logits / T) exactly (the Gumbel-max trick); at T == 0 the noise is ignored.
    """
    logits = np.asarray(logits, dtype=np.float64)
    _check_logits(logits)
    if temperature < 0:
        raise VerifyInputError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return np.argmax(logits, axis=-1)
    gumbel = np.asarray(gumbel, dtype=np.float64)
    if gumbel.shape != logits.shape:
        raise VerifyInputError(f"gumbel has shape {gumbel.shape}, logits {logits.shape}; "
                               "draw one Gumbel value per (position, token)")
    return np.argmax(logits / temperature + gumbel, axis=-1)


def sample_replay(logits: np.ndarray, temperature: float, gumbel: np.ndarray) -> int:
    """One replay sample. logits: (vocab,); gumbel: (vocab,) = rng.gumbel(seed, position, vocab)."""
    logits = np.asarray(logits, dtype=np.float64)
    return int(sample_replay_rows(logits[None, :], temperature, np.asarray(gumbel)[None, :])[0])


# ---------------------------------------------------------------------------------------------
# Greedy and replay: accept while the draft equals the champion's own choice
# ---------------------------------------------------------------------------------------------
def _accept_matching(champion_tokens: np.ndarray, draft_tokens: np.ndarray) -> Verdict:
    """champion_tokens (K+1,), draft_tokens (K,): accept the longest prefix where they agree.

    The champion's token at the first disagreement (or its row-K token, the bonus, when all K
    agree) is emitted too, so the emitted tokens are exactly champion_tokens[: n_accepted + 1].
    """
    k = len(draft_tokens)
    if champion_tokens.shape != (k + 1,):
        raise VerifyInputError(f"the champion gives {champion_tokens.shape[0]} rows for {k} "
                               f"drafts; it must score K+1 = {k + 1} positions")
    agree = champion_tokens[:k] == draft_tokens  # (K,)
    n_accepted = int(np.cumprod(agree).sum())
    return Verdict(n_accepted, tuple(int(t) for t in champion_tokens[: n_accepted + 1]))


def verify_greedy(target_logits: np.ndarray, draft_tokens: np.ndarray) -> Verdict:
    """Greedy rule. target_logits: (K+1, vocab); draft_tokens: (K,).

    Accept draft i while it equals argmax(target_logits[i]) (ties to the lowest id), then emit the
    champion's argmax at the first mismatch, or at row K (the bonus) if every draft matched.
    """
    target_logits = np.asarray(target_logits, dtype=np.float64)
    _check_logits(target_logits)
    return _accept_matching(np.argmax(target_logits, axis=-1), _as_tokens(draft_tokens))


def verify_replay(target_logits: np.ndarray, draft_tokens: np.ndarray, temperature: float,
                  gumbel: np.ndarray) -> Verdict:
    """Replay rule. target_logits: (K+1, vocab); draft_tokens: (K,); gumbel: (K+1, vocab).

    Row i of gumbel must be rng.gumbel(seed, committed + i, vocab). The champion's sample at each
    row is sample_replay(row); accept draft i iff it equals that sample, and emit the champion's
    sample at the first mismatch (or at row K, the bonus). Every emitted token is therefore the
    champion's own replay sample at its position given the emitted prefix, which does not depend
    on the drafts: the output is champion-only replay sampling, whatever the drafter (drafts that
    disagree only cost speed).
    """
    draft_tokens = _as_tokens(draft_tokens)
    champion_tokens = sample_replay_rows(target_logits, temperature, np.asarray(gumbel))
    return _accept_matching(champion_tokens, draft_tokens)


# ---------------------------------------------------------------------------------------------
# Rejection sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2)
# ---------------------------------------------------------------------------------------------
def verify_rejection_rows(p_target: np.ndarray, q_draft: np.ndarray, draft_tokens: np.ndarray,
                          u_accept: np.ndarray, u_residual: np.ndarray,
                          u_bonus: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rejection rule for B independent cycles at once (what a batched accept kernel does).

    p_target: (B, K+1, vocab)  champion probabilities; row K is for the bonus token
    q_draft:  (B, K, vocab)    the distributions the drafts were sampled from (one-hot if the
                               drafter is deterministic, e.g. n-gram lookup)
    draft_tokens: (B, K) ints; u_accept, u_residual: (B, K); u_bonus: (B,); uniforms in [0, 1)
    Returns n_accepted (B,) int64 and tokens (B, K+1) int64, where tokens[b, :n_accepted[b] + 1]
    are the emitted tokens and the rest is -1.

    Rule, per cycle:
      accept d_i iff u_accept[i] * q_draft[i, d_i] < p_target[i, d_i]   (u < p/q without dividing;
          p == 0 always rejects, p >= q always accepts);
      a draft with q_draft[i, d_i] == 0 is rejected: the drafter claimed that token impossible, so
          its q_draft is wrong and p/q proves nothing; rejecting hands the position to the
          residual, which is a sample that the champion can produce;
      at the first rejection i, emit a sample of normalize(max(p_target[i] - q_draft[i], 0)) with
          u_residual[i]; that residual is all zero only if p_target[i] == q_draft[i], where the
          rejection has probability 0, and then p_target[i] itself is sampled;
      if all K are accepted, emit the bonus: a sample of p_target[K] with u_bonus.
    """
    p_target, q_draft, draft_tokens, u_accept, u_residual, u_bonus = _check_rejection_inputs(
        p_target, q_draft, draft_tokens, u_accept, u_residual, u_bonus)
    batch, k = draft_tokens.shape
    rows = np.arange(batch)[:, None]  # (B, 1)
    cols = np.arange(k)[None, :]  # (1, K)
    p_of_draft = p_target[rows, cols, draft_tokens]  # (B, K)
    q_of_draft = q_draft[rows, cols, draft_tokens]  # (B, K)
    accept = (q_of_draft > 0) & (u_accept * q_of_draft < p_of_draft)  # (B, K)
    # Only the prefix before the first rejection counts: later tests were never reached.
    n_accepted = np.cumprod(accept, axis=1).sum(axis=1)  # (B,)

    # Emitted last token: residual at row n_accepted, or the bonus from row K (all accepted).
    at = np.minimum(n_accepted, k - 1) if k else np.zeros(batch, dtype=np.int64)  # (B,)
    all_accepted = n_accepted == k  # (B,)
    p_row = p_target[np.arange(batch), n_accepted]  # (B, vocab): row K when all accepted
    if k:  # residual is computed for every cycle; use_p discards it where all were accepted
        residual = np.maximum(p_row - q_draft[np.arange(batch), at], 0.0)  # (B, vocab)
        residual_empty = residual.sum(axis=1) == 0  # p_target == q_draft at that row
        use_p = all_accepted | residual_empty
        last_probs = np.where(use_p[:, None], p_row, residual)  # (B, vocab)
        last_u = np.where(all_accepted, u_bonus, u_residual[np.arange(batch), at])  # (B,)
    else:
        last_probs, last_u = p_row, u_bonus
    last = sample_categorical_rows(last_probs, last_u)  # (B,)

    tokens = np.where(cols < n_accepted[:, None], draft_tokens, -1)  # (B, K)
    tokens = np.concatenate([tokens, np.full((batch, 1), -1, dtype=np.int64)], axis=1)
    tokens[np.arange(batch), n_accepted] = last
    return n_accepted, tokens


def verify_rejection(p_target: np.ndarray, q_draft: np.ndarray, draft_tokens: np.ndarray,
                     u_accept: np.ndarray, u_residual: np.ndarray, u_bonus: float) -> Verdict:
    """The rejection rule for one cycle; see verify_rejection_rows for the rule itself.

    p_target: (K+1, vocab); q_draft: (K, vocab); draft_tokens, u_accept, u_residual: (K,);
    u_bonus: a float. The uniforms should be rng.uniform(seed, committed + i, STREAM_ACCEPT),
    (..., STREAM_RESIDUAL) and rng.uniform(seed, committed + K, STREAM_BONUS).
    """
    n_accepted, tokens = verify_rejection_rows(
        np.asarray(p_target)[None], np.asarray(q_draft)[None], np.asarray(draft_tokens)[None],
        np.asarray(u_accept)[None], np.asarray(u_residual)[None], np.array([u_bonus]))
    n = int(n_accepted[0])
    return Verdict(n, tuple(int(t) for t in tokens[0, : n + 1]))


# ---------------------------------------------------------------------------------------------
# Input checks: wrong inputs fail here with a message, not as a wrong token later
# ---------------------------------------------------------------------------------------------
def _as_tokens(draft_tokens) -> np.ndarray:
    tokens = np.asarray(draft_tokens)
    if tokens.size == 0:
        tokens = tokens.astype(np.int64)
    if tokens.dtype.kind not in "iu":
        raise VerifyInputError(f"draft tokens must be integers, got dtype {tokens.dtype}")
    return tokens.astype(np.int64)


def _check_probs(name: str, probs: np.ndarray) -> None:  # (..., vocab)
    if not np.isfinite(probs).all() or (probs < 0).any():
        raise VerifyInputError(f"{name} has negative or non-finite entries; pass probabilities "
                               "(softmax of the logits), not logits")


def _check_uniforms(name: str, u: np.ndarray) -> None:
    if not ((u >= 0) & (u < 1)).all():
        raise VerifyInputError(f"{name} must lie in [0, 1); draw it with pyspec.rules.rng.uniform")


def _check_rejection_inputs(p_target, q_draft, draft_tokens, u_accept, u_residual, u_bonus):
    p_target = np.asarray(p_target, dtype=np.float64)  # (B, K+1, vocab)
    q_draft = np.asarray(q_draft, dtype=np.float64)  # (B, K, vocab)
    draft_tokens = _as_tokens(draft_tokens)  # (B, K)
    u_accept = np.asarray(u_accept, dtype=np.float64)  # (B, K)
    u_residual = np.asarray(u_residual, dtype=np.float64)  # (B, K)
    u_bonus = np.asarray(u_bonus, dtype=np.float64)  # (B,)
    if p_target.ndim != 3:
        raise VerifyInputError(f"p_target must be (B, K+1, vocab), got shape {p_target.shape}")
    batch, k_plus_1, vocab = p_target.shape
    k = k_plus_1 - 1
    expected = {"q_draft": (q_draft, (batch, k, vocab)), "draft_tokens": (draft_tokens, (batch, k)),
                "u_accept": (u_accept, (batch, k)), "u_residual": (u_residual, (batch, k)),
                "u_bonus": (u_bonus, (batch,))}
    for name, (arr, shape) in expected.items():
        if arr.shape != shape:
            raise VerifyInputError(f"{name} has shape {arr.shape}, expected {shape} for "
                                   f"p_target of shape {p_target.shape} (K = {k})")
    if k < 0:
        raise VerifyInputError("p_target needs at least one row (the bonus row at K = 0)")
    _check_probs("p_target", p_target)
    _check_probs("q_draft", q_draft)
    # The ratio p/q is only meaningful between normalised rows; 1e-3 tolerates float32 sums.
    for name, probs in (("p_target", p_target), ("q_draft", q_draft)):
        if probs.size and np.abs(probs.sum(axis=-1) - 1.0).max() > 1e-3:
            raise VerifyInputError(f"{name} rows must each sum to 1; normalise them (softmax)")
    if ((draft_tokens < 0) | (draft_tokens >= vocab)).any():
        raise VerifyInputError(f"draft tokens must be ids in [0, {vocab})")
    for name, u in (("u_accept", u_accept), ("u_residual", u_residual), ("u_bonus", u_bonus)):
        _check_uniforms(name, u)
    return p_target, q_draft, draft_tokens, u_accept, u_residual, u_bonus
