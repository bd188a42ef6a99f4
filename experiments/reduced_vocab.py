"""What a reduced draft vocabulary would buy: the shipped draft with its head cut to the N token
ids most frequent in its training answers, on the numpy engine (issue 10's third candidate).

The draft's logits outside the N ids become model.OUTSIDE_HEAD (Model.reduce_head, the cut
the numpy engine runs with a sidecar DRAFT.vocab.json), so it never proposes them and its q is 0
there; verification sees the same q, so the output stays the champion's (checked here: every
run's tokens against champion-only). What it costs is acceptance wherever the champion's token
lies outside the N ids; what it saves is the head product, most of a draft step on the CPU
(49,152 x 576 multiply-adds per token against about 14 M in the draft's four layers).

Reports, for each N: the share of the training answers' tokens inside the N ids, the share of
the champion's greedy tokens on the workload inside them, acceptance at --k fixed:4 on the
workload (engine runs, greedy), and the draft's one-token step time (head included), median
of --reps steps, timed as experiments/bench_draft_cost.py times a step. Frequencies come from the
training shards (train/generate.py's npz files), never from the workload.

    .venv/bin/python -m experiments.reduced_vocab --data GEN_DIR --workload workloads/public.jsonl \
        [--n 4096,8192,16384,32768] [--per-stratum 2] [--max-tokens 48] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import glob
import json
import os

import numpy as np

from pyspec import trained_draft_path
from pyspec.apps import provenance
from pyspec.apps.workload import first_per_stratum, read_workload
from pyspec.cpu.executor import CPUBackend
from pyspec.cpu.model import Model
from pyspec.drafters.model_draft import ModelDrafter
from pyspec.drafters.pairing import bind_borrowed
from pyspec.engine import Engine, Options
from pyspec.formats.gguf import GGUFFile
from pyspec.load import load_champion

from .bench_draft_cost import numpy_step_s   # the step timing it reports


def frequencies(data: str, vocab: int) -> np.ndarray:
    counts = np.zeros(vocab, np.int64)
    for shard in sorted(glob.glob(os.path.join(data, "gen-*.npz"))):
        counts += np.bincount(np.load(shard)["answer_ids"].astype(np.int64), minlength=vocab)
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="train/generate.py's shard folder")
    ap.add_argument("--workload", required=True)
    ap.add_argument("--n", default="4096,8192,16384,32768")
    ap.add_argument("--per-stratum", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()

    champion, tok = load_champion(None, "cpu")
    vocab = champion.config.vocab_size
    counts = frequencies(args.data, vocab)
    order = np.argsort(-counts, kind="stable")
    sizes = [int(n) for n in args.n.split(",")]
    draft_path = trained_draft_path()
    items = first_per_stratum(read_workload(args.workload), args.per_stratum)
    prompts = [tok.encode_chat(it["messages"]) for it in items]

    base = Engine(CPUBackend(champion), tok)
    reference = [base.generate(p, Options(max_tokens=args.max_tokens, k="fixed:0")).tokens
                 for p in prompts]
    greedy = np.concatenate([np.asarray(t, np.int64) for t in reference])

    rows, champion_steps = [], []
    for n in [*sizes, None]:
        ids = None if n is None else np.sort(order[:n])
        draft_file = GGUFFile.open(draft_path)
        bind_borrowed(draft_file, champion.file)   # a draft may read the champion's embedding
        model = Model(draft_file)
        if ids is not None:
            model.reduce_head(ids)   # the engine's own cut (load.reduced_head_ids uses it too)
        engine = Engine(CPUBackend(champion, ModelDrafter(model)), tok)
        drafted = accepted = 0
        identical = 0
        for p, ref in zip(prompts, reference):
            out = engine.generate(p, Options(max_tokens=args.max_tokens, k="fixed:4"))
            identical += out.tokens == ref
            drafted += out.stats["drafted"]
            accepted += out.stats["accepted"]
        inside = np.zeros(vocab, bool)
        inside[order[:n] if n else order] = True
        row = {"n": n or vocab,
               "training_token_coverage": float(counts[inside].sum() / counts.sum()),
               "workload_greedy_coverage": float(inside[greedy].mean()),
               "acceptance_fixed4": accepted / max(drafted, 1),
               "identical": f"{identical}/{len(prompts)}",
               "draft_step_s": None}
        champion_s, row["draft_step_s"] = numpy_step_s(champion, model, args.reps)
        champion_steps.append(champion_s)
        rows.append(row)
        print(json.dumps(row), flush=True)
    full = rows[-1]
    for r in rows:
        r["draft_step_vs_full"] = r["draft_step_s"] / full["draft_step_s"]
    champion_step = sorted(champion_steps)[len(champion_steps) // 2]
    result = {"draft": os.path.basename(draft_path), "prompts": len(prompts),
              "max_tokens": args.max_tokens, "champion_step_s": champion_step,
              "rows": rows}
    for r in rows:
        r["draft_step_vs_champion_pass"] = r["draft_step_s"] / champion_step
    if args.json:
        provenance.write(args.json, provenance.stamp(result, workload=args.workload))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
