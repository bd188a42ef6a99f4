"""Token trees and their exact acceptance walks, as pure functions (docs/architecture.md).

A tree of drafts is a list of nodes in depth-first order, each a token and the index of its
parent node (-1: a child of the root, the last committed token). The champion scores the root
and every node in one pass (row 0 the root, row i + 1 node i); the row of a node at depth d
(the root has depth 0) gives the distribution of position n + d after the n committed tokens.
A walk starts at the root and follows one child per step, so it accepts one path; it emits that
path's tokens and one champion token after it (the correction where no child is followed, or the
bonus at a leaf), exactly as the chain rules in verify.py do for a tree of width 1.

- `walk_greedy`     follow the child whose token is the champion's argmax (ties to the lowest
                    id): byte-identical to champion-only greedy decoding, whatever the tree.
- `walk_replay`     follow the child whose token is the champion's own Gumbel-max sample at
                    that position (noise keyed by (seed, position), rng.gumbel): byte-identical
                    to champion-only replay sampling with the same seed, whatever the tree.
- `walk_chosen`     the two above from each row's choice alone (the argmax or the replay
                    sample a device made per row), for a walk that never sees the logits.
- `walk_rejection`  multi-candidate rejection sampling over each node's children in order,
                    exact in distribution (the rule and its proof are in its docstring).

Nothing here draws random numbers, runs a model or touches a cache: the uniforms, the noise and
the sibling proposal rows come from the caller, keyed as `walk_rejection` says.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import OptionsError
from .verify import VerifyInputError, sample_categorical_rows, sample_replay_rows

ROOT = -1  # the parent index of a child of the root (the last committed token)
MAX_TREE_NODES = 63   # a tree and its root fill one verify pass of at most k_max + 1 = 64 rows


def parse_tree(spec: str | None):
    """None or "" (chains), "auto", or a tuple of widths per depth from "W1,W2,..."."""
    if not spec:
        return None
    if spec == "auto":
        return "auto"
    try:
        widths = tuple(int(w) for w in spec.split(","))
    except ValueError:
        widths = ()
    if not widths or min(widths) < 1:
        raise OptionsError(f"tree {spec!r}: give widths per depth as W1,W2,... (each >= 1, "
                           "e.g. 2,2,1) or auto")
    if int(np.cumprod(widths).sum()) > MAX_TREE_NODES:
        raise OptionsError(f"tree {spec!r} has {int(np.cumprod(widths).sum())} nodes; one pass "
                           f"verifies at most {MAX_TREE_NODES}: use fewer or narrower depths")
    return widths


class TreeShapeError(VerifyInputError):
    """A tree whose parents are not a depth-first list (a parent after its child, a node that
    does not continue the last node's ancestor chain) or whose inputs do not match its size."""


@dataclass(frozen=True)
class Tree:
    """Draft nodes in depth-first order. tokens (N,), parents (N,): parents[i] is the index of
    node i's parent, ROOT for a child of the root. Children of one node appear in the order
    they were drafted (the rejection walk tries them in that order)."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise TreeShapeError(f"a tree needs one parent per token: {len(self.tokens)} tokens, "
                                 f"{len(self.parents)} parents")
        stack: list[int] = []  # the ancestor chain of the last node, itself included
        for i, parent in enumerate(self.parents):
            while stack and stack[-1] != parent:
                stack.pop()
            if parent != ROOT and not stack:
                raise TreeShapeError(f"node {i}'s parent {parent} is not on the ancestor chain "
                                     "of the node before it: list the nodes depth-first")
            stack.append(i)

    @classmethod
    def chain(cls, tokens) -> Tree:
        """A chain of drafts as a tree: node i's parent is node i - 1."""
        tokens = tuple(int(t) for t in tokens)
        return cls(tokens, tuple(range(-1, len(tokens) - 1)))

    def __len__(self) -> int:
        return len(self.tokens)

    def depths(self) -> np.ndarray:
        """(N,) the depth of each node: 1 for a child of the root."""
        out = np.empty(len(self), dtype=np.int64)
        for i, parent in enumerate(self.parents):
            out[i] = 1 if parent == ROOT else out[parent] + 1
        return out

    def children(self, node: int) -> list[int]:
        """The children of `node` (ROOT for the root's), in drafted order."""
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def row_parents(self) -> np.ndarray:
        """(1 + N,) the parent row of each row of the champion's pass: row 0 (the root) has
        ROOT, meaning the committed context; node i (row i + 1) has its parent's row."""
        return np.array([ROOT] + [p + 1 for p in self.parents], dtype=np.int64)

    def path(self, node: int) -> list[int]:
        """The nodes from the root's child down to `node`, inclusive ([] for ROOT)."""
        out = []
        while node != ROOT:
            out.append(node)
            node = self.parents[node]
        return out[::-1]


def depth_first_order(parents) -> list[int]:
    """Nodes listed with parents before children (breadth-first, say: parents[i] < i or ROOT)
    -> the same nodes depth-first, children in listed order: order[j] is the listed index of
    depth-first node j."""
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        kids.setdefault(int(p), []).append(i)
    order: list[int] = []
    stack = list(reversed(kids.get(ROOT, [])))
    while stack:
        i = stack.pop()
        order.append(i)
        stack.extend(reversed(kids.get(i, [])))
    return order


def reorder(tokens, parents, order: list[int]) -> Tree:
    """The tree of nodes listed as (tokens, parents), in `order` (depth_first_order's)."""
    new = {old: j for j, old in enumerate(order)}
    return Tree(tuple(int(tokens[i]) for i in order),
                tuple(ROOT if parents[i] == ROOT else new[int(parents[i])] for i in order))


@dataclass(frozen=True)
class TreeVerdict:
    """The accepted path (node indices, root's child first) and the emitted tokens: the path's
    tokens, then one champion token (correction or bonus). n_accepted = len(path)."""

    path: tuple[int, ...]
    tokens: tuple[int, ...]

    @property
    def n_accepted(self) -> int:
        return len(self.path)


def _check_rows(tree: Tree, rows: np.ndarray, name: str) -> None:
    if rows.ndim != 2 or rows.shape[0] != len(tree) + 1:
        raise TreeShapeError(f"{name} must be (1 + N, vocab) = ({len(tree) + 1}, vocab) for a "
                             f"tree of {len(tree)} nodes; got shape {rows.shape}")


def walk_chosen(tree: Tree, choice) -> TreeVerdict:
    """Greedy and replay from each row's own choice, choice (1 + N,): the champion's argmax, or
    its replay sample keyed by the row's depth (on the GPU argmax_rows makes them and
    shaders/tree_walk.wgsl walks them the same way). Walk
    from the root taking the child whose token is choice[row] (the lowest-index such child
    where siblings repeat a token); emit the choice of the row where no child has it."""
    if len(choice) != len(tree) + 1:
        raise TreeShapeError(f"choice must hold 1 + N = {len(tree) + 1} tokens for a tree of "
                             f"{len(tree)} nodes; got {len(choice)}")
    node, path = ROOT, []
    while True:
        want = int(choice[node + 1])
        nxt = next((c for c in tree.children(node) if tree.tokens[c] == want), None)
        if nxt is None:
            return TreeVerdict(tuple(path), tuple(tree.tokens[i] for i in path) + (want,))
        path.append(nxt)
        node = nxt


def walk_greedy(target_logits: np.ndarray, tree: Tree) -> TreeVerdict:
    """Greedy. target_logits: (1 + N, vocab). Follow the child equal to the champion's argmax
    (ties to the lowest id) at each row: every emitted token is the champion's argmax after the
    emitted prefix, so the text is champion-only greedy text whatever the tree holds."""
    target_logits = np.asarray(target_logits, dtype=np.float64)
    _check_rows(tree, target_logits, "target_logits")
    return walk_chosen(tree, np.argmax(target_logits, axis=-1))


def walk_replay(target_logits: np.ndarray, tree: Tree, temperature: float,
                gumbel_by_depth: np.ndarray) -> TreeVerdict:
    """Replay. target_logits: (1 + N, vocab); gumbel_by_depth: (D + 1, vocab), row d =
    rng.gumbel(seed, n + d, vocab) for the n committed tokens and D = the tree's depth.

    Each row's champion token is its Gumbel-max sample with the noise of its position (its
    depth), the same noise champion-only sampling uses there; the walk follows the child that
    equals it. Every emitted token is therefore the champion's own replay sample at its position
    given the emitted prefix: the bytes equal champion-only sampling for the seed, whatever the
    tree (a tree that misses only costs speed)."""
    target_logits = np.asarray(target_logits, dtype=np.float64)
    _check_rows(tree, target_logits, "target_logits")
    depth = np.concatenate([[0], tree.depths()])  # (1 + N,) depth of each row
    gumbel_by_depth = np.asarray(gumbel_by_depth, dtype=np.float64)
    if gumbel_by_depth.shape != (int(depth.max()) + 1, target_logits.shape[1]):
        raise TreeShapeError(f"gumbel_by_depth must be (D + 1, vocab) = ({depth.max() + 1}, "
                             f"{target_logits.shape[1]}); got {gumbel_by_depth.shape}")
    return walk_chosen(tree, sample_replay_rows(target_logits, temperature, gumbel_by_depth[depth]))


def walk_rejection(p_target: np.ndarray, tree: Tree, q_sibling: np.ndarray, u_accept: np.ndarray,
                   u_residual: np.ndarray, u_bonus: np.ndarray) -> TreeVerdict:
    """Multi-candidate rejection sampling (recursive rejection sampling over siblings).

    p_target:  (1 + N, vocab) the champion's distributions by row (row 0 the root's)
    q_sibling: (N, vocab) row i = the law node i was drawn from GIVEN its parent's path and its
               earlier siblings. Siblings drawn without replacement from the draft's q (this
               package's drafters, Gumbel-top-k) have q with the earlier siblings removed and
               renormalised; i.i.d. siblings (SpecInfer) have q itself; deterministic ones
               (n-gram) one-hot rows.
    u_accept:  (N,) one uniform per node: rng.uniform(seed, n + depth - 1, STREAM_ACCEPT, rank)
               where rank is the node's index among its siblings
    u_residual, u_bonus: (D + 1,) by the depth d of the node the walk stops at: the emitted
               token's position n + d, (..., STREAM_RESIDUAL) and (..., STREAM_BONUS)

    At the current node, with r = p_target of its row, try its children c_1..c_m in order:
      accept c_j iff u_accept[c_j] * q_j(c_j) < r(c_j)   (q_j = q_sibling[c_j]);
      else r <- normalize(max(r - q_j, 0)) (kept as is when that is all zero: then r == q_j and
      the rejection had probability 0) and try c_{j+1}.
    An accepted child becomes the current node. When every child is rejected, emit a sample of r
    with u_residual[depth]; at a leaf, a sample of its row with u_bonus[depth].

    Why it is exact (Jeon et al. 2024, "Recursive Speculative Decoding", arXiv 2402.14160; for
    i.i.d. siblings Miao et al. 2024, SpecInfer, arXiv 2305.09781): round j is the ordinary
    rejection step of verify.py with target r_j and proposal q_j, where q_j is the true law of
    c_j given everything before it. That step emits c_j with probability min(r_j, q_j) per
    token and otherwise hands over to the residual r_{j+1}, which depends on r_j and q_j only,
    not on c_j; so if the rest of the walk emits r_{j+1}, round j emits r_j (Leviathan et al.
    2023, Theorem 1). By induction from the last round (a direct sample of r_{m+1}) the node
    emits its row's distribution, and after an accepted child the same holds one level down,
    given the path. A naive rule that tests every sibling against the unchanged r over-emits
    tokens the draft likes (tests/test_tree.py shows it failing).
    """
    p_target = np.asarray(p_target, dtype=np.float64)
    q_sibling = np.asarray(q_sibling, dtype=np.float64)
    _check_rows(tree, p_target, "p_target")
    if q_sibling.shape != (len(tree), p_target.shape[1]):
        raise TreeShapeError(f"q_sibling must be (N, vocab) = ({len(tree)}, {p_target.shape[1]})"
                             f"; got {q_sibling.shape}")
    node, depth, path = ROOT, 0, []
    while True:
        r = p_target[node + 1]                                          # (vocab,)
        kids = tree.children(node)
        for c in kids:
            token, q = tree.tokens[c], q_sibling[c]
            if q[token] > 0 and u_accept[c] * q[token] < r[token]:
                break
            residual = np.maximum(r - q, 0.0)
            if residual.sum() > 0:
                r = residual / residual.sum()
        else:
            u = u_residual[depth] if kids else u_bonus[depth]
            last = int(sample_categorical_rows(r[None, :], np.array([u]))[0])
            return TreeVerdict(tuple(path), tuple(tree.tokens[i] for i in path) + (last,))
        path.append(c)
        node, depth = c, depth + 1


def first_branch(tree: Tree, path) -> tuple[int, int]:
    """What a walk that accepted `path` says of the tree's first branch (each node's first
    child, from the root's): (its drafts that were tested, those accepted). Every walk tests a
    node's first child first, against the node's row as it is (rejection: before any
    residual), and takes it where it passes, so the first branch is tested as a chain of the
    same drafts would have been: its drafts accepted while the path follows it, and the next
    one, where there is one, rejected. A drafter's first child is its chain's draft (the
    argmax, the Gumbel-max sample: `draw_siblings`), so a tree cycle teaches the chain's
    acceptance by position (costmodel.py). shaders/tree_walk.wgsl writes the same tests."""
    accepted = 0   # depth-first: node i's first child, where it has one, is node i + 1
    for step in path:
        if step != accepted:
            return accepted + 1, accepted
        accepted += 1
    node = accepted - 1   # the path's last node (ROOT when it is empty)
    return accepted + (accepted < len(tree) and tree.parents[accepted] == node), accepted


def draw_siblings(q_draft: np.ndarray, width: int,
                  gumbel: np.ndarray) -> tuple[list[int], np.ndarray]:
    """Up to `width` distinct siblings drawn without replacement from q_draft (vocab,), by
    Gumbel-top-k: the tokens with the largest log q + g, in that order, are a sequential sample
    without replacement (Kool et al. 2019, arXiv 1903.06059). gumbel: (vocab,) standard Gumbel
    noise (rng.gumbel under the draft's key). Tokens with q = 0 are never drawn, so fewer come
    back when q has fewer than `width` tokens. Returns the tokens and (len, vocab) rows: row j
    is the law of sibling j given the siblings before it (q without them, renormalised), the
    q_sibling rows `walk_rejection` needs. The first sibling is the Gumbel-max sample of q, so
    under replay's noise it is the chain's draft."""
    q_draft = np.asarray(q_draft, dtype=np.float64)
    with np.errstate(divide="ignore"):
        keys = np.log(q_draft) + gumbel                                  # (vocab,); -inf at q = 0
    order = np.argsort(-keys, kind="stable")[: min(width, int((q_draft > 0).sum()))]
    rows = np.empty((len(order), q_draft.shape[0]))
    left = q_draft.copy()
    for j, token in enumerate(order):
        rows[j] = left / left.sum()
        left[token] = 0.0
    return [int(t) for t in order], rows
