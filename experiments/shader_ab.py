"""Chain passes of the champion with two shader folders, interleaved on one adapter: did a shader
change slow the chain down? (Issue 48 checked with it that the tree pass left chains alone.)

    .venv/bin/python -m experiments.shader_ab A_SHADERS B_SHADERS [--reps 7] [--rows 1,8]
        [--out F.json]

A_SHADERS is typically an older commit's (`git archive REV shaders | tar x -C DIR`). Each side's
plans are compiled from its folder on a device of its own; after a 150-token prefill, passes over
each row count alternate between the sides (rolled back each time), and the medians (ms per
pass: submit and a 16-byte readback) print as one JSON line, and with --out go to a file through
pyspec/apps/provenance.py's writer. Not part of the pyspec runtime.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import numpy as np

from pyspec import champion_path
from pyspec.apps import provenance
from pyspec.formats.gguf import GGUFFile
from pyspec.gpu import device, load_model, open_device


def build(shaders: str):
    """The champion on a device of its own, its plans compiled from `shaders`."""
    orig = device.shader_dir
    device.shader_dir = lambda: Path(shaders)
    try:
        m = load_model(open_device(), GGUFFile.open(champion_path()))
        m.limit_context(512)
        m.forward_dispatches(0)
    finally:
        device.shader_dir = orig
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--out", default=None, help="also write the medians here, with provenance")
    args = ap.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    models = {"a": build(args.a), "b": build(args.b)}
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 1000, 150)]
    for m in models.values():
        m.prefill(prompt, 0)
    times = {(name, rows): [] for name in models for rows in rows_list}
    for _ in range(args.reps):
        for rows in rows_list:
            for name, m in models.items():
                m.kv.rollback()
                t0 = time.perf_counter()
                m.feed(prompt[:rows], 0)
                m.steps.upload(1)
                m.dev.submit(m.forward_dispatches(0))
                asyncio.run(m.dev.read(m.logits, 16))
                times[(name, rows)].append(time.perf_counter() - t0)
    out = {f"{name} rows={rows}": round(statistics.median(t) * 1000, 1)
           for (name, rows), t in times.items()}
    result = {"median_ms_per_pass": out, "reps": args.reps, "shaders": {"a": args.a, "b": args.b},
              "adapter": models["a"].dev.name}
    print(json.dumps(result))
    if args.out:
        provenance.write(args.out, provenance.stamp(result, backend="wgpu"))


if __name__ == "__main__":
    main()
