"""Where the trained draft disagrees with the champion: the draft's first-step agreement on the
public workload, by how sure the champion itself was of its token (an analysis for planning; it
asserts nothing).

    .venv/bin/python -m experiments.agreement_by_confidence \
        --out bench/results/agreement-by-confidence.json [--max-tokens 64]

1. The champion alone writes each public prompt's greedy answer (numpy engine, --max-tokens).
2. The champion and the draft each read prompt + answer in one pass (teacher forcing). At each
   answer position: the champion's probability of its own (greedy) token, p1, and of its second
   choice, p2; whether the draft's argmax is the champion's token.
3. Positions are binned by p1. A draft's first step is accepted exactly when its argmax is the
   champion's token, so the agreement per bin says which positions cost the acceptance: where
   the champion is sure (p1 >= 0.9) a small draft should agree nearly always; where it is close
   to a coin toss between two tokens (p1 - p2 small), agreeing is a matter of the draft
   reproducing a near-tie the same way.
The strata are the public workload's less adversarial (issue 10's acceptance target leaves it out).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics

import numpy as np
from .tree_estimate import cached

WORKLOAD = os.path.join(os.path.dirname(__file__), "..", "workloads", "public.jsonl")
BINS = (0.0, 0.3, 0.5, 0.7, 0.9, 1.000001)
MARGINS = (0.0, 0.05, 0.1, 0.2, 0.4, 1.000001)


def softmax_rows(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z.astype(np.float64))
    return e / e.sum(axis=1, keepdims=True)


def positions(workload: str, max_tokens: int) -> list[dict]:
    """Per public prompt: id, stratum, and per answer position (p1, p2, draft agrees)."""
    from pyspec import champion_path, trained_draft_path
    from pyspec.apps.workload import check_messages, read_workload
    from pyspec.cpu.model import Model
    from pyspec.engine import Engine
    from pyspec.formats.gguf import GGUFFile
    from pyspec.load import backend, load_champion
    from pyspec.options import Options

    items = [it for it in read_workload(workload) if it["stratum"] != "adversarial"]
    champion, tok = load_champion(champion_path(), "cpu", 2048)
    engine = Engine(backend(champion, "none", 2048), tok)
    draft = Model(GGUFFile.open(trained_draft_path()))
    out = []
    for it, ids in zip(items, check_messages(items, tok, workload)):
        answer = engine.generate(ids, Options(max_tokens=max_tokens)).tokens
        seq = ids + answer[:-1]
        probs = softmax_rows(champion.forward(seq, champion.new_cache(len(seq)), exact=False,
                                              logits_from=len(ids) - 1))
        top2 = np.sort(probs, axis=1)[:, -2:]
        mine = probs[np.arange(len(answer)), answer]
        d = draft.forward(seq, draft.new_cache(len(seq)), exact=False, logits_from=len(ids) - 1)
        agrees = d.argmax(axis=1) == np.asarray(answer)
        out.append({"id": it["id"], "stratum": it["stratum"],
                    "p1": mine.round(5).tolist(),
                    "p2": np.where(np.isclose(top2[:, 1], mine), top2[:, 0],
                                   top2[:, 1]).round(5).tolist(),
                    "agrees": agrees.astype(int).tolist()})
        print(f"{it['id']:>12} {it['stratum']:>12} agreement {agrees.mean():.3f} "
              f"champion p1 median {np.median(mine):.3f}", flush=True)
    return out


def table(key: np.ndarray, agrees: np.ndarray, edges) -> list[dict]:
    rows = []
    for lo, hi in zip(edges, edges[1:]):
        sel = (key >= lo) & (key < hi)
        rows.append({"from": lo, "to": round(min(hi, 1.0), 2),
                     "share_of_positions": round(float(sel.mean()), 4),
                     "draft_agreement": round(float(agrees[sel].mean()), 4) if sel.any() else None,
                     "share_of_disagreements": round(float((sel & ~agrees).sum()
                                                           / max(1, (~agrees).sum())), 4)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--workload", default=WORKLOAD)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--positions", help="reuse (or write, when absent) step 1-2's positions")
    args = ap.parse_args()
    answers = cached(args.positions, lambda: positions(args.workload, args.max_tokens))
    p1 = np.concatenate([a["p1"] for a in answers])
    p2 = np.concatenate([a["p2"] for a in answers])
    agrees = np.concatenate([a["agrees"] for a in answers]).astype(bool)
    strata = sorted({a["stratum"] for a in answers})
    per_stratum = {}
    for s in strata:
        mine = [a for a in answers if a["stratum"] == s]
        sp1 = np.concatenate([a["p1"] for a in mine])
        sag = np.concatenate([a["agrees"] for a in mine]).astype(bool)
        per_stratum[s] = {"positions": int(sp1.size),
                          "draft_agreement": round(float(sag.mean()), 4),
                          "champion_p1_median": round(float(np.median(sp1)), 4),
                          "share_p1_below_0.5": round(float((sp1 < 0.5).mean()), 4),
                          "agreement_where_p1_at_least_0.9": (
                              round(float(sag[sp1 >= 0.9].mean()), 4) if (sp1 >= 0.9).any()
                              else None)}
    result = {
        "what": "the trained draft's first-step agreement with the champion's greedy token, "
                "teacher-forced, by the champion's own probability of that token (p1) and by "
                "its margin over the second choice (p1 - p2)",
        "script": "experiments/agreement_by_confidence.py",
        "machine": platform.platform(),
        "workload": "workloads/public.jsonl without the adversarial stratum",
        "answers": len(answers), "positions": int(p1.size), "max_tokens": args.max_tokens,
        "draft_agreement": round(float(agrees.mean()), 4),
        "champion_p1_median": round(float(np.median(p1)), 4),
        "by_p1": table(p1, agrees, BINS),
        "by_margin": table(p1 - p2, agrees, MARGINS),
        # What the first step would agree on if the draft matched the champion at every position
        # where the champion is at least this sure, and stayed as it is elsewhere.
        "if_perfect_where_p1_at_least": {
            str(t): round(float(((p1 >= t) | agrees).mean()), 4) for t in (0.5, 0.7, 0.9)},
        "per_stratum": per_stratum,
        "answer_median_agreement": round(statistics.median(
            float(np.mean(a["agrees"])) for a in answers), 4),
    }
    from pyspec.apps import provenance
    provenance.write(args.out, provenance.stamp(result, workload=args.workload))
    print(f"agreement {result['draft_agreement']}, champion p1 median "
          f"{result['champion_p1_median']}, if perfect where sure "
          f"{result['if_perfect_where_p1_at_least']}")
    for name in ("by_p1", "by_margin"):
        for r in result[name]:
            print(f"{name} [{r['from']:.2f}, {r['to']:.2f}) share {r['share_of_positions']:.3f} "
                  f"agreement {r['draft_agreement']} of disagreements "
                  f"{r['share_of_disagreements']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
