"""Tiny random Llama GGUFs for fast exact tests: written with ggufwrite.write.

A test model has the champion's shape of metadata and tensors (same names, Q4_1 matrices and a
Q8_0 tied embedding by default) at a few kilobytes: a byte-level BPE vocabulary of 256 byte tokens,
3 ChatML specials and `n_merges` merges learnt from a fixed corpus, and random weights scaled so
the next-token distribution is peaked enough to make greedy text and drafts interesting.
`perturb` makes a related draft: the same tokenizer and weights plus noise, so its proposals are
often, but not always, accepted. For drafts with another vocabulary (compat.py's classes):
`permute` renames every token id (tokenizer and weights alike: the same model under other ids),
and `reindex` carries weights over to another vocabulary row by row.
"""

from __future__ import annotations

import collections
import itertools
import re

import numpy as np

from .formats import gguf, ggufwrite, mixes, quant
from .text.tokenizer import _bytes_to_unicode

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a tiny test model<|im_end|>\n' }}{% endif %}"
          "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# Llama 3's template (its loop, `trim`, `bos_token`, whitespace control, the generation prompt)
# over the tiny vocabulary's specials: <|im_start|> opens a header (and is the BOS), <|endoftext|>
# closes it, <|im_end|> (the EOS) ends a turn. Not ChatML: only jinja2 renders it (e2e).
LLAMA3_STYLE = ("{{- bos_token }}{%- for message in messages %}"
                "{{- '<|im_start|>' + message['role'] + '<|endoftext|>\n\n' + message['content'] "
                "| trim + '<|im_end|>' }}{%- endfor %}{%- if add_generation_prompt %}"
                "{{- '<|im_start|>assistant<|endoftext|>\n\n' }}{%- endif %}")
CORPUS = ("the cat sat on the mat. the dog ate the bone. def f(x): return x + 1\n"
          "speculative decoding is exact. the champion checks every draft token. ") * 4


def learn_merges(words: list[list[str]], n: int) -> list[tuple[str, str]]:
    """Up to n merges learnt greedily on `words` (symbol lists, merged in place): each time the
    most frequent adjacent pair, ties to the greatest pair."""
    merges = []
    for _ in range(n):
        pairs = collections.Counter((a, b) for w in words for a, b in itertools.pairwise(w))
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i:i + 2] = [a + b]
                i += 1
    return merges


def tokenizer_metadata(n_merges: int = 64, corpus: str = CORPUS) -> dict:
    """GGUF tokenizer metadata: specials, 256 byte tokens, then merges learnt greedily on corpus."""
    byte_char = _bytes_to_unicode()
    tokens = SPECIALS + byte_char
    words = [[byte_char[b] for b in w.encode()] for w in re.findall(r" ?\S+", corpus)]
    learnt = learn_merges(words, n_merges)
    merges = [f"{a} {b}" for a, b in learnt]
    tokens += [a + b for a, b in learnt]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML,
    }


# The tokens a real family's chat template writes beyond SPECIALS (text, token type: 3 control, 4
# user-defined, as the family's GGUF marks them) and the special ids they take: for tiny models
# that render with the family's own template (tool calls; the template's text comes
# from the caller, e.g. llama.cpp's copies in .cache/llama.cpp/templates).
TEMPLATE_TOKENS = {
    "qwen2.5": ([("<tool_call>", 4), ("</tool_call>", 4)], {}),
    "llama3": ([("<|begin_of_text|>", 3), ("<|start_header_id|>", 3),
                ("<|end_header_id|>", 3), ("<|eot_id|>", 3)],
               {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>"}),
}


def templated_tokenizer(family: str, template: str, n_merges: int = 64) -> dict:
    """tokenizer_metadata with TEMPLATE_TOKENS[family] appended and `template` as the chat
    template."""
    md = tokenizer_metadata(n_merges)
    extra, ids = TEMPLATE_TOKENS[family]
    tokens = md["tokenizer.ggml.tokens"] + [t for t, _ in extra]
    md.update({"tokenizer.ggml.tokens": tokens,
               "tokenizer.ggml.token_type": md["tokenizer.ggml.token_type"] + [k for _, k in extra],
               "tokenizer.chat_template": template,
               **{f"tokenizer.ggml.{key}_token_id": tokens.index(text) for key, text in ids.items()}})
    return md


# Gemma 3's tokenizer settings (its GGUF: model "llama", no space prefix, byte fallback, BOS added,
# <eos> = 1, <bos> = 2, turns marked by <start_of_turn> / <end_of_turn>), over a small vocabulary.
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
GEMMA_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}"
                  "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
                  "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
                  "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")


