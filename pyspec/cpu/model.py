"""Model config from GGUF metadata and the reference Llama forward on the CPU (numpy).

The forward is *batch-invariant*: the logits of row i of a forward over positions [n, n+m) are
bit-identical to a one-token forward at position n+i. This is what makes greedy speculative output
byte-identical to champion-only output. It holds because
  - every matrix product runs on tiles of exactly TILE rows (zero-padded), so the BLAS kernel, its
    blocking and its reduction order never depend on how many rows a pass carries, and a row's
    result never depends on the other rows (tests/test_model.py checks this on the real champion);
  - attention, norms and softmax are computed row by row with the same calls a one-token pass makes.

`dtype=np.float64` gives the exact-math path used by tests to judge the float32 path. Weights are
dequantized once at load (quant.py); the GPU path (later) keeps them quantized.
Not here: sampling (verify.py), the generation loop (engine.py), caches (kv.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import PyspecError
from ..formats.gguf import GGUFError, GGUFFile
from ..kv import KVCache

TILE = 8  # rows per matrix-product tile; every product sees exactly this many rows
# A reduced head's logit for every id outside it (Model.reduce_head): finite, so that a row whose
# every kept id a processor masks (a JSON schema) still has a softmax, and so far below any real
# logit that its probability is exactly 0 in float32 (exp(-1e30 - max) underflows).
OUTSIDE_HEAD = -1e30


class ModelError(PyspecError, ValueError):
    """The GGUF holds a model pyspec cannot run."""

    code = "bad_model"


@dataclass(frozen=True)
class Config:
    n_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    rope_base: float
    rms_eps: float

    @classmethod
    def from_metadata(cls, md: dict) -> "Config":
        arch = md.get("general.architecture")
        if arch != "llama":
            raise ModelError(f"architecture {arch!r} is not supported; pyspec runs 'llama' models")

        def get(key, default=None, kind=int):
            v = md.get(f"llama.{key}", default)
            if v is None:
                raise ModelError(f"metadata key 'llama.{key}' is missing; the GGUF is incomplete")
            if kind is int and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise ModelError(f"metadata 'llama.{key}' = {v!r} must be a positive integer; "
                                 "the GGUF is corrupt")
            if kind is float and (not isinstance(v, (int, float)) or not v > 0):
                raise ModelError(f"metadata 'llama.{key}' = {v!r} must be a positive number")
            return v

        d_model, n_heads = get("embedding_length"), get("attention.head_count")
        n_kv = get("attention.head_count_kv", n_heads)
        if d_model % n_heads or n_heads % n_kv:
            raise ModelError(f"head counts {n_heads}/{n_kv} do not divide width {d_model}")
        head_dim = d_model // n_heads
        if head_dim % 2:
            raise ModelError(f"head size {head_dim} is odd; RoPE needs pairs")
        if get("rope.dimension_count", head_dim) != head_dim:
            raise ModelError("partial RoPE is not supported")
        vocab = md.get("llama.vocab_size") or len(md.get("tokenizer.ggml.tokens", ()))
        if not isinstance(vocab, int) or vocab <= 0:
            raise ModelError("the vocabulary size is unknown (no llama.vocab_size and no tokens)")
        return cls(n_layers=get("block_count"), d_model=d_model, d_ff=get("feed_forward_length"),
                   n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim, vocab_size=vocab,
                   context_length=get("context_length"),
                   rope_base=float(get("rope.freq_base", 10000.0, float)),
                   rms_eps=float(get("attention.layer_norm_rms_epsilon", None, float)))


LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")


def layer_shapes(cfg: Config) -> dict[str, tuple]:
    """The shape of each of a layer's tensors (LAYER_TENSORS), in the GGUF's (n_out, n_in)."""
    d, hd = cfg.d_model, cfg.head_dim
    return {"attn_norm": (d,), "attn_q": (cfg.n_heads * hd, d),
            "attn_k": (cfg.n_kv_heads * hd, d), "attn_v": (cfg.n_kv_heads * hd, d),
            "attn_output": (d, cfg.n_heads * hd), "ffn_norm": (d,),
            "ffn_gate": (cfg.d_ff, d), "ffn_up": (cfg.d_ff, d), "ffn_down": (d, cfg.d_ff)}


def shape_error(source: str, name: str, got: tuple, want: tuple) -> ModelError:
    """The one wording of a tensor whose shape is not the one the file's metadata gives it
    (Model on loading, load.check_tensors before it), naming the file."""
    return ModelError(f"{source}: tensor {name!r} has shape {tuple(got)}, but the file's own "
                      f"metadata makes it {tuple(want)}; the file is broken or not a model "
                      "pyspec can run: download it again or pick another model")


def load_tensors(f: GGUFFile, cfg: Config, load):
    """(tok_embd, out_norm, head, layers) of a Llama GGUF, each made by `load(name, shape)`;
    the CPU model dequantizes there, the GPU model uploads. A missing output.weight means the
    head is tied to the embedding."""
    d, shapes = cfg.d_model, layer_shapes(cfg)
    try:
        tok_embd = load("token_embd.weight", (cfg.vocab_size, d))                 # (vocab, d)
        out_norm = load("output_norm.weight", (d,))
        head = (load("output.weight", (cfg.vocab_size, d))
                if f.has("output.weight") else tok_embd)                          # (vocab, d)
        layers = [{n: load(f"blk.{i}.{n}.weight", shapes[n]) for n in LAYER_TENSORS}
                  for i in range(cfg.n_layers)]
    except GGUFError as e:
        raise ModelError(f"{f.source} is not a complete Llama model: {e.reason}") from e
    return tok_embd, out_norm, head, layers


def matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x (m, n_in) @ w.T for w (n_out, n_in), on zero-padded tiles of TILE rows -> (m, n_out)."""
    m = x.shape[0]
    out = np.empty((m, w.shape[0]), x.dtype)
    tile = np.zeros((TILE, x.shape[1]), x.dtype)
    for i in range(0, m, TILE):
        rows = min(TILE, m - i)
        tile[:rows] = x[i:i + rows]
        tile[rows:] = 0
        out[i:i + rows] = (tile @ w.T)[:rows]
    return out


