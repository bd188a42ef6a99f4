"""Count the token ids of the champion's training answers: the ranking a reduced draft head takes
its rows from (pyspec/drafters/model_draft.py, `head_ids`).

    python train/vocab_counts.py --data GEN_DIR --out vocab-counts.json

Reads train/generate.py's shards (answer ids only, prompts not counted), leaves out the held-out
prompts. answers (split.held_out), and writes the ids that occur, most frequent first (ties
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

from split import held_out  # noqa: E402


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
    ap.add_argument("--head-rows", type=int, default=0,
                    help="also write --vocab-json: the sidecar the numpy engine reads beside a "
                         "draft (schema pyspec.draft-vocab/1), keeping this many ids")
    ap.add_argument("--vocab-json", type=Path, default=None,
                    help="where to write that sidecar (e.g. models/DRAFT.vocab.json)")
    ap.add_argument("--champion-sha256", default="",
                    help="the champion that answered, recorded in the sidecar's source")
    a = ap.parse_args()
    if bool(a.head_rows) != bool(a.vocab_json):
        ap.error("--head-rows and --vocab-json go together")
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
    if a.vocab_json:
        if not 0 < a.head_rows <= len(ids):
            raise SystemExit(f"--head-rows {a.head_rows}: the answers hold {len(ids)} distinct ids")
        source = {k: report[k] for k in ("shards", "shards_sha256", "answers", "answer_tokens")}
        if a.champion_sha256:
            source["champion_sha256"] = a.champion_sha256
        prompts = a.data / "prompts.json"     # generate.py's record of the run
        if prompts.exists():
            source["generation"] = json.loads(prompts.read_text(encoding="utf-8"))
        source["held_out"] = "left out (train/split.py held_out)"
        a.vocab_json.write_text(json.dumps({
            "schema": "pyspec.draft-vocab/1", "head_rows": a.head_rows,
            "about": "The numpy engine runs the draft beside this file with its head cut to the "
                     "first head_rows ids below (pyspec/load.py reduced_head_ids): the ids of "
                     "the champion's answers to the frozen training prompts, most frequent "
                     "first, ties by id. Counted by train/vocab_counts.py, never over the "
                     "workload.",
            "source": source, "ids": report["ids"], "counts": report["counts"]}))
    print(json.dumps({k: v for k, v in report.items() if k not in ("ids", "counts")}
                     | {"distinct": len(ids)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
