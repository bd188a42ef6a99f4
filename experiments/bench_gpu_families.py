"""A one-token GPU pass per model family on the native adapter (lavapipe here): dispatches per
layer and pass time, at each family's smallest real width and vocabulary with a few layers.

A real model's pass is embedding + n_layers x layer + head, so the script builds random Q8_0
models of `--layers` layers at the real shape (testmodels.family_weights; tied embeddings, as the
real files have) and times the pass at two layer counts: their difference gives a layer's cost,
the rest is the embedding and the head (a vocabulary past one 128 MiB binding goes in parts:
weights.upload_rows). The real model's pass is then estimated as head + n_layers x layer and
reported as an estimate beside the measured passes; the champion's own file is measured whole.
Time is the process's CPU seconds (lavapipe runs its threads in this process, so it is the work
done whatever the machine's other load) and wall seconds, each the minimum over `--reps` passes
after a warm-up.

    .venv/bin/python -m experiments.bench_gpu_families [--layers 2,4] [--reps 4] [--vocab N]
        [--out F]

bench/results/lavapipe-families.json: --vocab 4096 --layers 1,3 --reps 3 (the real vocabularies'
random weights took longer than the time this was measured in), on a machine shared by other
work (hence the wall seconds, many times the CPU seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pyspec import champion_path, testmodels
from pyspec.apps import provenance
from pyspec.formats import ggufwrite, quant
from pyspec.formats.gguf import GGUFFile
from pyspec.gpu import load_model, open_device
from pyspec.gpu.model import dispatches_per_layer

# The smallest real model of each family: its shape (config.json of the Hugging Face release,
# as llama.cpp's converter writes it) and its layer count.
REAL = {
    "llama": ("Llama-3.2-1B", 16, dict(d=2048, n_heads=32, n_kv=8, head_dim=64, d_ff=8192),
              128256, {"rope.freq_base": 500000.0}),
    "qwen2": ("Qwen2.5-0.5B", 24, dict(d=896, n_heads=14, n_kv=2, head_dim=64, d_ff=4864),
              151936, {}),
    "qwen3": ("Qwen3-0.6B", 28, dict(d=1024, n_heads=16, n_kv=8, head_dim=128, d_ff=3072),
              151936, {}),
    "gemma3": ("Gemma-3-270M", 18, dict(d=640, n_heads=4, n_kv=1, head_dim=256, d_ff=2048),
               262144, {"attention.sliding_window": 512, "attention.sliding_window_pattern": 6}),
}


def write(path: Path, arch: str, n_layers: int, vocab: int = 0) -> None:
    """A random Q8_0 model of `arch`'s real shape with n_layers layers and a tied head (of
    `vocab` rows instead of the real vocabulary's where given)."""
    _, _, shape, real_vocab, extra = REAL[arch]
    vocab = vocab or real_vocab
    w = testmodels.family_weights(arch, vocab, n_layers=n_layers, seed=0, **shape)
    del w["output.weight"]
    md = testmodels.family_metadata(arch, n_layers=n_layers, ctx=512, **shape, **extra)
    md[f"{arch}.vocab_size"] = vocab
    ggufwrite.write(path, md, testmodels.tensor_types(w, quant.Q8_0.type_id, quant.Q8_0.type_id))


async def one_pass(model) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one 1-row pass at position 0 with a 4-byte readback."""
    model.kv.truncate(0)
    c0, t0 = time.process_time(), time.perf_counter()
    model.feed([5], 0)
    model.steps.upload(1)
    model.dev.submit(model.forward_dispatches(0))
    await model.dev.read(model.logits, 4)
    return time.process_time() - c0, time.perf_counter() - t0


def measure(dev, path: Path, reps: int) -> dict:
    """Dispatches, the head's parts and the fastest pass (CPU and wall seconds) of the model at
    `path`, whose buffers are freed afterwards."""
    with dev.owned([]) as buffers:
        model = load_model(dev, GGUFFile.open(path), max_ctx=512)
        runs = [asyncio.run(one_pass(model)) for _ in range(reps + 1)][1:]
        out = {"dispatches": len(model.forward_dispatches(0)),
               "per_layer": dispatches_per_layer(model.config, dev.is_cpu),
               "head_parts": len(getattr(model.head, "parts", [model.head])),
               "cpu_s": round(min(c for c, _ in runs), 4),
               "wall_s": round(min(w for _, w in runs), 4)}
    dev.free(buffers)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", default="2,4", help="two layer counts, comma-separated")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--families", default=",".join(REAL))
    ap.add_argument("--vocab", type=int, default=0,
                    help="a smaller vocabulary than the real one (the layers' cost is the same; "
                         "the embedding and head's shrinks), 0: the real one")
    ap.add_argument("--out", default="bench/results/lavapipe-families.json")
    args = ap.parse_args()
    lo, hi = (int(n) for n in args.layers.split(","))
    dev = open_device()
    rows = {}
    for arch in args.families.split(","):
        name, n_layers, *_ = REAL[arch]
        passes = {}
        with tempfile.TemporaryDirectory() as tmp:
            for n in (lo, hi):
                path = Path(tmp) / f"{arch}-{n}.gguf"
                write(path, arch, n, args.vocab)
                passes[n] = measure(dev, path, args.reps)
                path.unlink()
        layer = {k: (passes[hi][k] - passes[lo][k]) / (hi - lo) for k in ("cpu_s", "wall_s")}
        rest = {k: passes[lo][k] - lo * layer[k] for k in layer}
        rows[arch] = {"model": name, "layers": n_layers, "passes": passes,
                      "vocab": args.vocab or REAL[arch][3],
                      "dispatches_per_layer": passes[hi]["per_layer"],
                      "layer_cpu_s": round(layer["cpu_s"], 4),
                      "embed_head_cpu_s": round(rest["cpu_s"], 4),
                      "estimated_layers_cpu_s": round(n_layers * layer["cpu_s"], 3)}
        if not args.vocab:
            rows[arch]["estimated_pass_cpu_s"] = round(rest["cpu_s"]
                                                       + n_layers * layer["cpu_s"], 3)
        assert (passes[hi]["dispatches"] - passes[lo]["dispatches"]
                == (hi - lo) * passes[hi]["per_layer"]), "the plan and dispatches_per_layer differ"
        print(arch, json.dumps(rows[arch]), flush=True)
    rows["champion"] = {"model": "SmolLM2-135M (the champion's file, llama)", "layers": 30,
                        "pass": measure(dev, Path(champion_path()), args.reps)}
    print("champion", json.dumps(rows["champion"]), flush=True)
    provenance.write(args.out, provenance.stamp({"adapter": dev.name, "families": rows}))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
