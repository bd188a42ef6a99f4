"""Prompt n-gram lookup: propose what followed the latest earlier occurrence of the current suffix.

No weights and no cache. Proposals are deterministic, so their q_draft is one-hot (rejection mode
then accepts a draft with probability p_target(draft), which is exact). Strong on text that copies
its context (summaries, rewrites, JSON extraction, repetition), useless on fresh prose.
"""

from __future__ import annotations

import numpy as np

from ..cycle import Rule
from .proposal import Proposal

MAX_N = 4   # longest suffix tried
MIN_N = 1   # shortest suffix tried


class NgramDrafter:
    name = kind = "ngram"
    weight_bytes = 0
    kv_bytes = 0

    def __init__(self):
        self.calls = 0

    def reset(self, tokens: list[int]) -> None:
        pass

    def propose(self, tokens: list[int], k: int, rule: Rule) -> Proposal:
        self.calls += 1
        seq = np.asarray(tokens, dtype=np.int64)
        for n in range(min(MAX_N, len(seq) - 1), MIN_N - 1, -1):
            start = _latest_match(seq, n)
            if start is not None:
                follow = seq[start + n:start + n + k].tolist()
                return Proposal(follow, [None] * len(follow))
        return Proposal()

    def confirm(self, n_accepted: int) -> None:
        pass


def _latest_match(seq: np.ndarray, n: int) -> int | None:
    """Start of the latest occurrence of seq[-n:] that ends before the suffix itself."""
    suffix = seq[-n:]
    body = seq[:-1]  # a match must leave at least one following token
    if len(body) < n:
        return None
    windows = np.lib.stride_tricks.sliding_window_view(body, n)  # (len-n, n)
    hits = np.flatnonzero((windows == suffix).all(axis=1))
    return int(hits[-1]) if hits.size else None
