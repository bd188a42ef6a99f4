"""Tool calls (issue 58): tokens per champion pass and speedup of forced drafts (+ n-gram) against
champion-only under the same call grammar, on the prompts of bench/tool_prompts.jsonl.

    .venv/bin/python -m experiments tools-cpu          # the registered run (experiments/)
    .venv/bin/python -m experiments.bench_tools --out OUT.json \\
        [--backend cpu|numpy] [--champion PATH] [--template FILE] [--runs 2] [--only ID,ID] \\
        [--allow-dirty]

The champion (SmolLM2-135M-Instruct by default) has a ChatML template that takes no tools, so it
runs here under a template that does: Qwen 2.5's (llama.cpp's copy, .cache/llama.cpp/templates;
ChatML with tools, its <tool_call> written as text in this vocabulary). The model's weights and
file are unchanged; the result names the template by its sha256. The model was not trained to
call tools: under `required` and a named choice the grammar makes every call valid, and what is
measured is how many tokens the grammar forces and what drafting them (and n-gram proposals
around them) saves. Per prompt, side by side: champion-only under the grammar (k = 0, no forced
drafts), forced drafts alone ("none"), forced drafts around n-gram ("ngram"); greedy, so every
output must equal champion-only's token for token (recorded, with the token hashes of both
sides per run: `tokens_sha256` and champion-only's `baseline_tokens_sha256`). Medians with
[min, max] over runs. Written through pyspec/apps/provenance.py's writer after every prompt (the
prompt file is the workload); "complete" says whether every prompt ran. Timing goals live here,
never in tests.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from pathlib import Path

from pyspec import champion_path
from pyspec.apps import provenance
from pyspec.formats.gguf import GGUFFile
from pyspec.text.tokenizer import Tokenizer
from pyspec.engine import Engine, Options
from pyspec.load import backend, load_champion
from pyspec.text import toolcalls

from .bench_json import forced_config, summary

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "bench" / "tool_prompts.jsonl"
TEMPLATE = ROOT / ".cache" / "llama.cpp" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
CONFIGS = [("champion-only", "none", "fixed:0"), ("forced", "none", "heuristic"),
           ("forced+ngram", "ngram", "heuristic")]


def run_once(engine: Engine, ids: list[int], item: dict, k: str) -> dict:
    r = engine.generate(ids, Options(max_tokens=item["max_tokens"], k=k, tools=item["tools"],
                                     tool_choice=item["tool_choice"],
                                     parallel_tool_calls=item["parallel_tool_calls"]))
    st = r.stats
    return {"tokens": r.tokens, "finish_reason": r.finish_reason, "calls": r.tool_calls,
            "generated": st["generated_tokens"], "passes": st["champion_passes"],
            "forced": st["forced_tokens"], "tokens_per_s": st["tokens_per_s"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", choices=["cpu", "numpy"], default="cpu")
    ap.add_argument("--champion", default=None)
    ap.add_argument("--template", default=str(TEMPLATE))
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--only", default=None, help="comma-separated prompt ids")
    provenance.add_option(ap)
    args = ap.parse_args(argv)
    provenance.check_tree(args.allow_dirty)   # refused before the run, not after it
    champion, _ = load_champion(args.champion, args.backend, None)
    template = Path(args.template).read_text()
    # The weights as they are, the tokenizer with a template that takes tools.
    metadata = GGUFFile.open(args.champion or champion_path()).metadata
    tok = Tokenizer.from_metadata({**metadata, "tokenizer.chat_template": template})
    fmt = toolcalls.detect(tok)
    only = set(args.only.split(",")) if args.only else None
    items = [it for it in map(json.loads, PROMPTS.read_text().splitlines())
             if only is None or it["id"] in only]
    engines = {d: Engine(backend(champion, d), tok) for _, d, _ in CONFIGS}
    result = {"backend": args.backend, "adapter": engines["none"].adapter,
              "champion": args.champion or "smollm2", "runs": args.runs,
              "template": {"file": Path(args.template).name, "format": fmt.name,
                           "sha256": hashlib.sha256(template.encode()).hexdigest()},
              "prompts": {}}
    provenance.stamp(result, champion=args.champion, workload=str(PROMPTS), backend=args.backend,
                     drafts={"none": None, "ngram": None}, allow_dirty=args.allow_dirty)
    for item in items:
        ids = tok.encode_chat(item["messages"], tools=item["tools"])
        engines["none"].generate(ids, Options(max_tokens=2, tools=item["tools"]))   # warm
        rows = {name: [run_once(engines[d], ids, item, k) for _ in range(args.runs)]
                for name, d, k in CONFIGS}
        ref = rows["champion-only"][0]
        out = {"tool_choice": item["tool_choice"], "prompt_tokens": len(ids),
               "parallel_tool_calls": item["parallel_tool_calls"],
               "finish_reason": ref["finish_reason"],
               "calls": [c["function"]["name"] for c in ref["calls"] or []], "configs": {}}
        for name, runs in rows.items():
            out["configs"][name] = {
                **forced_config(runs, rows["champion-only"]),
                "equal_to_champion_only": all(r["tokens"] == ref["tokens"] for r in runs),
                "baseline_tokens_sha256": [provenance.tokens_sha256(c["tokens"])
                                           for c in rows["champion-only"]]}
        result["prompts"][item["id"]] = out
        print(item["id"], {n: (round(c["tokens_per_pass"], 2), round(c["speedup"]["median"], 2),
                               c["equal_to_champion_only"]) for n, c in out["configs"].items()},
              flush=True)
        # Written after every prompt, so that a run cut short keeps what it measured.
        provenance.write(args.out, {**result, "complete": False})
    result["overall"] = overall(result["prompts"])
    provenance.write(args.out, {**result, "complete": True})
    print(json.dumps(result["overall"], indent=1))
    return 0


def overall(prompts: dict) -> dict:
    """Per config over the prompts: tokens per pass (all tokens over all passes), the median
    speedup, and how many outputs equal champion-only's."""
    out = {}
    for name in (c[0] for c in CONFIGS):
        rows = [p["configs"][name] for p in prompts.values()]
        out[name] = {"tokens_per_pass": sum(r["generated"] for r in rows)
                     / max(sum(r["passes"] for r in rows), 1),
                     "forced_share": sum(r["forced"] for r in rows)
                     / max(sum(r["generated"] for r in rows), 1),
                     "median_speedup": statistics.median(r["speedup"]["median"] for r in rows),
                     "equal_to_champion_only": sum(r["equal_to_champion_only"] for r in rows),
                     "prompts": len(rows)}
    return out


if __name__ == "__main__":
    sys.exit(main())
