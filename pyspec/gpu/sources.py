"""Draft sources: the ways a cycle's drafts reach the champion's verify pass on the GPU.

Each has one method, `encode(b, rec, tokens, k, rule, limit)`, that records into the cycle's
Recording (gpu/recording.py) the drafting and the pass's input (its tokens and Step), on
backend `b`; it returns the drafts as the accept step needs them (a host Proposal, or None for
drafts that stay on the device). `tokens`: the committed tokens, or None for a cycle recorded
while the one before is in flight (it goes on from what the device holds).
  HostProposal   a drafter on the host (n-gram, a draft model of another vocabulary, the
                 grammar-forced drafts), or none: its tokens (and q rows) go up with the step
                 data.
  DeviceDraft    a draft model (or the champion's first L layers) sampling on the GPU.
  DeviceLookup   n-gram drafts looked up on the GPU (gpu/ngram.py) in a history the cycles
                 before appended from their accept words: the cycle needs nothing from the host,
                 so it goes ahead of the one in flight. Its first dispatch appends the tokens the
                 cycle before emitted, drafts up to k (fewer at the budget `limit` and the
                 context's end) and writes the pass's tokens and Step: positions and row counts
                 follow the GPU's verdict, never the host's guess; the host commits the rows
                 when it reads the cycle.
  TreeLookup     n-gram's tree (--tree) looked up on the GPU the same way (ngram.wgsl's
                 advance_tree): its pass's tokens and tree Step from the device, its walk on the
                 device (gpu/tree.py), so a tree cycle goes ahead as a looked-up chain does; the
                 host books its rows when it reads the cycle.
  FedDraft       a draft model on the GPU fed from the cycle before (gpu/ahead.py): the cycle's
                 first dispatch takes the tokens it emitted, feeds the draft's first step the
                 last m committed tokens and writes every Step of the cycle; it goes ahead too.
  FedTree        a draft model's tree of fixed widths (greedy, replay) fed the same way: the
                 first dispatch also moves the tree passes' Steps (a template from the root) to
                 the root's row, the draft's passes grow it in the cycle (gpu/treedraft.py), the
                 device walks it (gpu/tree.py), and the draft's next cycle feeds the D + 1
                 tokens after the root again (gpu/ahead.py says why).
  FromBefore     a champion-only cycle fed by the token the cycle in flight emits, copied on the
                 device from its accept words (pipelined decoding); that cycle keeps exactly one
                 row whatever its verdict, so its row is committed when this one is recorded.
                 Its Step is copied on the device too (gpu/after.py, as every champion-only
                 cycle's), so it writes nothing from the host.
Not here: the pass and the accept step (gpu/backend.py), the draft's steps (gpu/draft.py).
"""

from __future__ import annotations

import time

import numpy as np

from ..cycle import Proposal, Rule
from . import sampling, treedraft
from .device import Copy
from .draft import GPUDraft, draft_slot, encode_steps, step_copies, step_plan
from .ngram import tree_fields
from .recording import Recording
from .step import SLOT_CHAMPION
from .tree import TreeCycle


class HostProposal:
    """Drafts proposed on the host, or none (drafter None, or k = 0)."""

    def __init__(self, drafter):
        self.drafter = drafter

    def encode(self, b, rec: Recording, tokens: list[int], k: int, rule: Rule,
               limit: int | None = None) -> Proposal:
        d = self.drafter
        proposal = d.propose(tokens, k, rule) if k > 0 and d else Proposal()
        del proposal.tokens[k:], proposal.q_draft[k:]   # a drafter may return fewer, never more
        rec.t_draft = time.perf_counter() - rec.t0
        rec.k = len(proposal.tokens)
        b.kv.rollback()   # a self:L draft left rows here; the champion pass rewrites them
        rec.pos = b.champion.feed([tokens[-1]] + proposal.tokens, SLOT_CHAMPION)
        return proposal


class DeviceDraft:
    """A draft's k steps on the GPU; their tokens are rows 1..k of the champion's token list."""

    def __init__(self, draft: GPUDraft):
        self.draft = draft

    def encode(self, b, rec: Recording, tokens: list[int], k: int, rule: Rule,
               limit: int | None = None) -> None:
        rec.k = encode_steps(b, rec, self.draft, tokens, k, rule)
        rec.on_device = True
        b.kv.rollback()   # a self:L draft left rows here; the champion pass rewrites them
        rec.pos = b.kv.append(rec.k + 1)
        b.dev.write(b.champion.tokens, np.array([tokens[-1]], np.uint32))   # row 0 from the host


def _going_ahead(b, rec: Recording, tokens: list[int] | None, start) -> None:
    """A device-written cycle: no step slot or position from the host; `start(tokens)` begins
    the device's state at a request's first such cycle."""
    rec.slots, rec.pos, rec.looked_up = 0, None, True
    if tokens is not None:
        b.kv.rollback()
        start(tokens)
    else:
        rec.ahead = True


