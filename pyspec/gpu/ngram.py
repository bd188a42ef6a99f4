"""The n-gram drafter on the device (shaders/ngram.wgsl), which lets speculative cycles go ahead:
a cycle whose drafts are looked up on the GPU, in the history the cycles before appended there,
needs nothing from the host, so it is submitted before the one in flight is read
(gpu/backend.py, "Going ahead"; gpu/sources.DeviceLookup).

`DeviceNgram` owns the history, the state (its length and the pass's Step) and the parameters;
`plan` (advance) is the dispatch that starts each such cycle, `tree_plan` (advance_tree) each
such tree cycle (--tree). Its proposals are those of drafters/ngram.py's NgramDrafter for the
same tokens, its trees drafters/tree.ngram_tree's (tests/test_gpu_ngram.py), so the schedule's
shadow previews, scored on the host, still predict what a cycle would draft.
"""

from __future__ import annotations

import numpy as np

from ..drafters import ngram
from .constants import ROWS_MAX
from .device import Copy
from .step import STEP_BYTES, STEP_WORDS, pack_step

STATE_WORDS = 8 + STEP_WORDS   # n, fresh, 6 words of padding, then the Step (ngram.wgsl State)
STEP_OFFSET = 32          # the Step's byte offset in the state
MAX_SUFFIX = 8            # the kernel's longest suffix (shaders/ngram.wgsl)
PARAMS_WORDS = 24 + ROWS_MAX   # ngram.wgsl's Params: 12 words, caps (12), widths (ROWS_MAX)


class DeviceNgram:
    """The device side of n-gram drafting for one cache of `max_ctx` positions."""

    def __init__(self, dev, max_ctx: int, words, tokens):
        """`words`: the accept kernel's output buffer (the cycle before's verdict); `tokens`: the
        champion's token list (the pass's rows)."""
        if not (1 <= ngram.MIN_N <= ngram.MAX_N <= MAX_SUFFIX
                and len(ngram.DRAFTS_BY_MATCH) == ngram.MAX_N + 1):
            raise ValueError(f"the device lookup tries suffixes of 1..{MAX_SUFFIX} tokens, "
                             "with a cap for each length")
        self.dev, self.max_ctx = dev, max_ctx
        self.state = dev.buffer(4 * STATE_WORDS, label="ngram.state")
        # A cycle that goes ahead past the end (then dropped) may append up to ROWS_MAX more.
        self.hist = dev.buffer(4 * (max_ctx + 2 * ROWS_MAX), label="ngram.hist")
        self.params = dev.buffer(4 * PARAMS_WORDS, "uniform", "ngram.params")
        bindings = [self.params, words, self.state, self.hist, tokens]
        self.plan = dev.dispatch("ngram", "advance", bindings, 1)
        self.tree_plan = dev.dispatch("ngram", "advance_tree", bindings, 1)
        self._written: tuple | None = None

    def start(self, tokens: list[int]) -> None:
        """The history is `tokens` (the committed ones): written now, for the next cycle, whose
        lookup then appends nothing."""
        if len(tokens) > self.max_ctx + ROWS_MAX:
            raise ValueError(f"{len(tokens)} tokens do not fit the history")
        self.dev.write(self.hist, np.asarray(tokens, np.uint32))
        self.dev.write(self.state, np.array([len(tokens), 1], np.uint32))

    def set(self, k_cap: int, limit: int, seed: int, temperature: float, mode: str,
            widths: tuple = (), tree_nodes: int = 0) -> None:
        """The next cycle's parameters (written only when they change: the queue orders a write
        after the cycles submitted before it); `widths` and `tree_nodes` for a tree cycle's
        advance_tree (drafters/tree.ngram_tree's widths and max_nodes)."""
        key = (k_cap, limit, seed, temperature, mode, tuple(widths), tree_nodes)
        if key == self._written:
            return
        if len(widths) > ROWS_MAX:
            raise ValueError(f"a tree of {len(widths)} depths does not fit a pass")
        caps = np.zeros(12, np.uint32)   # [n]: the most drafts a match of n tokens proposes
        caps[:len(ngram.DRAFTS_BY_MATCH)] = ngram.DRAFTS_BY_MATCH
        per_depth = np.zeros(ROWS_MAX, np.uint32)   # [d]: the most children at depth d + 1
        per_depth[:len(widths)] = widths
        # The Step fields the host knows, packed as every Step is (step.pack_step's words 2-4, 6).
        step = pack_step(0, 0, seed, temperature, 0, mode)
        fields = np.concatenate([np.array(
            [min(k_cap, ROWS_MAX - 1), limit, self.max_ctx, ngram.MAX_N, ngram.MIN_N],
            np.uint32), step[[2, 3, 4, 6]], np.array([tree_nodes, len(widths), 0], np.uint32),
            caps, per_depth])
        self.dev.write(self.params, fields)
        self._written = key

    def step_copy(self, steps, slot: int):
        """The copy that puts the Step the lookup wrote into `steps`' slot."""
        buffer, offset, _ = steps.binding(slot)
        return Copy(self.state, STEP_OFFSET, buffer, offset, STEP_BYTES)
