"""Check that train/llama_torch.py computes what pyspec.cpu.model computes, on the champion.

    python train/check_torch.py --champion C.gguf

Runs one chat prompt through both (float32) and prints the largest logit difference and whether
every position's argmax agrees; exits 1 when they disagree by more than 1e-3 (float32 noise over
30 layers was 8.6e-5 on the H200). It also checks that `--qat`'s torch Q4_1 round trip
(llama_torch.FakeQ4_1) equals pyspec.formats.quant's on weights off the grid (the champion's first
layer matrix, already Q4_1, plus noise, and random matrices of other scales, with ties and
constant blocks), and passes the gradient straight through. Run it before trusting data or a
draft made with the torch model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llama_torch import FakeQ4_1, from_gguf, quantized_like  # noqa: E402

from pyspec.formats import quant  # noqa: E402
from pyspec.cpu.model import Model  # noqa: E402
from pyspec.text.tokenizer import Tokenizer  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--champion", required=True)
    args = ap.parse_args(argv)
    ref = Model.load(args.champion)
    tok = Tokenizer.from_metadata(ref.metadata)
    ids = tok.encode_chat([{"role": "user", "content": "Name three rivers in Europe and one fact "
                                                       "about each."}])
    want = ref.forward(ids, ref.new_cache(256))                              # (T, vocab)
    torch.backends.cuda.matmul.allow_tf32 = False
    model, _ = from_gguf(args.champion, device="cuda" if torch.cuda.is_available() else "cpu")
    with torch.no_grad():
        got = model(torch.tensor([ids], device=model.inv_freq.device))[0].float().cpu().numpy()
    diff = float(np.abs(got - want).max())
    agree = bool((got.argmax(-1) == want.argmax(-1)).all())
    # On the grid a round trip changes nothing, so the weights are moved off it first: noise of
    # a tenth of the weights' spread, matrices at other scales, a block of one value, and
    # values half way between two grid points of their block.
    rng = np.random.default_rng(0)
    first = model.layers[0].attn_q.weight.detach().float().cpu().numpy()
    cases = [first + rng.normal(0, 0.1 * first.std(), first.shape),
             rng.normal(0, 1e-3, (64, 256)), rng.normal(0, 30.0, (64, 256)),
             np.full((4, 64), 0.37), np.tile(np.arange(32) / 31.0 * 15.5 / 15, (4, 2))]
    q41, straight = 0.0, True
    for case in cases:
        w = torch.tensor(case, dtype=torch.float32, requires_grad=True)
        fake = FakeQ4_1()(w)
        fake.sum().backward()
        q41 = max(q41, float(np.abs(fake.detach().numpy() - quantized_like(
            case.astype(np.float32), quant.Q4_1.type_id)).max()))
        straight = straight and bool((w.grad == 1).all())
    print(json.dumps({"positions": len(ids), "max_abs_logit_diff": diff, "argmax_agree": agree,
                      "fake_q4_1_max_diff": q41, "straight_through": straight}))
    return 0 if agree and diff < 1e-3 and q41 < 1e-6 and straight else 1


if __name__ == "__main__":
    sys.exit(main())
