"""Model drafts: an independent small model with its own cache, and `self:L`, the champion's own
first L layers plus its final norm and head, sharing the champion's cache for those layers.

Both run the forward with exact=False (plain BLAS, fast one-token products): a draft's numbers
only steer proposals. The self:L draft writes its rows into the champion's cache at pending
positions; the champion's verify pass appends at the same positions and overwrites every one of
them before attention reads them, so the champion's committed rows never see draft arithmetic.
"""

from __future__ import annotations

import time

from ..cpu.model import Model, prefill
from ..cycle import Proposal, Rule, draft_rows_kept
from ..kv import KVCache


def _draft_steps(model: Model, kv: KVCache, feed: list[int], tokens: list[int], k: int,
                 rule: Rule, n_layers: int | None = None) -> Proposal:
    """Feed `feed` (the tokens the draft has not seen), then propose up to k tokens after the
    committed `tokens` (the first at position len(tokens); with the drafts so far they are the
    context the request's processors see). Leaves its rows pending in kv: those of `feed` and
    of every proposed token but the k-th (min(len(tokens), k - 1) drafts fed)."""
    out, position = Proposal(), len(tokens)
    logits = model.forward(feed, kv, n_layers=n_layers, last_only=True, exact=False)[0]  # (vocab,)
    for i in range(k):
        token, q_row, confidence = rule.choose(logits, position + i, tokens + out.tokens)
        if rule.stops(confidence):
            break
        out.tokens.append(token)
        out.q_draft.append(q_row)
        if i + 1 < k:  # the last draft token is never fed: its logits would not be used
            logits = model.forward([token], kv, n_layers=n_layers, exact=False)[0]
    return out


# Tokens a draft is fed at a cycle's start when it drafted the cycle before: the last committed
# one, and after a full acceptance the last draft's (model_draft.ModelDrafter.propose).
STEADY_FEED = 2


class ModelDrafter:
    """An independent draft model. Its cache holds a prefix of the committed sequence; each
    cycle feeds the tokens it has not seen yet (the last committed one, and after a full
    acceptance also the last draft and the bonus)."""

    kind = "model"

    def __init__(self, model: Model, max_ctx: int | None = None):
        self.model = model
        self.name = f"model:{model.source}"
        self.kv = model.new_cache(max_ctx)
        self.fed_before = 0        # pending rows of committed tokens fed by the last proposal
        self.drafts_fed = 0        # ... and of its drafts
        self.calls = 0
        self.catch_up_s = 0.0      # seconds the last proposal spent catching up (not drafting)

    @property
    def weight_bytes(self) -> int:
        return self.model.weight_bytes

    @property
    def kv_bytes(self) -> int:
        return self.kv.nbytes

    def reset(self, tokens: list[int]) -> None:
        self.kv.truncate(0)
        if len(tokens) <= self.kv.max_ctx:  # else this prompt is too long for the draft
            prefill(self.model, self.kv, tokens, exact=False)

    def propose(self, tokens: list[int], k: int, rule: Rule) -> Proposal:
        self.kv.rollback()
        self.fed_before = self.drafts_fed = 0
        feed = tokens[self.kv.committed:]
        if self.kv.committed + len(feed) + k - 1 > self.kv.max_ctx:
            return Proposal()  # the draft's context is full: the champion goes on alone
        self.catch_up_s = 0.0
        if len(feed) > STEADY_FEED:
            # Tokens committed while it drafted nothing (the guard had it off): fed and committed
            # ahead of the steps, and timed apart, so that the guard's time per draft token is a
            # step's, not the catch-up of every cycle it sat out (on the numpy engine a probe
            # after 16 such cycles had put a step at 15-28 ms instead of about 7).
            t0, catch = time.perf_counter(), feed[:-STEADY_FEED]
            self.model.forward(catch, self.kv, logits_from=len(catch), exact=False)
            self.kv.commit(len(catch))
            feed = feed[-STEADY_FEED:]
            self.catch_up_s = time.perf_counter() - t0
        out = _draft_steps(self.model, self.kv, feed, tokens, k, rule)
        self.fed_before, self.drafts_fed = len(feed), min(len(out.tokens), k - 1)
        self.calls += 1 + self.drafts_fed
        return out

    def confirm(self, n_accepted: int) -> None:
        self.kv.commit(draft_rows_kept(self.fed_before, self.drafts_fed, n_accepted))
        self.fed_before = self.drafts_fed = 0


class SelfDrafter:
    """The champion's first L layers + final norm + head, sharing the champion's cache."""

    kind = "self"

    def __init__(self, champion: Model, champion_kv: KVCache, layers: int):
        self.model = champion
        self.kv = champion_kv
        self.layers = layers
        self.name = f"self:{layers}"
        self.weight_bytes = 0   # shares the champion's weights
        self.kv_bytes = 0       # ... and its cache
        self.calls = 0

    def reset(self, tokens: list[int]) -> None:
        pass

    def propose(self, tokens: list[int], k: int, rule: Rule) -> Proposal:
        # The champion's cache holds every committed token but the last one.
        out = _draft_steps(self.model, self.kv, tokens[-1:], tokens, k, rule,
                           n_layers=self.layers)
        self.calls += 1 + min(len(out.tokens), k - 1)
        return out

    def confirm(self, n_accepted: int) -> None:
        pass  # no cache of its own: the champion's verify pass rewrote and committed the rows
