"""`python -m pyspec gate`: a measured verdict per drafter for one champion on this device
(docs/gate.md: speculation stays on only where it is measured to pay).

It runs the workload (bench's: the preregistered public.jsonl, or the sample --per-stratum and
--max-tokens ask for) through bench's side-by-side loop (bench.run_sides: champion-only and each
drafter back to back, prompt by prompt) and reports per drafter: tokens per champion pass,
acceptance by position, the speedup (the per-prompt ratio's median, with a bootstrap interval of
that median, and its range), the change of time to first token against one draft pass, and peak
memory. Then a verdict, `promote` or `keep off`, by THRESHOLDS (stated in docs/gate.md), which
is written to `<out>/gate-<backend>.json` (with provenance.record) and recorded for `auto`
(verdicts.py) only once the whole run has finished: a run stopped midway leaves none, and so
does a sample under THRESHOLDS["prompts"] (`unrecorded`: its verdict is printed, not kept).

Not here: the loop and the per-stratum statistics (bench.py, benchstats.py), the verdict table
and the rule by which `auto` follows it (verdicts.py, load.auto_choice).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import numpy as np

from .. import champion_path, trained_draft_path, verdicts
from ..drafters import parse_draft
from ..drafters.pairing import check_pair
from ..engine import Engine
from ..errors import UsageError
from ..formats.gguf import GGUFFile
from ..load import backend, load_champion
from .bench import check_options, draft_file, run_sides
from .benchstats import prompt_lines, summarize
from .provenance import DRAFTED_MIN, ROOT, add_option, record, sha256_file, write
from .workload import PUBLIC_WORKLOAD, check_messages, first_per_stratum, read_workload

# The verdict rule: a drafter is promoted only if every line holds (docs/gate.md says why).
THRESHOLDS = {
    "prompts": 8,              # prompts measured, at least: fewer make no interval worth the name
    "drafted_share": DRAFTED_MIN,   # share of cycles that drafted, at least ("did not draft")
    "speedup_median": 1.05,    # median per-prompt speedup, at least: a gain worth a draft
    "speedup_low": 1.00,       # the lower end of its 95% interval, above: it pays, not noise
    "ttft_draft_passes": 1.0,  # TTFT may grow by at most this many draft passes ...
    "ttft_slack": 0.05,        # ... plus this share of champion-only's TTFT (timer noise)
}
RULE_VERSION = 1      # bumped whenever THRESHOLDS or the rule change: old verdicts say which
BOOTSTRAP = {"resamples": 2000, "level": 0.95, "seed": 0}
INTERVAL = ("percentile bootstrap of the median of per-prompt speedups (tokens/s after prefill, "
            "drafter over champion-only), 95%, 2000 resamples, seed 0")
SCHEMA = "pyspec.gate/1"
DEFAULT_WORKLOAD = PUBLIC_WORKLOAD


def default_drafts() -> list[str]:
    """The drafters `auto` chooses among: n-gram, and the shipped trained draft if present."""
    try:
        trained_draft_path()
        return ["ngram", "trained"]
    except FileNotFoundError:
        return ["ngram"]


def check_drafts(champion: str, drafts: list[str]) -> None:
    """Refuse, before anything loads or runs, a drafter spec that is not one, "none" (the
    champion-only side, always run) and a draft model whose pair with the champion cannot be
    exact (pairing.check_pair on the two files' headers)."""
    if "none" in drafts:
        raise UsageError("--draft none: champion-only is the side every drafter is measured "
                         "against; name drafters (ngram, self:L, trained, a GGUF path)")
    header = None
    for d in drafts:
        path = draft_file(d)
        if path is None:
            continue
        header = header or GGUFFile.open(champion).metadata
        check_pair(header, GGUFFile.open(path).metadata).raise_if_bad()


def identity(drafter: str) -> str:
    """A drafter's name in a verdict: a draft model's sha256 (after "ngram+" for a combination),
    else its kind ("ngram", "self:20")."""
    spec = parse_draft(drafter)
    if spec.kind == "model":
        return sha256_file(spec.path)
    if spec.kind == "combo":
        return "ngram+" + sha256_file(spec.path)
    return f"self:{spec.layers}" if spec.kind == "self" else spec.kind


def speedup_interval(ratios: list[float]) -> dict:
    """The per-prompt speedups' median, its bootstrap interval (INTERVAL) and range."""
    x = np.asarray(ratios, dtype=float)
    rng = np.random.default_rng(BOOTSTRAP["seed"])
    medians = np.median(rng.choice(x, size=(BOOTSTRAP["resamples"], len(x))), axis=1)
    tail = (1 - BOOTSTRAP["level"]) / 2
    low, high = np.quantile(medians, [tail, 1 - tail])
    return {"median": float(np.median(x)), "low": float(low), "high": float(high),
            "min": float(x.min()), "max": float(x.max()), "n": len(x)}


def peak_total(peak: dict) -> int:
    """A run's peak bytes: the device's allocation on a GPU, else weights + KV + scratch."""
    if peak.get("device") is not None:
        return peak["device"]
    return sum(peak[k] or 0 for k in ("weights", "kv", "scratch"))


def measure(rows: list[dict]) -> dict:
    """One drafter's rows (bench's `compare` rows) -> what the verdict reads."""
    s = summarize(rows)
    passes = [r["stats"]["draft_s"] / r["stats"]["draft_calls"] for r in rows
              if r["stats"]["draft_calls"]]
    return {
        "prompts": s["prompts"], "outcome": s["outcome"],
        "identical_to_baseline": s["identical_to_baseline"],
        "drafted_cycles_share": s["drafted_cycles_share"],
        "tokens_per_pass": s["tokens_per_pass"],
        "acceptance": s["acceptance"], "acceptance_by_position": s["acceptance_by_position"],
        "speedup": speedup_interval([r["speedup"] for r in rows]),
        # per prompt: the drafter's TTFT minus champion-only's, beside it
        "ttft_change_s": statistics.median(r["stats"]["ttft_s"] - r["baseline_ttft_s"]
                                           for r in rows),
        "baseline_ttft_s": statistics.median(r["baseline_ttft_s"] for r in rows),
        "draft_pass_s": statistics.median(passes) if passes else 0.0,
        "peak_bytes": max(peak_total(r["stats"]["peak_bytes"]) for r in rows),
        "baseline_peak_bytes": max(peak_total(r["baseline_peak_bytes"]) for r in rows),
    }


def judge(m: dict, memory_budget: int | None = None, t: dict = THRESHOLDS) -> dict:
    """{"verdict": "promote" | "keep off", "reasons": why not, one line each (empty: promote)}
    for one drafter's measurements `m`; `memory_budget`: bytes its peak may not pass."""
    why = []
    if m["prompts"] < t["prompts"]:
        why.append(f"{m['prompts']} prompts measured, fewer than {t['prompts']}")
    if m["drafted_cycles_share"] < t["drafted_share"]:
        why.append(f"drafted in {m['drafted_cycles_share']:.0%} of cycles, under "
                   f"{t['drafted_share']:.0%}: it did not draft")
    elif m["identical_to_baseline"] not in (None, m["prompts"]):
        why.append(f"{m['prompts'] - m['identical_to_baseline']} of {m['prompts']} outputs "
                   "differ from champion-only: not exact (a bug: report it)")
    sp = m["speedup"]
    if sp["median"] < t["speedup_median"]:
        why.append(f"median speedup x{sp['median']:.3f} under x{t['speedup_median']:.2f}")
    if sp["low"] <= t["speedup_low"]:
        why.append(f"the speedup's interval reaches x{sp['low']:.3f}, not above "
                   f"x{t['speedup_low']:.2f}")
    allowed = t["ttft_draft_passes"] * m["draft_pass_s"] + t["ttft_slack"] * m["baseline_ttft_s"]
    if m["ttft_change_s"] > allowed:
        why.append(f"TTFT grew {m['ttft_change_s'] * 1e3:.1f} ms, more than the "
                   f"{allowed * 1e3:.1f} ms allowed")
    if memory_budget is not None and m["peak_bytes"] > memory_budget:
        why.append(f"peak memory {m['peak_bytes'] / 1e6:.1f} MB over the budget of "
                   f"{memory_budget / 1e6:.1f} MB")
    return {"verdict": verdicts.KEEP_OFF if why else verdicts.PROMOTE, "reasons": why,
            "ttft_allowed_s": allowed}


def unrecorded(m: dict, t: dict = THRESHOLDS) -> str | None:
    """Why a drafter's verdict is not recorded (None: it is). The rule's own minimum sample:
    a verdict from fewer prompts is printed, never kept, so that a quick trial run cannot
    decide what `auto` runs afterwards."""
    if m["prompts"] < t["prompts"]:
        return (f"{m['prompts']} prompts measured, fewer than the {t['prompts']} a verdict "
                "needs to be recorded")
    return None


def judge_rows(rows: dict[str, list[dict]], names: dict[str, str], champion_sha256: str,
               device_class: str, memory_budget: int | None = None) -> tuple[dict, list]:
    """(drafter -> its measurements, verdict and reasons, the verdicts to record) from
    run_sides' rows; `names`: each drafter's identity in a verdict. Each drafter's
    `not_recorded` says why its verdict is not among them (null: it is, and `verdict_sha256`
    names it). Natively and in the page."""
    table, found = {}, []
    for d, rs in rows.items():
        if not rs:
            continue
        table[d] = measure(rs)
        table[d] |= judge(table[d], memory_budget)
        table[d]["not_recorded"] = unrecorded(table[d])
        table[d]["verdict_sha256"] = None
        if table[d]["not_recorded"]:
            continue
        found.append(verdicts.record(
            champion_sha256=champion_sha256, draft=names[d], device_class=device_class,
            verdict=table[d]["verdict"], speedup=table[d]["speedup"],
            rule_version=RULE_VERSION, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())))
        table[d]["verdict_sha256"] = found[-1]["sha256"]
    return table, found


