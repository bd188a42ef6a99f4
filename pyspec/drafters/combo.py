"""n-gram lookup and a draft model, one of them per cycle (`--draft ngram+trained`).

The two win on different text. Prompt lookup proposes long, nearly free blocks where the answer
copies what came before (a rewrite, a summary, repeated structure), and nothing elsewhere; a
draft model proposes everywhere, two tokens at a time at best, for the cost of its steps. On the
H200 the trained draft was ahead on ambiguity, chat, conflict, json and memory, n-gram on
adversarial, long, multilingual, repetitive, rewrite and summary (bench/results/h200.json (legacy)).

`Combo.choose(tokens)` picks by the lookup's own signal before anything is drafted: the length
of the suffix it matches (NgramDrafter.classify). A match of MATCH tokens or more is n-gram's
(its first draft is right 66% of the time after 3 matched tokens and 85% after 4, against 22%
after 1: bench/results/ngram-match.json (legacy); the trained draft's first is right 59% of the
time).

The engine owns the switching (engine.py): each member keeps its own guard (schedule.Schedule,
its own measured times and acceptance), the active member is the backend's `drafter`, and the
engine changes it only between cycles with nothing in flight. Where cycles go ahead on a GPU,
the choice for the next cycle is made from the tokens known before the cycle in flight is read,
and a switch waits for that read (a cycle's device state, the lookup's history or the draft's
feed, belongs to one member). Either member's drafts are verified like any other, so which one
drafted never changes the output.

Measured on the H200 (bench/results/h200-combo.json, legacy: guarded, all three in one run): 1.24x
overall against 1.25x for the draft alone and 1.22x for n-gram alone; the best of the three on
chat, json and repetitive, below n-gram alone where the prompt is copied (each switch costs a
cycle that does not go ahead, and matches shorter than MATCH go to the draft). With the
retrained draft (2026-12-03): 1.23x at MATCH = 3, 1.17x at MATCH = 2, against 1.29x for the
draft alone (bench/results/h200-combo-qat.json and h200-combo-qat-match2.json, legacy).
"""

from __future__ import annotations

MATCH = 3   # suffix tokens matched from which n-gram drafts the cycle


class Combo:
    """Two drafters and the rule that picks one per cycle (see the module docstring)."""

    kind = "combo"

    def __init__(self, ngram, model):
        self.ngram, self.model = ngram, model
        self.members = (ngram, model)
        self.name = f"ngram+{model.name}"
        self.weight_bytes = model.weight_bytes
        self.kv_bytes = model.kv_bytes

    @property
    def calls(self) -> int:
        return self.ngram.calls + self.model.calls

    @property
    def bridge_stats(self) -> dict | None:
        """The draft model's bridge to the champion's vocabulary (drafters/bridge.py), if any."""
        return getattr(self.model, "bridge_stats", None)

    def choose(self, tokens: list[int]):
        """The member to draft after `tokens`."""
        return self.ngram if self.ngram.classify(tokens) >= MATCH else self.model

    def reset(self, tokens: list[int]) -> None:
        for member in self.members:
            member.reset(tokens)
