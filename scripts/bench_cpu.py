"""The CPU engines before and after, side by side in one run: model.py's plain reference (8-row
tiles, `--backend numpy`) against fastcpu.py's row-at-a-time products (`--backend cpu`).

    .venv/bin/python scripts/bench_cpu.py [--per-stratum 1] [--max-tokens 48]
        [--drafts ngram,self:20] [--out bench/results]

Both engines share one GGUFFile. For every prompt each engine runs champion-only and each
drafter back to back (pyspec/apps/bench.py's rows: speedup over champion-only on the same engine), the
engine order alternating per prompt, so a busy neighbour on the shared cores hits both alike.
Per engine it reports pyspec bench's tables plus the guard's decisions (webtools.bench's
guard_decisions); on top, the champion-only and best-drafter tokens/s of each engine and their
ratio, and whether both engines' greedy outputs were identical to their own champion-only run.
Writes `<out>/cpu-before-after.json` and `.png`. Timing claims live here, never in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pyspec import champion_path  # noqa: E402
from pyspec.apps import benchstats, provenance, workload  # noqa: E402
from pyspec.cpu.fastcpu import FastModel  # noqa: E402
from pyspec.cpu.model import Model  # noqa: E402
from pyspec.engine import Engine, Options  # noqa: E402
from pyspec.formats.gguf import GGUFFile  # noqa: E402
from pyspec.load import backend  # noqa: E402
from pyspec.text.tokenizer import Tokenizer  # noqa: E402
from webtools.bench import guard_decisions  # noqa: E402

WORKLOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workloads", "public.jsonl")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default=WORKLOAD)
    p.add_argument("--per-stratum", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--drafts", default="ngram,self:20")
    p.add_argument("--k", default="heuristic")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    items = workload.first_per_stratum(workload.read_workload(args.workload), args.per_stratum)
    drafts = [d for d in args.drafts.split(",") if d]
    f = GGUFFile.open(champion_path())
    tok = Tokenizer.from_metadata(f.metadata)
    models = {"numpy": Model(f), "cpu": FastModel(f)}
    engines = {e: {d: Engine(backend(m, d), tok) for d in ["none", *drafts]}
               for e, m in models.items()}
    rows = {e: {d: [] for d in drafts} for e in models}
    base_tps = {e: [] for e in models}
    t0 = time.time()
    for n, it in enumerate(items, 1):
        ids = tok.encode_chat(it["messages"])
        max_tokens = min(it.get("max_tokens", 128), args.max_tokens)
        order = list(models) if n % 2 else list(models)[::-1]
        line = [f"[{n}/{len(items)}] {it['id']:<16}"]
        for e in order:
            runs = {d: engines[e][d].generate(ids, Options(
                        max_tokens=max_tokens, k="fixed:0" if d == "none" else args.k))
                    for d in (["none", *drafts] if n % 2 else [*drafts, "none"])}
            base = runs["none"]
            base_tps[e].append(base.stats["tokens_per_s"])
            line.append(f"{e}: base {base.stats['tokens_per_s']:.2f}")
            for d in drafts:
                row = benchstats.compare(it, runs[d].stats, runs[d].tokens, base.stats, base.tokens)
                rows[e][d].append(row)
                line.append(f"{d} {row['stats']['tokens_per_s']:.2f} (x{row['speedup']:.2f})")
        print(" | ".join(line), f"[{time.time() - t0:.0f}s]", file=sys.stderr, flush=True)
    strata = sorted({it["stratum"] for it in items})
    result = {"workload": os.path.basename(args.workload), "max_tokens_cap": args.max_tokens,
              "k_policy": args.k, "kernel": models["cpu"].kernel,
              "machine": {"platform": platform.platform(), "python": platform.python_version(),
                          "cpus": os.cpu_count(), "load_avg_at_end": os.getloadavg()},
              "engines": {}, "wall_s": time.time() - t0}
    for e in models:
        best = {d: statistics.median(r["stats"]["tokens_per_s"] for r in rows[e][d])
                for d in drafts}
        result["engines"][e] = {
            "champion_only_tokens_per_s": benchstats.spread(base_tps[e]),
            "drafter_tokens_per_s_median": best,
            "best_drafter": max(best, key=best.get),
            "identical_to_champion_only": all(r["identical"] for d in drafts for r in rows[e][d]),
            "drafters": benchstats.drafter_tables(rows[e], strata),
            "schedule": {d: guard_decisions(rows[e][d]) for d in drafts},
            "prompts": benchstats.prompt_lines(rows[e]),
        }
    before, after = result["engines"]["numpy"], result["engines"]["cpu"]
    result["ratio_after_over_before"] = {
        "champion_only": (after["champion_only_tokens_per_s"]["median"]
                          / before["champion_only_tokens_per_s"]["median"]),
        "best_drafter": (after["drafter_tokens_per_s_median"][after["best_drafter"]]
                         / before["drafter_tokens_per_s_median"][before["best_drafter"]])}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "cpu-before-after.json")
    provenance.stamp(result, workload=args.workload)
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
    plot(result, strata, drafts, path.removesuffix(".json") + ".png")
    print(json.dumps({e: {k: result["engines"][e][k] for k in
                          ("champion_only_tokens_per_s", "drafter_tokens_per_s_median")}
                      for e in models} | {"ratio": result["ratio_after_over_before"]}, indent=1))
    print(f"wrote {path}", file=sys.stderr)
    return 0


def plot(result: dict, strata: list[str], drafts: list[str], path: str) -> None:
    """Left: champion-only and drafter tokens/s per engine (median, range). Right: each drafter's
    speedup over champion-only per stratum, per engine."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    names = ["none", *drafts]
    for i, e in enumerate(result["engines"]):
        eng = result["engines"][e]
        values = [eng["champion_only_tokens_per_s"]]
        values += [eng["drafters"][d]["overall"]["tokens_per_s"] for d in drafts]
        xs = [j + 0.4 * i for j in range(len(names))]
        med = [v["median"] for v in values]
        err = [[m - v["min"] for m, v in zip(med, values)], [v["max"] - m for m, v in zip(med, values)]]
        axes[0].bar(xs, med, 0.4, yerr=err, label=f"{e}", capsize=3)
        for d in drafts:
            sp = [eng["drafters"][d]["strata"].get(s, {}).get("speedup", {}).get("median", 0)
                  for s in strata]
            axes[1].plot(strata, sp, marker="o", label=f"{e} {d}")
    axes[0].set_xticks([j + 0.2 for j in range(len(names))], names)
    axes[0].set_ylabel("decode tokens/s (median, range over prompts)")
    axes[0].set_title("numpy (model.py tiles) vs cpu (fastcpu rows)")
    axes[0].legend()
    axes[1].axhline(1.0, color="gray", lw=0.8)
    axes[1].axhline(0.97, color="red", lw=0.8, ls="--")
    axes[1].set_ylabel("speedup over champion-only, same engine")
    axes[1].tick_params(axis="x", rotation=45)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
