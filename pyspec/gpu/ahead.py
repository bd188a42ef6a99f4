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

A draft model's tree cycle (gpu/treedraft.py, fixed widths under greedy or replay) is fed the
same way, and so it goes ahead too. Its first pass feeds the last m committed tokens as a chain,
as a chain's first step does; its depth passes and the champion's tree pass take their Steps
from a template of the tree of its depth D, packed with the root at row 0 and written when a
request's trees are warmed (`trees`), which advance moves to the root's row n - 1 and gives the
request's seed, temperature and mode. The m after a tree cycle of depth D is D + 1, since the
tree's draft rows are not the chain's: the accepted path's nodes sit at the cache rows the tree
gave them (row n + their index in the layout, not n + their depth - 1), so every row past the
root's (row n - 1, fed in the first pass) must be fed again: the a + 1 tokens the cycle emits,
a <= D accepted. Feeding D + 1 rows, from row n + a - D <= n, writes rows before n again with
the values they hold (the forward is batch-invariant) and the a + 1 new ones at their chain
rows; with a = D (every node of a path accepted) nothing less covers them, so D + 1 is the least
fixed m. The rows from t_{n-m} need n >= m of the cycle after: the host keeps D at most the
committed tokens the tree cycle surely starts from (treedraft.fed_layout).

