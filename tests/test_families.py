"""The model families (cpu/model.py ARCHITECTURES: llama with Llama 3's rope factors, qwen2,
qwen3, gemma3) on the CPU engines, on tiny GGUFs written by pyspec/testmodels.py with each
family's real metadata keys and tensor names.

Judged here: the Config each family's metadata gives (the field names the GPU side shares), the
named errors for what pyspec does not run, batch invariance of both engines, the float32 path
against float64 on every clear step, and speculative output equal to champion-only output
(greedy and replay; n-gram and a smaller draft of the same family). llama.cpp's own logits for
these files are judged in tests/test_family_goldens.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import greedy_pick, reference_decode
from pyspec import testmodels
from pyspec.cpu.fastcpu import FastModel
from pyspec.cpu.model import ARCHITECTURES, Config, Model, ModelError
from pyspec.engine import Engine
from pyspec.formats import gguf
from pyspec.load import backend as backend_for
from pyspec.options import Options
from pyspec.rules import rng, verify
from pyspec.text.tokenizer import Tokenizer

FAMILIES = list(testmodels.FAMILY_SHAPES)
FORMATS = testmodels.FAMILY_FORMATS


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """(family, format) -> the path of its tiny model (seed 3), written once."""
    root, out = tmp_path_factory.mktemp("families"), {}
    for arch in FAMILIES:
        for fmt in FORMATS:
            out[arch, fmt] = str(root / f"{arch}-{fmt}.gguf")
            testmodels.write_family_format(out[arch, fmt], arch, fmt)
    return out


def prompt_ids(path) -> list[int]:
    """A chat prompt of ~40 tokens: longer than gemma3's 8-key window."""
    tok = Tokenizer.from_metadata(gguf.GGUFFile.open(path).metadata)
    return tok.encode(tok.render_chat([{"role": "user", "content":
                                        "the cat sat on the mat. the dog ate the bone."}]),
                      special=True)


def test_config_of_each_family(paths):
    cfgs = {arch: Model.load(paths[arch, "F32"]).config for arch in FAMILIES}
    assert set(ARCHITECTURES) == set(FAMILIES)
    assert [cfgs[a].rope_neox for a in FAMILIES] == [False, True, True, True]
    assert [cfgs[a].qkv_bias for a in FAMILIES] == [False, True, False, False]
    assert [cfgs[a].qk_norm for a in FAMILIES] == [False, False, True, True]
    assert [cfgs[a].post_norms for a in FAMILIES] == [False, False, False, True]
    assert [cfgs[a].act for a in FAMILIES] == ["silu", "silu", "silu", "gelu_tanh"]
    assert cfgs["qwen3"].head_dim == 32 and cfgs["qwen3"].d_model == 64
    g = cfgs["gemma3"]
    assert g.embed_scale == 8.0 and g.attn_scale == 1 / np.sqrt(32)
    assert g.sliding_window == 8 and g.swa_layers == (True, False, True, False)
    assert g.rope_base == 1e6 and g.rope_base_swa == 10000.0
    assert cfgs["llama"].swa_layers == (False, False) and cfgs["llama"].sliding_window == 0
    llama = Model.load(paths["llama", "F32"])
    assert llama.rope_freqs.shape == (8,) and llama.rope_freqs[-1] == 8


def test_gemma3_pattern_defaults_to_every_sixth_layer_global():
    md = testmodels.family_metadata("gemma3", n_layers=12, d=64, n_heads=4, n_kv=1, head_dim=32,
                                    d_ff=128)
    del md["gemma3.attention.sliding_window_pattern"]
    md["tokenizer.ggml.tokens"] = ["a"] * 10
    cfg = Config.from_metadata(md)
    assert [i for i, local in enumerate(cfg.swa_layers) if not local] == [5, 11]
    del md["gemma3.attention.sliding_window"]
    assert Config.from_metadata(md).swa_layers == (False,) * 12


