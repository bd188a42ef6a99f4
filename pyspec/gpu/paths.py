"""How a GPU backend (gpu/backend.py) runs its cycles: `Paths`, fixed when it is built, from the
comparisons the benchmark makes and the defaults of the device's adapter.
Not here: the cycles themselves (gpu/backend.py, gpu/sources.py).
"""

from __future__ import annotations

import dataclasses

from .processors import KINDS


@dataclasses.dataclass(frozen=True)
class Paths:
    """How a backend runs its cycles, fixed when it is built. The first three are the
    comparisons the benchmark reports (apps/bench.py builds a backend for each side); the rest
    depend on the device and come from its adapter (`for_device`)."""

    pipelined: bool = True     # False: every cycle is read before the next is submitted
    device_ngram: bool = True  # False: n-gram drafts from the host, cycles read one at a time
    # A draft model's cycles fed on the device, going ahead (gpu/ahead.py); False: fed from the
    # host, read one at a time. Not on a software adapter by default, where the GPU's threads
    # share the host's cores and they measured slower
    # (bench/results/lavapipe-draft-ahead.json (legacy))
    draft_ahead: bool = True
    # The per-row sampling kernels split over each row (argmax_parts + argmax_merge, ...); not
    # on a software adapter (sampling.py, shaders/sample.wgsl)
    split_rows: bool = True
    # The processors the accept step runs on the device (gpu/processors.py); the filters not on
    # a software adapter, where the device's row searches measured slower than reading the rows
    # back (bench/results/mask-lavapipe.json (legacy))
    device_processors: tuple = KINDS
    # A draft model's trees of fixed widths under greedy or replay grown on the device, every
    # depth's pass in the cycle's one submission (gpu/treedraft.py); False: a depth a pass with
    # its logits read back (gpu/tree.DraftForward), the way `auto` and rejection trees grow
    device_trees: bool = True

    @classmethod
    def for_device(cls, dev, **given) -> "Paths":
        """The paths for `dev`'s adapter, with the comparisons (or a test's choice) `given`."""
        gpu = not dev.is_cpu
        chosen = dict(draft_ahead=gpu, split_rows=gpu,
                      device_processors=KINDS if gpu else KINDS[:2])
        return cls(**{**chosen, **given})

