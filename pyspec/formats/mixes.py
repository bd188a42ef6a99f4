"""Which block format each tensor of a Q4_K_M file gets, as llama.cpp's quantizer picks it.

For writing test models shaped like the files users bring (testmodels.py, the families' tiny
random models): `q4_k_m(name, shape, n_layers, tied)` for one tensor, `q4_k_m_mix(shapes)` for
a whole model. The rule is llama.cpp's `llama_tensor_get_type_impl` and `tensor_type_fallback`
(src/llama-quant.cpp) for ftype Q4_K_M, restricted to what pyspec's families hold (dense models,
no experts, no fused attn_qkv, not Falcon, not a 70B, no imatrix, no user overrides):
- 1-D tensors (norms, biases, rope_freqs) are not quantized: F32.
- `output.weight`, or `token_embd.weight` when there is no `output.weight` (tied): Q6_K, or
  Q8_0 when the width (ne[0], the last numpy axis) is not a multiple of 256.
- `attn_v.weight` and `ffn_down.weight` of layer i: Q6_K where use_more_bits(i, n_layers), i.e.
  i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2 (integer division), else Q4_K. llama.cpp counts
  attn_v tensors and ffn_down tensors in file order; with one of each per layer, in layer order,
  the count is the layer index, which is what this module reads from the name `blk.i.`.
- Everything else with a 2-D shape (token_embd untied, attn_q/k/output, ffn_gate/up): Q4_K.
- Fallback when the width is not a multiple of 256: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0;
  and F16 when it is not a multiple of 32 either.
"""

from __future__ import annotations

import re

from . import quant
from .quant import BlockFormat

_FALLBACK = {quant.Q4_K: quant.Q5_0, quant.Q5_K: quant.Q5_1, quant.Q6_K: quant.Q8_0}
_LAYER = re.compile(r"^blk\.(\d+)\.")


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's layers that get more bits: the first and last eighth, and every third between."""
    return (i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8
            or (i_layer - n_layers // 8) % 3 == 2)


def q4_k_m(name: str, shape: tuple[int, ...], n_layers: int, tied: bool) -> BlockFormat:
    """The format llama.cpp's Q4_K_M gives tensor `name` of numpy `shape` (last axis = ne[0])
    in a model of `n_layers` layers; `tied`: the file has no output.weight, so token_embd.weight
    is also the head. Raises ValueError for a layer tensor whose name lacks `blk.i.`."""
    if len(shape) < 2:
        return quant.F32
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return quant.Q6_K if shape[-1] % quant.Q6_K.block_elems == 0 else quant.Q8_0
    fmt = quant.Q4_K
    if name.endswith(("attn_v.weight", "ffn_down.weight")):
        m = _LAYER.match(name)
        if m is None:
            raise ValueError(f"tensor {name!r}: expected a layer tensor named blk.<i>.*")
        if use_more_bits(int(m.group(1)), n_layers):
            fmt = quant.Q6_K
    return fallback(fmt, shape[-1])


def fallback(fmt: BlockFormat, width: int) -> BlockFormat:
    """`fmt`, or llama.cpp's fallback for a row `width` that its blocks do not divide."""
    if width % fmt.block_elems == 0:
        return fmt
    fmt = _FALLBACK.get(fmt, fmt)
    return fmt if width % fmt.block_elems == 0 else quant.F16


def q4_k_m_mix(shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """Every tensor of a model (name -> numpy shape) -> its Q4_K_M ggml type id. The layer
    count is the number of distinct `blk.i.` prefixes; tied when no output.weight is present."""
    n_layers = len({m.group(1) for m in map(_LAYER.match, shapes) if m})
    tied = "output.weight" not in shapes
    return {name: q4_k_m(name, shape, n_layers, tied).type_id for name, shape in shapes.items()}
