"""A draft model's tree grown on the device (--tree W1,W2,... with a GPU draft, greedy or replay):
every depth's frontier drafted in one batched draft pass, all of them recorded into the cycle's
one submission, so a tree cycle costs one submission and one small readback, as a chain's does.

The widths fix the tree's shape before any token is known (`layout`: drafters/tree.py's growth
of the same widths, without its tokens), so the host records every pass at once:
  pass 0     the draft's unseen tokens as a chain (the last is the tree's root, t_{n-1}); then
             topk_rows (shaders/topk.wgsl) picks the w_1 children of its last row on the device
             (greedy: its top-w ids, ties to the lowest; replay: the Gumbel-top-w of the noise
             of that position, drafters/tree._children's own rule);
  depth d    the nodes of depth d (their tokens copied from the picks into the draft's feed), one
             row each, under their parents by the Step's table from the root; topk_rows picks
             each row's w_{d+1} children, and so on.
Copies put each depth's picks into the champion's token list too: the pass carries the nodes
breadth-first (every parent before its children, all the tree pass needs), and the device walks
them (gpu/tree.py). The draft's tree rows stay pending and are dropped by its confirm
(drafters/tree.grow_model_tree says why the draft's cache needs no compaction). Fed from the
host (`encode`), the cycle after is not submitted before this one is read: its first pass feeds
the draft what this one emitted. Fed on the device (gpu/ahead.py, sources.FedTree: where the
draft's chains are), it is: the tree is the full one of its depth (`full_layouts`, whose Steps the
device holds as templates), its first pass feeds the m tokens the cycles before left unfed, and
the cycle after feeds the D + 1 after its root.
Not here: an `auto` tree (its widths follow the draft's probabilities, so its shape is known only
once drafted) and rejection's (its walk needs the siblings' q rows and the champion's logits):
those grow a depth a pass on the host where the adapter reads synchronously (gpu/tree.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..rules.tree import ROOT
from . import sampling
from .constants import ROWS_MAX
from .device import Copy
from .draft import GPUDraft, draft_slot
from .recording import Recording
from .step import STEP_WORDS, pack_step

DEVICE_MODES = ("greedy", "replay")   # the modes whose draft trees grow on the device


@dataclass(frozen=True)
class Layout:
    """A tree's shape, its nodes breadth-first."""

    parents: tuple[int, ...]   # (N,) each node's parent node: ROOT or an earlier node
    levels: tuple[int, ...]    # nodes per depth, from depth 1


def layout(widths, depth: int, max_nodes: int, draft_room: int) -> Layout:
    """The tree drafters/tree.grow_model_tree grows with fixed `widths` (each at most the
    vocabulary) at most `depth` deep: w_d children under every node of depth d - 1, breadth
    first, until `max_nodes`; no deeper once a depth's nodes would not fit the `draft_room`
    rows left in the draft's cache."""
    parents: list[int] = []
    levels: list[int] = []
    frontier = [ROOT]
    for d in range(min(len(widths), depth)):
        new = []
        for parent in frontier:
            for _ in range(widths[d]):
                if len(parents) < max_nodes:
                    parents.append(parent)
                    new.append(len(parents) - 1)
        if not new:
            break
        levels.append(len(new))
        if draft_room < len(new):
            break
        draft_room -= len(new)
        frontier = new
    return Layout(tuple(parents), tuple(levels))


def grows(b, drafter, rule) -> bool:
    """Whether a TreeDrafter's trees grow on the device of backend `b` under `rule`."""
    return (b.paths.device_trees and isinstance(drafter.inner, GPUDraft)
            and drafter.shape != "auto" and rule.mode in DEVICE_MODES)


def encode(b, rec: Recording, drafter, tokens: list[int], k: int, rule,
           room: int) -> Layout | None:
    """Record a TreeDrafter's tree at most k deep and `room` nodes for the committed `tokens`
    (see the module docstring), fed from the host; its nodes go to rows 1.. of the champion's
    token list, in layout order. None where the draft's cache cannot take the tokens."""
    draft = drafter.inner
    kv = draft.model.kv
    draft.ahead = None   # fed from the host from here (its chains restart from the tokens)
    if len(tokens) > kv.max_ctx:
        kv.rollback()
        return None
    draft.catch_up(tokens, draft_slot(0))   # at most a pass of unseen tokens
    feed = tokens[kv.committed:]
    widths = fixed_widths(b, drafter)
    shape = layout(widths, k, min(drafter.max_nodes, room), kv.max_ctx - len(tokens))
    b.dev.write(draft.feed_tokens, np.asarray(feed, np.uint32))
    pos = kv.append(len(feed))
    kv.append(sum(shape.levels[:-1]))   # the depth passes' rows
    for d, fields in enumerate(pass_steps(shape, len(feed), pos + len(feed) - 1)):
        b.champion.steps.set(draft_slot(d), seed=rule.seed, temperature=rule.temperature,
                             mode=rule.mode, **fields)
    rec.slots = max(rec.slots, record(b, rec, draft, shape, widths, len(feed)))
    draft.fed_before, draft.drafts_fed = len(feed), 0   # confirm keeps the fed rows only
    return shape


