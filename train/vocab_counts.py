"""Count the token ids of the champion's training answers: the ranking a reduced draft head takes
its rows from (pyspec/drafters/model_draft.py, `head_ids`).

    python train/vocab_counts.py --data GEN_DIR --out vocab-counts.json

Reads train/generate.py's shards (answer ids only, prompts not counted), leaves out the held-out
prompts' answers (generate.held_out), and writes the ids that occur, most frequent first (ties
by id), with their counts, the shards read and their sha256. Never reads the workload.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from generate import held_out  # noqa: E402


def count(shards: list[Path], vocab: int) -> tuple[np.ndarray, int]:
    counts = np.zeros(vocab, np.int64)
    answers = 0
    for path in shards:
        z = np.load(path)
        ends = np.cumsum(z["answer_len"])
        starts = ends - z["answer_len"]
        for a, b, pid in zip(starts, ends, z["prompt_id"]):
            if held_out(str(pid)):
                continue
            np.add.at(counts, z["answer_ids"][a:b], 1)
            answers += 1
    return counts, answers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--vocab", type=int, default=49152)
    a = ap.parse_args()
    shards = sorted(a.data.glob("gen-*.npz"))
    if not shards:
        raise SystemExit(f"no gen-*.npz shards in {a.data}")
    counts, answers = count(shards, a.vocab)
    ids = np.lexsort((np.arange(a.vocab), -counts))       # most frequent first, ties by id
    ids = ids[counts[ids] > 0]
    digest = hashlib.sha256()
    for path in shards:
        digest.update(path.read_bytes())
    report = {"shards": [p.name for p in shards], "shards_sha256": digest.hexdigest(),
              "answers": answers, "answer_tokens": int(counts.sum()), "vocab": a.vocab,
              "ids": ids.tolist(), "counts": counts[ids].tolist()}
    a.out.write_text(json.dumps(report))
    print(json.dumps({k: v for k, v in report.items() if k not in ("ids", "counts")}
                     | {"distinct": len(ids)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