def gemma3_tokenizer_metadata(n_pieces: int = 96, corpus: str = CORPUS) -> dict:
    """GGUF tokenizer metadata with Gemma 3's settings: specials, the 256 byte-fallback tokens,
    then pieces learnt greedily on `corpus` (spaces as U+2581), each scored below the last."""
    words = [list(w.replace(" ", "\u2581")) for w in re.findall(r" ?\S+", corpus)]
    pieces = sorted({ch for w in words for ch in w})
    pieces += [a + b for a, b in learn_merges(words, n_pieces)]
    tokens = GEMMA_SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [3, 3, 3, 2, 3, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * (len(GEMMA_SPECIALS) + 256) + [-float(i) for i in range(len(pieces))]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.ggml.add_space_prefix": False,
        "tokenizer.chat_template": GEMMA_TEMPLATE,
    }


def random_weights(vocab: int, n_layers: int, d: int, n_heads: int, n_kv: int, d_ff: int,
                   seed: int, head_gain: float = 4.0, layer_gain: float = 2.0,
                   head_dim: int | None = None) -> dict[str, np.ndarray]:
    """A Llama layout's weights: embedding, head, final norm, and each layer's norms and
    matrices (head_dim defaults to d / n_heads)."""
    rng = np.random.default_rng(seed)
    hd = head_dim or d // n_heads

    def mat(rows, cols, gain=1.0):
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    w = {"token_embd.weight": mat(vocab, d, np.sqrt(d)),
         "output.weight": mat(vocab, d, head_gain),
         "output_norm.weight": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)}
    for i in range(n_layers):
        p = f"blk.{i}."
        w.update({p + "attn_norm.weight": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
                  p + "ffn_norm.weight": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
                  p + "attn_q.weight": mat(n_heads * hd, d), p + "attn_k.weight": mat(n_kv * hd, d),
                  p + "attn_v.weight": mat(n_kv * hd, d), p + "attn_output.weight": mat(d, n_heads * hd, layer_gain),
                  p + "ffn_gate.weight": mat(d_ff, d), p + "ffn_up.weight": mat(d_ff, d),
                  p + "ffn_down.weight": mat(d, d_ff, layer_gain)})
    return w


def write_model(path, *, n_layers: int = 2, d: int = 64, n_heads: int = 4, n_kv: int = 2,
                d_ff: int = 128, n_merges: int = 64, seed: int = 0, ctx: int = 256,
                weights: dict[str, np.ndarray] | None = None, tokenizer: dict | None = None,
                matrix_type: int | str = quant.Q4_1.type_id,
                embd_type: int = quant.Q8_0.type_id) -> dict[str, np.ndarray]:
    """Write a tiny Llama GGUF; returns its float weights (before quantization). Without
    "output.weight" in `weights` the head is tied to the embedding. `matrix_type` "Q4_K_M"
    gives every tensor (the embedding too) the type llama.cpp's Q4_K_M would (mixes.py): with
    widths under 256 that is the Q5_0 / Q8_0 fallbacks; d = 256 makes K-quants."""
    md_tok = tokenizer or tokenizer_metadata(n_merges)
    vocab = len(md_tok["tokenizer.ggml.tokens"])
    w = weights or random_weights(vocab, n_layers, d, n_heads, n_kv, d_ff, seed)
    md = {"general.architecture": "llama", "general.name": f"pyspec-tiny-{seed}",
          "llama.block_count": n_layers, "llama.context_length": ctx,
          "llama.embedding_length": d, "llama.feed_forward_length": d_ff,
          "llama.attention.head_count": n_heads, "llama.attention.head_count_kv": n_kv,
          "llama.rope.freq_base": 10000.0, "llama.attention.layer_norm_rms_epsilon": 1e-5,
          "llama.vocab_size": vocab, **md_tok}

    ggufwrite.write(path, md, tensor_types(w, matrix_type, embd_type))
    return w


