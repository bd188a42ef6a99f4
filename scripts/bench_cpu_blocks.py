"""Block-format weights against float32 weights on the native CPU engine (cpu/blocks.py,
cpu/fastcpu.py): time a parameter of a one-token pass and of a 5-row verify pass, weight bytes
and load time of each mode, on the champion and on real shapes' random Q4_K_M files
(`scripts/real_shapes.py write DIR --only Qwen3-0.6B`).

  python scripts/bench_cpu_blocks.py [--model PATH ...] [--rounds N] [--kernels blas,einsum]
                                     [--out bench/results/cpu-blocks.json]

Both modes on each row kernel (fastcpu.KERNELS: "blas" is the native engine's, "einsum" the
page's, run here in CPython). Their passes are interleaved round by round (the machine is
shared: a change of its load moves all alike) and the medians compared. Before timing, the logits
of every mode are checked to be bit-identical to float32's on its kernel. Not part of the
pyspec runtime.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyspec import champion_path  # noqa: E402
from pyspec.cpu import fastcpu  # noqa: E402
from pyspec.cpu.fastcpu import FastModel  # noqa: E402

PREFILL = 16


def bench_model(path: str, kernels: list[str], rounds: int) -> dict:
    """One model's row: each kernel's modes, their bytes, load time and pass medians, and the
    ratios of blocks to float32."""
    modes = {}
    for kernel in kernels:
        for weights in fastcpu.WEIGHTS:
            t0 = time.perf_counter()
            modes[f"{kernel} {weights}"] = (FastModel.load(path, kernel, weights),
                                           time.perf_counter() - t0)
    cfg = modes[f"{kernels[0]} float32"][0].config
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, cfg.vocab_size, PREFILL)]
    ref = {k: modes[f"{k} float32"][0].forward(tokens[:5], modes[f"{k} float32"][0].new_cache(8))
           for k in kernels}
    caches = {}
    for name, (model, _) in modes.items():
        got = model.forward(tokens[:5], model.new_cache(8))
        assert np.array_equal(got.view(np.uint32), ref[model.kernel].view(np.uint32)), name
        caches[name] = model.new_cache(PREFILL + 8)
        model.forward(tokens, caches[name], last_only=True)
        caches[name].commit(PREFILL)
    times = {(name, rows): [] for name in modes for rows in (1, 5)}
    for _ in range(rounds):
        for rows in (1, 5):
            for name, (model, _) in modes.items():
                t0 = time.perf_counter()
                model.forward(tokens[:rows], caches[name])
                times[(name, rows)].append(time.perf_counter() - t0)
                caches[name].rollback()
    params = sum(math.prod(t.shape) for t in modes[f"{kernels[0]} float32"][0].file.tensors.values())
    row = {"params": params, "file_bytes": os.path.getsize(path), "modes": {}}
    for name, (model, load_s) in modes.items():
        ms = {rows: float(np.median(times[(name, rows)])) * 1e3 for rows in (1, 5)}
        row["modes"][name] = {"weight_bytes": model.weight_bytes, "load_s": round(load_s, 2),
                              "ms_1_row": round(ms[1], 1), "ms_5_rows": round(ms[5], 1),
                              "ns_per_param_1_row": round(ms[1] * 1e6 / params, 3)}
    for k in kernels:
        base, m = row["modes"][f"{k} float32"], row["modes"][f"{k} blocks"]
        m["x_float32_1_row"] = round(m["ms_1_row"] / base["ms_1_row"], 2)
        m["x_float32_5_rows"] = round(m["ms_5_rows"] / base["ms_5_rows"], 2)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", nargs="*", default=None, help="GGUF files (default: the champion)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--kernels", default="blas,einsum")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench/results/cpu-blocks.json")
    args = ap.parse_args()
    kernels = args.kernels.split(",")
    load_before = os.getloadavg()[0]
    rows = {}
    with fastcpu.one_blas_thread():
        for path in args.model or [champion_path()]:
            rows[os.path.basename(path)] = bench_model(path, kernels, args.rounds)
            print(json.dumps(rows[os.path.basename(path)]), flush=True)
    doc = {"schema": "pyspec.bench-cpu-blocks/1", "engine": "fastcpu (native numpy)",
           "rounds": args.rounds, "machine": f"{os.cpu_count()} cores, shared; load average "
           f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after", "models": rows}
    from pyspec.apps import provenance

    provenance.stamp(doc, backend="cpu", adapter="cpu-numpy")
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
