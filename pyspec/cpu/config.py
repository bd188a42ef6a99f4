"""Model config from GGUF metadata, per family (llama, qwen2, qwen3, gemma3), and the tensors each
family's layers hold: what the numpy model (model.py) and the GPU model (gpu/model.py) both load.

Every value comes from the file's "ARCH.*" metadata, or llama.cpp's default where its converter
writes none (llama-model.cpp, models/ARCH.cpp; cited as facts, no code taken). What pyspec does
not run is a named error: an architecture outside ARCHITECTURES, a missing required key, a key or
a tensor that would change the computation in a way not implemented here.
Not here: the forward (model.py), the GGUF container (formats/gguf.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import PyspecError
from ..formats.gguf import GGUFError, GGUFFile


class ModelError(PyspecError, ValueError):
    """The GGUF holds a model pyspec cannot run."""

    code = "bad_model"


ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
# Metadata keys that change the forward pass and that pyspec does not implement, with the value that
# makes each a no-op (llama.cpp's default); any other value is refused by name.
UNSUPPORTED_KEYS = {"rope.scaling.factor": (0.0, 1.0), "rope.scale_linear": (0.0, 1.0),
                    "rope.scaling.type": ("none", "linear"),
                    "final_logit_softcapping": (0.0,), "attn_logit_softcapping": (0.0,)}


@dataclass(frozen=True)
class Config:
    """A model's shape and its family's conventions, all from GGUF metadata under "ARCH." (or
    llama.cpp's default where its converter writes none)."""
    n_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int            # attention.key_length (= value_length), else d_model / n_heads
    vocab_size: int
    context_length: int
    rope_base: float         # rope.freq_base: the global layers' base
    rms_eps: float
    arch: str = "llama"
    rope_neox: bool = False  # True: rotate pairs (i, i + head_dim/2); False: (2i, 2i+1)
    qkv_bias: bool = False   # blk.N.attn_{q,k,v}.bias (qwen2)
    qk_norm: bool = False    # blk.N.attn_{q,k}_norm.weight: per-head RMSNorm before rope
    post_norms: bool = False  # blk.N.post_attention_norm / post_ffw_norm on each branch (gemma3)
    act: str = "silu"        # the FFN gate's activation: "silu" | "gelu_tanh"
    embed_scale: float = 1.0  # the embedding rows times this (gemma3: sqrt(d_model))
    attn_scale: float = 0.0   # scores times this; set to 1/sqrt(head_dim) when not given
    sliding_window: int = 0   # keys a local layer sees, itself included (0: no local layers)
    swa_layers: tuple = ()    # per layer, True = local (sliding window, rope_base_swa)
    rope_base_swa: float = 10000.0

    def __post_init__(self):
        if not self.attn_scale:
            object.__setattr__(self, "attn_scale", 1.0 / float(np.sqrt(self.head_dim)))
        if not self.swa_layers:
            object.__setattr__(self, "swa_layers", (False,) * self.n_layers)

    @classmethod
    def from_metadata(cls, md: dict) -> Config:
        arch = md.get("general.architecture")
        if arch not in ARCHITECTURES:
            raise ModelError(f"architecture {arch!r} is not supported; pyspec runs "
                             f"{', '.join(ARCHITECTURES)} models")
        get = _getter(md, arch)
        _refuse_unsupported(md, arch)
        d_model, n_heads = get("embedding_length"), get("attention.head_count")
        n_kv = get("attention.head_count_kv", n_heads)
        if n_heads % n_kv:
            raise ModelError(f"{n_heads} query heads do not share {n_kv} KV heads evenly; "
                             "the GGUF is corrupt")
        head_dim = get("attention.key_length", d_model // n_heads if d_model % n_heads == 0
                       else None)
        if get("attention.value_length", head_dim) != head_dim:
            raise ModelError(f"{arch}.attention.value_length differs from key_length "
                             f"{head_dim}; pyspec runs models whose K and V heads are one size")
        if head_dim % 2:
            raise ModelError(f"head size {head_dim} is odd; RoPE needs pairs")
        if get("rope.dimension_count", head_dim) != head_dim:
            raise ModelError("partial RoPE is not supported")
        vocab = md.get(f"{arch}.vocab_size") or len(md.get("tokenizer.ggml.tokens", ()))
        if not isinstance(vocab, int) or vocab <= 0:
            raise ModelError(f"the vocabulary size is unknown (no {arch}.vocab_size and no "
                             "tokens)")
        n_layers = get("block_count")
        if n_layers > MAX_LAYERS:   # before anything is made per layer (a mutated count)
            raise ModelError(f"{arch}.block_count = {n_layers} layers is implausible (pyspec "
                             f"reads at most {MAX_LAYERS}); the GGUF is corrupt")
        fam = _family(md, arch, get, n_layers, d_model, n_heads, head_dim)
        return cls(n_layers=n_layers, d_model=d_model, d_ff=get("feed_forward_length"),
                   n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim, vocab_size=vocab,
                   context_length=get("context_length"),
                   rope_base=float(get("rope.freq_base", 10000.0, float)),
                   rms_eps=float(get("attention.layer_norm_rms_epsilon", None, float)),
                   arch=arch, **fam)


def _getter(md: dict, arch: str):
    """get(key, default, kind): metadata "ARCH.key", checked to be a positive int / number."""
    def get(key, default=None, kind=int):
        v = md.get(f"{arch}.{key}", default)
        if v is None:
            raise ModelError(f"metadata key '{arch}.{key}' is missing; the GGUF is incomplete "
                             f"(a {arch} model needs it)")
        if kind is int and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            raise ModelError(f"metadata '{arch}.{key}' = {v!r} must be a positive integer; "
                             "the GGUF is corrupt")
        if kind is float and (not isinstance(v, (int, float)) or not v > 0):
            raise ModelError(f"metadata '{arch}.{key}' = {v!r} must be a positive number")
        return v
    return get


def _refuse_unsupported(md: dict, arch: str) -> None:
    """ModelError naming a metadata key that would change the computation in a way pyspec does
    not implement (rope scaling, logit soft-capping)."""
    for key, noop in UNSUPPORTED_KEYS.items():
        v = md.get(f"{arch}.{key}")
        if v is not None and v not in noop:
            raise ModelError(f"metadata '{arch}.{key}' = {v!r} changes the forward pass in a "
                             "way pyspec does not implement; pick a model without it")


# More layers than any model pyspec could run (the largest open dense models have about 130): a
# count past this is a corrupt file, refused before per-layer tables are built from it.
MAX_LAYERS = 1024


def _family(md: dict, arch: str, get, n_layers: int, d_model: int, n_heads: int,
            head_dim: int) -> dict:
    """The Config fields that differ by architecture, as llama.cpp decides them (llama-model.cpp
    and models/ARCH.cpp; GGUF has no rope-mode key: the converter permutes llama's Q/K rows for
    adjacent pairs, the others keep the (i, i + head/2) pairing)."""
    if arch != "gemma3":
        return {"rope_neox": arch != "llama", "qkv_bias": arch == "qwen2", "qk_norm": arch == "qwen3"}
    window = md.get(f"{arch}.attention.sliding_window", 0)
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ModelError(f"metadata '{arch}.attention.sliding_window' = {window!r} must be a "
                         "non-negative integer")
    swa = (False,) * n_layers
    if window:
        pattern = md.get(f"{arch}.attention.sliding_window_pattern", 6)
        if isinstance(pattern, list):    # one flag per layer, True = local
            if len(pattern) != n_layers or not all(isinstance(b, bool) for b in pattern):
                raise ModelError(f"metadata '{arch}.attention.sliding_window_pattern' must "
                                 f"hold one bool per layer ({n_layers})")
            swa = tuple(pattern)
        elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern >= 0:
            # every n-th layer is global, the others local (llama_hparams::set_swa_pattern)
            swa = tuple(pattern == 0 or i % pattern < pattern - 1 for i in range(n_layers))
        else:
            raise ModelError(f"metadata '{arch}.attention.sliding_window_pattern' = "
                             f"{pattern!r} must be a non-negative integer or a list of bools")
    # llama.cpp scales by 1/sqrt(d_model / n_heads) for the 62-layer 27B, else 1/sqrt(head_dim)
    scale_dim = d_model // n_heads if n_layers == 62 else head_dim
    return {"rope_neox": True, "qk_norm": True, "post_norms": True, "act": "gelu_tanh",
                "embed_scale": float(np.sqrt(np.float32(d_model))),
                "attn_scale": 1.0 / float(np.sqrt(scale_dim)), "sliding_window": window,
                "swa_layers": swa, "rope_base_swa": float(get("rope.freq_base_swa", 10000.0, float))}


LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")


def layer_tensors(cfg: Config) -> tuple[str, ...]:
    """The names of a layer's tensors in `cfg`'s family: LAYER_TENSORS, then the family's own.
    A name is the GGUF tensor's without "blk.N." and without ".weight" (a bias keeps ".bias")."""
    extra = ()
    if cfg.qkv_bias:
        extra += ("attn_q.bias", "attn_k.bias", "attn_v.bias")
    if cfg.qk_norm:
        extra += ("attn_q_norm", "attn_k_norm")
    if cfg.post_norms:
        extra += ("post_attention_norm", "post_ffw_norm")
    return LAYER_TENSORS + extra


def tensor_name(i: int, name: str) -> str:
    """Layer i's GGUF tensor called `name` in layer_tensors."""
    return f"blk.{i}.{name}" if name.endswith(".bias") else f"blk.{i}.{name}.weight"


def layer_shapes(cfg: Config) -> dict[str, tuple]:
    """The shape of each of a layer's tensors (layer_tensors), in the GGUF's (n_out, n_in)."""
    d, hd = cfg.d_model, cfg.head_dim
    q, kv = cfg.n_heads * hd, cfg.n_kv_heads * hd
    return {"attn_norm": (d,), "attn_q": (q, d), "attn_k": (kv, d), "attn_v": (kv, d),
            "attn_output": (d, q), "ffn_norm": (d,),
            "ffn_gate": (cfg.d_ff, d), "ffn_up": (cfg.d_ff, d), "ffn_down": (d, cfg.d_ff),
            "attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,),
            "attn_q_norm": (hd,), "attn_k_norm": (hd,),
            "post_attention_norm": (d,), "post_ffw_norm": (d,)}


def shape_error(source: str, name: str, got: tuple, want: tuple) -> ModelError:
    """The one wording of a tensor whose shape is not the one the file's metadata gives it
    (Model on loading, load.check_tensors before it), naming the file."""
    return ModelError(f"{source}: tensor {name!r} has shape {tuple(got)}, but the file's own "
                      f"metadata makes it {tuple(want)}; the file is broken or not a model "
                      "pyspec can run: download it again or pick another model")


GLOBAL_TENSORS = ("token_embd.weight", "output_norm.weight", "output.weight")
ROPE_FREQS = "rope_freqs.weight"   # Llama 3's rope frequency factors: (head_dim/2,)


def load_tensors(f: GGUFFile, cfg: Config, load):
    """(tok_embd, out_norm, head, layers) of a GGUF of cfg's family, each made by
    `load(name, shape)`; the CPU model dequantizes there, the GPU model uploads. layers[i] maps
    each name of layer_tensors(cfg) to its tensor. A missing output.weight means the head is tied
    to the embedding. A tensor pyspec would not use (a bias, a norm of another family) is
    refused by name: ignoring it would compute another model."""
    d, shapes, names = cfg.d_model, layer_shapes(cfg), layer_tensors(cfg)
    check_no_unknown_tensors(f, cfg)
    try:
        tok_embd = load("token_embd.weight", (cfg.vocab_size, d))                 # (vocab, d)
        out_norm = load("output_norm.weight", (d,))
        head = (load("output.weight", (cfg.vocab_size, d))
                if f.has("output.weight") else tok_embd)                          # (vocab, d)
        layers = [{n: load(tensor_name(i, n), shapes[n]) for n in names}
                  for i in range(cfg.n_layers)]
        if f.has(ROPE_FREQS):
            load(ROPE_FREQS, (cfg.head_dim // 2,))
    except GGUFError as e:
        raise ModelError(f"{f.source} is not a complete {cfg.arch} model: {e.reason}") from e
    return tok_embd, out_norm, head, layers


def check_no_unknown_tensors(f: GGUFFile, cfg: Config) -> None:
    """ModelError naming the first tensor of `f` that a model of cfg's family does not use."""
    known = set(GLOBAL_TENSORS) | {tensor_name(i, n) for i in range(cfg.n_layers)
                                   for n in layer_tensors(cfg)}
    if cfg.arch == "llama":
        known.add(ROPE_FREQS)
    for name in list(f.tensors) + list(f.borrowed):
        if name not in known:
            raise ModelError(f"{f.source}: tensor {name!r} changes the computation of a "
                             f"{cfg.arch} model in a way pyspec does not implement; pick "
                             "another model")


def rope_factors(f: GGUFFile, cfg: Config) -> np.ndarray | None:
    """The rope frequency factors (rope_freqs.weight, (head_dim/2,) float32: frequency i is
    divided by factor i, as ggml_rope_ext does) or None where the file has none (or is not a
    llama: load_tensors refuses the tensor there)."""
    if cfg.arch != "llama" or not f.has(ROPE_FREQS):
        return None
    w = f.dequantize(ROPE_FREQS).astype(np.float32)
    if w.shape != (cfg.head_dim // 2,):
        raise shape_error(f.source, ROPE_FREQS, w.shape, (cfg.head_dim // 2,))
    if not np.all(np.isfinite(w)) or not np.all(w > 0):
        raise ModelError(f"{f.source}: {ROPE_FREQS} holds a factor that is not a positive "
                         "number; the file is broken: download it again")
    return w


def rope_inv_freq(cfg: Config, local: bool, factors: np.ndarray | None) -> np.ndarray:
    """(head_dim/2,) float64: the angle per position of each rotated pair, base^(-2i/hd) over
    the pair's frequency factor; a local (sliding-window) layer uses rope_base_swa."""
    hd = cfg.head_dim
    base = cfg.rope_base_swa if local else cfg.rope_base
    inv = base ** (-np.arange(hd // 2, dtype=np.float64) * 2 / hd)                  # (hd/2,)
    return inv if factors is None else inv / factors.astype(np.float64)