A cycle that goes ahead writes nothing from the host: a queue write costs a native WebGPU (Dawn in
the page, wgpu) a staging allocation, and with one per cycle while cycles were in flight, many of
the page's cycles took several times the host time of the others whenever k changed from cycle
to cycle (the guard, measured through Dawn). The fields that change per cycle (k, m, the verify
pass's one-hot flag, a tree's depth) pick a block of a table of every Params the request can use
(`params_table`), written once when the request's fields change; the cycle's first command
copies its block into the params buffer, in queue order after the reads of the cycles in flight.
"""

from __future__ import annotations

import numpy as np

from .constants import FLAG_ONE_HOT, ROWS_MAX
from .device import Copy
from .step import SLOT_BYTES, STEP_WORDS, pack_step

SLOT_WORDS = SLOT_BYTES // 4
STATE_WORDS = 4 + ROWS_MAX   # n, fresh, 2 words of padding, the last ROWS_MAX tokens (State)
PARAMS_WORDS = 12            # ahead.wgsl's Params
PARAMS_BYTES = 4 * PARAMS_WORDS
# [one_hot, or TREE][k_cap, or a tree's depth][m]: every Params of a request
TABLE_SHAPE = (3, ROWS_MAX, ROWS_MAX + 1)
TREE = 2                               # the table's plane of tree cycles
TEMPLATE_WORDS = ROWS_MAX * SLOT_WORDS  # a tree's template Steps (ahead.wgsl's tree_steps)


def pack_params(k_cap: int, feed_rows: int, limit: int, ctx: int, seed: int, temperature: float,
                mode: str, one_hot: bool, tree_depth: int = 0) -> np.ndarray:
    """(PARAMS_WORDS,) ahead.wgsl's Params for one cycle; `tree_depth` > 0: a tree cycle,
    its 1 + D slots from the template of depth D (then k_cap is 0: no chain steps)."""
    step = pack_step(0, 0, seed, temperature, 0, mode)   # the Step fields the host knows
    tree = [tree_depth + 1, tree_depth * TEMPLATE_WORDS] if tree_depth else [0, 0]
    return np.concatenate([np.array([0 if tree_depth else min(k_cap, ROWS_MAX - 1), limit, ctx],
                                    np.uint32),
                           step[[2, 3, 4, 6]],
                           np.array([FLAG_ONE_HOT if one_hot else 0, feed_rows, *tree, 0],
                                    np.uint32)])


def params_table(ctx: int, limit: int, seed: int, temperature: float,
                 mode: str) -> np.ndarray:
    """(*TABLE_SHAPE, PARAMS_WORDS) the Params of every cycle of a request: block [o, k, m] is
    pack_params(k, m, ..., one_hot=o), block [TREE, D, m] pack_params(0, m, ..., one_hot=True,
    tree_depth=D) (D > 0)."""
    table = np.tile(pack_params(0, 0, limit, ctx, seed, temperature, mode, False),
                    (*TABLE_SHAPE, 1))
    table[..., 0] = np.arange(ROWS_MAX)[:, None]   # k_cap (words: ahead.wgsl's Params order)
    table[1:, ..., 7] = FLAG_ONE_HOT                # verify_flags
    table[..., 8] = np.arange(ROWS_MAX + 1)         # feed_rows
    depth = np.arange(1, ROWS_MAX)[:, None]
    table[TREE, :, :, 0] = 0
    table[TREE, 1:, :, 9] = depth + 1               # tree_slots
    table[TREE, 1:, :, 10] = depth * TEMPLATE_WORDS  # tree_at
    return table


def table_block(k_cap: int, feed_rows: int, one_hot: bool, tree_depth: int = 0) -> int:
    """The index of a cycle's block in params_table's blocks, flattened."""
    if not 0 <= feed_rows <= ROWS_MAX:
        raise ValueError(f"a draft's first step feeds at most {ROWS_MAX} rows, not {feed_rows}")
    if not 0 <= tree_depth < ROWS_MAX:
        raise ValueError(f"a tree is at most {ROWS_MAX - 1} deep, not {tree_depth}")
    plane, k = (TREE, tree_depth) if tree_depth else (int(one_hot), min(k_cap, ROWS_MAX - 1))
    return int(np.ravel_multi_index((plane, k, feed_rows), TABLE_SHAPE))


class DeviceFeed:
    """The device side of a GPU draft's pipelined cycles, for caches of `max_ctx` positions."""

    def __init__(self, dev, max_ctx: int, words, feed, tokens):
        """`words`: the accept kernel's output buffer (the cycle before's verdict); `feed`: the
        draft's token list (its first step's rows); `tokens`: the champion's token list."""
        self.dev, self.max_ctx = dev, max_ctx
        self.state = dev.buffer(4 * STATE_WORDS, label="ahead.state")
        self.steps = dev.buffer(ROWS_MAX * SLOT_BYTES, label="ahead.steps")
        self.params = dev.buffer(PARAMS_BYTES, "uniform", "ahead.params")
        # (*TABLE_SHAPE, PARAMS_WORDS): a copy source, so storage (every adapter: COPY_SRC)
        self.table = dev.buffer(int(np.prod(TABLE_SHAPE)) * PARAMS_BYTES, label="ahead.table")
        # (ROWS_MAX, ROWS_MAX, SLOT_WORDS): [D] the Steps of a tree cycle of depth D, packed
        # with its root at row 0 (`trees`)
        self.template = dev.buffer(ROWS_MAX * TEMPLATE_WORDS * 4, label="ahead.template")
        self.plan = dev.dispatch("ahead", "advance",
                                 [self.params, words, self.state, self.steps, feed, tokens,
                                  self.template], 1)
        self._written: tuple | None = None   # the request fields the table holds
        self._trees: bytes | None = None     # the templates the device holds

    def start(self, tokens: list[int]) -> None:
        """The committed tokens are `tokens`: written now, for the next cycle, which then takes
        nothing from the words."""
        state = np.zeros(STATE_WORDS, np.uint32)
        last = tokens[-ROWS_MAX:]
        state[0], state[1] = len(tokens), 1
        state[STATE_WORDS - len(last):] = last
        self.dev.write(self.state, state)

    def trees(self, templates: dict) -> None:
        """Write the templates (depth D: (1 + D, STEP_WORDS) its Steps, the root at row 0;
        slot 1 unused: the device writes it) where they differ from those the device holds:
        when a request's trees are warmed, before its first cycle."""
        words = np.zeros((ROWS_MAX, ROWS_MAX, SLOT_WORDS), np.uint32)
        for depth, steps in templates.items():
            words[depth, :len(steps), :STEP_WORDS] = steps
        if words.tobytes() != self._trees:
            self.dev.write(self.template, words.reshape(-1))
            self._trees = words.tobytes()

    def params_copy(self, k_cap: int, feed_rows: int, limit: int, seed: int,
                    temperature: float, mode: str, one_hot: bool, tree_depth: int = 0) -> Copy:
        """The copy, a cycle's first command, that puts its Params (its block of the table) in
        the params buffer; `tree_depth`: a tree cycle's D (its template's, `trees`). The table
        is written only when the request's fields change (the queue orders the write after the
        cycles submitted before it)."""
        request = (limit, seed, temperature, mode)
        if request != self._written:
            self.dev.write(self.table, params_table(self.max_ctx, *request))
            self._written = request
        offset = table_block(k_cap, feed_rows, one_hot, tree_depth) * PARAMS_BYTES
        return Copy(self.table, offset, self.params, 0, PARAMS_BYTES)

    def steps_copy(self, steps, slots: int):
        """The copy that puts the Steps the kernel wrote into `steps`' first `slots` slots."""
        buffer, offset, _ = steps.binding(0)
        return Copy(self.steps, 0, buffer, offset, slots * SLOT_BYTES)
