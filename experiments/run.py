"""`python -m experiments NAME`: run one experiment of the registry the one way, so that its
files name the code that ran.

From a clean checkout (pyspec/apps/provenance.py's check_tree; `--allow-dirty` runs in place, and
the files say so), HEAD is unpacked with `git archive` into a folder outside any checkout
(TMPDIR/pyspec-experiments/COMMIT/) and the experiment's command runs there with PYSPEC_COMMIT set,
so editing the checkout during a long run cannot change what it measures nor what it records. Its
outputs are copied into bench/results/ under their registered names; commit them after the run
(tests/test_results.py checks that the commit they name is an ancestor of the one that adds them).

Not here: the registry (experiments/__init__.py), the writer (provenance.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pyspec.apps import provenance
from pyspec.errors import UsageError

from . import EXPERIMENTS, FULL_HEAD, Experiment

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def export(commit: str) -> Path:
    """The tree of `commit` in TMPDIR/pyspec-experiments/COMMIT/ (git archive; outside any
    checkout, so that git cannot answer for it), the checkout's .venv and .cache linked in (the
    pinned environment and downloads, not code)."""
    tree = Path(tempfile.gettempdir()) / "pyspec-experiments" / commit
    if not (tree / "pyspec").is_dir():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        for name in (".venv", ".cache"):
            if (ROOT / name).exists() and not (tree / name).exists():
                (tree / name).symlink_to(ROOT / name)
    return tree


def prepare(e: Experiment, tree: Path) -> None:
    """What a command needs beside the tree: "full-head", the shipped draft without its
    reduced-head sidecar."""
    if e.prepare == "full-head":
        target = tree / FULL_HEAD
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tree / "models" / "draft-l4.gguf", target)


def run(name: str, allow_dirty: str | None, extra: list[str], into: Path | None = None) -> int:
    e = EXPERIMENTS.get(name)
    if e is None:
        raise UsageError(f"no experiment {name!r}: `python -m experiments` lists them")
    if not e.commands:
        raise UsageError(f"{name}: its script left the tree ({e.what}); nothing to run")
    if e.machine == "gpu":
        print(f"note: {name} needs the GPU machine (scripts/h200.sh carries the tree there)",
              file=sys.stderr)
    tree_state = provenance.check_tree(allow_dirty)
    env = dict(os.environ, PYSPEC_EXPERIMENT=name)
    if tree_state["dirty"]:
        cwd = ROOT
        env[provenance.ALLOW_DIRTY] = str(allow_dirty)
    else:
        cwd = export(tree_state["commit"])
        env |= {"PYSPEC_COMMIT": tree_state["commit"],
                "PYSPEC_COMMIT_CHECKED": "git archive of the commit (experiments/run.py)"}
    prepare(e, cwd)
    out = Path(tempfile.mkdtemp(prefix=f"experiment-{name}-"))
    argv = [sys.executable, *(a.replace("{out}", str(out)) for a in e.commands[0]), *extra]
    print(f"[{name}] {' '.join(argv[1:])} (in {cwd})", file=sys.stderr, flush=True)
    try:
        code = subprocess.call(argv, cwd=cwd, env=env)
        for made, kept in e.outputs.items():
            if (out / made).exists():
                shutil.copyfile(out / made, (into or RESULTS) / kept)
                print(f"[{name}] {(into or RESULTS) / kept}", file=sys.stderr)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments",
                                 description="run one named experiment (none: list them)")
    ap.add_argument("name", nargs="?")
    provenance.add_option(ap)
    ap.add_argument("--into", type=Path, default=None,
                    help="where its files go (default bench/results/; another folder keeps the "
                         "checkout clean for the next run)")
    # the rest goes to its command (tests/test_results.py then refuses the file: its command is
    # not the registered one, so a changed run must change the registry first)
    args, extra = ap.parse_known_args(argv)
    if args.name is None:
        for key, e in EXPERIMENTS.items():
            print(f"{key:<26} [{e.machine}] {e.what}")
        return 0
    try:
        return run(args.name, args.allow_dirty, extra, args.into)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
