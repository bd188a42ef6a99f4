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
(drafters/tree.grow_model_tree says why the draft's cache needs no compaction). The cycle after
is not submitted before this one is read: its first pass feeds the draft what this one emitted,
from the host.
Not here: an `auto` tree (its widths follow the draft's probabilities, so its shape is known only
once drafted) and rejection's (its walk needs the siblings' q rows and the champion's logits):
those grow a depth a pass on the host where the adapter reads synchronously (gpu/tree.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..rules.tree import ROOT
from . import sampling
from .device import Copy
from .draft import GPUDraft, draft_slot
from .recording import Recording

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
    (see the module docstring); its nodes go to rows 1.. of the champion's token list, in
    layout order. None where the draft's cache cannot take the tokens."""
    draft, steps = drafter.inner, b.champion.steps
    kv = draft.model.kv
    draft.ahead = None   # fed from the host from here (its chains restart from the tokens)
    if len(tokens) > kv.max_ctx:
        kv.rollback()
        return None
    draft.catch_up(tokens, draft_slot(0))   # at most a pass of unseen tokens
    feed = tokens[kv.committed:]
    vocab = min(b.vocab, draft.model.config.vocab_size)
    widths = [min(w, vocab) for w in drafter.shape]
    shape = layout(widths, k, min(drafter.max_nodes, room), kv.max_ctx - len(tokens))
    fields = dict(seed=rule.seed, temperature=rule.temperature, mode=rule.mode)
    b.dev.write(draft.feed_tokens, np.asarray(feed, np.uint32))
    pos = kv.append(len(feed))
    base = pos + len(feed) - 1    # the root's row in the draft's cache
    entries = [-1] + [0 if p == ROOT else 1 + p for p in shape.parents]   # from the root
    slot = draft_slot(0)
    steps.set(slot, rows=len(feed), pos=pos, **fields)
    rec.commands.append(pass_plan(b, draft, slot, widths[0], tree=False))
    picks, placed = (len(feed) - 1) * widths[0], 0   # the next depth's first pick; nodes so far
    for d, count in enumerate(shape.levels):
        rec.commands.append(Copy(b.tree_picks, 4 * picks, b.champion.tokens, 4 * (1 + placed),
                                 4 * count))
        placed += count
        if d + 1 == len(shape.levels):
            break
        rec.commands.append(Copy(b.tree_picks, 4 * picks, draft.feed_tokens, 0, 4 * count))
        slot = draft_slot(d + 1)
        pos = kv.append(count)
        steps.set(slot, rows=count, pos=pos, tree=(base, entries[:1 + placed]), **fields)
        rec.commands.append(pass_plan(b, draft, slot, widths[d + 1], tree=True))
        picks = 0
    rec.slots = max(rec.slots, slot + 1)
    draft.calls += len(shape.levels)
    draft.fed_before, draft.drafts_fed = len(feed), 0   # confirm keeps the fed rows only
    return shape


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
