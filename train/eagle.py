"""The EAGLE-style candidate: a one-layer head over the champion's own last hidden state.

    python train/eagle.py --champion C.gguf --data DIR --work DIR [--steps 1200] [--minutes 6]

At position t the head reads f_t, the champion's final residual state (before its final norm),
and the embedding of the token t + 1 the champion chose from it: u = fc([f_t; e(y_{t+1})]), one
Llama layer over the u of every position (its own causal attention and RoPE), giving z_{t+1}, a
guess of f_{t+1}; the champion's own final norm and head turn z_{t+1} into q for token t + 2.
Drafting goes on from z (its own guesses) and the drafted token.

Training unrolls K = 4 drafting steps at every position at once ("training-time test"): step j
feeds the guesses of step j - 1 as features, so the head learns from its own errors. Every
position's context is then made of guesses too, which is harsher than drafting (where the
context before the start is the champion's true states): the acceptance it reports is a lower
estimate. Loss per step: forward KL(p_champion || q) plus 0.1 x smooth-L1 of z against f.

Resumable (--work holds the state); the report has the held-out acceptance in pyspec's terms.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from distill import collate, load_sequences, optimizer_state, train_steps  # noqa: E402
from llama_torch import Layer, from_gguf, n_params, rms_norm  # noqa: E402

K = 4


class Head(torch.nn.Module):
    def __init__(self, champion):
        super().__init__()
        s = champion.s
        self.champion = [champion]          # not a submodule: frozen, shared
        self.fc = torch.nn.Linear(2 * s.d, s.d, bias=False)
        self.layer = Layer(s)
        with torch.no_grad():              # start as "f + e", through the champion's last layer
            self.fc.weight.zero_()
            self.fc.weight[:, :s.d].copy_(torch.eye(s.d))
            self.fc.weight[:, s.d:].copy_(torch.eye(s.d))
            self.layer.load_state_dict(champion.layers[-1].state_dict())

    def forward(self, feats, next_tokens):
        """feats (B, T, d), next_tokens (B, T) -> z (B, T, d) guesses of the next features."""
        c = self.champion[0]
        u = self.fc(torch.cat([feats, c.tok_embd(next_tokens).to(feats.dtype)], -1))
        cos, sin = c.angles(torch.arange(u.shape[1], device=u.device)[None], u.dtype)
        return c._block(self.layer, u, cos, sin, None)

    def logits(self, z):
        c = self.champion[0]
        return rms_norm(z, c.out_norm, c.s.eps) @ c.head_weight().T.to(z.dtype)


def unroll(head, champion, tokens, mask):
    """Per step j: (log q at the masked positions (n, vocab), z (B, T-1, d)); and log p, f."""
    with torch.no_grad():
        f = champion.features(tokens)                                      # (B, T, d)
        log_p = torch.log_softmax(head.logits(f).float(), -1)              # (B, T, vocab)
    feats, out = f[:, :-1], []
    for _ in range(K):
        z = head(feats, tokens[:, 1:])               # z[s] guesses f[s+1]; predicts token s + 2
        out.append(z)
        feats = torch.cat([f[:, :1], z[:, :-1]], 1)  # step j + 1 at s reads step j's guess of f_s
    return out, f, log_p


def loss_fn(head, champion, tokens, mask):
    zs, f, log_p = unroll(head, champion, tokens, mask)
    m = mask[:, 1:]                       # z[s] is scored where token s + 2 is an answer token
    target_p, target_f = log_p[:, 1:][m], f[:, 1:][m]
    total = 0.0
    for z in zs:
        log_q = torch.log_softmax(head.logits(z[m]).float(), -1)
        kl = (target_p.exp() * (target_p - log_q)).sum(-1).mean()
        total = total + kl + 0.1 * F.smooth_l1_loss(z[m].float(), target_f.float())
    return total / K


@torch.no_grad()
def evaluate(head, champion, held, dev) -> dict:
    drafted = accepted = 0
    by_pos = np.zeros((2, K))
    for item in held:
        if item[2] != 0.0:
            continue
        tokens, mask = collate([item], dev)
        with torch.autocast("cuda", torch.bfloat16, enabled=tokens.is_cuda):
            zs, _, _ = unroll(head, champion, tokens, mask)
            preds = [head.logits(z[0]).argmax(-1) for z in zs]    # step j at s predicts s + 2
        y = tokens[0]
        T = y.shape[0]
        start = int(item[1]) - 2   # the first start whose first draft is an answer token
        for t in range(max(0, start), T - 2):
            n = 0
            while n < K and t + n + 2 < T and int(preds[n][t + n]) == int(y[t + n + 2]):
                n += 1
            block = min(K, T - 2 - t)
            drafted += block
            accepted += n
            for j in range(block):
                by_pos[0, j] += 1
                by_pos[1, j] += j < n
    return {"greedy_acceptance_rate_k4": accepted / max(1, drafted),
            "greedy_acceptance_by_position": (by_pos[1] / np.maximum(1, by_pos[0])).round(4).tolist(),
            "note": "every start position scored (not only block starts); context of guesses"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--champion", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--minutes", type=float, default=6.0)
    ap.add_argument("--batch-tokens", type=int, default=16_000)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--eval-limit", type=int, default=300)
    args = ap.parse_args(argv)
    t0 = time.time()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    champion, _ = from_gguf(args.champion, device=dev)
    champion = champion.eval().requires_grad_(False)
    head = Head(champion).to(dev)
    params, opt, state, ckpt = optimizer_state(head, "head", work, dev, args.lr)
    train, held, info = load_sequences(args.data)
    held = held[:args.eval_limit]

    def loss_of(tokens, mask):
        with torch.autocast("cuda", torch.bfloat16, enabled=tokens.is_cuda):
            return loss_fn(head, champion, tokens, mask)

    train_steps(state, train, args, dev, loss_of, opt, params, t0 + args.minutes * 60)
    torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "state": state}, ckpt)
    report = {"candidate": "eagle-1layer", "steps": state["step"], "trainable_params": n_params(head),
              "final_loss": float(np.mean(state["losses"][-100:])) if state["losses"] else None,
              "seconds": round(time.time() - t0, 1), **info}
    report["held_out"] = evaluate(head, champion, held, dev)   # also after a partial run
    (work / "report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
