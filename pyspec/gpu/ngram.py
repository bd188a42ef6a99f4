"""The n-gram drafter on the device (shaders/ngram.wgsl), which lets speculative cycles go ahead:
a cycle whose drafts are looked up on the GPU, in the history the cycles before appended there,
needs nothing from the host, so it is submitted before the one in flight is read
(gpu/backend.py, "Going ahead"; gpu/sources.DeviceLookup).

`DeviceNgram` owns the history, the state (its length and the pass's Step) and the parameters;
`plan` (advance) is the dispatch that starts each such cycle, `tree_plan` (advance_tree) each
such tree cycle (--tree). Its proposals are those of drafters/ngram.py's NgramDrafter for the
same tokens, its trees drafters/tree.ngram_tree's (tests/test_gpu_ngram.py), so the schedule's
shadow previews, scored on the host, still predict what a cycle would draft.

A cycle that goes ahead writes nothing from the host: a queue write costs a native WebGPU (Dawn in
the page, wgpu) a staging allocation per write, which made the page's cycles slow whenever k
changed from cycle to cycle (gpu/ahead.py says more). The Params of every cycle the request can
run, a chain or a tree of each k, sit in a table (`params_table`), written once when the
request's fields change; the cycle's first command copies its block into the params buffer.
"""

from __future__ import annotations

import numpy as np

from ..drafters import ngram
from ..drafters.tree import ngram_widths
from .constants import ROWS_MAX
from .device import Copy
from .step import STEP_BYTES, STEP_WORDS, pack_step

STATE_WORDS = 8 + STEP_WORDS   # n, fresh, 6 words of padding, then the Step (ngram.wgsl State)
STEP_OFFSET = 32          # the Step's byte offset in the state
MAX_SUFFIX = 8            # the kernel's longest suffix (shaders/ngram.wgsl)
PARAMS_WORDS = 24 + ROWS_MAX   # ngram.wgsl's Params: 12 words, caps (12), widths (ROWS_MAX)
PARAMS_BYTES = 4 * PARAMS_WORDS


def pack_params(k_cap: int, limit: int, ctx: int, seed: int, temperature: float, mode: str,
                widths: tuple = (), tree_nodes: int = 0) -> np.ndarray:
    """(PARAMS_WORDS,) ngram.wgsl's Params for one cycle."""
    if len(widths) > ROWS_MAX:
        raise ValueError(f"a tree of {len(widths)} depths does not fit a pass")
    caps = np.zeros(12, np.uint32)   # [n]: the most drafts a match of n tokens proposes
    caps[:len(ngram.DRAFTS_BY_MATCH)] = ngram.DRAFTS_BY_MATCH
    per_depth = np.zeros(ROWS_MAX, np.uint32)   # [d]: the most children at depth d + 1
    per_depth[:len(widths)] = widths
    # The Step fields the host knows, packed as every Step is (step.pack_step's words 2-4, 6).
    step = pack_step(0, 0, seed, temperature, 0, mode)
    return np.concatenate([np.array(
        [min(k_cap, ROWS_MAX - 1), limit, ctx, ngram.MAX_N, ngram.MIN_N], np.uint32),
        step[[2, 3, 4, 6]], np.array([tree_nodes, len(widths), 0], np.uint32), caps, per_depth])


def tree_fields(drafter) -> tuple[tuple, int]:
    """(widths, most nodes) of a TreeDrafter's n-gram trees, as advance_tree's Params take them
    (drafters/tree.ngram_tree's widths and max_nodes)."""
    return ngram_widths(drafter.shape), drafter.max_nodes


def params_table(ctx: int, limit: int, seed: int, temperature: float, mode: str,
                 tree: tuple = ((), 0)) -> np.ndarray:
    """(2, ROWS_MAX, PARAMS_WORDS) the Params of every cycle of a request: [0, k] a chain's,
    pack_params(k, ...); [1, k] a tree's (`tree`: its widths and most nodes)."""
    table = np.stack([pack_params(0, limit, ctx, seed, temperature, mode),
                      pack_params(0, limit, ctx, seed, temperature, mode, *tree)])
    table = np.repeat(table[:, None], ROWS_MAX, axis=1)
    table[:, :, 0] = np.arange(ROWS_MAX)   # k_cap, Params' first word
    return table


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
        self.params = dev.buffer(PARAMS_BYTES, "uniform", "ngram.params")
        # (2, ROWS_MAX, PARAMS_WORDS) params_table: a copy source, so storage (COPY_SRC)
        self.table = dev.buffer(2 * ROWS_MAX * PARAMS_BYTES, label="ngram.table")
        bindings = [self.params, words, self.state, self.hist, tokens]
        self.plan = dev.dispatch("ngram", "advance", bindings, 1)
        self.tree_plan = dev.dispatch("ngram", "advance_tree", bindings, 1)
        self.tree: tuple = ((), 0)   # the request's tree (tree_fields), for the table
        self._written: tuple | None = None   # the request fields the table holds

    def start(self, tokens: list[int]) -> None:
        """The history is `tokens` (the committed ones): written now, for the next cycle, whose
        lookup then appends nothing."""
        if len(tokens) > self.max_ctx + ROWS_MAX:
            raise ValueError(f"{len(tokens)} tokens do not fit the history")
        self.dev.write(self.hist, np.asarray(tokens, np.uint32))
        self.dev.write(self.state, np.array([len(tokens), 1], np.uint32))

    def expect_tree(self, tree: tuple) -> None:
        """The tree (`tree_fields`) of the request about to start (gpu/tree.warm), so that the
        table written at its first cycle, a chain's or a tree's, holds its trees' Params too and
        its first tree cycle, perhaps gone ahead, writes nothing."""
        self.tree = tree

    def params_copy(self, k_cap: int, limit: int, seed: int, temperature: float, mode: str,
                    tree: tuple | None = None) -> Copy:
        """The copy, a cycle's first command, that puts its Params (its block of the table) in
        the params buffer; `tree` (`tree_fields`) for a tree cycle's advance_tree. The table is
        written only when the request's fields change (the queue orders the write after the
        cycles submitted before it)."""
        if tree is not None:
            self.tree = tree
        request = (limit, seed, temperature, mode, self.tree)
        if request != self._written:
            self.dev.write(self.table, params_table(self.max_ctx, *request))
            self._written = request
        block = (tree is not None) * ROWS_MAX + min(k_cap, ROWS_MAX - 1)
        return Copy(self.table, block * PARAMS_BYTES, self.params, 0, PARAMS_BYTES)

    def step_copy(self, steps, slot: int):
        """The copy that puts the Step the lookup wrote into `steps`' slot."""
        buffer, offset, _ = steps.binding(slot)
        return Copy(self.state, STEP_OFFSET, buffer, offset, STEP_BYTES)
