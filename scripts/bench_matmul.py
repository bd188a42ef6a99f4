"""Wall-clock benchmark of ops.matmul on the champion's real matrix shapes, per rows of a pass.

Times one dispatch of each matrix (576x576, 192x576, 1536x576, 576x1536 Q4_1, the 49152x576 Q8_0
head, and a random 576x576 f32) at 1, 4, 8 and 16 rows: the wall clock around submit plus a
4-byte readback (which waits for the GPU), median of several runs, and the process CPU time of
the same span (on a CPU adapter it counts the driver's worker threads, and it is steadier than
the wall clock on a shared machine). Prints "wall / cpu" in ms.
Not here: correctness (tests/test_gpu_ops.py), whole-pass timings.

    .venv/bin/python scripts/bench_matmul.py [--runs 7] [--rows 1,4,8,16] [--model x.gguf]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np

from pyspec import champion_path
from pyspec.formats.gguf import GGUFFile
from pyspec.gpu import native, ops
from pyspec.gpu.weights import Weight
from pyspec.gpu.device import ROWS_MAX
from pyspec.gpu.step import Steps

MATRICES = ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_gate.weight",
            "blk.0.ffn_down.weight", "token_embd.weight"]


def weights(dev, path) -> list[Weight]:
    """The champion's matrices of each shape, plus a random 576x576 f32 one."""
    f = GGUFFile.open(path)
    out = [Weight.upload(dev, f, name) for name in MATRICES]
    w = np.random.default_rng(0).standard_normal((576, 576)).astype(np.float32)
    return out + [Weight(dev.upload(w), "f32", w.shape, "random.f32")]


def time_matmul(dev, weight: Weight, rows: int, runs: int,
                matmul=ops.matmul) -> tuple[float, float]:
    """Median (wall, process CPU) seconds of one `matmul` dispatch of `rows` rows, from submit to
    a 4-byte readback."""
    n_out, n_in = weight.shape
    rng = np.random.default_rng(1)
    x = dev.upload(rng.standard_normal((ROWS_MAX, n_in)).astype(np.float32))
    y = dev.buffer(ROWS_MAX * n_out * 4)
    steps = Steps(dev, 1)
    steps.set(0, rows=rows, pos=0)
    steps.upload(1)
    dispatch = [matmul(dev, weight, x, y, steps.binding(0))]

    def once() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        dev.submit(dispatch)
        asyncio.run(dev.read(y, 4))
        return time.perf_counter() - wall, time.process_time() - cpu

    once()  # warm-up: pipeline compile, first touch of the weights
    walls, cpus = zip(*(once() for _ in range(runs)))
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--rows", default="1,4,8,16")
    parser.add_argument("--model", default=None, help="GGUF file (default: the champion)")
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    dev = native.NativeDevice()
    print(f"adapter: {dev.name}; median of {args.runs} runs, wall / cpu ms")
    print(f"{'matrix':<24}{'kind':<6}{'shape':>10}" + "".join(f"{f'rows={r}':>18}" for r in rows))
    for w in weights(dev, args.model or champion_path()):
        times = [time_matmul(dev, w, r, args.runs) for r in rows]
        cells = "".join(f"{f'{wall * 1e3:.2f} / {cpu * 1e3:.2f}':>18}" for wall, cpu in times)
        print(f"{w.name:<24}{w.kind:<6}{f'{w.shape[0]}x{w.shape[1]}':>10}{cells}", flush=True)


if __name__ == "__main__":
    main()
