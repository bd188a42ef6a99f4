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


def test_missing_llama_cpp_fixtures_fail_when_required(need_llama, monkeypatch, tmp_path):
    """The oracle cannot vanish quietly: without llama.cpp's files (setup did not unpack them)
    the tokenizer and template tests skip on a laptop and fail under PYSPEC_REQUIRE=llama, which
    .ci/run sets."""
    import pathlib

    monkeypatch.delenv("PYSPEC_REQUIRE", raising=False)
    with pytest.raises(pytest.skip.Exception, match="build.py setup"):
        need_llama(tmp_path)
    monkeypatch.setenv("PYSPEC_REQUIRE", "gpu,browser,llama")
    with pytest.raises(pytest.fail.Exception, match="not in .*requires 'llama'"):
        need_llama(tmp_path)
    ci = (pathlib.Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    assert "export PYSPEC_REQUIRE=gpu,browser,llama\n" in ci
    (tmp_path / "ggml-vocab-gpt-2.gguf").write_bytes(b"")
    assert need_llama(tmp_path) == tmp_path
