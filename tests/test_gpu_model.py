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


def test_prefill_without_the_head_fills_the_same_cache(tiny, gpu):
    """prefill leaves the head out; its cache rows are bit-identical to those of passes that
    compute logits."""
    from pyspec.gpu.device import ROWS_MAX

    body = tiny.prompt[:-1]
    gpu.prefill(tiny.prompt, 0)
    with_prefill = asyncio.run(gpu.read_kv(len(body)))
    gpu.kv.truncate(0)
    for i in range(0, len(body), ROWS_MAX):
        asyncio.run(gpu.read_logits(body[i:i + ROWS_MAX], 0))
        gpu.kv.commit(len(body[i:i + ROWS_MAX]))
    with_logits = asyncio.run(gpu.read_kv(len(body)))
    assert len(body) > ROWS_MAX       # more than one tile
    for a, b in zip(with_prefill, with_logits):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


# --- long contexts: attention split over ~1000 positions ------------------------------------

LONG = 1000   # cache rows before the pass: past every split attention makes (ops.attention)


@pytest.fixture(scope="module")
def long_file(tmp_path_factory):
    """The tiny champion's weights with 2048 positions, and a numpy Model of it."""
    from pyspec import testmodels
    from pyspec.cpu.model import Model

    path = tmp_path_factory.mktemp("long") / "champion-2048.gguf"
    testmodels.write_model(path, seed=1, ctx=2048)
    return path, Model.load(path)


@pytest.mark.parametrize("kernels", ["gpu", "cpu"])
def test_long_context_forward(long_file, kernels):
    """A pass at positions LONG.. after a LONG-token prefill, with the kernels a GPU runs and the
    ones a software adapter runs (the adapter kind picks attention's entry point and the
    products' split): it agrees with the reference, and each of its rows is bit-identical to a
    one-token pass at that position."""
    from pyspec.formats.gguf import GGUFFile
    from pyspec.gpu import load_model, native

    path, ref_model = long_file
    dev = native.NativeDevice()
    dev.is_cpu = kernels == "cpu"
    model = load_model(dev, GGUFFile.open(path))
    vocab = ref_model.config.vocab_size
    tokens = [(31 * i + 7) % vocab for i in range(LONG + 16)]
    ref = ref_model.forward(tokens, ref_model.new_cache())[LONG:]          # (16, vocab)

    def run(chunks):
        model.prefill(tokens[:LONG + 1], 0)         # the cache holds LONG rows
        rows = []
        for chunk in chunks:
            rows.append(asyncio.run(model.read_logits(chunk, 0)))
            model.kv.commit(len(chunk))
        return np.concatenate(rows)

    batched = run([tokens[LONG:]])
    assert np.all(np.abs(batched - ref) <= ATOL + RTOL * np.abs(ref))
    single = run([[t] for t in tokens[LONG:]])
    assert np.array_equal(batched.view(np.uint32), single.view(np.uint32))
    dev.destroy()
