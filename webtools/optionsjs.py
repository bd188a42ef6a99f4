"""web/options.js, written from pyspec/options.py's REQUEST: each request option's JavaScript
types (`typeof` names), default and OpenAI name, which client.js's facade reads. Like
errorcodes.py: `python -m webtools.optionsjs` and `build.py site` rewrite it when it is stale,
and tests/test_options.py fails while it is.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyspec.options import REQUEST

ROOT = Path(__file__).resolve().parent.parent
JS = ROOT / "web" / "options.js"
_TYPES = {int: "number", float: "number", str: "string", list: "object", dict: "object",
          bool: "boolean"}


def render() -> str:
    rows = []
    for o in REQUEST:
        default = list(o.default) if isinstance(o.default, tuple) else o.default
        spec = {"types": list(dict.fromkeys(_TYPES[t] for t in o.types)), "default": default,
                "openai": o.openai}
        rows.append(f"  {o.name}: {json.dumps(spec)},\n")
    return ("// The request options of pyspec/options.py REQUEST (types as typeof names), written "
            "by\n// webtools/optionsjs.py; do not edit (tests/test_options.py checks it).\n"
            "export const REQUEST_OPTIONS = {\n" + "".join(rows) + "};\n")


def refresh(path: Path = JS) -> bool:
    """Rewrite `path` when it differs from REQUEST; returns whether it changed."""
    new = render()
    changed = not path.exists() or path.read_text() != new
    if changed:
        path.write_text(new)
    return changed


if __name__ == "__main__":
    print(f"{JS.relative_to(ROOT)}: {'rewritten' if refresh() else 'up to date'}")
    sys.exit(0)
