"""bench/results/README.md, made from the result files and the registry: per file its experiment,
machine, date, commit, command and the pages and modules that cite it. A file with provenance
speaks for itself; a legacy one (experiments.LEGACY) by what was written down at the time, and
says so. `python -m experiments.readme` rewrites the page; tests/test_results.py checks it is
current.

Not here: the README's headline table (webtools/results.py), the checks of each file
(tests/test_results.py).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from . import EXPERIMENTS, LEGACY, experiment_of, normal

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
# Where a result file may be cited: the pages, the training notes, the code.
CITERS = ["README.md", "docs/*.md", "train/README.md", "pyspec/**/*.py", "webtools/*.py"]

HEAD = """# Benchmark results

Made by `python -m experiments.readme` from the files and the registry (`experiments/`); do not
edit by hand. Each file is the one behind a claim: a run that a later one replaced left the tree
(git history keeps it). Numbers inside are medians over prompts with [min, max] ranges.

A file written through `pyspec/apps/provenance.py` names the command as run, its commit (a run
from a tree with uncommitted changes says so), the date, the machine and its load, the adapter,
the sha256 of every model and of the workload, and the token hash of both sides of every
compared output; `tests/test_results.py` checks each. A **legacy** file predates that writer: its
machine and command below are what was written down at the time, and its figures cannot be
recounted. Run an experiment with `python -m experiments NAME` (`python -m experiments` lists
them).

Machines: **H200** is one NVIDIA H200 through native WebGPU (wgpu-py on Vulkan); **2-core** a
2-core AMD EPYC VM shared with other jobs (numpy with OpenBLAS natively, Chromium's SwiftShader
for the page); **lavapipe** Mesa's CPU Vulkan on that VM.

| file | experiment | machine | date | commit | command | cited by |
|---|---|---|---|---|---|---|
"""


def cited_by(name: str) -> str:
    """The pages and modules that name a result file (README and docs first)."""
    found = []
    for pattern in CITERS:
        for path in sorted(ROOT.glob(pattern)):
            if name in path.read_text(encoding="utf-8"):
                found.append(str(path.relative_to(ROOT)))
    return ", ".join(found) or "-"


def as_registered(command: str) -> str:
    """A recorded command as the registry writes it (experiments.normal), --out folder OUT."""
    args = normal(command)
    return shlex.join(["python", *args] if args[:1] == ["-m"] else args).replace("'{out}'", "OUT").replace("{out}", "OUT")


def machine(origin: dict) -> str:
    m = origin.get("machine") or {}
    load = (origin.get("load") or {}).get("start")
    return (f"{m.get('processor') or m.get('platform')}, {m.get('cpus')} cores"
            + (f", load {load[0]:.1f}" if load else "") + f"; {origin.get('adapter')}")


def row(name: str) -> str:
    key = experiment_of(name)
    what = f"`{key}`" if key else "-"
    plot = (RESULTS / name).with_suffix(".png")
    shown = f"`{name}`" + (", `.png`" if plot.exists() else "")
    if name in LEGACY:
        where, command = LEGACY[name]
        return f"| {shown} | {what} | {where} | - | **legacy** | `{command}` | {cited_by(name)} |"
    origin = json.loads((RESULTS / name).read_text())["provenance"]
    commit = origin["commit"][:9] + (" (dirty: " + origin["dirty_allowed"] + ")"
                                     if origin.get("dirty") else "")
    return (f"| {shown} | {what} | {machine(origin)} | {origin['date'][:10]} | {commit} | "
            f"`{as_registered(origin['command'])}` | {cited_by(name)} |")


def page() -> str:
    names = sorted(p.name for p in RESULTS.glob("*.json"))
    order = {key: i for i, key in enumerate(EXPERIMENTS)}
    names.sort(key=lambda n: (order.get(experiment_of(n), len(order)), n))
    return HEAD + "\n".join(row(n) for n in names) + "\n"


if __name__ == "__main__":
    (RESULTS / "README.md").write_text(page(), encoding="utf-8")
    print(f"wrote {RESULTS / 'README.md'}")
