"""webtools/errorcodes.py: client.d.ts's SpecErrorCode union is exactly the codes raised in
pyspec/ and web/, and the reader of the sources finds every kind of raise (checked against the
classes Python itself knows and against codes named in docs/faults.md)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import pyspec
from pyspec.errors import PyspecError
from webtools import errorcodes

ROOT = Path(__file__).resolve().parent.parent


def dts_union(text: str) -> list[str]:
    block = text.split(errorcodes.BEGIN)[1].split(errorcodes.END)[0]
    return re.findall(r'\| "([a-z_]+)"', block)


def test_client_dts_union_equals_the_codes_in_the_sources():
    assert dts_union(errorcodes.DTS.read_text()) == errorcodes.codes(), (
        "web/client.d.ts is stale: run `python -m webtools.errorcodes` (or python3 build.py site)")


def test_every_kind_of_raise_is_read():
    """One code from each form the reader knows: a class attribute (and the base's `internal`),
    web.py's SessionError, worker.js's WorkerError and its reply for an exception with no code,
    client.js's SpecError. A refactor that hides one from the reader fails here."""
    found = set(errorcodes.codes())
    assert {"internal", "prompt_too_long", "incompatible_draft"} <= found     # class attributes
    assert {"not_ready", "bad_request"} <= found                              # SessionError(...)
    assert {"download_failed", "corrupt_download", "unknown_model"} <= found  # WorkerError
    assert {"fatal"} <= found                                                 # worker's reply
    assert {"worker_died", "terminated"} <= found                             # client's SpecError


def _subclasses(cls) -> set[type]:
    out = set(cls.__subclasses__())
    for sub in list(out):
        out |= _subclasses(sub)
    return out


def test_every_pyspec_error_class_code_is_in_the_union():
    """The oracle is Python itself: import every pyspec module and walk PyspecError's subclasses."""
    for mod in pkgutil.walk_packages(pyspec.__path__, "pyspec."):
        if mod.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(mod.name)
        except ImportError:      # a module for another platform (Pyodide's js)
            continue
    codes = {c.code for c in _subclasses(PyspecError) | {PyspecError} if isinstance(c.code, str)}
    assert len(codes) >= 8
    assert codes <= set(errorcodes.codes())


def test_codes_the_docs_name_exist():
    page = (ROOT / "docs" / "faults.md").read_text()
    named = re.search(r"`SpecError` with a `code` \(([^)]*)\)", page)
    assert named, "docs/faults.md's sentence naming the SpecError codes moved"
    assert set(re.findall(r"`([a-z_]+)`", named.group(1))) <= set(errorcodes.codes())


def test_render_replaces_only_the_union_and_needs_its_markers():
    text = "head\n" + errorcodes.BEGIN + 'export type SpecErrorCode =\n  | "x";\n' + errorcodes.END
    out = errorcodes.render(text + "tail\n", ["a", "b"])
    assert out.startswith("head\n") and out.endswith(errorcodes.END + "tail\n")
    assert dts_union(out) == ["a", "b"]
    with pytest.raises(ValueError, match="markers"):
        errorcodes.render("no markers", ["a"])
