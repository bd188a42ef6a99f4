"""A request's stats: what its cycles drafted and accepted, by position, and the times.

`Stats` is counted cycle by cycle by the loop (engine.py); `summary` turns it into the dict
that Result.stats holds and the receipt copies a part of (receipts.py).
Not here: the schedule's own stats (schedule.merged_stats), the receipt.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import schedule


@dataclass
class Stats:
    champion_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_by_position: list = field(default_factory=lambda: [0] * schedule.K_MAX)
    accepted_by_position: list = field(default_factory=lambda: [0] * schedule.K_MAX)
    t_draft: float = 0.0
    t_verify: float = 0.0
    scratch: int = 0      # peak activation bytes of a pass
    draft_calls_before: int = 0   # the drafter's lifetime call count when this request began

    def record(self, k: int, n_accepted: int, t_draft: float, t_verify: float) -> None:
        self.champion_passes += 1
        self.t_draft += t_draft
        self.t_verify += t_verify
        self.drafted += k
        self.accepted += n_accepted
        grow = k - len(self.drafted_by_position)
        if grow > 0:
            self.drafted_by_position += [0] * grow
            self.accepted_by_position += [0] * grow
        for i in range(k):
            self.drafted_by_position[i] += 1
            self.accepted_by_position[i] += i < n_accepted


def summary(st: Stats, backend, drafter, scheds: dict, n_generated: int, wall: float,
            t_prefill: float, ttft: float | None, finish: str) -> dict:
    """The stats of a request `backend` ran, drafted by `drafter` (its draft source)."""
    decode = max(wall - t_prefill, 1e-9)
    return {
        "adapter": backend.adapter,
        "drafter": drafter.name if drafter else "none",
        # where the drafts were made: "device" (sampled or looked up on the GPU inside the
        # cycle's submission), "host", both ("device+host"), or None (nothing drafted)
        "draft_path": draft_path(backend.timing, st.drafted),
        # a draft with another vocabulary (drafters/bridge.py): class, intersection size
        "bridge": getattr(drafter, "bridge_stats", None),
        "generated_tokens": n_generated,
        "finish_reason": finish,
        "champion_passes": st.champion_passes,
        "draft_calls": drafter.calls - st.draft_calls_before if drafter else 0,
        "drafted": st.drafted,
        "accepted": st.accepted,
        "acceptance_rate": st.accepted / st.drafted if st.drafted else 0.0,
        "tokens_per_pass": n_generated / st.champion_passes if st.champion_passes else 0.0,
        "drafted_by_position": st.drafted_by_position,
        "accepted_by_position": st.accepted_by_position,
        "schedule": schedule.merged_stats(scheds),
        "tokens_per_s": n_generated / decode,
        "ttft_s": ttft,
        "prefill_s": t_prefill,
        "draft_s": st.t_draft,
        "verify_s": st.t_verify,
        "wall_s": wall,
        # GPU backends: per-cycle host time (encode + submit) vs time awaiting the readback
        "backend_timing": dict(backend.timing),
        "peak_bytes": {
            "weights": backend.weight_bytes,
            "kv": backend.kv_bytes,
            "kv_used": backend.kv.peak_bytes,
            "scratch": st.scratch,
            # On a GPU: every byte of the device's buffers (weights, caches, the fixed
            # scratch of ROWS_MAX x vocab rows), as allocated; None on the numpy engines
            "device": getattr(getattr(backend.champion, "dev", None), "allocated", None),
        },
    }


def draft_path(timing: dict, drafted: int) -> str | None:
    """Where a request's drafts were made: the GPU backend counts its cycles by where their
    drafts came from (gpu/backend.py); the numpy engine's are all the host's."""
    found = [w for w in ("device", "host") if timing.get(f"drafted_on_{w}")]
    return "+".join(found) or ("host" if drafted else None)
