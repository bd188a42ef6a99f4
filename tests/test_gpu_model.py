"""The GPU forward (pyspec/gpu/model.py) on a tiny random model: it agrees with the numpy
reference, and it is batch-invariant as a whole: row i of a pass over m tokens is bit-identical
to a one-token pass at that position, whatever m and however the cache was filled."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from conftest import requires_gpu

pytestmark = requires_gpu

# |gpu - cpu| <= ATOL + RTOL * |cpu|: float32 on both sides, different summation orders.
ATOL, RTOL = 1e-4, 1e-4


@pytest.fixture(scope="module")
def gpu(tiny):
    return tiny.on("gpu")


def test_forward_matches_the_reference(tiny, gpu):
    tokens = tiny.prompt[:16]
    gpu.limit_context(None)
    got = asyncio.run(gpu.read_logits(tokens, 0))                       # (16, vocab)
    ref = tiny.champion.forward(tokens, tiny.champion.new_cache())      # (16, vocab)
    assert np.all(np.abs(got - ref) <= ATOL + RTOL * np.abs(ref))


@pytest.mark.parametrize("m", [1, 2, 5, 9, 16])
def test_whole_forward_is_batch_invariant(tiny, gpu, m):
    """After a prefix of 7 tokens, one pass over m tokens vs m one-token passes."""
    prefix, block = tiny.prompt[:7], tiny.prompt[7:7 + m]
    assert len(block) == m

    def run(chunks):
        gpu.limit_context(None)
        asyncio.run(gpu.read_logits(prefix, 0))
        gpu.kv.commit(len(prefix))
        rows = []
        for chunk in chunks:
            rows.append(asyncio.run(gpu.read_logits(chunk, 0)))
            gpu.kv.commit(len(chunk))
        return np.concatenate(rows)

    batched = run([block])
    single = run([[t] for t in block])
    assert batched.shape == single.shape == (m, tiny.champion.config.vocab_size)
    assert np.array_equal(batched.view(np.uint32), single.view(np.uint32))
