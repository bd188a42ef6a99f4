"""The one writer of benchmark results, so that every claim can be recounted after the run.

`record` says where a result came from: the command line as run, the commit (a dirty tree is
refused unless the run was told to allow it, and then the file says so: `DirtyTreeError`), the
date, the machine and its load, the backend and adapter, the name and sha256 of every model the
run loaded (champion, drafts, `models=` for others) and of the workload. `write` checks a result
(`problems`: provenance present, each hash well-formed, a token hash for both sides of every
compared output) and writes it; `stamp` adds the record to a measuring script's result. For every
output the sha256 of its token ids (`tokens_sha256`) lets "identical to champion-only" be
recounted (`recount_identical`). It also holds the rule that a drafter which drafted in fewer
than `DRAFTED_MIN` of its cycles "did not draft" (`outcome`): its output equals champion-only's
because it barely ran, which says nothing about its exactness or its speed.

Used by `pyspec bench`, `pyspec gate`, the page's bench (webtools/bench.py) and every experiment
(experiments/). Not here: running or summarising a benchmark (bench.py, benchstats.py); which
result files predate this record (experiments.LEGACY).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile

import numpy as np

from ..errors import UsageError

# A drafter that drafted in fewer than this share of its cycles is reported as "did not draft".
DRAFTED_MIN = 0.10

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Set (to a reason) to let a run record a dirty tree; the file then says so ("dirty_allowed").
ALLOW_DIRTY = "PYSPEC_ALLOW_DIRTY"
SHA256 = re.compile(r"[0-9a-f]{64}")
COMMIT = re.compile(r"[0-9a-f]{40}")


class DirtyTreeError(UsageError):
    """A result would name a commit whose files are not the ones that ran."""


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

    A copy of the tree on the GPU machine names its commit in PYSPEC_COMMIT, which the runner
    sets only after checking every tracked file's sha256 against the list made at that commit
    (scripts/h200.sh): then "commit_checked" says how. It comes first: the copy there carries a
    .git of another commit (the session's first), which would name the wrong one, dirty."""
    if os.environ.get("PYSPEC_COMMIT"):
        return {"commit": os.environ["PYSPEC_COMMIT"], "dirty": False,
                "commit_checked": os.environ.get("PYSPEC_COMMIT_CHECKED", "")}

    def git(*args):
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
    try:
        # Why: a tree copy unpacked inside another checkout (a cache folder) would otherwise
        # name that checkout's commit; only a checkout whose top is root speaks for root.
        if os.path.realpath(git("rev-parse", "--show-toplevel")) != os.path.realpath(root):
            raise subprocess.SubprocessError("root is not the top of a checkout")
        return {"commit": git("rev-parse", "HEAD"),
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
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


# The GPU machine's work folder, as scripts/h200.sh makes it ($W: PYSPEC_DEVICE_DIR, else the
# temporary folder, then pyspec/).
DEVICE_DIR = os.path.join(os.environ.get("PYSPEC_DEVICE_DIR") or tempfile.gettempdir(), "pyspec")
# Folders a command names that are its machine's, not the measurement's, as the file writes them:
# a checkout's workload or script (relative to the tree), the GPU machine's work folder ($W); the
# --out folder is written {out}.
SCRATCH = ((r"^/.*/((?:workloads|experiments|scripts)/[\w.-]+)$", r"\1"),
           ("^" + re.escape(DEVICE_DIR + "/"), "$W/"))


def portable(args: list[str]) -> list[str]:
    """A command's arguments without the paths of the machine it ran on (SCRATCH, the
    checkout's own root), so a result file reads the same wherever it was made."""
    root, out = str(ROOT) + "/", []
    for prev, a in zip([None, *args], args):
        if prev == "--out":
            a = "{out}"
        elif a.startswith("--out="):
            a = "--out={out}"
        a = a.removeprefix(root)
        for pattern, to in SCRATCH:
            a = re.sub(pattern, to, a)
        out.append(a)
    return out


def command() -> str:
    """The command line as run, the interpreter written `python` (its path names a machine) and
    its paths portable."""
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    return shlex.join(["python", *portable(argv[1:])])


def check_tree(allow_dirty: str | None = None) -> dict:
    """git_commit, refusing a dirty tree unless allowed (`allow_dirty`, else $PYSPEC_ALLOW_DIRTY:
    a reason the file keeps as "dirty_allowed"). Call it before a run, so a refusal costs none."""
    tree = git_commit()
    allowed = allow_dirty or os.environ.get(ALLOW_DIRTY)
    if tree["dirty"] and not allowed:
        raise DirtyTreeError(
            f"the checkout at {ROOT} has uncommitted changes, so the commit a result would name "
            "is not the code that ran: commit first, or pass --allow-dirty (scripts: set "
            f"{ALLOW_DIRTY}=REASON) and the file will say it came from a dirty tree")
    if tree["dirty"]:
        tree["dirty_allowed"] = str(allowed)
    return tree


def add_option(parser) -> None:
    """--allow-dirty, for every command that writes a result."""
    parser.add_argument("--allow-dirty", action="store_const", const="--allow-dirty",
                        default=None, help="run from a checkout with uncommitted changes (the "
                                           "result then says so; refused otherwise)")


def record(*, champion: str | None, drafts: dict[str, str | None], workload: str | None,
           adapter: str, backend: str, models: dict[str, str] | None = None,
           allow_dirty: str | None = None) -> dict:
    """A result's provenance: champion and workload paths give a name and sha256; `drafts` maps
    each drafter to its model's path (None for one without weights: ngram, self:L, none);
    `models` names the other models a run loaded (a shape benchmark's), each by its path."""
    def named(path):
        return {"file": os.path.basename(path) if path else None, "sha256": sha256_file(path)}
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": command(), "experiment": os.environ.get("PYSPEC_EXPERIMENT"),
           **check_tree(allow_dirty), "machine": machine(),
           "load": {"start": load_average()}, "backend": backend, "adapter": adapter,
           "champion": named(champion), "workload": named(workload),
           "drafts": {d: named(path) if path else None for d, path in drafts.items()}}
    if models:
        out["models"] = {name: named(str(path)) for name, path in models.items()}
    return out


