"""The page's WebGPU stack (Dawn in Node, webtools/dawn.mjs) beside native wgpu-py on one machine:
one JSON and a plot from what `scripts/h200.sh dawn` brought back.

    python -m experiments.dawn_report DIR --out bench/results/h200-dawn.json

DIR holds dawn-none.json, dawn-ngram.json, dawn-trained.json (the harness's answers: one run per
prompt; dawn-trained-fixed3.json, the trees' dawn-ngram-tree.json, dawn-trained-tree.json,
dawn-trained-tree-guard.json and dawn-trained-tree-211.json, and the null GPU's, where the run
made them) and native/bench-wgpu.json (pyspec bench on the same prompts). Per drafter and
stratum: tok/s on each stack, the host seconds per cycle (encode + submit) and the seconds waiting
on the readback per cycle (and, per prompt, each cycle's host ms and the guard's k histogram);
whether Dawn's speculative tokens equal Dawn's champion-only tokens (the exactness contract, per
backend), and how often Dawn's tokens equal native wgpu's (token-id hashes:
provenance.tokens_sha256). Not part of the pyspec runtime.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from pyspec.apps.benchstats import per_cycle
from pyspec.apps import provenance
from pyspec.apps.provenance import stamp, tokens_sha256

ROOT = Path(__file__).resolve().parent.parent

SIDES = {"none": "champion-only", "ngram": "ngram", "trained": "models/draft-l4.gguf",
         "trained-fixed3": "models/draft-l4.gguf fixed:3",
         # trees (scripts/h200.sh's DAWN_SIDES only where named): the first word is the native
         # bench's drafter, whose tokens theirs must equal (exact under greedy, tree or chain)
         "ngram-tree": "ngram tree auto", "trained-tree": "models/draft-l4.gguf tree 2,2,1 fixed:3",
         "trained-tree-guard": "models/draft-l4.gguf tree 2,2,1",
         "trained-tree-211": "models/draft-l4.gguf tree 2,1,1 fixed:3"}
# The same stack on webtools/nullgpu.mjs (computes nothing; its tokens mean nothing): the page's
# own per-cycle cost, beside which Dawn's host time is what Dawn's calls add.
NULL_SIDES = {"null-none": "null GPU: champion-only", "null-trained": "null GPU: draft-l4 fixed:3"}


SCHEDULE_COUNTS = ("trees", "tree_off", "guard_off", "probes", "untimed")


def spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)} \
        if xs else {}


def dawn_side(runs: list[dict]) -> dict:
    by = {}
    for r in runs:
        by.setdefault(r["stratum"], []).append(r)
    by["overall"] = runs
    out = {}
    for stratum, rs in by.items():
        timing = per_cycle([r["stats"]["backend_timing"] for r in rs])
        out[stratum] = {"tokens_per_s": spread([r["stats"]["tokens_per_s"] for r in rs]),
                        "tokens_per_pass": spread([r["stats"]["tokens_per_pass"] for r in rs]),
                        "host_ms_per_cycle": timing["host_s_per_cycle"] * 1e3,
                        "wait_ms_per_cycle": timing["wait_s_per_cycle"] * 1e3,
                        "gc_ms_per_cycle": timing["gc_s_per_cycle"] * 1e3,
                        "gc_full": timing["gc_full"],
                        # where the drafts were made (stats.draft_path): runs by path
                        "draft_path": {str(p): sum(r["stats"].get("draft_path") == p
                                                   for r in rs)
                                       for p in {r["stats"].get("draft_path") for r in rs}},
                        # the guard's decisions summed over the prompts (trees drafted, trees
                        # declined for the chain, cycles kept off, probes, cycles not timed)
                        "schedule": {key: sum(r["stats"].get("schedule", {}).get(key, 0)
                                              for r in rs) for key in SCHEDULE_COUNTS},
                        "ahead_per_cycle": (sum(r["stats"]["backend_timing"]["ahead"]
                                                for r in rs) / max(1, sum(
                            r["stats"]["backend_timing"]["cycles"] for r in rs)))}
        if stratum != "overall":   # one prompt: its cycles one by one, and the guard's k's
            out[stratum]["host_ms_cycles"] = [
                round(h * 1e3, 2) for r in rs for h in r["stats"]["backend_timing"]
                ["host_s_cycles"]]
            # the collector's ms since the cycle before (runs made before pyspec/gctime.py: none)
            out[stratum]["gc_ms_cycles"] = [
                round(g * 1e3, 2) for r in rs
                for g in r["stats"]["backend_timing"].get("gc_s_cycles", [])]
            out[stratum]["k_histogram"] = [r["stats"].get("schedule", {}).get("k_histogram")
                                           for r in rs]
    return out


def native_hashes(bench: dict) -> dict:
    """{side: {prompt id: token hash}} from a bench JSON (champion-only as each drafter's
    baseline)."""
    out = {"champion-only": {}}
    for drafter, rows in bench["prompts"].items():
        out[drafter] = {r["id"]: r["tokens_sha256"] for r in rows}
        out["champion-only"].update({r["id"]: r["baseline_tokens_sha256"] for r in rows})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--out", default="bench/results/h200-dawn.json")
    args = ap.parse_args()
    native = json.loads((args.dir / "native" / "bench-wgpu.json").read_text())
    hashes = native_hashes(native)
    dawn, exact, agree, adapter = {}, {}, {}, None
    base = None
    for d, side in {**SIDES, **NULL_SIDES}.items():
        path = args.dir / f"dawn-{d}.json"
        if d not in ("none", "ngram", "trained") and not path.exists():
            continue   # a run of an older scripts/h200.sh
        answer = json.loads(path.read_text())
        if d in NULL_SIDES:
            dawn[side] = dawn_side(answer["runs"])
            continue
        adapter = adapter or answer.get("adapter")
        runs = answer["runs"]
        if d == "none":
            base = {r["id"]: r["tokens"] for r in runs}
        dawn[side] = dawn_side(runs)
        exact[side] = sum(r["tokens"] == base.get(r["id"]) for r in runs)
        agree[side] = sum(tokens_sha256(r["tokens"]) == hashes.get(side.split()[0], {}).get(
            r["id"]) for r in runs)
        dawn[side]["prompts"] = len(runs)
    result = {
        "schema": "pyspec.dawn-vs-native/1",
        "about": __doc__.split("\n")[0],
        "dawn_adapter": adapter,
        "native_adapter": native.get("adapter"),
        "dawn": dawn,
        "dawn_identical_to_dawn_champion_only": exact,
        "dawn_tokens_equal_native": agree,
        "native": {"champion_tok_s": native.get("champion_tok_s"),
                   "drafters": {k: v.get("overall") for k, v in native["drafters"].items()},
                   "gpu": native.get("gpu")},
    }
    # Where the run came from is the GPU machine's record (pyspec bench wrote it there, on the
    # same prompts in the same call), not this machine's.
    result["provenance"] = native.get("provenance") or stamp({})["provenance"]
    result["provenance"]["dawn_adapter"] = adapter
    provenance.write(str(args.out), result, here="provenance" not in native)
    plot(result, Path(args.out).with_suffix(".png"))
    print(json.dumps({k: result[k] for k in ("dawn_identical_to_dawn_champion_only",
                                             "dawn_tokens_equal_native")}))
    for side, strata in dawn.items():
        o = strata["overall"]
        print(f"dawn {side}: {o['tokens_per_s'].get('median', 0):.1f} tok/s, host "
              f"{o['host_ms_per_cycle']:.2f} ms/cycle, wait {o['wait_ms_per_cycle']:.2f} ms/cycle")


def plot(result: dict, png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dawn = result["dawn"]
    dawn = {side: rows for side, rows in dawn.items() if side not in NULL_SIDES.values()}
    strata = [s for s in dawn["champion-only"] if s not in ("overall", "prompts")]
    fig, ax = plt.subplots(figsize=(11, 4))
    width = 0.8 / len(dawn)
    for i, (side, rows) in enumerate(dawn.items()):
        ax.bar([j + i * width for j in range(len(strata))],
               [rows.get(s, {}).get("tokens_per_s", {}).get("median", 0) for s in strata],
               width, label=f"Dawn: {side}")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(strata))], strata, rotation=20)
    ax.set_ylabel("tok/s (median)")
    ax.set_title(f"The page's stack (Pyodide + Dawn in Node) on {result['native_adapter']}, "
                 "per stratum")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main()
