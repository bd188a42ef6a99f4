"""The real shapes on a GPU through native WebGPU, beside llama.cpp's CUDA llama-bench: decode and
prefill speed, the fraction of HBM bandwidth each reaches, pyspec's dispatches per pass, and the
verify cost by rows that decides where speculation and trees pay.

  python -m experiments.gpu_shapes measure DIR --names A,B [--champion F] --out RAW.json
      on the GPU machine (scripts/h200.sh shapes): each DIR/NAME.gguf (experiments/real_shapes.py
      write) loaded on the native adapter with timestamps; per model the pass seconds for 1..16
      rows (gpu/measure.py: medians, wall clock around submit + one readback), GPU seconds of a
      1-, 8- and 16-row pass, a decode loop (DECODE one-token passes from position 0, each
      awaited: what a cycle without drafts pays), a prefill of PREFILL tokens (16 rows a
      submission, no head, one readback at the end), the weights' bytes and the dispatches.
  python -m experiments.gpu_shapes report RAW.json [LLAMA_BENCH.json ...]
          --out bench/results/h200-shapes.json
      here: joins llama-bench's JSON (-o json; the model named by its file) to the native rows,
      computes bandwidth fractions against NVIDIA's figure for the GPU measured (H200 4.8 TB/s,
      H100 SXM 3.35 TB/s: HBM_BY_GPU), writes the JSON with the measuring run's provenance and a
      plot beside it.

The weights are random (Q4_K_M as llama.cpp picks: formats/mixes.py), so only speed is measured.
Bytes per decoded token are taken as the weights' bytes: every weight is read once per pass; the
KV rows read are negligible at these positions (< 1%). Not part of the pyspec runtime.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
HBM_SPEC = 4.8e12        # bytes/s, H200 HBM3e (NVIDIA's figure)
# NVIDIA's memory bandwidth figures by the adapter's name (the first that the name contains).
HBM_BY_GPU = (("H200", 4.8e12), ("H100 PCIe", 2.0e12), ("H100 NVL", 3.9e12), ("H100", 3.35e12))


def hbm_spec(adapter: str) -> float:
    """The memory bandwidth NVIDIA gives for the adapter named (H200's when it names none)."""
    return next((bw for name, bw in HBM_BY_GPU if name in (adapter or "")), HBM_SPEC)


async def decode_loop(model, n: int) -> float:
    """Seconds for n one-token passes from position 0, each committed and awaited."""
    model.kv.truncate(0)
    t0 = time.perf_counter()
    for i in range(n):
        model.feed([(31 * i + 7) % model.config.vocab_size], 0)
        model.steps.upload(1)
        model.dev.submit(model.forward_dispatches(0))
        await model.dev.read(model.logits, 4)
        model.kv.commit(1)
    seconds = time.perf_counter() - t0
    model.kv.truncate(0)
    return seconds


async def prefill_seconds(model, n: int) -> float:
    prompt = [(17 * i + 3) % model.config.vocab_size for i in range(n + 1)]
    model.kv.truncate(0)
    t0 = time.perf_counter()
    model.prefill(prompt, 0)
    await model.dev.read(model.logits, 4)
    seconds = time.perf_counter() - t0
    model.kv.truncate(0)
    return seconds


def measure_one(dev, path: Path, decode: int, prefill: int) -> dict:
    from pyspec.formats.gguf import GGUFFile
    from pyspec.gpu import load_model
    from pyspec.gpu.measure import measure

    t0 = time.perf_counter()
    with dev.owned([]) as buffers:
        model = load_model(dev, GGUFFile.open(path), max_ctx=prefill + 64)
        load_s = time.perf_counter() - t0
        row = {"file_bytes": path.stat().st_size, "weight_bytes": model.weight_bytes,
               "device_bytes": dev.allocated, "load_s": round(load_s, 2),
               "n_layers": model.config.n_layers, "vocab": model.config.vocab_size,
               "dispatches_per_pass": len(model.forward_dispatches(0)),
               "rows": measure(model)}
        asyncio.run(decode_loop(model, 8))   # warm-up
        row["decode_s"] = min(asyncio.run(decode_loop(model, decode)) for _ in range(3))
        row["decode_tok_s"] = decode / row["decode_s"]
        row["prefill_s"] = min(asyncio.run(prefill_seconds(model, prefill)) for _ in range(3))
        row["prefill_tok_s"] = prefill / row["prefill_s"]
        row["decode_tokens"], row["prefill_tokens"] = decode, prefill
    dev.free(buffers)
    return row


def cmd_measure(args) -> None:
    from pyspec.apps import provenance
    from pyspec.gpu import open_device

    dev = open_device(timestamps=True)
    paths = {n: Path(args.dir) / f"{n}.gguf" for n in args.names.split(",") if n}
    if args.champion:
        paths = {"SmolLM2-135M (champion, Q4_1)": Path(args.champion), **paths}
    rows = {}
    for name, path in paths.items():
        try:
            rows[name] = measure_one(dev, path, args.decode, args.prefill)
        except Exception as e:    # one shape's failure is a result too; the others still run
            rows[name] = {"error": f"{type(e).__name__}: {e}"}
        print(name, json.dumps({k: v for k, v in rows[name].items() if k != "rows"}), flush=True)
        result = {"adapter": dev.name, "models": rows}
        provenance.write(args.out, provenance.stamp(
            result, models={n: str(p) for n, p in paths.items()}, backend="wgpu"))


def llama_rows(files: list[str]) -> dict:
    """{model file stem: {"pp": tok/s, "tg": tok/s, ...}} from llama-bench's -o json files."""
    out = {}
    for f in files:
        text = Path(f).read_text()
        if not text.strip():
            continue
        for r in json.loads(text):
            name = Path(r["model_filename"]).stem
            kind = f"pp{r['n_prompt']}" if r["n_prompt"] and not r["n_gen"] else "tg"
            out.setdefault(name, {"model_type": r.get("model_type"), "gpu": r.get("gpu_info"),
                                  "build": r.get("build_commit"), "model_size": r["model_size"]})
            out[name][f"{kind}_tok_s"] = r["avg_ts"]
            out[name][f"{kind}_tok_s_stddev"] = r["stddev_ts"]
            out[name][f"{kind}_tokens"] = r["n_prompt"] or r["n_gen"]
    return out


def cmd_report(args) -> None:
    raw = json.loads(Path(args.raw).read_text())
    hbm = hbm_spec(raw.get("adapter", ""))
    peer = llama_rows(args.llama)
    extra = json.loads(Path(args.raw_extra).read_text())["models"] if args.raw_extra else {}
    table = []
    for name, row in raw["models"].items():
        if "error" in row:
            table.append({"model": name, "error": row["error"]})
            continue
        stem = "champ" if name.startswith("SmolLM2-135M (") else name
        lc = peer.get(stem, {})
        ratio = row["rows"]["verify_cost_ratio"]
        entry = {
            "model": name, "layers": row["n_layers"], "vocab": row["vocab"],
            "file_mb": round(row["file_bytes"] / 1e6, 1),
            "dispatches_per_pass": row["dispatches_per_pass"],
            "pyspec_decode_tok_s": round(row["decode_tok_s"], 1),
            "pyspec_prefill_tok_s": round(row["prefill_tok_s"], 1),
            "pyspec_hbm_fraction": round(row["weight_bytes"] * row["decode_tok_s"] / hbm, 3),
            "pyspec_gpu_pass_1_row_ms": round(row["rows"].get("gpu_pass_s", {}).get("1", 0) * 1e3, 3),
            "verify_cost_ratio": {k: round(v, 3) for k, v in ratio.items()},
        }
        if lc:
            entry.update({
                "llama_cpp_decode_tok_s": round(lc.get("tg_tok_s", 0), 1),
                **{f"llama_cpp_prefill_{k[2:-6]}_tok_s": round(v, 1) for k, v in lc.items()
                   if k.startswith("pp") and k.endswith("_tok_s")},
                "llama_cpp_hbm_fraction": round(lc["model_size"] * lc.get("tg_tok_s", 0) / hbm, 3),
                "decode_ratio_pyspec_over_llama_cpp": round(row["decode_tok_s"] / lc["tg_tok_s"], 3)
                if lc.get("tg_tok_s") else None})
        entry.update(page_side(name, args, lc, hbm, row["weight_bytes"]))
        if name in extra:
            entry[f"pyspec_prefill_{extra[name]['prefill_tokens']}_tok_s"] = round(
                extra[name]["prefill_tok_s"], 1)
            entry["pyspec_decode_tok_s_second_run"] = round(extra[name]["decode_tok_s"], 1)
        table.append(entry)
    from pyspec.apps import provenance
    out = {"schema": "pyspec.gpu-shapes/1", "about": __doc__.split("\n")[0],
           "hbm_bytes_per_s": {"spec": hbm, "gpu": raw.get("adapter")},
           "table": table, "llama_bench": peer,
           # the measure run as written there, its provenance hoisted (below)
           "native_raw": {k: v for k, v in raw.items() if k != "provenance"},
           "dawn_raw": {Path(f).name: dawn_summary(f) for f in args.dawn + args.null + args.dawn_busy},
           # go/no-go: what Dawn (npm webgpu, the page's WebGPU) said of the GPU, and the GPU
           "dawn_probe": json.loads(Path(args.probe).read_text()) if args.probe else None,
           "nvidia_smi": Path(args.smi).read_text().strip() if args.smi else None}
    # (a raw of before this module kept the command as run beside its provenance)
    out = provenance.stamp(out) if "provenance" not in raw else {**out, "provenance": raw["provenance"]}
    out["provenance"] = {**out["provenance"], "report_command": provenance.command(),
                         **({"command": raw["command"]} if "command" in raw else {})}
    if args.tree_commit:      # the runner's check of the copy there (h200.sh recv), see --help
        # What the copy's own .git said there (the session's first commit, the files differing
        # from it as any later commit's do) is kept; the commit is the one the files equal.
        said = out["provenance"]
        out["provenance"] = {**said, "copy_git_head": said.get("commit"),
                             "copy_git_head_differs": said.get("dirty"),
                             "commit": args.tree_commit, "dirty": False,
                             "commit_checked": args.tree_evidence}
    provenance.write(args.out, out, here="provenance" not in raw)
    plot(table, Path(args.out).with_suffix(".png"), raw.get("adapter", "GPU"))
    for e in table:
        print(json.dumps({k: v for k, v in e.items() if k != "verify_cost_ratio"}))


def dawn_summary(path: str) -> dict:
    """One harness answer (webtools/dawn.mjs, --repeat runs of one prompt): tok/s median and
    range, host and wait ms per cycle, cycles gone ahead, the adapter."""
    answer = json.loads(Path(path).read_text())
    runs = answer["runs"]
    tok_s = [r["stats"]["tokens_per_s"] for r in runs]
    timing = [r["stats"]["backend_timing"] for r in runs]
    cycles = sum(t["cycles"] for t in timing)
    return {"adapter": answer.get("adapter"), "runs": len(runs), "warmup": answer.get("warmup"),
            "tokens": [len(r["tokens"]) for r in runs],
            "tokens_per_s": {"median": round(statistics.median(tok_s), 1),
                             "min": round(min(tok_s), 1), "max": round(max(tok_s), 1)},
            "host_ms_per_cycle": round(sum(t["host_s"] for t in timing) / cycles * 1e3, 3),
            "wait_ms_per_cycle": round(sum(t["wait_s"] for t in timing) / cycles * 1e3, 3),
            "ahead_share": round(sum(t["ahead"] for t in timing) / cycles, 3)}


def page_side(name: str, args, lc: dict, hbm: float, weight_bytes: int) -> dict:
    """The shape's columns from the page's stack: Dawn (webtools/dawn.mjs on the GPU), the same
    stack on the null GPU (its own per-cycle cost), Dawn during llama.cpp's build (a busy host)."""
    def find(files, prefix):
        return next((f for f in files if Path(f).name == f"{prefix}{name}.json"), None)
    out = {}
    for key, files, prefix in (("dawn", args.dawn, "dawn-"), ("null_gpu", args.null, "null-"),
                               ("dawn_busy_host", args.dawn_busy, "dawn-shape-")):
        f = find(files, prefix)
        if f:
            d = dawn_summary(f)
            out[f"{key}_decode_tok_s"] = d["tokens_per_s"]
            out[f"{key}_host_ms_per_cycle"] = d["host_ms_per_cycle"]
    if "dawn_decode_tok_s" in out:
        med = out["dawn_decode_tok_s"]["median"]
        out["dawn_hbm_fraction"] = round(weight_bytes * med / hbm, 3)
        if lc.get("tg_tok_s"):
            out["decode_ratio_dawn_over_llama_cpp"] = round(med / lc["tg_tok_s"], 3)
    return out


def plot(table: list[dict], png: Path, gpu: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [e for e in table if "error" not in e]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    x = np.arange(len(rows))
    a.bar(x - 0.27, [e["pyspec_decode_tok_s"] for e in rows], 0.27,
          label="pyspec native wgpu-py (each pass awaited)")
    a.bar(x, [e.get("dawn_decode_tok_s", {}).get("median", 0) for e in rows], 0.27,
          label="pyspec in the page's stack (Dawn, pipelined)")
    a.bar(x + 0.27, [e.get("llama_cpp_decode_tok_s", 0) for e in rows], 0.27,
          label="llama.cpp CUDA (llama-bench tg128)")
    a.set_xticks(x, [e["model"].split(" (")[0] for e in rows], rotation=20, fontsize=8)
    a.set_ylabel("decode tok/s (one-token passes)")
    a.legend(fontsize=7)
    for e in rows:
        r = e["verify_cost_ratio"]
        b.plot([int(k) for k in r], list(r.values()), marker="o", label=e["model"].split(" (")[0])
    b.set_xlabel("rows in the pass (1 + drafts)")
    b.set_ylabel("pass time / one-row pass")
    b.legend(fontsize=7)
    fig.suptitle(f"{gpu}: real shapes (random Q4_K_M) - decode speed and verify cost by rows")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("dir")
    m.add_argument("--names", default="")
    m.add_argument("--champion", default="")
    m.add_argument("--decode", type=int, default=128)
    m.add_argument("--prefill", type=int, default=1024)
    m.add_argument("--out", required=True)
    r = sub.add_parser("report")
    r.add_argument("raw")
    r.add_argument("llama", nargs="*")
    r.add_argument("--out", default="bench/results/h200-shapes.json")
    r.add_argument("--raw-extra", help="a second measure run (another --prefill) to join")
    r.add_argument("--dawn", nargs="*", default=[], help="dawn.mjs answers, dawn-NAME.json")
    r.add_argument("--null", nargs="*", default=[], help="the null GPU's, null-NAME.json")
    r.add_argument("--dawn-busy", nargs="*", default=[],
                   help="dawn.mjs answers taken while the host was busy (dawn-shape-NAME.json)")
    r.add_argument("--tree-commit", help="the commit the runner checked the copy against "
                   "(h200.sh recv: every tracked file's sha256 equal to its list)")
    r.add_argument("--probe", help="webtools.dawn --probe's answer there")
    r.add_argument("--smi", help="nvidia-smi's name, driver and memory there")
    r.add_argument("--tree-evidence", default="", help="what the runner printed of that check")
    args = ap.parse_args()
    np.seterr(all="ignore")
    cmd_measure(args) if args.cmd == "measure" else cmd_report(args)


if __name__ == "__main__":
    main()
