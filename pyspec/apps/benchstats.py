"""The statistics of a benchmark: one row per prompt and drafter (`compare`: a drafter's run
against the champion-only run beside it), their medians and ranges per stratum and overall
(`summarize`, `drafter_tables`), the GPU's host time per cycle (`per_cycle`), the pipelining A/B
table, the printed table and the plot. Shared by the native bench (bench.py) and the page's
(webtools/bench.py): both build rows of the same shape.

Every range says how many prompts it rests on (`spread`'s `n`, a summary's `prompts`), and a
drafter that barely drafted is reported as such, not as identical (provenance.outcome).

Not here: running the sides (bench.py), where a result came from (provenance.py).
"""

from __future__ import annotations

import statistics
import sys

from .provenance import drafted_share, outcome, tokens_sha256


def compare(item: dict, stats: dict, tokens: list[int], base_stats: dict,
            base_tokens: list[int], exact: bool = True) -> dict:
    """One prompt's row for `summarize`: a drafter's run against the champion-only run next to it.
    `stats` are engine stats (Engine.generate, or the browser worker's `done` message); `exact`:
    whether the two outputs must be the same tokens (not under rejection sampling)."""
    return {"id": item["id"], "stratum": item["stratum"], "stats": stats,
            "identical": tokens == base_tokens if exact else None,
            "tokens_sha256": tokens_sha256(tokens),
            "baseline_tokens_sha256": tokens_sha256(base_tokens),
            "speedup": stats["tokens_per_s"] / base_stats["tokens_per_s"],
            "baseline_tokens_per_s": base_stats["tokens_per_s"],
            "baseline_ttft_s": base_stats["ttft_s"],
            "baseline_passes": base_stats["champion_passes"],
            "baseline_peak_bytes": base_stats["peak_bytes"],
            "baseline_pass_s": base_stats["verify_s"] / base_stats["champion_passes"],
            "pass_s": stats["verify_s"] / stats["champion_passes"]}


def identity_over_repeats(row: dict, outputs: list[list[int]], base_tokens: list[int]) -> None:
    """With --repeat, a drafter's row is identical only if every run of both sides gave the
    baseline's tokens; the first output that did not keeps its hash in the row."""
    odd = next((t for t in outputs if t != base_tokens), None)
    row["identical"] = odd is None
    if odd is not None:
        row["tokens_sha256"] = tokens_sha256(odd)


def drafter_tables(rows: dict[str, list[dict]], strata: list[str]) -> dict:
    """drafter -> {"overall": summary, "strata": {stratum: summary}} (strata with no row skipped)."""
    return {d: {"overall": summarize(rs),
                "strata": {s: summarize([r for r in rs if r["stratum"] == s])
                           for s in strata if any(r["stratum"] == s for r in rs)}}
            for d, rs in rows.items() if rs}


def prompt_lines(rows: dict[str, list[dict]]) -> dict:
    """drafter -> one line per prompt: identity (with both outputs' token hashes, so it can be
    recounted: provenance.recount_identical), speedup, tokens per pass, the guard's decisions."""
    return {d: [{k: r[k] for k in ("id", "stratum", "identical", "tokens_sha256",
                                   "baseline_tokens_sha256", "speedup")} |
                {"tokens_per_pass": r["stats"]["tokens_per_pass"],
                 "guard": {k: v for k, v in r["stats"]["schedule"].items() if k != "policy"}}
                for r in rs]
            for d, rs in rows.items()}


def per_cycle(timings: list[dict]) -> dict:
    """GPU backend_timing dicts ({cycles, host_s, wait_s, readbacks, readback_bytes} per request)
    -> per decode cycle, readbacks and their bytes, and seconds of host work (encode + submit)
    and of waiting for the readback: means, and the
    median and range of the cycles' own host times (`host_s_cycle`), and of those encoded while
    no other cycle was in flight (`host_s_cycle_alone`: on a software adapter, whose threads run
    on the host's cores, the host's own cost; the others share the cores with the GPU's work),
    and the garbage collector's share."""
    cycles = sum(t.get("cycles", 0) for t in timings)
    return {"cycles": cycles,
            "readbacks_per_cycle": sum(t.get("readbacks", 0) for t in timings) / max(cycles, 1),
            "readback_bytes_per_cycle": (sum(t.get("readback_bytes", 0) for t in timings)
                                         / max(cycles, 1)),
            "host_s_per_cycle": sum(t.get("host_s", 0.0) for t in timings) / max(cycles, 1),
            "host_s_cycle": spread([h for t in timings for h in t.get("host_s_cycles", [])]),
            "host_s_cycle_alone": spread([h for t in timings for h in t.get("host_s_alone", [])]),
            "wait_s_per_cycle": sum(t.get("wait_s", 0.0) for t in timings) / max(cycles, 1),
            # Python's collector (pyspec/gctime.py): its seconds a cycle and its collections
            "gc_s_per_cycle": sum(t.get("gc_s", 0.0) for t in timings) / max(cycles, 1),
            "gc_collections": sum(t.get("gc_collections", 0) for t in timings),
            "gc_full": sum(t.get("gc_full", 0) for t in timings)}


