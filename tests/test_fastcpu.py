"""Tests for pyspec/cpu/fastcpu.py: the row-at-a-time CPU engine keeps model.py's contracts.

- Batch invariance (DESIGN §1), bit for bit, for both row kernels, on tiny shapes and on the real
  champion (rows 1..17 against one-token passes: model.py's check).
- KV transactions: committed rows equal a fresh run's after any append / commit / rollback mix.
- Against the float64 reference path (model.Model, dtype float64, an oracle sharing no product
  code): logits within atol + rtol*|ref|, and the argmax equal wherever float64's top-2 margin is
  clear. The engine-level exactness tests (greedy speculative == champion-only, replay, rejection
  distribution) run on it through the "fastcpu" backend of tests/conftest.py.
Speed is measured in bench/results, never asserted here.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_model import (
    check_against_fresh_run,
    check_batch_invariance,
    random_transactions,
)

from pyspec import champion_path
from pyspec.cpu import fastcpu
from pyspec.cpu.model import Model
from pyspec.errors import UsageError
from pyspec.testmodels import write_model

SHAPES = [dict(d=64, n_heads=4, n_kv=2, d_ff=128, n_layers=2),
          dict(d=96, n_heads=6, n_kv=3, d_ff=64, n_layers=3),
          dict(d=32, n_heads=2, n_kv=1, d_ff=96, n_layers=1)]


@pytest.fixture(scope="module")
def champion_fast() -> fastcpu.FastModel:
    return fastcpu.FastModel.load(champion_path())


@pytest.mark.parametrize("kernel", fastcpu.KERNELS)
@pytest.mark.parametrize("shape", SHAPES)
def test_batch_invariance_tiny(tmp_path, shape, kernel):
    path = tmp_path / "tiny.gguf"
    write_model(path, seed=7, **shape)
    model = fastcpu.FastModel.load(path, kernel)
    tokens = np.random.default_rng(1).integers(0, model.config.vocab_size, 40).tolist()
    check_batch_invariance(model, tokens, starts=(0, 3, 13))


@pytest.mark.parametrize("kernel", fastcpu.KERNELS)
def test_blocks_keep_invariance(tmp_path, monkeypatch, kernel):
    """Matrices wider than a block are computed in blocks (the last one shorter): still
    invariant."""
    monkeypatch.setitem(fastcpu.BLOCK_ROWS, kernel, 48)  # the tiny vocabulary is not a multiple
    path = tmp_path / "tiny.gguf"
    write_model(path, seed=5, **SHAPES[0])
    model = fastcpu.FastModel.load(path, kernel)
    assert model.config.vocab_size % 48
    tokens = np.random.default_rng(2).integers(0, model.config.vocab_size, 30).tolist()
    check_batch_invariance(model, tokens, starts=(0, 4))


@pytest.mark.champion
def test_batch_invariance_champion(champion_fast):
    tokens = np.random.default_rng(3).integers(0, champion_fast.config.vocab_size, 60).tolist()
    check_batch_invariance(champion_fast, tokens, starts=(0, 29))


@pytest.mark.parametrize("kernel", fastcpu.KERNELS)
def test_kv_transactions(tmp_path, kernel):
    path = tmp_path / "tiny.gguf"
    write_model(path, seed=3, **SHAPES[0])
    model = fastcpu.FastModel.load(path, kernel)
    for seed in range(2):
        kv, committed, logits = random_transactions(model, np.random.default_rng(seed), 25, 200)
        assert len(committed) > 10
        check_against_fresh_run(model, kv, committed, logits)


@pytest.mark.parametrize("kernel", fastcpu.KERNELS)
def test_close_to_float64(tmp_path, kernel):
    """Row products reorder float32 sums, nothing more: within 1e-4 + 1e-3 * |ref| of float64."""
    path = tmp_path / "tiny.gguf"
    write_model(path, seed=11, **SHAPES[1])
    exact = Model.load(path, np.float64)
    model = fastcpu.FastModel.load(path, kernel)
    tokens = np.random.default_rng(4).integers(0, model.config.vocab_size, 24).tolist()
    ref = exact.forward(tokens, exact.new_cache(32))                     # (24, vocab) float64
    got = model.forward(tokens, model.new_cache(32))                     # (24, vocab) float32
    assert got.dtype == np.float32
    assert np.all(np.abs(got - ref) <= 1e-4 + 1e-3 * np.abs(ref)), np.abs(got - ref).max()
    part = np.partition(ref, -2, axis=-1)
    clear = part[:, -1] - part[:, -2] > 1e-3
    assert np.array_equal(got.argmax(-1)[clear], ref.argmax(-1)[clear])


@pytest.mark.champion
def test_champion_close_to_the_reference(champion_fast):
    """The champion's logits on both engines agree to float32 noise (the reference's tiles and
    the rows here sum in different orders)."""
    ref_model = Model(champion_fast.file)
    tokens = np.random.default_rng(5).integers(0, champion_fast.config.vocab_size, 12).tolist()
    ref = ref_model.forward(tokens, ref_model.new_cache(16))
    got = champion_fast.forward(tokens, champion_fast.new_cache(16))
    assert np.all(np.abs(got - ref) <= 1e-2 + 1e-3 * np.abs(ref)), np.abs(got - ref).max()


def test_kernel_choice(monkeypatch):
    monkeypatch.delenv("PYSPEC_CPU_KERNEL", raising=False)
    assert fastcpu.choose_kernel() == ("blas" if fastcpu.numpy_has_blas() else "einsum")
    monkeypatch.setenv("PYSPEC_CPU_KERNEL", "einsum")
    assert fastcpu.choose_kernel() == "einsum"
    monkeypatch.setenv("PYSPEC_CPU_KERNEL", "cublas")
    with pytest.raises(UsageError, match="PYSPEC_CPU_KERNEL") as e:
        fastcpu.choose_kernel()
    assert e.value.code == "bad_config"


def test_one_blas_thread_restores_the_count():
    if fastcpu._THREADS is None:
        pytest.skip("no bundled OpenBLAS to set (a numpy without BLAS or a system one)")
    get, _ = fastcpu._THREADS
    before = get()
    with fastcpu.one_blas_thread():
        assert get() == 1
    assert get() == before


def test_rope_tables_equal_model_rope(tmp_path):
    """The looked-up cos / sin give Model.rope's values bit for bit, at positions past the first
    table (it grows) and in any order."""
    path = tmp_path / "tiny.gguf"
    write_model(path, seed=2, **SHAPES[0])
    fast, ref = fastcpu.FastModel.load(path), Model.load(path)
    x = np.random.default_rng(6).standard_normal((5, 4, 16)).astype(np.float32)
    for positions in ([0, 1, 2, 3, 4], [300, 7, 255, 256, 1000]):
        positions = np.array(positions)
        assert np.array_equal(fast.rope(x, positions), ref.rope(x, positions))
