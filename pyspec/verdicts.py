"""Recorded gate verdicts (docs/gate.md): whether a drafter was measured to pay for one champion on
one device class, and the rule by which `auto` follows them.

A verdict is one JSON object (`record` makes it; `python -m pyspec gate` measures it):

    {"champion_sha256", "draft": a draft model's sha256 or a drafter's kind ("ngram", "self:20"),
     "device_class": device_class (receipts.ADAPTER_CLASSES, a GPU's with its architecture), "verdict": "promote" | "keep off",
     "speedup": {"median", "low", "high"}, "rule_version", "date", "sha256"}

`sha256` is the hash of the other fields (`verdict_sha256`): the name a receipt gives the verdict
that chose its drafter, never a path or text. Natively the table is a cache file (`store_path`:
$PYSPEC_VERDICTS, else $XDG_CACHE_HOME/pyspec/verdicts.json, else ~/.cache/pyspec/verdicts.json);
in the page it lives in OPFS and the worker hands it to the session at init (apps/session.py). A
newer verdict for the same champion, draft and device class replaces the older; `find` and
`remove` name verdicts by their sha256 (or its first digits), `clear` deletes the file.

`choose` is the rule: among the candidates auto may run, the promoted one with the highest
measured speedup; else, when the drafter today's rule would pick (load.default_draft) was kept
off, no drafter; else None, and today's rule stands.

Not here: measuring (apps/gate.py), the thresholds (apps/gate.py THRESHOLDS), the receipt's
field (receipts.py), the `verdicts` command and the notes that name a verdict
(apps/verdict_table.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass

from .errors import PyspecError

SCHEMA = "pyspec.verdicts/1"
PROMOTE, KEEP_OFF = "promote", "keep off"
VERDICTS = (PROMOTE, KEEP_OFF)
_FIELDS = ("champion_sha256", "draft", "device_class", "verdict", "speedup", "rule_version",
           "date")


class VerdictStoreError(PyspecError, ValueError):
    """The verdict file is not a verdict table: the message says which file and how to mend it."""

    code = "bad_config"


class UnknownVerdictError(PyspecError, LookupError):
    """No verdict (or more than one) has the sha256 or prefix given: the message says which
    names the table holds, or to give more digits."""

    code = "bad_config"


SHORT = 12      # the digits of a verdict's sha256 that name it in listings and notes
MIN_PREFIX = 4  # the fewest digits `find` takes


def device_class(adapter_class: str, architecture: str | None = None) -> str:
    """A verdict's device class: the receipt's adapter class ("cpu-numpy", "software",
    "gpu:nvidia", ...), and for a hardware GPU the architecture its adapter names
    (GPUAdapterInfo.architecture, wgpu-py's adapter info: "gpu:nvidia/hopper"), so that a
    verdict measured on one generation of a vendor's GPUs is not followed on another. Software
    adapters and the numpy engine are one class each. Only letters, digits and "-_." of the
    architecture are kept (32 at most): a class names hardware, never a driver build."""
    arch = re.sub(r"[^a-z0-9_.-]", "", (architecture or "").lower())[:32]
    return f"{adapter_class}/{arch}" if adapter_class.startswith("gpu:") and arch else \
        adapter_class


def verdict_sha256(v: dict) -> str:
    """The sha256 of a verdict's fields (all but `sha256`), as canonical JSON."""
    body = {k: v[k] for k in _FIELDS}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def record(*, champion_sha256: str, draft: str, device_class: str, verdict: str,
           speedup: dict, rule_version: int, date: str) -> dict:
    """One verdict, with its sha256."""
    if verdict not in VERDICTS:
        raise ValueError(f"a verdict is one of {VERDICTS}, got {verdict!r}")
    v = {"champion_sha256": champion_sha256, "draft": draft, "device_class": device_class,
         "verdict": verdict, "speedup": {k: speedup[k] for k in ("median", "low", "high")},
         "rule_version": rule_version, "date": date}
    return v | {"sha256": verdict_sha256(v)}


def parse(table, source: str) -> list[dict]:
    """A list of verdicts from a table (its list, or {"schema", "verdicts"}), each checked:
    VerdictStoreError naming `source` for one that is not a verdict or whose sha256 is wrong."""
    if isinstance(table, dict) and table.get("schema") == SCHEMA:
        table = table.get("verdicts")
    if not isinstance(table, list):
        raise VerdictStoreError(f"{source}: not a verdict table ({SCHEMA}); delete it, and "
                                "`python -m pyspec gate` records verdicts afresh")
    for v in table:
        try:
            ok = (v["verdict"] in VERDICTS and verdict_sha256(v) == v["sha256"]
                  and all(isinstance(v[k], str) for k in ("champion_sha256", "draft",
                                                          "device_class")))
        except (KeyError, TypeError):
            ok = False
        if not ok:
            raise VerdictStoreError(f"{source}: an entry is not a verdict, or its sha256 does "
                                    "not match its fields; delete the file and run the gate "
                                    "again")
    return table


def store_path() -> str:
    """The native verdict file: $PYSPEC_VERDICTS (a file of one's own; the tests' too), else
    $XDG_CACHE_HOME/pyspec/verdicts.json, else ~/.cache/pyspec/verdicts.json."""
    if os.environ.get("PYSPEC_VERDICTS"):
        return os.environ["PYSPEC_VERDICTS"]
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "pyspec", "verdicts.json")


def load(path: str | None = None) -> list[dict]:
    """The verdicts in the native file ([] when there is none)."""
    path = path or store_path()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    try:
        return parse(json.loads(text), path)
    except (json.JSONDecodeError, RecursionError):
        raise VerdictStoreError(f"{path}: not JSON; delete it, and `python -m pyspec gate` "
                                "records verdicts afresh") from None