def spread(values: list[float]) -> dict:
    """Median, min and max of values, and `n`: how many they are."""
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def summarize(rows: list[dict]) -> dict:
    """Rows of one drafter in one stratum -> medians and ranges."""
    longest = max(len(r["stats"]["drafted_by_position"]) for r in rows)
    by_pos_drafted = [sum(r["stats"]["drafted_by_position"][i] for r in rows
                          if i < len(r["stats"]["drafted_by_position"])) for i in range(longest)]
    by_pos_accepted = [sum(r["stats"]["accepted_by_position"][i] for r in rows
                           if i < len(r["stats"]["accepted_by_position"])) for i in range(longest)]
    drafted = sum(r["stats"]["drafted"] for r in rows)
    # None under rejection sampling, where outputs agree in distribution only
    identical = (None if any(r["identical"] is None for r in rows)
                 else sum(r["identical"] for r in rows))
    share = drafted_share([r["stats"] for r in rows])
    return {
        "prompts": len(rows),
        "identical_to_baseline": identical,
        "drafted_cycles_share": share,
        "outcome": outcome(identical, len(rows), share),
        "speedup": spread([r["speedup"] for r in rows]),
        "tokens_per_pass": spread([r["stats"]["tokens_per_pass"] for r in rows]),
        "acceptance": (sum(r["stats"]["accepted"] for r in rows) / drafted) if drafted else 0.0,
        "acceptance_by_position": [a / d if d else None
                                   for a, d in zip(by_pos_accepted, by_pos_drafted)],
        "ttft_s": spread([r["stats"]["ttft_s"] for r in rows]),
        "baseline_ttft_s": spread([r["baseline_ttft_s"] for r in rows]),
        "champion_passes": sum(r["stats"]["champion_passes"] for r in rows),
        "baseline_champion_passes": sum(r["baseline_passes"] for r in rows),
        # seconds per champion pass on each side: the same kernel, so a gap here is machine noise
        "pass_s": spread([r["pass_s"] for r in rows]),
        "baseline_pass_s": spread([r["baseline_pass_s"] for r in rows]),
        "draft_calls": sum(r["stats"]["draft_calls"] for r in rows),
        "tokens_per_s": spread([r["stats"]["tokens_per_s"] for r in rows]),
        "baseline_tokens_per_s": spread([r["baseline_tokens_per_s"] for r in rows]),
        "peak_bytes": {k: max((r["stats"]["peak_bytes"][k] for r in rows
                               if r["stats"]["peak_bytes"][k] is not None), default=None)
                       for k in rows[0]["stats"]["peak_bytes"]},
    }


def pipelining_table(rows: list[dict]) -> dict:
    """Champion-only with each cycle submitted before the last is read (the default on a GPU)
    vs read cycle by cycle, side by side per prompt: tokens/s and their ratio."""
    return {"prompts": len(rows), "identical": sum(r["identical"] for r in rows),
            "champion_tok_s": spread([r["pipelined_tok_s"] for r in rows]),
            "champion_tok_s_serial": spread([r["serial_tok_s"] for r in rows]),
            "ratio": spread([r["pipelined_tok_s"] / r["serial_tok_s"] for r in rows])}


def print_table(result: dict, strata: list[str]) -> None:
    """Per drafter and stratum: the speedup's median and range over n prompts, tokens per pass,
    acceptance, and the outcome (identical, N of M differ, did not draft, not compared)."""
    for d, res in result["drafters"].items():
        print(f"\n{d}: stratum  speedup median [min, max] (n)  tokens/pass  acceptance  outcome")
        for s in [*strata, "overall"]:
            r = res["overall"] if s == "overall" else res["strata"][s]
            sp = r["speedup"]
            print(f"  {s:<13} {sp['median']:.2f} [{sp['min']:.2f}, {sp['max']:.2f}] "
                  f"({r['prompts']})   {r['tokens_per_pass']['median']:.2f}        "
                  f"{r['acceptance']:.2f}      {r['outcome']}")


def plot(result: dict, strata: list[str], path: str, title: str | None = None) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed; skipping the plot", file=sys.stderr)
        return
    drafts = list(result["drafters"])
    labels = [*strata, "overall"]
    fig, axes = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    width = 0.8 / max(len(drafts), 1)
    for j, d in enumerate(drafts):
        res = result["drafters"][d]
        rows = [res["overall"] if s == "overall" else res["strata"][s] for s in labels]
        xs = [i + j * width for i in range(len(labels))]
        for ax, key in zip(axes, ("speedup", "tokens_per_pass")):
            med = [r[key]["median"] for r in rows]
            err = [[m - r[key]["min"] for m, r in zip(med, rows)],
                   [r[key]["max"] - m for m, r in zip(med, rows)]]
            ax.bar(xs, med, width, yerr=err, capsize=2, label=d)
    axes[0].axhline(1.0, color="k", lw=0.8)
    axes[0].set_ylabel("decode speedup vs champion-only\n(median, range)")
    axes[1].set_ylabel("tokens per champion pass\n(median, range)")
    axes[1].set_xticks([i + width * (len(drafts) - 1) / 2 for i in range(len(labels))])
    axes[1].set_xticklabels(labels, rotation=30)
    axes[0].legend()
    axes[0].set_title(title or f"pyspec bench, backend {result['backend']} ({result['adapter']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
