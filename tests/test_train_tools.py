"""The numpy-only parts of train/ (PyTorch is a training-only extra, not installed here): the
record that keeps a generation folder to one run, the overlap check of the frozen prompt files
against the workload, the shipped draft's lineage in models/MANIFEST.json, and the reduced-head
sidecar vocab_counts.py writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "train"))

import seed_prompts  # noqa: E402
import split  # noqa: E402

from pyspec.load import parse_reduced_head  # noqa: E402

WORKLOAD = ROOT / "workloads" / "public.jsonl"
DATA = ROOT / "train" / "data"


def test_a_generation_folder_takes_only_the_run_that_made_it():
    files = split.prompt_files([DATA / "seed_prompts.jsonl.gz", DATA / "self_prompts.jsonl.gz"])
    # named and hashed as the uncompressed files the shipped draft's runs recorded
    manifest = json.loads((ROOT / "models" / "MANIFEST.json").read_text())["drafts"][0]
    assert [(f["file"], f["sha256"]) for f in files] == [
        ("seed_prompts.jsonl", manifest["seed_prompts"]["sha256"]),
        ("self_prompts.jsonl", manifest["self_prompts"][0]["sha256"])]
    settings = {"seed": 1, "max_new": 160, "max_batch": 1536, "batch_tokens": 400000, "limit": 0}
    run = {"files": files, "settings": settings}
    assert split.run_mismatch(run, run) is None
    assert split.run_mismatch({"files": files}, run) is None     # recorded before settings were
    assert "another order" in split.run_mismatch({"files": files[::-1], "settings": settings}, run)
    other = split.run_mismatch({"files": files, "settings": {**settings, "seed": 0}}, run)
    assert other == "its settings differ: seed 0 -> 1"
    # the order sets the shuffle: the same files in another order give other shards
    a = split.read_prompts([DATA / "self_prompts.jsonl.gz", DATA / "self_prompts_2.jsonl.gz"], 1)
    b = split.read_prompts([DATA / "self_prompts_2.jsonl.gz", DATA / "self_prompts.jsonl.gz"], 1)
    assert [r["id"] for r in a[:512]] != [r["id"] for r in b[:512]]


def test_the_frozen_prompts_overlap_the_workload_as_the_manifest_says():
    """Word 8-grams, and the workload's 4-7 word messages held whole (too short for an 8-gram):
    the figures models/MANIFEST.json records, recomputed. A change to a frozen file, to the
    workload or to the check shows here."""
    entry = json.loads((ROOT / "models" / "MANIFEST.json").read_text())["drafts"][0]
    want = {"seed_prompts.jsonl.gz": 0, "self_prompts.jsonl.gz": 3, "self_prompts_2.jsonl.gz": 3}
    assert seed_prompts.short_messages(WORKLOAD) == {
        ("what", "is", "the", "capital"),
        ("tell", "me", "something", "interesting", "about", "octopuses")}
    for name, short in want.items():
        got = seed_prompts.overlap(seed_prompts.read_jsonl(DATA / name), WORKLOAD)
        assert got["prompts_with_shared_8gram"] == 0, name
        assert got["prompts_holding_a_short_message"] == short, (name, got["examples"])
    assert entry["seed_prompts"]["overlap_short_workload_messages"].startswith("0 of 6,000")
    assert [s["overlap_short_workload_messages"][:2] for s in entry["self_prompts"]] == ["3 ", "3 "]
    assert seed_prompts.holds_short("So, what is the capital of Peru?", seed_prompts.short_messages(
        WORKLOAD))
    assert not seed_prompts.holds_short("What is the capitalist view?",
                                        seed_prompts.short_messages(WORKLOAD))


def test_the_shipped_draft_is_the_last_stage_of_its_recorded_lineage():
    entry = json.loads((ROOT / "models" / "MANIFEST.json").read_text())["drafts"][0]
    lineage = entry["lineage"]
    assert lineage["prompt_files_in_order"] == list(split.SHIPPED_ORDER)
    before = None
    for stage in lineage["stages"]:
        report = json.loads((ROOT / stage["report"]).read_text())
        assert report["gguf_sha256"] == stage["gguf_sha256"]
        assert report["data_sha256"] == stage["data_sha256"]
        assert (report.get("init") or {}).get("sha256") == stage["init"] == before
        assert [f["file"] for f in report["prompt_files"]] == list(split.SHIPPED_ORDER)
        before = stage["gguf_sha256"]
    assert before == entry["sha256"]


def test_vocab_counts_writes_a_sidecar_the_engine_reads(tmp_path):
    """train/vocab_counts.py runs without PyTorch, leaves out held-out prompts' answers, and
    with --vocab-json writes a reduced-head sidecar pyspec.load accepts."""
    held = next(f"self-{i}" for i in range(1000) if split.held_out(f"self-{i}"))
    kept = next(f"self-{i}" for i in range(1000) if not split.held_out(f"self-{i}"))
    (tmp_path / "gen").mkdir()
    np.savez(tmp_path / "gen" / "gen-000.npz",
             prompt_ids=np.array([1, 2, 3, 4], np.uint16), prompt_len=np.array([2, 2], np.int32),
             answer_ids=np.array([5, 6, 5, 7, 9], np.uint16),
             answer_len=np.array([3, 2], np.int32), temperature=np.zeros(2, np.float32),
             prompt_index=np.arange(2, dtype=np.int32), prompt_id=np.array([kept, held]))
    out = subprocess.run([sys.executable, str(ROOT / "train" / "vocab_counts.py"),
                          "--data", str(tmp_path / "gen"), "--out", str(tmp_path / "c.json"),
                          "--vocab", "16", "--head-rows", "2",
                          "--vocab-json", str(tmp_path / "d.vocab.json")],
                         capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    counts = json.loads((tmp_path / "c.json").read_text())
    assert counts["ids"] == [5, 6] and counts["counts"] == [2, 1]    # 7 and 9: held out
    assert parse_reduced_head((tmp_path / "d.vocab.json").read_text(), 16, "d") == [5, 6]