def fed_layout(b, drafter, k: int, limit: int, least: int, most: int) -> Layout | None:
    """The tree of a cycle fed on the device (gpu/ahead.py) that starts from `least` to `most`
    committed tokens (the cycles in flight decide): the full tree of its depth (`full_layouts`:
    the one whose template the device holds) at most k deep and at most `least` (the m = D + 1
    after it feeds rows from t_{n-m}: gpu/ahead.py), that fits the budget (`limit` tokens) and
    the caches whichever the start; None where none does (the cycle drafts a chain)."""
    depth = min(k, least, limit - most - 1, b.kv.max_ctx - most)
    fits = [shape for d, shape in full_layouts(b, drafter).items() if d <= depth
            and most + len(shape.parents) <= min(b.kv.max_ctx, drafter.inner.model.kv.max_ctx)]
    return fits[-1] if fits else None


def full_layouts(b, drafter) -> dict[int, Layout]:
    """{D: the tree D deep} of a TreeDrafter's widths, cut by no cache: those whose cycles go
    ahead (cached on `b`)."""
    widths = fixed_widths(b, drafter)
    key = ("tree_layouts", tuple(widths), drafter.max_nodes)
    if key not in b.draft_plans:
        shapes = (layout(widths, d, min(drafter.max_nodes, ROWS_MAX - 1), ROWS_MAX)
                  for d in range(1, len(widths) + 1))
        b.draft_plans[key] = {len(shape.levels): shape for shape in shapes}
    return b.draft_plans[key]


def template(shape: Layout) -> np.ndarray:
    """(1 + D, STEP_WORDS) a fed tree cycle's Steps, D deep, packed with the root at row 0
    and no seed, temperature or mode (the device gives the request's): slot 0 the champion's
    tree pass (gpu/tree.accept's), slot 1 + d draft pass d (pass 0's left zero: the device
    writes it, a chain of m rows)."""
    parents = [ROOT] + [p + 1 for p in shape.parents]
    out = [pack_step(len(parents), 0, tree=(0, parents)), np.zeros(STEP_WORDS, np.uint32)]
    out += [pack_step(**step) for step in pass_steps(shape, 1, 0)[1:]]
    return np.stack(out)


def pass_steps(shape: Layout, feed: int, base: int) -> list[dict]:
    """Per draft pass d (slot draft_slot(d)), its Step's rows, pos and tree, for a tree rooted
    at cache row `base`, the last of the `feed` rows pass 0 feeds as a chain: depth d's nodes
    follow at the rows after the nodes before them, each under its parent by the table."""
    entries = [-1] + [0 if p == ROOT else 1 + p for p in shape.parents]   # from the root
    out, placed = [dict(rows=feed, pos=base + 1 - feed)], 0
    for count in shape.levels[:-1]:
        placed += count
        out.append(dict(rows=count, pos=base + 1 + placed - count,
                        tree=(base, entries[:1 + placed])))
    return out


def record(b, rec: Recording, draft: GPUDraft, shape: Layout, widths, feed: int) -> int:
    """The tree's draft passes (their Steps set apart) and the copies of their picks, pass 0
    feeding `feed` rows; returns the step slots they use."""
    rec.commands.append(pass_plan(b, draft, draft_slot(0), widths[0], tree=False))
    picks, placed = (feed - 1) * widths[0], 0   # the next depth's first pick; nodes so far
    for d, count in enumerate(shape.levels):
        rec.commands.append(Copy(b.tree_picks, 4 * picks, b.champion.tokens, 4 * (1 + placed),
                                 4 * count))
        placed += count
        if d + 1 == len(shape.levels):
            break
        rec.commands.append(Copy(b.tree_picks, 4 * picks, draft.feed_tokens, 0, 4 * count))
        rec.commands.append(pass_plan(b, draft, draft_slot(d + 1), widths[d + 1], tree=True))
        picks = 0
    draft.calls += len(shape.levels)
    return draft_slot(len(shape.levels) - 1) + 1


def fixed_widths(b, drafter) -> list[int]:
    """A TreeDrafter's widths, each at most the vocabulary."""
    vocab = min(b.vocab, drafter.inner.model.config.vocab_size)
    return [min(w, vocab) for w in drafter.shape]


def pass_plan(b, draft: GPUDraft, slot: int, width: int, tree: bool) -> list:
    """One draft pass on `slot` fed from its feed buffer and its topk_rows into b.tree_picks
    (cached on `b` per slot, width and whether the pass is a tree's)."""
    key = ("tree", id(draft), slot, width, tree)
    if key not in b.draft_plans:
        model = draft.model
        plan = list(model.forward_dispatches(slot, draft.layers, draft.feed_tokens, tree=tree))
        plan += sampling.topk_rows(b.dev, model.logits, b.tree_picks,
                                   b.champion.steps.binding(slot),
                                   vocab=model.config.vocab_size, width=width,
                                   split=b.split_rows)
        b.draft_plans[key] = plan
    return b.draft_plans[key]
