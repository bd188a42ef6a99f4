"""The request's logits processors on the device: on the champion's logits rows in place, before
the champion's choices, so the readback stays the 68 accept words.

  penalize_rows  logit_bias and the repetition, presence and frequency penalties, from token
                 counts kept on the device (count_tokens adds each cycle's emitted tokens after
                 the accept kernel); the host sets the counts once per request.
  filter_rows    the JSON-schema mask, uploaded each cycle as bits (row i's after the drafts
                 before it, so the drafts must be the host's: forced tokens, n-gram), then at
                 T > 0 top_k, top_p and min_p (shaders/filter.wgsl: sort-free, its tie rules and
                 rounding; on a GPU split over each row, shaders/filter_split.wgsl, the same
                 output).
A request whose processors are not all among those the device runs (`kinds`, from the adapter:
gpu/paths.Paths), in the chain's order, takes the host accept (gpu/hostaccept.py).
Not here: the kernels (sampling.py), the processors' rules (rules/processors.py).
"""

from __future__ import annotations

import time

import numpy as np

from ..cycle import Rule
from ..rules.jsonmask import JsonMask
from ..rules.processors import Filters, Penalties
from . import sampling
from .constants import ROWS_MAX
from .step import SLOT_CHAMPION

KINDS = (JsonMask, Penalties, Filters)   # every processor with a device step, in chain order


def device_found(rule: Rule, kinds: tuple, on_device: bool) -> tuple | None:
    """(mask, penalties, filters), each None where absent (all None without processors), when
    every processor of the request is among `kinds`; else None. The mask needs the drafts on
    the host (a row's mask depends on them), so not with drafts sampled on the device."""
    found = {kind: None for kind in KINDS}
    for p in rule.processors:
        if type(p) not in kinds or found[type(p)] is not None:
            return None
        found[type(p)] = p
    mask, pen, filters = found.values()
    if mask is not None and on_device:
        return None
    return mask, pen, filters


class DeviceProcessors:
    """The penalize and filter plans of one backend, made at their first use, and the request
    whose parameters they hold."""

    def __init__(self, b):
        self.b = b
        self._pen = None    # (params, counts, bias, plans, rule)
        self._filt = None   # (params, mask words, plan, rule)

    def plan(self, rule: Rule, on_device: bool) -> tuple | None:
        """(mask, penalties, filters) for a cycle whose processors all run on the device, or
        None for the host accept."""
        found = device_found(rule, self.b.paths.device_processors, on_device)
        filters = found[2] if found is not None else None
        if filters is not None and filters.top_p < 1.0 and self.b.vocab > sampling.TOP_P_VOCAB_MAX:
            return None   # top_p over more than 2^20 tokens has no device step
        return found

    def encode(self, found: tuple, rule: Rule, tokens: list[int], drafts, k: int) -> tuple:
        """(commands before the champion's choices, commands after the accept kernel)."""
        mask, pen, filters = found
        before, after = [], []
        if pen is not None:
            penalize, count = self._penalties(rule, pen, tokens)
            before.append(penalize)
            after.append(count)
        if mask is not None or filters is not None:
            before.append(self._filters(rule, mask, filters, tokens, drafts, k))
        return before, after

    def _filters(self, rule: Rule, mask, filters, tokens: list[int], drafts, k: int):
        """The filter plan (shaders/filter.wgsl); at a request's first cycle (a new Rule)
        its parameters, and every cycle the k + 1 rows' masks (row i after the drafts before
        it), uploaded as bits: ceil(vocab / 32) words a row."""
        b = self.b
        dev, vocab = b.dev, b.vocab
        if self._filt is None:
            params = sampling.filter_params(dev, vocab)
            words = dev.buffer(4 * ROWS_MAX * sampling.mask_words(vocab), label="filter.mask")
            weights = dev.buffer(4 * ROWS_MAX * vocab, label="filter.weights")  # (R, vocab) f32
            plan = sampling.filter_rows(dev, params, b.champion.logits, words, weights,
                                        b.champion.steps.binding(SLOT_CHAMPION), vocab=vocab,
                                        split=b.paths.split_rows)
            self._filt = [params, words, plan, None]
        params, words, plan, current = self._filt
        if current is not rule:
            f = filters or Filters(rule.temperature)
            sampling.set_filters(dev, params, vocab, mask is not None, f.top_k, f.top_p, f.min_p)
            self._filt[3] = rule
        if mask is not None:
            t0 = time.perf_counter()
            dev.write(words, mask.words(tokens, drafts.tokens, k + 1, vocab))   # (k+1, words)
            b.timing["mask_s"] = b.timing.get("mask_s", 0.0) + time.perf_counter() - t0
        return plan

    def _penalties(self, rule: Rule, pen: Penalties, tokens: list[int]) -> tuple:
        """The penalize and count dispatches; at a request's first cycle (a new Rule), its
        counts (from the committed tokens: prompt and resumed ids), bias and parameters."""
        b = self.b
        dev, vocab = b.dev, b.vocab
        if self._pen is None:
            params = sampling.penalty_params(dev, vocab)
            counts = dev.buffer(8 * vocab, label="penalize.counts")     # (2, vocab) u32
            bias = dev.buffer(4 * vocab, label="penalize.bias")         # (vocab,) f32
            step = b.champion.steps.binding(SLOT_CHAMPION)
            plans = (sampling.penalize_rows(dev, params, b.champion.logits, counts, bias,
                                            b.champion.tokens, step, vocab=vocab),
                     sampling.count_tokens(dev, params, b.out, counts, step, vocab=vocab))
            self._pen = [params, counts, bias, plans, None]
        params, counts, bias, plans, current = self._pen
        if current is not rule:   # a new request: its counts and parameters
            seq = np.asarray(tokens, dtype=np.int64)
            table = np.stack([np.bincount(seq, minlength=vocab),
                              np.bincount(seq[pen.prompt_len:], minlength=vocab)])  # (2, vocab)
            dev.write(counts, table.astype(np.uint32))
            if pen.bias is not None:
                dev.write(bias, pen.bias.astype(np.float32))
            sampling.set_penalties(dev, params, vocab, pen.repetition, pen.presence,
                                   pen.frequency, pen.bias is not None)
            self._pen[4] = rule
        return plans
