"""Where a benchmark result came from, and what its outputs were, so that a claim can be checked
after the run: the commit, the sha256 of the champion, of each draft model and of the workload,
the date, the machine and the adapter (`record`), and for every output the sha256 of its token
ids (`tokens_sha256`), from which "identical to champion-only" can be recounted
(`recount_identical`); `stamp` adds the record to a measuring script's result. It also holds the rule that a drafter which drafted in fewer than
`DRAFTED_MIN` of its cycles "did not draft" (`outcome`): its output equals champion-only's
because it barely ran, which says nothing about its exactness or its speed.

Not here: running or summarising a benchmark (bench.py, benchstats.py).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import platform
import subprocess

import numpy as np

# A drafter that drafted in fewer than this share of its cycles is reported as "did not draft".
DRAFTED_MIN = 0.10

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sha256_file(path: str | None) -> str | None:
    """The sha256 of a file's bytes, read in 1 MB pieces; None for no path or a missing file."""
    if not path or not os.path.isfile(path):
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tokens_sha256(ids: list[int]) -> str:
    """The sha256 of token ids as little-endian uint32: two outputs hash alike iff they are the
    same ids (the text is never stored: a result file may be shared)."""
    return hashlib.sha256(np.asarray(ids, dtype="<u4").tobytes()).hexdigest()


def git_commit(root: str = ROOT) -> dict:
    """{"commit", "dirty"} of the checkout at root: None for both outside a git checkout.

    A copy of the tree without its .git (the GPU machine's) names its commit in PYSPEC_COMMIT,
    which the runner sets only after checking every tracked file's sha256 against the list made
    at that commit (scripts/h200.sh): then "commit_checked" says how."""
    def git(*args):
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD"),
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        if os.environ.get("PYSPEC_COMMIT"):
            return {"commit": os.environ["PYSPEC_COMMIT"], "dirty": False,
                    "commit_checked": os.environ.get("PYSPEC_COMMIT_CHECKED", "")}
        return {"commit": None, "dirty": None}


def machine() -> dict:
    """The host: OS, CPU model, core count and Python."""
    return {"platform": platform.platform(), "processor": cpu_model(),
            "cpus": os.cpu_count(), "python": platform.python_version()}


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo on Linux; platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def record(*, champion: str | None, drafts: dict[str, str | None], workload: str | None,
           adapter: str, backend: str, models: dict[str, str] | None = None) -> dict:
    """A result's provenance: champion and workload paths give a name and sha256; `drafts` maps
    each drafter to its model's path (None for one without weights: ngram, self:L, none);
    `models` names the other models a run loaded (a shape benchmark's), each by its path."""
    def named(path):
        return {"file": os.path.basename(path) if path else None, "sha256": sha256_file(path)}
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           **git_commit(), "machine": machine(), "backend": backend, "adapter": adapter,
           "champion": named(champion), "workload": named(workload),
           "drafts": {d: named(path) if path else None for d, path in drafts.items()}}
    if models:
        out["models"] = {name: named(str(path)) for name, path in models.items()}
    return out


def stamp(result: dict, *, champion: str | None = None, drafts: dict | None = None,
          workload: str | None = None, adapter: str | None = None,
          backend: str | None = None, models: dict | None = None) -> dict:
    """`result` with its "provenance" (record's) added, for the measuring scripts; the champion
    defaults to the installed one unless `models` names what was loaded instead."""
    if champion is None and models is None:
        from .. import champion_path
        try:
            champion = champion_path()
        except FileNotFoundError:
            pass
    result["provenance"] = record(champion=champion, drafts=drafts or {}, workload=workload,
                                  adapter=adapter or result.get("adapter"), backend=backend,
                                  models=models)
    return result


def drafted_share(stats: list[dict]) -> float:
    """The share of champion passes that checked at least one drafted token, over runs' stats
    (drafted_by_position[0] counts the cycles with a first draft)."""
    passes = sum(s["champion_passes"] for s in stats)
    drafted = sum(s["drafted_by_position"][0] for s in stats if s["drafted_by_position"])
    return drafted / passes if passes else 0.0


def outcome(identical: int | None, prompts: int, share: float) -> str:
    """What a drafter's rows show: "did not draft" below DRAFTED_MIN of cycles drafted (whatever
    the outputs), else "identical", "N of M differ", or "not compared" (rejection sampling)."""
    if share < DRAFTED_MIN:
        return "did not draft"
    if identical is None:
        return "not compared"
    return "identical" if identical == prompts else f"{prompts - identical} of {prompts} differ"


def recount_identical(prompt_lines: list[dict]) -> int:
    """How many of a drafter's prompt lines (a result's "prompts"[drafter]) hash as their
    champion-only output: the count a result's identical_to_baseline must agree with."""
    return sum(r["tokens_sha256"] == r["baseline_tokens_sha256"] for r in prompt_lines)
