"""A model of one of cpu.model's families (llama, qwen2, qwen3, gemma3) on a GPU device: quantized
weights in buffers, a KV cache per layer, and the forward pass as a list of dispatches.

`GPUModel.forward_dispatches(slot, n_layers)` returns the dispatches of one pass: embedding (times
config.embed_scale), then per layer on a GPU: Q, K and V as one product (RMSNorm folded in, the
biases added (qwen2), Q and K rotated by RoPE as they are stored, K and V written straight into
the cache rows at the pass's positions) -> attention (a sliding window on gemma3's local layers)
-> output product (+ residual) -> gate and up as one product (RMSNorm folded in, SiLU- or
GELU-gated as it is stored) -> down product (+ residual); then the head (final norm folded in).
Families whose Q and K are normed per head before RoPE (qwen3, gemma3) store them unrotated and
a qk_norm pass norms and rotates them in place; gemma3's post-norms make each residual add a
pass of its own (the product into h, then x += rms_norm(h)). Dispatches per layer on a GPU:
llama and qwen2 5, qwen3 6, gemma3 8 (`dispatches_per_layer`); on a CPU adapter each pre-norm is
a pass of its own before its product (2 more per layer). The pass's rows and positions come from
its Step slot, so each slot's list is built once and re-encoded every cycle. A vocabulary table
larger than one storage binding (a 262,144-token head on a device that binds 128 MiB) is uploaded
in parts of rows (weights.upload_rows), and its embedding and head take a dispatch per part.
Every kernel computes row i the same way whatever the number of rows (batch invariance), which
is what makes greedy speculative output byte-identical to champion-only output on the GPU.

RoPE pairs: the kernels rotate adjacent outputs (2i, 2i + 1), which one matmul thread holds. A
NEOX-mode family (qwen2, qwen3, gemma3) rotates (i, i + hd/2); its Q and K rows (and their biases
and norm weights) are uploaded in the order (0, hd/2, 1, hd/2 + 1, ...) per head, which makes
its pairs adjacent (what llama.cpp's converter does to a llama's rows). Q.K is a sum over a
head's dims, so attention is unchanged; read_kv puts K back in the file's order.

The weights are uploaded one tensor at a time, each streamed to its buffer weights.STREAM_BYTES of
the file at a time (weights.stream_rows; the page reads them from OPFS as they go,
GGUFFile.from_reader); only a fused weight's parts (a layer's Q, K, V or gate and up) are whole
on the host while they are stacked. Nothing is dequantized on the CPU but the small vectors that
are stacked (biases, Q/K norms), so the host holds no second copy of the model.
Not here: sampling and acceptance (sampling.py), the speculative cycle (cycle.py, backend.py).
"""

from __future__ import annotations

import numpy as np

from ..cpu.config import (ROPE_FREQS, Config, ModelError, load_tensors, rope_factors,
                          rope_inv_freq)
from ..cpu.model import LoadedWeights
from ..formats.gguf import GGUFFile
from ..kv import KVCache
from . import ops, weights
from .device import ROWS_MAX, Device
from .step import Steps

# Tensors uploaded as part of a stack (or read on the host) after load_tensors, not alone.
_FUSED = tuple(f".{n}.weight" for n in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up",
                                         "attn_q_norm", "attn_k_norm"))
_FUSED += (".attn_q.bias", ".attn_k.bias", ".attn_v.bias", ROPE_FREQS)


_VOCAB_TABLES = ("token_embd.weight", "output.weight")


def whole_buffers(f: GGUFFile) -> dict[str, int]:
    """The buffers a model of `f`'s tensors needs on a GPU, each in one binding: name -> bytes.
    A layer's Q, K and V as one (attn_qkv), its gate and up as one (ffn_gate_up), as _stack
    uploads them; other tensors alone; a vocabulary table only weights.PART_ROWS of its rows, as it
    goes in row parts where it outgrows a binding (weights.upload_rows). The card's rule against an
    adapter's limits (apps/info.py)."""
    groups = {"attn_q.weight": "attn_qkv", "attn_k.weight": "attn_qkv",
              "attn_v.weight": "attn_qkv", "ffn_gate.weight": "ffn_gate_up",
              "ffn_up.weight": "ffn_gate_up"}
    sizes: dict[str, int] = {}
    for name, t in f.tensors.items():
        nbytes = weights.gpu_nbytes(t)
        if name in _VOCAB_TABLES and len(t.shape) == 2:
            rows = weights.PART_ROWS
            name, nbytes = f"{name} ({rows} rows)", nbytes // t.shape[0] * rows
        elif name.startswith("blk.") and name.split(".", 2)[-1] in groups:
            name = ".".join(name.split(".")[:2] + [groups[name.split(".", 2)[-1]]])
        sizes[name] = sizes.get(name, 0) + nbytes
    return sizes


