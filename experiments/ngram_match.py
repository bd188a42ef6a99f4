"""How often n-gram drafts are right, by the length of the suffix they matched: the measurement
behind drafters/ngram.py's DRAFTS_BY_MATCH.

The champion answers prompts of the frozen training seed set (train/data/seed_prompts.jsonl.gz, the
first --per-kind of each kind; never the evaluation workload), greedy. Then at every position of
every answer the host drafter's lookup runs on the tokens so far, as a cycle would, and its
drafts (up to 15) are scored against the champion's next tokens: by the matched suffix length
n, how often the first draft is right and how many lead drafts are right on average.

    .venv/bin/python -m experiments.ngram_match --champion C.gguf --backend wgpu \
        --out bench/results/ngram-match.json [--tokens T.json]

--tokens keeps the champion's answers (prompt and output ids) in a file, and reads them from it
when it exists, so the analysis can be rerun without the champion.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
from collections import defaultdict
from pathlib import Path

from pyspec.apps import provenance
from pyspec.drafters import ngram

SEEDS = Path(__file__).resolve().parent.parent / "train" / "data" / "seed_prompts.jsonl.gz"
LONGEST = 15   # drafts scored per position: the most any match proposes


def answers(args) -> list[dict]:
    if args.tokens and os.path.exists(args.tokens):
        return json.loads(Path(args.tokens).read_text())
    from pyspec.engine import Engine
    from pyspec.load import backend, load_champion
    from pyspec.options import Options
    by_kind: dict[str, list] = defaultdict(list)
    for line in gzip.decompress(SEEDS.read_bytes()).decode("utf-8").split("\n")[:-1]:
        row = json.loads(line)
        if len(by_kind[row["kind"]]) < args.per_kind:
            by_kind[row["kind"]].append(row)
    champion, tok = load_champion(args.champion, args.backend, 2048)
    engine = Engine(backend(champion, "none"), tok)
    out = []
    for kind in sorted(by_kind):
        for row in by_kind[kind]:
            ids = tok.encode_chat(row["messages"])
            r = engine.generate(ids, Options(max_tokens=args.max_tokens))
            out.append({"id": row["id"], "kind": kind, "prompt": ids, "out": r.tokens})
    if args.tokens:
        Path(args.tokens).write_text(json.dumps(out))
    return out


def lookup(drafter: ngram.NgramDrafter, tokens: list[int]) -> tuple[list[int], int]:
    """(the drafts, uncapped, and the matched suffix length) by the drafter's rule."""
    start, n = drafter.match(tokens)
    return (tokens[start:start + LONGEST] if n else []), n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--champion")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--per-kind", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--tokens", help="the champion's answers: kept here, read from here")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = answers(args)
    stats: dict[int, list] = defaultdict(lambda: [0, 0, 0])   # n -> positions, first right, right
    for row in rows:
        prompt, out, drafter = row["prompt"], row["out"], ngram.NgramDrafter()
        for p in range(len(out)):
            drafts, n = lookup(drafter, prompt + out[:p])   # the index grows with the answer
            right = 0
            for i, t in enumerate(drafts):
                if p + i >= len(out) or out[p + i] != t:
                    break
                right += 1
            s = stats[n]
            s[0] += 1
            s[1] += right > 0
            s[2] += right
    report = {
        "prompts": len(rows), "source": "train/data/seed_prompts.jsonl.gz",
        "answers": f"greedy, at most {args.max_tokens} tokens, the first {args.per_kind} "
                   "prompts of each kind",
        "positions": sum(s[0] for s in stats.values()),
        "by_match_length": {str(n): {"positions": s[0], "first_right": s[1] / s[0],
                                     "mean_right": s[2] / s[0]} for n, s in sorted(stats.items())},
        "drafts_by_match": list(ngram.DRAFTS_BY_MATCH),
    }
    provenance.write(args.out, provenance.stamp(report, champion=args.champion,
                                                workload=str(SEEDS)))
    for n, s in report["by_match_length"].items():
        print(f"match {n}: {s['positions']} positions, first draft right {s['first_right']:.2f}, "
              f"{s['mean_right']:.2f} drafts right on average")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
