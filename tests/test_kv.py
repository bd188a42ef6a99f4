"""KV cache transactions and byte accounting (pyspec/kv.py). Model-level checks that committed
rows equal a fresh run live in test_model.py and test_engine.py."""

from __future__ import annotations

import pytest

from pyspec.kv import ContextOverflowError, KVCache


def test_append_commit_rollback():
    kv = KVCache(n_layers=2, max_ctx=10, n_kv_heads=1, head_dim=4)
    assert kv.append(3) == 0 and kv.length == 3
    kv.commit(3)
    assert kv.append(4) == 3 and kv.append(2) == 7      # draft steps append in a row
    assert (kv.committed, kv.pending) == (3, 6)
    kv.commit(2)                                         # keep the first two pending rows
    assert (kv.committed, kv.pending, kv.length) == (5, 0, 5)
    kv.append(1)
    kv.rollback()
    assert kv.length == 5 and kv.peak == 9
    with pytest.raises(ValueError):
        kv.commit(1)                                     # nothing pending
    kv.truncate(0)
    assert kv.length == 0


def test_overflow_is_a_clear_error():
    kv = KVCache(n_layers=1, max_ctx=4, n_kv_heads=1, head_dim=2)
    kv.append(4)
    with pytest.raises(ContextOverflowError, match="context holds 4"):
        kv.append(1)


def test_byte_accounting():
    kv = KVCache(n_layers=3, max_ctx=100, n_kv_heads=2, head_dim=8)
    assert kv.nbytes == 2 * 3 * 100 * 2 * 8 * 4
    kv.append(25)
    assert kv.peak_bytes == kv.nbytes // 4