def bad_metadata_cases():
    base = {"n_layers": 2, "d": 64, "n_heads": 4, "n_kv": 2, "head_dim": 32, "d_ff": 128}
    md = {**testmodels.family_metadata("qwen3", **base), "tokenizer.ggml.tokens": ["a"] * 10}
    yield {**md, "general.architecture": "phi3"}, "llama, qwen2, qwen3, gemma3"
    yield {k: v for k, v in md.items() if "rms_epsilon" not in k}, \
        "'qwen3.attention.layer_norm_rms_epsilon' is missing"
    no_len = {k: v for k, v in md.items() if "key_length" not in k}
    yield {**no_len, "qwen3.embedding_length": 66}, "'qwen3.attention.key_length' is missing"
    yield {**md, "qwen3.attention.value_length": 16}, "value_length"
    yield {**md, "qwen3.rope.scaling.type": "yarn"}, "'qwen3.rope.scaling.type'"
    yield {**md, "qwen3.rope.scaling.factor": 8.0}, "'qwen3.rope.scaling.factor'"
    g = {**testmodels.family_metadata("gemma3", **base), "tokenizer.ggml.tokens": ["a"] * 10}
    yield {**g, "gemma3.final_logit_softcapping": 30.0}, "final_logit_softcapping"
    yield {**g, "gemma3.attention.sliding_window_pattern": [True]}, "one bool per layer"


@pytest.mark.parametrize("md,words", list(bad_metadata_cases()))
def test_bad_metadata_is_a_named_error(md, words):
    with pytest.raises(ModelError, match=words.replace("(", r"\(")):
        Config.from_metadata(md)


@pytest.mark.parametrize("arch,name", [("llama", "blk.0.attn_q.bias"),
                                       ("qwen3", "rope_freqs.weight"),
                                       ("qwen2", "output.bias"),
                                       ("llama", "blk.1.post_ffw_norm.weight")])
def test_a_tensor_pyspec_would_ignore_is_refused_by_name(tmp_path, arch, name):
    path = str(tmp_path / "m.gguf")
    w = testmodels.family_weights(arch, 323, seed=0, **testmodels.FAMILY_SHAPES[arch])
    w[name] = np.ones(8, np.float32)
    testmodels.write_family_model(path, arch, weights=w)
    with pytest.raises(ModelError, match=f"tensor '{name}' changes the computation"):
        Model.load(path)


def test_missing_family_tensor_and_bad_rope_factors_are_named(tmp_path):
    path = str(tmp_path / "m.gguf")
    w = testmodels.family_weights("qwen2", 323, seed=0, **testmodels.FAMILY_SHAPES["qwen2"])
    del w["blk.1.attn_k.bias"]
    testmodels.write_family_model(path, "qwen2", weights=w)
    with pytest.raises(ModelError, match="not a complete qwen2 model.*blk.1.attn_k.bias"):
        Model.load(path)
    w = testmodels.family_weights("llama", 323, seed=0, **testmodels.FAMILY_SHAPES["llama"])
    w["rope_freqs.weight"] = np.ones(5, np.float32)
    testmodels.write_family_model(path, "llama", weights=w)
    with pytest.raises(ModelError, match="'rope_freqs.weight' has shape"):
        Model.load(path)


@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_float32_engines_against_float64(paths, arch, fmt):
    """numpy and fastcpu in float32 choose float64's token on every step whose top-2 margin is
    clear of float32 noise, and both are batch-invariant (a row of a many-token pass equals
    the one-token pass at its position)."""
    path, prompt = paths[arch, fmt], prompt_ids(paths[arch, fmt])
    exact = Model.load(path, np.float64)
    ref = exact.forward(prompt, exact.new_cache())                        # (m, vocab)
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-3
    assert clear.mean() > 0.9
    for model in (Model.load(path), FastModel.load(path)):
        batch = model.forward(prompt, model.new_cache())
        assert np.abs(batch - ref).max() < 1e-3
        assert np.array_equal(batch.argmax(1)[clear], ref.argmax(1)[clear])
        kv = model.new_cache()
        rows = np.concatenate([model.forward([t], kv) for t in prompt[:12]])
        assert np.array_equal(rows, batch[:12])


