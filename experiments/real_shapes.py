"""Random-weight Q4_K_M models of the real shapes (models/real_shapes.json), and their cost on the
native CPU engine (cpu/fastcpu.py).

  python -m experiments.real_shapes write DIR [--only NAME ...]
      writes DIR/NAME.gguf for each shape: the family's metadata keys at the real numbers (plus
      Llama 3.2's rope_freqs.weight, computed from its rope scaling as llama.cpp's converter
      does), every tensor random and quantized as llama.cpp's Q4_K_M picks (formats/mixes.py:
      Q4_K / Q6_K, and Q5_0 / Q8_0 where a row is not a multiple of 256). Not committed: 0.1
      to 1 GB each. The tokenizer is testmodels' byte-level one padded with unused tokens to the
      real vocabulary size, so the embedding, the head and the tokenizer have the real row count.
  python -m experiments.real_shapes bench DIR [--tokens N] [--max-gb G]
          [--out bench/results/real-shapes.json]
      loads each model on the fast CPU engine in a fresh process, decodes N tokens one pass at a
      time after a 16-token prefill, and records tok/s, weight bytes (as loaded: float32, and
      the file's Q4_K_M bytes), KV bytes per token and the process's peak resident memory;
      writes JSON and a PNG plot beside it. Shapes whose float32 weights exceed --max-gb are
      listed as skipped (this 2-core, 23 GB VM is shared).
Not part of the pyspec runtime.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import resource
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHAPES = ROOT / "models" / "real_shapes.json"
CHUNK = 1 << 22   # values drawn and quantized per step: a 262,144-row embedding stays small


def shapes() -> dict[str, dict]:
    return json.loads(SHAPES.read_text(encoding="utf-8"))["shapes"]


def llama3_rope_factors(s: dict) -> np.ndarray:
    """rope_freqs.weight from Llama 3's rope scaling, as llama.cpp's converter computes it:
    factor 1 for wavelengths under original/high, `factor` above original/low, smooth between."""
    r, hd = s["llama3_rope"], s["head_dim"]
    freqs = 1.0 / s["rope_freq_base"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    low = r["original_max_position_embeddings"] / r["low_freq_factor"]
    high = r["original_max_position_embeddings"] / r["high_freq_factor"]
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high:
            out.append(1.0)
        elif wavelen > low:
            out.append(r["factor"])
        else:
            smooth = ((r["original_max_position_embeddings"] / wavelen - r["low_freq_factor"])
                      / (r["high_freq_factor"] - r["low_freq_factor"]))
            out.append(1 / ((1 - smooth) / r["factor"] + smooth))
    return np.array(out, np.float32)


def tensor_shapes(s: dict) -> dict[str, tuple]:
    """Every tensor's numpy shape for shape `s`, in the family's names (cpu/config.py)."""
    from pyspec.cpu.config import Config, layer_shapes, layer_tensors, tensor_name

    cfg = Config.from_metadata(metadata(s))
    out = {"token_embd.weight": (s["vocab_size"], s["embedding_length"]),
           "output_norm.weight": (s["embedding_length"],)}
    if not s["tied"]:
        out["output.weight"] = out["token_embd.weight"]
    per = layer_shapes(cfg)
    for i in range(cfg.n_layers):
        out |= {tensor_name(i, n): per[n] for n in layer_tensors(cfg)}
    if "llama3_rope" in s:
        out["rope_freqs.weight"] = (s["head_dim"] // 2,)
    return out


def metadata(s: dict) -> dict:
    from pyspec import testmodels

    md = testmodels.family_metadata(
        s["arch"], n_layers=s["block_count"], d=s["embedding_length"], n_heads=s["head_count"],
        n_kv=s["head_count_kv"], head_dim=s["head_dim"], d_ff=s["feed_forward_length"],
        ctx=s["context_length"], **{"rope.freq_base": s["rope_freq_base"],
                                     "attention.layer_norm_rms_epsilon": s["rms_eps"]})
    md = {k: v for k, v in md.items() if "sliding_window" not in k}
    if "sliding_window" in s:   # the pattern: llama.cpp's default (every sixth layer global)
        md[f"{s['arch']}.attention.sliding_window"] = s["sliding_window"]
    return {**md, f"{s['arch']}.vocab_size": s["vocab_size"]}


def uint32_counts(md: dict) -> dict:
    """Non-negative int scalars as UINT32 (numpy uint32, which the writer keeps), as llama.cpp's
    converter writes counts and lengths and its loader requires: scripts/h200.sh runs
    llama-bench on these files."""
    return {k: np.uint32(v) if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else v
            for k, v in md.items()}


def random_tensor(name: str, shape: tuple, type_id: int, rng) -> object:
    """A RawTensor of `shape` drawn N(0, 1/n_in) (norms: 1 + noise) and quantized as `type_id`,
    CHUNK values at a time."""
    from pyspec.formats import ggufwrite, quant

    if len(shape) == 1:
        v = (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        return ggufwrite.RawTensor(quant.quantize(v, type_id), shape, type_id)
    rows = max(1, CHUNK // shape[1])
    parts = [quant.quantize((rng.standard_normal((min(rows, shape[0] - a), shape[1]),
                                                 dtype=np.float32) / np.sqrt(shape[1])),
                            type_id) for a in range(0, shape[0], rows)]
    return ggufwrite.RawTensor(np.concatenate(parts), shape, type_id)


def padded_tokenizer(md: dict, vocab_size: int) -> dict:
    """The byte-level test tokenizer with unused tokens (GGUF token type 5) up to the real
    vocabulary size, so that its tokens and the head's rows agree, as pyspec and llama.cpp
    require."""
    tokens = md["tokenizer.ggml.tokens"]
    pad = vocab_size - len(tokens)
    return {**md, "tokenizer.ggml.tokens": tokens + [f"<unused{i}>" for i in range(pad)],
            "tokenizer.ggml.token_type": md["tokenizer.ggml.token_type"] + [5] * pad}


def write(directory: pathlib.Path, names: list[str]) -> None:
    from pyspec import testmodels
    from pyspec.formats import ggufwrite, mixes, quant

    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        s, t0 = shapes()[name], time.time()
        rng = np.random.default_rng(0)
        shp = tensor_shapes(s)
        types = mixes.q4_k_m_mix(shp)
        tensors = {n: random_tensor(n, shp[n], types[n], rng) for n in shp
                   if n != "rope_freqs.weight"}
        if "rope_freqs.weight" in shp:
            tensors["rope_freqs.weight"] = (llama3_rope_factors(s), quant.F32.type_id)
        md = uint32_counts({**metadata(s), "general.name": f"random-{name}",
                            **padded_tokenizer(testmodels.tokenizer_metadata(), s["vocab_size"])})
        ggufwrite.write(directory / f"{name}.gguf", md, tensors)
        print(f"{name}: {os.path.getsize(directory / f'{name}.gguf') / 1e6:.0f} MB in "
              f"{time.time() - t0:.0f} s", flush=True)


def bench_one(path: str, tokens: int) -> dict:
    """One shape's row (run in a fresh process, so that its peak memory is its own)."""
    from pyspec.cpu.fastcpu import FastModel

    t0 = time.time()
    model = FastModel.load(path)
    load_s = time.time() - t0
    cfg = model.config
    kv = model.new_cache(max_ctx=16 + tokens + 1)
    rng = np.random.default_rng(0)
    model.forward(rng.integers(0, cfg.vocab_size, 16), kv, last_only=True)
    kv.commit(16)
    t0 = time.time()
    for t in rng.integers(0, cfg.vocab_size, tokens):
        model.forward([int(t)], kv)
        kv.commit(1)
    dt = time.time() - t0
    return {"tok_s": tokens / dt, "tokens": tokens, "load_s": load_s,
            "weight_bytes_loaded": model.weight_bytes, "file_bytes": os.path.getsize(path),
            "kv_bytes_per_token": 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def bench(directory: pathlib.Path, tokens: int, max_gb: float, out: pathlib.Path) -> None:
    rows = {}
    for name, s in shapes().items():
        n_params = sum(math.prod(v) for v in tensor_shapes(s).values())
        path = directory / f"{name}.gguf"
        if n_params * 4 > max_gb * 1e9 or not path.exists():
            why = "not written" if not path.exists() else f"float32 weights above {max_gb} GB"
            rows[name] = {"skipped": why, "params": n_params}
            continue
        res = subprocess.run([sys.executable, "-m", "experiments.real_shapes", "one", str(path),
                              str(tokens)], capture_output=True, text=True, check=True, cwd=ROOT)
        rows[name] = {"params": n_params, **json.loads(res.stdout.splitlines()[-1])}
        print(name, rows[name], flush=True)
    doc = {"schema": "pyspec.bench-real-shapes/1", "engine": "fastcpu (native numpy)",
           "machine": f"{os.cpu_count()} cores, shared; load average {os.getloadavg()[0]:.1f} "
                      "at the end: tok/s here are a loaded VM's, not a quiet one's", "rows": rows}
    from pyspec.apps import provenance

    provenance.write(str(out), provenance.stamp(doc, backend="cpu", adapter="cpu-numpy"))
    plot(rows, out.with_suffix(".png"))


def plot(rows: dict, path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = {n: r for n, r in rows.items() if "tok_s" in r}
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.scatter([r["file_bytes"] / 1e6 for r in done.values()], [r["tok_s"] for r in done.values()])
    for n, r in done.items():
        ax.annotate(n, (r["file_bytes"] / 1e6, r["tok_s"]), fontsize=8)
    ax.set_xlabel("Q4_K_M file (MB)")
    ax.set_ylabel("decode tok/s (fastcpu)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    if sys.argv[1:2] == ["one"]:
        print(json.dumps(bench_one(sys.argv[2], int(sys.argv[3]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["write", "bench"])
    ap.add_argument("dir", type=pathlib.Path)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--max-gb", type=float, default=5.0)
    ap.add_argument("--out", type=pathlib.Path,
                    default=ROOT / "bench" / "results" / "real-shapes.json")
    args = ap.parse_args()
    if args.command == "write":
        write(args.dir, args.only or list(shapes()))
    else:
        bench(args.dir, args.tokens, args.max_gb, args.out)


if __name__ == "__main__":
    main()