def _plain_matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x (m, n_in) @ w.T; one row becomes a matrix-vector product. Not batch-invariant."""
    return (w @ x[0])[None] if x.shape[0] == 1 else x @ w.T


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x (m, d) -> (m, d). numpy reduces each row of a C-contiguous array along its last axis with
    the same pairwise summation whatever m is, so rows stay independent (tested)."""
    ms = np.mean(x * x, axis=-1, keepdims=True)                         # (m, 1)
    return x / np.sqrt(ms + x.dtype.type(eps)) * weight


def prefill(model: "Model", kv: KVCache, prompt: list[int], exact: bool = True,
            start: int = 0) -> None:
    """Fill the cache with every prompt token but the last: the first decoding step feeds that
    one, so a cache always lags the token sequence by one row. Rows below `start` are kept
    (they must hold prompt[:start]: a conversation's earlier turns)."""
    kv.truncate(start)
    if len(prompt) - 1 > start:
        model.forward(prompt[start:-1], kv, last_only=True, exact=exact)
        kv.commit(len(prompt) - 1 - start)


class LoadedWeights:
    """What every loaded model (this numpy one, gpu.GPUModel) says about its weights: the sha256
    of its GGUF file and the bytes its tensors take where they live."""

    def sha256(self) -> str:
        """sha256 of the GGUF file's bytes (computed once)."""
        if self._sha256 is None:  # set to None by each model's __init__
            self._sha256 = self.file.sha256()
        return self._sha256

    @property
    def weight_bytes(self) -> int:
        n = self.tok_embd.nbytes + self.out_norm.nbytes
        n += sum(w.nbytes for layer in self.layers for w in layer.values())
        rows = getattr(self, "_head_rows", None)   # a numpy draft's reduced head: a copy
        n += 0 if rows is None else rows.nbytes
        return n + (0 if self.head is self.tok_embd else self.head.nbytes)


