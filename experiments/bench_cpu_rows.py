"""What a verify pass over m rows costs on the CPU engine, in one-row passes, for weight blocks of
several sizes side by side (fastcpu.BLOCK_ROWS["blas"]), on the real champion.

    .venv/bin/python -m experiments.bench_cpu_rows [--blocks 4096,256] [--rows 1,2,3,5,8]
        [--ctx 300] [--reps 9] --out bench/results/cpu-rows.json

The champion's cache holds --ctx random tokens; each pass feeds m more and is rolled back. The
block sizes take turns pass by pass, so a busy neighbour on the shared cores hits each alike.
Reports medians and ranges (ms) and each median over the same block's one-row median. A
benchmark, never a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np

from pyspec import champion_path
from pyspec.apps import provenance
from pyspec.cpu import fastcpu
from pyspec.kv import KVCache


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", default="4096,256")
    p.add_argument("--rows", default="1,2,3,5,8")
    p.add_argument("--ctx", type=int, default=300)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    blocks = [int(b) for b in a.blocks.split(",")]
    rows = [int(r) for r in a.rows.split(",")]
    model = fastcpu.FastModel.load(champion_path(), "blas")
    cfg = model.config
    kv = KVCache(cfg.n_layers, a.ctx + max(rows), cfg.n_kv_heads, cfg.head_dim)
    rng = np.random.default_rng(0)
    model.forward(rng.integers(0, cfg.vocab_size, a.ctx), kv)
    kv.commit(a.ctx)
    times = {b: {m: [] for m in rows} for b in blocks}
    before = fastcpu.BLOCK_ROWS["blas"]
    try:
        for _ in range(a.reps):
            for m in rows:
                for b in blocks:
                    fastcpu.BLOCK_ROWS["blas"] = b
                    tokens = rng.integers(0, cfg.vocab_size, m)
                    t = time.perf_counter()
                    model.forward(tokens, kv, last_only=False)
                    times[b][m].append((time.perf_counter() - t) * 1e3)
                    kv.rollback()
    finally:
        fastcpu.BLOCK_ROWS["blas"] = before
    result = {"machine": platform.platform(), "processor": platform.processor(),
              "ctx": a.ctx, "reps": a.reps, "blocks": {}}
    for b in blocks:
        one = statistics.median(times[b][1]) if 1 in rows else None
        result["blocks"][str(b)] = {
            str(m): {"median_ms": round(statistics.median(ts), 2),
                     "range_ms": [round(min(ts), 2), round(max(ts), 2)],
                     "over_one_row": round(statistics.median(ts) / one, 3) if one else None}
            for m, ts in times[b].items()}
        print(b, {m: v["median_ms"] for m, v in result["blocks"][str(b)].items()},
              {m: v["over_one_row"] for m, v in result["blocks"][str(b)].items()})
    provenance.write(a.out, provenance.stamp(result))


if __name__ == "__main__":
    main()
