"""The headline results table of README.md, made from the result files it links to, so that no
figure in it can drift from its file, and docs/sampling-and-json.md's table of schema-constrained
decoding the same way: `python -m webtools.results` prints both, and tests/test_docs.py checks
that the two pages hold exactly these tables.

Each row is one claim: a drafter in one result file against champion-only in the same run.
Speedups are the median over prompts with the range and the number of prompts; a drafter that
drafted in fewer than provenance.DRAFTED_MIN of its cycles is shown as "did not draft".

Not here: running a benchmark (pyspec/apps/bench.py, webtools/bench.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from pyspec.apps.provenance import DRAFTED_MIN

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"

# (where it ran, result file, drafters in the order shown)
CLAIMS = [
    ("NVIDIA H200, native WebGPU", "h200.json", ["trained", "ngram+trained", "ngram", "self:20"]),
    ("2-core AMD EPYC, numpy engine", "cpu-guard-reduced-head.json",
     ["trained", "ngram+trained", "ngram"]),
    ("2-core AMD EPYC, numpy engine, `--k fixed:2`", "cpu-reduced-head-k2.json", ["trained"]),
    ("headless Chromium (SwiftShader), the page's numpy engine", "browser-cpu-guard3.json",
     ["ngram", "trained"]),
]


def drafted_share(result: dict, drafter: str) -> float:
    """The share of a drafter's cycles that drafted: the summary's own (files written since
    provenance.py) or, for older files, the cycles its guard gave a k above 0."""
    overall = result["drafters"][drafter]["overall"]
    if "drafted_cycles_share" in overall:
        return overall["drafted_cycles_share"]
    hist = [(int(k), n) for line in result["prompts"][drafter]
            for k, n in line["guard"]["k_histogram"].items()]
    total = sum(n for _, n in hist)
    return sum(n for k, n in hist if k > 0) / total if total else 0.0


def champion_tok_s(result: dict) -> float:
    value = result["champion_tok_s"]
    return value["median"] if isinstance(value, dict) else value


def row(result: dict, drafter: str) -> str:
    """One drafter's cells: speedup median [range] (prompts), and identical or did not draft."""
    overall = result["drafters"][drafter]["overall"]
    s, n = overall["speedup"], overall["prompts"]
    share = drafted_share(result, drafter)
    if share < DRAFTED_MIN:
        return f"`{drafter}` | - | did not draft ({share:.0%} of cycles)"
    same = overall["identical_to_baseline"]
    return (f"`{drafter}` | **{s['median']:.2f}x** [{s['min']:.2f}, {s['max']:.2f}] ({n}) | "
            f"{same}/{n} identical")


def table(root: Path = RESULTS) -> str:
    lines = ["| where (file) | champion alone | drafter | speedup [range] (prompts) | outputs |",
             "|---|---|---|---|---|"]
    for where, name, drafters in CLAIMS:
        result = json.loads((root / name).read_text())
        for i, d in enumerate(drafters):
            head = (f"{where} ([`{name}`](bench/results/{name})) | "
                    f"{champion_tok_s(result):.1f} tok/s" if i == 0 else " | ")
            lines.append(f"| {head} | {row(result, d)} |")
    return "\n".join(lines) + "\n"


# (where it ran, result file) of scripts/bench_json.py runs: docs/sampling-and-json.md's table
JSON_CLAIMS = [("NVIDIA H200, native WebGPU", "json-h200.json"),
               ("2-core AMD EPYC, numpy engine", "json-cpu.json")]


def json_table(root: Path = RESULTS) -> str:
    """Schema-constrained decoding against constrained champion-only, from bench_json's files."""
    lines = ["| where (file) | forced tokens alone | forced + n-gram [range] (prompts) | outputs |",
             "|---|---|---|---|"]
    for where, name in JSON_CLAIMS:
        runs = json.loads((root / name).read_text())["overall"]
        forced, ngram = runs["none/heuristic"], runs["ngram/heuristic"]
        lo, hi = ngram["speedup_range"]
        same = "all identical" if ngram["all_equal_to_reference"] else "NOT all identical"
        lines.append(f"| {where} ([`{name}`](../bench/results/{name})) | "
                     f"{forced['speedup_median']:.2f}x | **{ngram['speedup_median']:.2f}x** "
                     f"[{lo:.2f}, {hi:.2f}] ({ngram['prompts']}) | {same} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(), end="")
    print()
    print(json_table(), end="")
