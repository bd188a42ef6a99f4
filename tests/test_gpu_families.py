"""The GPU forward (pyspec/gpu/model.py) of each model family on a tiny random model of that
family, on a native adapter: its logits and KV cache agree with the numpy reference
(pyspec/cpu/model.py), it is batch-invariant as a whole, its plan has the dispatches per layer
model.dispatches_per_layer says (a Llama keeps 5 on a GPU: 152 for the 30-layer champion), and
greedy speculative output equals champion-only output on the GPU; and every family in every
format against llama.cpp's golden logits, by tests/test_family_goldens.py's rule.

The families' tiny models are testmodels.write_family_model's (in Q8_0): llama with Llama 3's rope
frequency factors, qwen2 (Q/K/V biases, NEOX pairs), qwen3 (per-head Q/K norms, a head size that
is not width / heads) and gemma3 (embedding scale, post-norms, GELU gate, sliding-window layers
with their own rope base).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from conftest import gpu_device, requires_gpu
from test_family_goldens import MODELS as GOLDEN_MODELS
from test_family_goldens import assert_matches_llama_cpp
from pyspec import testmodels
from pyspec.cpu.model import Model
from pyspec.engine import Engine
from pyspec.formats import quant
from pyspec.formats.gguf import GGUFFile
from pyspec.gpu.device import ROWS_MAX
from pyspec.gpu import load_model, weights
from pyspec.gpu.model import dispatches_per_layer
from pyspec.load import backend
from pyspec.options import Options
from pyspec.text.tokenizer import Tokenizer

pytestmark = requires_gpu

# |gpu - cpu| <= ATOL + RTOL * |cpu|: float32 on both sides, different summation orders.
ATOL, RTOL = 1e-4, 1e-4


@pytest.fixture(scope="module", params=list(testmodels.FAMILY_SHAPES))
def family(request, tmp_path_factory):
    """(arch, numpy Model, GPUModel, tokenizer, prompt ids) of one family's tiny model
    (testmodels.FAMILY_SHAPES) in Q8_0."""
    arch = request.param
    path = tmp_path_factory.mktemp(f"family_{arch}") / f"{arch}.gguf"
    testmodels.write_family_model(path, arch, matrix_type=quant.Q8_0.type_id)
    f = GGUFFile.open(path)
    tok = Tokenizer.from_metadata(f.metadata)
    prompt = tok.encode(testmodels.CORPUS * 2)[-40:]   # repeats, for the n-gram draft
    return arch, Model(f), load_model(gpu_device(), f), tok, prompt


@pytest.fixture(params=["software", "gpu"])
def kernels(request, family, monkeypatch):
    """The plan a software adapter runs (norms as passes, one lane a product) or a GPU's (norms
    folded into the products, lanes split): both on this adapter, plans rebuilt for each."""
    gpu = family[2]
    monkeypatch.setattr(gpu.dev, "is_cpu", request.param == "software")
    gpu.forget_plans()
    yield request.param
    gpu.forget_plans()


def test_forward_and_cache_match_the_reference(family, kernels):
    arch, cpu, gpu, _, prompt = family
    tokens = prompt[:16]
    gpu.limit_context(None)
    got = asyncio.run(gpu.read_logits(tokens, 0))                       # (16, vocab)
    kv = cpu.new_cache()
    ref = cpu.forward(tokens, kv)                                       # (16, vocab)
    assert np.all(np.abs(got - ref) <= ATOL + RTOL * np.abs(ref)), arch
    k, v = asyncio.run(gpu.read_kv(len(tokens)))          # (n_layers, 16, n_kv, hd), file order
    for got_kv, ref_kv in ((k, kv.k[:, :len(tokens)]), (v, kv.v[:, :len(tokens)])):
        assert np.all(np.abs(got_kv - ref_kv) <= ATOL + RTOL * np.abs(ref_kv)), arch


def test_whole_forward_is_batch_invariant(family, kernels):
    """After a prefix of 5 tokens (past gemma3's window), one 7-token pass vs 7 one-token
    passes, bit for bit."""
    _, _, gpu, _, prompt = family
    prefix, block = prompt[:5], prompt[5:12]

    def run(chunks):
        gpu.limit_context(None)
        asyncio.run(gpu.read_logits(prefix, 0))
        gpu.kv.commit(len(prefix))
        rows = []
        for chunk in chunks:
            rows.append(asyncio.run(gpu.read_logits(chunk, 0)))
            gpu.kv.commit(len(chunk))
        return np.concatenate(rows)

    assert np.array_equal(run([block]).view(np.uint32), run([[t] for t in block]).view(np.uint32))


def test_dispatches_per_layer(family, monkeypatch):
    """A plan is the embedding, dispatches_per_layer per layer and the head, on a software
    adapter and (plans built, not run) a GPU's: 5 a layer for llama and qwen2 there, so the
    30-layer champion keeps its 152."""
    arch, _, gpu, _, _ = family
    cfg = gpu.config
    want = {"llama": 5, "qwen2": 5, "qwen3": 6, "gemma3": 8}[arch]
    assert dispatches_per_layer(cfg, False) == want
    for cpu_adapter in (True, False):
        monkeypatch.setattr(gpu.dev, "is_cpu", cpu_adapter)
        plan = gpu._plan(0, cfg.n_layers, gpu.tokens, True, tree=False)
        per_layer = dispatches_per_layer(cfg, cpu_adapter)
        assert len(plan) == 1 + cfg.n_layers * per_layer + 1 + cpu_adapter
    if arch == "llama":
        assert 1 + 30 * dispatches_per_layer(cfg, False) + 1 == 152


@pytest.mark.parametrize("draft", ["ngram", "self:1"])
def test_greedy_speculative_equals_champion_only(family, draft):
    """Drafts of an n-gram table and of the family's own first layer (self:1, on the GPU too)
    verified by the family's champion on the GPU give the champion-only tokens, byte for byte."""
    _, _, gpu, tok, prompt = family
    opts = dict(max_tokens=12, stop_at_eos=False)
    base = Engine(backend(gpu, "none"), tok).generate(prompt, Options(**opts))
    spec = Engine(backend(gpu, draft), tok).generate(prompt, Options(k="fixed:2", **opts))
    assert len(base.tokens) == 12
    assert spec.tokens == base.tokens
    assert spec.stats["drafted"] > 0, "no draft was proposed: the comparison is vacuous"


def test_vocabulary_split_by_rows(family, monkeypatch):
    """On a device that binds less than the embedding and head (as lavapipe's 128 MiB binds less
    than a 262,144-token head), they go up in parts of rows and their passes take a dispatch per
    part: the logits are bit-identical to the whole tables' on a software adapter (each output
    is the same dot product; on a GPU a part's lanes may differ, ops._lanes) and the plan grows
    by the extra parts only."""
    arch, _, gpu, _, prompt = family
    if not gpu.dev.is_cpu:
        pytest.skip("bit-identical only where each output is one thread's (a software adapter)")
    cfg = gpu.config
    row_bytes = gpu.head.nbytes // cfg.vocab_size
    limit = 2 * weights.PART_ROWS * row_bytes - 1              # parts of PART_ROWS rows
    upload_rows = weights.upload_rows

    def small_binding(dev, f, name):
        """upload_rows on a device that binds `limit` bytes (the other tensors as they are)."""
        with monkeypatch.context() as m:
            m.setitem(dev.limits, "max-storage-buffer-binding-size", limit)
            return upload_rows(dev, f, name)

    monkeypatch.setattr(weights, "upload_rows", small_binding)
    split = load_model(gpu.dev, gpu.file)
    n = len(split.head.parts)
    assert n > 1 and len(split.tok_embd.parts) == n
    assert all(w.nbytes <= limit and first % weights.PART_ROWS == 0
               for first, w in split.head.parts)
    assert len(split.forward_dispatches(0)) == len(gpu.forward_dispatches(0)) + 2 * (n - 1)
    tokens = prompt[:ROWS_MAX]
    for model in (gpu, split):
        model.limit_context(None)
    whole = asyncio.run(gpu.read_logits(tokens, 0))
    parts = asyncio.run(split.read_logits(tokens, 0))
    assert np.array_equal(whole.view(np.uint32), parts.view(np.uint32)), arch


@pytest.mark.parametrize("m", GOLDEN_MODELS, ids=lambda m: f"{m['arch']}-{m['format']}")
def test_logits_match_llama_cpp(m, tmp_path):
    """The GPU forward over prompt + continuation (ROWS_MAX rows a pass) against llama.cpp."""
    path = tmp_path / "m.gguf"
    testmodels.write_family_format(path, m["arch"], m["format"], seed=m["seed"])
    f = GGUFFile.open(path)
    assert f.sha256() == m["model_sha256"]
    gpu = load_model(gpu_device(), f)
    gpu.limit_context(None)
    ids = m["prompt_ids"] + m["continuation_ids"][:-1]
    logits = np.concatenate([asyncio.run(gpu.read_logits(ids[i:i + ROWS_MAX], 0))
                             for i in range(0, len(ids), ROWS_MAX)])         # (len(ids), vocab)
    assert_matches_llama_cpp(logits, m)
