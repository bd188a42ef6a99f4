"""A draft whose steps run on the GPU, and how its k steps are recorded into a cycle.

Step i feeds its token(s), runs the draft forward and samples the token for position n + i on
the GPU (argmax, Gumbel replay, or a q_draft sample); buffer copies carry it into the next
step's input and into row i + 1 of the champion's token list, with no CPU round trip. Step slot
1 + i is draft step i (slot 0 is the champion pass's).
Not here: when the draft runs (gpu/sources.py), the kernels (sampling.py), the forward
(model.py), the device-fed cycles' first dispatch (ahead.py).
"""

from __future__ import annotations

import collections

import numpy as np

from ..cycle import Rule, draft_rows_kept
from ..kv import rows_kept
from ..rules import rng
from . import sampling
from .device import Copy
from .model import GPUModel
from .recording import Recording
from .constants import ROWS_MAX


def draft_slot(i: int) -> int:
    return 1 + i


class GPUDraft:
    """A drafter whose steps run on the GPU: the champion's first L layers (`self:L`, sharing the
    champion's cache) or an independent draft model with its own cache. The engine sees the
    drafter protocol (name, calls, reset, confirm); `encode_steps` records its steps."""

    def __init__(self, model: GPUModel, layers: int | None, name: str, shares_cache: bool):
        self.model = model
        self.layers = layers
        self.name = name
        self.kind = "self" if shares_cache else "model"
        self.shares_cache = shares_cache
        self.weight_bytes = 0 if shares_cache else model.weight_bytes
        self.kv_bytes = 0 if shares_cache else model.kv.nbytes
        self.calls = 0
        self.fed_before = 0     # pending rows of committed tokens fed this cycle
        self.drafts_fed = 0     # ... and of drafts (k - 1: the last draft is never fed)
        self.feed_tokens = model.dev.buffer(ROWS_MAX * 4, label=f"{name}.feed")   # (R,) u32
        self._held: tuple | None = None   # (cache epoch, tokens whose first rows it holds)
        # Cycles fed on the device (gpu/ahead.py): per cycle submitted and not yet confirmed,
        # the m of the cycle after it; None while cycles are fed from the host.
        self.ahead: collections.deque | None = None
        self.feed_rows = 0      # m of the next cycle fed on the device
        self.known = 0          # committed tokens after the cycles confirmed so far
        self.most: collections.deque = collections.deque()

    def reset(self, tokens: list[int]) -> None:
        """A new request for `tokens`: a draft with its own cache keeps the rows the last
        request left that still hold a prefix of them (a conversation's earlier turns, a
        repeated prompt; the forward is batch-invariant, so they are what a prefill would
        write) and prefills the rest."""
        self.fed_before = self.drafts_fed = 0
        self.ahead = None
        kv = self.model.kv
        if not self.shares_cache and len(tokens) <= kv.max_ctx:
            start = rows_kept(kv, *self._held, tokens) if self._held else 0
            self.model.prefill(tokens, draft_slot(0), start)
            self._held = (kv.epoch, tokens)   # the engine's list: it grows as tokens commit

    def confirm(self, n_accepted: int) -> None:
        if self.ahead is not None:   # fed on the device: rows for all but the next cycle's m
            self.known += n_accepted + 1
            self.model.kv.rollback()
            # (after a tree, m = D + 1 may reach below the rows kept so far: they stay valid,
            # fed again with the values they hold)
            kv = self.model.kv
            kv.commit_to(max(kv.committed, self.known - self.ahead.popleft()))
            self.most.popleft()
        elif not self.shares_cache:  # self:L's rows are the champion's, rewritten by its pass
            self.model.kv.commit(draft_rows_kept(self.fed_before, self.drafts_fed, n_accepted))
        self.fed_before = self.drafts_fed = 0

    def catch_up(self, tokens: list[int], slot: int) -> None:
        """Drop the pending rows; where the cache lacks more of the committed `tokens` than a pass
        holds (cycles without drafts do not feed it), prefill them, in a submission of their
        own."""
        kv = self.model.kv
        kv.rollback()
        if len(tokens) - kv.committed > ROWS_MAX:
            self.model.prefill(tokens, slot, kv.committed)

    def start_ahead(self, tokens: list[int], slot: int) -> None:
        """The first cycle fed on the device, for the committed `tokens`: m is what the cache
        lacks after catching up."""
        self.catch_up(tokens, slot)
        self.ahead, self.known = collections.deque(), len(tokens)
        self.most = collections.deque()   # per cycle in flight: the most tokens it emits
        self.feed_rows = len(tokens) - self.model.kv.committed

    def plan_ahead(self, k: int, tree_depth: int | None = None) -> tuple[int, bool]:
        """(m, whether the first step runs) for the next cycle fed on the device with k drafts,
        or a tree `tree_depth` deep; records the m of the cycle after it (gpu/ahead.py: D + 1
        after a tree D deep) and the most tokens the cycle emits (`bounds`)."""
        m = self.feed_rows
        # a champion-only cycle skips the draft while m may grow
        runs = k > 0 or m == ROWS_MAX or tree_depth is not None
        if tree_depth is not None:
            self.feed_rows, k = tree_depth + 1, tree_depth
        else:
            self.feed_rows = 2 if k > 0 else 1 if runs else m + 1
        self.ahead.append(self.feed_rows)
        self.most.append(k + 1)
        return m, runs

    def dropped(self) -> None:
        """The last cycle fed on the device will never be read (the request ended)."""
        self.ahead.pop()
        self.most.pop()

    def bounds(self) -> tuple[int, int]:
        """(least, most) committed tokens the next cycle fed on the device starts from: those
        confirmed, and at least one, at most k + 1, per cycle in flight."""
        return self.known + len(self.ahead), self.known + sum(self.most)


