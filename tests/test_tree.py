"""Tests for pyspec/rules/tree.py: tree shapes, and the three acceptance walks exact.

Greedy and replay are checked for identity: a toy champion (logits a pure function of the
context) decodes alone and through random trees, and the tokens must be the same. Rejection is
checked in distribution with the real pyspec.rules.rng uniforms (one seed per test), by the bound
of tests/test_verify.py: each cell's frequency within 4 standard errors of its probability, a
p = 0 cell never seen. A naive rule (every sibling tested against the unchanged target) must
fail the same check.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import pytest

from pyspec.rules import rng, verify
from pyspec.rules.tree import (ROOT, Tree, TreeShapeError, draw_siblings, walk_greedy,
                               walk_rejection, walk_replay)

VOCAB = 5


def _assert_follows(counts: np.ndarray, probs: np.ndarray, label: str) -> None:
    """counts (cells,) of n draws against probs (cells,): 4 standard errors, p == 0 never seen."""
    n = counts.sum()
    freq = counts / n
    se = np.sqrt(probs * (1 - probs) / n)
    assert np.all(counts[probs == 0] == 0), f"{label}: a p = 0 cell was seen: {counts}"
    worst = np.abs(freq - probs) - 4 * se
    assert np.all(worst <= 1e-12), f"{label}: freq {freq.round(4)} vs p {probs.round(4)}, n {n}"


def _toy_logits(context, salt: str) -> np.ndarray:
    """(vocab,) logits that are a pure function of the context: a toy model."""
    return _toy_cached(tuple(int(t) for t in context), salt)


@functools.lru_cache(maxsize=None)
def _toy_cached(context: tuple, salt: str, vocab: int = VOCAB) -> np.ndarray:
    digest = hashlib.sha256((salt + repr(context)).encode()).digest()
    gen = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    logits = gen.normal(0, 2, vocab)
    logits[gen.integers(vocab)] = -np.inf if salt == "p" and gen.random() < 0.3 else logits[0]
    return logits


def _probs(context, salt):
    return _probs_cached(tuple(int(t) for t in context), salt)


@functools.lru_cache(maxsize=None)
def _probs_cached(context: tuple, salt: str) -> np.ndarray:
    return verify.softmax(_toy_cached(context, salt), 1.0)


# ---------------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------------
def test_depth_first_trees_are_accepted_and_others_refused():
    tree = Tree((5, 6, 7, 8, 9), (ROOT, 0, 0, ROOT, 3))
    assert list(tree.depths()) == [1, 2, 2, 1, 2]
    assert tree.children(ROOT) == [0, 3] and tree.children(0) == [1, 2]
    assert list(tree.row_parents()) == [ROOT, 0, 1, 1, 0, 4]
    assert tree.path(2) == [0, 2]
    assert Tree.chain([3, 4]).parents == (ROOT, 0)
    with pytest.raises(TreeShapeError, match="depth-first"):
        Tree((1, 2, 3), (ROOT, ROOT, 0))       # node 2's parent is not on node 1's chain
    with pytest.raises(TreeShapeError, match="depth-first"):
        Tree((1, 2), (1, ROOT))                # a parent after its child
    with pytest.raises(TreeShapeError, match="one parent per token"):
        Tree((1, 2), (ROOT,))
    with pytest.raises(TreeShapeError, match=r"\(1 \+ N, vocab\)"):
        walk_greedy(np.zeros((2, 3)), tree)


def test_draw_siblings_is_gumbel_top_k_with_conditional_rows():
    q = np.array([0.5, 0.0, 0.3, 0.2])
    g = np.array([0.0, 9.0, 0.5, 0.1])
    tokens, rows = draw_siblings(q, 4, g)
    assert tokens == [0, 2, 3]                  # q = 0 never drawn; fewer than the width
    assert np.allclose(rows, [[0.5, 0, 0.3, 0.2], [0, 0, 0.6, 0.4], [0, 0, 0, 1]])


# ---------------------------------------------------------------------------------------------
# Greedy and replay: identical to champion-only decoding, whatever the tree
# ---------------------------------------------------------------------------------------------
def _random_tree(gen, context, choice_at, max_nodes=9) -> Tree:
    """A random depth-first tree; where a coin says so a child is the champion's own choice
    (choice_at(context)), so that walks go deep. Siblings may repeat a token."""
    tokens, parents = [], []

    def grow(parent, ctx, depth):
        for _ in range(int(gen.integers(0, 3))):
            if len(tokens) >= max_nodes or depth > 4:
                return
            tok = choice_at(ctx) if gen.random() < 0.6 else int(gen.integers(VOCAB))
            tokens.append(tok)
            parents.append(parent)
            grow(len(tokens) - 1, ctx + [tok], depth + 1)

    grow(ROOT, list(context), 1)
    return Tree(tuple(tokens), tuple(parents))


def _rows(tree: Tree, context, salt) -> np.ndarray:
    """(1 + N, vocab): the toy champion's logits at the root and at every node's path."""
    paths = [[]] + [[tree.tokens[j] for j in tree.path(i)] for i in range(len(tree))]
    return np.stack([_toy_logits(list(context) + p, salt) for p in paths])


@pytest.mark.parametrize("mode", ["greedy", "replay"])
def test_walks_emit_champion_only_tokens(mode):
    seed, temperature, length = 77, 0.8, 40
    gen = np.random.default_rng(3)

    def choice(ctx):  # the champion alone at position len(ctx)
        logits = _toy_logits(ctx, "p")
        if mode == "greedy":
            return int(np.argmax(logits))
        return verify.sample_replay(logits, temperature, rng.gumbel(seed, len(ctx), VOCAB))

    for trial in range(20):
        prompt = [int(t) for t in gen.integers(VOCAB, size=3)] + [trial]
        alone = list(prompt)
        while len(alone) < len(prompt) + length:
            alone.append(choice(alone))
        out, deepest = list(prompt), 0
        while len(out) < len(prompt) + length:
            tree = _random_tree(gen, out, choice)
            rows = _rows(tree, out, "p")
            if mode == "greedy":
                verdict = walk_greedy(rows, tree)
            else:
                depth = int(tree.depths().max()) if len(tree) else 0
                noise = rng.gumbel(seed, len(out) + np.arange(depth + 1), VOCAB)
                verdict = walk_replay(rows, tree, temperature, noise)
            assert list(verdict.tokens[:-1]) == [tree.tokens[i] for i in verdict.path]
            deepest = max(deepest, verdict.n_accepted)
            out += verdict.tokens
        assert out[:len(alone)] == alone
        assert deepest >= 2     # the trees did get followed, not only corrected


# ---------------------------------------------------------------------------------------------
# Rejection: exact in distribution
# ---------------------------------------------------------------------------------------------
class _Noise:
    """Every random number trial t uses, drawn in a few vectorised calls: position start_t + j
    for j < SPAN (a trial and its second cycle stay inside its own positions)."""

    SPAN, RANKS = 6, 3

    def __init__(self, seed: int, starts: np.ndarray):
        pos = starts[:, None] + np.arange(self.SPAN)[None, :]              # (n, SPAN)
        ranks = np.arange(self.RANKS)
        self.gumbel = rng.gumbel(seed ^ 0x5A5A, pos.reshape(-1), VOCAB).reshape(
            len(starts), self.SPAN, VOCAB)                                   # (n, SPAN, vocab)
        self.u_draft = rng.uniforms(seed, pos[..., None], rng.STREAM_DRAFT, ranks)
        self.u_accept = rng.uniforms(seed, pos[..., None], rng.STREAM_ACCEPT, ranks)
        self.u_residual = rng.uniforms(seed, pos, rng.STREAM_RESIDUAL, 0)  # (n, SPAN)
        self.u_bonus = rng.uniforms(seed, pos, rng.STREAM_BONUS, 0)        # (n, SPAN)


def _draft_tree(noise: _Noise, t: int, off: int, context, widths, replacement: bool):
    """Siblings from the toy draft q: without replacement (draw_siblings) or i.i.d.; the tree and
    its q_sibling rows (N, vocab). `off`: the offset of its first position in trial t's span."""
    tokens, parents, q_rows = [], [], []

    def grow(parent, ctx, depth):
        if depth >= len(widths):
            return
        q = _probs(ctx, "q")
        if replacement:
            u = noise.u_draft[t, off + depth, :widths[depth]]
            kids = verify.sample_categorical_rows(np.broadcast_to(q, (len(u), VOCAB)), u)
            rows = np.broadcast_to(q, (len(kids), VOCAB))
        else:
            kids, rows = draw_siblings(q, widths[depth], noise.gumbel[t, off + depth])
        for tok, row in zip(kids, rows):
            tokens.append(int(tok))
            parents.append(parent)
            q_rows.append(row)
            grow(len(tokens) - 1, ctx + [int(tok)], depth + 1)

    grow(ROOT, list(context), 0)
    return Tree(tuple(tokens), tuple(parents)), np.array(q_rows).reshape(-1, VOCAB)


