"""JSON-schema decoding (issue 12): forced-token share, tokens per champion pass, and speedup
against constrained champion-only, on the json stratum of the public workload (its 4 prompts,
with the schemas in bench/json_prompts.jsonl) and the 8 schema prompts written there.

    .venv/bin/python -m experiments.bench_json --out bench/results/json-cpu.json \\
        [--backend numpy|cpu|wgpu] [--champion PATH] [--drafts none,ngram@fixed:4,trained] \\
        [--k heuristic] [--runs 3] [--only ID,ID]

Per prompt, side by side in one run: the reference, constrained champion-only (k = 0, no forced
drafts), then each drafter under the schema ("none": forced tokens only; "ngram": forced tokens
around n-gram proposals; a GPU draft gives way to n-gram under a schema: plan._host_drafter).
Every run starts with cold masks (the schema's mask cache dropped; the
vocabulary's tables, built once per engine, are timed apart), so the mask time includes every
mask computed. Recorded: generated tokens, champion passes, forced tokens, decode tokens/s, the
host seconds of the mask processor per masked row (JsonMask.apply, timed by wrapping it here),
whether the output equals the reference token for token (greedy: it must), and whether it
parses as JSON. Medians with [min, max] over runs; a plot beside the JSON. Timing goals live
here, never in tests.

`mask_cost` (no model needed; also `--masks-only`): the processor's CPU time (process_time, so
a busy machine's descheduling does not count) per masked row along each prompt's `document` (a
valid answer, tokenized), every mask cold; the issue's goal is <= 1 ms natively.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

from pyspec.apps import provenance
from pyspec.apps.bench import draft_file
from pyspec.rules import jsonmask
from pyspec.engine import Engine, Options
from pyspec.load import backend, load_champion

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "workloads" / "public.jsonl"
PROMPTS = ROOT / "bench" / "json_prompts.jsonl"

MASK_TIME = {"s": 0.0, "rows": 0, "per_call": []}   # per_call: ms per row of each apply
_apply = jsonmask.JsonMask.apply


def _timed_apply(self, logits, prefix, drafts):
    t = time.perf_counter()
    out = _apply(self, logits, prefix, drafts)
    dt = time.perf_counter() - t
    MASK_TIME["s"] += dt
    MASK_TIME["rows"] += len(logits)
    MASK_TIME["per_call"].append(1e3 * dt / max(len(logits), 1))
    return out


jsonmask.JsonMask.apply = _timed_apply


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def forced_config(runs: list[dict], baseline: list[dict]) -> dict:
    """A config's row of a prompt whose output is partly forced (a schema's or a tool call's
    grammar): its runs' counts, speed, token hashes and speedup over the champion-only runs."""
    r0 = runs[0]
    return {"generated": r0["generated"], "passes": r0["passes"], "forced": r0["forced"],
            "forced_share": r0["forced"] / max(r0["generated"], 1),
            "tokens_per_pass": r0["generated"] / max(r0["passes"], 1),
            "tokens_per_s": summary([r["tokens_per_s"] for r in runs]),
            "tokens_sha256": [provenance.tokens_sha256(r["tokens"]) for r in runs],
            "speedup": summary([r["tokens_per_s"] / c["tokens_per_s"]
                                for r, c in zip(runs, baseline)])}


def prompts(only: set[str] | None) -> list[dict]:
    public = {}
    if WORKLOAD.exists():
        public = {it["id"]: it for it in map(json.loads, WORKLOAD.read_text().splitlines())}
    out = []
    for item in map(json.loads, PROMPTS.read_text().splitlines()):
        if "workload" in item:
            if item["workload"] not in public:
                continue   # the public workload is not beside this checkout
            item["messages"] = public[item["workload"]]["messages"]
        if only is None or item["id"] in only:
            out.append(item)
    return out


