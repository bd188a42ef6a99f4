"""The reference forward of every model family (config.py) on the CPU, in numpy.

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

import numpy as np

from ..formats.gguf import GGUFFile
from ..kv import KVCache
from .config import (  # noqa: F401 - Config and its helpers, imported from here by many modules
    ARCHITECTURES,
    LAYER_TENSORS,
    Config,
    ModelError,
    layer_shapes,
    layer_tensors,
    load_tensors,
    rope_factors,
    rope_inv_freq,
    shape_error,
    tensor_name,
)

TILE = 8  # rows per matrix-product tile; every product sees exactly this many rows
# A reduced head's logit for every id outside it (Model.reduce_head): finite, so that a row whose
# every kept id a processor masks (a JSON schema) still has a softmax, and so far below any real
# logit that its probability is exactly 0 in float32 (exp(-1e30 - max) underflows).
OUTSIDE_HEAD = -1e30


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
    # np.mean's own steps (a sum, then a division by the count as an intp), without its
    # Python overhead: the same bits, a tenth of a tiny model's forward pass less
    ms = np.add.reduce(x * x, axis=-1, keepdims=True)                   # (m, 1)
    np.true_divide(ms, np.intp(x.shape[-1]), out=ms, casting="unsafe")
    return x / np.sqrt(ms + x.dtype.type(eps)) * weight


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool) -> np.ndarray:
    """x (m, heads, hd) with its pairs rotated by angles of cos, sin (m, 1, hd/2): pairs
    (2i, 2i+1), or (i, i + hd/2) when `neox`."""
    half = x.shape[-1] // 2
    i0, i1 = (slice(0, half), slice(half, None)) if neox else (slice(0, None, 2),
                                                               slice(1, None, 2))
    x0, x1 = x[..., i0], x[..., i1]
    out = np.empty_like(x)
    out[..., i0] = x0 * cos - x1 * sin
    out[..., i1] = x0 * sin + x1 * cos
    return out


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh form (ggml_gelu): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    c = x.dtype.type(np.sqrt(2 / np.pi))
    return x.dtype.type(0.5) * x * (1 + np.tanh(c * (x + x.dtype.type(0.044715) * x * x * x)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def prefill(model: Model, kv: KVCache, prompt: list[int], exact: bool = True,
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
        self.rope_freqs = rope_factors(f, cfg)                  # None or (hd/2,) float32
        # (hd/2,) per kind of layer: [global, local]
        self.inv_freq = [rope_inv_freq(cfg, local, self.rope_freqs) for local in (False, True)]

    def _load(self, name: str, shape: tuple) -> np.ndarray:
        """Tensor `name` dequantized to the model's dtype, checked to have `shape`."""
        w = self.file.dequantize(name)
        if w.shape != shape:
            raise shape_error(self.source, name, w.shape, shape)
        return w.astype(self.dtype, copy=False)

    @classmethod
    def load(cls, path, dtype=np.float32) -> Model:
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

    def rope_angles(self, positions: np.ndarray, local: bool) -> tuple[np.ndarray, np.ndarray]:
        """(cos, sin) of each position's angles, (m, hd/2) each, in the model's dtype."""
        ang = positions[:, None].astype(np.float64) * self.inv_freq[local][None, :]  # (m, hd/2)
        return np.cos(ang).astype(self.dtype), np.sin(ang).astype(self.dtype)

    def rope(self, x: np.ndarray, positions: np.ndarray, local: bool = False) -> np.ndarray:
        """Rotate each head's pairs by pos * inv_freq: adjacent pairs (x[2i], x[2i+1]) (llama.cpp
        NORM mode; the llama converter permutes Q/K rows for it) or, with config.rope_neox,
        (x[i], x[i + hd/2]) (NEOX mode). x (m, heads, hd) -> same."""
        cos, sin = self.rope_angles(positions, local)
        return rotate(x, cos[:, None, :], sin[:, None, :], self.config.rope_neox)

    def attention(self, q: np.ndarray, kc: np.ndarray, vc: np.ndarray,
                  positions: np.ndarray, exact: bool = True, window: int = 0,
                  keys: list[np.ndarray] | None = None) -> np.ndarray:
        """q (m, n_heads, hd); kc, vc (max_ctx, n_kv, hd) -> (m, n_heads*hd), one row at a time:
        row i attends to positions [0, positions[i]] exactly as a one-token pass would, or to the
        last `window` of them (a sliding-window layer, itself included, as llama.cpp masks).
        `keys` (a tree pass): row i's slots in position order (KVCache.lineage), positions[i] + 1
        of them, instead of slots [0, positions[i]]. exact=False (drafts) computes blocks of
        rows at once under a causal mask (not for trees)."""
        cfg = self.config
        group = cfg.n_heads // cfg.n_kv_heads  # query head h reads kv head h // group
        scale = self.dtype.type(cfg.attn_scale)
        if keys is None and not exact and len(positions) > 1:
            return self._attention_blocks(q, kc, vc, positions, group, scale, window)
        out = np.empty((q.shape[0], cfg.n_heads * cfg.head_dim), self.dtype)
        for i, pos in enumerate(positions):
            lo = max(0, pos + 1 - window) if window else 0
            qi = q[i].reshape(cfg.n_kv_heads, group, cfg.head_dim)        # (kv, group, hd)
            # A tree row's keys, gathered in position order, lie in memory as the chain's slice
            # does (same values, same strides): the same products, bit for bit.
            rows = slice(lo, pos + 1) if keys is None else keys[i][lo:]
            k = kc[rows].transpose(1, 2, 0)                                # (kv, hd, t)
            v = vc[rows].transpose(1, 0, 2)                                # (kv, t, hd)
            s = np.matmul(qi, k) * scale                                   # (kv, group, t)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            out[i] = np.matmul(s, v).reshape(-1)                           # (kv, group, hd)
        return out

    def _attention_blocks(self, q, kc, vc, positions, group: int, scale, window: int = 0,
                          block: int = 256) -> np.ndarray:
        """`attention` for `block` query rows per product (a draft's prefill: hundreds of rows
        through a few layers). Row i still sees keys [0, positions[i]] only (its window's on a
        local layer); the sums run in another order, so the numbers differ from the row loop in
        the last bits."""
        cfg = self.config
        m, hd, kvh = q.shape[0], cfg.head_dim, cfg.n_kv_heads
        out = np.empty((m, cfg.n_heads * hd), self.dtype)
        for a in range(0, m, block):
            pos = positions[a:a + block]
            b, t = len(pos), int(pos.max()) + 1
            qb = q[a:a + b].reshape(b, kvh, group, hd).transpose(1, 0, 2, 3)
            s = np.matmul(qb.reshape(kvh, b * group, hd), kc[:t].transpose(1, 2, 0)) * scale
            s = s.reshape(kvh, b, group, t)
            masked = np.arange(t)[None, :] > pos[:, None]                    # (b, t): future keys
            if window:
                masked |= np.arange(t)[None, :] <= pos[:, None] - window     # outside the window
            s = np.where(masked[None, :, None, :], -np.inf, s)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            o = np.matmul(s.reshape(kvh, b * group, t), vc[:t].transpose(1, 0, 2))  # (kv, b*g, hd)
            out[a:a + b] = o.reshape(kvh, b, group, hd).transpose(1, 0, 2, 3).reshape(b, -1)
        return out

    def scratch_bytes(self, rows: int, logit_rows: int) -> int:
        """Activation bytes of a pass over `rows` tokens producing `logit_rows` logits rows."""
        cfg = self.config
        per_row = (3 * cfg.d_model + (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
                   + 3 * cfg.d_ff)
        return (rows * per_row + logit_rows * cfg.vocab_size) * self.dtype.itemsize

    def product(self, x: np.ndarray, w: np.ndarray, exact: bool = True) -> np.ndarray:
        """x (m, n_in) @ w.T -> (m, n_out): `matmul`'s tiles, or plain BLAS when not exact.
        fastcpu.FastModel replaces it with row-at-a-time products."""
        return matmul(x, w) if exact else _plain_matmul(x, w)

    def _attention_branch(self, x, w: dict, kv: KVCache, li: int, start: int,
                          positions: np.ndarray, mm, exact: bool, keys=None) -> np.ndarray:
        """Layer li's attention over x (m, d), its K and V rows stored in kv -> (m, d), the
        output added to the residual (after its post-norm in gemma3)."""
        cfg, eps, m = self.config, self.config.rms_eps, x.shape[0]
        local = cfg.swa_layers[li]
        h = rms_norm(x, w["attn_norm"], eps)                                # (m, d)
        q, k, v = (mm(h, w[n]) for n in ("attn_q", "attn_k", "attn_v"))  # (m, heads*hd) ...
        if cfg.qkv_bias:
            q, k, v = q + w["attn_q.bias"], k + w["attn_k.bias"], v + w["attn_v.bias"]
        q = q.reshape(m, cfg.n_heads, cfg.head_dim)
        k = k.reshape(m, cfg.n_kv_heads, cfg.head_dim)
        if cfg.qk_norm:   # per head, over its head_dim values
            q, k = rms_norm(q, w["attn_q_norm"], eps), rms_norm(k, w["attn_k_norm"], eps)
        kv.k[li, start:start + m] = self.rope(k, positions, local)
        kv.v[li, start:start + m] = v.reshape(m, cfg.n_kv_heads, cfg.head_dim)
        a = self.attention(self.rope(q, positions, local), kv.k[li], kv.v[li], positions, exact,
                           cfg.sliding_window if local else 0, keys)
        o = mm(a, w["attn_output"])                                         # (m, d)
        return rms_norm(o, w["post_attention_norm"], eps) if cfg.post_norms else o

    def _ffn_branch(self, x, w: dict, mm) -> np.ndarray:
        """The gated FFN over x (m, d) -> (m, d), the output added to the residual."""
        cfg = self.config
        h = rms_norm(x, w["ffn_norm"], cfg.rms_eps)
        g = mm(h, w["ffn_gate"])                                            # (m, d_ff)
        act = gelu_tanh(g) if cfg.act == "gelu_tanh" else silu(g)
        f = mm(act * mm(h, w["ffn_up"]), w["ffn_down"])                     # (m, d)
        return rms_norm(f, w["post_ffw_norm"], cfg.rms_eps) if cfg.post_norms else f

    def forward(self, tokens, kv: KVCache, n_layers: int | None = None,
                last_only: bool = False, exact: bool = True,
                logits_from: int = 0, inputs: np.ndarray | None = None,
                parents=None) -> np.ndarray:
        """Feed tokens at the next positions of `kv` (appending their rows) -> logits of rows
        [logits_from, m) (m - logits_from, vocab); last_only is logits_from = m - 1.
        `n_layers` runs only the first layers. `inputs` (m, d) replaces the token embeddings as
        the first residual (an EAGLE-style head's input products). When kv keeps states, each
        row's final residual state (before the final norm) is stored there.

        `parents` (m,) makes the pass a tree's: row i is written at the next free slot but sits
        under the row at slot parents[i] (an earlier row of this pass, a pending row, or the
        last committed one), at that row's position + 1, and attends to the committed rows and
        its own ancestors only (KVCache.append_tree, lineage). A node's logits are those of its
        path fed as a chain, bit for bit (tests/test_model.py).

        exact=False uses plain BLAS products (a one-token pass becomes a matrix-vector product,
        several times faster) and gives up batch invariance: for drafts, whose numbers only ever
        affect speed, never for the champion."""
        cfg = self.config
        mm = lambda x, w: self.product(x, w, exact)
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise ValueError("forward needs at least one token")
        if tokens.min() < 0 or tokens.max() >= cfg.vocab_size:
            raise ValueError(f"token id out of range [0, {cfg.vocab_size})")
        m = tokens.size
        if parents is None:
            start, keys = kv.append(m), None
            positions = np.arange(start, start + m)
        else:
            start = kv.append_tree(parents)
            keys = [kv.lineage(s) for s in range(start, start + m)]
            positions = np.array([len(k) - 1 for k in keys])
        x = self.tok_embd[tokens] if inputs is None else inputs            # (m, d)
        if cfg.embed_scale != 1.0 and inputs is None:
            x = x * self.dtype.type(cfg.embed_scale)
        for li, w in enumerate(self.layers[:n_layers or cfg.n_layers]):
            x = x + self._attention_branch(x, w, kv, li, start, positions, mm, exact, keys)
            x = x + self._ffn_branch(x, w, mm)
        if kv.states is not None and (n_layers or cfg.n_layers) >= cfg.n_layers:
            kv.states[start:start + m] = x   # final states only, never a self:L draft's
        x = rms_norm(x[m - 1:] if last_only else x[logits_from:], self.out_norm, cfg.rms_eps)
        if self.head_ids is None:
            return mm(x, self.head)                                           # (rows, vocab)
        logits = np.full((x.shape[0], cfg.vocab_size), OUTSIDE_HEAD, self.dtype)
        logits[:, self.head_ids] = mm(x, self._head_rows)
        return logits