class DeviceLookup:
    """n-gram drafts looked up on the GPU (see the module docstring)."""

    def __init__(self, drafter):
        self.drafter = drafter

    def encode(self, b, rec: Recording, tokens: list[int] | None, k: int, rule: Rule,
               limit: int) -> None:
        lookup = b.lookup()
        _going_ahead(b, rec, tokens, lookup.start)
        if k:
            self.drafter.calls += 1
        rec.commands += [lookup.params_copy(k, limit, rule.seed, rule.temperature, rule.mode),
                         lookup.plan, lookup.step_copy(b.champion.steps, SLOT_CHAMPION)]
        rec.k = k


class TreeLookup:
    """n-gram's tree looked up on the GPU (see the module docstring); `drafter`: a TreeDrafter
    of an n-gram drafter."""

    def __init__(self, drafter):
        self.drafter = drafter

    def encode(self, b, rec: Recording, tokens: list[int] | None, k: int, rule: Rule,
               limit: int) -> None:
        lookup = b.lookup()
        _going_ahead(b, rec, tokens, lookup.start)
        if k:
            self.drafter.inner.calls += 1
        params = lookup.params_copy(k, limit, rule.seed, rule.temperature, rule.mode,
                                    tree=tree_fields(self.drafter))
        rec.commands += [params, lookup.tree_plan,
                         lookup.step_copy(b.champion.steps, SLOT_CHAMPION)]
        rec.k, rec.tree = k, TreeCycle()


class FedDraft:
    """A draft model on the GPU fed from the cycle before (see the module docstring)."""

    def __init__(self, draft: GPUDraft):
        self.draft = draft

    def encode(self, b, rec: Recording, tokens: list[int] | None, k: int, rule: Rule,
               limit: int) -> None:
        _going_ahead(b, rec, tokens, _start(b, self.draft))
        _fed_chain(b, rec, self.draft, k, rule, limit)


class FedTree:
    """A draft model's fixed-width tree (under greedy or replay) fed from the cycle before (see
    the module docstring); `drafter`: a TreeDrafter of a GPUDraft. Where no tree fits (the
    budget, the context, the tokens the next m needs: treedraft.fed_layout), a fed chain."""

    def __init__(self, drafter):
        self.drafter = drafter

    def encode(self, b, rec: Recording, tokens: list[int] | None, k: int, rule: Rule,
               limit: int) -> None:
        draft = self.drafter.inner
        _going_ahead(b, rec, tokens, _start(b, draft))
        shape = treedraft.fed_layout(b, self.drafter, k, limit, *draft.bounds())
        if shape is None:
            return _fed_chain(b, rec, draft, k, rule, limit)
        m, _ = draft.plan_ahead(0, tree_depth=len(shape.levels))   # its template's (warm)
        rec.fed, rec.on_device, rec.k, rec.tree = draft, True, len(shape.levels), TreeCycle()
        feed, depth = b.feed(), len(shape.levels)
        rec.commands += [feed.params_copy(0, m, limit, rule.seed, rule.temperature, rule.mode,
                                          True, tree_depth=depth),
                         feed.plan, feed.steps_copy(b.champion.steps, 1 + depth)]
        treedraft.record(b, rec, draft, shape, treedraft.fixed_widths(b, self.drafter), m)


def _start(b, draft: GPUDraft):
    """What begins a request's first cycle fed on the device from the committed tokens."""
    def start(tokens):
        draft.start_ahead(tokens, draft_slot(0))
        b.feed().start(tokens)
    return start


def _fed_chain(b, rec: Recording, draft: GPUDraft, k: int, rule: Rule, limit: int) -> None:
    """A fed cycle's k draft steps (a champion-only cycle's first step where m would pass a
    pass), its Params and Steps from the device (gpu/ahead.py)."""
    feed = b.feed()
    rec.fed, rec.on_device, rec.k = draft, True, k
    m, runs = draft.plan_ahead(k)
    steps = max(k, int(runs))
    params = feed.params_copy(k, m, limit, rule.seed, rule.temperature, rule.mode,
                              one_hot=rule.mode != "rejection" or k == 0)
    rec.commands += [params, feed.plan, feed.steps_copy(b.champion.steps, 1 + steps)]
    draft.calls += k
    for i in range(steps):
        rec.commands.append(step_plan(b, draft, draft_slot(i), rule.mode))
        rec.commands += step_copies(b, draft, i, k, m - 1 if i == 0 else 0, rule.mode)


class FromBefore:
    """A champion-only cycle fed by the token of the cycle in flight (see the module docstring)."""

    def encode(self, b, rec: Recording, tokens, k: int, rule: Rule,
               limit: int | None = None) -> Proposal:
        rec.ahead = True
        rec.pos = b.kv.append(1)
        rec.commands.append(Copy(b.out, 4 * sampling.ACCEPT_TOKENS, b.champion.tokens, 0, 4))
        return Proposal()
