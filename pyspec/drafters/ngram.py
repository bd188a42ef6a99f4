"""Prompt n-gram lookup: propose what followed the latest earlier occurrence of the current suffix.

No weights and no cache. Proposals are deterministic, so their q_draft is one-hot (rejection mode
then accepts a draft with probability p_target(draft), which is exact). Strong on text that copies
its context (summaries, rewrites, JSON extraction, repetition), useless on fresh prose.

The lookup keeps an index of every n-gram's two latest starts, extended by the tokens appended
since the last call, so a proposal costs a few dictionary reads however long the context is. That
makes it free to ask: `preview` proposes without counting a call, and the engine scores previews
against the champion's own tokens while speculation is off (schedule.Schedule.shadow).
"""

from __future__ import annotations

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
        self._seq: list[int] | None = None   # the token list the index covers a prefix of
        self._seen = 0
        self._index: list[dict[tuple, tuple]] = []

    def reset(self, tokens: list[int]) -> None:
        self._seq = None

    def propose(self, tokens: list[int], k: int, rule: Rule) -> Proposal:
        self.calls += 1
        follow = self.preview(tokens, k)
        return Proposal(follow, [None] * len(follow))

    def preview(self, tokens: list[int], k: int) -> list[int]:
        """What `propose` would draft for `tokens`: the k tokens after the latest earlier
        occurrence of the longest suffix (MAX_N down to MIN_N tokens) that occurred before."""
        self._extend(tokens)
        for n in range(min(MAX_N, len(tokens) - 1), MIN_N - 1, -1):
            entry = self._index[n].get(tuple(tokens[-n:]))
            # entry[0] is the suffix itself (the latest window indexed); entry[1] the occurrence
            # before it, which ends at least one token before the end: something follows it.
            if entry is not None and entry[1] is not None:
                start = entry[1] + n
                return tokens[start:start + k]
        return []

    def confirm(self, n_accepted: int) -> None:
        pass

    def _extend(self, tokens: list[int]) -> None:
        """Index the windows ending at the tokens appended since the last call. The engine grows
        one list in place during a request; another list, or a shorter or changed one, is
        indexed afresh."""
        seen = self._seen
        if (tokens is not self._seq or len(tokens) < seen
                or (seen and tokens[seen - 1] != self._last)):
            self._seq, self._index, seen = tokens, [{} for _ in range(MAX_N + 1)], 0
        for j in range(seen, len(tokens)):
            for n in range(1, min(MAX_N, j + 1) + 1):
                key = tuple(tokens[j - n + 1:j + 1])
                index = self._index[n]
                before = index.get(key)
                index[key] = (j - n + 1, before[0] if before else None)
        self._seen = len(tokens)
        self._last = tokens[-1] if tokens else None
