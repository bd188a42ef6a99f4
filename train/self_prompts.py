"""User messages written by the champion itself: free-form prompts for the draft's training text.

    python train/self_prompts.py --champion CHAMPION.gguf [--n 10000] [--seed 0]
        [--exclude EARLIER.jsonl ...] [--first-id 0] [--out FILE]

The templated seed set (seed_prompts.py) gives templated answers: a draft trained on them agrees
with the champion far more on held-out seed prompts than on the workload. Here the champion is
given its chat template up to the start of a user turn (the default system message, then
`<|im_start|>user\\n`) and samples the user's message; in 33 of the 39 draws of OPENERS (85%)
the message is started with a common opening word, so that requests, questions and tasks all
appear. A message is kept when the champion closed it (`<|im_end|>`) within --max-new tokens, it
has 3 words or more, it is not a duplicate (case and spacing folded) and it shares no word 8-gram
with the workload (workloads/public.jsonl, read only for that check). The kept set is written to
train/data/self_prompts.jsonl.gz ({"id", "kind": "self", "messages"}) and committed: like the seed
set it is frozen before the champion answers it, and models/MANIFEST.json records its sha256.
A later set is drawn with another --seed, --exclude names the sets already committed (their
messages count as duplicates) and --first-id continues their ids, so that the sets can be answered
together.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llama_torch import from_gguf  # noqa: E402
from seed_prompts import (  # noqa: E402
    WORKLOAD, eight_grams, holds_short, read_jsonl, short_messages, write_jsonl)

from pyspec.text.tokenizer import Tokenizer  # noqa: E402

OUT = Path(__file__).resolve().parent / "data" / "self_prompts.jsonl.gz"
# Openings of the user messages people write to an assistant (questions, requests, tasks);
# "" lets the champion choose the first word itself.
OPENERS = ("", "", "", "", "", "", "Can you", "Could you", "What", "How", "Why", "Write", "Explain",
           "Please", "I", "My", "Give me", "Help me", "Summarize", "Rewrite", "List", "Tell me",
           "Is it", "Which", "Translate", "Create", "Describe", "Compare", "Suggest", "Make",
           "When", "Where", "Who", "Do you", "Should I", "Convert", "Extract", "Plan", "Find")


def user_turn_prefix(tok: Tokenizer) -> str:
    """The chat template's text up to where a user message begins."""
    marker = "\u2063"  # a character the template never writes
    text = tok.render_chat([{"role": "user", "content": marker}], add_generation_prompt=False)
    return text.split(marker)[0]


def fold(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--champion", required=True)
    ap.add_argument("--n", type=int, default=10_000, help="prompts to keep")
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--workload", type=Path, default=WORKLOAD, help="for the 8-gram check only")
    ap.add_argument("--exclude", action="append", type=Path, default=[],
                    help="an earlier prompt set (repeatable): its messages count as duplicates")
    ap.add_argument("--first-id", type=int, default=0, help="the first id's number (self-N)")
    args = ap.parse_args(argv)
    t0 = time.time()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model, md = from_gguf(args.champion, device=dev)
    model = model.to(torch.bfloat16 if dev == "cuda" else torch.float32).eval()
    tok = Tokenizer.from_metadata(md)
    prefix = user_turn_prefix(tok)
    end = tok.encode("<|im_end|>", special=True, add_bos=False)
    held = set()
    for row in read_jsonl(args.workload):
        for m in row["messages"]:
            held |= eight_grams(m["content"])
    short = short_messages(args.workload)   # 4-7 word messages hold no 8-gram: checked whole
    rng = np.random.default_rng(args.seed)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    kept = []
    seen = {fold(m["content"]) for path in args.exclude for row in read_jsonl(path)
            for m in row["messages"]}
    counts = {"sampled": 0, "unclosed": 0, "short": 0, "control_text": 0, "duplicate": 0,
              "workload_8gram": 0, "workload_message": 0}
    while len(kept) < args.n:
        openers = [OPENERS[i] for i in rng.integers(0, len(OPENERS), args.batch)]
        temps = rng.uniform(0.7, 1.0, args.batch).tolist()
        starts = [tok.encode(prefix + o, special=True, add_bos=False) for o in openers]
        with torch.no_grad():
            outs = model.generate(starts, args.max_new, temps, set(end), gen)
        for opener, ids in zip(openers, outs):
            counts["sampled"] += 1
            if not ids or ids[-1] not in end:
                counts["unclosed"] += 1
                continue
            text = (opener + tok.decode(ids[:-1], special=True)).strip()
            if "<|" in text:
                counts["control_text"] += 1
            elif len(text.split()) < 3:
                counts["short"] += 1
            elif fold(text) in seen:
                counts["duplicate"] += 1
            elif eight_grams(text) & held:
                counts["workload_8gram"] += 1
            elif holds_short(text, short):
                counts["workload_message"] += 1
            else:
                seen.add(fold(text))
                kept.append(text)
        print(json.dumps({"kept": len(kept), **counts, "elapsed_s": round(time.time() - t0, 1)}),
              flush=True)
    rows = [{"id": f"self-{args.first_id + i}", "kind": "self",
             "messages": [{"role": "user", "content": text}]}
            for i, text in enumerate(kept[:args.n])]
    out = Path(args.out)
    digest = write_jsonl(out, rows)
    print(json.dumps({"file": str(out), "prompts": len(rows), "sha256": digest,
                      "workload_8grams": len(held), "filtered": counts,
                      "excluded_sets": [path.name for path in args.exclude],
                      "seconds": round(time.time() - t0, 1)}, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
