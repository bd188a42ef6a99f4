"""The numpy executor: the champion and its drafter on the CPU, each cycle step run as it is called.

This is the reference every GPU path is judged by. Its drafts are host tokens (a Proposal), the
champion pass keeps its logits (k+1, vocab) on the host and the accept step applies verify.py's
rule through `cycle.Rule.verdict`, so the handle `submit` returns already holds the verdict.
Not here: the cycle's order (cycle.py), the loop (engine.py), the forward (model.py).
"""

from __future__ import annotations

import asyncio
import time

from ..cycle import Executor, Outcome, Rule
from ..drafters import Proposal, make_drafter
from .fastcpu import one_blas_thread
from .model import Model

# Prompt rows per prefill block: a cancel is noticed between blocks. Rows are computed in the
# same 8-row tiles whatever the block (model.matmul), so blocking changes no row.
PREFILL_BLOCK = 32


class CPUBackend(Executor):
    adapter = adapter_class = "cpu-numpy"   # the numpy engine's name and its receipt class

    def __init__(self, champion: Model, draft="ngram", max_ctx: int | None = None,
                 load_draft=None):
        """`draft` is a --draft spec (drafters.parse_draft) or a drafter object;
        `load_draft(path)` loads a draft model's GGUF (load.load_draft_checked)."""
        self.champion = champion
        self.kv = champion.new_cache(max_ctx)
        self.drafter = self._take(make_drafter(draft, champion, self.kv, load_draft)
                                  if isinstance(draft, str) else draft)
        self.timing: dict = {}
        self._logits = None        # (k+1, vocab) of the last champion pass
        self._t0 = self._t1 = 0.0  # start of the cycle, end of its drafting
        self._catch_up = 0.0       # ... of which the draft's catch-up (Outcome.t_catch_up)
        self._done: Outcome | None = None  # the verdict of the cycle being encoded

    async def prefill(self, prompt: list[int], start: int = 0, should_stop=None) -> None:
        """Commit the rows of prompt[start:-1] after the `start` rows kept (they hold
        prompt[:start]), PREFILL_BLOCK rows at a time. When should_stop() says so between blocks
        it stops there: the rows committed so far stay valid, and the drafter is not reset."""
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
        with one_blas_thread():           # a draft model prefills here (draft(), below)
            self._reset_drafters(prompt)

    def draft(self, tokens: list[int], k: int, rule: Rule) -> Proposal:
        self._t0 = time.perf_counter()
        # A draft model's products on one OpenBLAS thread, as the champion's (fastcpu): on two
        # shared cores the default two threads made a draft step 40x slower under load.
        with one_blas_thread():
            proposal = (self.drafter.propose(tokens, k, rule) if k > 0 and self.drafter
                        else Proposal())
        del proposal.tokens[k:], proposal.q_draft[k:]  # a drafter may return fewer, never more
        self._t1 = time.perf_counter()
        self._catch_up = getattr(self.drafter, "catch_up_s", 0.0) if k > 0 else 0.0
        return proposal

    def champion_pass(self, last: int, drafts: Proposal) -> None:
        self.kv.rollback()  # a self:L draft leaves rows here; this pass rewrites them
        self._logits = self.champion.forward([last] + drafts.tokens, self.kv)  # (k+1, vocab)

    def accept(self, drafts: Proposal, tokens: list[int], rule: Rule) -> None:
        q_draft = drafts.q_matrix(self._logits.shape[1]) if rule.mode == "rejection" else None
        verdict = rule.verdict(self._logits, drafts.tokens, q_draft, tokens)
        self._done = Outcome(verdict, len(drafts.tokens), self._t1 - self._t0 - self._catch_up,
                             time.perf_counter() - self._t1, t_catch_up=self._catch_up)

    def submit(self) -> Outcome:
        return self._done

    async def read(self, handle: Outcome) -> Outcome:
        return handle
