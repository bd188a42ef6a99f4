"""The GPU machine's tables in docs/benchmarks.md and the README, made from their result files
(webtools/results.py writes them into the pages): the page's stack (Dawn) beside native wgpu-py
with the real champion, the real shapes against llama.cpp CUDA, the product kernels' A/B, and
trees against chains. Each says which stack a figure comes from; none mixes two files.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"

# the Dawn run's sides (experiments/dawn_report.py's names) as the tables show them
DAWN_SIDES = [("champion-only", "champion alone", None),
              ("ngram", "`ngram`, guarded", "ngram"),
              ("models/draft-l4.gguf", "trained draft, guarded", "models/draft-l4.gguf"),
              ("models/draft-l4.gguf fixed:3", "trained draft, `--k fixed:3`", None),
              # trees: rows only in a run whose DAWN_SIDES named them (scripts/h200.sh)
              ("ngram tree auto", "`ngram`, `--tree auto`, guarded", None),
              ("models/draft-l4.gguf tree 2,2,1 fixed:3",
               "trained draft, `--tree 2,2,1 --k fixed:3`", None),
              ("models/draft-l4.gguf tree 2,2,1", "trained draft, `--tree 2,2,1`, guarded", None),
              ("models/draft-l4.gguf tree 2,1,1 fixed:3",
               "trained draft, `--tree 2,1,1 --k fixed:3`", None)]
NULL_SIDES = [("null GPU: champion-only", "champion alone"),
              ("null GPU: draft-l4 fixed:3", "trained draft, `--k fixed:3`")]


def load(name: str, root: Path = RESULTS) -> dict:
    return json.loads((root / name).read_text())


def span(values: list[float], fmt: str = ".2f", unit: str = "x") -> str:
    return (f"{statistics.median(values):{fmt}}{unit} [{min(values):{fmt}}, "
            f"{max(values):{fmt}}]")


def per_prompt(side: dict) -> dict[str, float]:
    """stratum -> the one prompt's tokens/s (the Dawn run takes one prompt a stratum)."""
    return {s: v["tokens_per_s"]["median"] for s, v in side.items()
            if isinstance(v, dict) and "tokens_per_s" in v and s != "overall"}


def dawn_table(name: str = "h100-dawn.json", root: Path = RESULTS) -> str:
    """The real champion through the page's stack (Pyodide + Dawn in Node) on the GPU machine,
    each side's speedup prompt by prompt over Dawn's champion-only, beside native wgpu-py's
    bench of the same prompts in the same call."""
    r = load(name, root)
    dawn, native = r["dawn"], r["native"]
    base = per_prompt(dawn["champion-only"])
    same, native_same = r["dawn_identical_to_dawn_champion_only"], r["dawn_tokens_equal_native"]
    out = ["| side | Dawn tok/s median [range] | Dawn speedup [range] (prompts) | tokens a pass "
           "| host ms a cycle | identical to Dawn's champion alone | tokens equal native's | "
           "native wgpu-py speedup [range] |", "|---|---|---|---|---|---|---|---|"]
    for key, label, native_key in DAWN_SIDES:
        if key not in dawn:     # a side this run did not make (the trees, unless named)
            continue
        side = dawn[key]
        tps = per_prompt(side)
        ratios = [tps[s] / base[s] for s in tps if s in base]
        overall = side["overall"]
        speed = "-" if key == "champion-only" else f"**{span(ratios)}** ({len(ratios)})"
        nat = native["drafters"].get(native_key, {}).get("speedup") if native_key else None
        nat_cell = (f"{nat['median']:.2f}x [{nat['min']:.2f}, {nat['max']:.2f}]" if nat else
                    f"{native['champion_tok_s']:.0f} tok/s" if key == "champion-only" else "-")
        out.append(f"| {label} | {span(list(tps.values()), '.0f', '')} | {speed} | "
                   f"{overall['tokens_per_pass']['median']:.2f} | "
                   f"{overall['host_ms_per_cycle']:.2f} | {same[key]}/{len(tps)} | "
                   f"{native_same[key]}/{len(tps)} | {nat_cell} |")
    for key, label in NULL_SIDES:
        if key not in dawn:     # a null side this run did not make
            continue
        o = dawn[key]["overall"]
        out.append(f"| null GPU (computes nothing): {label} | - | - | - | "
                   f"{o['host_ms_per_cycle']:.2f} | - | - | - |")
    return "\n".join(out) + "\n"