class Model(LoadedWeights):
    """Weights + config. `forward` runs any prefix of the layers (the self:L draft uses the first L)."""

    def __init__(self, f: GGUFFile, dtype=np.float32):
        self._open(f, dtype)
        self.tok_embd, self.out_norm, self.head, self.layers = load_tensors(f, self.config,
                                                                            self._load)

    def _open(self, f: GGUFFile, dtype) -> None:
        """Everything but the tensors: config, dtype, metadata, RoPE frequencies."""
        self.config = cfg = Config.from_metadata(f.metadata)
        self.dtype = np.dtype(dtype)
        self.metadata = f.metadata
        self.source = f.source
        self.file = f
        self._sha256: str | None = None
        hd = cfg.head_dim
        half = hd // 2
        self.inv_freq = (cfg.rope_base ** (-np.arange(half, dtype=np.float64) * 2 / hd))  # (hd/2,)

    def _load(self, name: str, shape: tuple) -> np.ndarray:
        """Tensor `name` dequantized to the model's dtype, checked to have `shape`."""
        w = self.file.dequantize(name)
        if w.shape != shape:
            raise shape_error(self.source, name, w.shape, shape)
        return w.astype(self.dtype, copy=False)

    @classmethod
    def load(cls, path, dtype=np.float32) -> "Model":
        return cls(GGUFFile.open(path), dtype)

    head_ids: np.ndarray | None = None   # a reduced head's ids (reduce_head), sorted

    def reduce_head(self, ids) -> None:
        """Keep only the head rows `ids` (a draft's reduced vocabulary): `forward`'s logits are
        OUTSIDE_HEAD everywhere else, so a drafter never proposes those ids and its q is 0
        there. Verification sees that q, so the output stays the champion's. For drafts: the
        head product shrinks by the rows cut (on the numpy engine most of a draft step)."""
        ids = np.unique(np.asarray(ids, dtype=np.int64))
        if ids.size == 0 or ids[0] < 0 or ids[-1] >= self.config.vocab_size:
            span = f" from {ids[0]} to {ids[-1]}" if ids.size else ""
            raise ModelError(f"a reduced head needs ids in [0, {self.config.vocab_size}); got "
                             f"{ids.size} ids{span}")
        self.head_ids = ids
        self._head_rows = np.ascontiguousarray(self.head[ids])           # (len(ids), d)

    def new_cache(self, max_ctx: int | None = None, n_layers: int | None = None) -> KVCache:
        cfg = self.config
        ctx = min(max_ctx or cfg.context_length, cfg.context_length)
        return KVCache(n_layers or cfg.n_layers, ctx, cfg.n_kv_heads, cfg.head_dim, self.dtype)

    def rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Rotate adjacent pairs (x[2i], x[2i+1]) by pos * base^(-2i/hd) (llama.cpp NORM mode;
        the GGUF converter permutes Q/K rows for it). x (m, heads, hd) -> same."""
        ang = positions[:, None].astype(np.float64) * self.inv_freq[None, :]   # (m, hd/2)
        cos = np.cos(ang).astype(self.dtype)[:, None, :]
        sin = np.sin(ang).astype(self.dtype)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    def attention(self, q: np.ndarray, kc: np.ndarray, vc: np.ndarray,
                  positions: np.ndarray, exact: bool = True) -> np.ndarray:
        """q (m, n_heads, hd); kc, vc (max_ctx, n_kv, hd) -> (m, n_heads*hd), one row at a time:
        row i attends to positions [0, positions[i]] exactly as a one-token pass would.
        exact=False (drafts) computes blocks of rows at once under a causal mask."""
        cfg = self.config
        group = cfg.n_heads // cfg.n_kv_heads  # query head h reads kv head h // group
        scale = self.dtype.type(1.0 / np.sqrt(cfg.head_dim))
        if not exact and len(positions) > 1:
            return self._attention_blocks(q, kc, vc, positions, group, scale)
        out = np.empty((q.shape[0], cfg.n_heads * cfg.head_dim), self.dtype)
        for i, pos in enumerate(positions):
            qi = q[i].reshape(cfg.n_kv_heads, group, cfg.head_dim)        # (kv, group, hd)
            k = kc[:pos + 1].transpose(1, 2, 0)                            # (kv, hd, t)
            v = vc[:pos + 1].transpose(1, 0, 2)                            # (kv, t, hd)
            s = np.matmul(qi, k) * scale                                   # (kv, group, t)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            out[i] = np.matmul(s, v).reshape(-1)                           # (kv, group, hd)
        return out

    def _attention_blocks(self, q, kc, vc, positions, group: int, scale,
                          block: int = 256) -> np.ndarray:
        """`attention` for `block` query rows per product (a draft's prefill: hundreds of rows
        through a few layers). Row i still sees keys [0, positions[i]] only; the sums run in
        another order, so the numbers differ from the row loop in the last bits."""
        cfg = self.config
        m, hd, kvh = q.shape[0], cfg.head_dim, cfg.n_kv_heads
        out = np.empty((m, cfg.n_heads * hd), self.dtype)
        for a in range(0, m, block):
            pos = positions[a:a + block]
            b, t = len(pos), int(pos.max()) + 1
            qb = q[a:a + b].reshape(b, kvh, group, hd).transpose(1, 0, 2, 3)
            s = np.matmul(qb.reshape(kvh, b * group, hd), kc[:t].transpose(1, 2, 0)) * scale
            s = s.reshape(kvh, b, group, t)
            future = np.arange(t)[None, :] > pos[:, None]                    # (b, t): masked keys
            s = np.where(future[None, :, None, :], -np.inf, s)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            o = np.matmul(s.reshape(kvh, b * group, t), vc[:t].transpose(1, 0, 2))  # (kv, b*g, hd)
            out[a:a + b] = o.reshape(kvh, b, group, hd).transpose(1, 0, 2, 3).reshape(b, -1)
        return out

    def scratch_bytes(self, rows: int, logit_rows: int) -> int:
        """Activation bytes of a pass over `rows` tokens producing `logit_rows` logits rows."""
        cfg = self.config
        per_row = 4 * cfg.d_model + 2 * cfg.n_kv_heads * cfg.head_dim + 3 * cfg.d_ff
        return (rows * per_row + logit_rows * cfg.vocab_size) * self.dtype.itemsize

    def product(self, x: np.ndarray, w: np.ndarray, exact: bool = True) -> np.ndarray:
        """x (m, n_in) @ w.T -> (m, n_out): `matmul`'s tiles, or plain BLAS when not exact.
        fastcpu.FastModel replaces it with row-at-a-time products."""
        return matmul(x, w) if exact else _plain_matmul(x, w)

    def forward(self, tokens, kv: KVCache, n_layers: int | None = None,
                last_only: bool = False, exact: bool = True,
                logits_from: int = 0, inputs: np.ndarray | None = None) -> np.ndarray:
        """Feed tokens at the next positions of `kv` (appending their rows) -> logits of rows
        [logits_from, m) (m - logits_from, vocab); last_only is logits_from = m - 1.
        `n_layers` runs only the first layers. `inputs` (m, d) replaces the token embeddings as
        the first residual (an EAGLE-style head's input products). When kv keeps states, each
        row's final residual state (before the final norm) is stored there.

        exact=False uses plain BLAS products (a one-token pass becomes a matrix-vector product,
        several times faster) and gives up batch invariance: for drafts, whose numbers only ever
        affect speed, never for the champion."""
        cfg = self.config
        mm = lambda x, w: self.product(x, w, exact)  # noqa: E731
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise ValueError("forward needs at least one token")
        if tokens.min() < 0 or tokens.max() >= cfg.vocab_size:
            raise ValueError(f"token id out of range [0, {cfg.vocab_size})")
        m = tokens.size
        start = kv.append(m)
        positions = np.arange(start, start + m)
        x = self.tok_embd[tokens] if inputs is None else inputs            # (m, d)
        eps = cfg.rms_eps
        for li, w in enumerate(self.layers[:n_layers or cfg.n_layers]):
            h = rms_norm(x, w["attn_norm"], eps)                            # (m, d)
            q = self.rope(mm(h, w["attn_q"]).reshape(m, cfg.n_heads, cfg.head_dim), positions)
            k = self.rope(mm(h, w["attn_k"]).reshape(m, cfg.n_kv_heads, cfg.head_dim),
                          positions)
            kv.k[li, start:start + m] = k
            kv.v[li, start:start + m] = mm(h, w["attn_v"]).reshape(m, cfg.n_kv_heads,
                                                                        cfg.head_dim)
            x = x + mm(self.attention(q, kv.k[li], kv.v[li], positions, exact), w["attn_output"])
            h = rms_norm(x, w["ffn_norm"], eps)
            g = mm(h, w["ffn_gate"])                                        # (m, d_ff)
            x = x + mm(g / (1 + np.exp(-g)) * mm(h, w["ffn_up"]), w["ffn_down"])
        if kv.states is not None and (n_layers or cfg.n_layers) >= cfg.n_layers:
            kv.states[start:start + m] = x   # final states only, never a self:L draft's
        x = rms_norm(x[m - 1:] if last_only else x[logits_from:], self.out_norm, eps)
        if self.head_ids is None:
            return mm(x, self.head)                                           # (rows, vocab)
        logits = np.full((x.shape[0], cfg.vocab_size), OUTSIDE_HEAD, self.dtype)
        logits[:, self.head_ids] = mm(x, self._head_rows)
        return logits
