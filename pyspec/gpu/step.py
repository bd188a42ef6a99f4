"""The per-pass `Step` uniform (shaders/step.wgsl): what changes between passes of a cycle.

Kernels take their static shapes from their own params uniform (made once, when a plan is built)
and everything that changes per pass from a Step slot, so a plan's dispatches and bind groups are
built once and re-encoded every cycle; a cycle only writes the step buffer.
"""

from __future__ import annotations

import numpy as np

# Step.mode's values and Step.flags' bit, which the shaders get as MODE_GREEDY, MODE_REPLAY,
# MODE_REJECTION and FLAG_ONE_HOT (constants.py).
from .constants import FLAG_ONE_HOT, MODES, ROWS_MAX

SLOT_BYTES = 256   # WebGPU's minUniformBufferOffsetAlignment is at most 256
STEP_BYTES = 32
# Slots of a cycle: the champion pass (its sampler and accept kernel share it), then one per
# draft step. Every model on a device shares them (Device.steps), since a cycle's draft steps and
# champion pass go in one submission.
SLOT_CHAMPION = 0
N_SLOTS = ROWS_MAX     # 1 + the most drafts one pass verifies (ROWS_MAX - 1)


def pack_step(rows: int, pos: int, seed: int = 0, temperature: float = 0.0, n_draft: int = 0,
              mode: str = "greedy", one_hot: bool = False) -> np.ndarray:
    """The 32 bytes of one Step, as a uint32 array (8,)."""
    out = np.zeros(8, np.uint32)
    out[0], out[1] = rows, pos
    out[2], out[3] = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    out[4] = np.float32(temperature).view(np.uint32)
    out[5], out[6], out[7] = n_draft, MODES[mode], FLAG_ONE_HOT if one_hot else 0
    return out


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
        self._host[i, :8] = pack_step(**fields)

    def upload(self, n: int | None = None) -> None:
        """Write slots [0, n) to the GPU (one queue write, ordered before the next submit)."""
        n = self.n if n is None else n
        self.dev.write(self.buffer, self._host[:n].reshape(-1))
