"""The `SpecError` codes a page can see, read from the code that raises them, and the TypeScript
union `SpecErrorCode` in web/client.d.ts written from them, so the types are never kept by hand.

A code comes from one of these places (pyspec/errors.py is the hierarchy):
  pyspec/**.py   a PyspecError subclass's class attribute `code = "..."`, and web.py's
                 `SessionError("...", ...)` (a code chosen per raise)
  web/*.js       `new WorkerError("...", ...)` (worker.js: downloads, requests) and
                 `new SpecError("...", ...)` (client.js: a dead worker, the facade's refusals),
                 and the literals in the `code:` of worker.js's error reply (an exception that
                 carries no code: "fatal" or "internal")
`codes()` reads them; `render()` puts the union between the BEGIN/END markers of client.d.ts.
`python -m webtools.errorcodes` and `build.py site` rewrite web/client.d.ts when it is stale, and
tests/test_errorcodes.py fails while it is.

Not here: the other types of client.d.ts (written by hand, next to client.js).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DTS = ROOT / "web" / "client.d.ts"
BEGIN = "// BEGIN SpecErrorCode: written by webtools/errorcodes.py from the sources; do not edit\n"
END = "// END SpecErrorCode\n"

_PY_CODE = re.compile(r'^\s+code = "([a-z_]+)"$', re.M)         # class attribute
_PY_SESSION = re.compile(r'SessionError\(\s*"([a-z_]+)"')
_JS_ERROR = re.compile(r'new (?:WorkerError|SpecError)\(\s*"([a-z_]+)"')
_JS_REPLY = re.compile(r'post\(\{ type: "error",[^;]*?code: (.*?),\s*message:', re.S)
_LITERAL = re.compile(r'"([a-z_]+)"')


def codes(root: Path = ROOT) -> list[str]:
    """Every SpecError code raised in pyspec/ and web/, sorted."""
    found: set[str] = set()
    for path in (root / "pyspec").rglob("*.py"):
        text = path.read_text()
        found.update(_PY_CODE.findall(text), _PY_SESSION.findall(text))
    for path in (root / "web").glob("*.js"):
        text = path.read_text()
        found.update(_JS_ERROR.findall(text))
        for expr in _JS_REPLY.findall(text):
            found.update(_LITERAL.findall(expr))
    return sorted(found)


def union(names: list[str]) -> str:
    return "export type SpecErrorCode =\n" + "".join(f'  | "{n}"\n' for n in names)[:-1] + ";\n"


def render(dts: str, names: list[str]) -> str:
    """`dts` with the union between its markers replaced by one of `names`."""
    head, sep, rest = dts.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not (sep and sep2):
        raise ValueError(f"{DTS.name} lacks the markers {BEGIN.strip()!r} ... {END.strip()!r}")
    return head + BEGIN + union(names) + END + tail


def refresh(path: Path = DTS) -> bool:
    """Rewrite `path` when its union differs from the sources; returns whether it changed."""
    old = path.read_text()
    new = render(old, codes())
    if new != old:
        path.write_text(new)
    return new != old


if __name__ == "__main__":
    changed = refresh()
    print(f"{DTS.relative_to(ROOT)}: {'rewritten' if changed else 'up to date'} "
          f"({len(codes())} codes)")
    sys.exit(0)
