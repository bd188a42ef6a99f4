"""Make the draft's training text: the champion answers the frozen seed prompts.

    python train/generate.py --champion CHAMPION.gguf --out DIR [--max-new 160] [--minutes 6]

Each prompt of the frozen prompt files (--prompts, repeatable; default the templated seed set
train/data/seed_prompts.jsonl) is answered once greedily and twice sampled, at a temperature drawn
from [0.7, 1.0] (the temperatures pyspec serves). With more than one file the prompts are shuffled
together (a fixed permutation), so that a run stopped for time has answered every file alike.
The answers are written as shards DIR/gen-NNN.npz (prompt ids, answer ids, temperature, prompt
index and id) of a few megabytes each, and DIR/prompts.json names the prompt files and their
sha256. Resumable: a shard already in DIR is skipped, and the run stops cleanly after
`--minutes` so that it fits a slice of GPU time; run it again to go on. Logits are not stored:
distillation runs the champion again on the same text (cheap on the GPU, and exact full
distributions instead of a top-k cut).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llama_torch import from_gguf  # noqa: E402
from seed_prompts import read_jsonl  # noqa: E402

from pyspec.tokenizer import Tokenizer  # noqa: E402

SEEDS = Path(__file__).resolve().parent / "data" / "seed_prompts.jsonl"
SAMPLES = (0.0, "T", "T")         # per prompt: one greedy answer, two sampled at T ~ U[0.7, 1.0]
SHARD_PROMPTS = 512               # prompts per shard (each answered len(SAMPLES) times)


def held_out(prompt_id: str) -> bool:
    """5% of the seed prompts, chosen by a hash of the id, are kept for measuring acceptance."""
    return hashlib.sha256(prompt_id.encode()).digest()[0] < 13


def read_prompts(paths: list[Path], seed: int) -> list[dict]:
    """The prompt files' rows; more than one file is shuffled together by `seed`."""
    rows = [row for path in paths for row in read_jsonl(path)]
    if len(paths) > 1:
        rows = [rows[i] for i in np.random.default_rng(seed).permutation(len(rows))]
    return rows


def prompt_files(paths: list[Path]) -> list[dict]:
    return [{"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
             "prompts": len(read_jsonl(path))} for path in paths]


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
    ap.add_argument("--prompts", action="append", type=Path,
                    help="a frozen prompt file (repeatable); default train/data/seed_prompts.jsonl")
    args = ap.parse_args(argv)
    paths = args.prompts or [SEEDS]
    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model, md = from_gguf(args.champion, device=dev)
    model = model.to(torch.bfloat16 if dev == "cuda" else torch.float32).eval()
    tok = Tokenizer.from_metadata(md)
    rows = read_prompts(paths, args.seed)
    (out / "prompts.json").write_text(json.dumps({"files": prompt_files(paths)}, indent=1))
    if args.limit:
        rows = rows[:args.limit]
    work = jobs(tok, rows, args.seed)
    stop = set(tok.eog_ids)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    per_shard = SHARD_PROMPTS * len(SAMPLES)
    n_shards = (len(work) + per_shard - 1) // per_shard
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
        np.savez(path, prompt_ids=p_ids, prompt_len=p_len, answer_ids=a_ids, answer_len=a_len,
                 temperature=np.asarray([j[2] for j in chunk], np.float32),
                 prompt_index=np.asarray([j[0] for j in chunk], np.int32),
                 prompt_id=np.asarray([rows[j[0]]["id"] for j in chunk]))
        print(json.dumps({"shard": s, "of": n_shards, "answers": len(chunk),
                          "answer_tokens": int(a_len.sum()), "elapsed_s": round(time.time() - t0, 1)}),
              flush=True)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