def encode_steps(b, rec: Recording, draft: GPUDraft, tokens: list[int], k: int,
                 rule: Rule) -> int:
    """Record the draft's k steps for the committed `tokens` on backend `b`; returns k (0 when
    the draft's cache is full: the champion goes on alone)."""
    model, steps = draft.model, b.champion.steps
    if draft.shares_cache:
        feed = tokens[-1:]  # the champion's cache holds every committed token but the last
    else:
        if len(tokens) + k - 1 > model.kv.max_ctx:
            model.kv.rollback()
            return 0
        draft.catch_up(tokens, draft_slot(0))
        feed = tokens[model.kv.committed:]
    draft.calls += k
    draft.fed_before, draft.drafts_fed = len(feed), k - 1
    rec.slots = max(rec.slots, draft_slot(k - 1) + 1)
    b.dev.write(draft.feed_tokens, np.asarray(feed, np.uint32))
    for i in range(k):
        rows = len(feed) if i == 0 else 1
        pos = model.kv.append(rows)
        slot = draft_slot(i)
        steps.set(slot, rows=rows, pos=pos, seed=rule.seed, temperature=rule.temperature,
                  mode=rule.mode)
        rec.commands.append(step_plan(b, draft, slot, rule.mode))
        rec.commands += step_copies(b, draft, i, k, rows - 1, rule.mode)
    return k


def step_copies(b, draft: GPUDraft, i: int, k: int, last: int, mode: str) -> list[Copy]:
    """After draft step i of k: the token for position n + i, in row `last` of the step's
    samples, to the champion's token list and (unless it is the last draft) to the draft's
    feed; its confidence and, under rejection, its q row."""
    out = [Copy(b.d_sample, 4 * last, b.champion.tokens, 4 * (1 + i), 4),
           Copy(b.d_conf, 4 * last, b.draft_conf, 4 * i, 4)]
    if mode == "rejection":
        v4 = 4 * b.vocab
        out.append(Copy(b.d_probs, v4 * last, b.q_draft, v4 * i, v4))
    if i + 1 < k:
        out.append(Copy(b.d_sample, 4 * last, draft.feed_tokens, 0, 4))
    return out


def step_plan(b, draft: GPUDraft, slot: int, mode: str) -> list:
    """One draft forward on `slot` and its sampler (cached on `b` per slot and mode)."""
    key = (id(draft), slot, mode == "rejection")
    if key not in b.draft_plans:
        dev, model, vocab, split = b.dev, draft.model, b.vocab, b.split_rows
        step = b.champion.steps.binding(slot)
        plan = list(model.forward_dispatches(slot, draft.layers, draft.feed_tokens))
        if mode == "rejection":
            plan += sampling.softmax_rows(dev, model.logits, b.d_probs, b.d_conf, step,
                                          vocab=vocab, split=split)
            plan += sampling.sample_rows(dev, b.d_probs, b.d_sample, step, vocab=vocab,
                                         stream=rng.STREAM_DRAFT, split=split)
        else:
            plan += sampling.argmax_rows(dev, model.logits, b.d_sample, b.d_conf, step,
                                         vocab=vocab, split=split)
        b.draft_plans[key] = plan
    return b.draft_plans[key]
