"""The EAGLE-style draft: a one-layer head over the champion's own final residual state.

    python train/eagle.py --champion C.gguf --data DIR --work DIR [--steps 2500] [--minutes 6]
                          [--gguf OUT.gguf]

Row s of the head reads f_s, the champion's final residual state at position s, through the
champion's final norm (the hidden state its head turns into the distribution of token s + 1; the
raw residual has a few dimensions hundreds of times larger than the rest), and the embedding of
token s + 1: u_s = W_f norm(f_s) + W_e e(y_{s+1}). One Llama layer over the rows (its own
causal attention, RoPE and cache) gives z_s, a guess of f_{s+1}; the champion's own final norm
and head turn z_s into q for token s + 2. Drafting from a committed sequence y_0..y_c: the rows
s < c hold true states (the champion computed f_s when it verified y_s); the first draft comes
from row c - 1, the next ones from rows fed with the head's own guess z and the drafted token.

Training-time test, exact: step j of the unroll computes, at every row s at once, what drafting
step j computes when drafting started at t = s - j + 1: its input is step j - 1's guess z at
row s - 1, and its attention sees the true rows up to t and the guess rows t + 1 .. s that steps
2 .. j wrote for the same start (one extra key per step, at a fixed offset). So the loss trains
exactly the drafts the engine makes, and the held-out acceptance below is what drafting gets on
that text (greedy, K = 4), not an estimate. Loss per step: forward KL(p_champion || q) at the
rows whose drafted token is an answer token, plus `--feature-loss` x smooth-L1 of z against
f_{s+1} (both through the final norm), which keeps z in the space of the states the first step
reads.

Resumable (--work holds the state); the report has the held-out acceptance in pyspec's terms;
--gguf writes the head (its layer and the two input products, Q8_0; the champion's embedding,
final norm and head are referenced, not copied).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from distill import checkpointer, collate, load_sequences, optimizer_state, train_steps  # noqa: E402
from generate import SEEDS  # noqa: E402
from llama_torch import Layer, from_gguf, n_params, quantized_like, rms_norm, rope  # noqa: E402

from pyspec import gguf, quant  # noqa: E402
from pyspec.drafters.eagle import EAGLE_TENSORS  # noqa: E402
from pyspec.model import LAYER_TENSORS  # noqa: E402

K = 4


class Head(torch.nn.Module):
    def __init__(self, champion):
        super().__init__()
        s = champion.s
        self.s = s
        self.champion = [champion]          # not a submodule: frozen, shared
        self.fc_feat = torch.nn.Linear(s.d, s.d, bias=False)
        self.fc_embd = torch.nn.Linear(s.d, s.d, bias=False)
        self.layer = Layer(s)
        with torch.no_grad():              # start as "f + e" through the champion's last layer
            self.fc_feat.weight.copy_(torch.eye(s.d))
            self.fc_embd.weight.copy_(torch.eye(s.d))
            self.layer.load_state_dict(champion.layers[-1].state_dict())

    def logits(self, z):
        c = self.champion[0]
        return rms_norm(z, c.out_norm, c.s.eps) @ c.head_weight().T.to(z.dtype)

    def step(self, j: int, g, next_tokens, cos, sin, past: list):
        """Unroll step j (1-based) at every row: g (B, T, d) the states read (true ones at step
        1, the previous step's guesses after), next_tokens (B, T). past: the (k, v) of steps
        1 .. j-1, (B, n_kv, T, hd) each. -> z (B, T, d), this step's (k, v)."""
        s, layer = self.s, self.layer
        c = self.champion[0]
        u = (self.fc_feat(rms_norm(g, c.out_norm, s.eps))
             + self.fc_embd(c.tok_embd(next_tokens).to(g.dtype)))
        h = rms_norm(u, layer.attn_norm, s.eps)
        B, T, _ = h.shape
        q = rope(layer.attn_q(h).view(B, T, s.n_heads, s.hd).transpose(1, 2), cos, sin)
        k = rope(layer.attn_k(h).view(B, T, s.n_kv, s.hd).transpose(1, 2), cos, sin)
        v = layer.attn_v(h).view(B, T, s.n_kv, s.hd).transpose(1, 2)
        if j == 1:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            o = ttt_attention(q, [*past, (k, v)], s.n_heads // s.n_kv)
        x = u + layer.attn_output(o.transpose(1, 2).reshape(B, T, -1))
        h = rms_norm(x, layer.ffn_norm, s.eps)
        return x + layer.ffn_down(F.silu(layer.ffn_gate(h)) * layer.ffn_up(h)), (k, v)


def shift_rows(x, n: int):
    """x (..., T, e) moved n rows later along T (row t gets row t - n; zeros first)."""
    return F.pad(x, (0, 0, n, 0))[..., :x.shape[-2], :] if n else x


def ttt_attention(q, kvs: list, rep: int):
    """Attention of step j = len(kvs) at every row s: the true rows (step 1's keys) at positions
    <= s - j + 1, then step i's key at position s - j + i for i = 2 .. j (the guess rows the same
    drafting start wrote). q (B, H, T, hd); kvs[i] (k, v), (B, n_kv, T, hd)."""
    j = len(kvs)
    T, hd = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(hd)
    k1, v1 = (t.repeat_interleave(rep, 1) for t in kvs[0])
    scores = (q @ k1.transpose(-1, -2)) * scale                               # (B, H, T, T)
    rows = torch.arange(T, device=q.device)
    scores = scores.masked_fill(rows[None, :] > rows[:, None] - (j - 1), float("-inf"))
    extra_k, extra_v = [], []
    for i in range(2, j + 1):
        ki, vi = (shift_rows(t.repeat_interleave(rep, 1), j - i) for t in kvs[i - 1])
        extra_k.append((q * ki).sum(-1, keepdim=True) * scale)                # (B, H, T, 1)
        extra_v.append(vi)
    w = torch.softmax(torch.cat([scores, *extra_k], -1).float(), -1).to(q.dtype)
    o = w[..., :T] @ v1
    for n, vi in enumerate(extra_v):
        o = o + w[..., T + n:T + n + 1] * vi
    return o


def unroll(head, champion, tokens):
    """-> zs (K of (B, T-1, d): step j's z at rows 0..T-2), f (B, T, d), log_p (B, T, vocab)."""
    with torch.no_grad():
        f = champion.features(tokens)                                      # (B, T, d)
        log_p = torch.log_softmax(head.logits(f).float(), -1)
    T = tokens.shape[1] - 1
    cos, sin = champion.angles(torch.arange(T, device=tokens.device)[None], f.dtype)
    g, nxt, past, zs = f[:, :-1], tokens[:, 1:], [], []
    for j in range(1, K + 1):
        z, kv = head.step(j, g, nxt, cos, sin, past)
        past.append(kv)
        zs.append(z)
        g = torch.cat([f[:, :1], z[:, :-1]], 1)      # row s of step j + 1 reads z of row s - 1
    return zs, f, log_p


def step_masks(mask):
    """mask (B, T) from collate (position t predicts an answer token) -> K masks (B, T-1): step
    j at row s drafts token s + 2 (an answer token) from a start t = s - j + 1 whose first draft,
    token t + 2, is an answer token too."""
    answer = mask[:, 1:]                                   # row s: token s + 2 is an answer token
    return [answer & shift_rows(answer[..., None].float(), j - 1)[..., 0].bool()
            for j in range(1, K + 1)]


def loss_fn(head, champion, tokens, mask, feature_weight: float):
    zs, f, log_p = unroll(head, champion, tokens)
    total = 0.0
    for z, m in zip(zs, step_masks(mask)):
        target = log_p[:, 1:][m]                           # the champion at s + 1: token s + 2
        log_q = torch.log_softmax(head.logits(z[m]).float(), -1)
        total = total + (target.exp() * (target - log_q)).sum(-1).mean()
        if feature_weight:
            norm = lambda x: rms_norm(x.float(), champion.out_norm, champion.s.eps)  # noqa: E731
            total = total + feature_weight * F.smooth_l1_loss(norm(z[m]), norm(f[:, 1:][m]))
    return total / K


@torch.no_grad()
def evaluate(head, champion, held, dev) -> dict:
    """Greedy held-out answers: drafting blocks of K walked as the engine walks them (a block
    starts after the accepted drafts and the champion's token), and the first step's argmax
    agreement at every row."""
    drafted = accepted = 0
    by_pos = np.zeros((2, K))
    agree = []
    for item in held:
        if item[2] != 0.0:
            continue
        tokens, mask = collate([item], dev)
        with torch.autocast("cuda", torch.bfloat16, enabled=tokens.is_cuda):
            zs, _, _ = unroll(head, champion, tokens)
            preds = [head.logits(z[0]).argmax(-1).cpu().numpy() for z in zs]
        y = tokens[0].cpu().numpy()
        T, t = len(y), int(item[1]) - 2         # the first start: its first draft is token p
        agree.append(preds[0][max(0, t):T - 2] == y[max(0, t) + 2:])
        while t < T - 2:
            n = 0
            while n < K and t + n + 2 < T and preds[n][t + n] == y[t + n + 2]:
                n += 1
            block = min(K, T - 2 - t)
            drafted += block
            accepted += n
            by_pos[0, :block] += 1
            by_pos[1, :n] += 1
            t += n + 1
    return {"greedy_acceptance_rate_k4": accepted / max(1, drafted),
            "greedy_acceptance_by_position": (by_pos[1] / np.maximum(1, by_pos[0])).round(4).tolist(),
            "first_step_argmax_agreement": float(np.mean(np.concatenate(agree))) if agree else None,
            "greedy_answers": len(agree)}


@torch.no_grad()
def quantize_head(head, type_id: int) -> None:
    """Replace each matrix by what it reads back as after quantizing to `type_id`."""
    mats = [head.fc_feat.weight, head.fc_embd.weight]
    mats += [getattr(head.layer, n).weight for n in LAYER_TENSORS if not n.endswith("norm")]
    for w in mats:
        w.copy_(torch.from_numpy(quantized_like(w.detach().float().cpu().numpy(), type_id))
                .to(w.device, w.dtype))


def to_gguf(head, champion_md: dict, champion_sha: str, path, type_id: int, extra: dict) -> None:
    """The head as a GGUF pyspec loads as an `eagle` draft: the champion's tokenizer metadata (so
    check-pair compares it), its shape, the champion's sha256 (the head is bound to it), one layer
    and the two input products; no embedding, final norm or head (the champion's are used)."""
    md = {k: v for k, v in champion_md.items()
          if k.startswith("tokenizer.") or k.startswith("llama.") or k == "general.architecture"}
    md.update({"general.name": "pyspec-eagle-head", "llama.block_count": 1,
               "pyspec.draft.kind": "eagle", "pyspec.eagle.champion_sha256": champion_sha,
               **extra})
    get = lambda p: p.detach().float().cpu().numpy()  # noqa: E731
    tensors = {EAGLE_TENSORS[0]: (get(head.fc_feat.weight), type_id),
               EAGLE_TENSORS[1]: (get(head.fc_embd.weight), type_id)}
    for n in LAYER_TENSORS:
        p = getattr(head.layer, n)
        tensors[f"blk.0.{n}.weight"] = ((get(p), quant.F32.type_id) if n.endswith("norm")
                                        else (get(p.weight), type_id))
    gguf.write(path, md, tensors)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--champion", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--steps", type=int, default=2500)
    ap.add_argument("--minutes", type=float, default=6.0)
    ap.add_argument("--batch-tokens", type=int, default=16_000)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--feature-loss", type=float, default=0.1)
    ap.add_argument("--eval-limit", type=int, default=300)
    ap.add_argument("--gguf", default="")
    ap.add_argument("--matrix-type", choices=["Q8_0", "Q4_1"], default="Q8_0")
    args = ap.parse_args(argv)
    t0 = time.time()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    champion, md = from_gguf(args.champion, device=dev)
    champion = champion.eval().requires_grad_(False)
    head = Head(champion).to(dev)
    params, opt, state, ckpt = optimizer_state(head, "head", work, dev, args.lr)
    train, held, info = load_sequences(args.data)
    held = held[:args.eval_limit]
    print(json.dumps({"trainable_params": n_params(head), **info}), flush=True)
    save = checkpointer(head, "head", opt, state, ckpt)

    def loss_of(tokens, mask):
        with torch.autocast("cuda", torch.bfloat16, enabled=tokens.is_cuda):
            return loss_fn(head, champion, tokens, mask, args.feature_loss)

    train_steps(state, train, args, dev, loss_of, opt, params, t0 + args.minutes * 60, save)
    save()
    champion_sha = hashlib.sha256(Path(args.champion).read_bytes()).hexdigest()
    report = {"candidate": "eagle-1layer", "steps": state["step"], "epochs": state["epoch"],
              "train_seconds": round(state["seconds"], 1), "trainable_params": n_params(head),
              "final_loss": float(np.mean(state["losses"][-100:])) if state["losses"] else None,
              "objective": f"forward KL at each of K = {K} exact training-time-test steps + "
                           f"{args.feature_loss} x smooth-L1(z, f)",
              "batch_tokens": args.batch_tokens, "lr": args.lr, "matrix_type": args.matrix_type,
              "champion_sha256": champion_sha,
              "seed_prompts_sha256": hashlib.sha256(SEEDS.read_bytes()).hexdigest(), **info}
    report["held_out_float"] = evaluate(head, champion, held, dev)   # also after a partial run
    if state["step"] >= args.steps:
        type_id = quant.BY_NAME[args.matrix_type].type_id
        quantize_head(head, type_id)       # score what the GGUF holds
        report["held_out"] = evaluate(head, champion, held, dev)
        if args.gguf:
            to_gguf(head, md, champion_sha, args.gguf, type_id,
                    {"pyspec.eagle.steps": state["step"]})
            report["gguf_sha256"] = hashlib.sha256(Path(args.gguf).read_bytes()).hexdigest()
            report["gguf_bytes"] = Path(args.gguf).stat().st_size
    (work / "report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
