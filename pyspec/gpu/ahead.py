"""A GPU draft model's cycles fed on the device (shaders/ahead.wgsl), which lets them go ahead:
the cycle's first dispatch takes the tokens the cycle before emitted from the accept kernel's
words, so the cycle needs nothing from the host and is submitted before the one in flight is read
(gpu/backend.py, "Going ahead"; gpu/sources.FedDraft), as n-gram cycles are (gpu/ngram.py).

The draft's first step feeds the last m committed tokens, then its own drafts follow one row at
a time. The host must know m when it encodes the cycle (its copies read the step's last row), and
it does, although the cycle before may still be in flight:
- after a cycle that drafted (k > 0), m = 2. That cycle fed every committed token and its drafts;
  if every draft was accepted, the last one (never fed) and the bonus token are new (2), else only
  the correction is (1), and the row before it is fed again. Writing a row again gives the same
  values, because the forward is batch-invariant, so m = 2 is right either way;
- after a champion-only cycle (k = 0), which emits exactly one token, m grows by one. Before it
  would pass ROWS_MAX, a champion-only cycle runs the draft's first step anyway, feeding only
  (then m = 1);
- at a request's first cycle, m = the committed tokens past the draft cache's committed rows.
GPUDraft (gpu/draft.py) keeps m (`plan_ahead`), and its `confirm` the draft cache's bookkeeping
from the verdicts as they are read: after a cycle, the committed tokens less the m of the cycle
after it have rows.
"""

from __future__ import annotations

import numpy as np

from .constants import FLAG_ONE_HOT, ROWS_MAX
from .device import Copy
from .step import SLOT_BYTES, pack_step

STATE_WORDS = 4 + ROWS_MAX   # n, fresh, 2 words of padding, the last ROWS_MAX tokens (State)


class DeviceFeed:
    """The device side of a GPU draft's pipelined cycles, for caches of `max_ctx` positions."""

    def __init__(self, dev, max_ctx: int, words, feed, tokens):
        """`words`: the accept kernel's output buffer (the cycle before's verdict); `feed`: the
        draft's token list (its first step's rows); `tokens`: the champion's token list."""
        self.dev, self.max_ctx = dev, max_ctx
        self.state = dev.buffer(4 * STATE_WORDS, label="ahead.state")
        self.steps = dev.buffer(ROWS_MAX * SLOT_BYTES, label="ahead.steps")
        self.params = dev.buffer(48, "uniform", "ahead.params")
        self.plan = dev.dispatch("ahead", "advance",
                                 [self.params, words, self.state, self.steps, feed, tokens], 1)
        self._written: tuple | None = None

    def start(self, tokens: list[int]) -> None:
        """The committed tokens are `tokens`: written now, for the next cycle, which then takes
        nothing from the words."""
        state = np.zeros(STATE_WORDS, np.uint32)
        last = tokens[-ROWS_MAX:]
        state[0], state[1] = len(tokens), 1
        state[STATE_WORDS - len(last):] = last
        self.dev.write(self.state, state)

    def set(self, k_cap: int, feed_rows: int, limit: int, seed: int, temperature: float,
            mode: str, one_hot: bool) -> None:
        """The next cycle's parameters (written only when they change: the queue orders a write
        after the cycles submitted before it)."""
        key = (k_cap, feed_rows, limit, seed, temperature, mode, one_hot)
        if key == self._written:
            return
        step = pack_step(0, 0, seed, temperature, 0, mode)
        fields = np.concatenate([np.array([min(k_cap, ROWS_MAX - 1), limit, self.max_ctx],
                                          np.uint32), step[[2, 3, 4, 6]],
                                 np.array([FLAG_ONE_HOT if one_hot else 0, feed_rows, 0, 0, 0],
                                          np.uint32)])
        self.dev.write(self.params, fields)
        self._written = key

    def steps_copy(self, steps, slots: int):
        """The copy that puts the Steps the kernel wrote into `steps`' first `slots` slots."""
        buffer, offset, _ = steps.binding(0)
        return Copy(self.steps, 0, buffer, offset, slots * SLOT_BYTES)
