"""Chain passes of a model with two sides of the product kernels, interleaved on one adapter: did a
shader change slow the chain down? (Issue 48 checked with it that the tree pass left chains alone.)

    .venv/bin/python -m experiments.shader_ab A_SHADERS B_SHADERS [--model X.gguf] [--reps 7]
        [--rows 1,8] [--out F.json]
    .venv/bin/python -m experiments.shader_ab --matmul [--model X.gguf ...] [--reps 7]
        [--rows 1,8] [--split] [--out F.json]
        (--split: a GPU's work split on a CPU adapter, to check the script on lavapipe)

Two shader folders: A_SHADERS is typically an older commit's (`git archive REV shaders | tar x -C
DIR`). --matmul: both sides from shaders/, the GPU's quantized products on side "blocks" taking
matmul.wgsl's lanes of whole blocks (ops.GPU_MATMUL = "blocks", what PYSPEC_MATMUL=blocks sets;
the kernel before) and on side "coalesced" matmul_coalesced.wgsl (the default). The model is the
champion unless --model names GGUFs (e.g. experiments/real_shapes.py's random Q4_K_M shapes).

Each side's plans are built on a device of its own; after a 150-token prefill, passes over each
row count alternate between the sides (rolled back each time). One JSON line per model (with its
sha256 and the commit), by "side rows=N": median_ms_per_pass (wall: submit and a 16-byte
readback), gpu_ms_per_pass (timestamps at a whole pass's ends, where the adapter has them) and
matmul_gpu_ms (the products' sum in a profile of a compute pass per dispatch, so each carries a
pass's overhead); per side, whether row i of the widest pass equals a one-row pass at its
position bit for bit (batch_invariant); and the logits' largest difference from the first side
relative to their largest magnitude (max_rel_diff: the kernels sum in other orders). Not part
of the runtime.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from pathlib import Path

import numpy as np

from pyspec import champion_path
from pyspec.apps import provenance
from pyspec.formats.gguf import GGUFFile
from pyspec.gpu import device, load_model, ops, open_device

PROMPT = 150   # tokens prefilled before the timed passes
CONTEXT = 512  # positions the KV cache holds (a real shape's own context would not fit)


@contextlib.contextmanager
def side(shaders: Path, matmul: str):
    """Plans built inside take their pipelines from `shaders` and GPU_MATMUL = `matmul`."""
    orig = device.shader_dir, ops.GPU_MATMUL
    device.shader_dir, ops.GPU_MATMUL = (lambda: shaders), matmul
    try:
        yield
    finally:
        device.shader_dir, ops.GPU_MATMUL = orig


def prompt_of(vocab: int) -> list[int]:
    """The prefilled prompt: PROMPT ids drawn below min(vocab, 1000), seed 0."""
    return [int(t) for t in np.random.default_rng(0).integers(0, min(vocab, 1000), PROMPT)]


def build(path: str, shaders: Path, matmul: str, split: bool = False):
    """The model on a device of its own, its plans built inside side(shaders, matmul) and
    prompt_of(its vocabulary) prefilled. `split`: a GPU's work split on a CPU adapter."""
    with side(shaders, matmul):
        dev = open_device(timestamps=True)
        dev.is_cpu = dev.is_cpu and not split
        m = load_model(dev, GGUFFile.open(path), max_ctx=CONTEXT)
        m.forward_dispatches(0)
        m.prefill(prompt_of(m.config.vocab_size), 0)
    return m


def one_pass(m, tokens: list[int]) -> None:
    """A pass over `tokens` after the prefill (rolled back first), its logits' first 16 bytes
    read back."""
    m.kv.rollback()
    m.feed(tokens, 0)
    m.steps.upload(1)
    m.dev.submit(m.forward_dispatches(0))
    asyncio.run(m.dev.read(m.logits, 16))


def logits_and_invariance(m, tokens: list[int]) -> tuple[np.ndarray, bool]:
    """(the logits of one pass over `tokens`, whether each of its rows equals bit for bit a
    one-row pass at that position), after the prefill; the cache is left as the prefill left it."""
    base = m.kv.committed
    m.kv.rollback()
    wide = asyncio.run(m.read_logits(tokens, 0))
    m.kv.rollback()
    single = []
    for t in tokens:
        single.append(asyncio.run(m.read_logits([t], 0)))
        m.kv.commit(1)
    m.kv.truncate(base)
    return wide, wide.tobytes() == np.concatenate(single).tobytes()


