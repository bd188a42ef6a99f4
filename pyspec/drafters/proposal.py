"""A drafter's proposal: the drafted tokens and the distributions they were drawn from."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)       # (k,)
    q_draft: list[np.ndarray | None] = field(default_factory=list)  # k rows (vocab,); None = one-hot

    def q_matrix(self, vocab: int) -> np.ndarray:
        """(k, vocab) float64: the draft distributions, one-hot rows for deterministic proposals."""
        q = np.zeros((len(self.tokens), vocab))
        for i, (t, row) in enumerate(zip(self.tokens, self.q_draft)):
            if row is None:
                q[i, t] = 1.0
            else:
                q[i] = row
        return q
