"""Cost of one draft step as a fraction of a champion pass, for a GGUF draft (default: the shipped
trained draft), on the numpy engine and on a native WebGPU adapter (lavapipe here).

    .venv/bin/python -m experiments.bench_draft_cost [--draft PATH] [--reps 7] [--no-gpu] \
        --out F.json

numpy: the champion's one-token pass as the CPU engine runs it (fastcpu.FastModel, exact) against
the draft's as model_draft runs it (model.Model, exact=False, one token after a short prefix),
timed alternately, medians. WebGPU: gpu.measure's one-row pass (encode, submit, 4-byte readback)
for each model (not for an EAGLE-style head: the GPU engine does not run one). A benchmark,
never a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

from pyspec import champion_path, trained_draft_path
from pyspec.apps import provenance
from pyspec.cpu.fastcpu import FastModel
from pyspec.cpu.model import Model
from pyspec.drafters.eagle import EagleHead, is_eagle
from pyspec.drafters.pairing import bind_borrowed
from pyspec.formats.gguf import GGUFFile

PREFIX = [1, 330, 2391, 314, 253, 1092, 30, 441]   # a short prefix of token ids (ctx before the step)


def numpy_step_s(champion: FastModel, draft: Model, reps: int) -> tuple[float, float]:
    """Median seconds of one one-token step at position len(PREFIX): champion, draft. An EAGLE
    head's step includes its input products (drafters/eagle.py: W_f norm(z) + W_e e(y))."""
    def step(model, **kw):
        kv = model.new_cache(64)
        eagle = isinstance(model, EagleHead)
        feed = (lambda ids: dict(inputs=model.inputs(np.ones((len(ids), model.config.d_model),
                                                             np.float32), ids))
                ) if eagle else (lambda ids: {})
        model.forward(PREFIX, kv, **kw, **feed(PREFIX))
        kv.commit(len(PREFIX))
        t0 = time.perf_counter()
        model.forward([42], kv, **kw, **feed([42]))
        return time.perf_counter() - t0

    c, d = [], []
    for _ in range(reps):
        c.append(step(champion))
        d.append(step(draft, exact=False))
    return statistics.median(c), statistics.median(d)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draft", default=None)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--no-gpu", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    draft_path = args.draft or trained_draft_path()
    champion = FastModel.load(champion_path())
    draft_file = GGUFFile.open(draft_path)
    bind_borrowed(draft_file, champion.file)    # a draft may read the champion's embedding
    eagle = is_eagle(draft_file.metadata)
    draft = EagleHead(draft_file, champion) if eagle else Model(draft_file)
    c, d = numpy_step_s(champion, draft, args.reps)
    result = {"draft": draft_path.rsplit("/", 1)[-1], "machine": platform.platform(),
              "numpy": {"champion_pass_s": c, "draft_step_s": d, "draft_over_champion": d / c}}
    if not args.no_gpu and not eagle:   # the GPU engine does not run an EAGLE head (yet)
        from pyspec.gpu import load_model, open_device
        from pyspec.gpu.measure import measure
        dev = open_device()
        gpu_champion = load_model(dev, champion.file, 64)
        g_c = measure(gpu_champion, 3, [1])["pass_s"]["1"]
        g_d = measure(load_model(dev, draft_file, 64, "draft", gpu_champion), 3,
                      [1])["pass_s"]["1"]
        result["wgpu"] = {"adapter": dev.name, "champion_pass_s": g_c, "draft_step_s": g_d,
                          "draft_over_champion": g_d / g_c}
    provenance.write(args.out, provenance.stamp(result))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
