"""The headline results table of README.md, made from the result files it links to, so that no
figure in it can drift from its file, and docs/sampling-and-json.md's table of schema-constrained
decoding the same way: `python -m webtools.results` rewrites them in their pages, and
tests/test_docs.py checks that the pages hold exactly these tables.

Each row is one claim: a drafter in one result file against champion-only in the same run.
Speedups are the median over prompts with the range and the number of prompts; a drafter that
drafted in fewer than provenance.DRAFTED_MIN of its cycles is shown as "did not draft". A file
with provenance shows its commit, date and sample, and its "identical" count is recounted from
the token hashes of both sides (provenance.recount_identical), never read from the summary; a
file of experiments.LEGACY is marked legacy: its count rests on per-prompt true/false alone.

Not here: running a benchmark (pyspec/apps/bench.py, webtools/bench.py).
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

from experiments import LEGACY
from pyspec.apps.provenance import DRAFTED_MIN, recount_identical
from webtools.gpu_tables import dawn_table, gpu_shapes_table, matmul_ab_table, trees_table

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"

# (where it ran, result file, drafters in the order shown). The GPU row's re-run with provenance
# (experiments "gpu-headline", bench/results/h100-headline.json) goes first when it lands; h200.json
# stays, marked legacy, until it replaces it.
CLAIMS = [
    ("NVIDIA H100, native WebGPU", "h100-headline.json",
     ["trained", "ngram+trained", "ngram", "self:20"]),
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


def identical(result: dict, drafter: str, legacy: bool) -> int:
    """How many of a drafter's outputs equal champion-only's: recounted from the token hashes;
    a legacy file's summary count (it has no hashes)."""
    summary = result["drafters"][drafter]["overall"]["identical_to_baseline"]
    if legacy:
        return summary
    recounted = recount_identical(result["prompts"][drafter])
    if recounted != summary:
        raise ValueError(f"{drafter}: {summary} identical in the summary, {recounted} by the "
                         "token hashes: the file contradicts itself")
    return recounted


def row(result: dict, drafter: str, legacy: bool = False) -> str:
    """One drafter's cells: speedup median [range] (prompts), and identical or did not draft."""
    overall = result["drafters"][drafter]["overall"]
    s, n = overall["speedup"], overall["prompts"]
    share = drafted_share(result, drafter)
    if share < DRAFTED_MIN:
        return f"`{drafter}` | - | did not draft ({share:.0%} of cycles)"
    same = identical(result, drafter, legacy)
    return (f"`{drafter}` | **{s['median']:.2f}x** [{s['min']:.2f}, {s['max']:.2f}] ({n}) | "
            f"{same}/{n} identical" + (" (legacy: not recountable)" if legacy else ""))


def source(result: dict, name: str) -> str:
    """What a row's file is: legacy, or its commit, date and sample (prompts per stratum)."""
    if name in LEGACY:
        return "**legacy**: no commit, no token hashes"
    origin = result["provenance"]
    per = result.get("per_stratum")
    sample = f"{per} prompt{'s' if per > 1 else ''} per stratum" if per else "every prompt"
    load = (origin.get("load") or {}).get("start")
    busy = f", load {load[0]:.1f} on {origin['machine']['cpus']} cores" if load else ""
    return f"{sample}, `{origin['commit'][:7]}`, {origin['date'][:10]}{busy}"


def table(root: Path = RESULTS) -> str:
    lines = ["| where (file) | champion alone | drafter | speedup [range] (prompts) | outputs |",
             "|---|---|---|---|---|"]
    for where, name, drafters in CLAIMS:
        result = json.loads((root / name).read_text())
        for i, d in enumerate(drafters):
            head = (f"{where} ([`{name}`](bench/results/{name}); {source(result, name)}) | "
                    f"{champion_tok_s(result):.1f} tok/s" if i == 0 else " | ")
            lines.append(f"| {head} | {row(result, d, name in LEGACY)} |")
    return "\n".join(lines) + "\n"


# (where it ran, result file) of experiments/bench_json.py runs: docs/sampling-and-json.md's table
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
        where += " (**legacy**)" if name in LEGACY else ""
        lines.append(f"| {where} ([`{name}`](../bench/results/{name})) | "
                     f"{forced['speedup_median']:.2f}x | **{ngram['speedup_median']:.2f}x** "
                     f"[{lo:.2f}, {hi:.2f}] ({ngram['prompts']}) | {same} |")
    return "\n".join(lines) + "\n"


def spread(x: dict) -> str:
    return f"{x['median']:.2f} [{x['min']:.2f}, {x['max']:.2f}]"


