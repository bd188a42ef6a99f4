"""Tokens per champion pass for trees against chains on the CPU or the GPU, the champion
with n-gram and with the trained draft, greedy, on a few public prompts (issue 48).

    .venv/bin/python -m experiments.tree_vs_chain --per-stratum 1 \
        --strata chat,rewrite,summary,repetitive --max-tokens 48 --out bench/results/tree-cpu.json
    nice .venv/bin/python -m experiments.tree_vs_chain --engine gpu --strata chat,code \
        --max-tokens 24 --configs gpu --out bench/results/tree-lavapipe.json

Each (drafter, shape) runs every prompt; a shape is a chain `fixed:K` (K + 1 verify rows) or a
tree W1,W2,... at k = its depth (1 + its nodes rows at most). Reported per configuration: tokens
per pass (generated / champion passes), the verify rows it asked for, and wall tokens per second
on this machine (a shared 2-core VM: wall time is noisy; tokens per pass is not), and the
acceptance by depth (of the cycles that reached depth i, the share that accepted a draft there).
The outputs must equal the champion-only greedy text (asserted): trees are exact. On the GPU a
pass holds at most 16 rows: `--configs gpu` compares a tree with the chain of as many rows. A
benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from pyspec import champion_path, trained_draft_path
from pyspec.apps import provenance, workload
from pyspec.apps.provenance import tokens_sha256
from pyspec.cpu.fastcpu import FastModel
from pyspec.cpu.model import Model
from pyspec.engine import Engine, Options
from pyspec.formats.gguf import GGUFFile
from pyspec.load import backend, load_draft_checked
from pyspec.text.tokenizer import Tokenizer

WORKLOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workloads", "public.jsonl")
# (label, k policy, tree shape, verify rows asked for)
CONFIGS = [("chain k=3", "fixed:3", None, 4), ("chain k=10", "fixed:10", None, 11),
           ("tree 2,2,1", "fixed:3", "2,2,1", 11), ("tree 3,1,1", "fixed:3", "3,1,1", 10),
           ("tree auto", "fixed:4", "auto", 17)]
# a pass of at most 16 rows (the GPU): each tree against the chain of as many verify rows
CONFIGS_GPU = [("chain k=3", "fixed:3", None, 4), ("chain k=10", "fixed:10", None, 11),
               ("tree 2,2,1", "fixed:3", "2,2,1", 11), ("chain k=15", "fixed:15", None, 16),
               ("tree auto", "fixed:4", "auto", 16)]
# under the break-even guard (what users get by default): the chain and `--tree auto`
GUARDED = [("guard chain", "heuristic", None, None), ("guard tree auto", "heuristic", "auto", None)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default=WORKLOAD)
    p.add_argument("--champion", default=None, help="the champion GGUF (default: the installed one)")
    p.add_argument("--per-stratum", type=int, default=1)
    p.add_argument("--strata", default="chat,rewrite,summary,repetitive")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--drafts", default="ngram,trained")
    p.add_argument("--engine", choices=["numpy", "fast", "gpu"], default="fast",
                   help="the CPU engine, or the native GPU adapter (tokens per pass are the "
                        "same; wall time is not)")
    p.add_argument("--configs", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--out", default="")
    args = p.parse_args()
    items = [it for it in workload.first_per_stratum(workload.read_workload(args.workload),
                                                     args.per_stratum)
             if args.strata == "all" or it["stratum"] in args.strata.split(",")]
    champion_file = args.champion or champion_path()
    f = GGUFFile.open(champion_file)
    tok = Tokenizer.from_metadata(f.metadata)
    champion = _champion(f, args.engine)
    spec = {"ngram": "ngram", "trained": trained_draft_path()}
    prompts = [tok.encode_chat(it["messages"]) for it in items]
    alone_engine = Engine(backend(champion, "none"), tok)
    alone_engine.generate(prompts[0], Options(max_tokens=8, k="fixed:0"))     # warm-up
    t0 = time.perf_counter()
    alone = [alone_engine.generate(ids, Options(max_tokens=args.max_tokens, k="fixed:0")).tokens
             for ids in prompts]
    alone_wall = time.perf_counter() - t0
    result = {"command": " ".join(sys.argv), "max_tokens": args.max_tokens,
              "engine": args.engine,
              "adapter": getattr(getattr(champion, "dev", None), "name", args.engine),
              "prompts": [it["id"] for it in items],
              "champion_only": {"tokens": sum(map(len, alone)),
                                "tokens_per_s": round(sum(map(len, alone)) / alone_wall, 2),
                                "tokens_sha256": [tokens_sha256(t) for t in alone]},
              "rows": []}
    configs = CONFIGS_GPU if args.configs == "gpu" else CONFIGS
    for d in args.drafts.split(","):
        eng = Engine(backend(champion, spec[d], load_draft=load_draft_checked(champion)), tok)
        eng.generate(prompts[0], Options(max_tokens=8, k="fixed:2"))            # warm-up
        for label, k, tree, rows in configs + GUARDED:
            row = _run(eng, prompts, alone, args.max_tokens, k, tree)
            row.update({"draft": d, "shape": label, "verify_rows": rows,
                        "speedup": round(row["tokens_per_s"]
                                         / result["champion_only"]["tokens_per_s"], 3)})
            result["rows"].append(row)
            if args.out:          # after every row: a run cut short still leaves its rows
                _write(args, result, champion_file, spec)
            print(json.dumps({k: v for k, v in row.items() if k != "tokens_sha256"}),
                  file=sys.stderr, flush=True)
    return 0


def _write(args, result: dict, champion_file: str, spec: dict) -> None:
    provenance.write(args.out, provenance.stamp(
        result, champion=champion_file, workload=args.workload,
        drafts={"ngram": None, "trained": spec["trained"]},
        backend="wgpu" if args.engine == "gpu" else args.engine))
    plot(result, os.path.splitext(args.out)[0] + ".png")


def plot(result: dict, png: str) -> None:
    """Speedup over champion-only per shape, a panel per drafter, each bar labelled with its
    tokens per pass."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drafts = list(dict.fromkeys(r["draft"] for r in result["rows"]))
    fig, axes = plt.subplots(1, len(drafts), figsize=(5.5 * len(drafts), 4), squeeze=False)
    for ax, d in zip(axes[0], drafts):
        rows = [r for r in result["rows"] if r["draft"] == d]
        xs = range(len(rows))
        ax.bar(xs, [r["speedup"] for r in rows],
               color=["tab:green" if r["tree"] else "tab:blue" for r in rows])
        for x, r in zip(xs, rows):
            ax.annotate(f"{r['tokens_per_pass']:.2f}/pass", (x, r["speedup"]), ha="center",
                        va="bottom", fontsize=7)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(list(xs), [r["shape"] for r in rows], rotation=30, ha="right",
                      fontsize=8)
        ax.set_title(f"{d} (blue: chains, green: trees)", fontsize=9)
        ax.set_ylabel("speedup over champion-only")
    fig.suptitle(f"Trees against chains on {result['adapter']}, {len(result['prompts'])} "
                 f"prompts, {result['max_tokens']} tokens", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def _run(eng, prompts, alone, max_tokens: int, k: str, tree: str | None) -> dict:
    """One configuration over every prompt: tokens per pass, wall tokens/s, acceptance by depth,
    each output's token hash; asserts each output equals champion-only's (trees are exact)."""
    gen = passes = 0
    reached, accepted = [0] * 16, [0] * 16
    hashes = []
    t0 = time.perf_counter()
    for ids, want in zip(prompts, alone):
        r = eng.generate(ids, Options(max_tokens=max_tokens, k=k, tree=tree))
        assert r.tokens == want, f"{k} {tree}: not exact"
        hashes.append(tokens_sha256(r.tokens))
        gen += len(r.tokens)
        passes += r.stats["champion_passes"]
        for i, (d_i, a_i) in enumerate(zip(r.stats["drafted_by_position"],
                                           r.stats["accepted_by_position"])):
            reached[i] += d_i
            accepted[i] += a_i
    wall = time.perf_counter() - t0
    return {"k": k, "tree": tree, "tokens": gen, "passes": passes,
            "tokens_per_pass": round(gen / passes, 3), "tokens_per_s": round(gen / wall, 2),
            "acceptance_by_depth": [round(a / n, 3) for a, n in zip(accepted, reached) if n],
            "tokens_sha256": hashes}


def _champion(f, engine: str):
    """The champion on the engine asked for: numpy, the fast CPU engine or the native GPU."""
    if engine == "gpu":
        from pyspec.gpu import load_model, open_device
        return load_model(open_device(), f)
    return FastModel(f) if engine == "fast" else Model(f)


if __name__ == "__main__":
    sys.exit(main())
