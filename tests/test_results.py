"""Every file in bench/results/ can be recounted, or is named as legacy: its provenance present
and well-formed (pyspec/apps/provenance.problems), the commit it names an ancestor of the commit
that brought the file (so the code that ran is in the history), made by one of its experiment's
commands (experiments/); bench/results/README.md is made from the files; every script is an
experiment's, a named tool or a golden recorder.

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

from experiments import EXPERIMENTS, LEGACY, TOOLS, experiment_of, normal, readme
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


def test_every_script_is_an_experiment_a_tool_or_a_recorder():
    named = {c[0].removeprefix("scripts/") for e in EXPERIMENTS.values() for c in e.commands
             if c and c[0].startswith("scripts/")}
    tracked = {Path(p).name for p in git("ls-files", "scripts").stdout.split()}
    assert tracked, "git ls-files found no scripts"
    assert named <= tracked, f"a command names no script: {named - tracked}"
    assert set(TOOLS) <= tracked, f"a tool that is not there: {set(TOOLS) - tracked}"
    for name in tracked:
        assert name in named or name in TOOLS, \
            f"scripts/{name}: no experiment runs it and it is no named tool: delete it"


def test_the_golden_files_name_their_recorders():
    for script, golden in ((s, w) for s, w in TOOLS.items() if s.startswith("record_golden")):
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
