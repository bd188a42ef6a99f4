"""A PyTorch Llama with pyspec's semantics, for making training text and training drafts.

Training only: PyTorch is never a runtime dependency of pyspec. The forward follows
`pyspec.cpu.model.Model.forward` (RMSNorm, Q/K/V, llama.cpp NORM-mode RoPE over adjacent pairs,
grouped-query causal attention, SiLU-gated MLP, tied or separate head) so that a draft trained
here means the same thing when pyspec runs it. `from_gguf` reads weights through pyspec's own GGUF
reader and dequantizer; `to_gguf` writes a draft with the champion's tokenizer metadata.

Two ways to run it:
- `forward(tokens)`: a whole right-padded batch (B, T) at positions 0..T-1 (training, scoring);
- `generate(...)`: left-padded prompts, then one token per step with a KV cache (data making).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from pyspec.cpu.model import LAYER_TENSORS, Config
from pyspec.drafters.pairing import bind_borrowed
from pyspec.formats import gguf, ggufwrite, quant


@dataclass
class Shape:
    n_layers: int
    d: int
    d_ff: int
    n_heads: int
    n_kv: int
    vocab: int
    rope_base: float
    eps: float

    @property
    def hd(self) -> int:
        return self.d // self.n_heads

    @classmethod
    def of(cls, cfg: Config, n_layers: int | None = None) -> "Shape":
        return cls(n_layers or cfg.n_layers, cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.n_kv_heads,
                   cfg.vocab_size, cfg.rope_base, cfg.rms_eps)


class Layer(torch.nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.attn_norm = torch.nn.Parameter(torch.ones(s.d))
        self.attn_q = torch.nn.Linear(s.d, s.n_heads * s.hd, bias=False)
        self.attn_k = torch.nn.Linear(s.d, s.n_kv * s.hd, bias=False)
        self.attn_v = torch.nn.Linear(s.d, s.n_kv * s.hd, bias=False)
        self.attn_output = torch.nn.Linear(s.n_heads * s.hd, s.d, bias=False)
        self.ffn_norm = torch.nn.Parameter(torch.ones(s.d))
        self.ffn_gate = torch.nn.Linear(s.d, s.d_ff, bias=False)
        self.ffn_up = torch.nn.Linear(s.d, s.d_ff, bias=False)
        self.ffn_down = torch.nn.Linear(s.d_ff, s.d, bias=False)


def rms_norm(x, w, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w.to(x.dtype)


def rope(x, cos, sin):
    """x (B, heads, T, hd); cos, sin (B or 1, 1, T, hd/2): rotate pairs (x[2i], x[2i+1])."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


