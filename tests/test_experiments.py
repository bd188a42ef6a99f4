"""experiments/run.py: an experiment runs its registered command with {out} filled in, its file
names the experiment and the command as run, and lands in bench/results/ under its name."""

from __future__ import annotations

import json

from experiments import Experiment, run
from pyspec.apps import provenance
from experiments import normal


def test_an_experiment_runs_its_command_and_its_file_says_so(tiny, tmp_path, monkeypatch):
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "a", "stratum": "chat", "max_tokens": 4, "messages":
                                    [{"role": "user", "content": "the cat sat on the mat"}]}))
    command = ("-m", "pyspec", "bench", "--workload", str(workload), "--champion",
               tiny.champion_path, "--drafts", "ngram", "--out", "{out}")
    monkeypatch.setitem(run.EXPERIMENTS, "tiny-bench", Experiment(
        "a tiny bench", (command,), {"bench-cpu.json": "tiny-bench.json"}))
    monkeypatch.setattr(run, "RESULTS", tmp_path)
    # in place, as from a checkout with uncommitted changes (a clean one runs from git archive;
    # the command itself records the tree as it finds it)
    monkeypatch.setattr(provenance, "git_commit", lambda: {"commit": "f" * 40, "dirty": True})
    assert run.main(["tiny-bench", "--allow-dirty"]) == 0
    origin = json.loads((tmp_path / "tiny-bench.json").read_text())["provenance"]
    assert origin["experiment"] == "tiny-bench"
    assert normal(origin["command"]) == normal(command)
    assert run.main(["no-such"]) == 2