def tensor_types(w: dict[str, np.ndarray], matrix_type: int | str, embd_type: int | str
                 ) -> dict[str, tuple[np.ndarray, int]]:
    """Each tensor with its ggml type, for ggufwrite.write: 1-D tensors (norms, biases, rope factors)
    F32, the embedding `embd_type`, other matrices `matrix_type`; "Q4_K_M" (either) gives every
    tensor the type llama.cpp's Q4_K_M would (mixes.py)."""
    mix = (mixes.q4_k_m_mix({n: v.shape for n, v in w.items()})
           if "Q4_K_M" in (matrix_type, embd_type) else {})

    def kind(name, v):
        if name in mix:
            return mix[name]
        if v.ndim == 1:
            return quant.F32.type_id
        return embd_type if name == "token_embd.weight" else matrix_type

    return {n: (v, kind(n, v)) for n, v in w.items()}


# --- model families (cpu/model.py ARCHITECTURES) ------------------------------------------------
# Each family's tiny shape: head sizes other than d / n_heads where the family allows it (qwen3,
# gemma3), a grouped-KV ratio above 1, and for gemma3 local layers (a window of 8 keys, every
# second layer global) so that a prompt of a few dozen tokens crosses the window.
FAMILY_SHAPES = {
    "llama": {"n_layers": 2, "d": 64, "n_heads": 4, "n_kv": 2, "head_dim": 16, "d_ff": 128},
    "qwen2": {"n_layers": 2, "d": 64, "n_heads": 4, "n_kv": 2, "head_dim": 16, "d_ff": 128},
    "qwen3": {"n_layers": 2, "d": 64, "n_heads": 4, "n_kv": 2, "head_dim": 32, "d_ff": 128},
    "gemma3": {"n_layers": 4, "d": 64, "n_heads": 4, "n_kv": 1, "head_dim": 32, "d_ff": 128},
}
# Wider variants whose rows are multiples of 256, so that a Q4_K_M mix holds real K-quants
# (Q4_K, Q6_K) rather than the Q5_0 / Q8_0 fallbacks, with the real head sizes 64, 128 and 256.
FAMILY_WIDE = {
    "llama": {"d": 256, "n_heads": 4, "n_kv": 2, "head_dim": 64, "d_ff": 512},
    "qwen2": {"d": 256, "n_heads": 4, "n_kv": 2, "head_dim": 64, "d_ff": 512},
    "qwen3": {"d": 256, "n_heads": 4, "n_kv": 2, "head_dim": 128, "d_ff": 512},
    "gemma3": {"d": 256, "n_heads": 4, "n_kv": 1, "head_dim": 256, "d_ff": 512},
}
# The metadata each family's converter writes beyond the shape (llama.cpp's convert_hf_to_gguf
# and conversion/*.py), at the real models' values.
FAMILY_METADATA = {
    "llama": {"rope.freq_base": 500000.0, "attention.layer_norm_rms_epsilon": 1e-5},
    "qwen2": {"rope.freq_base": 1000000.0, "attention.layer_norm_rms_epsilon": 1e-6},
    "qwen3": {"rope.freq_base": 1000000.0, "attention.layer_norm_rms_epsilon": 1e-6},
    "gemma3": {"rope.freq_base": 1000000.0, "attention.layer_norm_rms_epsilon": 1e-6,
               "attention.sliding_window": 8, "attention.sliding_window_pattern": 2},
}


