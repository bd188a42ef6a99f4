"""Tree drafts on the CPU: a draft model's tree (children of a node from its logits, one draft
pass per depth over that depth's nodes) and n-gram's tree (the continuations after several
earlier occurrences of the context's end, merged where they share a prefix).

A tree shape is the widths per depth (rules/tree.parse_tree: "2,2,1"), or "auto": children
taken from the draft's confidence (the likeliest tokens until they hold AUTO_MASS of its
probability, at most AUTO_WIDTH, to AUTO_DEPTH, at most AUTO_NODES nodes). Children per mode:
greedy, the draft's top-w; replay and rejection, w draws without replacement by Gumbel-top-k
under the champion's noise of that position (rules/tree.draw_siblings: the first is the chain's
draft), with the conditional rows rejection needs. The walks (rules/tree.py) make any tree exact.

Not here: the walk (rules/tree.py, cycle.tree_verdict), the verify pass (cpu/model.py), the
executor (cpu/executor.py).
"""

from __future__ import annotations

import numpy as np

from ..cycle import Rule, TreeProposal
from ..errors import TreeUnsupportedError
from ..rules import rng, verify
from ..rules.tree import (MAX_TREE_NODES, ROOT, Tree, depth_first_order, draw_siblings,
                          parse_tree, reorder)

AUTO_MASS, AUTO_WIDTH, AUTO_DEPTH, AUTO_NODES = 0.8, 3, 4, 16
TREE_DRAFTERS = ("ngram", "model")   # the drafter kinds TreeDrafter wraps


def _children(logits: np.ndarray, position: int, rule: Rule, width) -> tuple[list, list]:
    """A node's children from the draft's logits (vocab,) at `position`: tokens and q rows."""
    if width == "auto":
        probs = verify.softmax(logits, max(rule.temperature, 1e-6) if rule.mode != "greedy"
                               else 1.0)
        order = np.argsort(-probs, kind="stable")
        width = int(np.searchsorted(np.cumsum(probs[order]), AUTO_MASS) + 1)
        width = min(width, AUTO_WIDTH)
    if rule.mode == "greedy":
        top = np.argsort(-logits, kind="stable")[:width]        # ties to the lowest id
        return [int(t) for t in top], [None] * len(top)
    q = verify.softmax(logits, rule.temperature)                # (vocab,)
    tokens, rows = draw_siblings(q, width, rng.gumbel(rule.seed, position, logits.shape[0]))
    return tokens, list(rows) if rule.mode == "rejection" else [None] * len(tokens)


def _depth_first(tokens: list[int], parents: list[int], rows: list) -> TreeProposal:
    """Nodes listed breadth-first (parents before children) -> the same tree depth-first."""
    order = depth_first_order(parents)
    return TreeProposal(reorder(tokens, parents, order), [rows[i] for i in order])


def grow_model_tree(drafter, tokens: list[int], shape, depth: int, rule: Rule,
                    max_nodes: int = MAX_TREE_NODES) -> TreeProposal:
    """A model drafter's tree after the committed `tokens`, at most `depth` deep and `max_nodes`
    nodes (the pass's rows): its unseen tokens fed as a chain, then one draft pass per depth
    over that depth's nodes, each under its parent (cpu/model.py's tree pass; on the GPU
    gpu/tree.DraftForward; a GPU draft's fixed widths grow on the device instead, the same
    tree: gpu/treedraft.py). Leaves every row pending in the draft's cache; the executor's
    confirm keeps the fed rows only (the accepted path is fed again next cycle, in the pass
    that feeds the bonus token anyway: no compaction of the draft's cache)."""
    model, kv = drafter.model, drafter.kv
    kv.rollback()
    feed = tokens[kv.committed:]
    logits = model.forward(feed, kv, last_only=True, exact=False)        # (1, vocab)
    drafter.fed_before, drafter.drafts_fed = len(feed), 0
    n = len(tokens)
    auto = shape == "auto"
    levels = AUTO_DEPTH if auto else len(shape)
    out_tokens, out_parents, out_rows = [], [], []
    frontier = [(ROOT, kv.length - 1)]        # (node index, its row's slot in the draft cache)
    for d in range(min(levels, depth)):
        width = "auto" if auto else shape[d]
        new = []
        for row, (node, slot) in enumerate(frontier):
            kids, rows = _children(logits[row], n + d, rule, width)
            for t, q in zip(kids, rows):
                if len(out_tokens) >= min(AUTO_NODES if auto else MAX_TREE_NODES, max_nodes):
                    break
                out_tokens.append(t)
                out_parents.append(node)
                out_rows.append(q)
                new.append((len(out_tokens) - 1, slot))
        if not new or d + 1 == min(levels, depth) or kv.length + len(new) > kv.max_ctx:
            break
        start = kv.length
        logits = model.forward([out_tokens[i] for i, _ in new], kv, exact=False,
                               parents=[s for _, s in new])
        frontier = [(i, start + j) for j, (i, _) in enumerate(new)]
        drafter.calls += 1
    drafter.calls += 1
    return _depth_first(out_tokens, out_parents, out_rows)


