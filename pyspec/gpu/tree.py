"""Token trees on the GPU (--tree): a tree cycle's drafts and pass input, its walk and what it
reads back, and the accepted path's cache rows moved into place.

  draft    the tree comes from drafters/tree.TreeDrafter: n-gram's trie, looked up on the device
           (ngram.wgsl's advance_tree: sources.TreeLookup) where its cycles go ahead, else on
           the host; a GPU draft model's of fixed widths under greedy or replay grown on the
           device, every depth's frontier in one batched draft pass inside the cycle's
           submission (treedraft.py); other draft-model trees (`auto`, rejection) grown a depth
           a pass with each pass's logits read back at once (DraftForward: only where the adapter
           reads synchronously, GPUBackend.tree_refusal). The tree is cut to the rows one pass
           carries (ROWS_MAX - 1 nodes) and to the context's end; the pass feeds [t_{n-1}] + the
           nodes with each row's parent in its Step (step.pack_step, FLAG_TREE), so the
           champion's one pass puts node i at position n + depth - 1 and its K and V at cache
           row n + i, and each row attends to the committed rows and its own ancestors only, in
           position order (shaders/attention.wgsl): its logits are bit-identical to its path's
           verified as a chain (tests/test_gpu_tree.py). A parent before its children is all
           the pass needs: host trees ride depth-first, device trees in the order they grew.
  accept   greedy and replay (CHOSEN_MODES): argmax_rows reduces each row to its choice (the
           argmax, or the replay sample keyed by the row's depth) and tree_walk.wgsl walks them
           (rules/tree.walk_chosen), writing the accept words (n_accepted, the emitted tokens:
           the layout the device's n-gram history reads) and the path's moves; only those
           ACCEPT_WORDS + MOVES_WORDS words come back. Rejection: the (1 + N, vocab) logits rows
           come back whole (its walk needs every row's distribution and the siblings' q rows),
           walked by cycle.tree_verdict on the host as the CPU executor does.
  commit   the root's and the accepted path's rows are kept: the path's K and V rows move to the
           rows after the root (shaders/kv_compact.wgsl, one dispatch per layer: O(accepted)
           row copies where a chain moves a pointer), recorded at the front of the next
           submission (`Compaction.pending`), so a cycle stays one submission. A walk on the
           device wrote the moves itself, so the next cycle may be submitted before this one is
           read: n-gram's looked-up trees go ahead as its chains do (gpu/backend.py, "Going
           ahead"), and so do a draft model's fixed-width trees fed on the device (gpu/ahead.py,
           sources.FedTree: the next cycle's first pass takes the tokens the walk emitted from
           its words and feeds the draft again every row after the tree's root).
Not here: the rules (rules/tree.py), the drafts (drafters/tree.py, treedraft.py, ngram.py), the
pass (model.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..cycle import Proposal, Rule, TreeProposal, tree_verdict
from ..drafters.ngram import NgramDrafter
from ..drafters.tree import grow_model_tree
from ..rules import verify
from ..rules.tree import ROOT, Tree, first_branch
from . import treedraft
from .constants import (ACCEPT_N_ACCEPTED, ACCEPT_TESTS, ACCEPT_TOKENS, ACCEPT_WORDS, NONE,
                        ROWS_MAX, WG)
from .device import Copy
from .draft import GPUDraft, draft_slot
from .ngram import tree_fields
from .recording import Recording
from .step import SLOT_CHAMPION

CHOSEN_MODES = ("greedy", "replay")   # the modes walked from the rows' choices alone
MOVES_WORDS = 4 + ROWS_MAX   # shaders/moves.wgsl's Moves: n, dst, nodes, depth, src (ROWS_MAX,)


class DraftForward:
    """A GPU draft model as drafters/tree.grow_model_tree's `model`, for the trees that do not
    grow on the device (treedraft.grows): each forward is one pass whose logits are read back
    at once (an adapter that reads synchronously: native.py): the
    unseen tokens as a chain (the last is the tree's root), then a depth a pass, each node
    under its parent by the Step's table from the root (step.pack_step)."""

    def __init__(self, draft: GPUDraft):
        self.draft = draft
        self.base, self.parents = 0, [-1]   # the root's cache row; each entry's parent entry

    def forward(self, tokens: list[int], kv, last_only: bool = False, exact: bool = True,
                parents=None) -> np.ndarray:
        """(rows, vocab) logits (the last row only with last_only); `parents`: the cache rows
        the rows hang under (grow_model_tree's), None for a chain."""
        model, slot = self.draft.model, draft_slot(0)
        if parents is None:
            self.base, self.parents, tree = kv.length + len(tokens) - 1, [-1], None
        else:
            self.parents += [int(p) - self.base for p in parents]
            tree = (self.base, self.parents)
        model.feed(tokens, slot, tree)
        model.steps.upload(slot + 1)
        rows, vocab, dev = len(tokens), model.config.vocab_size, model.dev
        readback = dev.stage(model.logits, 4 * rows * vocab)
        plan = model.forward_dispatches(slot, self.draft.layers, tree=tree is not None)
        dev.submit([*plan, readback.copy])
        logits = np.frombuffer(dev.redeem_now(readback), np.float32, rows * vocab)
        return logits.reshape(rows, vocab)[-1:] if last_only else logits.reshape(rows, vocab)


class DraftTree:
    """What grow_model_tree reads and counts of a drafter, over a GPUDraft."""

    def __init__(self, draft: GPUDraft):
        self.draft, self.model, self.kv = draft, DraftForward(draft), draft.model.kv

    def __getattr__(self, name):   # its counters: calls, fed_before, drafts_fed
        return getattr(self.draft, name)

    def __setattr__(self, name, value):
        if name in ("draft", "model", "kv"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.draft, name, value)


def propose(drafter, tokens: list[int], k: int, rule: Rule) -> Proposal | TreeProposal:
    """A TreeDrafter's tree at most k deep drafted on the host: a GPU draft model's grown here
    a depth a pass (DraftTree), n-gram's trie."""
    if k <= 0:
        return Proposal()
    inner = drafter.inner
    if not isinstance(inner, GPUDraft):
        return drafter.propose(tokens, k, rule)
    inner.ahead = None   # fed from the host from here (its chains restart from the tokens)
    inner.catch_up(tokens, draft_slot(0))   # at most a pass of unseen tokens
    return grow_model_tree(DraftTree(inner), tokens, drafter.shape, k, rule, drafter.max_nodes)


@dataclass(eq=False)
class TreeCycle:
    """A tree cycle's drafts as its pass carries them: node i in pass row 1 + i."""

    parents: tuple[int, ...] | None = None  # (N,) each node's parent node (ROOT or an earlier
                                            # one); None: the device wrote the pass's Step
    proposal: TreeProposal | None = None    # drafted on the host: the tree, depth-first (the
                                            # pass's order), with its q rows
    tokens: list[int] | None = None         # the committed tokens (the accept step's)
    rule: Rule | None = None

    @property
    def chosen(self) -> bool:
        """Whether the rows are reduced on the device to their choices and walked there (else
        read back and walked on the host)."""
        return self.rule.mode in CHOSEN_MODES


class TreeSource:
    """A draft source (gpu/sources.py) for a TreeDrafter: its tree verified in one pass."""

    def __init__(self, drafter):
        self.drafter = drafter

    def encode(self, b, rec: Recording, tokens: list[int], k: int, rule: Rule,
               limit: int | None = None) -> Proposal | TreeProposal | None:
        room = min(ROWS_MAX - 1, b.kv.max_ctx - len(tokens))   # nodes after row n - 1
        if k > 0 and room >= 1 and treedraft.grows(b, self.drafter, rule):
            shape = treedraft.encode(b, rec, self.drafter, tokens, k, rule, room)
            if shape is not None:
                rec.k, rec.on_device, rec.tree = len(shape.levels), True, TreeCycle(shape.parents)
                b.kv.rollback()
                rec.pos = b.kv.append(1 + len(shape.parents))
                b.dev.write(b.champion.tokens, np.array([tokens[-1]], np.uint32))   # row 0
                return None
            k = 0
        proposal = propose(self.drafter, tokens, k, rule)
        tree = getattr(proposal, "tree", Tree((), ()))
        rec.t_draft = time.perf_counter() - rec.t0
        b.kv.rollback()
        if not len(tree) or room < 1:   # an empty tree: a champion-only pass
            rec.k = 0
            rec.pos = b.champion.feed([tokens[-1]], SLOT_CHAMPION)
            return Proposal()
        if len(tree) > room:   # a depth-first prefix of a tree is a tree
            proposal = TreeProposal(Tree(tree.tokens[:room], tree.parents[:room]),
                                    proposal.q_sibling[:room])
            tree = proposal.tree
        rec.k = int(tree.depths().max())
        rec.tree = TreeCycle(tree.parents, proposal)
        rec.pos = b.champion.feed([tokens[-1], *tree.tokens], SLOT_CHAMPION)
        return proposal


def accept(b, rec: Recording, tokens: list[int], rule: Rule) -> None:
    """The tree pass's Step (unless the device wrote it), then the verdict. Greedy and replay:
    each row's choice on the device (argmax_rows: the argmax, or the replay sample keyed by the
    row's depth), then the walk (tree_walk.wgsl: rules/tree.walk_chosen), which writes the
    accept words and the path's moves, all that comes back. Rejection: the pass's (1 + N,
    vocab) logits rows, copied into the host-accept buffer, since its walk needs every row's
    distribution and the siblings' q rows."""
    cyc = rec.tree
    cyc.tokens, cyc.rule = list(tokens), rule
    if cyc.parents is not None:
        parents = [ROOT] + [p + 1 for p in cyc.parents]
        b.champion.steps.set(SLOT_CHAMPION, rows=len(parents), pos=rec.pos, seed=rule.seed,
                             temperature=rule.temperature, mode=rule.mode,
                             tree=(rec.pos, parents))
    if not cyc.chosen:
        rows = 1 + len(cyc.parents)
        rec.commands.append(Copy(b.champion.logits, 0, b.host_rows, 0, 4 * rows * b.vocab))
        return
    moves = b.compaction().moves
    rec.commands += [b.choices(), walk_plan(b),
                     Copy(b.out, 0, b.host_rows, 0, 4 * ACCEPT_WORDS),
                     Copy(moves, 0, b.host_rows, 4 * ACCEPT_WORDS, 4 * MOVES_WORDS)]


def walk_plan(b) -> list:
    """tree_walk over the champion pass's Step, choices and tokens (a plan, built once)."""
    if "tree_walk" not in b.draft_plans:
        champ = b.champion
        b.draft_plans["tree_walk"] = [b.dev.dispatch(
            "tree_walk", "tree_walk", [b.compaction().moves, champ.steps.binding(SLOT_CHAMPION),
                                       b.choice, champ.tokens, b.out], 1)]
    return b.draft_plans["tree_walk"]


def warm(b, drafter) -> None:
    """Build the plans a TreeDrafter's cycles run on backend `b` (compiling their pipelines)
    before its first tree cycle, whose time the guard keeps as a tree's (GPUBackend._warm does
    the same for a chain's first cycle)."""
    b.champion.forward_dispatches(SLOT_CHAMPION, tree=True)
    b.choices()
    walk_plan(b)
    if isinstance(drafter.inner, NgramDrafter):
        b.lookup().expect_tree(tree_fields(drafter))
    elif isinstance(drafter.inner, GPUDraft) and drafter.shape != "auto":
        vocab = min(b.vocab, drafter.inner.model.config.vocab_size)
        for d, width in enumerate(drafter.shape):
            treedraft.pass_plan(b, drafter.inner, draft_slot(d), min(width, vocab), tree=d > 0)
        if b.paths.draft_ahead and b.paths.device_trees:   # its trees' Steps, if fed (ahead.py)
            b.feed().trees({d: treedraft.template(shape)
                            for d, shape in treedraft.full_layouts(b, drafter).items()})


def staged(b, rec: Recording) -> tuple[object, int]:
    """(the buffer, the bytes) a tree cycle reads back: the walk's words and moves, or
    rejection's rows."""
    cyc = rec.tree
    if not cyc.chosen:
        return b.host_rows, 4 * (1 + len(cyc.parents)) * b.vocab
    return b.host_rows, 4 * (ACCEPT_WORDS + MOVES_WORDS)


@dataclass(frozen=True)
class Walked:
    """A tree cycle's verdict as read: the verdict, the rows to keep (the root's and the
    accepted path's cache rows), the tree's depth and nodes, whether the device moves the
    rows (its walk wrote the moves) or the host must (`Compaction.move`), and what it says of
    the tree's first branch, the chain it is (rules/tree.first_branch)."""

    verdict: verify.Verdict
    rows: list[int]
    depth: int
    nodes: int
    moved: bool
    chain: tuple[int, int]   # its first branch's drafts tested, and accepted (first_branch)


def verdict(b, rec: Recording, raw: bytes) -> Walked:
    cyc = rec.tree
    if not cyc.chosen:
        rows = 1 + len(cyc.parents)
        logits = np.frombuffer(raw, np.float32, rows * b.vocab).reshape(rows, b.vocab)
        found, path = tree_verdict(cyc.rule, logits.astype(np.float64), cyc.proposal,
                                   len(cyc.tokens))
        return Walked(found, [rec.pos] + [rec.pos + 1 + i for i in path], rec.k, rows - 1,
                      False, first_branch(cyc.proposal.tree, path))
    words = np.frombuffer(raw, np.uint32, ACCEPT_WORDS + MOVES_WORDS)
    n = int(words[ACCEPT_N_ACCEPTED])
    n_moved, dst, nodes, depth = (int(w) for w in words[ACCEPT_WORDS:ACCEPT_WORDS + 4])
    found = verify.Verdict(n, tuple(int(t) for t in words[ACCEPT_TOKENS:ACCEPT_TOKENS + n + 1]))
    src = words[ACCEPT_WORDS + 4:ACCEPT_WORDS + 4 + n_moved]
    tests = words[ACCEPT_TESTS:ACCEPT_TESTS + ROWS_MAX]
    tested = int(np.count_nonzero(tests != NONE))   # passes, then at most one fail, then NONE
    return Walked(found, [dst - 1] + [int(r) for r in src], depth, nodes, True,
                  (tested, int(tests[:tested].sum())))


class Compaction:
    """A model's compaction of an accepted path: per layer, one kv_compact dispatch over its K
    and V caches, with the moves (shaders/moves.wgsl) in a buffer that the host writes after
    its own walk (`move`) or the device's walk wrote (`walked`, then `kept`)."""

    def __init__(self, model):
        self.model = model
        cfg, dev = model.config, model.dev
        row4 = cfg.n_kv_heads * cfg.head_dim // 4
        self.params = dev.uniform(np.array([row4, 0, 0, 0], np.uint32), "kv_compact")
        self.moves = dev.buffer(4 * MOVES_WORDS, label="kv_compact.moves")   # (MOVES_WORDS,)
        self.plan = [dev.dispatch("kv_compact", "kv_compact", [self.params, self.moves, k, v],
                                  -(-row4 // WG))
                     for k, v in zip(model.k_cache, model.v_cache)]
        self.pending: list = []   # the moves the next submission begins with

    def move(self, rows: list[int]) -> None:
        """Commit the cache rows `rows` (the root's, then the path's), moved after the
        committed ones; their dispatches wait in `pending` for the next submission."""
        if self.pending:   # no submission took the last moves (the buffer is rewritten now)
            self.model.dev.submit(self.take())
        src = rows[1:]
        self.kept(rows)
        if not src or src == list(range(rows[0] + 1, rows[0] + 1 + len(src))):
            return   # the path is the first rows already: nothing moves
        fields = np.zeros(MOVES_WORDS, np.uint32)
        fields[:2] = len(src), rows[0] + 1
        fields[4:4 + len(src)] = src
        self.model.dev.write(self.moves, fields)
        self.pending = list(self.plan)

    def walked(self) -> None:
        """A cycle just submitted walks its tree on the device, writing the moves: the next
        submission begins with them, whether or not the cycle has been read by then."""
        self.pending = list(self.plan)

    def kept(self, rows: list[int]) -> None:
        """The bookkeeping of a commit of `rows` (the moves are the device's)."""
        self.model.kv.compact(rows)

    def take(self) -> list:
        """The dispatches waiting for a submission (then none)."""
        out, self.pending = self.pending, []
        return out