def merge(table: list[dict], new: list[dict]) -> list[dict]:
    """The table with `new` in it, each replacing an older verdict of its key."""
    keys = {_key(v) for v in new}
    return [v for v in table if _key(v) not in keys] + list(new)


def save(new: list[dict], path: str | None = None) -> str:
    """Add verdicts to the native file; returns its path."""
    path = path or store_path()
    return _write(merge(load(path), new), path)


def find(table: list[dict], name: str, source: str) -> dict:
    """The verdict whose sha256 is `name` or starts with it (at least MIN_PREFIX hex digits);
    UnknownVerdictError naming `source` for none, or for a prefix that names more than one."""
    name = name.lower()
    if not re.fullmatch(f"[0-9a-f]{{{MIN_PREFIX},64}}", name):
        raise UnknownVerdictError(f"{name!r} is not a verdict's name: give its sha256, or at "
                                  f"least its first {MIN_PREFIX} hex digits, as `python -m "
                                  "pyspec verdicts` lists them")
    hits = [v for v in table if v["sha256"].startswith(name)]
    if not hits:
        raise UnknownVerdictError(f"no verdict {name} in {source} ({len(table)} there): `python "
                                  "-m pyspec verdicts` lists them")
    if len(hits) > 1:
        raise UnknownVerdictError(f"{name} names {len(hits)} verdicts in {source} ("
                                  f"{', '.join(v['sha256'][:SHORT] for v in hits)}): give more "
                                  "of its sha256")
    return hits[0]


def remove(names: list[str], path: str | None = None) -> list[dict]:
    """Take the verdicts `names` name (find's rule: every name must name one, else nothing is
    removed) out of the native file; returns them."""
    path = path or store_path()
    table = load(path)
    gone = [find(table, n, path) for n in names]
    _write([v for v in table if v not in gone], path)
    return gone


def clear(path: str | None = None) -> int | None:
    """Delete the native file, whatever it holds; returns how many verdicts it held (None: it
    was not a verdict table; 0: there was none)."""
    path = path or store_path()
    try:
        n = len(load(path))
    except VerdictStoreError:
        n = None
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    return n


def _write(table: list[dict], path: str) -> str:
    """The table, written whole to a temporary file, then renamed, so that a run stopped while
    writing leaves the old one; returns the path."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"schema": SCHEMA, "verdicts": table}, f, indent=1)
    os.replace(tmp, path)
    return path


def draft_name(draft: str) -> str:
    """A verdict's draft in words: its kind ("ngram", "self:20"), or a draft model by the first
    digits of its sha256 ("model 3f2a9c1b7d4e", "ngram+model 3f2a9c1b7d4e")."""
    if re.fullmatch(r"(ngram\+)?[0-9a-f]{64}", draft):
        combo, _, sha = draft.rpartition("+")
        return f"{combo}{'+' if combo else ''}model {sha[:SHORT]}"
    return draft


def describe(v: dict) -> str:
    """One verdict in a line: its word, draft, device class, speedup and interval, and the gate
    run that measured it (its date)."""
    sp = v["speedup"]
    return (f"{v['verdict']} {draft_name(v['draft'])} on {v['device_class']}, speedup "
            f"x{sp['median']:.3f} [{sp['low']:.3f}, {sp['high']:.3f}], gate run of {v['date']}")


def _key(v: dict) -> tuple:
    return v["champion_sha256"], v["draft"], v["device_class"]


def explain(choice: "Choice | None") -> str | None:
    """The verdict that made `choice`, in words ("no drafter: kept off by the recorded gate
    verdict 2840fb139173 (keep off ngram on cpu-numpy, ...)"); None where no verdict did. The
    CLI's note and the page's info.draft_auto say where it is kept and how to clear it."""
    v = choice.verdict if choice else None
    if v is None:
        return None
    did = (f"drafter {choice.drafter}, chosen by" if v["verdict"] == PROMOTE
           else "no drafter: kept off by")
    return f"{did} the recorded gate verdict {v['sha256'][:SHORT]} ({describe(v)})"


@dataclass
class Choice:
    """What `auto` runs ("none", or a drafter spec from the candidates) and the verdict that
    chose it (None: today's rule did)."""
    drafter: str
    verdict: dict | None = None

    def receipt(self) -> dict:
        """The receipt's `draft.auto`: which verdict chose the drafter (null fields: the rule)."""
        v = self.verdict or {"verdict": None, "sha256": None}
        return {"verdict": v["verdict"], "verdict_sha256": v["sha256"]}


def weightless(table: list[dict]) -> dict[str, str]:
    """The drafters of a table that need no weights (ngram, self:L), each its own spec: the
    candidates `choose` gets beside a draft model of the caller's."""
    return {v["draft"]: v["draft"] for v in table
            if v["draft"] == "ngram" or v["draft"].startswith("self:")}


def choose(table: list[dict], champion_sha256: str, device_class: str,
           candidates: dict[str, str], default: str) -> Choice | None:
    """`auto`'s choice by recorded verdicts. `candidates` maps a draft's identity (a sha256 or a
    kind, as gate records it) to the spec that runs it; `default` is the spec today's rule picks.
    The promoted candidate with the highest median speedup; else "none" when `default`'s own
    verdict is "keep off"; else None (no verdict decides: today's rule stands)."""
    mine = [v for v in table if v["champion_sha256"] == champion_sha256
            and v["device_class"] == device_class and v["draft"] in candidates]
    promoted = [v for v in mine if v["verdict"] == PROMOTE]
    if promoted:
        best = max(promoted, key=lambda v: v["speedup"]["median"])
        return Choice(candidates[best["draft"]], best)
    kept_off = [v for v in mine if candidates[v["draft"]] == default]
    if kept_off:
        return Choice("none", kept_off[-1])
    return None
