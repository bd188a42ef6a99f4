"""The EAGLE-style draft: a head over the champion's own final residual states.

    python train/eagle.py --champion C.gguf --data DIR --work DIR [--steps 2500] [--minutes 6]
                          [--init-draft D.gguf --qat] [--gguf OUT.gguf]

Row s of the head reads f_{s-1}, the champion's final residual state at position s - 1 (zero at
row 0), through the champion's final norm (the hidden state its head turns into the distribution
of token s; the raw residual has a few dimensions hundreds of times larger than the rest), and
the embedding of token s: u_s = W_f norm(f_{s-1}) + W_e e(y_s). The head's layers over the rows
(their own causal attention, RoPE and cache) give z_s, a guess of f_s; a final norm and head turn
z_s into q for token s + 1. Drafting from a committed sequence y_0..y_c: the rows s <= c hold
true states (the champion computed f_{s-1} when it verified y_{s-1}); the first draft comes from
row c, the next ones from rows fed with the head's own guess z and the drafted token.

Two shapes:
- the head (default): one layer, started from the champion's last, with W_f = W_e = I; its
  embedding, final norm and head are the champion's, referenced by the GGUF, not copied
  (`--head-layers N`: N layers, from the champion's last N);
- `--init-draft D.gguf`: a draft model fed with the champion's states. Its layers, embedding and
  final norm are the draft's (D's file, e.g. models/draft-l4.gguf), W_e = I and W_f = 0: it
  starts as exactly that draft (row s then reads e(y_s), the draft's own input), and training
  teaches it what the states add. `--qat` trains its layer matrices on D's Q4_1 grid.

Training-time test, exact: step j of the unroll computes, at every row s at once, what drafting
step j computes when drafting started at t = s - j + 1: its input is step j - 1's guess z at
row s - 1, and its attention (in every layer) sees the true rows up to t and the guess rows
t + 1 .. s that steps 2 .. j wrote for the same start (one extra key per step, at a fixed
offset). So the loss trains exactly the drafts the engine makes (train/check_eagle.py checks it
against pyspec's EagleDrafter), and the held-out acceptance below is what drafting gets on that
text (greedy, K = 4), not an estimate. Loss per step: forward KL(p_champion || q) at the rows
whose drafted token is an answer token, plus `--feature-loss` x smooth-L1 of z against f_s (both
through the champion's final norm), which keeps z in the space of the states the first step reads.

`--taps 2,15` (an experiment, EAGLE-3's low, middle and high features): the first step also
reads the champion's residual after each tapped layer (as the next layer's attention norm reads
it), u_s = W_f norm(f_{s-1}) + W_t [taps at s - 1] + W_e e(y_s), W_t starting at 0 (so it starts
as the plain head); the later steps have no taps to read (their rows are guesses), as in EAGLE-3.
pyspec's engines do not run such a head, so no GGUF is written for it: the report's held-out
acceptance is the measurement.

Resumable (--work holds the state); the report has the held-out acceptance in pyspec's terms
(for --init-draft also before the first step: the draft's own); --gguf writes the head (its
layers and the two input products, Q8_0, or Q4_1 layers with --qat; a fed draft's embedding as
Q4_1 and its norm too).
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

from distill import (  # noqa: E402
    checkpointer,
    collate,
    git_commit,
    load_sequences,
    optimizer_state,
    run_settings,
    train_steps,
)
from llama_torch import (  # noqa: E402
    FakeQ4_1,
    Layer,
    from_gguf,
    n_params,
    quantized_like,
    rms_norm,
    rope,
)
from seed_prompts import data_bytes  # noqa: E402
from split import SEEDS  # noqa: E402
from torch.nn.utils import parametrize  # noqa: E402

from pyspec.formats import quant  # noqa: E402
from pyspec.cpu.model import LAYER_TENSORS  # noqa: E402
from pyspec.drafters.eagle import EAGLE_TENSORS  # noqa: E402
from pyspec.formats import ggufwrite

K = 4


class Head(torch.nn.Module):
    def __init__(self, champion, draft=None, taps=(), head_layers: int = 1):
        super().__init__()
        s = champion.s
        self.s = s
        self.champion = [champion]          # not a submodule: frozen, shared
        self.taps = tuple(taps)             # champion layers whose states step 1 also reads
        self.fc_feat = torch.nn.Linear(s.d, s.d, bias=False)
        self.fc_embd = torch.nn.Linear(s.d, s.d, bias=False)
        self.fc_taps = (torch.nn.Linear(len(self.taps) * s.d, s.d, bias=False)
                        if self.taps else None)
        with torch.no_grad():
            self.fc_embd.weight.copy_(torch.eye(s.d))
            if self.fc_taps is not None:   # the taps weigh nothing at the start
                self.fc_taps.weight.zero_()
            if draft is None:              # start as "f + e" through the champion's last layers
                self.fc_feat.weight.copy_(torch.eye(s.d))
                self.layers = torch.nn.ModuleList([Layer(s) for _ in range(head_layers)])
                for mine, theirs in zip(self.layers, champion.layers[-head_layers:]):
                    mine.load_state_dict(theirs.state_dict())
                self.tok_embd = self.out_norm = None
                self.draft = [None]
            else:                          # start as the draft: the states weigh nothing yet
                self.fc_feat.weight.zero_()
                self.layers = draft.layers
                self.tok_embd = draft.tok_embd.requires_grad_(False)   # its Q4_1 values
                self.out_norm = draft.out_norm
                self.head = draft.head             # None: tied to the embedding
                if self.head is not None:          # frozen, as the embedding is
                    self.head.requires_grad_(False)
                self.draft = [draft]               # for head_weight(); its parts are ours

    def embed(self, tokens):
        c = self.champion[0]
        return (c.tok_embd if self.tok_embd is None else self.tok_embd)(tokens)

    def logits(self, z):
        c = self.champion[0]
        if self.tok_embd is None:
            return rms_norm(z, c.out_norm, c.s.eps) @ c.head_weight().T.to(z.dtype)
        return rms_norm(z, self.out_norm, c.s.eps) @ self.draft[0].head_weight().T.to(z.dtype)

    def step(self, j: int, g, tokens, cos, sin, past: list, tapped=None):
        """Unroll step j (1-based) at every row: g (B, T, d) the states read (row s: f_{s-1} at
        step 1, the previous step's guess at row s - 1 after), tokens (B, T). past: for steps
        1 .. j-1, each layer's (k, v), (B, n_kv, T, hd) each. tapped (B, T, taps * d): step 1's
        taps at row s - 1, else None. -> z (B, T, d), this step's (k, v) per layer."""
        s = self.s
        c = self.champion[0]
        x = (self.fc_feat(rms_norm(g, c.out_norm, s.eps))
             + self.fc_embd(self.embed(tokens).to(g.dtype)))
        if tapped is not None:
            x = x + self.fc_taps(tapped.to(x.dtype))
        kvs = []
        for li, layer in enumerate(self.layers):
            h = rms_norm(x, layer.attn_norm, s.eps)
            B, T, _ = h.shape
            q = rope(layer.attn_q(h).view(B, T, s.n_heads, s.hd).transpose(1, 2), cos, sin)
            k = rope(layer.attn_k(h).view(B, T, s.n_kv, s.hd).transpose(1, 2), cos, sin)
            v = layer.attn_v(h).view(B, T, s.n_kv, s.hd).transpose(1, 2)
            if j == 1:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                o = ttt_attention(q, [p[li] for p in past] + [(k, v)], s.n_heads // s.n_kv)
            x = x + layer.attn_output(o.transpose(1, 2).reshape(B, T, -1))
            h = rms_norm(x, layer.ffn_norm, s.eps)
            x = x + layer.ffn_down(F.silu(layer.ffn_gate(h)) * layer.ffn_up(h))
            kvs.append((k, v))
        return x, kvs


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
    """-> zs (K of (B, T, d): step j's z at rows 0..T-1), f (B, T, d), log_p (B, T, vocab)."""
    tapped = None
    with torch.no_grad():
        if head.taps:
            f, taps = champion.features(tokens, head.taps)                 # (B, T, d), [...]
            tapped = shift_rows(torch.cat(taps, -1), 1)                    # row s: taps at s - 1
        else:
            f = champion.features(tokens)                                  # (B, T, d)
        c = champion
        log_p = torch.log_softmax((rms_norm(f, c.out_norm, c.s.eps)
                                   @ c.head_weight().T.to(f.dtype)).float(), -1)
    T = tokens.shape[1]
    cos, sin = champion.angles(torch.arange(T, device=tokens.device)[None], f.dtype)
    g = shift_rows(f, 1)                              # row s reads f_{s-1}, zero at row 0
    past, zs = [], []
    for j in range(1, K + 1):
        z, kv = head.step(j, g, tokens, cos, sin, past, tapped if j == 1 else None)
        past.append(kv)
        zs.append(z)
        g = shift_rows(z, 1)                          # row s of step j + 1 reads z of row s - 1
    return zs, f, log_p


def step_masks(mask):
    """mask (B, T) from collate (position t predicts an answer token) -> K masks (B, T): step j
    at row s drafts token s + 1 (an answer token) from a start t = s - j + 1 whose first draft,
    token t + 1, is an answer token too."""
    return [mask & shift_rows(mask[..., None].float(), j - 1)[..., 0].bool()
            for j in range(1, K + 1)]


def loss_fn(head, champion, tokens, mask, feature_weight: float):
    zs, f, log_p = unroll(head, champion, tokens)
    total = 0.0
    for z, m in zip(zs, step_masks(mask)):
        target = log_p[m]                                  # the champion at s: token s + 1
        log_q = torch.log_softmax(head.logits(z[m]).float(), -1)
        total = total + (target.exp() * (target - log_q)).sum(-1).mean()
        if feature_weight:
            norm = lambda x: rms_norm(x.float(), champion.out_norm, champion.s.eps)  # noqa: E731
            total = total + feature_weight * F.smooth_l1_loss(norm(z[m]), norm(f[m]))
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
        T, t = len(y), int(item[1]) - 1         # the first start: its first draft is token p
        agree.append(preds[0][max(0, t):T - 1] == y[max(0, t) + 1:])
        while t < T - 1:
            n = 0
            while n < K and t + n + 1 < T and preds[n][t + n] == y[t + n + 1]:
                n += 1
            block = min(K, T - 1 - t)
            drafted += block
            accepted += n
            by_pos[0, :block] += 1
            by_pos[1, :n] += 1
            t += n + 1
    return {"greedy_acceptance_rate_k4": accepted / max(1, drafted),
            "greedy_acceptance_by_position": (by_pos[1] / np.maximum(1, by_pos[0])).round(4).tolist(),
            "first_step_argmax_agreement": float(np.mean(np.concatenate(agree))) if agree else None,
            "greedy_answers": len(agree)}


def layer_matrices(head):
    """(layer, name) of each layer matrix (the norms excluded)."""
    return [(layer, n) for layer in head.layers for n in LAYER_TENSORS if not n.endswith("norm")]


@torch.no_grad()
def quantize_head(head, input_type: int, layer_type: int) -> None:
    """Replace each matrix by what it reads back as after quantizing: W_f and W_e to
    `input_type`, the layers' to `layer_type`."""
    mats = [(head.fc_feat.weight, input_type), (head.fc_embd.weight, input_type)]
    if head.fc_taps is not None:
        mats.append((head.fc_taps.weight, input_type))
    mats += [(getattr(layer, n).weight, layer_type) for layer, n in layer_matrices(head)]
    for w, type_id in mats:
        w.copy_(torch.from_numpy(quantized_like(w.detach().float().cpu().numpy(), type_id))
                .to(w.device, w.dtype))


def to_gguf(head, champion_md: dict, champion_sha: str, path, input_type: int, extra: dict,
            layer_type: int | None = None) -> None:
    """The head as a GGUF pyspec loads as an `eagle` draft: the champion's tokenizer metadata (so
    check-pair compares it), its shape, the champion's sha256 (the head is bound to it), its
    layers and the two input products; a fed draft's embedding (Q4_1, its tied head) and final
    norm, else none (the champion's are used)."""
    md = {k: v for k, v in champion_md.items()
          if k.startswith("tokenizer.") or k.startswith("llama.") or k == "general.architecture"}
    md.update({"general.name": "pyspec-eagle-head" if head.tok_embd is None
               else f"pyspec-fed-draft-L{len(head.layers)}",
               "llama.block_count": len(head.layers),
               "pyspec.draft.kind": "eagle", "pyspec.eagle.champion_sha256": champion_sha,
               **extra})
    get = lambda p: p.detach().float().cpu().numpy()  # noqa: E731
    tensors = {EAGLE_TENSORS[0]: (get(head.fc_feat.weight), input_type),
               EAGLE_TENSORS[1]: (get(head.fc_embd.weight), input_type)}
    for i, layer in enumerate(head.layers):
        for n in LAYER_TENSORS:
            p = getattr(layer, n)
            tensors[f"blk.{i}.{n}.weight"] = (
                (get(p), quant.F32.type_id) if n.endswith("norm")
                else (get(p.weight), input_type if layer_type is None else layer_type))
    if head.tok_embd is not None:
        tensors["token_embd.weight"] = (get(head.tok_embd.weight), quant.Q4_1.type_id)
        tensors["output_norm.weight"] = (get(head.out_norm), quant.F32.type_id)
        if head.head is not None:
            tensors["output.weight"] = (get(head.head.weight), quant.Q4_1.type_id)
    ggufwrite.write(path, md, tensors)


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
    ap.add_argument("--matrix-type", choices=["Q8_0", "Q4_1"], default="Q8_0",
                    help="the GGUF type of W_f, W_e and (without --qat) the layers' matrices")
    ap.add_argument("--init-draft", default="",
                    help="a draft GGUF (e.g. models/draft-l4.gguf): its layers, embedding and "
                         "norm, fed with the champion's states (W_f = 0, W_e = I at the start)")
    ap.add_argument("--taps", default="",
                    help="champion layers (e.g. 2,15) whose states the first step reads beside "
                         "the final one (EAGLE-3's features; measured, not written as a GGUF)")
    ap.add_argument("--head-layers", type=int, default=1,
                    help="layers in the head, from the champion's last (without --init-draft)")
    ap.add_argument("--qat", action="store_true",
                    help="with --init-draft: the layers train on the Q4_1 grid and are written "
                         "as Q4_1 (the draft's own type)")
    args = ap.parse_args(argv)
    if args.qat and not args.init_draft:
        ap.error("--qat is for --init-draft (a Q4_1 draft's layers)")
    taps = tuple(int(t) for t in args.taps.split(",") if t.strip())
    t0 = time.time()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    champion, md = from_gguf(args.champion, device=dev)
    champion = champion.eval().requires_grad_(False)
    draft = from_gguf(args.init_draft, device=dev, lender=args.champion)[0] \
        if args.init_draft else None
    if taps and not all(0 <= t < champion.s.n_layers - 1 for t in taps):
        ap.error(f"--taps: layers of the champion before its last, 0 .. {champion.s.n_layers - 2}")
    head = Head(champion, draft, taps, args.head_layers).to(dev)
    if args.qat:
        for layer, n in layer_matrices(head):
            parametrize.register_parametrization(getattr(layer, n), "weight", FakeQ4_1())
    train, held, info = load_sequences(args.data)
    held = held[:args.eval_limit]
    params, opt, state, ckpt = optimizer_state(head, "head", work, dev, args.lr,
                                               run_settings(args, info))
    print(json.dumps({"trainable_params": n_params(head), **info}), flush=True)
    save = checkpointer(head, "head", opt, state, ckpt)
    if draft is not None and state["step"] == 0:   # kept in the state: a resumed run reports it
        state["held_out_at_start"] = evaluate(head, champion, held, dev)
    start = state.get("held_out_at_start")

    def loss_of(tokens, mask):
        with torch.autocast("cuda", torch.bfloat16, enabled=tokens.is_cuda):
            return loss_fn(head, champion, tokens, mask, args.feature_loss)

    train_steps(state, train, args, dev, loss_of, opt, params, t0 + args.minutes * 60, save)
    save()
    champion_sha = hashlib.sha256(Path(args.champion).read_bytes()).hexdigest()
    report = {"candidate": (f"fed-draft-{len(head.layers)}layer" if draft is not None
                            else f"eagle-{len(head.layers)}layer"
                            + (f"-taps-{'-'.join(map(str, taps))}" if taps else "")),
              "steps": state["step"], "epochs": state["epoch"],
              "train_seconds": round(state["seconds"], 1), "trainable_params": n_params(head),
              "final_loss": float(np.mean(state["losses"][-100:])) if state["losses"] else None,
              "objective": f"forward KL at each of K = {K} exact training-time-test steps + "
                           f"{args.feature_loss} x smooth-L1(z, f)",
              "batch_tokens": args.batch_tokens, "lr": args.lr, "matrix_type": args.matrix_type,
              "quantization_aware": args.qat,
              "champion_sha256": champion_sha,
              "seed_prompts_sha256": hashlib.sha256(data_bytes(SEEDS)).hexdigest(), **info,
              "args": vars(args), "git_commit": git_commit()}
    if args.init_draft:
        report["init_draft"] = {"gguf": Path(args.init_draft).name, "sha256": hashlib.sha256(
            Path(args.init_draft).read_bytes()).hexdigest()}
    if start is not None:
        report["held_out_at_start"] = start   # the draft's own (W_f = 0)
    if args.qat:
        for layer, n in layer_matrices(head):   # the weights as trained (on the grid)
            parametrize.remove_parametrizations(getattr(layer, n), "weight")
    report["held_out_float"] = evaluate(head, champion, held, dev)   # also after a partial run
    if state["step"] >= args.steps:
        type_id = quant.BY_NAME[args.matrix_type].type_id
        layer_type = quant.Q4_1.type_id if args.qat else type_id
        quantize_head(head, type_id, layer_type)       # score what the GGUF holds
        report["held_out"] = evaluate(head, champion, held, dev)
        if args.gguf and taps:
            report["gguf"] = "not written: pyspec's engines do not run a head with taps"
        elif args.gguf:
            to_gguf(head, md, champion_sha, args.gguf, type_id,
                    {"pyspec.eagle.steps": state["step"]}, layer_type)
            report["gguf_sha256"] = hashlib.sha256(Path(args.gguf).read_bytes()).hexdigest()
            report["gguf_bytes"] = Path(args.gguf).stat().st_size
    (work / "report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
