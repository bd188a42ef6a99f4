"""Tests for pyspec/cpu/memory.py: the CPU engine's memory budget and the refusal of a model whose
float32 weights exceed it, with the largest parameter count that fits (the model card's rule is
tested in tests/test_info.py)."""

from __future__ import annotations

import math

import pytest

from pyspec.cpu import fastcpu, memory
from pyspec.errors import ModelTooLargeError
from pyspec.formats.gguf import GGUFFile
from pyspec.testmodels import write_model


def test_the_budget_natively_and_in_the_page(monkeypatch):
    # (the file is not in the page's heap: the worker streams it, web/stream.js)
    assert memory.float32_budget(page=True) == memory.WASM_HEAP_BYTES - memory.PAGE_RUNTIME_BYTES
    monkeypatch.setattr(memory, "memory_host", lambda: 8 << 30)
    assert memory.float32_budget(page=False) == 4 << 30
    monkeypatch.setattr(memory, "memory_host", lambda: None)
    assert memory.float32_budget(page=False) is None
    memory.check_fits(10**12, "any.gguf")   # no budget known: nothing refused


def test_a_model_over_the_budget_is_refused_with_the_largest_that_fits(tmp_path, monkeypatch):
    path = tmp_path / "tiny.gguf"
    write_model(path, seed=1)
    params = sum(math.prod(t.shape) for t in GGUFFile.open(path).tensors.values())
    monkeypatch.setattr(memory, "float32_budget", lambda: 4 * params)
    assert fastcpu.FastModel.load(path).config.n_layers == 2     # exactly at the budget: loads
    monkeypatch.setattr(memory, "float32_budget", lambda: 4 * params - 8)
    with pytest.raises(ModelTooLargeError) as e:
        fastcpu.FastModel.load(path)
    assert e.value.code == "model_too_large"
    assert f"the largest model it loads here has {(params - 2) / 1e6:,.0f}M parameters" in str(e.value)
    assert "tiny.gguf" in str(e.value) and "--backend wgpu" in str(e.value)
