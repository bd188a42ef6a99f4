"""Every file in bench/results/ can be recounted, or is named as legacy: its provenance present
and well-formed (pyspec/apps/provenance.problems), the commit it names an ancestor of the commit
that brought the file (so the code that ran is in the history), made by one of its experiment's
commands (experiments/); bench/results/README.md is made from the files; every measurement is a
module of experiments/ that an experiment runs, and scripts/ holds none.

Needs the repository's full history (CI's clean clone of main has it); a shallow clone fails here
rather than skipping.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from experiments import EXPERIMENTS, LEGACY, PLUMBING, SCRIPTS, experiment_of, normal, readme
from pyspec.apps import provenance

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
FILES = sorted(p.name for p in RESULTS.glob("*.json"))


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def brought_in(name: str) -> str:
    """The commit that last changed bench/results/NAME; HEAD for a file not committed yet."""
    path = f"bench/results/{name}"
    if git("status", "--porcelain", "--", path).stdout.strip():
        return git("rev-parse", "HEAD").stdout.strip()
    return git("log", "-1", "--format=%H", "--", path).stdout.strip()


def test_the_history_is_whole():
    assert git("rev-parse", "--is-shallow-repository").stdout.strip() == "false", \
        "a shallow clone: fetch the whole history (git fetch --unshallow) to check provenance"


@pytest.mark.parametrize("name", FILES)
def test_a_result_file_can_be_recounted_or_is_legacy(name):
    result = json.loads((RESULTS / name).read_text())
    bad = provenance.problems(result) if isinstance(result, dict) else ["not an object"]
    if name in LEGACY:
        assert bad, f"{name} is recountable now: take it off experiments.LEGACY"
        return
    assert not bad, f"{name}: {'; '.join(bad)} (or list it in experiments.LEGACY)"
    commit, made = result["provenance"]["commit"], brought_in(name)
    assert git("cat-file", "-e", commit + "^{commit}").returncode == 0, \
        f"{name} names commit {commit}, which this repository does not hold"
    assert git("merge-base", "--is-ancestor", commit, made).returncode == 0, \
        f"{name} names commit {commit}, not an ancestor of {made}, which brought the file"


@pytest.mark.parametrize("name", [n for n in FILES if n not in LEGACY])
def test_a_result_file_was_made_by_its_experiment(name):
    key = experiment_of(name)
    assert key, f"{name} belongs to no experiment: add it to experiments.EXPERIMENTS"
    ran = normal(json.loads((RESULTS / name).read_text())["provenance"]["command"])
    assert ran in [normal(c) for c in EXPERIMENTS[key].commands], \
        f"{name} was made by `{shlex.join(ran)}`, not by a command of experiment {key}"


def test_every_file_belongs_to_one_experiment_and_legacy_names_files():
    for name in FILES:
        owners = [k for k, e in EXPERIMENTS.items() if name in e.results()]
        assert len(owners) == 1, f"{name}: experiments {owners}"
    assert set(LEGACY) <= set(FILES), set(LEGACY) - set(FILES)


def test_scripts_holds_the_recorders_and_build_helpers_only():
    tracked = {Path(p).name for p in git("ls-files", "scripts").stdout.split()}
    assert tracked, "git ls-files found no scripts"
    assert tracked <= set(SCRIPTS), \
        f"scripts/{sorted(tracked - set(SCRIPTS))}: a measurement is a module of experiments/ " \
        "(registered in experiments.EXPERIMENTS); anything else is named in experiments.SCRIPTS"
    assert set(SCRIPTS) <= tracked, f"experiments.SCRIPTS names what left: {set(SCRIPTS) - tracked}"


def test_every_module_of_experiments_is_run_by_an_experiment():
    modules = {Path(p).stem for p in git("ls-files", "experiments/*.py").stdout.split()}
    run = {c[1].removeprefix("experiments.") for e in EXPERIMENTS.values() for c in e.commands
           if c[:1] == ("-m",) and c[1].startswith("experiments.")}
    assert run <= modules, f"a command names no module: {run - modules}"
    for name in modules - set(PLUMBING):
        assert name in run, f"experiments/{name}.py: no experiment runs it: register or delete it"


def test_a_command_recorded_as_a_script_is_the_module_it_became():
    assert normal("scripts/bench_tools.py --runs 3 --out /tmp/x") == \
        ["-m", "experiments.bench_tools", "--runs", "3", "--out", "{out}"]
    assert normal("python scripts/gone.py") == ["scripts/gone.py"]    # no such module: as is


def test_the_golden_files_name_their_recorders():
    for script, golden in ((s, w) for s, w in SCRIPTS.items() if s.startswith("record_golden")):
        assert f"scripts/{script}" in (ROOT / golden).read_text(), golden


def test_the_results_readme_is_made_from_the_files():
    assert (RESULTS / "README.md").read_text() == readme.page(), \
        "run python -m experiments.readme"


def units(text: str) -> list[str]:
    """A page's paragraphs, each table row on its own."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        rows = [ln for ln in para.splitlines() if ln.startswith("|")]
        out += rows if rows else [para]
    return out


def test_a_legacy_file_is_marked_wherever_a_page_quotes_it():
    """In the pages and in the code's docstrings and comments, by paragraph."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "train/README.md",
             *sorted((ROOT / "pyspec").rglob("*.py")), *sorted((ROOT / "webtools").glob("*.py"))]
    for page in pages:
        for unit in units(page.read_text()):
            for name in set(re.findall(r"bench/results/([\w.-]+\.json)", unit)) & set(LEGACY):
                assert "legacy" in unit.lower(), \
                    f"{page.name} quotes {name} without saying it is legacy: {unit[:160]!r}"


def test_no_result_file_names_a_folder_of_the_machine_it_ran_on():
    """Commands are kept portable (provenance.portable): no /tmp, /root, /home or /work path."""
    machine = re.compile(r"(?<![\w.$])/(?:tmp|root|home|work)/")
    for path in sorted(RESULTS.glob("*.json")):
        for line in path.read_text().splitlines():
            assert not machine.search(line), f"{path.name}: {line.strip()[:160]}"
