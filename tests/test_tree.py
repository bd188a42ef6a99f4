"""Tests for pyspec/rules/tree.py: tree shapes, and the three acceptance walks exact.

Greedy and replay are checked for identity: a toy champion (logits a pure function of the
context) decodes alone and through random trees, and the tokens must be the same. Rejection is
checked in distribution through the engine's own code (drafters/tree.grow_model_tree over a toy
draft model, cycle.tree_verdict with its keying: one seed per request, from the test's own seed
block), 10,000 requests a case, by the bound of tests/test_verify.py: each cell's frequency
within 4 standard errors of its probability, a p = 0 cell never seen. A naive rule (every
sibling tested against the unchanged target) must fail the same check. The engine itself, on a
tiny model: tests/test_tree_engine.py.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import pytest

from pyspec.cycle import Rule, TreeProposal, tree_verdict
from pyspec.drafters.tree import grow_model_tree
from pyspec.rules import rng, verify
from pyspec.rules import tree as tree_rules
from pyspec.rules.tree import (ROOT, Tree, TreeShapeError, TreeVerdict, draw_siblings,
                               walk_greedy, walk_rejection, walk_replay)
from test_engine import seed_block

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


def test_a_walk_tests_the_first_branch_as_its_chain_would_be():
    """first_branch: what a walk says of the tree's first branch (each node's first child) is
    what verifying that branch alone as a chain says, (drafts tested, accepted), under greedy
    and rejection (a node's first child is tested against its row before any residual), over
    random trees. The guard scores it as the chain's acceptance (costmodel.py). Hand cases
    first: a walk that leaves the branch for a sibling, one stopped at the branch's leaf."""
    tree = Tree((1, 2, 3, 4), (ROOT, 0, 0, ROOT))   # depth-first: 0 -> {1, 2}; 3 beside 0
    assert tree_rules.first_branch(tree, (0, 2)) == (2, 1)     # left at depth 2
    assert tree_rules.first_branch(tree, (0, 1)) == (2, 2)     # to the first branch's leaf
    assert tree_rules.first_branch(tree, (0,)) == (2, 1)       # node 0's children rejected
    assert tree_rules.first_branch(tree, (3,)) == (1, 0)
    assert tree_rules.first_branch(tree, ()) == (1, 0)
    assert tree_rules.first_branch(Tree((), ()), ()) == (0, 0)
    gen, tested_deep, left = np.random.default_rng(11), 0, 0
    for trial in range(400):
        context = [int(t) for t in gen.integers(VOCAB, size=3)]
        tree = _random_tree(gen, context, lambda ctx: int(np.argmax(_toy_logits(ctx, "p"))))
        branch = 0
        while branch < len(tree) and tree.parents[branch] == branch - 1:
            branch += 1
        rows = _rows(tree, context, "p")                       # (1 + N, vocab)
        if trial % 2:
            walked = walk_greedy(rows, tree)
            chain = verify.verify_greedy(rows[:branch + 1], tree.tokens[:branch])
        else:
            p = verify.softmax(rows, 1.0)
            q = gen.dirichlet(np.full(VOCAB, 0.5), size=len(tree))
            u_acc, u_res, u_bon = gen.random(len(tree)), gen.random(8), gen.random(8)
            walked = walk_rejection(p, tree, q, u_acc, u_res, u_bon)
            chain = verify.verify_rejection(p[:branch + 1], q[:branch], tree.tokens[:branch],
                                            u_acc[:branch], u_res[:branch], u_bon[branch])
        want = (min(branch, chain.n_accepted + 1), chain.n_accepted)
        assert tree_rules.first_branch(tree, walked.path) == want, (tree, walked.path)
        tested_deep += want[0] >= 2
        left += walked.n_accepted > want[1]
    assert tested_deep > 50 and left > 20, (tested_deep, left)   # the cases were reached


# ---------------------------------------------------------------------------------------------
# Rejection: exact in distribution, through the engine's own code
# ---------------------------------------------------------------------------------------------
# A trial is what the engine does for a request (cpu/executor.py): the tree of drafters/tree.py
# (grow_model_tree, siblings by draw_siblings under the noise of their position) over a toy
# draft model, then cycle.tree_verdict over the toy champion's rows, its uniforms keyed by the
# request's seed and the positions as the engine keys them; nothing here draws a random number
# of the rule's. Each trial has its own seed (test_engine.seed_block: a block of the test's own).
class _ToyCache:
    """The draft cache grow_model_tree reads and writes: rows of (token, parent row)."""

    max_ctx = 1 << 20

    def __init__(self):
        self.rows: list[tuple[int, int]] = []
        self.committed = 0

    @property
    def length(self) -> int:
        return len(self.rows)

    def rollback(self) -> None:
        del self.rows[self.committed:]


class _ToyModel:
    """A draft model whose logits after a row are _toy_logits of that row's context (its parent
    rows back to the first), so grow_model_tree's tree passes see each node's own path."""

    def forward(self, tokens, kv, last_only=False, exact=True, parents=None):
        start = kv.length
        for j, t in enumerate(tokens):
            kv.rows.append((int(t), parents[j] if parents is not None else kv.length - 1))
        out = []
        for row in range(start, kv.length):
            context = []
            while row >= 0:
                context.append(kv.rows[row][0])
                row = kv.rows[row][1]
            out.append(_toy_logits(context[::-1], "q"))
        return np.stack(out[-1:] if last_only else out)


class _ToyDrafter:
    kind = "model"

    def __init__(self):
        self.model, self.kv, self.calls = _ToyModel(), _ToyCache(), 0


def _iid_tree(gen, context, widths):
    """Siblings drawn i.i.d. from the toy q (SpecInfer's trees; no pyspec drafter draws them):
    the proposal, each node's row its q (the law of every sibling)."""
    tokens, parents, rows = [], [], []

    def grow(parent, ctx, depth):
        if depth < len(widths):
            q = _probs(ctx, "q")
            for tok in gen.choice(VOCAB, size=widths[depth], p=q):
                tokens.append(int(tok))
                parents.append(parent)
                rows.append(q)
                grow(len(tokens) - 1, ctx + [int(tok)], depth + 1)

    grow(ROOT, list(context), 0)
    return TreeProposal(Tree(tuple(tokens), tuple(parents)), rows)


def _tree_cycle(seed, context, widths, replacement):
    """One rejection cycle of a request with `seed` after `context`: the emitted tokens."""
    rule = Rule("rejection", temperature=1.0, seed=seed)
    if replacement:
        proposal = _iid_tree(np.random.default_rng([seed, len(context)]), context, widths)
    else:
        proposal = grow_model_tree(_ToyDrafter(), list(context), widths, len(widths), rule)
    tree = proposal.tree
    rows = np.stack([_toy_logits(list(context) + [tree.tokens[j] for j in path], "p")
                     for path in [[]] + [tree.path(i) for i in range(len(tree))]])
    verdict, path = tree_verdict(rule, rows, proposal, len(context))
    assert list(verdict.tokens[:-1]) == [tree.tokens[i] for i in path]
    return verdict.tokens


def _joint_of_two(seeds, widths, replacement) -> np.ndarray:
    """Counts (vocab * vocab,) of a request's first two tokens, one request per seed (a second
    cycle where the first emitted one token)."""
    counts = np.zeros(VOCAB * VOCAB, dtype=np.int64)
    context = (1, 2)
    for seed in seeds:
        tokens = _tree_cycle(seed, context, widths, replacement)
        if len(tokens) == 1:
            tokens += _tree_cycle(seed, context + tokens, widths, replacement)
        counts[tokens[0] * VOCAB + tokens[1]] += 1
    return counts


def _expected_joint() -> np.ndarray:
    p0 = _probs([1, 2], "p")
    return np.concatenate([p0[a] * _probs([1, 2, a], "p") for a in range(VOCAB)])


DRAWS = 10_000


@pytest.mark.parametrize("widths, replacement", [((3, 2), False), ((2, 1, 1), False),
                                                  ((3, 2), True)],
                         ids=["3,2-without-replacement", "2,1,1-without-replacement", "3,2-iid"])
def test_rejection_walk_follows_the_champion_jointly(widths, replacement):
    counts = _joint_of_two(seed_block(DRAWS), widths, replacement)
    _assert_follows(counts, _expected_joint(), f"widths {widths}, replacement {replacement}")


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
            return TreeVerdict(tuple(path), tuple(tree.tokens[i] for i in path) + (last,))


def test_a_naive_sibling_rule_fails_the_same_check(monkeypatch):
    """Through the same cycle; 2,000 requests suffice (it misses a cell by 17 standard errors
    there, against the bound's 4)."""
    monkeypatch.setattr(tree_rules, "walk_rejection", _naive_walk)
    counts = _joint_of_two(seed_block(2_000), (3, 2), False)
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
