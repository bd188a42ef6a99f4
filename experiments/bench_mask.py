"""What the JSON-schema mask and the filters cost per row on the device (shaders/filter.wgsl),
against the host accept they replace (issue 12).

    .venv/bin/python -m experiments.bench_mask --out bench/results/mask-lavapipe.json [--reps 5] \
        [--split both|on|off]

Masks are the real ones: the champion's vocabulary (49,152 tokens) and the schemas of
bench/json_prompts.jsonl, along each prompt's `document` (a valid answer), with warm masks (a
cold mask's own cost is bench_json.py's `mask_cost`). Per cycle of r rows (r = k + 1: 1, 5, 16):
  words_ms      host: JsonMask.words, the r rows' bits packed (r * 6 KB)
  upload_ms     host: the queue write of those bits
  readback_ms   host accept: reading back the r logits rows (less a 16-byte readback)
  host_mask_ms  host accept: numpy's mask on them (JsonMask.apply)
Per r, on the device (`reps` plans in one submission, less an empty submission, per plan;
median of 3): filter_rows with the mask alone, and with top_k 40, top_p 0.9, min_p 0.05 and all
three (T = 0.8, no mask) on random normal rows (flat: the host's worst case for top_p, whose
1024-candidate shortcut then sorts the whole row), both ways unless --split says one:
`device_<filter>_ms` one workgroup per row (filter.wgsl's filter_rows, the software adapters'
default) and `device_<filter>_split_ms` split over each row (filter_split.wgsl's ten kernels,
a GPU's default); and numpy's processors.Filters on the same rows (`host_<filter>_ms`). For
scale, `device_argmax_ms`: argmax_rows, which every greedy cycle runs anyway, on the same rows.
Wall-clock medians with [min, max]; the load average is recorded, since a shared machine's other
work lands in wall time. Timing goals live here, never in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from pyspec import champion_path
from pyspec.apps import provenance
from pyspec.rules import jsonmask
from pyspec.formats.gguf import GGUFFile
from pyspec.gpu import native, sampling
from pyspec.gpu.device import ROWS_MAX
from pyspec.gpu.step import Steps
from pyspec.rules.processors import Filters
from pyspec.text.tokenizer import Tokenizer

PROMPTS = Path(__file__).resolve().parent.parent / "bench" / "json_prompts.jsonl"
ROWS = (1, 5, 16)
FILTERS = {"mask": {}, "top_k": {"top_k": 40}, "top_p": {"top_p": 0.9},
           "min_p": {"min_p": 0.05}, "all": {"top_k": 40, "top_p": 0.9, "min_p": 0.05}}


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - t)


def gpu_ms(dev, commands: list, reps: int, probe) -> float:
    """ms per command of `commands` submitted reps times in one submission (less an empty
    submission and its 16-byte readback)."""
    def once(cmds):
        t = time.perf_counter()
        dev.submit(cmds)
        asyncio.run(dev.read(probe, 16))
        return time.perf_counter() - t
    once(commands)   # the pipeline is compiled
    full = statistics.median(once(commands * reps) for _ in range(3))
    empty = statistics.median(once([]) for _ in range(3))
    return 1e3 * max(full - empty, 0.0) / reps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--champion", default=None)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cycles", type=int, default=12, help="cycles measured per prompt")
    ap.add_argument("--split", choices=("both", "on", "off"), default="both",
                    help="time filter_rows split over each row, one workgroup per row, or both")
    args = ap.parse_args(argv)
    tok = Tokenizer.from_metadata(GGUFFile.open(args.champion or champion_path()).metadata)
    vocab = tok.vocab_size
    dev = native.NativeDevice()
    load = [os.getloadavg()[0]]
    fresh = np.random.default_rng(0).standard_normal((ROWS_MAX, vocab)).astype(np.float32)
    logits = dev.upload(fresh)                                                # (R, vocab)
    words = dev.buffer(4 * ROWS_MAX * sampling.mask_words(vocab))
    weights = dev.buffer(4 * ROWS_MAX * vocab)
    probe = dev.buffer(16)
    steps = Steps(dev, 1)
    plans = {}
    ways = {"both": (False, True), "on": (True,), "off": (False,)}[args.split]
    for name, f in FILTERS.items():
        params = sampling.filter_params(dev, vocab)
        sampling.set_filters(dev, params, vocab, name == "mask", **f)
        for split in ways:
            plans[name + ("_split" if split else "")] = sampling.filter_rows(
                dev, params, logits, words, weights, steps.binding(0), vocab=vocab, split=split)
    plans["argmax"] = sampling.argmax_rows(dev, logits, dev.buffer(4 * ROWS_MAX),
                                           dev.buffer(4 * ROWS_MAX), steps.binding(0),
                                           vocab=vocab)
    cache: dict = {}
    items = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    host_rows = fresh.astype(np.float64)                                      # (R, vocab)
    per_rows = {}
    for r in ROWS:
        m = {"words_ms": [], "upload_ms": [], "readback_ms": [], "host_mask_ms": []}
        for item in items:
            c = jsonmask.constrain(cache, tok, item["schema"], 0)
            ids = tok.encode(json.dumps(item["document"], separators=(",", ":"),
                                        ensure_ascii=False)) + [tok.eos_id]
            proc = jsonmask.JsonMask(c)
            step = max(1, (len(ids) - r) // args.cycles)
            for at in range(0, max(len(ids) - r, 1), step):
                prefix, drafts = ids[:at], ids[at:at + r - 1]
                proc.words(prefix, drafts, r, vocab)          # warm: this cycle's masks
                t = time.perf_counter()
                bits = proc.words(prefix, drafts, r, vocab)   # (r, words)
                t1 = time.perf_counter()
                dev.write(words, bits)
                t2 = time.perf_counter()
                m["words_ms"].append(1e3 * (t1 - t))
                m["upload_ms"].append(1e3 * (t2 - t1))
                t = time.perf_counter()
                rows = asyncio.run(dev.read_array(logits, np.float32, (r, vocab)))
                t1 = time.perf_counter()
                asyncio.run(dev.read(probe, 16))
                t2 = time.perf_counter()
                proc.apply(rows.astype(np.float64), prefix, drafts)
                t3 = time.perf_counter()
                m["readback_ms"].append(1e3 * ((t1 - t) - (t2 - t1)))
                m["host_mask_ms"].append(1e3 * (t3 - t2))
        steps.set(0, rows=r, pos=0, temperature=0.8, mode="rejection")
        steps.upload()
        out = {k: summary(v) for k, v in m.items()}
        for name, plan in plans.items():
            dev.write(logits, fresh)   # the mask's rows are the last cycle's real masks
            out[f"device_{name}_ms"] = gpu_ms(dev, [plan], args.reps, probe)
        for name, f in FILTERS.items():
            if name != "mask":
                out[f"host_{name}_ms"] = statistics.median(
                    timed(lambda: Filters(0.8, **f).apply(host_rows[:r], [], []))
                    for _ in range(3))
        out["per_row_ms"] = {k: (v["median"] if isinstance(v, dict) else v) / r
                             for k, v in out.items()}
        per_rows[r] = out
        print(r, json.dumps(out["per_row_ms"]), flush=True)
    load.append(os.getloadavg()[0])
    result = {"machine": {"platform": platform.platform(), "python": platform.python_version(),
                          "cpus": os.cpu_count(), "load_average_1min": load},
              "adapter": dev.name, "vocab": vocab, "mask_bytes_per_row": 4 * (-(-vocab // 32)),
              "reps": args.reps, "prompts": len(items), "filters": FILTERS, "split": args.split,
              "rows": per_rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    provenance.write(args.out, provenance.stamp(result, champion=args.champion))
    return 0


if __name__ == "__main__":
    sys.exit(main())
