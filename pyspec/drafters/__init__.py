"""Draft sources: what proposes the tokens the champion verifies.

Every drafter has the same three calls, all given the committed token sequence:
  reset(tokens)                  a new request whose prompt is `tokens` (champion prefilled)
  propose(tokens, k, choose, stop) -> Proposal    up to k tokens continuing `tokens`
  accept(tokens)                 the sequence after verification (sync caches)
`choose(logits (vocab,), position)` is the engine's rule for turning draft logits into a token
(argmax, Gumbel-coupled, or a sample from q_draft) and returns (token, q_draft row or None,
confidence); `stop(i, confidence)` lets the schedule end drafting early.

Drafters never decide what is emitted: that is verify.py's job, so a bad draft only costs speed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

Choose = Callable[[np.ndarray, int], "tuple[int, np.ndarray | None, float]"]
Stop = Callable[[int, float], bool]


class DraftSpecError(ValueError):
    """An unknown --draft value."""


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


def make_drafter(spec: str, champion, champion_cache=None, load_model=None):
    """'ngram' | 'none' | 'self:L' | a GGUF path -> drafter (None for 'none').

    `champion_cache` is the champion's KV cache (self:L shares it); `load_model(path)` loads an
    independent draft model (the caller checks the pair with compat.check_pair first)."""
    from .model_draft import ModelDrafter, SelfDrafter
    from .ngram import NgramDrafter

    if spec == "none":
        return None
    if spec == "ngram":
        return NgramDrafter()
    if spec.startswith("self:"):
        try:
            layers = int(spec[5:])
        except ValueError:
            layers = -1
        n = champion.config.n_layers
        if not 1 <= layers < n:
            raise DraftSpecError(f"--draft {spec}: L must be an integer in 1..{n - 1} "
                                 f"(the champion has {n} layers)")
        return SelfDrafter(champion, champion_cache, layers)
    import os

    if load_model is None or not os.path.exists(spec):
        raise DraftSpecError(f"unknown --draft {spec!r}: use ngram, none, self:L or the path of "
                             f"a GGUF draft model")
    return ModelDrafter(load_model(spec), champion_cache.max_ctx if champion_cache else None)