def _tree_cycle(noise, t, off, context, widths, replacement, walk=walk_rejection):
    """One rejection cycle of trial t after `context`, its first new position at `off`."""
    tree, q_rows = _draft_tree(noise, t, off, context, widths, replacement)
    depth = tree.depths()
    ranks = np.zeros(len(tree), dtype=np.int64)
    for parent in set(tree.parents):
        ranks[tree.children(parent)] = np.arange(len(tree.children(parent)))
    u_accept = noise.u_accept[t, off + depth - 1, ranks]                  # (N,)
    paths = [[]] + [[tree.tokens[j] for j in tree.path(i)] for i in range(len(tree))]
    p_rows = np.stack([_probs(list(context) + p, "p") for p in paths])    # (1 + N, vocab)
    span = slice(off, off + len(widths) + 1)
    return walk(p_rows, tree, q_rows, u_accept, noise.u_residual[t, span], noise.u_bonus[t, span])


def _joint_of_two(seed, widths, replacement, n, walk=walk_rejection) -> np.ndarray:
    """Counts (vocab * vocab,) of the first two tokens over n trials (a second cycle where the
    first emitted one token), each trial on its own positions."""
    noise = _Noise(seed, np.arange(n) * 16)
    counts = np.zeros(VOCAB * VOCAB, dtype=np.int64)
    context = [1, 2]
    for t in range(n):
        tokens = walk(noise, t, 0, context, widths, replacement).tokens
        if len(tokens) == 1:
            tokens += walk(noise, t, 1, context + list(tokens), widths, replacement).tokens
        counts[tokens[0] * VOCAB + tokens[1]] += 1
    return counts


