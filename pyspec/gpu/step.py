"""The per-pass `Step` uniform (shaders/step.wgsl): what changes between passes of a cycle.

Kernels take their static shapes from their own params uniform (made once, when a plan is built)
and everything that changes per pass from a Step slot, so a plan's dispatches and bind groups are
built once and re-encoded every cycle; a cycle only writes the step buffer.
"""

from __future__ import annotations

import numpy as np

# Step.mode's values and Step.flags' bit, which the shaders get as MODE_GREEDY, MODE_REPLAY,
# MODE_REJECTION and FLAG_ONE_HOT (constants.py).
from .constants import FLAG_ONE_HOT, FLAG_TREE, MODES, ROWS_MAX, TREE_NO_PARENT

SLOT_BYTES = 256   # WebGPU's minUniformBufferOffsetAlignment is at most 256
STEP_WORDS = 12 + ROWS_MAX   # the 8 fields, tree_base and 3 words of padding, the tree's table
STEP_BYTES = 4 * STEP_WORDS
STEP_POS = 1   # the word of the Step's position (gpu/after.py copies it alone)
# Slots of a cycle: the champion pass (its sampler and accept kernel share it), then one per
# draft step. Every model on a device shares them (Device.steps), since a cycle's draft steps and
# champion pass go in one submission.
SLOT_CHAMPION = 0
N_SLOTS = ROWS_MAX     # 1 + the most drafts one pass verifies (ROWS_MAX - 1)


def pack_step(rows: int, pos: int, seed: int = 0, temperature: float = 0.0, n_draft: int = 0,
              mode: str = "greedy", one_hot: bool = False, tree=None) -> np.ndarray:
    """The STEP_BYTES of one Step, as a uint32 array (STEP_WORDS,). `tree`: (base, parents) for
    a pass whose rows are nodes of a tree rooted at cache row `base`: parents[i] is the parent
    entry of entry i (cache row base + i; -1 for entry 0, the root only), for every entry up to
    this pass's last row (tree_table)."""
    out = np.zeros(STEP_WORDS, np.uint32)
    out[0], out[STEP_POS] = rows, pos
    out[2], out[3] = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    out[4] = np.float32(temperature).view(np.uint32)
    out[5], out[6], out[7] = n_draft, MODES[mode], FLAG_ONE_HOT if one_hot else 0
    if tree is not None:
        base, parents = tree
        if not base <= pos or pos + rows - base != len(parents):
            raise ValueError(f"a tree rooted at row {base} needs a parent for each of rows "
                             f"{base}..{pos + rows - 1}, got {len(parents)}")
        out[7] |= FLAG_TREE
        out[8] = base
        out[12:12 + len(parents)] = tree_table(parents)
    return out


def tree_table(parents) -> np.ndarray:
    """(entries,) the Step's table of a tree from each entry's parent entry (earlier; -1: the
    root, entry 0 only): depth | parent << 16 (shaders/step.wgsl)."""
    parents = [int(p) for p in parents]
    if (not 1 <= len(parents) <= ROWS_MAX or parents[0] != -1
            or any(not 0 <= p < r for r, p in enumerate(parents) if r)):
        raise ValueError(f"a tree's parent rows must be -1 for the root and an earlier entry "
                         f"for every other, at most {ROWS_MAX} entries; got {parents}")
    depth = [0] * len(parents)
    for r, p in enumerate(parents[1:], 1):
        depth[r] = depth[p] + 1
    up = [TREE_NO_PARENT] + parents[1:]
    return np.array([d | u << 16 for d, u in zip(depth, up)], np.uint32)


class Steps:
    """A uniform buffer of `n` Step slots; `binding(i)` is what a kernel binds at binding 1."""

    def __init__(self, dev, n: int):
        self.dev = dev
        self.n = n
        self.buffer = dev.buffer(n * SLOT_BYTES, "uniform", "steps")
        self._host = np.zeros((n, SLOT_BYTES // 4), np.uint32)

    def binding(self, i: int) -> tuple:
        if not 0 <= i < self.n:
            raise IndexError(f"step slot {i} out of range (0..{self.n - 1})")
        return (self.buffer, i * SLOT_BYTES, STEP_BYTES)

    def set(self, i: int, **fields) -> None:
        self._host[i, :STEP_WORDS] = pack_step(**fields)

    def packed(self, i: int) -> np.ndarray:
        """(STEP_WORDS,) slot i's Step as the host last packed it (`set`)."""
        return self._host[i, :STEP_WORDS]

    def upload(self, n: int | None = None) -> None:
        """Write slots [0, n) to the GPU (one queue write, ordered before the next submit)."""
        n = self.n if n is None else n
        self.dev.write(self.buffer, self._host[:n].reshape(-1))
