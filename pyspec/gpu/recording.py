"""One GPU cycle as a value: what cycle.py's steps record into, and the handle `read` redeems.

A `Recording` is made when a cycle starts (`GPUBackend.record`), passed through the steps (its
draft source encodes the drafts and the champion pass's input, the backend appends the pass and
the accept step, `submit` ends it with the readback's copy), and handed to the engine as the
cycle's handle. Nothing of a cycle lives on the backend between the steps, so a later cycle may be
recorded while this one is in flight.
Not here: what is recorded (gpu/sources.py, gpu/backend.py), the GPU's commands (device.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class Recording:
    """A cycle being recorded, then submitted (see the module docstring)."""

    source: object            # the draft source (gpu/sources.py) that encodes its drafts
    t0: float                 # when its encoding began (perf_counter)
    limit: int | None = None  # the most tokens the request may hold (cycles drafted on the device)
    commands: list = field(default_factory=list)   # dispatches, plans and copies, in order
    slots: int = 1            # step slots the host writes (0: a dispatch of the cycle writes them)
    pass_at: int = 0          # commands before the champion pass (the drafting's share)
    pos: int | None = 0       # first position of the champion pass (None: the device decides)
    k: int = 0                # drafts proposed (for cycles drafted on the device: asked for)
    on_device: bool = False   # the drafts are sampled on the GPU (a draft model's steps)
    t_draft: float = 0.0      # seconds drafting on the host (host proposals)
    host: tuple | None = None  # (drafts, tokens, rule) where the accept rule runs on the host
    tree: object = None       # a tree cycle's TreeProposal (gpu/tree.py): walked on the host
    # --- set by submit -------------------------------------------------------------------------
    share: float = 0.0        # the drafting's part of the cycle's time (GPU drafts)
    t_submit: float = 0.0
    readback: object = None   # device.Readback: its copy ended the cycle's submission
    # --- how the cycle went ahead (pipelining) -------------------------------------------------
    committed: bool = False   # its row was committed when the next cycle was submitted
    looked_up: bool = False   # drafts and position from the device: rows appended on read
    fed: object = None        # the GPUDraft whose cycle was fed on the device (gpu/ahead.py)
    ahead: bool = False       # submitted while the cycle before was in flight (its host time
                              # overlapped that cycle's GPU work)
