"""Prompt n-gram lookup: propose what followed the latest earlier occurrence of the current suffix.

No weights and no cache. Proposals are deterministic, so their q_draft is one-hot (rejection mode
then accepts a draft with probability p_target(draft), which is exact). Strong on text that copies
its context (summaries, rewrites, JSON extraction, repetition), useless on fresh prose.

The lookup keeps an index of every n-gram's two latest starts, extended by the tokens appended
since the last call (the list a call passes may be a new one, such as the schema drafter's
context plus forced tokens), so a proposal costs a few dictionary reads and one list comparison. That
makes it free to ask: `preview` proposes without counting a call, and the engine scores previews
against the champion's own tokens while speculation is off (schedule.Schedule.shadow).
"""

from __future__ import annotations

from ..cycle import Proposal, Rule

MAX_N = 4   # longest suffix tried
MIN_N = 1   # shortest suffix tried
# The most tokens a match of n tokens proposes (index n): as many as its evidence supports. On
# the champion's own answers to 288 of the frozen training seed prompts (not the evaluation
# workload), a 1-token match's first draft was right 22% of the time and 0.66 drafts were
# accepted on average; 2 tokens 49% / 1.92; 3 tokens 66% / 2.97; 4 tokens 85% / 5.33
# (bench/results/ngram-match.json (legacy), experiments/ngram_match.py). A wrong draft costs a
# verify row; these caps keep the rows a weak match risks to about what it is expected to return.
DRAFTS_BY_MATCH = (0, 1, 3, 7, 15)


class NgramDrafter:
    name = kind = "ngram"
    weight_bytes = 0
    kv_bytes = 0

    def __init__(self):
        self.calls = 0
        self._indexed: list[int] = []        # the tokens the index covers, in order
        self._index: list[dict[tuple, tuple]] = [{} for _ in range(MAX_N + 1)]

    def reset(self, tokens: list[int]) -> None:
        pass

    def propose(self, tokens: list[int], k: int, rule: Rule) -> Proposal:
        self.calls += 1
        follow = self.preview(tokens, k)
        return Proposal(follow, [None] * len(follow))

    def preview(self, tokens: list[int], k: int) -> list[int]:
        """What `propose` would draft for `tokens`: the k tokens (at most DRAFTS_BY_MATCH[n])
        after the latest earlier occurrence of the longest suffix (MAX_N down to MIN_N tokens,
        n of them) that occurred before."""
        start, n = self.match(tokens)
        return tokens[start:start + min(k, DRAFTS_BY_MATCH[n])] if n else []

    def match(self, tokens: list[int]) -> tuple[int, int]:
        """(where the continuation starts, n) for the longest suffix of n tokens that occurred
        before (the latest earlier occurrence); (0, 0) when none did."""
        self._extend(tokens)
        for n in range(min(MAX_N, len(tokens) - 1), MIN_N - 1, -1):
            entry = self._index[n].get(tuple(tokens[-n:]))
            # entry[0] is the suffix itself (the latest window indexed); entry[1] the occurrence
            # before it, which ends at least one token before the end: something follows it.
            if entry is not None and entry[1] is not None:
                return entry[1] + n, n
        return 0, 0

    def classify(self, tokens: list[int]) -> int:
        """How good the proposal for `tokens` will be, before it is made: the length of the
        suffix it matches (0: it proposes nothing). The schedule keeps acceptance per class."""
        return self.match(tokens)[1]

    def confirm(self, n_accepted: int) -> None:
        pass

    def _extend(self, tokens: list[int]) -> None:
        """Index the windows ending at the tokens past those already indexed. A list that does
        not start with them (another request, an edited conversation) is indexed afresh; the
        check is one list comparison."""
        seen = len(self._indexed)
        if len(tokens) < seen or tokens[:seen] != self._indexed:
            self._indexed, self._index, seen = [], [{} for _ in range(MAX_N + 1)], 0
        for j in range(seen, len(tokens)):
            for n in range(1, min(MAX_N, j + 1) + 1):
                key = tuple(tokens[j - n + 1:j + 1])
                index = self._index[n]
                before = index.get(key)
                index[key] = (j - n + 1, before[0] if before else None)
        self._indexed += tokens[seen:]
