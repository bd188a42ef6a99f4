"""The host accept, the fallback where a request's processors are not all on the device (any
other processor, a mask with drafts sampled on the GPU, top_p over more than 2^20 tokens, and
by default the filters on a software adapter, where they measured slower: gpu/paths.Paths).

The accept step gathers the champion's k+1 logits rows (and GPU drafts' tokens, confidences and,
for rejection, q_draft rows) into one buffer by copies in the same submission; `read` reads it
back once and applies the same numpy rule as the CPU executor (cycle.Rule.verdict). Still one
submission and one readback per cycle, a larger one: (k + 1) * vocab floats (k * vocab more for
rejection with a GPU draft). Its cycles add `host_accept_s` to the request's backend timing.
Layout of the gathered buffer: tokens (R,) u32 | conf (R,) f32 | logits (k+1, vocab) f32 |
q_draft (k, vocab) f32, packed after the logits rows of the cycle's k (R = ROWS_MAX).
"""

from __future__ import annotations

import numpy as np

from .constants import ROWS_MAX
from .device import Copy
from .recording import Recording


def rows_bytes(vocab: int) -> int:
    """The gathered buffer's size for the largest cycle."""
    return 4 * (2 * ROWS_MAX + (2 * ROWS_MAX - 1) * vocab)


def readback_bytes(vocab: int, k: int, with_q: bool) -> int:
    return 4 * (2 * ROWS_MAX + (2 * k + 1 if with_q else k + 1) * vocab)


def gather(b, k: int, on_device: bool, rejection: bool) -> list[Copy]:
    """Copies of what the host rule needs into b.host_rows."""
    r, v4, dst = ROWS_MAX, 4 * b.vocab, b.host_rows
    out = [Copy(b.champion.logits, 0, dst, 8 * r, (k + 1) * v4)]
    if on_device and k:
        out += [Copy(b.champion.tokens, 0, dst, 0, 4 * (k + 1)),
                Copy(b.draft_conf, 0, dst, 4 * r, 4 * k)]
        if rejection:
            out.append(Copy(b.q_draft, 0, dst, 8 * r + (k + 1) * v4, k * v4))
    return out


def verdict(rec: Recording, raw: bytes, vocab: int):
    """(the verdict, drafts verified) from the gathered rows of `rec`, by the numpy rule."""
    drafts, tokens, rule = rec.host
    k, r = rec.k, ROWS_MAX
    words = np.frombuffer(raw, np.uint32, 2 * r)
    floats = np.frombuffer(raw, np.float32, (rec.readback.nbytes - 8 * r) // 4, 8 * r)
    logits = floats[:(k + 1) * vocab].reshape(k + 1, vocab).astype(np.float64)
    if rec.on_device:
        draft_tokens = [int(t) for t in words[1:k + 1]]
        conf = words[r:r + k].view(np.float32)
        # The confidence stop (the accept kernel's on the device path): drafts past the
        # first low-confidence one count as never proposed.
        low = np.flatnonzero(conf < rule.conf_threshold)
        k_eff = int(low[0]) if low.size else k
        q = None
        if rule.mode == "rejection" and k > 0:
            q = floats[(k + 1) * vocab:(2 * k + 1) * vocab].reshape(k, vocab)[:k_eff]
            # The draft kernel sampled by inverse CDF against the row's own f32 total, so its
            # q is the row over that total: renormalised in float64 here.
            q = q.astype(np.float64)
            q = q / q.sum(axis=1, keepdims=True)
    else:
        draft_tokens, k_eff = drafts.tokens, k
        q = drafts.q_matrix(vocab) if rule.mode == "rejection" else None
    return rule.verdict(logits[:k_eff + 1], draft_tokens[:k_eff], q, tokens), k_eff
