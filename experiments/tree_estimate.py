"""What verifying a tree of drafts instead of a chain would give the trained draft, estimated
from the champion's greedy text on the public workload (an estimate for planning; no engine
runs a tree).

    .venv/bin/python -m experiments.tree_estimate --out bench/results/tree-estimate.json \
        [--ranks R.json] [--max-tokens 64]

1. The champion alone writes each public prompt's greedy answer (numpy engine, --max-tokens).
2. The draft reads prompt + answer in one pass (teacher forcing) and gives, at each answer
   position, the rank of the champion's token among its logits (0: its argmax).
3. Greedy verification of a tree whose every node at depth j - 1 has the draft's top w_j tokens
   as children accepts the longest path of the champion's own tokens in it, and the champion's
   token after it: at a node on that path the draft's context is the true prefix, so the path
   reaches depth j exactly when the ranks at positions p .. p + j - 1 are below w_1 .. w_j. A
   chain of k drafts is widths (1,) * k. Ranks are computed once; every shape is simulated on them.
4. A cycle's cost, in champion passes: the verify pass over the tree's rows (1 + its nodes) as
   `verify_cost_ratio` of an H200 run (bench/results/h200.json, made non-decreasing in rows),
   plus one draft step per depth at --draft-step (0.2: a fixed:2 cycle cost 1.46 passes for two
   steps and a 3-row verify on the H200; a step over the nodes of a depth costs what a one-row
   step does while the draft is bound by its dispatches). Speed estimate = tokens per cycle /
   cost. It leaves out the accept and readback overheads, so it reads chains ~10% above their
   measured speedups; the ratio tree / chain is what it is for.
5. Two chains in one pass: the prompt n-gram's proposal (drafters/ngram.py, on the true prefix)
   beside the draft's chain, each a branch from the last committed token; a cycle keeps the
   longer agreeing branch. Next to it the same cost model for n-gram alone, the draft's chain
   alone and `ngram+trained`'s rule (n-gram where the context ends in a match of 3 tokens or
   more, the draft otherwise), counted as if a switch cost nothing (on the H200 it does: a switch
   waits for the cycle in flight). Medians over the answers, per stratum.
A benchmark script: it asserts nothing. --ranks reuses (or writes, when absent) step 1-2's ranks.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics

import numpy as np

WORKLOAD = os.path.join(os.path.dirname(__file__), "..", "workloads", "public.jsonl")
H200 = os.path.join(os.path.dirname(__file__), "..", "bench", "results", "h200.json")


def answer_ranks(workload: str, max_tokens: int) -> list[dict]:
    """Per public prompt: its id, stratum, and the draft's rank of each greedy champion token."""
    from pyspec import champion_path, trained_draft_path
    from pyspec.apps.workload import check_messages, read_workload
    from pyspec.cpu.model import Model
    from pyspec.engine import Engine
    from pyspec.formats.gguf import GGUFFile
    from pyspec.load import backend, load_champion
    from pyspec.options import Options

    items = read_workload(workload)
    champion, tok = load_champion(champion_path(), "cpu", 2048)
    engine = Engine(backend(champion, "none", 2048), tok)
    draft = Model(GGUFFile.open(trained_draft_path()))
    out = []
    for it, ids in zip(items, check_messages(items, tok, workload)):
        answer = engine.generate(ids, Options(max_tokens=max_tokens)).tokens
        kv = draft.new_cache(len(ids) + len(answer))
        logits = draft.forward(ids + answer[:-1], kv, exact=False, logits_from=len(ids) - 1)
        ranks = [int((row > row[t]).sum()) for row, t in zip(logits, answer)]
        out.append({"id": it["id"], "stratum": it["stratum"], "ranks": ranks,
                    "prompt": ids, "answer": answer})
    return out


def tree_rows(widths: tuple) -> int:
    """Rows of the verify pass: the last committed token and every node of the tree."""
    rows, level = 1, 1
    for w in widths:
        level *= w
        rows += level
    return rows


def tokens_per_cycle(ranks: list[int], widths: tuple) -> float:
    """Tokens a greedy cycle emits on average over one answer, cycles one after the other."""
    p, cycles = 0, 0
    while p < len(ranks):
        depth = 0
        while depth < len(widths) and p + depth < len(ranks) and ranks[p + depth] < widths[depth]:
            depth += 1
        p, cycles = p + depth + 1, cycles + 1
    return len(ranks) / cycles