def gpu_ms(m, tokens: list[int]) -> tuple[float | None, float | None]:
    """(GPU ms of the whole pass, GPU ms of its products in a profile) or Nones without
    timestamps."""
    if not m.dev.timestamps:
        return None, None
    m.kv.rollback()
    m.feed(tokens, 0)
    m.steps.upload(1)
    whole = m.dev.time_pass(m.forward_dispatches(0))
    products = sum(s for kernel, s in m.dev.profile(m.forward_dispatches(0))
                   if kernel.startswith("matmul"))
    m.kv.rollback()
    return round(whole * 1000, 3), round(products * 1000, 3)


def compare(path: str, sides: dict, rows_list: list[int], reps: int, split: bool) -> dict:
    """The JSON line of one model: sides {name: (shaders, matmul)}."""
    models = {name: build(path, shaders, matmul, split)
              for name, (shaders, matmul) in sides.items()}
    prompt = prompt_of(next(iter(models.values())).config.vocab_size)
    times = {(name, rows): [] for name in models for rows in rows_list}
    for _ in range(reps):
        for rows in rows_list:
            for name, m in models.items():
                t0 = time.perf_counter()
                one_pass(m, prompt[:rows])
                times[(name, rows)].append(time.perf_counter() - t0)
    out = {"model": Path(path).name, "model_sha256": provenance.sha256_file(path),
           "adapter": next(iter(models.values())).dev.name, "reps": reps,
           **provenance.git_commit(),
           "median_ms_per_pass": {f"{name} rows={rows}": round(statistics.median(t) * 1000, 3)
                                  for (name, rows), t in times.items()},
           "gpu_ms_per_pass": {}, "matmul_gpu_ms": {}, "batch_invariant": {}, "max_rel_diff": {}}
    first = None
    for name, m in models.items():
        for rows in rows_list:
            whole, products = gpu_ms(m, prompt[:rows])
            out["gpu_ms_per_pass"][f"{name} rows={rows}"] = whole
            out["matmul_gpu_ms"][f"{name} rows={rows}"] = products
        logits, same = logits_and_invariance(m, prompt[:max(rows_list)])
        out["batch_invariant"][name] = same
        first = logits if first is None else first
        out["max_rel_diff"][name] = float(np.max(np.abs(logits - first))
                                          / (np.max(np.abs(first)) + 1e-30))
    for m in models.values():
        m.dev.destroy()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folders", nargs="*", metavar="SHADERS", help="A_SHADERS B_SHADERS")
    ap.add_argument("--matmul", action="store_true",
                    help="sides blocks / coalesced: ops.GPU_MATMUL, both from shaders/")
    ap.add_argument("--model", action="append", help="a GGUF (repeatable); default the champion")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--out", default=None, help="also write the lines here, with provenance")
    ap.add_argument("--split", action="store_true",
                    help="take a GPU's work split on a CPU adapter (to check the script there)")
    args = ap.parse_args()
    here = device.shader_dir()
    if args.matmul == bool(args.folders) or (args.folders and len(args.folders) != 2):
        ap.error("give two shader folders (A_SHADERS B_SHADERS) or --matmul")
    sides = ({"blocks": (here, "blocks"), "coalesced": (here, "coalesced")} if args.matmul else
             {"a": (Path(args.folders[0]), ops.GPU_MATMUL),
              "b": (Path(args.folders[1]), ops.GPU_MATMUL)})
    rows_list = [int(r) for r in args.rows.split(",")]
    lines = []
    for path in args.model or [champion_path()]:
        lines.append(compare(path, sides, rows_list, args.reps, args.split))
        print(json.dumps(lines[-1]), flush=True)
    if args.out:
        provenance.write(args.out, provenance.stamp({"models": lines}, backend="wgpu"))
        plot({"models": lines}, Path(args.out).with_suffix(".png"))


def plot(result: dict, png: Path) -> None:
    """GPU ms per pass (the queries' time, else the wall's) per model, side and rows."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = result["models"]
    key = "gpu_ms_per_pass" if all(m.get("gpu_ms_per_pass") for m in models) else \
        "median_ms_per_pass"
    bars = list(models[0][key])                     # "SIDE rows=N", in the run's order
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(bars)
    for i, bar in enumerate(bars):
        xs = [j + i * width for j in range(len(models))]
        ys = [m[key].get(bar, 0) for m in models]
        ax.bar(xs, ys, width, label=bar)
        for x, y in zip(xs, ys):
            ax.annotate(f"{y:.2f}", (x, y), ha="center", va="bottom", fontsize=7)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(models))],
                  [m["model"].removesuffix(".gguf") for m in models])
    ax.set_ylabel("GPU ms per pass (median)" if key == "gpu_ms_per_pass"
                  else "wall ms per pass (median)")
    ax.set_title(f"Quantized products, sides interleaved on {models[0]['adapter']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main()