def run_gate(args) -> int:
    """Check everything, measure, judge, record the verdicts, write the JSON and print."""
    drafts = args.draft or default_drafts()
    args.drafts = ",".join(drafts)            # what bench's option check reads
    args.workload = args.workload or DEFAULT_WORKLOAD
    check_options(args)
    store = verdicts.store_path()
    verdicts.load(store)      # a store that is not one is named now, not after the measuring
    champion_file = args.champion or champion_path()
    check_drafts(champion_file, drafts)
    items = first_per_stratum(read_workload(args.workload), args.per_stratum)
    champion, tok = load_champion(args.champion, args.backend, args.ctx)
    prompts = check_messages(items, tok, args.workload)
    engines = {d: Engine(backend(champion, d, args.ctx), tok) for d in ["none", *drafts]}
    origin = record(champion=champion_file, workload=args.workload,   # the tree before the run
                    drafts={d: draft_file(d) for d in drafts}, adapter=engines["none"].adapter,
                    backend=args.backend, allow_dirty=args.allow_dirty)
    t0 = time.time()
    rows, skipped, _ = run_sides(args, items, prompts, engines, drafts)
    device, sha = engines["none"].device_class, champion.sha256()
    budget = int(args.memory_budget * 1e6) if args.memory_budget else None
    table, found = judge_rows(rows, {d: identity(d) for d in drafts}, sha, device, budget)
    result = {"schema": SCHEMA, "backend": args.backend, "adapter": engines["none"].adapter,
              "device_class": device,
              "provenance": origin,
              "workload": os.path.basename(args.workload), "per_stratum": args.per_stratum,
              "max_tokens_cap": args.max_tokens, "k_policy": args.k, "repeat": args.repeat,
              "thresholds": THRESHOLDS, "rule_version": RULE_VERSION,
              "memory_budget_bytes": budget, "interval": INTERVAL, "drafters": table,
              "prompts": prompt_lines(rows), "skipped": skipped, "wall_s": time.time() - t0,
              # the file the verdicts went to, null where none was recorded (`not_recorded`)
              "recorded_in": verdicts.save(found, store) if found else None}
    path = write(os.path.join(args.out, f"gate-{args.backend}.json"), result)
    print(json.dumps(result) if args.json
          else f"{format_verdicts(result)}\n\n{recorded_line(result)}")
    print(f"wrote {path}", file=sys.stderr)
    return 0