def trees_table(name: str = "h100-trees.json", root: Path = RESULTS) -> str:
    """Trees against chains natively on the GPU machine (experiments/tree_vs_chain.py): every
    row's outputs equal champion-only's (the script asserts it; the hashes are in the file)."""
    r = load(name, root)
    base = r["champion_only"]
    out = [f"| draft | shape | `--k` | verify rows | tokens a pass | tok/s | x champion alone "
           f"({base['tokens_per_s']:.0f} tok/s) |", "|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        rows = row["verify_rows"] if row["verify_rows"] is not None else "guard"
        out.append(f"| {row['draft']} | {row['shape']} | `{row['k']}` | {rows} | "
                   f"{row['tokens_per_pass']:.2f} | {row['tokens_per_s']:.0f} | "
                   f"**{row['speedup']:.2f}x** |")
    return "\n".join(out) + "\n"


def matmul_ab_table(name: str = "h100-matmul-ab.json", root: Path = RESULTS) -> str:
    """The quantized products' two GPU kernels, interleaved on one adapter: GPU ms a whole
    pass (timestamps at its ends) at 1 and 8 rows, and whether each is batch-invariant."""
    r = load(name, root)
    out = ["| model | GPU ms a pass, 1 row: whole blocks / coalesced | 8 rows: whole blocks / "
           "coalesced | batch-invariant (both) | logits' largest relative difference |",
           "|---|---|---|---|---|"]
    for m in r["models"]:
        g = m["gpu_ms_per_pass"]
        one = (g["blocks rows=1"], g["coalesced rows=1"])
        eight = (g["blocks rows=8"], g["coalesced rows=8"])
        inv = "yes" if all(m["batch_invariant"].values()) else "**no**"
        out.append(f"| {m['model'].removesuffix('.gguf')} | {one[0]:.2f} / **{one[1]:.2f}** "
                   f"({one[0] / one[1]:.2f}x) | {eight[0]:.2f} / **{eight[1]:.2f}** "
                   f"({eight[0] / eight[1]:.2f}x) | {inv} | "
                   f"{m['max_rel_diff']['coalesced']:.1e} |")
    return "\n".join(out) + "\n"


def gpu_shapes_table(name: str = "h100-shapes.json", root: Path = RESULTS) -> str:
    """docs/benchmarks.md's table of the real shapes (random Q4_K_M) on the GPU machine: decode
    natively (each pass awaited), in the page's stack (Dawn, pipelined), on the null GPU (the
    page's own cost), and llama.cpp CUDA's; prefill; the share of memory bandwidth."""
    result = load(name, root)
    out = ["| shape (file) | native wgpu-py decode | page's stack (Dawn) decode [range] | "
           "Dawn / llama.cpp | host ms a cycle: Dawn / null GPU | llama.cpp CUDA decode | "
           "prefill 1,024: native / llama.cpp | bandwidth used: Dawn / llama.cpp | "
           "verify 8 / 16 rows (x one row) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for e in result["table"]:
        dawn = e.get("dawn_decode_tok_s")
        dawn_cell = (f"{dawn['median']:.0f} [{dawn['min']:.0f}, {dawn['max']:.0f}]" if dawn else
                     "-")
        host = (f"{e['dawn_host_ms_per_cycle']:.2f} / {e['null_gpu_host_ms_per_cycle']:.2f}"
                if "null_gpu_host_ms_per_cycle" in e else
                f"{e['dawn_host_ms_per_cycle']:.2f} / -" if "dawn_host_ms_per_cycle" in e
                else "-")
        ratio = e.get("decode_ratio_dawn_over_llama_cpp")
        bw = (f"{e['dawn_hbm_fraction']:.1%} / {e['llama_cpp_hbm_fraction']:.1%}"
              if "dawn_hbm_fraction" in e else f"- / {e['llama_cpp_hbm_fraction']:.1%}")
        vcr = e["verify_cost_ratio"]
        out.append(f"| {e['model']} ({e['file_mb']:.0f} MB) | {e['pyspec_decode_tok_s']:.0f} | "
                   f"{dawn_cell} | {f'{ratio:.2f}x' if ratio else '-'} | {host} | "
                   f"{e['llama_cpp_decode_tok_s']:.0f} | {e['pyspec_prefill_tok_s']:,.0f} / "
                   f"{e['llama_cpp_prefill_1024_tok_s']:,.0f} | {bw} | "
                   f"{vcr['8']:.2f} / {vcr['16']:.2f} |")
    return "\n".join(out) + "\n"