def _parts(w) -> list:
    """[(first row, Weight)] of a vocabulary table: weights.RowParts' parts, or the whole Weight."""
    return list(w.parts) if isinstance(w, weights.RowParts) else [(0, w)]


def dispatches_per_layer(cfg: Config, cpu_adapter: bool) -> int:
    """The dispatches of one layer of `_layer`'s plan (tests and bench tie the two)."""
    n = 5 + cfg.qk_norm + 2 * cfg.post_norms
    return n + 2 * cpu_adapter


def _neox_rows(heads: int, hd: int) -> np.ndarray:
    """(heads * hd,) the rows of a NEOX-mode Q or K matrix in the order that makes its RoPE pairs
    (i, i + hd/2) adjacent: per head 0, hd/2, 1, hd/2 + 1, ..."""
    half = np.arange(hd // 2)
    per_head = np.stack([half, half + hd // 2], axis=1).reshape(-1)           # (hd,)
    return (np.arange(heads)[:, None] * hd + per_head[None, :]).reshape(-1)


class _Fused:
    """A tensor uploaded later as part of a fused product's weight (weights.Weight.upload_stack,
    upload_pair)."""

    def __init__(self, name: str):
        self.name = name


class GPUModel(LoadedWeights):
    """Weights + config + per-layer KV buffers on `dev`. The cache bookkeeping (committed and
    pending rows) is a kv.KVCache without arrays, so the CPU and GPU paths share one rule."""

    def __init__(self, dev: Device, f: GGUFFile, steps: Steps, max_ctx: int | None = None,
                 label: str = "model", lender: "GPUModel | None" = None):
        """`lender`: the champion on the same device, whose buffers serve the tensors `f`
        borrows (gguf.py) instead of a second upload."""
        self.dev = dev
        self._lender = lender
        self._lent: dict[str, weights.Weight] = {}
        self.file = f
        self.source = f.source
        self.metadata = f.metadata
        self.config = cfg = Config.from_metadata(f.metadata)
        self.steps = steps
        self.label = label
        self._sha256: str | None = None
        d, hd = cfg.d_model, cfg.head_dim
        self.tok_embd, self.out_norm, self.head, self.layers = load_tensors(f, cfg, self._load)
        for layer in self.layers:  # the fused products' weights, each from its tensors' bytes
            self._stack(layer)

        self.capacity = min(max_ctx or cfg.context_length, cfg.context_length)
        self.kv = KVCache(cfg.n_layers, self.capacity, cfg.n_kv_heads, hd, store=False)
        ctx, kv_row = self.capacity, cfg.n_kv_heads * hd
        # One buffer per layer keeps every binding under the 128 MiB storage-binding limit.
        self.k_cache = [dev.buffer(ctx * kv_row * 4, label=f"{label}.k{i}")   # (max_ctx, n_kv*hd)
                        for i in range(cfg.n_layers)]
        self.v_cache = [dev.buffer(ctx * kv_row * 4, label=f"{label}.v{i}")   # (max_ctx, n_kv*hd)
                        for i in range(cfg.n_layers)]
        # (max_ctx, hd/2, 2) cos, sin per kind of layer: [global, local] (gemma3's local base)
        factors = rope_factors(f, cfg)
        self.rope = [ops.rope_table(dev, rope_inv_freq(cfg, False, factors), ctx)]
        self.rope.append(ops.rope_table(dev, rope_inv_freq(cfg, True, factors), ctx, "rope local")
                         if any(cfg.swa_layers) else self.rope[0])
        R = ROWS_MAX
        self.tokens = dev.buffer(R * 4, label=f"{label}.tokens")               # (R,) u32
        self.x = dev.buffer(R * d * 4, label=f"{label}.x")                     # (R, d) residual
        self.h = dev.buffer(R * d * 4, label=f"{label}.h")    # (R, d) normed (CPU adapters)
        self.q = dev.buffer(R * cfg.n_heads * hd * 4, label=f"{label}.q")      # (R, heads*hd)
        self.att = dev.buffer(R * cfg.n_heads * hd * 4, label=f"{label}.att")  # (R, heads*hd)
        self.g = dev.buffer(R * cfg.d_ff * 4, label=f"{label}.g")              # (R, d_ff) silu(g)*u
        self.logits = dev.buffer(R * cfg.vocab_size * 4, label=f"{label}.logits")  # (R, vocab)
        # (R, n_heads, max_ctx) attention scores, shared by every layer
        # (dispatches run in order)
        self.scores = dev.buffer(ops.attention_scratch_bytes(cfg.n_heads, ctx), label=f"{label}.s")
        self._plans: dict[tuple, list] = {}
        self._plan_buffers: dict[tuple, list] = {}   # the uniforms each plan made (its params)

    def _stack(self, layer: dict) -> None:
        """Replace a layer's Q, K, V (and their biases and norms) and gate, up by the stacked
        weights the plan binds: attn_qkv, attn_qkv.bias (qwen2), attn_qk_norm (qwen3, gemma3),
        ffn_gate_up; NEOX-mode Q and K rows in adjacent-pair order (_neox_rows)."""
        cfg, dev, f = self.config, self.dev, self.file
        orders = [None, None, None]
        if cfg.rope_neox:
            orders[:2] = [_neox_rows(n, cfg.head_dim) for n in (cfg.n_heads, cfg.n_kv_heads)]
        layer["attn_qkv"] = weights.Weight.upload_stack(
            dev, f, [layer.pop(n).name for n in ("attn_q", "attn_k", "attn_v")], orders)
        if cfg.qkv_bias:
            names = [layer.pop(f"attn_{n}.bias").name for n in "qkv"]
            b = [f.dequantize(n).reshape(-1) for n in names]
            b = [v if o is None else v[o] for v, o in zip(b, orders)]
            layer["attn_qkv.bias"] = weights.Weight.vector(dev, np.concatenate(b), "+".join(names))
        if cfg.qk_norm:
            names = [layer.pop(n).name for n in ("attn_q_norm", "attn_k_norm")]
            head = _neox_rows(1, cfg.head_dim) if cfg.rope_neox else slice(None)
            g = np.concatenate([f.dequantize(n).reshape(-1)[head] for n in names])  # (2 hd,)
            layer["attn_qk_norm"] = weights.Weight.vector(dev, g, "+".join(names))
        layer["ffn_gate_up"] = weights.Weight.upload_pair(dev, f, layer.pop("ffn_gate").name,
                                                      layer.pop("ffn_up").name)

    def _load(self, name: str, shape: tuple) -> "weights.Weight":
        t = self.file.tensor(name)
        if tuple(t.shape) != shape:
            raise ModelError(f"tensor {name!r} has shape {tuple(t.shape)}, expected {shape}")
        if name.endswith(_FUSED):
            return _Fused(name)   # uploaded with its partners (attn_qkv, ffn_gate_up) after
        lent = self._lender.uploaded(name) if name in self.file.borrowed and self._lender else None
        if lent is not None:
            self._lent[name] = lent
            return lent
        if name in _VOCAB_TABLES:   # parts of rows where a large vocabulary outgrows a binding
            return weights.upload_rows(self.dev, self.file, name)
        return weights.Weight.upload(self.dev, self.file, name)

    def uploaded(self, name: str) -> "weights.Weight | None":
        """The buffer holding tensor `name` as uploaded alone (not fused), or None."""
        for w in (self.tok_embd, self.out_norm, self.head):
            if getattr(w, "name", None) == name:
                return w
        return None

    @property
    def weight_bytes(self) -> int:
        """The bytes of weights this model uploaded (lent buffers are the lender's)."""
        lent = {id(w): w.nbytes for w in self._lent.values()}
        return super().weight_bytes - sum(lent.values())

    def limit_context(self, max_ctx: int | None) -> None:
        """Start a fresh cache of max_ctx positions (default: all the buffers hold)."""
        if max_ctx and max_ctx > self.capacity:
            raise ValueError(f"the GPU cache was sized for {self.capacity} positions; load the "
                             f"model with max_ctx >= {max_ctx}")
        cfg = self.config
        self.kv = KVCache(cfg.n_layers, max_ctx or self.capacity, cfg.n_kv_heads, cfg.head_dim,
                          store=False)

    async def read_kv(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The first n K and V rows of every layer, (n_layers, n, n_kv, hd) each (tests)."""
        cfg = self.config
        shape = (n, cfg.n_kv_heads, cfg.head_dim)
        k = np.stack([await self.dev.read_array(b, np.float32, shape) for b in self.k_cache])
        v = [await self.dev.read_array(b, np.float32, shape) for b in self.v_cache]
        if cfg.rope_neox:   # back from the adjacent-pair order the rows were uploaded in
            order, k_file = _neox_rows(1, cfg.head_dim), np.empty_like(k)
            k_file[..., order] = k
            k = k_file
        return k, np.stack(v)

    # --- bookkeeping ----------------------------------------------------------------------------
    def scratch_bytes(self, rows: int, logit_rows: int) -> int:
        cfg = self.config
        per_row = cfg.d_model + 2 * cfg.n_heads * cfg.head_dim + cfg.d_ff   # x, q, att, g
        return 4 * (rows * per_row + logit_rows * cfg.vocab_size)

    # --- the forward, as dispatches -----------------------------------------------------------
    def forward_dispatches(self, slot: int, n_layers: int | None = None, tokens=None,
                           logits: bool = True, tree: bool = False) -> list:
        """The dispatches of one pass whose rows/positions are Step slot `slot`: feeds
        tokens[:rows] (default self.tokens) at positions pos.., writes K/V rows there, logits
        (rows, vocab) into self.logits. `n_layers` runs only the first layers (the self:L draft).
        logits=False leaves out the head (and its norm): a prefill pass only fills the cache.
        tree=True: a plan that also runs a tree's pass (a Step with FLAG_TREE; a chain's has
        its own, attention without the tree's walk). Built once per (slot, n_layers, tokens
        buffer, logits, tree) and cached."""
        n_layers = n_layers or self.config.n_layers
        tokens = self.tokens if tokens is None else tokens
        key = (slot, n_layers, id(tokens), logits, tree)
        if key not in self._plans:
            # The plan's uniforms are this model's, whoever asked for it (an engine's backend
            # frees its own buffers on close, never these): kept per plan for forget_plans.
            with self.dev.owned(self._plan_buffers.setdefault(key, [])):
                self._plans[key] = self._plan(slot, n_layers, tokens, logits, tree)
        return self._plans[key]

    def _plan(self, slot: int, n_layers: int, tokens, logits: bool, tree: bool) -> list:
        cfg = self.config
        dev, step = self.dev, self.steps.binding(slot)
        out = [ops.embed(dev, part, tokens, self.x, step, scale=cfg.embed_scale, first=first,
                         total=cfg.vocab_size) for first, part in _parts(self.tok_embd)]

        def normed(weight) -> tuple:
            """(input, kwargs) of a product over rms_norm(x): on a GPU the product folds the
            norm in; on a CPU adapter, where every invocation is a SIMD lane of one core, summing
            the squares again in every thread costs more than a pass of its own (measured on
            lavapipe), so the norm runs first into h."""
            if not dev.is_cpu:
                return self.x, {"norm": weight, "eps": cfg.rms_eps}
            out.append(ops.rmsnorm(dev, self.x, weight, self.h, step, eps=cfg.rms_eps))
            return self.h, {}

        for i, w in enumerate(self.layers[:n_layers]):
            self._layer(out, i, w, step, normed, tree)
        if logits:
            h, norm = normed(self.out_norm)
            for first, part in _parts(self.head):   # each part into its columns of the logits
                y = (self.logits, 4 * first, dev.size_of(self.logits) - 4 * first)
                out.append(ops.matmul(dev, part, h, y if first else self.logits, step,
                                      y_stride=cfg.vocab_size, **norm))
        return out

    def _layer(self, out: list, i: int, w: dict, step, normed, tree: bool) -> None:
        """Append layer i's dispatches (dispatches_per_layer of them) to `out`."""
        cfg, dev, ctx = self.config, self.dev, self.capacity
        hd, local = cfg.head_dim, cfg.swa_layers[i]
        kc, vc = self.k_cache[i], self.v_cache[i]
        heads = {"n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads, "head_dim": hd,
                 "max_ctx": ctx}
        rope = {"rope": self.rope[local], "head_dim": hd, "max_ctx": ctx}
        # Q, K and V in one product over the normed residual: Q and K rotated as they are stored
        # (the RoPE epilogue) unless a per-head norm must come first (qk_norm's pass does both),
        # K and V straight into the cache rows of this pass's positions.
        h, norm = normed(w["attn_norm"])
        bias = {"bias": w["attn_qkv.bias"]} if cfg.qkv_bias else {}
        out.append(ops.matmul(dev, w["attn_qkv"], h, self.q, step,
                              qkv=(kc, vc, cfg.n_heads * hd, cfg.n_kv_heads * hd),
                              **norm, **bias, **({} if cfg.qk_norm else rope)))
        if cfg.qk_norm:
            out.append(ops.qk_norm(dev, self.q, kc, w["attn_qk_norm"], rope["rope"], step,
                                   eps=cfg.rms_eps, **heads))
        out.append(ops.attention(dev, self.q, kc, vc, self.scores, self.att, step,
                                 scale=cfg.attn_scale,
                                 window=cfg.sliding_window if local else 0, tree=tree, **heads))
        out += self._residual(w["attn_output"], self.att, w.get("post_attention_norm"), step)
        h, norm = normed(w["ffn_norm"])
        out.append(ops.matmul(dev, w["ffn_gate_up"], h, self.g, step, gate=cfg.act, **norm))
        out += self._residual(w["ffn_down"], self.g, w.get("post_ffw_norm"), step)

    def _residual(self, weight, x, post_norm, step) -> list:
        """x += weight @ x_in as the product's epilogue, or with a post-norm (gemma3) the product
        into h and then x += rms_norm(h, post_norm): the norm needs the whole output row, which
        no thread of the product holds."""
        dev = self.dev
        if post_norm is None:
            return [ops.matmul(dev, weight, x, self.x, step, accumulate=True)]
        return [ops.matmul(dev, weight, x, self.h, step),
                ops.rmsnorm(dev, self.h, post_norm, self.x, step, eps=self.config.rms_eps,
                            accumulate=True)]

    def forget_plans(self, tokens=None) -> None:
        """Drop the plans fed from buffer `tokens` (every plan when None) and free their
        uniforms: the plans a self:L draft had built over its feed buffer, which its backend
        frees on close (a later buffer could get the same id and find a plan bound to the freed
        one), or a draft model's, with the model."""
        for key in [key for key in self._plans if tokens is None or key[2] == id(tokens)]:
            del self._plans[key]
            self.dev.free(self._plan_buffers.pop(key))

    def feed(self, tokens, slot: int, tree=None) -> int:
        """Reserve KV rows for `tokens` (<= ROWS_MAX), write them and the Step slot; returns the
        first cache row. `tree`: (base, parents) where the rows are nodes of a tree rooted at
        cache row base (step.pack_step). The caller submits forward_dispatches(slot) after."""
        tokens = np.asarray(tokens, dtype=np.uint32).reshape(-1)
        if not 1 <= tokens.size <= ROWS_MAX:
            raise ValueError(f"a pass carries 1..{ROWS_MAX} tokens, got {tokens.size}")
        if int(tokens.max()) >= self.config.vocab_size:
            raise ValueError(f"token id out of range [0, {self.config.vocab_size})")
        pos = self.kv.append(tokens.size)
        self.dev.write(self.tokens, tokens)
        self.steps.set(slot, rows=tokens.size, pos=pos, tree=tree)
        return pos

    def prefill(self, prompt: list[int], slot: int, start: int = 0,
                end: int | None = None) -> None:
        """Commit the rows of prompt[start:end] after the `start` rows kept (they hold
        prompt[:start]); `end` defaults to every prompt token but the last (the cache lags the
        sequence by one row, as on the CPU). ROWS_MAX rows per submission. No logits: nothing
        reads them (the last prompt token is fed by the first cycle), so the head, the largest
        product, is left out; the cache rows are those of a pass with the head."""
        end = len(prompt) - 1 if end is None else min(end, len(prompt) - 1)
        if start != self.kv.committed or self.kv.pending:
            self.kv.truncate(start)
        for i in range(start, end, ROWS_MAX):
            rows = prompt[i:min(i + ROWS_MAX, end)]
            self.feed(rows, slot)
            self.steps.upload(slot + 1)
            self.dev.submit(self.forward_dispatches(slot, logits=False))
            self.kv.commit(len(rows))

    async def read_logits(self, tokens: list[int], slot: int, tree=None) -> np.ndarray:
        """Feed tokens at the next rows (pending; a tree's nodes with `tree`, as `feed`) and read
        back their logits (rows, vocab). For tests and scoring."""
        rows = len(tokens)
        self.feed(tokens, slot, tree)
        self.steps.upload(slot + 1)
        self.dev.submit(self.forward_dispatches(slot, tree=tree is not None))
        return await self.dev.read_array(self.logits, np.float32, (rows, self.config.vocab_size))