class Llama(torch.nn.Module):
    def __init__(self, s: Shape, tied: bool = True):
        super().__init__()
        self.s = s
        self.tok_embd = torch.nn.Embedding(s.vocab, s.d)
        self.layers = torch.nn.ModuleList(Layer(s) for _ in range(s.n_layers))
        self.out_norm = torch.nn.Parameter(torch.ones(s.d))
        self.head = None if tied else torch.nn.Linear(s.d, s.vocab, bias=False)
        inv = s.rope_base ** (-torch.arange(s.hd // 2, dtype=torch.float64) * 2 / s.hd)
        self.register_buffer("inv_freq", inv, persistent=False)       # (hd/2,) float64

    def head_weight(self):
        return self.tok_embd.weight if self.head is None else self.head.weight

    def angles(self, positions, dtype):
        """positions (B or 1, T) -> cos, sin (B or 1, 1, T, hd/2), computed in float64 as
        pyspec's reference does, then rounded."""
        ang = positions.to(torch.float64)[..., None] * self.inv_freq
        return torch.cos(ang).to(dtype)[:, None], torch.sin(ang).to(dtype)[:, None]

    def _attend(self, layer, h, cos, sin, mask, cache=None, at=None):
        s = self.s
        B, T, _ = h.shape
        q = rope(layer.attn_q(h).view(B, T, s.n_heads, s.hd).transpose(1, 2), cos, sin)
        k = rope(layer.attn_k(h).view(B, T, s.n_kv, s.hd).transpose(1, 2), cos, sin)
        v = layer.attn_v(h).view(B, T, s.n_kv, s.hd).transpose(1, 2)
        if cache is not None:                     # (B, n_kv, T_max, hd) each; write rows at..at+T
            cache[0][:, :, at:at + T] = k
            cache[1][:, :, at:at + T] = v
            k, v = cache[0][:, :, :at + T], cache[1][:, :, :at + T]
        if mask is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return layer.attn_output(o.transpose(1, 2).reshape(B, T, -1))

    def _block(self, layer, x, cos, sin, mask, cache=None, at=None):
        eps = self.s.eps
        x = x + self._attend(layer, rms_norm(x, layer.attn_norm, eps), cos, sin, mask, cache, at)
        h = rms_norm(x, layer.ffn_norm, eps)
        return x + layer.ffn_down(F.silu(layer.ffn_gate(h)) * layer.ffn_up(h))

    def features(self, tokens, taps=()):
        """tokens (B, T), right-padded, at positions 0..T-1 -> the final residual states
        (B, T, d), before the final norm. With `taps` (layer indices): (final, [the residual
        after each tapped layer, as the next layer's attention norm reads it]), the low and
        middle states an EAGLE-3-style head reads beside the final one."""
        B, T = tokens.shape
        x = self.tok_embd(tokens)
        cos, sin = self.angles(torch.arange(T, device=tokens.device)[None], x.dtype)
        tapped = {}
        for i, layer in enumerate(self.layers):
            x = self._block(layer, x, cos, sin, None)
            if i in taps:
                tapped[i] = rms_norm(x, self.layers[i + 1].attn_norm, self.s.eps)
        return (x, [tapped[i] for i in taps]) if taps else x

    def hidden(self, tokens):
        """tokens (B, T) -> final-normed states (B, T, d)."""
        return rms_norm(self.features(tokens), self.out_norm, self.s.eps)

    def forward(self, tokens):
        return self.hidden(tokens) @ self.head_weight().T.to(torch.get_default_dtype())

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new: int, temperatures: list[float],
                 stop: set[int], generator: torch.Generator) -> list[list[int]]:
        """Left-pad the prompts, then decode up to max_new tokens each (greedy where the
        temperature is 0) until a stop id. Returns the new ids of each prompt, stop id included."""
        dev = self.inv_freq.device
        dtype = self.tok_embd.weight.dtype
        B, P = len(prompts), max(map(len, prompts))
        pad = torch.tensor([P - len(p) for p in prompts], device=dev)                # (B,)
        tokens = torch.zeros(B, P, dtype=torch.long, device=dev)
        for b, p in enumerate(prompts):
            tokens[b, P - len(p):] = torch.tensor(p, device=dev)
        T_max = P + max_new
        s = self.s
        caches = [(torch.zeros(B, s.n_kv, T_max, s.hd, device=dev, dtype=dtype),
                   torch.zeros(B, s.n_kv, T_max, s.hd, device=dev, dtype=dtype))
                  for _ in self.layers]
        key_pos = torch.arange(T_max, device=dev)
        valid = key_pos[None] >= pad[:, None]                                        # (B, T_max)
        temps = torch.tensor(temperatures, device=dev, dtype=torch.float32)[:, None]
        out = torch.zeros(B, max_new, dtype=torch.long, device=dev)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        stops = torch.tensor(sorted(stop), device=dev)
        at, step_tokens = 0, tokens
        for i in range(max_new):
            T = step_tokens.shape[1]
            q_pos = torch.arange(at, at + T, device=dev)
            positions = (q_pos[None] - pad[:, None]).clamp(min=0)                    # (B, T)
            keys = key_pos[None, None, None, :at + T]
            # Why the diagonal: a padding row attends to itself, so that no row is all masked
            # (that would give NaN rows, and NaN cache rows poison later rows through 0 * NaN).
            mask = ((valid[:, None, None, :at + T] & (keys <= q_pos[None, None, :, None]))
                    | (keys == q_pos[None, None, :, None]))
            x = self.tok_embd(step_tokens)
            cos, sin = self.angles(positions, x.dtype)
            for layer, cache in zip(self.layers, caches):
                x = self._block(layer, x, cos, sin, mask, cache, at)
            logits = (rms_norm(x[:, -1], self.out_norm, s.eps) @ self.head_weight().T).float()
            greedy = logits.argmax(-1)
            probs = torch.softmax(logits / temps.clamp(min=1e-6), -1)
            sampled = torch.multinomial(probs, 1, generator=generator)[:, 0]
            nxt = torch.where(temps[:, 0] > 0, sampled, greedy)
            nxt = torch.where(done, torch.zeros_like(nxt), nxt)
            out[:, i] = nxt
            done |= torch.isin(nxt, stops)
            at += T
            step_tokens = nxt[:, None]
            if bool(done.all()):
                out = out[:, :i + 1]
                break
        result = []
        for row in out.tolist():
            n = next((j + 1 for j, t in enumerate(row) if t in stop), len(row))
            result.append(row[:n])
        return result


# --- GGUF in and out --------------------------------------------------------------------------

def from_gguf(path, layers: list[int] | None = None, device="cpu",
              lender=None) -> tuple[Llama, dict]:
    """A Llama from a GGUF (dequantized float32), optionally only the champion `layers` named,
    in that order; a draft that borrows tensors reads them from `lender` (the champion's path).
    Returns (model, metadata)."""
    f = gguf.GGUFFile.open(path)
    if f.borrowed:
        if lender is None:
            raise ValueError(f"{path} borrows {', '.join(f.borrowed)}: give its champion")
        bind_borrowed(f, gguf.GGUFFile.open(lender))
    cfg = Config.from_metadata(f.metadata)
    picks = list(range(cfg.n_layers)) if layers is None else list(layers)
    tied = not f.has("output.weight")
    m = Llama(Shape.of(cfg, len(picks)), tied=tied)
    t = lambda name: torch.from_numpy(np.ascontiguousarray(f.dequantize(name)))  # noqa: E731
    with torch.no_grad():
        m.tok_embd.weight.copy_(t("token_embd.weight"))
        m.out_norm.copy_(t("output_norm.weight"))
        if not tied:
            m.head.weight.copy_(t("output.weight"))
        for mine, src in zip(m.layers, picks):
            for name in LAYER_TENSORS:
                w = t(f"blk.{src}.{name}.weight")
                target = getattr(mine, name)
                (target if isinstance(target, torch.nn.Parameter) else target.weight).copy_(w)
    return m.to(device), dict(f.metadata)


def quantized_like(values: np.ndarray, type_id: int) -> np.ndarray:
    """What a tensor reads back as after quantizing it to `type_id` (float32, same shape)."""
    raw = quant.quantize(values, type_id)
    return quant.dequantize(raw, type_id, values.shape)


class FakeQ4_1(torch.nn.Module):
    """Quantization-aware training: a weight as Q4_1 reads it back (blocks of 32 along a row,
    f16 scale and minimum, round to nearest, as pyspec.formats.quant writes it), with the gradient passed
    straight through to the float weight. Registered with torch.nn.utils.parametrize."""

    def forward(self, w):
        x = w.reshape(-1, 32)
        lo = x.min(1, keepdim=True).values
        d = ((x.max(1, keepdim=True).values - lo) / 15).half().float()
        m = lo.half().float()
        inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
        q = torch.clamp(torch.round((x - m) * inv), 0, 15)
        return w + ((d * q + m).reshape(w.shape) - w).detach()


def to_gguf(model: Llama, champion_md: dict, path, name: str, extra: dict,
            embd_type: int = quant.Q4_1.type_id, matrix_type: int = quant.Q8_0.type_id,
            borrow_from: "gguf.GGUFFile | None" = None) -> None:
    """Write a draft GGUF with the champion's tokenizer and chat template. The head is tied to the
    embedding where the model's is (the champion's is); a model with a head of its own (one
    made from a champion with an untied output.weight) writes it as output.weight, in
    `embd_type`; norms stay F32. With `borrow_from` (the champion's file) the draft borrows the
    champion's token embedding (gguf.py) instead of holding a copy in `embd_type`: the model
    must then have trained with exactly that embedding (its dequantized values)."""
    s = model.s
    md = {k: v for k, v in champion_md.items()
          if k.startswith("tokenizer.") or k in ("general.architecture",)}
    md.update({"general.name": name, "llama.block_count": s.n_layers,
               "llama.context_length": champion_md["llama.context_length"],
               "llama.embedding_length": s.d, "llama.feed_forward_length": s.d_ff,
               "llama.attention.head_count": s.n_heads, "llama.attention.head_count_kv": s.n_kv,
               "llama.rope.freq_base": float(s.rope_base),
               "llama.attention.layer_norm_rms_epsilon": float(s.eps),
               "llama.rope.dimension_count": s.hd, "llama.vocab_size": s.vocab, **extra})
    get = lambda p: p.detach().float().cpu().numpy()  # noqa: E731
    tensors = {"token_embd.weight": (get(model.tok_embd.weight), embd_type),
               "output_norm.weight": (get(model.out_norm), quant.F32.type_id)}
    if model.head is not None:    # untied: a file without it would tie the head to the embedding
        tensors["output.weight"] = (get(model.head.weight), embd_type)
    for i, layer in enumerate(model.layers):
        for n in LAYER_TENSORS:
            p = getattr(layer, n)
            w = get(p if isinstance(p, torch.nn.Parameter) else p.weight)
            tensors[f"blk.{i}.{n}.weight"] = (w, quant.F32.type_id if n.endswith("norm")
                                              else matrix_type)
    if borrow_from is not None:
        lent = borrow_from.dequantize("token_embd.weight")
        if not np.array_equal(lent, tensors["token_embd.weight"][0]):
            raise ValueError("the draft's embedding is not the champion's: it cannot borrow it")
        del tensors["token_embd.weight"]
        md.update(ggufwrite.borrowed_metadata(borrow_from, ["token_embd.weight"]))
        md["pyspec.borrowed.from_champion_sha256"] = borrow_from.sha256()
    ggufwrite.write(path, md, tensors)


@torch.no_grad()
def grow(draft: Llama, champion: Llama, picks: list[int]) -> Llama:
    """A deeper draft that computes what `draft` computes: after draft layer i comes a copy of
    champion layer picks[i], its two output products (attn_output, ffn_down) zeroed, so that it
    adds nothing to the residual until training moves them (the block expansion of LLaMA Pro).
    Embedding, final norm and head are the draft's."""
    s = draft.s
    bigger = Llama(Shape(s.n_layers + len(picks), s.d, s.d_ff, s.n_heads, s.n_kv, s.vocab,
                         s.rope_base, s.eps), tied=draft.head is None).to(draft.out_norm.device)
    bigger.load_state_dict({k: v for k, v in draft.state_dict().items()
                            if not k.startswith("layers.")}, strict=False)
    order = []                                  # (source layer, whether it is a new one)
    for i, layer in enumerate(draft.layers):
        order.append((layer, False))
        if i < len(picks):
            order.append((champion.layers[picks[i]], True))
    for mine, (src, new) in zip(bigger.layers, order):
        mine.load_state_dict(src.state_dict())
        if new:
            mine.attn_output.weight.zero_()
            mine.ffn_down.weight.zero_()
    return bigger


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def cosine(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return 0.5 * peak * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))
