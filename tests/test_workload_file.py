"""The public workload travels with the repository: its bytes are the ones its README names, it
is every runner's default, and nothing in the repository reads a folder beside the checkout
(a clone has none)."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

from pyspec.apps import gate, workload

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = ROOT / "workloads" / "public.jsonl"


def test_the_workload_is_the_one_its_readme_names():
    named = re.search(r"sha256 of `public.jsonl`: `([0-9a-f]{64})`",
                      (ROOT / "workloads" / "README.md").read_text()).group(1)
    assert hashlib.sha256(PUBLIC.read_bytes()).hexdigest() == named
    items = workload.read_workload(str(PUBLIC))
    assert len(items) == 44 and len({it["stratum"] for it in items}) == 11


def test_runners_default_to_it():
    assert Path(workload.PUBLIC_WORKLOAD) == PUBLIC
    assert Path(gate.DEFAULT_WORKLOAD) == PUBLIC
    from pyspec.apps.cli import parser
    args = parser().parse_args(["bench"])
    assert Path(args.workload) == PUBLIC


def test_nothing_reads_beside_the_checkout():
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True,
                             text=True, check=True).stdout.split()
    pattern = re.compile(r"""\.\./shared|["']shared["']\s*[,/)]|/\s*"shared"\s*/""")
    found = [f"{name}:{n}" for name in tracked
             if name.endswith((".py", ".js", ".mjs", ".sh", ".md", ".html")) and
             name != "tests/test_workload_file.py"
             for n, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1)
             if pattern.search(line)]
    assert not found, f"reads ../shared (a clone has no such folder): {found}"
