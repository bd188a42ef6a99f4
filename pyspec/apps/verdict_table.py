"""`python -m pyspec verdicts`: the recorded gate verdicts that `--draft auto` follows, listed,
shown one by one and cleared; and the note a generation prints when one chose its drafter.

The table is the native file of verdicts.py (`store_path`: $PYSPEC_VERDICTS, else the user's
cache folder); a verdict is named by its sha256, or by its first digits as the listing shows
them (verdicts.find). Every listing names the file, so that a user knows which one `auto` reads.

Not here: the table's format and the rule `auto` follows (verdicts.py), measuring and recording
(gate.py), the page's table in OPFS (web/verdicts.js).
"""

from __future__ import annotations

import json

from .. import verdicts
from ..errors import UsageError

CLEAR = "python -m pyspec verdicts clear"


def cmd_list(args) -> int:
    path = verdicts.store_path()
    table = verdicts.load(path)
    if args.json:
        print(json.dumps({"file": path, "verdicts": table}))
        return 0
    if not table:
        print(f"no verdicts in {path}: `--draft auto` follows today's rule (`python -m pyspec "
              "gate` records verdicts; PYSPEC_VERDICTS names another file)")
        return 0
    print(f"{len(table)} verdict{'s' * (len(table) > 1)} in {path} (PYSPEC_VERDICTS names "
          "another file); `--draft auto` follows those of its champion and device class:")
    for v in table:
        print(f"  {v['sha256'][:verdicts.SHORT]}  {verdicts.describe(v)}; champion "
              f"{v['champion_sha256'][:verdicts.SHORT]}")
    print(f"`python -m pyspec verdicts show NAME` shows one; `{CLEAR} NAME` (or --all) removes")
    return 0


def cmd_show(args) -> int:
    path = verdicts.store_path()
    v = verdicts.find(verdicts.load(path), args.name, path)
    if args.json:
        print(json.dumps(v))
        return 0
    sp = v["speedup"]
    rows = [("verdict", v["verdict"]), ("draft", v["draft"]),
            ("champion", v["champion_sha256"]), ("device class", v["device_class"]),
            ("speedup", f"x{sp['median']:.3f}, interval [{sp['low']:.3f}, {sp['high']:.3f}]"),
            ("measured", f"by the gate run of {v['date']}, rule version {v['rule_version']}"),
            ("sha256", v["sha256"]), ("file", path)]
    print("\n".join(f"{k:<13} {value}" for k, value in rows))
    print(f"auto          {effect(v)}")
    print(f"`{CLEAR} {v['sha256'][:verdicts.SHORT]}` removes it")
    return 0


def effect(v: dict) -> str:
    """What `--draft auto` does by the verdict (verdicts.choose), in words."""
    where = f"for this champion on {v['device_class']}"
    if v["verdict"] == verdicts.PROMOTE:
        return (f"runs {verdicts.draft_name(v['draft'])} {where} (unless another promoted "
                "drafter measured faster)")
    return (f"runs no drafter {where} where today's rule would pick "
            f"{verdicts.draft_name(v['draft'])}")


def cmd_clear(args) -> int:
    path = verdicts.store_path()
    if args.all == bool(args.names):
        raise UsageError("name the verdicts to clear (their sha256, or its first digits as "
                         "`python -m pyspec verdicts` lists them), or give --all")
    if args.all:
        n = verdicts.clear(path)
        print(f"no verdicts in {path}: nothing to clear" if n == 0 else
              f"removed {path} (it was not a verdict table)" if n is None else
              f"removed {n} verdict{'s' * (n > 1)}: {path} is gone; `--draft auto` follows "
              "today's rule")
        return 0
    for v in verdicts.remove(args.names, path):
        print(f"removed {v['sha256'][:verdicts.SHORT]} ({verdicts.describe(v)}) from {path}")
    return 0


def notice(choice: verdicts.Choice | None) -> str | None:
    """The note a generation prints when a recorded verdict chose its drafter (`choice`: the
    executor's `auto`), else None: which verdict, what it measured, and how to clear it."""
    said = verdicts.explain(choice)
    if said is None:
        return None
    name = choice.verdict["sha256"][:verdicts.SHORT]
    return (f"{said} in {verdicts.store_path()}; `{CLEAR} {name}` removes it, `--draft NAME` "
            "overrides it")


def add_parser(sub) -> None:
    """The `verdicts` command and its actions (list, the default; show; clear)."""
    p = sub.add_parser("verdicts", help="list, show or clear the gate verdicts --draft auto "
                                        "follows",
                       description="The recorded gate verdicts (python -m pyspec gate) that "
                                   "--draft auto follows, in $PYSPEC_VERDICTS, else "
                                   "$XDG_CACHE_HOME/pyspec/verdicts.json, else "
                                   "~/.cache/pyspec/verdicts.json.")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_list, parser=p)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    a = actions.add_parser("list", help="every verdict, with its name (the default)")
    a.add_argument("--json", action="store_true", help="print {file, verdicts}")
    a.set_defaults(func=cmd_list, parser=a)
    a = actions.add_parser("show", help="one verdict, and what auto does by it")
    a.add_argument("name", help="its sha256, or its first digits (at least "
                                f"{verdicts.MIN_PREFIX})")
    a.add_argument("--json", action="store_true", help="print the verdict")
    a.set_defaults(func=cmd_show, parser=a)
    a = actions.add_parser("clear", help="remove verdicts: those named, or --all (the file)")
    a.add_argument("names", nargs="*", metavar="NAME", help="a verdict's sha256 or its first "
                                                            "digits")
    a.add_argument("--all", action="store_true", help="remove the file, whatever it holds")
    a.set_defaults(func=cmd_clear, parser=a)
