"""Token trees on the GPU (--tree): a tree cycle's drafts and pass input, its readback and walk,
and the accepted path's cache rows moved into place.

  draft    the tree comes from drafters/tree.TreeDrafter: n-gram's trie on the host, or a GPU
           draft model grown a depth a pass (DraftForward: each pass's logits read back, so
           only where the adapter reads synchronously), cut to the rows one pass carries
           (ROWS_MAX - 1 nodes) and to the context's end; the pass feeds
           [t_{n-1}] + the nodes with each row's parent in its Step (step.pack_step,
           FLAG_TREE), so the champion's one pass puts node i at position n + depth - 1 and its
           K and V at cache row n + i, and each row attends to the committed rows and its own
           ancestors only, in position order (shaders/attention.wgsl): its logits are
           bit-identical to its path's verified as a chain (tests/test_gpu_tree.py).
  accept   the pass's (1 + N, vocab) logits rows are copied into the backend's host-accept
           buffer and read back; cycle.tree_verdict walks them on the host by the request's
           rule, as the CPU executor does (greedy, replay and rejection exact alike).
  commit   the root's and the accepted path's rows are kept: the path's K and V rows move to the
           rows after the root (shaders/kv_compact.wgsl, one dispatch per layer: O(accepted)
           row copies where a chain moves a pointer), recorded at the front of the next
           submission (`Compaction.pending`), so a cycle stays one submission.
Tree cycles are read one at a time: the next tree is drafted on the host after the tokens this
one emits, so none goes ahead of the one in flight (chains keep their pipelining).
Not here: the rules (rules/tree.py), the drafts (drafters/tree.py), the pass (model.py).
"""

from __future__ import annotations

import time

import numpy as np

from ..cycle import Proposal, Rule, TreeProposal, tree_verdict
from ..rules.tree import Tree
from .constants import ROWS_MAX, WG
from ..drafters.tree import grow_model_tree
from .device import Copy
from .draft import GPUDraft, draft_slot
from .recording import Recording
from .step import SLOT_CHAMPION


class DraftForward:
    """A GPU draft model as drafters/tree.grow_model_tree's `model`: each forward is one pass
    whose logits are read back at once (an adapter that reads synchronously: native.py): the
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
    """A TreeDrafter's tree at most k deep: a GPU draft model's grown here (DraftTree),
    n-gram's on the host."""
    if k <= 0:
        return Proposal()
    inner = drafter.inner
    if not isinstance(inner, GPUDraft):
        return drafter.propose(tokens, k, rule)
    inner.ahead = None   # fed from the host from here (its chains restart from the tokens)
    inner.catch_up(tokens, draft_slot(0))   # at most a pass of unseen tokens
    return grow_model_tree(DraftTree(inner), tokens, drafter.shape, k, rule, drafter.max_nodes)


class TreeSource:
    """A draft source (gpu/sources.py) for a TreeDrafter: a host tree verified in one pass."""

    def __init__(self, drafter):
        self.drafter = drafter

    def encode(self, b, rec: Recording, tokens: list[int], k: int, rule: Rule,
               limit: int | None = None) -> Proposal | TreeProposal:
        proposal = propose(self.drafter, tokens, k, rule)
        room = min(ROWS_MAX - 1, b.kv.max_ctx - len(tokens))   # nodes after row n - 1
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
        rec.tree = proposal
        base = b.kv.length
        rec.pos = b.champion.feed([tokens[-1], *tree.tokens], SLOT_CHAMPION,
                                  tree=(base, tree.row_parents()))
        return proposal


def gather(b, rec: Recording, tokens: list[int], rule: Rule) -> Copy:
    """The copy of the pass's logits rows into the host-accept buffer (read back whole)."""
    rec.host = (rec.tree, list(tokens), rule)
    return Copy(b.champion.logits, 0, b.host_rows, 0, readback_bytes(b.vocab, rec))


def readback_bytes(vocab: int, rec: Recording) -> int:
    return 4 * (1 + len(rec.tree.tree)) * vocab


def verdict(b, rec: Recording, raw: bytes):
    """(the verdict, the rows to keep: the root's and the accepted path's cache rows)."""
    proposal, tokens, rule = rec.host
    rows = 1 + len(proposal.tree)
    logits = np.frombuffer(raw, np.float32, rows * b.vocab).reshape(rows, b.vocab)
    found, path = tree_verdict(rule, logits.astype(np.float64), proposal, len(tokens))
    return found, [rec.pos] + [rec.pos + 1 + i for i in path]


class Compaction:
    """A model's compaction of an accepted path: per layer, one kv_compact dispatch over its K
    and V caches, with the moves in one uniform the host writes per tree cycle."""

    def __init__(self, model):
        self.model = model
        cfg = model.config
        self.row4 = cfg.n_kv_heads * cfg.head_dim // 4
        self.params = model.dev.uniform(np.zeros(4 + ROWS_MAX, np.uint32), "kv_compact")
        self.plan = [model.dev.dispatch("kv_compact", "kv_compact", [self.params, k, v],
                                        -(-self.row4 // WG))
                     for k, v in zip(model.k_cache, model.v_cache)]
        self.pending: list = []   # the moves the next submission begins with

    def move(self, rows: list[int]) -> None:
        """Commit the cache rows `rows` (the root's, then the path's), moved after the
        committed ones; their dispatches wait in `pending` for the next submission."""
        kv = self.model.kv
        if self.pending:   # no submission took the last moves (this uniform is rewritten now)
            self.model.dev.submit(self.take())
        src = rows[1:]
        kv.compact(rows)   # the bookkeeping (it checks the rows)
        if not src or src == list(range(rows[0] + 1, rows[0] + 1 + len(src))):
            return   # the path is the first rows already: nothing moves
        fields = np.zeros(4 + ROWS_MAX, np.uint32)
        fields[:3] = len(src), rows[0] + 1, self.row4
        fields[4:4 + len(src)] = src
        self.model.dev.write(self.params, fields)
        self.pending = list(self.plan)

    def take(self) -> list:
        """The dispatches waiting for a submission (then none)."""
        out, self.pending = self.pending, []
        return out