def load_average() -> list[float] | None:
    """The host's 1, 5 and 15 minute load averages (None where the OS has none): a shared
    machine's figures are read against it."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def problems(result: dict, claim: bool = True) -> list[str]:
    """What keeps a result from being recounted: no provenance, a malformed commit or sha256, a
    named file without its sha256, a dirty tree not declared, a compared output without the
    token hash of both sides. Empty for a good result. A claim (a file of bench/results/,
    tests/test_results.py) must name its commit; `write` lets a run outside a git checkout (an
    installed pyspec: commit and dirty None) go without one."""
    origin = result.get("provenance")
    if not isinstance(origin, dict):
        return ["no provenance"]
    out = []
    outside = origin.get("commit") is None and origin.get("dirty") is None
    if not (isinstance(origin.get("commit"), str) and COMMIT.fullmatch(origin["commit"])) \
            and (claim or not outside):
        out.append(f"commit {origin.get('commit')!r} is not a 40-digit hex id")
    if origin.get("dirty") and not origin.get("dirty_allowed"):
        out.append("a dirty tree, not declared (dirty_allowed)")
    for key in ("date", "command", "machine"):
        if not origin.get(key):
            out.append(f"no {key}")
    named = [("champion", origin.get("champion")), ("workload", origin.get("workload")),
             *[(f"draft {d}", v) for d, v in (origin.get("drafts") or {}).items()],
             *[(f"model {m}", v) for m, v in (origin.get("models") or {}).items()]]
    for what, entry in named:
        if entry and entry.get("file") and not SHA256.fullmatch(str(entry.get("sha256"))):
            out.append(f"{what} {entry['file']}: sha256 {entry.get('sha256')!r}")
    prompts = result.get("prompts")   # a bench's: drafter -> its prompt lines
    for drafter, lines in (prompts.items() if isinstance(prompts, dict) else ()):
        if not isinstance(lines, list):
            continue
        for line in lines:
            hashes = [line.get("tokens_sha256"), line.get("baseline_tokens_sha256")]
            if not all(isinstance(h, str) and SHA256.fullmatch(h) for h in hashes):
                out.append(f"{drafter} {line.get('id')}: no token hash of both sides")
    return out


def write(path: str, result: dict, here: bool = True) -> str:
    """Check `result` (`problems`; a bad one raises ValueError and is not written) and write it
    to `path` as JSON, the load at the end of the run added; replaced whole, never half-written.
    `here=False`: a report of a run on another machine (its record carried over), whose load
    this machine's is not."""
    bad = problems(result, claim=False)
    if bad:
        raise ValueError(f"{path}: not a recountable result: {'; '.join(bad)}")
    if here:
        result["provenance"]["load"] = {**result["provenance"].get("load", {}),
                                        "end": load_average()}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)
    return path


def stamp(result: dict, *, champion: str | None = None, drafts: dict | None = None,
          workload: str | None = None, adapter: str | None = None,
          backend: str | None = None, models: dict | None = None,
          allow_dirty: str | None = None) -> dict:
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
                                  models=models, allow_dirty=allow_dirty)
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