def family_metadata(arch: str, *, n_layers: int, d: int, n_heads: int, n_kv: int,
                    head_dim: int, d_ff: int, ctx: int = 256, **extra) -> dict:
    """The "ARCH.*" metadata of a model of `arch` (FAMILY_METADATA's values, `extra` over
    them), key and value lengths always written, as the Llama 3 / Qwen3 / Gemma 3 converters do."""
    keys = {"block_count": n_layers, "context_length": ctx, "embedding_length": d,
            "feed_forward_length": d_ff, "attention.head_count": n_heads,
            "attention.head_count_kv": n_kv, "attention.key_length": head_dim,
            "attention.value_length": head_dim, "rope.dimension_count": head_dim,
            **FAMILY_METADATA[arch], **extra}
    return {"general.architecture": arch, **{f"{arch}.{k}": v for k, v in keys.items()}}


def family_weights(arch: str, vocab: int, *, n_layers: int, d: int, n_heads: int, n_kv: int,
                   head_dim: int, d_ff: int, seed: int, rope_freqs: bool = True
                   ) -> dict[str, np.ndarray]:
    """random_weights plus the family's own tensors (drawn after them, so the shared ones are
    random_weights'): qwen2's Q/K/V biases, qwen3's and gemma3's per-head Q/K norms, gemma3's
    post-norms, and for llama Llama 3's rope frequency factors (1 for the fast pairs up to 8 for
    the slow ones, as its converter writes them)."""
    w = random_weights(vocab, n_layers, d, n_heads, n_kv, d_ff, seed, head_dim=head_dim)
    rng = np.random.default_rng(seed + 7919)

    def norm(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    for i in range(n_layers):
        p = f"blk.{i}."
        if arch == "qwen2":
            for name, n in (("attn_q", n_heads), ("attn_k", n_kv), ("attn_v", n_kv)):
                w[p + name + ".bias"] = (0.5 * rng.standard_normal(n * head_dim)).astype(np.float32)
        if arch in ("qwen3", "gemma3"):
            w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = norm(head_dim), norm(head_dim)
        if arch == "gemma3":
            w[p + "post_attention_norm.weight"], w[p + "post_ffw_norm.weight"] = norm(d), norm(d)
    if arch == "llama" and rope_freqs:
        w["rope_freqs.weight"] = np.geomspace(1, 8, head_dim // 2).astype(np.float32)
    return w


def write_family_model(path, arch: str, *, seed: int = 0, ctx: int = 256, n_merges: int = 64,
                       weights: dict[str, np.ndarray] | None = None, tokenizer: dict | None = None,
                       matrix_type: int | str = quant.F32.type_id,
                       embd_type: int | str | None = None, **shape) -> dict[str, np.ndarray]:
    """Write a tiny GGUF of family `arch` (FAMILY_SHAPES[arch], `shape` over it) with the
    family's metadata keys and tensor names; returns its float weights. Matrices in
    `matrix_type`, the embedding in `embd_type` (default: the same), norms, biases and rope
    factors in F32; "Q4_K_M" as llama.cpp's mix (d=256 for K-quants, else its Q5_0 / Q5_1 /
    Q8_0 fallbacks). Peaked as random_weights makes them (a head gain of 4). `tokenizer`:
    its tokenizer metadata (templated_tokenizer's), else tokenizer_metadata(n_merges)."""
    shape = {**FAMILY_SHAPES[arch], **shape}
    md_tok = tokenizer or tokenizer_metadata(n_merges)
    vocab = len(md_tok["tokenizer.ggml.tokens"])
    w = weights or family_weights(arch, vocab, seed=seed, **shape)
    md = {**family_metadata(arch, ctx=ctx, **shape), "general.name": f"pyspec-tiny-{arch}-{seed}",
          f"{arch}.vocab_size": vocab, **md_tok}
    embd_type = matrix_type if embd_type is None else embd_type
    ggufwrite.write(path, md, tensor_types(w, matrix_type, embd_type))
    return w


# The formats each family's tiny model is tested in (tests/test_families.py) and recorded by
# llama.cpp in (scripts/record_golden_forward.py): name -> write_family_model's matrix_type.
# "Q4_K_M" on the narrow shape holds the Q5_0 / Q8_0 fallbacks, "-wide" (FAMILY_WIDE) K-quants.
FAMILY_FORMATS = {"F32": quant.F32.type_id, "F16": quant.F16.type_id,
                  "Q8_0": quant.Q8_0.type_id, "Q4_K_M": "Q4_K_M", "Q4_K_M-wide": "Q4_K_M"}


def write_family_format(path, arch: str, fmt: str, seed: int = 3) -> dict[str, np.ndarray]:
    """write_family_model for one of FAMILY_FORMATS."""
    wide = FAMILY_WIDE[arch] if fmt.endswith("-wide") else {}
    return write_family_model(path, arch, seed=seed, matrix_type=FAMILY_FORMATS[fmt], **wide)


# A model for long contexts: an 8,192-position context (write_model's default is 256, and every
# backend caps max_ctx at the model's own length) at the smallest shape the kernels take (one
# layer, two heads of 4 dims, f32 weights, which have no 32-wide quant blocks): attention costs a
# pass in proportion to layers x heads x head_dim x positions, and an 8,000-token prefill on a
# software adapter is what a test pays for. write_model(path, seed=1, **LONG_CONTEXT).
LONG_CONTEXT = {"ctx": 8192, "n_layers": 1, "d": 8, "n_heads": 2, "n_kv": 1, "d_ff": 16,
                    "matrix_type": quant.F32.type_id, "embd_type": quant.F32.type_id}


def perturb(weights: dict[str, np.ndarray], scale: float, seed: int) -> dict[str, np.ndarray]:
    """The same weights plus Gaussian noise of `scale` times each tensor's std."""
    rng = np.random.default_rng(seed)
    return {n: (v + scale * v.std() * rng.standard_normal(v.shape)).astype(np.float32)
            for n, v in weights.items()}


# Merges learnt on another text: a vocabulary that shares most tokens with the default one, lacks
# some of its merges and has merges of its own (compat.py's "tli" class).
OTHER_CORPUS = CORPUS + "the bird flew over the wall. a fish swam in the deep sea. " * 4


def foreign_tokenizer(n_merges: int = 56) -> dict:
    """Tokenizer metadata with extra and missing tokens against tokenizer_metadata()'s."""
    return tokenizer_metadata(n_merges, OTHER_CORPUS)


def permute(md_tok: dict, weights: dict[str, np.ndarray], seed: int) -> tuple[dict, dict]:
    """The same tokenizer and model with every token id renamed by a random permutation:
    new id j is old id perm[j] (special ids follow their tokens; merges name texts, not ids)."""
    tokens = md_tok["tokenizer.ggml.tokens"]
    perm = np.random.default_rng(seed).permutation(len(tokens))           # (vocab,)
    new_id = np.argsort(perm)                                              # old id -> new id
    md = {**md_tok, "tokenizer.ggml.tokens": [tokens[i] for i in perm],
          "tokenizer.ggml.token_type": [md_tok["tokenizer.ggml.token_type"][i] for i in perm]}
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
        md[key] = int(new_id[md_tok[key]])
    return md, reindex(weights, perm, seed)


def reindex(weights: dict[str, np.ndarray], rows: np.ndarray, seed: int,
            head_gain: float = 1.0) -> dict[str, np.ndarray]:
    """Weights for another vocabulary: token j's embedding and head rows are row rows[j] of
    `weights`', a fresh random row where rows[j] < 0 (head rows scaled by head_gain, so that a
    smaller gain makes the new tokens less likely); every other tensor as it is."""
    rng = np.random.default_rng(seed)
    out = dict(weights)
    for name in ("token_embd.weight", "output.weight"):
        w = weights[name]                                                  # (vocab, d)
        gain = head_gain if name == "output.weight" else 1.0
        fresh = (rng.standard_normal((len(rows), w.shape[1])) * w.std() * gain).astype(np.float32)
        out[name] = np.where(np.asarray(rows)[:, None] >= 0, w[np.maximum(rows, 0)], fresh)
    return out


def write_eagle_head(path, champion_path, *, noise: float = 0.1, seed: int = 0,
                     champion_sha256: str | None = None,
                     matrix_type: int = quant.Q8_0.type_id) -> None:
    """An EAGLE-style head (drafters/eagle.py) for the champion GGUF at `champion_path`, bound to
    its sha256 (or `champion_sha256`): W_f = W_e = I and the champion's last layer, each plus
    `noise` times its std of Gaussian noise, the shape train/eagle.py starts from."""
    from .drafters.eagle import EAGLE_TENSORS

    f = gguf.GGUFFile.open(champion_path)
    n = f.metadata["llama.block_count"]
    d = f.metadata["llama.embedding_length"]
    eye = np.eye(d, dtype=np.float32)
    w = {EAGLE_TENSORS[0]: eye, EAGLE_TENSORS[1]: eye}
    w |= {name.replace(f"blk.{n - 1}.", "blk.0."): f.dequantize(name)
          for name in f.tensors if name.startswith(f"blk.{n - 1}.")}
    w = perturb(w, noise, seed)
    md = {k: v for k, v in f.metadata.items() if not k.startswith("general.name")}
    md |= {"general.name": "pyspec-tiny-eagle", "llama.block_count": 1,
           "pyspec.draft.kind": "eagle",
           "pyspec.eagle.champion_sha256": champion_sha256 or f.sha256()}
    ggufwrite.write(path, md, {name: (v, quant.F32.type_id if name.endswith("norm.weight")
                                 else matrix_type) for name, v in w.items()})


def write_fed_draft(path, champion_path, draft_path, *, feed: float = 0.0, noise: float = 0.0,
                    seed: int = 0, matrix_type: int = quant.F32.type_id) -> None:
    """A draft model fed with the champion's states (drafters/eagle.py EagleHead with its own
    embedding, final norm and head): the draft GGUF at `draft_path` (its layers, embedding, norm
    and head) with W_e = I and W_f = `feed` times Gaussian noise over the champion's states, each
    matrix then plus `noise` times its std of noise; bound to the champion at `champion_path`.
    With feed = noise = 0 it drafts exactly what the draft alone drafts, the point
    train/eagle.py --init-draft starts from."""
    from .drafters.eagle import EAGLE_TENSORS

    f, draft = gguf.GGUFFile.open(champion_path), gguf.GGUFFile.open(draft_path)
    d = f.metadata["llama.embedding_length"]
    rng = np.random.default_rng(seed + 1)
    w = {EAGLE_TENSORS[0]: (feed * rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32),
         EAGLE_TENSORS[1]: np.eye(d, dtype=np.float32)}
    w |= {name: draft.dequantize(name) for name in draft.tensors}
    if noise:
        w = perturb(w, noise, seed)
    md = {k: v for k, v in draft.metadata.items() if not k.startswith("general.name")}
    md |= {"general.name": "pyspec-tiny-fed-draft", "pyspec.draft.kind": "eagle",
           "pyspec.eagle.champion_sha256": f.sha256()}
    ggufwrite.write(path, md, {name: (v, quant.F32.type_id if name.endswith("norm.weight")
                                 else matrix_type) for name, v in w.items()})


def write_borrowing_draft(path, champion_path, weights: dict[str, np.ndarray], n_layers: int,
                          borrow: tuple[str, ...] = ("token_embd.weight",),
                          matrix_type: int = quant.Q4_1.type_id) -> None:
    """A draft of the champion's shape and tokenizer that holds `weights` (its layers and final
    norm, in the champion's tensor names) and borrows the tensors `borrow` from the champion GGUF
    at `champion_path` (gguf.py): the layout of the borrowing drafts in train/README.md."""
    f = gguf.GGUFFile.open(champion_path)
    md = {k: v for k, v in f.metadata.items() if k != "general.name"}
    md |= {"general.name": "pyspec-tiny-borrowing-draft", "llama.block_count": n_layers,
           **ggufwrite.borrowed_metadata(f, list(borrow))}
    ggufwrite.write(path, md, {n: (v, quant.F32.type_id if n.endswith("norm.weight") else matrix_type)
                          for n, v in weights.items() if n not in borrow})