def mask_cost(tok, items: list[dict]) -> dict:
    """CPU ms per masked row along each item's document, every mask computed cold."""
    import numpy as np

    cache: dict = {}
    t = time.process_time()
    jsonmask.tables(jsonmask.constrain(cache, tok, {"type": "null"}, 0).masker.vocab)
    tables_s = time.process_time() - t
    per_row = []
    for item in items:
        c = jsonmask.constrain(cache, tok, item["schema"], 0)
        ids = tok.encode(json.dumps(item["document"], separators=(",", ":"),
                                    ensure_ascii=False)) + [tok.eos_id]
        assert c.state_after(ids) is c.done, item["id"]   # the document follows the schema
        c = jsonmask.Constraint(jsonmask.Masker(c.masker.grammar, c.masker.vocab, tok.eos_id), 0)
        logits = np.zeros((1, tok.vocab_size))   # (1, vocab)
        for i in range(len(ids)):
            t = time.process_time()
            _apply(jsonmask.JsonMask(c), logits, ids[:i], [])
            per_row.append(1e3 * (time.process_time() - t))
    per_row.sort()
    return {"vocab_and_tables_cpu_s": tables_s, "rows": len(per_row),
            "cpu_ms_per_row": {"median": statistics.median(per_row),
                               "mean": statistics.mean(per_row),
                               "p90": per_row[int(0.9 * len(per_row))], "max": per_row[-1]}}


def run_once(engine: Engine, ids: list[int], item: dict, k: str) -> dict:
    for key in [key for key in engine.json_cache if key != "vocab"]:
        del engine.json_cache[key]    # cold masks: every mask of this run is computed in it
    MASK_TIME.update(s=0.0, rows=0, per_call=[])
    r = engine.generate(ids, Options(max_tokens=item["max_tokens"], k=k,
                                     json_schema=item["schema"]))
    st = r.stats
    try:
        json.loads(r.text)
        parses = True
    except ValueError:
        parses = False
    return {"tokens": r.tokens, "text": r.text, "finish_reason": r.finish_reason,
            "generated": st["generated_tokens"], "passes": st["champion_passes"],
            "forced": st["forced_tokens"], "accepted": st["accepted"], "drafted": st["drafted"],
            "tokens_per_s": st["tokens_per_s"], "decode_s": st["wall_s"] - st["prefill_s"],
            "mask_ms_per_row": 1e3 * MASK_TIME["s"] / max(MASK_TIME["rows"], 1),
            "mask_ms_per_row_p50": statistics.median(MASK_TIME["per_call"] or [0.0]),
            "mask_rows": MASK_TIME["rows"], "parses": parses}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", choices=["cpu", "numpy", "wgpu"], default="numpy")
    ap.add_argument("--champion", default=None)
    ap.add_argument("--drafts", default="none,ngram",
                    help="comma-separated DRAFT or DRAFT@K (K: --k when left out)")
    ap.add_argument("--k", default="heuristic")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default=None, help="comma-separated prompt ids")
    ap.add_argument("--masks-only", action="store_true", help="mask_cost alone, no champion")
    args = ap.parse_args(argv)
    if args.masks_only:
        from pyspec import champion_path
        from pyspec.formats.gguf import GGUFFile
        from pyspec.text.tokenizer import Tokenizer

        tok = Tokenizer.from_metadata(GGUFFile.open(args.champion or champion_path()).metadata)
        cost = mask_cost(tok, prompts(set(args.only.split(",")) if args.only else None))
        print(json.dumps(cost, indent=1))
        provenance.write(args.out, provenance.stamp({"mask_cost": cost}, champion=args.champion))
        return 0
    champion, tok = load_champion(args.champion, args.backend,
                                  1024 if args.backend == "wgpu" else None)
    items = prompts(set(args.only.split(",")) if args.only else None)
    configs = [("champion-only", "none", "fixed:0")]
    for entry in args.drafts.split(","):   # DRAFT or DRAFT@K
        d, _, k = entry.partition("@")
        configs.append((f"{d}/{k or args.k}", d, k or args.k))
    engines = {}
    for _, d, _ in configs:
        engines[d] = Engine(backend(champion, d, 1024 if args.backend == "wgpu" else None), tok)
    t = time.perf_counter()
    for e in engines.values():   # the vocabulary tables, once per engine (a page load)
        jsonmask.constrain(e.json_cache, tok, {"type": "null"}, 0)
        jsonmask.tables(e.json_cache["vocab"])
    tables_s = (time.perf_counter() - t) / len(engines)
    result = {"machine": {"platform": platform.platform(), "python": platform.python_version()},
              "backend": args.backend, "adapter": next(iter(engines.values())).adapter,
              "champion": args.champion or "smollm2", "k": args.k, "runs": args.runs,
              "vocab_tables_s": tables_s, "mask_cost": mask_cost(tok, items), "prompts": {}}
    provenance.stamp(result, champion=args.champion, workload=str(PROMPTS), backend=args.backend,
                     drafts={d: draft_file(d.removeprefix("readback:")) for _, d, _ in configs})
    # Warm-up, unreported: every side once on the first prompt (an engine's first request pays
    # for its caches and first allocations), so that no side is timed cold.
    for name, draft, k in configs:
        run_once(engines[draft], tok.encode_chat(items[0]["messages"]), items[0], k)
    for n, item in enumerate(items):
        ids = tok.encode_chat(item["messages"])
        engines["none"].generate(ids, Options(max_tokens=2, json_schema=item["schema"]))  # warm
        rows = {}
        # who runs first alternates from prompt to prompt, so that drift favours no side
        for name, draft, k in configs if n % 2 == 0 else configs[::-1]:
            runs = [run_once(engines[draft], ids, item, k) for _ in range(args.runs)]
            rows[name] = runs
        rows = {name: rows[name] for name, _, _ in configs}
        ref = rows["champion-only"][0]
        out = {"text": ref["text"], "finish_reason": ref["finish_reason"], "configs": {}}
        for name, runs in rows.items():
            r0 = runs[0]
            out["configs"][name] = {
                **forced_config(runs, rows["champion-only"]),
                "acceptance": r0["accepted"] / r0["drafted"] if r0["drafted"] else None,
                "mask_ms_per_row": summary([r["mask_ms_per_row"] for r in runs]),
                "mask_ms_per_row_p50": summary([r["mask_ms_per_row_p50"] for r in runs]),
                "mask_rows": r0["mask_rows"],
                "equal_to_reference": all(r["tokens"] == ref["tokens"] for r in runs),
                "parses": r0["parses"]}
        result["prompts"][item["id"]] = out
        # Written after every prompt, so that a run cut short keeps what it measured.
        provenance.write(args.out, {**result, "complete": False})
        print(item["id"], json.dumps({n: {k: c[k] for k in ("forced_share", "tokens_per_pass",
                                                            "equal_to_reference", "parses")}
                                      | {"speedup": round(c["speedup"]["median"], 2),
                                         "mask_ms": round(c["mask_ms_per_row"]["median"], 3)}
                                      for n, c in out["configs"].items()}), flush=True)
    result["overall"] = overall(result)
    provenance.write(args.out, {**result, "complete": True})
    plot(result, Path(args.out).with_suffix(".png"))
    print(json.dumps(result["overall"], indent=1))
    return 0