def recorded_line(result: dict) -> str:
    """The CLI's last line: which verdicts `auto` now follows and where they are kept, or why
    none was recorded."""
    drafters = result["drafters"]
    kept = [f"{d} {m['verdict']} ({m['verdict_sha256'][:12]})" for d, m in drafters.items()
            if m["verdict_sha256"]]
    if not kept:
        why = sorted({m["not_recorded"] for m in drafters.values()}) or ["no prompt was measured"]
        return (f"nothing recorded: {'; '.join(why)} (more prompts: --per-stratum, or the whole "
                "workload by default); `--draft auto` goes on as before")
    return (f"recorded in {result['recorded_in']}: {', '.join(kept)}; `--draft auto` follows "
            "them (`python -m pyspec verdicts` lists them, `... verdicts clear` removes them)")


def format_verdicts(result: dict) -> str:
    """Per drafter: its measurements, the verdict and the reasons against promoting it (the
    CLI prints it; the page shows it)."""
    out = [f"gate on {result['adapter']} ({result['device_class']}): {INTERVAL}"]
    for d, m in result["drafters"].items():
        sp, tpp = m["speedup"], m["tokens_per_pass"]
        by_pos = " ".join("-" if a is None else f"{a:.2f}" for a in m["acceptance_by_position"])
        out.append(
            f"\n{d}: {m['verdict']}\n"
            f"  tokens per pass   {tpp['median']:.2f} [{tpp['min']:.2f}, {tpp['max']:.2f}]\n"
            f"  acceptance        {m['acceptance']:.2f}; by position {by_pos}\n"
            f"  speedup           x{sp['median']:.3f}, interval [{sp['low']:.3f}, "
            f"{sp['high']:.3f}], range [{sp['min']:.3f}, {sp['max']:.3f}], "
            f"{sp['n']} prompts\n"
            f"  TTFT change       {m['ttft_change_s'] * 1e3:+.1f} ms (one draft pass "
            f"{m['draft_pass_s'] * 1e3:.1f} ms; allowed {m['ttft_allowed_s'] * 1e3:+.1f} ms)\n"
            f"  peak memory       {m['peak_bytes'] / 1e6:.1f} MB (champion-only "
            f"{m['baseline_peak_bytes'] / 1e6:.1f} MB)")
        out += [f"  keep off: {why}" for why in m["reasons"]]
        if m["not_recorded"]:
            out.append(f"  not recorded: {m['not_recorded']}")
    return "\n".join(out)


