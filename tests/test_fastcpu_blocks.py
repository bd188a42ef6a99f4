"""Tests for pyspec/cpu/blocks.py: the fast CPU engine with weights kept in their block format.

- Logits bit-identical to float32 mode on tiny models of every block format pyspec reads (the
  embedding in the same format), for both row kernels, with chunks small enough that matrices
  hold several and a shorter last one, and the embedding's lookups cross chunks.
- Greedy speculative output equals champion-only output in block mode, and float32 mode's.
- The mode is chosen by the memory budget (forced in tests), and the bytes the model card
  counts for a block-format tensor are the bytes it takes.
Speed is measured in bench/results/cpu-blocks.json, never asserted here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pyspec.cpu import blocks, fastcpu
from pyspec.engine import Engine
from pyspec.errors import UsageError
from pyspec.formats import quant
from pyspec.formats.gguf import GGUFFile
from pyspec.load import backend as backend_for
from pyspec.options import Options
from pyspec.testmodels import write_model

# (matrix type, embedding type, shape): K-quants need rows that are multiples of 256
FORMATS = [("Q4_0", "Q4_0", {}), ("Q4_1", "Q8_0", {}), ("Q5_0", "Q5_0", {}),
           ("Q5_1", "Q5_1", {}), ("Q8_0", "Q8_0", {}), ("F16", "F16", {}), ("BF16", "BF16", {}),
           ("Q4_K", "Q4_K", {"d": 256, "d_ff": 512}), ("Q5_K", "Q5_K", {"d": 256, "d_ff": 512}),
           ("Q6_K", "Q6_K", {"d": 256, "d_ff": 512}), ("Q4_K_M", "Q4_K_M", {"d": 256, "d_ff": 512})]


@pytest.fixture
def small_chunks(monkeypatch):
    """Blocks (and chunks) of 48 rows for both kernels: the tiny vocabulary (and d_ff 128) is
    not a multiple, so the last chunk is short."""
    for kernel in fastcpu.KERNELS:
        monkeypatch.setitem(fastcpu.BLOCK_ROWS, kernel, 48)


def type_of(name: str) -> int | str:
    """write_model's type argument: a ggml type id, or the "Q4_K_M" mix by name."""
    return name if name == "Q4_K_M" else quant.BY_NAME[name].type_id


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32)


@pytest.mark.parametrize("kernel", fastcpu.KERNELS)
@pytest.mark.parametrize("matrix,embd,shape", FORMATS, ids=[f[0] for f in FORMATS])
def test_logits_bit_identical_to_float32(tmp_path, small_chunks, matrix, embd, shape, kernel):
    path = tmp_path / "tiny.gguf"
    write_model(path, seed=4, n_layers=1, matrix_type=type_of(matrix), embd_type=type_of(embd),
                **shape)
    f32 = fastcpu.FastModel.load(path, kernel, "float32")
    blk = fastcpu.FastModel.load(path, kernel, "blocks")
    assert isinstance(blk.layers[0]["ffn_down"], blocks.BlockMatrix)
    assert blk.layers[0]["ffn_down"].n_chunks > 1 and blk.head.n_chunks > 2
    assert blk.weight_bytes < f32.weight_bytes
    tokens = np.random.default_rng(5).integers(0, f32.config.vocab_size, 20).tolist()
    kv32, kvb = f32.new_cache(32), blk.new_cache(32)
    assert np.array_equal(bits(blk.forward(tokens, kvb)), bits(f32.forward(tokens, kv32)))
    kv32.commit(20), kvb.commit(20)
    assert np.array_equal(bits(blk.forward([3], kvb)), bits(f32.forward([3], kv32)))


def test_rows_of_a_block_matrix_are_the_dequantized_rows(tmp_path, small_chunks):
    """The embedding's lookup (any ids, repeated, across chunks) and every chunk equal
    quant.dequantize's rows bit for bit."""
    path = tmp_path / "tiny.gguf"
    write_model(path, seed=2)
    model = fastcpu.FastModel.load(path, "blas", "blocks")
    want = model.file.dequantize("token_embd.weight")                     # (vocab, d)
    ids = [0, 47, 48, 200, 47, want.shape[0] - 1]
    assert np.array_equal(bits(model.tok_embd[ids]), bits(want[ids]))
    w = model.tok_embd
    out, nibbles = w.scratch()
    whole = np.concatenate([w.chunk(c, out, nibbles).copy() for c in range(w.n_chunks)])
    assert np.array_equal(bits(whole), bits(want))


def test_greedy_speculative_equals_champion_only_in_block_mode(tiny, small_chunks):
    fast = fastcpu.FastModel.load(tiny.champion_path, weights="blocks")
    f32 = fastcpu.FastModel.load(tiny.champion_path, weights="float32")
    opts = dict(max_tokens=24, stop_at_eos=False)
    reference = Engine(backend_for(f32, "none"), tiny.tokenizer).generate(
        tiny.prompt, Options(**opts)).tokens
    for draft in ("none", "ngram", "self:1"):
        engine = Engine(backend_for(fast, draft), tiny.tokenizer)
        for k in ("fixed:0", "fixed:3", "heuristic"):
            r = engine.generate(tiny.prompt, Options(k=k, **opts))
            assert r.tokens == reference, f"draft {draft}, {k}"


def test_the_mode_follows_the_memory_budget(tmp_path, monkeypatch):
    path = tmp_path / "tiny.gguf"
    write_model(path, seed=1)
    params = sum(math.prod(t.shape) for t in GGUFFile.open(path).tensors.values())
    monkeypatch.setattr(blocks, "float32_budget", lambda file_bytes: 4 * params - 1)
    assert fastcpu.FastModel.load(path).weights == "blocks"
    monkeypatch.setattr(blocks, "float32_budget", lambda file_bytes: 4 * params)
    assert fastcpu.FastModel.load(path).weights == "float32"
    with pytest.raises(UsageError, match="weights"):
        fastcpu.FastModel.load(path, weights="int4")


def test_the_budget_natively_and_in_the_page():
    assert blocks.float32_budget(1000, page=True) == (blocks.WASM_HEAP_BYTES
                                                      - blocks.PAGE_RUNTIME_BYTES - 1000)
    host = blocks.memory_host()
    assert blocks.float32_budget(1000, page=False) == (
        None if host is None else int(blocks.HOST_FRACTION * host))
    assert blocks.weights_mode(10, None) == "float32"
    assert blocks.weights_mode(10, 40) == "float32" and blocks.weights_mode(10, 39) == "blocks"


@pytest.mark.parametrize("fmt", [f for f in quant.FORMATS.values() if f is not quant.F32])
def test_the_cards_bytes_are_the_bytes_taken(fmt):
    n_out, n_in = 96, 512
    raw = quant.quantize(np.random.default_rng(3).standard_normal((n_out, n_in)), fmt.type_id)
    w = blocks.BlockMatrix(raw, fmt, (n_out, n_in), 32)
    assert w.nbytes == blocks.packed_bytes(fmt, n_out * n_in)
