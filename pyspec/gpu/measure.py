"""GPU cost measurements for the benchmark (never for tests): what a pass over m tokens costs
relative to one, the fixed cost of a submission plus readback, and a per-kernel profile from
timestamp queries where the adapter has them.

Every timing is the median of repeated runs, wall clock around submit + the one awaited readback,
i.e. exactly what a cycle pays. Not here: the workload benchmark itself (bench.py).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import defaultdict

from .device import ROWS_MAX

SLOT = 0


async def _pass_seconds(model, rows: int, reps: int) -> float:
    """Median seconds of one champion pass over `rows` tokens, including encode, submit and a
    4-byte readback (the sync point a cycle has anyway)."""
    times = []
    tokens = [(17 * i + 5) % model.config.vocab_size for i in range(rows)]
    for _ in range(reps + 2):  # two warm-ups
        model.kv.truncate(0)
        t0 = time.perf_counter()
        model.feed(tokens, SLOT)
        model.steps.upload(SLOT + 1)
        model.dev.submit(model.forward_dispatches(SLOT))
        await model.dev.read(model.logits, 4)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


async def _round_trip_seconds(dev, buf, reps: int) -> float:
    """The fixed cost of a cycle: an empty submission and a small readback."""
    times = []
    for _ in range(reps + 2):
        t0 = time.perf_counter()
        dev.submit([])
        await dev.read(buf, 16)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


def measure(model, reps: int | None = None, rows: list[int] | None = None) -> dict:
    """{pass_s: {rows: s}, verify_cost_ratio: {rows: ratio}, round_trip_s, kernel_profile,
    gpu_pass_s: {rows: s}} (the last two with timestamps).
    A software adapter takes seconds per pass, so it gets fewer rows and repetitions."""
    if rows is None:
        rows = [1, 2, 4, 8, 16] if model.dev.is_cpu else list(range(1, ROWS_MAX + 1))
    reps = reps or (3 if model.dev.is_cpu else 20)

    async def run():
        await _pass_seconds(model, 1, reps)   # warm-up: the first passes ran slow on the H200
        passes = {m: await _pass_seconds(model, m, reps) for m in rows}
        if not model.dev.is_cpu:
            # A second round, each row count keeping its faster median: on the H200 a whole
            # first batch once ran at 2.4x (the GPU's clocks still settling after the warm-up).
            passes = {m: min(t, await _pass_seconds(model, m, reps)) for m, t in passes.items()}
        rt = await _round_trip_seconds(model.dev, model.logits, reps)
        return passes, rt

    passes, round_trip = asyncio.run(run())
    result = {
        "adapter": model.dev.name,
        "pass_s": {str(m): t for m, t in passes.items()},
        # keyed by tokens in the pass: "1" is a champion-only step, "K+1" verifies K drafts
        "verify_cost_ratio": {str(m): t / passes[1] for m, t in passes.items()},
        "round_trip_s": round_trip,
        "fixed_share_of_one_token_pass": round_trip / passes[1],
    }
    if getattr(model.dev, "timestamps", False):
        result["kernel_profile"] = {str(m): kernel_profile(model, m) for m in (1, 8, 16)
                                    if m in rows}
        result["gpu_pass_s"] = {str(m): gpu_pass_seconds(model, m) for m in (1, 8, 16)
                                if m in rows}
    return result


def gpu_pass_seconds(model, rows: int) -> float:
    """GPU seconds of one whole pass over `rows` tokens, its dispatches in one compute pass
    (timestamps at its ends): the GPU time a cycle's forward costs."""
    model.kv.truncate(0)
    model.feed([5] * rows, SLOT)
    model.steps.upload(SLOT + 1)
    seconds = model.dev.time_pass(model.forward_dispatches(SLOT))
    model.kv.truncate(0)
    return seconds


def kernel_profile(model, rows: int) -> dict:
    """GPU seconds per kernel for one pass over `rows` tokens (timestamp queries), plus the sum."""
    model.kv.truncate(0)
    model.feed([5] * rows, SLOT)
    model.steps.upload(SLOT + 1)
    timed = model.dev.profile(model.forward_dispatches(SLOT))
    by_kernel: dict[str, float] = defaultdict(float)
    for kernel, seconds in timed:
        by_kernel[kernel] += seconds
    model.kv.truncate(0)
    return {"gpu_s_total": sum(by_kernel.values()), "dispatches": len(timed),
            "by_kernel_s": dict(sorted(by_kernel.items(), key=lambda kv: -kv[1]))}
