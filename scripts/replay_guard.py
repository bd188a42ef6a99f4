"""Replay the break-even guard over the champion's own greedy outputs, with a GPU's measured cycle
times, to see where speculation gains or loses time without a GPU (bench/results/README.md,
"n-gram previews instead of probes").

    .venv/bin/python scripts/replay_guard.py --workload workloads/public.jsonl \\
        [--outputs greedy.json] [--ahead-ms 1.95] [--alone-ms 2.71] [--row-ms 0.047]

The champion's greedy outputs (64 tokens a prompt; `--outputs` caches them: about 3 minutes on
the CPU engine here) fix what any drafter's proposals would keep. The replay runs the engine's
loop in miniature: pyspec's own Schedule and NgramDrafter, a cycle decided while the one before
is in flight, a k = 0 cycle after a k = 0 cycle going ahead (costing --ahead-ms) and every other
cycle read alone (--alone-ms plus --row-ms per draft). It prints the predicted speedup against
pipelined champion-only per stratum, with the guard's probes and with previews, and where the
time went (cycles read alone with nothing drafted). Timing goals live in benchmarks, not here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspec import schedule  # noqa: E402
from pyspec.apps.workload import read_workload  # noqa: E402
from pyspec.drafters.ngram import NgramDrafter  # noqa: E402
from pyspec.request import score_previews  # noqa: E402


def greedy_outputs(workload: str, cache: str | None, max_tokens: int) -> list[dict]:
    if cache and Path(cache).exists():
        return json.loads(Path(cache).read_text())
    from pyspec.engine import Engine
    from pyspec.load import backend, load_champion
    from pyspec.options import Options
    champion, tok = load_champion(None, "cpu", 2048)
    engine = Engine(backend(champion, "none"), tok)
    out = []
    for it in read_workload(workload):
        ids = tok.encode_chat(it["messages"])
        r = engine.generate(ids, Options(max_tokens=min(max_tokens, it.get("max_tokens", 128)),
                                         k="fixed:0"))
        out.append({"id": it["id"], "stratum": it["stratum"], "prompt": ids, "out": r.tokens})
        print(it["id"], len(r.tokens), file=sys.stderr, flush=True)
    if cache:
        Path(cache).write_text(json.dumps(out))
    return out


def replay(item: dict, timing: dict, shadowed: bool, t: dict) -> dict:
    sched = schedule.Schedule(schedule.Heuristic(), True, timing, shadowed)
    drafter, out = NgramDrafter(), item["out"]
    tokens, i, seconds, bubbles = list(item["prompt"]), 0, 0.0, 0
    queued = decided = None
    previews: list = []
    while i < len(out):
        remaining = len(out) - i
        ahead = queued is not None
        if ahead:
            k, queued = 0, None
        elif decided is not None:
            k, decided = decided, None
        else:
            k = min(sched.next_k(), remaining - 1)
        drafts = drafter.propose(tokens, k, None).tokens if k > 0 else []
        kept = 0
        while kept < len(drafts) and drafts[kept] == out[i + kept]:
            kept += 1
        if not drafts and remaining > 1:
            k_next = min(sched.next_k(), remaining - 2)
            if k_next == 0:
                queued = True
            else:
                decided = k_next
        cost = t["ahead"] if ahead else t["alone"] + t["row"] * len(drafts)
        bubbles += not ahead and not drafts and i > 0
        seconds += cost
        sched.observe(len(drafts), kept, 0.0, cost, ahead)
        tokens += out[i:i + kept + 1]
        i += kept + 1
        if shadowed:
            previews = score_previews(previews, tokens, sched)
            if not drafts:
                previews.append((len(tokens), drafter.preview(tokens, schedule.K_MAX), None))
    base = t["ahead"] * (len(out) - 1) + t["alone"]
    return {"speedup": base / seconds, "bubbles": bubbles, **sched.stats()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", required=True)
    ap.add_argument("--outputs", default=None, help="JSON cache of the champion's outputs")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ahead-ms", type=float, default=1.95)
    ap.add_argument("--alone-ms", type=float, default=2.71)
    ap.add_argument("--row-ms", type=float, default=0.047)
    args = ap.parse_args(argv)
    items = greedy_outputs(args.workload, args.outputs, args.max_tokens)
    t = {"ahead": args.ahead_ms / 1e3, "alone": args.alone_ms / 1e3, "row": args.row_ms / 1e3}
    for shadowed in (False, True):
        timing: dict = {}
        rows = [(it["stratum"], replay(it, timing, shadowed, t)) for it in items]
        strata = sorted({s for s, _ in rows})
        print("previews" if shadowed else "probes  ",
              f"overall {statistics.median(r['speedup'] for _, r in rows):.2f}",
              " ".join(f"{s} {statistics.median(r['speedup'] for x, r in rows if x == s):.2f}"
                       for s in strata))
        print("          cycles read alone with nothing drafted:",
              sum(r["bubbles"] for _, r in rows), "of", sum(sum(r["k_histogram"].values())
                                                              for _, r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