def two_chain_speed(answer: dict, verify_cost: dict, draft_step: float, k_draft: int,
                    use_ngram) -> float:
    """Tokens per champion pass over one answer: each cycle verifies the n-gram's proposal
    (when use_ngram(match length)) and a chain of k_draft drafts (0 where the n-gram is used
    alone: use_ngram returns "alone"), side by side."""
    from pyspec.drafters.ngram import NgramDrafter

    prompt, tokens, ranks = answer["prompt"], answer["answer"], answer["ranks"]
    ngram, p, cost = NgramDrafter(), 0, 0.0
    while p < len(tokens):
        context = prompt + tokens[:p]
        choice = use_ngram(ngram.match(context)[1])
        proposal = ngram.preview(context, 15) if choice else []
        k = 0 if choice == "alone" else k_draft
        by_ngram = 0
        while (by_ngram < len(proposal) and p + by_ngram < len(tokens)
               and proposal[by_ngram] == tokens[p + by_ngram]):
            by_ngram += 1
        by_draft = 0
        while by_draft < k and p + by_draft < len(tokens) and ranks[p + by_draft] == 0:
            by_draft += 1
        cost += verify_cost[min(len(verify_cost), 1 + len(proposal) + k)] + k * draft_step
        p += max(by_ngram, by_draft) + 1
    return len(tokens) / cost


TWO_CHAIN_RULES = {
    "draft chain, 2 drafts": (2, lambda match: False),
    "n-gram alone": (0, lambda match: "alone"),
    "ngram+trained's rule, switches free": (2, lambda match: "alone" if match >= 3 else False),
    "both chains, 2 drafts": (2, lambda match: True),
    "both chains; n-gram alone at a match of 3+": (2, lambda match: "alone" if match >= 3
                                                    else True),
}


def cached(path: str | None, make):
    """The JSON at `path` when it exists, else make(), written there when a path is given."""
    if path and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    value = make()
    if path:
        with open(path, "w") as f:
            json.dump(value, f)
    return value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default=WORKLOAD)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ranks", default=None)
    ap.add_argument("--draft-step", type=float, default=0.2)
    ap.add_argument("--max-rows", type=int, default=16)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    answers = cached(args.ranks, lambda: answer_ranks(args.workload, args.max_tokens))
    with open(H200) as f:
        ratio = json.load(f)["gpu"]["verify_cost_ratio"]
    verify_cost, top = {}, 0.0
    for rows in range(1, args.max_rows + 1):
        top = max(top, ratio[str(rows)])
        verify_cost[rows] = top
    kept = [a for a in answers if a["stratum"] != "adversarial"]
    ranks = np.concatenate([a["ranks"] for a in kept])
    shapes = []
    for depth in range(1, 6):
        for widths in itertools.product([1, 2, 3, 4], repeat=depth):
            rows = tree_rows(widths)
            if rows > args.max_rows or list(widths) != sorted(widths, reverse=True):
                continue
            per_answer = [tokens_per_cycle(a["ranks"], widths) for a in kept]
            tpc = statistics.mean(per_answer)
            cost = verify_cost[rows] + depth * args.draft_step
            shapes.append({"widths": list(widths), "rows": rows, "tokens_per_cycle": round(tpc, 4),
                           "cost_passes": round(cost, 4), "speed_estimate": round(tpc / cost, 4),
                           "chain": set(widths) == {1}})
    shapes.sort(key=lambda s: -s["speed_estimate"])
    best_chain = max((s for s in shapes if s["chain"]), key=lambda s: s["speed_estimate"])
    result = {
        "what": __doc__.split("\n\n")[0],
        "machine": platform.platform(),
        "answers": len(kept), "answer_tokens": int(ranks.size),
        "strata": "the public workload without adversarial",
        "draft_top_n_agreement": {str(n): round(float((ranks < n).mean()), 4)
                                  for n in (1, 2, 3, 4, 8)},
        "draft_step_passes": args.draft_step,
        "verify_cost_ratio": verify_cost,
        "best_chain": best_chain,
        "best_tree": shapes[0],
        "tree_over_chain": round(shapes[0]["speed_estimate"] / best_chain["speed_estimate"], 4),
        "shapes": shapes,
    }
    if all("answer" in a for a in kept):
        strata = sorted({a["stratum"] for a in kept})
        result["two_chains"] = {}
        for name, (k, rule) in TWO_CHAIN_RULES.items():
            speed = {a["id"]: two_chain_speed(a, verify_cost, args.draft_step, k, rule)
                     for a in kept}
            row = {s: round(statistics.median(v for a in kept if a["stratum"] == s
                                              for v in [speed[a["id"]]]), 3) for s in strata}
            row["overall"] = round(statistics.median(speed.values()), 3)
            result["two_chains"][name] = row
            print(f"{name:45s} " + " ".join(f"{s[:6]} {v:.2f}" for s, v in row.items()))
    from pyspec.apps import provenance
    provenance.write(args.out, provenance.stamp(result, workload=args.workload))
    print(f"top-n agreement {result['draft_top_n_agreement']}")
    for s in shapes[:8] + [best_chain]:
        print(f"{str(s['widths']):>14} rows {s['rows']:>2} tokens/cycle "
              f"{s['tokens_per_cycle']:.3f} cost {s['cost_passes']:.2f} est "
              f"{s['speed_estimate']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
