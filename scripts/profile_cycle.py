"""Where a cycle's time goes on a GPU: host encoding, GPU throughput, per kernel.

Runs one real request (champion-only, greedy, pipelined) for its tok/s, keeping the command list
of its last cycle, then replays that list:
- host: the median seconds of `Device.submit(commands)` (encoding and submitting, no wait);
- GPU: N submissions back to back and one readback, wall / N: what a cycle costs when the host
  is never the bottleneck (the GPU's throughput per cycle, barriers between dispatches included);
- per kernel: timestamps around each dispatch (one pass each: an upper bound per dispatch).

With `--draft D --k fixed:K` it also profiles speculative cycles with that drafter (`speculative`
in the JSON): the requests' wall time per cycle against the host time spent encoding one and the
GPU time of one (the last cycle of a request, its dispatches as one timed pass), and where the
rest goes. A cycle that goes ahead costs max(host, GPU) when the two overlap; the engine's own
work between readbacks (the verdict, the guard, the text) is what is left of the wall time.

    .venv/bin/python scripts/profile_cycle.py [--champion C.gguf] [--tokens 64] [--n 50]
        [--loop 200] [--draft D.gguf --k fixed:2] [--argmax default|split|rows] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

from pyspec.apps import provenance
from pyspec.apps.bench import last_cycle, recorded_request
from pyspec.engine import Engine
from pyspec.gpu.device import Copy, Dispatch
from pyspec.load import backend, load_champion
from pyspec.options import Options

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper who "
                                      "finds a message in a bottle."}]


def host_breakdown(dev, commands, reps: int = 20) -> dict:
    """Median seconds of each part of `Device.submit`, the GPU idle before each: recording the
    pass (Python and the C calls), ending it and finishing the command buffer (wgpu-core checks
    and tracks every binding there), and the queue submission."""
    parts = {"record": [], "end_and_finish": [], "queue_submit": []}
    dispatches = [c for c in commands if isinstance(c, Dispatch)]
    for _ in range(reps):
        asyncio.run(dev.read(commands[-1].src, 4))
        t0 = time.perf_counter()
        encoder = dev._begin_encoder()
        compute, last = dev._begin_pass(encoder), None
        for c in dispatches:
            if c.pipeline is not last:
                dev._set_pipeline(compute, c.pipeline)
                last = c.pipeline
            dev._dispatch(compute, c.bind_group, c.workgroups)
        t1 = time.perf_counter()
        dev._end_pass(compute)
        buffer = encoder.finish()
        t2 = time.perf_counter()
        dev.device.queue.submit([buffer])
        t3 = time.perf_counter()
        for key, value in zip(parts, (t1 - t0, t2 - t1, t3 - t2)):
            parts[key].append(value)
    return {key: statistics.median(v) for key, v in parts.items()}


def pipelined_loop(dev, commands, mode: str, cycles: int = 200) -> float:
    """Seconds per cycle of the same cycle submitted `cycles` times, each one before the one
    before it is read (the engine's pipelining), its readback into one of 3 staging buffers.
    map_late: the map is asked for when the cycle is read (Device.redeem today);
    map_early: right after its submission."""
    import wgpu
    body = [c for c in commands if not (isinstance(c, Copy) and c is commands[-1])]
    last = commands[-1]
    staging = [dev.device.create_buffer(size=max(16, last.nbytes), usage=wgpu.BufferUsage.MAP_READ |
                                        wgpu.BufferUsage.COPY_DST) for _ in range(3)]
    promises = [None] * 3
    t0 = time.perf_counter()
    for i in range(cycles + 1):
        if i < cycles:
            b = i % 3
            dev.submit(body + [Copy(last.src, last.src_offset, staging[b], 0, last.nbytes)])
            if mode == "map_early":
                promises[b] = staging[b].map_async("READ_NOSYNC")
        if i > 0:
            b = (i - 1) % 3
            if mode == "map_early":
                promises[b].sync_wait()
            else:
                staging[b].map_sync("READ_NOSYNC")
            bytes(staging[b].read_mapped(0, 16))
            staging[b].unmap()
    return (time.perf_counter() - t0) / cycles


def compute_passes(commands: list) -> int:
    """Compute passes Device.submit opens for `commands`: a copy ends one."""
    passes, open_ = 0, False
    for c in commands:
        if isinstance(c, Dispatch) and not open_:
            passes, open_ = passes + 1, True
        elif isinstance(c, Copy):
            open_ = False
    return passes


def speculative(champion, tok, ids: list[int], draft: str, k: str, tokens: int,
                paths: dict) -> dict:
    """Requests with `draft` at `k` (greedy, pipelined), then their cycle's parts (module doc)."""
    dev = champion.dev
    engine = Engine(backend(champion, draft, **paths), tok)
    options = Options(max_tokens=tokens, k=k, stop_at_eos=False)
    engine.generate(ids, Options(max_tokens=8, k=k, stop_at_eos=False))   # warm-up
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        result, submissions = recorded_request(engine, ids, options)
        wall = time.perf_counter() - t0
        timing = dict(engine.backend.timing)
        cycles = max(timing["cycles"], 1)
        runs.append({"tok_s": result.stats["tokens_per_s"], "cycles": timing["cycles"],
                     "ahead": timing["ahead"], "tokens_per_cycle": len(result.tokens) / cycles,
                     "wall_s_per_cycle": wall / cycles,
                     "host_s_per_cycle": statistics.median(timing["host_s_cycles"]),
                     "wait_s_per_cycle": timing["wait_s"] / cycles,
                     "acceptance": result.stats.get("acceptance_rate")})
    # The request's longest submission is a cycle with every draft step (prefill is shorter
    # once the prompt fits a few blocks; the prompt here is short).
    cycle = max(submissions, key=len)
    dispatches = [c for c in cycle if isinstance(c, Dispatch)]
    host = []
    for _ in range(20):
        asyncio.run(dev.read(champion.logits, 4))
        t0 = time.perf_counter()
        dev.submit(cycle)
        host.append(time.perf_counter() - t0)
    asyncio.run(dev.read(champion.logits, 4))
    by_kernel: dict[str, list] = defaultdict(lambda: [0, 0.0])
    if dev.timestamps:
        for kernel, s in dev.profile(dispatches):
            by_kernel[kernel][0] += 1
            by_kernel[kernel][1] += s
    median = {key: statistics.median(r[key] for r in runs)
              for key in ("tok_s", "tokens_per_cycle", "wall_s_per_cycle", "host_s_per_cycle",
                          "wait_s_per_cycle")}
    result = {
        "draft": draft, "k": k, "runs": runs, "median": median,
        "dispatches_per_cycle": len(dispatches),
        "copies_per_cycle": sum(isinstance(c, Copy) for c in cycle),
        "compute_passes_per_cycle": compute_passes(cycle),
        "host_submit_s": statistics.median(host),
        "host_submit_breakdown_s": host_breakdown(dev, cycle),
        "gpu_s_one_pass_timestamps": (dev.time_pass(cycle) if dev.timestamps else None),
        "kernel_profile_s": {k: {"dispatches": n, "s": s} for k, (n, s) in
                             sorted(by_kernel.items(), key=lambda kv: -kv[1][1])},
    }
    engine.backend.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--champion", default=None)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--loop", type=int, default=200, help="cycles of each pipelined loop")
    parser.add_argument("--draft", default=None, help="also profile cycles with this drafter")
    parser.add_argument("--k", default="fixed:2", help="the draft length policy with --draft")
    parser.add_argument("--argmax", choices=["default", "split", "rows"], default="default",
                        help="argmax_rows split over each row, or one workgroup per row (an A/B; "
                             "default: the backend's choice for the adapter)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    paths = {"default": {}, "split": {"split_rows": True},
             "rows": {"split_rows": False}}[args.argmax]   # gpu.backend.Paths
    champion, tok = load_champion(args.champion, "wgpu")
    dev = champion.dev
    engine = Engine(backend(champion, "none", **paths), tok)
    ids = tok.encode_chat(PROMPT)
    engine.generate(ids, Options(max_tokens=8, k="fixed:0", stop_at_eos=False))   # warm-up
    runs = [engine.generate(ids, Options(max_tokens=args.tokens, k="fixed:0", stop_at_eos=False))
            for _ in range(3)]
    timing = dict(engine.backend.timing)
    commands = last_cycle(engine, ids, args.tokens)
    tok_s = statistics.median(r.stats["tokens_per_s"] for r in runs)

    host = []
    for _ in range(20):
        t0 = time.perf_counter()
        dev.submit(commands)
        host.append(time.perf_counter() - t0)
    asyncio.run(dev.read(champion.logits, 4))

    breakdown = host_breakdown(dev, commands)

    gpu = []
    for _ in range(5):
        asyncio.run(dev.read(champion.logits, 4))
        t0 = time.perf_counter()
        for _ in range(args.n):
            dev.submit(commands)
        asyncio.run(dev.read(champion.logits, 4))
        gpu.append((time.perf_counter() - t0) / args.n)

    gpu_pass = dev.time_pass(commands) if hasattr(dev, "time_pass") and dev.timestamps else None
    loops = {mode: pipelined_loop(dev, commands, mode, args.loop)
             for mode in ("map_late", "map_early")}

    by_kernel: dict[str, list] = defaultdict(lambda: [0, 0.0])
    dispatches = [c for c in commands if isinstance(c, Dispatch)]
    if dev.timestamps:
        for kernel, s in dev.profile(dispatches):
            by_kernel[kernel][0] += 1
            by_kernel[kernel][1] += s
    result = {
        "adapter": dev.name,
        "tok_s_pipelined": tok_s,
        "host_s_per_cycle_in_requests": timing["host_s"] / max(timing["cycles"], 1),
        "wait_s_per_cycle_in_requests": timing["wait_s"] / max(timing["cycles"], 1),
        "dispatches_per_cycle": len(dispatches),
        "copies_per_cycle": sum(isinstance(c, Copy) for c in commands),
        "host_submit_s": statistics.median(host),
        "host_submit_breakdown_s": breakdown,
        "gpu_s_per_cycle_back_to_back": statistics.median(gpu),
        "gpu_s_range": [min(gpu), max(gpu)],
        "gpu_s_one_pass_timestamps": gpu_pass,
        "pipelined_loop_s_per_cycle": loops,
        "kernel_profile_s": {k: {"dispatches": n, "s": s} for k, (n, s) in
                             sorted(by_kernel.items(), key=lambda kv: -kv[1][1])},
    }
    if args.draft:
        result["speculative"] = speculative(champion, tok, ids, args.draft, args.k, args.tokens,
                                            paths)
    result["argmax"] = args.argmax
    print(json.dumps(result, indent=1))
    if args.json:
        provenance.stamp(result, champion=args.champion)
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
