"""Make the draft's training text: the champion answers the frozen seed prompts.

    python train/generate.py --champion CHAMPION.gguf --out DIR [--max-new 160] [--minutes 6]
        [--prompts FILE ...] [--seed S] [--shards N]

Each prompt of the frozen prompt files (--prompts, repeatable; default the templated seed set
train/data/seed_prompts.jsonl.gz) is answered once greedily and twice sampled, at a temperature drawn
from [0.7, 1.0] (the temperatures pyspec serves). With more than one file the prompts are shuffled
together (a fixed permutation), so that a run stopped for time has answered every file alike.
The answers are written as shards DIR/gen-NNN.npz (prompt ids, answer ids, temperature, prompt
index and id) of a few megabytes each, and DIR/prompts.json names the prompt files (in order) and
their sha256, and the settings that shape a shard (seed, --max-new, --max-batch,
--batch-tokens, --limit: the batching changes which sampled answers come out). Resumable: a shard
already in DIR is skipped, and the run stops cleanly after `--minutes` so that it fits a slice of
GPU time; run it again to go on. A folder whose prompts.json records other files, another order
or other settings is refused (its shards would be skipped as if this run had made them). Each
shard is written under a temporary name and renamed, so a run killed mid-write leaves no shard
to keep. `--shards N` stops after shards 0..N-1, so a stage's data does not depend on how fast
the GPU was. Logits are not stored: distillation runs the champion again on the same text (cheap
on the GPU, and exact full distributions instead of a top-k cut). Two runs of the same settings
give the same prompts and temperatures; the sampled answers agree only statistically (bf16 and
batched sampling on a GPU are not bit-reproducible across machines).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llama_torch import from_gguf  # noqa: E402
from split import (  # noqa: E402,F401
    SAMPLES,
    SEEDS,
    SHARD_PROMPTS,
    prompt_files,
    read_prompts,
    run_mismatch,
)

from pyspec.text.tokenizer import Tokenizer  # noqa: E402


def jobs(tok: Tokenizer, rows: list[dict], seed: int) -> list[tuple[int, list[int], float]]:
    """(prompt index, prompt ids, temperature) for every answer to make, longest prompts last."""
    rng = np.random.default_rng(seed)
    out = []
    for i, row in enumerate(rows):
        ids = tok.encode_chat(row["messages"])
        for kind in SAMPLES:
            out.append((i, ids, 0.0 if kind == 0.0 else float(rng.uniform(0.7, 1.0))))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--champion", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-new", type=int, default=160)
    ap.add_argument("--batch-tokens", type=int, default=96_000, help="prompt+answer tokens per batch")
    ap.add_argument("--minutes", type=float, default=6.0)
    ap.add_argument("--max-batch", type=int, default=512, help="answers decoded together at most")
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts (smoke test)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shards", type=int, default=0,
                    help="stop after shards 0..N-1 (0: every shard)")
    ap.add_argument("--prompts", action="append", type=Path,
                    help="a frozen prompt file (repeatable, in order: the order sets the "
                         "shuffle); default train/data/seed_prompts.jsonl.gz")
    args = ap.parse_args(argv)
    paths = args.prompts or [SEEDS]
    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"files": prompt_files(paths),
              "settings": {"seed": args.seed, "max_new": args.max_new,
                           "max_batch": args.max_batch, "batch_tokens": args.batch_tokens,
                           "limit": args.limit}}
    if (out / "prompts.json").exists():
        why = run_mismatch(json.loads((out / "prompts.json").read_text()), record)
        if why:
            print(f"error: {out} holds shards of another run: {why}; give another --out",
                  file=sys.stderr)
            return 2
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model, md = from_gguf(args.champion, device=dev)
    model = model.to(torch.bfloat16 if dev == "cuda" else torch.float32).eval()
    tok = Tokenizer.from_metadata(md)
    rows = read_prompts(paths, args.seed)
    (out / "prompts.json").write_text(json.dumps(record, indent=1))
    if args.limit:
        rows = rows[:args.limit]
    work = jobs(tok, rows, args.seed)
    stop = set(tok.eog_ids)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    per_shard = SHARD_PROMPTS * len(SAMPLES)
    n_shards = (len(work) + per_shard - 1) // per_shard
    if args.shards:
        n_shards = min(n_shards, args.shards)
    for s in range(n_shards):
        path = out / f"gen-{s:03d}.npz"
        if path.exists():
            continue
        if time.time() - t0 > args.minutes * 60:
            print(f"stopping for time before shard {s}/{n_shards}; run again to go on", flush=True)
            return 0
        chunk = sorted(work[s * per_shard:(s + 1) * per_shard], key=lambda j: len(j[1]))
        gen.manual_seed(args.seed * 1000 + s)  # a shard's text does not depend on earlier runs
        answers, i = [], 0
        while i < len(chunk):
            n = max(1, args.batch_tokens // (len(chunk[i][1]) + args.max_new))
            n = min(n, args.max_batch)
            batch = chunk[i:i + n]
            # Why the longest prompt sets the batch: batches are sorted by length, so the last
            # prompt is the longest and the batch stays within --batch-tokens.
            answers += model.generate([j[1] for j in batch], args.max_new, [j[2] for j in batch],
                                      stop, gen)
            i += n
        flat = lambda seqs: (np.concatenate([np.asarray(x, np.uint16) for x in seqs]),  # noqa: E731
                             np.asarray([len(x) for x in seqs], np.int32))
        p_ids, p_len = flat([j[1] for j in chunk])
        a_ids, a_len = flat(answers)
        part = path.with_name(path.stem + ".part.npz")   # renamed once whole
        np.savez(part, prompt_ids=p_ids, prompt_len=p_len, answer_ids=a_ids, answer_len=a_len,
                 temperature=np.asarray([j[2] for j in chunk], np.float32),
                 prompt_index=np.asarray([j[0] for j in chunk], np.int32),
                 prompt_id=np.asarray([rows[j[0]]["id"] for j in chunk]))
        os.replace(part, path)
        print(json.dumps({"shard": s, "of": n_shards, "answers": len(chunk),
                          "answer_tokens": int(a_len.sum()), "elapsed_s": round(time.time() - t0, 1)}),
              flush=True)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
