"""A champion-only cycle's Step copied on the device, so that the champion-only cycles submitted
after the one in flight (gpu/backend.submit_after, gpu/sources.FromBefore) write nothing from
the host, as looked-up (gpu/ngram.py) and fed (gpu/ahead.py) cycles do: a queue write costs a
native WebGPU (Dawn in the page, wgpu) a staging allocation (gpu/ahead.py says what that did).

The champion's Step (step.py) of one champion-only cycle differs from the next one's only in its
position: one row, no drafts, one-hot, and the request's seed, temperature and mode. No other
counter advances: replay and rejection key their random numbers by (seed, position) (DESIGN
section 4). So the slot is two copies, among the cycle's first commands:
  template   the cycle's Step with its position 0: written when that changes, which is at the
             request's first champion-only cycle (not one gone ahead: its token comes from the
             host), not at the cycles after it;
  positions  (capacity,) u32, i at i, written once: the cycle's position is its word there. The
             host knows the position, since a champion-only cycle keeps exactly one row.
The copies are made from the slot the host packed (Steps.set), so the slot's bytes are those the
host would have written: the outputs are unchanged, greedy and sampled.
Not here: which cycles take their Step this way (gpu/backend.py's accept: every champion-only
chain cycle whose processors run on the device).
"""

from __future__ import annotations

import numpy as np

from .device import Copy
from .step import STEP_BYTES, STEP_POS


class StepTemplate:
    """The template and position table of one step slot of `steps`, for positions below
    `capacity`."""

    def __init__(self, dev, steps, slot: int, capacity: int):
        self.dev, self.steps, self.slot = dev, steps, slot
        self.template = dev.buffer(STEP_BYTES, label="after.template")   # (STEP_WORDS,) u32
        self.positions = dev.buffer(4 * capacity, label="after.positions",   # (capacity,) u32
                                    data=np.arange(capacity, dtype=np.uint32))
        self.capacity = capacity
        self._written: bytes | None = None   # the template's words, as the device holds them

    def copies(self, pos: int) -> list:
        """The copies that put the slot as the host packed it (Steps.set), at position `pos`,
        into the step buffer; the template is written first where it differs from what the
        device holds (the queue orders the write after the submissions before it)."""
        if not 0 <= pos < self.capacity:
            raise ValueError(f"position {pos} is past the {self.capacity} the table holds")
        words = self.steps.packed(self.slot).copy()
        words[STEP_POS] = 0
        if words.tobytes() != self._written:
            self.dev.write(self.template, words)
            self._written = words.tobytes()
        buffer, offset, nbytes = self.steps.binding(self.slot)
        return [Copy(self.template, 0, buffer, offset, nbytes),
                Copy(self.positions, 4 * pos, buffer, offset + 4 * STEP_POS, 4)]
