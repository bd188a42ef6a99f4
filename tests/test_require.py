"""PYSPEC_REQUIRE (the root conftest.py): a missing part fails when required, else skips."""

from __future__ import annotations

import pytest


def test_a_missing_part_skips_unless_required(need, monkeypatch):
    monkeypatch.delenv("PYSPEC_REQUIRE", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no adapter"):
        need("gpu", "no adapter")
    monkeypatch.setenv("PYSPEC_REQUIRE", "browser")
    with pytest.raises(pytest.skip.Exception):
        need("gpu", "no adapter")
    with pytest.raises(pytest.fail.Exception, match="no chromium.*requires 'browser'"):
        need("browser", "no chromium")
    monkeypatch.setenv("PYSPEC_REQUIRE", " gpu , browser ")
    with pytest.raises(pytest.fail.Exception):
        need("gpu", "no adapter")


def test_an_unknown_part_is_an_error(need, monkeypatch):
    monkeypatch.setenv("PYSPEC_REQUIRE", "gpu,cuda")
    with pytest.raises(pytest.UsageError, match="cuda"):
        need("gpu", "no adapter")
    monkeypatch.delenv("PYSPEC_REQUIRE")
    with pytest.raises(ValueError):
        need("tpu", "no such part")
