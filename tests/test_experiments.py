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


def test_every_dawn_side_the_script_runs_is_one_the_report_reads():
    """scripts/h200.sh's dawn step names its sides (DAWN_SIDES, and side_options' cases, the
    trees among them, which run only where named); experiments/dawn_report.py maps each file
    to a side, and webtools/gpu_tables.py shows those sides: the three must agree, or a run's
    file is silently left out of the report."""
    import re
    from pathlib import Path

    from experiments import dawn_report
    from webtools import gpu_tables

    script = (Path(__file__).resolve().parent.parent / "scripts" / "h200.sh").read_text()
    # side_options (the sides' one table), then the dawn step (its default sides)
    step = script[script.index("\nside_options() {"):script.index("\ndawn_mixed() {")]
    default = re.search(r"\$\{DAWN_SIDES:-([^}]+)\}", step)[1].split()
    cases = [c for alts in re.findall(r"^\s+([\w|-]+)\) echo", step, re.M)
             for c in alts.split("|")]
    known = {**dawn_report.SIDES, **dawn_report.NULL_SIDES}
    assert set(default) | set(cases) <= set(known), (default, cases)
    assert {"ngram-tree", "trained-tree"} <= set(cases) and not {"ngram-tree",
                                                                 "trained-tree"} & set(default)
    assert {key for key, _, _ in gpu_tables.DAWN_SIDES} <= set(dawn_report.SIDES.values())
    assert {key for key, _ in gpu_tables.NULL_SIDES} <= set(dawn_report.NULL_SIDES.values())