def _expected_joint() -> np.ndarray:
    p0 = _probs([1, 2], "p")
    return np.concatenate([p0[a] * _probs([1, 2, a], "p") for a in range(VOCAB)])


DRAWS = 10_000


@pytest.mark.parametrize("replacement", [False, True], ids=["without-replacement", "iid"])
@pytest.mark.parametrize("widths", [(3, 2), (2, 1, 1)])
def test_rejection_walk_follows_the_champion_jointly(widths, replacement):
    counts = _joint_of_two(SEED_BY_WIDTHS[widths], widths, replacement, DRAWS, _tree_cycle)
    _assert_follows(counts, _expected_joint(), f"widths {widths}, replacement {replacement}")


SEED_BY_WIDTHS = {(3, 2): 1101, (2, 1, 1): 2202}


def _naive_walk(p_target, tree, q_sibling, u_accept, u_residual, u_bonus):
    """The wrong rule: every sibling tested against the row's unchanged p, then p sampled."""
    node, depth, path = ROOT, 0, []
    while True:
        r = p_target[node + 1]
        for c in tree.children(node):
            if u_accept[c] * q_sibling[c, tree.tokens[c]] < r[tree.tokens[c]]:
                path.append(c)
                node, depth = c, depth + 1
                break
        else:
            u = u_residual[depth] if tree.children(node) else u_bonus[depth]
            last = int(verify.sample_categorical_rows(r[None], np.array([u]))[0])
            return verify.Verdict(len(path), tuple(tree.tokens[i] for i in path) + (last,))


def test_a_naive_sibling_rule_fails_the_same_check():
    def naive_cycle(noise, t, off, context, widths, replacement):
        return _tree_cycle(noise, t, off, context, widths, replacement, _naive_walk)

    counts = _joint_of_two(3303, (3, 2), False, DRAWS, naive_cycle)
    with pytest.raises(AssertionError, match="freq"):
        _assert_follows(counts, _expected_joint(), "naive")


def test_a_chain_tree_decides_as_verify_rejection():
    gen = np.random.default_rng(5)
    for trial in range(300):
        k = int(gen.integers(0, 5))
        p = gen.dirichlet(np.full(VOCAB, 0.5), size=k + 1)               # (K+1, vocab)
        q = gen.dirichlet(np.full(VOCAB, 0.5), size=k)                   # (K, vocab)
        drafts = gen.integers(0, VOCAB, k)
        n = trial * 8
        u_acc = rng.uniforms(7, n + np.arange(k), rng.STREAM_ACCEPT, 0)
        u_res = rng.uniforms(7, n + np.arange(k + 1), rng.STREAM_RESIDUAL, 0)
        u_bon = rng.uniforms(7, n + np.arange(k + 1), rng.STREAM_BONUS, 0)
        chain = verify.verify_rejection(p, q, drafts, u_acc, u_res[:k], u_bon[k])
        walked = walk_rejection(p, Tree.chain(drafts), q, u_acc, u_res, u_bon)
        assert (walked.n_accepted, walked.tokens) == (chain.n_accepted, chain.tokens)