def ngram_widths(shape) -> tuple[int, ...]:
    """n-gram's widths per depth for a tree `shape`: `auto` has no probabilities to follow, so
    AUTO_WIDTH children at each of AUTO_DEPTH depths."""
    return (AUTO_WIDTH,) * AUTO_DEPTH if shape == "auto" else tuple(shape)


def ngram_tree(tokens: list[int], shape, depth: int, max_n: int = 4,
               max_nodes: int = MAX_TREE_NODES) -> TreeProposal:
    """n-gram's tree: the continuations (up to `depth` tokens) after the latest earlier
    occurrences of the longest suffix (of at most max_n tokens) that occurred before, merged
    into a trie; at most widths[d] children per node at depth d + 1 and `max_nodes` nodes, in
    the order they are added (the latest occurrence first). The GPU drafts the same tree
    (shaders/ngram.wgsl, advance_tree)."""
    widths = ngram_widths(shape)
    depth = min(depth, len(widths))
    arr = np.asarray(tokens)
    for n in range(min(max_n, len(tokens) - 1), 0, -1):
        suffix = arr[-n:]
        ends = [j for j in range(len(tokens) - 1, n - 1, -1)
                if np.array_equal(arr[j - n:j], suffix)]
        if ends:
            break
    else:
        return TreeProposal(Tree((), ()))
    out_tokens, out_parents, index = [], [], {}
    for j in ends:
        node = ROOT
        for d, t in enumerate(tokens[j:j + depth]):
            key = (node, t)
            if key not in index:
                if (sum(1 for p in out_parents if p == node) >= widths[d]
                        or len(out_tokens) >= max_nodes):
                    break
                out_tokens.append(t)
                out_parents.append(node)
                index[key] = len(out_tokens) - 1
            node = index[key]
    return _depth_first(out_tokens, out_parents, [None] * len(out_tokens))


class TreeDrafter:
    """A request's drafter drafting trees of `shape` (rules/tree.parse_tree: widths or "auto")
    instead of chains; everything else (reset, confirm, its counts and names) is the wrapped
    drafter's, an n-gram drafter or a draft model (TREE_DRAFTERS). The engine wraps a request's
    drafter in it for --tree; the executor verifies the TreeProposal it returns."""

    def __init__(self, inner, shape, max_nodes: int = MAX_TREE_NODES):
        self.inner, self.shape, self.max_nodes = inner, shape, max_nodes

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def nodes(self, depth: int) -> int:
        """The most nodes a tree `depth` deep of this shape has (the pass's rows, less one)."""
        if self.shape == "auto":
            return self.max_nodes
        return min(int(np.cumprod(self.shape[:depth]).sum()), self.max_nodes)

    def propose(self, tokens: list[int], depth: int, rule: Rule) -> TreeProposal:
        """A tree at most `depth` deep after the committed `tokens`."""
        if self.inner.kind == "ngram":
            self.inner.calls += 1
            return ngram_tree(tokens, self.shape, depth, max_nodes=self.max_nodes)
        return grow_model_tree(self.inner, tokens, self.shape, depth, rule, self.max_nodes)


def tree_drafter(drafter, tree: str | None, backend, rule: Rule, constraint, kind: str | None):
    """A request's `drafter` drafting trees under its tree option `tree` (a TreeDrafter), or as
    it is without one (or without a drafter). A tree is refused by name where it cannot be
    verified exactly: a `backend` without the tree pass, sampling controls or a schema
    (`constraint`; their rows would need each node's own context, which the tree walk does not
    apply), a drafter of a `kind` that drafts no trees (self:L, a combination), a tree the
    backend cannot draft (its `tree_refusal`). The words are the request's ("tree 2,2,1"), as
    the page shows them; the command line reads them with its flags (apps/request.cli_error,
    the caller's errors.about("tree"))."""
    shape = parse_tree(tree)
    if shape is None or drafter is None:
        return drafter
    if not getattr(backend, "takes_trees", False):
        raise TreeUnsupportedError(
            f"tree needs the tree verify pass, which the {backend.adapter} backend does not "
            "have yet: run with backend cpu (or cpu-numpy), or draft chains (no tree)")
    if rule.processors or constraint is not None:
        raise TreeUnsupportedError("tree does not take sampling controls (top-k, top-p, "
                                   "penalties, logit bias) or a JSON schema yet: leave them out, "
                                   "or draft chains (no tree)")
    kinds = getattr(backend, "tree_kinds", TREE_DRAFTERS)
    if kind not in kinds:
        raise TreeUnsupportedError(f"tree on the {backend.adapter} backend needs a drafter of "
                                   f"kind {' or '.join(kinds)}, not {kind}: draft with ngram"
                                   f"{' or a draft model' if 'model' in kinds else ''}, or "
                                   "draft chains (no tree)")
    refusal = getattr(backend, "tree_refusal", None)
    why = refusal(shape, rule, kind) if refusal is not None else None
    if why:
        raise TreeUnsupportedError(why)
    nodes = int(np.cumprod(shape).sum()) if shape != "auto" else 0
    if nodes > backend.k_max:
        raise TreeUnsupportedError(f"tree {tree} has {nodes} nodes, but one pass of the "
                                   f"{backend.adapter} backend verifies at most {backend.k_max}: "
                                   "use fewer or narrower depths")
    return TreeDrafter(drafter, shape, min(MAX_TREE_NODES, backend.k_max))
