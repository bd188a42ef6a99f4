"""Tests for pyspec/formats/mixes.py: the Q4_K_M type of each tensor as llama.cpp's
src/llama-quant.cpp picks it (llama_tensor_get_type_impl, tensor_type_fallback) for the shapes
of the families pyspec runs. Expected values are worked out by hand from that source."""

from __future__ import annotations

import pytest

from pyspec.formats import mixes, quant


def test_use_more_bits_layers():
    """i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2: for 24 layers (Qwen2.5-0.5B) 3 + 3 at the
    ends and every third between; for 30 (SmolLM2-135M) 3 and 4 at the ends."""
    assert [i for i in range(24) if mixes.use_more_bits(i, 24)] == [0, 1, 2, 5, 8, 11, 14, 17,
                                                                     20, 21, 22, 23]
    assert [i for i in range(30) if mixes.use_more_bits(i, 30)] == [0, 1, 2, 5, 8, 11, 14, 17,
                                                                     20, 23, 26, 27, 28, 29]


@pytest.mark.parametrize("name,shape,tied,expected", [
    ("blk.0.attn_norm.weight", (896,), False, "F32"),
    ("blk.3.attn_q.bias", (896,), False, "F32"),
    ("rope_freqs.weight", (32,), False, "F32"),
    ("token_embd.weight", (151936, 1024), False, "Q4_K"),     # untied: the default type
    ("token_embd.weight", (151936, 1024), True, "Q6_K"),      # tied: the head's type
    ("token_embd.weight", (151936, 896), True, "Q8_0"),       # tied, width % 256: Q8_0
    ("output.weight", (49152, 2048), False, "Q6_K"),
    ("output.weight", (49152, 960), False, "Q8_0"),
    ("blk.0.attn_v.weight", (128, 896), False, "Q8_0"),       # Q6_K layer, falls back
    ("blk.3.attn_v.weight", (128, 896), False, "Q5_0"),       # Q4_K layer, falls back
    ("blk.3.attn_v.weight", (256, 1024), False, "Q4_K"),
    ("blk.5.attn_v.weight", (256, 1024), False, "Q6_K"),
    ("blk.5.ffn_down.weight", (896, 4864), False, "Q6_K"),    # width 4864 = 19 * 256
    ("blk.4.ffn_down.weight", (896, 4864), False, "Q4_K"),
    ("blk.4.ffn_up.weight", (4864, 896), False, "Q5_0"),
    ("blk.0.attn_q.weight", (1024, 1024), False, "Q4_K"),     # not attn_v: no extra bits
    ("blk.0.ffn_gate.weight", (6, 48), False, "F16"),         # not even whole 32-blocks
])
def test_q4_k_m_picks_llama_cpp_types(name, shape, tied, expected):
    assert mixes.q4_k_m(name, shape, 24, tied).name == expected


def test_q4_k_m_mix_of_a_model():
    shapes = {"token_embd.weight": (1000, 640), "output_norm.weight": (640,)}
    for i in range(6):
        shapes |= {f"blk.{i}.attn_v.weight": (256, 640), f"blk.{i}.ffn_down.weight": (640, 2048),
                   f"blk.{i}.attn_norm.weight": (640,)}
    mix = {n: quant.FORMATS[t].name for n, t in mixes.q4_k_m_mix(shapes).items()}
    # 6 layers: n/8 = 0 and 7n/8 = 5, so layers 2 and 5 get more bits; tied head: Q8_0 at 640.
    assert mix["token_embd.weight"] == "Q8_0" and mix["output_norm.weight"] == "F32"
    assert [mix[f"blk.{i}.attn_v.weight"] for i in range(6)] == ["Q5_0", "Q5_0", "Q8_0", "Q5_0",
                                                                  "Q5_0", "Q8_0"]
    assert [mix[f"blk.{i}.ffn_down.weight"] for i in range(6)] == ["Q4_K", "Q4_K", "Q6_K",
                                                                    "Q4_K", "Q4_K", "Q6_K"]


def test_fallback_and_errors():
    assert mixes.fallback(quant.Q5_K, 640) is quant.Q5_1
    assert mixes.fallback(quant.Q6_K, 512) is quant.Q6_K
    with pytest.raises(ValueError, match="blk"):
        mixes.q4_k_m("attn_v.weight", (64, 256), 2, False)
