"""The numpy executor: the champion and its drafter on the CPU, each cycle step run as it is called.

This is the reference every GPU path is judged by. Its drafts are host tokens (a Proposal), the
champion pass keeps its logits (k+1, vocab) on the host and the accept step applies verify.py's
rule through `cycle.Rule.verdict`, so the handle `submit` returns already holds the verdict.
A drafter that drafts trees (drafters/tree.TreeDrafter, for --tree) returns a TreeProposal: it
is verified in one pass (cpu/model.py's tree pass), walked (cycle.tree_verdict) and the accepted
path's rows are compacted at commit.
Not here: the cycle's order (cycle.py), the loop (engine.py), the forward (model.py).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from ..cycle import Executor, Outcome, Proposal, Rule, TreeProposal, tree_verdict
from ..rules.tree import ROOT, Tree, first_branch
from .fastcpu import one_blas_thread
from .model import Model

# Prompt rows per prefill block: a cancel is noticed between blocks. Rows are computed in the
# same 8-row tiles whatever the block (model.matmul), so blocking changes no row.
PREFILL_BLOCK = 32


@dataclass
class Cycle:
    """A cycle as the steps run it: its drafter, times, the pass's logits and then its verdict."""

    drafter: object
    t0: float                  # start of the cycle
    t1: float = 0.0            # end of its drafting
    catch_up: float = 0.0      # ... of which the draft's catch-up (Outcome.t_catch_up)
    k: int = 0
    logits: object = None      # (k+1, vocab) of the champion pass
    done: Outcome | None = None


class CPUBackend(Executor):
    # the numpy engine's name, its receipt class and its gate verdicts' device class
    adapter = adapter_class = device_class = "cpu-numpy"
    takes_trees = True   # it verifies a TreeProposal (--tree); the GPU backend does not

    def __init__(self, champion: Model, drafter=None, max_ctx: int | None = None, kv=None):
        """`drafter`: what load.make_drafter built (None: champion-only); `kv`: the champion's
        cache when the drafter was built over it (self:L shares it), else a new one."""
        self.champion = champion
        self.kv = kv if kv is not None else champion.new_cache(max_ctx)
        self.drafter = self._take(drafter)
        self.timing: dict = {}

    async def prefill(self, prompt: list[int], start: int = 0, should_stop=None,
                      drafter=None) -> None:
        """Commit the rows of prompt[start:-1] after the `start` rows kept (they hold
        prompt[:start]), PREFILL_BLOCK rows at a time, and reset the request's `drafter`. When
        should_stop() says so between blocks it stops there: the rows committed so far stay
        valid, and the drafter is not reset."""
        self.kv.truncate(start)
        body = prompt[:-1]
        for i in range(start, len(body), PREFILL_BLOCK):
            if should_stop is not None and i > start:
                await asyncio.sleep(0)     # let a cancel message in
                if should_stop():
                    return
            block = body[i:i + PREFILL_BLOCK]
            self.champion.forward(block, self.kv, last_only=True)
            self.kv.commit(len(block))
        if drafter is not None:
            with one_blas_thread():       # a draft model prefills here (draft(), below)
                drafter.reset(prompt)

    def record(self, drafter, k: int) -> Cycle:
        return Cycle(drafter, time.perf_counter())

    def draft(self, c: Cycle, tokens: list[int], k: int, rule: Rule) -> Proposal | TreeProposal:
        d = c.drafter
        # A draft model's products on one OpenBLAS thread, as the champion's (fastcpu): on two
        # shared cores the default two threads made a draft step 40x slower under load.
        with one_blas_thread():
            proposal = d.propose(tokens, k, rule) if k > 0 and d else Proposal()
        if isinstance(proposal, TreeProposal):
            proposal = self._fit(proposal)
            c.k = int(proposal.tree.depths().max()) if proposal.tokens else 0
        else:
            del proposal.tokens[k:], proposal.q_draft[k:]  # a drafter may return fewer, never more
            c.k = len(proposal.tokens)
        c.t1 = time.perf_counter()
        c.catch_up = getattr(d, "catch_up_s", 0.0) if k > 0 else 0.0
        return proposal

    def _fit(self, proposal: TreeProposal) -> Proposal | TreeProposal:
        """A tree cut to the rows the context has left (a depth-first prefix of a tree is a
        tree); an empty one is an empty chain."""
        room = self.kv.max_ctx - self.kv.committed - 1
        tree = proposal.tree
        if len(tree) > room:
            proposal = TreeProposal(Tree(tree.tokens[:room], tree.parents[:room]),
                                    proposal.q_sibling[:room])
        return proposal if len(proposal.tree) else Proposal()

    def champion_pass(self, c: Cycle, last: int, drafts: Proposal | TreeProposal) -> None:
        self.kv.rollback()  # a self:L draft leaves rows here; this pass rewrites them
        parents = None
        if isinstance(drafts, TreeProposal):   # (1 + N, vocab), node i in row i + 1
            start, rows = self.kv.length, drafts.tree.row_parents()
            parents = np.where(rows == ROOT, start - 1, start + rows)
        c.logits = self.champion.forward([last] + drafts.tokens, self.kv,
                                         parents=parents)   # (k+1, vocab) for a chain

    def accept(self, c: Cycle, drafts: Proposal | TreeProposal, tokens: list[int],
               rule: Rule) -> None:
        rows, nodes, chain = None, 0, None
        if isinstance(drafts, TreeProposal):
            nodes = len(drafts.tree)
            verdict, path = tree_verdict(rule, c.logits, drafts, len(tokens))
            start = self.kv.committed
            rows = [start] + [start + 1 + i for i in path]
            chain = first_branch(drafts.tree, path)
        else:
            q_draft = drafts.q_matrix(c.logits.shape[1]) if rule.mode == "rejection" else None
            verdict = rule.verdict(c.logits, drafts.tokens, q_draft, tokens)
        c.done = Outcome(verdict, c.k, c.t1 - c.t0 - c.catch_up, time.perf_counter() - c.t1,
                         t_catch_up=c.catch_up, rows=rows, nodes=nodes, chain=chain)

    def commit(self, outcome: Outcome, drafter) -> None:
        """A tree cycle keeps the root's and the accepted path's rows, compacted into place
        (KVCache.compact: O(accepted) row copies, not section 5's pointer move); the draft
        model keeps the rows of the tokens it was fed and is fed the path next cycle."""
        if outcome.rows is None:
            return super().commit(outcome, drafter)
        self.kv.compact(outcome.rows)
        if drafter is not None:
            drafter.confirm(outcome.verdict.n_accepted)

    def submit(self, c: Cycle) -> Cycle:
        return c

    async def read(self, c: Cycle) -> Outcome:
        return c.done
