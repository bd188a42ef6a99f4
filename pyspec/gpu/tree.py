"""Token trees on the GPU (--tree): a tree cycle's drafts and pass input, its readback and walk,
and the accepted path's cache rows moved into place.

  draft    the tree comes from the host drafter (drafters/tree.TreeDrafter), cut to the rows one
           pass carries (ROWS_MAX - 1 nodes) and to the context's end; the pass feeds
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
from .device import Copy
from .recording import Recording
from .step import SLOT_CHAMPION


class TreeSource:
    """A draft source (gpu/sources.py) for a TreeDrafter: a host tree verified in one pass."""

    def __init__(self, drafter):
        self.drafter = drafter

    def encode(self, b, rec: Recording, tokens: list[int], k: int, rule: Rule,
               limit: int | None = None) -> Proposal | TreeProposal:
        proposal = self.drafter.propose(tokens, k, rule) if k > 0 else Proposal()
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