def add_parser(sub, champion_help: str) -> None:
    """The `gate` command's options (bench's workload flags among them)."""
    p = sub.add_parser("gate", help="measure whether each drafter pays here: promote or keep off")
    p.add_argument("--champion", help=champion_help)
    p.add_argument("--draft", action="append",
                   help="a drafter to judge (repeatable; default: ngram, and trained if shipped)")
    p.add_argument("--workload", default=None,
                   help=f"a JSONL workload (default: the preregistered {DEFAULT_WORKLOAD})")
    p.add_argument("--per-stratum", type=int, default=None,
                   help="prompts per stratum (default, or 0: all)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="cap each prompt's max_tokens (default, or 0: no cap)")
    p.add_argument("--backend", choices=["cpu", "numpy", "wgpu"], default="cpu")
    p.add_argument("--ctx", type=int, default=None, help="context positions to reserve")
    p.add_argument("--k", default="heuristic", help="fixed:K | heuristic | confidence:P")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of each prompt per side; a row compares each side's median run")
    p.add_argument("--memory-budget", type=float, default=None, metavar="MB",
                   help="peak memory a promoted drafter may not pass (default: none)")
    p.add_argument("--out", default="gate-out", help="the folder for the JSON")
    p.add_argument("--json", action="store_true",
                   help="print the JSON (as written to --out) instead of the table")
    add_option(p)
    p.set_defaults(func=run_gate, temperature=0.0, seed=0, verify=None)
