"""What every training script agrees on, without PyTorch: the frozen prompt files, their order
and shuffle, the held-out split, and the record of a generation run (generate.py's prompts.json).

numpy and the standard library only, so that the numpy-only steps (vocab_counts.py) and checks
run where PyTorch is not installed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from seed_prompts import data_bytes, read_jsonl

DATA = Path(__file__).resolve().parent / "data"
SEEDS = DATA / "seed_prompts.jsonl.gz"
# The order the shipped draft's chain gave the files to generate.py (every report's
# `prompt_files`): the shuffle below depends on it, so device.sh names the files in this order
# rather than by a shell glob, whose order follows the locale.
SHIPPED_ORDER = ("seed_prompts.jsonl", "self_prompts_2.jsonl", "self_prompts.jsonl")
SAMPLES = (0.0, "T", "T")         # per prompt: one greedy answer, two sampled at T ~ U[0.7, 1.0]
SHARD_PROMPTS = 512               # prompts per shard (each answered len(SAMPLES) times)


def held_out(prompt_id: str) -> bool:
    """About 5% of the prompts of every file (13 in 256), chosen by a hash of the id, are kept
    for measuring acceptance. Split by prompt, so a prompt's three answers stay together. The
    templated seed set has near-siblings across the split (a held-out prompt whose template and
    most words a training prompt shares), so its held-out figure reads high; the self-written
    prompts' figure is the one to compare with the workload."""
    return hashlib.sha256(prompt_id.encode()).digest()[0] < 13


def read_prompts(paths: list[Path], seed: int) -> list[dict]:
    """The prompt files' rows, in the order given; more than one file is shuffled together by
    `seed` (a fixed permutation of the concatenation: the same files in another order give other
    shards)."""
    rows = [row for path in paths for row in read_jsonl(path)]
    if len(paths) > 1:
        rows = [rows[i] for i in np.random.default_rng(seed).permutation(len(rows))]
    return rows


def prompt_files(paths: list[Path]) -> list[dict]:
    """Each file's name, sha256 and prompt count, in the order given: of the uncompressed bytes,
    under the name without .gz, as the runs before the sets were gzipped recorded them."""
    return [{"file": path.name.removesuffix(".gz"),
             "sha256": hashlib.sha256(data_bytes(path)).hexdigest(),
             "prompts": len(read_jsonl(path))} for path in paths]


def run_mismatch(recorded: dict, wanted: dict) -> str | None:
    """Why a generation folder's prompts.json (`recorded`) does not describe the run `wanted`
    would make, or None. Shards are skipped by name when resuming, so a folder made with other
    files, another order, seed or batching must not be added to. A record without `settings`
    (written before they were kept) is judged on its files alone."""
    if [f["sha256"] for f in recorded.get("files", [])] != [f["sha256"] for f in wanted["files"]]:
        names = [f["file"] for f in recorded.get("files", [])]
        return (f"its prompt files are {names}, this run's {[f['file'] for f in wanted['files']]} "
                "(same names in another order, or other bytes, give other shards)")
    settings = recorded.get("settings")
    if settings is None:
        return None
    changed = [f"{key} {settings.get(key)!r} -> {value!r}"
               for key, value in wanted["settings"].items() if settings.get(key) != value]
    return f"its settings differ: {', '.join(changed)}" if changed else None