def strata_table(name: str, drafters: list[str], root: Path = RESULTS) -> str:
    """A result's speedup per stratum and overall, median [min, max], one column a drafter."""
    result = json.loads((root / name).read_text())
    cols = [result["drafters"][d] for d in drafters]
    strata = sorted(cols[0]["strata"])
    lines = ["| stratum | " + " | ".join(f"`{d}`" for d in drafters) + " |",
             "|---" * (len(drafters) + 1) + "|"]
    lines += [f"| {s} (n {cols[0]['strata'][s]['prompts']}) | "
              + " | ".join(spread(c["strata"][s]["speedup"]) for c in cols) + " |" for s in strata]
    lines.append(f"| overall ({cols[0]['overall']['prompts']}) | "
                 + " | ".join(spread(c["overall"]["speedup"]) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def link(name: str) -> str:
    """A result file's link from docs/: legacy, or its commit and the machine's load."""
    if name in LEGACY:
        return f"[`{name}`](../bench/results/{name}) (legacy)"
    origin = json.loads((RESULTS / name).read_text())["provenance"]
    load = (origin.get("load") or {}).get("start")
    return (f"[`{name}`](../bench/results/{name}) (commit `{origin['commit'][:7]}`"
            + (f", load {load[0]:.1f} on {origin['machine']['cpus']} cores" if load else "") + ")")


def cpu_figures(root: Path = RESULTS) -> str:
    """docs/cpu-engine.md's figures: the numpy engine guarded and at fixed:2, and the page."""
    def load(name):
        return json.loads((root / name).read_text())
    guard, k2, page = (load(n) for n in ("cpu-guard-reduced-head.json", "cpu-reduced-head-k2.json",
                                         "browser-cpu-guard3.json"))

    def speed(result, d, full=False):
        o = result["drafters"][d]["overall"]
        share = drafted_share(result, d)
        if share < DRAFTED_MIN:
            return f"did not draft ({share:.0%} of cycles)"
        x = o["speedup"]
        return f"{x['median']:.2f}x" + (f" [{x['min']:.2f}, {x['max']:.2f}]" if full else "")

    def sample(result):
        n = result["drafters"][next(iter(result["drafters"]))]["overall"]["prompts"]
        per = result.get("per_stratum")
        return f"{n} public prompts" + (f" ({per} per stratum)" if per else "")
    full = next(d for d in guard["drafters"] if d.startswith("trained-full-head"))
    # recounted from the token hashes where the file has them (identical)
    same = all(identical(r, d, name in LEGACY) == r["drafters"][d]["overall"]["prompts"]
               for name, r in (("cpu-guard-reduced-head.json", guard),
                               ("cpu-reduced-head-k2.json", k2),
                               ("browser-cpu-guard3.json", page)) for d in r["drafters"])
    shares = ", ".join(f"`{d}` {drafted_share(page, d):.0%}" for d in page["drafters"])
    text = (f"On the 2-core machine, {sample(guard)}, guarded, `--repeat {guard['repeat']}` "
            f"({link('cpu-guard-reduced-head.json')}): champion-only "
            f"{champion_tok_s(guard):.1f} tok/s; `trained` {speed(guard, 'trained', True)}, "
            f"`ngram+trained` {speed(guard, 'ngram+trained')}, `ngram` {speed(guard, 'ngram')}; "
            f"`trained-full-head` (the same draft without the reduced head) "
            f"{speed(guard, full)}. Unguarded at `fixed:2` ({sample(k2)}) the trained draft runs "
            f"{speed(k2, 'trained', True)} ({link('cpu-reduced-head-k2.json')}). In the page "
            f"(Pyodide, no BLAS; {sample(page)}, {link('browser-cpu-guard3.json')}) the share of "
            f"cycles that drafted: {shares}. "
            + ("Every output was identical to champion-only's." if same else
               "NOT every output was identical to champion-only's."))
    return textwrap.fill(text, width=100, break_long_words=False,
                         break_on_hyphens=False) + "\n"


def blocks() -> dict[tuple[str, str], str]:
    """(page, marker) -> the text between `<!-- MARKER ... -->` and `<!-- /MARKER -->`."""
    return {("README.md", "headline table"): table(),
            ("docs/sampling-and-json.md", "json table"): json_table(),
            ("docs/benchmarks.md", "strata table"):
                strata_table("h200.json", ["ngram", "trained", "ngram+trained"]),
            ("docs/cpu-engine.md", "cpu figures"): cpu_figures(),
            ("docs/benchmarks.md", "gpu shapes table"): gpu_shapes_table(),
            ("docs/benchmarks.md", "gpu shapes blocks table"):
                gpu_shapes_table("h100-shapes-blocks.json"),
            ("docs/benchmarks.md", "dawn table"): dawn_table(),
            ("README.md", "dawn table"): dawn_table(),
            ("docs/benchmarks.md", "trees table"): trees_table(),
            ("docs/benchmarks.md", "matmul ab table"): matmul_ab_table()}


def write(root: Path = RESULTS.parent.parent) -> None:
    """Rewrite every generated block in its page."""
    for (page, marker), text in blocks().items():
        path = root / page
        old = path.read_text()
        new = re.sub(rf"(<!-- {marker}[^>]*-->\n).*?(<!-- /{marker} -->)",
                     lambda m: m.group(1) + text + m.group(2), old, flags=re.S)
        if new != old:
            path.write_text(new)
            print(f"rewrote {page}: {marker}")


if __name__ == "__main__":
    write()
