"""Every block format on every backend: a tiny Llama GGUF whose matrices are in one format (or
in llama.cpp's Q4_K_M mix, formats/mixes.py) gives, on each CPU engine, bit for bit the logits of
the same model written as F32 with its weights dequantized (formats/quant.py, itself bit-exact
against the gguf package: tests/test_quant.py). So the engines take each format as its reference
dequantization and nothing else. On a GPU (weights kept in their formats: shaders/blocks.wgsl)
the whole forward agrees with the numpy reference within float32 reordering and is
batch-invariant; the products per format are tested in tests/test_gpu_ops.py.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from pyspec import testmodels
from pyspec.cpu import fastcpu
from pyspec.cpu.model import Model
from pyspec.formats import ggufwrite, quant
from pyspec.formats.gguf import GGUFFile

ATOL, RTOL = 1e-4, 1e-4   # |gpu - cpu| <= ATOL + RTOL |cpu| (tests/test_gpu_model.py's)

# name -> (write_model arguments, the formats the file must hold besides F32)
CASES = {
    "Q4_K_M.d256": (dict(d=256, d_ff=512, matrix_type="Q4_K_M"), {"Q4_K", "Q6_K"}),
    "Q4_K_M.d64": (dict(d=64, d_ff=128, matrix_type="Q4_K_M"), {"Q5_0", "Q8_0"}),
    "Q5_K": (dict(d=256, d_ff=256, matrix_type=quant.Q5_K.type_id,
                  embd_type=quant.Q5_K.type_id), {"Q5_K"}),
    "Q5_0": (dict(matrix_type=quant.Q5_0.type_id, embd_type=quant.Q5_1.type_id),
             {"Q5_0", "Q5_1"}),
    "BF16": (dict(matrix_type=quant.BF16.type_id, embd_type=quant.BF16.type_id), {"BF16"}),
}


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    """(the model in its formats, the same dequantized weights as F32)."""
    kwargs, formats = CASES[request.param]
    root = tmp_path_factory.mktemp("formats")
    path = root / "mixed.gguf"
    testmodels.write_model(path, seed=3, n_layers=2, n_heads=4, n_kv=2, **kwargs)
    f = GGUFFile.open(path)
    held = {f.tensors[n].format.name for n in f.tensors} - {"F32"}
    assert held == formats, held
    plain = root / "f32.gguf"
    ggufwrite.write(plain, f.metadata, {n: (f.dequantize(n), quant.F32.type_id) for n in f.tensors})
    return path, plain


@pytest.mark.parametrize("engine", ["numpy", *fastcpu.KERNELS])
def test_cpu_engines_take_each_format_as_its_dequantization(pair, engine):
    load = Model.load if engine == "numpy" else (lambda p: fastcpu.FastModel.load(p, engine))
    tokens = list(range(3, 40, 3))
    got, want = (load(p) for p in pair)
    a = got.forward(tokens, got.new_cache(32))
    b = want.forward(tokens, want.new_cache(32))
    assert a.shape == (len(tokens), got.config.vocab_size)
    assert np.array_equal(a, b) and np.isfinite(a).all()


@pytest.mark.usefixtures("gpu")
def test_gpu_forward_takes_each_format(pair):
    """Logits of 12 tokens in one pass vs numpy; then after 7 of them, one pass over 5 vs five
    one-token passes, bit for bit."""
    from conftest import gpu_device
    from pyspec.gpu import load_model

    path, _ = pair
    ref, gpu = Model.load(path), load_model(gpu_device(), GGUFFile.open(path), max_ctx=32)
    tokens = list(range(3, 39, 3))
    got = asyncio.run(gpu.read_logits(tokens, 0))
    want = ref.forward(tokens, ref.new_cache(32))
    assert np.all(np.abs(got - want) <= ATOL + RTOL * np.abs(want))

    def run(chunks):
        gpu.limit_context(None)
        asyncio.run(gpu.read_logits(tokens[:7], 0))
        gpu.kv.commit(7)
        rows = []
        for chunk in chunks:
            rows.append(asyncio.run(gpu.read_logits(chunk, 0)))
            gpu.kv.commit(len(chunk))
        return np.concatenate(rows)

    block = tokens[7:12]
    assert run([block]).tobytes() == run([[t] for t in block]).tobytes()