def test_sliding_window_masks_keys_outside_it(paths):
    """On gemma3 a local layer's window changes the logits once the prompt is longer than it:
    the same model with every layer global gives other logits from position 8 on only."""
    path = paths["gemma3", "F32"]
    prompt = prompt_ids(path)
    local = Model.load(path, np.float64)
    wide = Model.load(path, np.float64)
    wide.config = Config(**{**wide.config.__dict__, "sliding_window": 0})
    a, b = (m.forward(prompt, m.new_cache()) for m in (local, wide))
    assert np.array_equal(a[:8], b[:8])
    assert np.abs(a[8:] - b[8:]).max(axis=1).min() > 1e-6


# --- speculative output equals champion-only output, per family --------------------------------
@pytest.fixture(scope="module")
def drafts(paths, tmp_path_factory):
    """arch -> a smaller draft of the same family: the champion's first half of layers plus
    3% noise."""
    root, out = tmp_path_factory.mktemp("family-drafts"), {}
    for arch in FAMILIES:
        shape = testmodels.FAMILY_SHAPES[arch]
        n = shape["n_layers"] // 2
        w = testmodels.family_weights(arch, 323, seed=3, **shape)
        keep = {k: v for k, v in w.items()
                if not k.startswith("blk.") or int(k.split(".")[1]) < n}
        out[arch] = str(root / f"{arch}-draft.gguf")
        testmodels.write_family_model(out[arch], arch, weights=testmodels.perturb(keep, 0.03, 9),
                                      matrix_type=FORMATS["Q8_0"], **{**shape, "n_layers": n})
    return out


@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.parametrize("engine_kind", [Model, FastModel])
def test_speculative_output_equals_champion_only(paths, drafts, arch, engine_kind):
    path = paths[arch, "Q4_K_M"]
    champion = engine_kind.load(path)
    tok = Tokenizer.from_metadata(champion.metadata)
    prompt = prompt_ids(path)
    greedy = reference_decode(champion, prompt, 24, greedy_pick)

    def replay_pick(logits, position):
        return verify.sample_replay(logits, 0.8, rng.gumbel(77, position, len(logits)))

    replay = reference_decode(champion, prompt, 24, replay_pick)
    for draft in ("ngram", drafts[arch]):
        engine = Engine(backend_for(champion, draft, load_draft=Model.load), tok)
        for k in (1, 3, 6):
            r = engine.generate(prompt, Options(max_tokens=24, k=f"fixed:{k}", stop_at_eos=False))
            assert r.tokens == greedy, f"{draft}, K={k}"
            r = engine.generate(prompt, Options(max_tokens=24, k=f"fixed:{k}", temperature=0.8,
                                                seed=77, stop_at_eos=False))
            assert r.tokens == replay, f"{draft}, K={k}, replay"
        if draft != "ngram":
            assert r.stats["accepted"] > 0


def test_q4_k_m_models_hold_k_quants_and_their_fallbacks(paths):
    """The narrow Q4_K_M files hold llama.cpp's fallbacks for widths that are not multiples of
    256 (Q5_0, Q8_0), the wide ones real K-quants (Q4_K, Q6_K)."""
    def formats(path):
        f = gguf.GGUFFile.open(path)
        return {f.tensor(n).format.name for n in f.tensors if len(f.tensor(n).shape) == 2}

    for arch in FAMILIES:
        assert formats(paths[arch, "Q4_K_M"]) == {"Q5_0", "Q8_0"}
        assert formats(paths[arch, "Q4_K_M-wide"]) == {"Q4_K", "Q6_K"}
