"""Check that train/eagle.py trains what pyspec drafts: the unroll's step j at row s must give the
logits pyspec's EagleDrafter computes at its j-th draft from the start s - j + 1.

    python train/check_eagle.py --champion C.gguf [--init-draft D.gguf] [--prompt TEXT] [--tokens 24]

A head with random weights (so that nothing lines up by accident) is written as an F32 GGUF; the
champion answers the prompt greedily (numpy); then at every start the drafter proposes K tokens
(fed the true tokens, as the unroll is) and each step's logits are compared with the unroll's.
With --init-draft the head is a draft model fed with the champion's states (eagle.py's
--init-draft: D's layers, embedding and norm, perturbed, and a random W_f). Exits 1 on a mismatch
(max |logit difference| above 2e-3 or another argmax), or when the unroll with a shifted
attention mask (a wrong training-time test) matches as well: the check must be able to fail.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import eagle  # noqa: E402
from eagle import Head, K, shift_rows, to_gguf, unroll  # noqa: E402
from llama_torch import from_gguf  # noqa: E402

from pyspec.formats import quant  # noqa: E402
from pyspec.cpu.model import Model  # noqa: E402
from pyspec.drafters.eagle import EagleDrafter, EagleHead  # noqa: E402
from pyspec.formats.gguf import GGUFFile  # noqa: E402
from pyspec.text.tokenizer import Tokenizer  # noqa: E402


class Teacher:
    """A cycle.Rule stand-in: records each draft's logits and feeds the true next token."""

    def __init__(self, seq):
        self.seq, self.logits = seq, []

    def choose(self, logits, position, context):
        self.logits.append(np.array(logits))
        return self.seq[position], None, 1.0

    def stops(self, confidence):
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--champion", required=True)
    ap.add_argument("--prompt", default="Name three rivers in Europe and say where each one ends.")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--init-draft", default="")
    args = ap.parse_args(argv)
    torch.manual_seed(1)
    ch = Model.load(args.champion)
    tok = Tokenizer.from_metadata(ch.metadata)
    seq = tok.encode_chat([{"role": "user", "content": args.prompt}])
    p = len(seq)
    kv = ch.new_cache(p + args.tokens + 8)
    for _ in range(args.tokens):   # greedy, recomputed each step (a check, not a server)
        kv.truncate(0)
        seq.append(int(ch.forward(seq, kv, last_only=True)[0].argmax()))

    tch, md = from_gguf(args.champion)
    draft = from_gguf(args.init_draft, lender=args.champion)[0] if args.init_draft else None
    head = Head(tch.eval().requires_grad_(False), draft)
    with torch.no_grad():
        for prm in head.parameters():
            prm.add_(0.02 * torch.randn_like(prm))
        if draft is not None:      # W_f starts at 0: make the states count
            head.fc_feat.weight.copy_(0.5 * torch.randn_like(head.fc_feat.weight)
                                      / head.s.d ** 0.5)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "head.gguf"
        to_gguf(head, md, ch.sha256(), path, quant.F32.type_id, {})
        if draft is not None:      # the embedding as the file holds it (Q4_1)
            with torch.no_grad():
                head.tok_embd.weight.copy_(torch.from_numpy(
                    GGUFFile.open(path).dequantize("token_embd.weight")))
        eh = EagleHead(GGUFFile.open(path), ch)
        with torch.no_grad():
            zs, _, _ = unroll(head, tch, torch.tensor([seq]))
            want = [head.logits(z[0]).numpy() for z in zs]      # step j at row s
            eagle.ttt_attention = shifted(eagle.ttt_attention)
            zs, _, _ = unroll(head, tch, torch.tensor([seq]))
            wrong = [head.logits(z[0]).numpy() for z in zs]

    champion_kv = ch.new_cache(len(seq) + 8)
    drafter = EagleDrafter(eh, champion_kv)
    ch.forward(seq[:-1], champion_kv)                           # the states of every row
    champion_kv.commit(len(seq) - 1)
    got = {}
    for t in range(p - 1, len(seq) - K - 1):
        drafter.reset(seq)
        teacher = Teacher(seq)
        drafter.propose(seq[:t + 1], K, teacher)                 # committed y_0..y_t
        for j, logits in enumerate(teacher.logits):
            got[j, t] = logits
    for name, ref in (("the unroll", want), ("an unroll with a shifted mask", wrong)):
        worst = max(float(np.abs(g - ref[j][t + j]).max()) for (j, t), g in got.items())
        bad = sum(int(g.argmax() != ref[j][t + j].argmax()) for (j, t), g in got.items())
        print(f"{name}: max |logit difference| {worst:.2e}; argmax differs at {bad} of "
              f"{len(got)} draft steps")
        if name == "the unroll":
            ok = worst < 2e-3 and bad == 0
        elif worst < 2e-3:
            print("the shifted mask matches too: this check cannot tell")
            ok = False
    return 0 if ok else 1


def shifted(attention):
    """ttt_attention with its mask one row off (a wrong training-time test)."""
    def wrong(q, kvs, rep):
        return attention(q, [(shift_rows(k, 1), shift_rows(v, 1)) for k, v in kvs[:1]]
                         + kvs[1:], rep)
    return wrong


if __name__ == "__main__":
    sys.exit(main())
