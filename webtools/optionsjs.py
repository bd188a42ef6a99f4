"""web/options.js, written from pyspec/options.py's REQUEST: each request option's JavaScript
types (`typeof` names), default and OpenAI name, which client.js's facade reads. Like
errorcodes.py: `python -m webtools.optionsjs` and `build.py site` rewrite it when it is stale,
and tests/test_options.py fails while it is.

Also docs/embedding.md's table of generate()'s options (`docs_table`, between its
`<!-- generate options -->` markers): `python -m webtools.optionsjs` rewrites it, and
tests/test_docs.py fails while it is stale.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from pyspec.options import REQUEST

ROOT = Path(__file__).resolve().parent.parent
JS = ROOT / "web" / "options.js"
DOCS = ROOT / "docs" / "embedding.md"
MARKER = "generate options"
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


_DOC_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list",
              dict: "object"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def docs_table() -> str:
    """The markdown table of generate()'s options: name, type, default, values, the name
    chat.completions.create takes it by, and what it does."""
    rows = ["| option | type | default | values | OpenAI name | what it does |",
            "|---|---|---|---|---|---|"]
    for o in REQUEST:
        types = "number" if float in o.types else " or ".join(_DOC_TYPES[t] for t in o.types)
        default = list(o.default) if isinstance(o.default, tuple) else o.default
        values = ", ".join(f"`{c}`" for c in o.choices) if o.choices else _cell(o.range) or " "
        openai = f"`{o.openai}`" if o.openai else "-"
        rows.append(f"| `{o.name}` | {types} | `{json.dumps(default)}` | {values} | {openai} | "
                    f"{_cell(o.api or o.help)} |")
    return "\n".join(rows) + "\n"


def refresh_docs(path: Path = DOCS) -> bool:
    """Rewrite the table in `path` when it differs; returns whether it changed."""
    text = path.read_text()
    pattern = re.compile(rf"(<!-- {MARKER}[^>]*-->\n)(.*?)(<!-- /{MARKER} -->)", re.S)
    new = pattern.sub(lambda m: m[1] + docs_table() + m[3], text)
    if new != text:
        path.write_text(new)
    return new != text


def refresh(path: Path = JS) -> bool:
    """Rewrite `path` when it differs from REQUEST; returns whether it changed."""
    new = render()
    changed = not path.exists() or path.read_text() != new
    if changed:
        path.write_text(new)
    return changed


if __name__ == "__main__":
    print(f"{JS.relative_to(ROOT)}: {'rewritten' if refresh() else 'up to date'}")
    print(f"{DOCS.relative_to(ROOT)}: {'rewritten' if refresh_docs() else 'up to date'}")
    sys.exit(0)