def overall(result: dict) -> dict:
    """Per config: medians over prompts, and the token-weighted forced share."""
    out = {}
    names = next(iter(result["prompts"].values()))["configs"]
    for name in names:
        cs = [p["configs"][name] for p in result["prompts"].values()]
        out[name] = {
            "forced_share": sum(c["forced"] for c in cs) / max(sum(c["generated"] for c in cs), 1),
            "tokens_per_pass": statistics.median(c["tokens_per_pass"] for c in cs),
            "speedup_median": statistics.median(c["speedup"]["median"] for c in cs),
            "speedup_range": [min(c["speedup"]["median"] for c in cs),
                              max(c["speedup"]["median"] for c in cs)],
            "mask_ms_per_row_median": statistics.median(c["mask_ms_per_row"]["median"]
                                                        for c in cs),
            "mask_ms_per_row_max": max(c["mask_ms_per_row"]["max"] for c in cs),
            "mask_ms_per_call_p50_median": statistics.median(
                c["mask_ms_per_row_p50"]["median"] for c in cs),
            "all_equal_to_reference": all(c["equal_to_reference"] for c in cs),
            "parsed": sum(c["parses"] for c in cs), "prompts": len(cs)}
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ids = list(result["prompts"])
    names = [n for n in next(iter(result["prompts"].values()))["configs"] if n != "champion-only"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(len(names), 1)
    for j, name in enumerate(names):
        xs = [i + j * width for i in range(len(ids))]
        sp = [result["prompts"][p]["configs"][name]["speedup"] for p in ids]
        a.bar(xs, [s["median"] for s in sp], width, label=name,
              yerr=[[s["median"] - s["min"] for s in sp], [s["max"] - s["median"] for s in sp]])
        b.bar(xs, [result["prompts"][p]["configs"][name]["tokens_per_pass"] for p in ids],
              width, label=name)
    for ax, title in ((a, "speedup vs constrained champion-only (tokens/s)"),
                      (b, "tokens per champion pass")):
        ax.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(ids))])
        ax.set_xticklabels(ids, rotation=60, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.legend(fontsize=8)
    share = {n: result["overall"][n]["forced_share"] for n in names}
    fig.suptitle(f"JSON-schema decoding, {result['adapter']}; forced-token share "
                 + ", ".join(f"{n}: {v:.0%}" for n, v in share.items()), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
