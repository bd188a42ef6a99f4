"""A request's state as the loop passes it from step to step (engine.py), and the small pure
steps over it that need no engine: the chunk it shows next, forced tokens, shadow previews.

Not here: the loop and its steps that use the backend (engine.py), the chunks' types
(chunks.py), the stats' counting (stats.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import schedule
from .chunks import Chunk
from .cycle import Rule
from .options import Options
from .stats import Stats
from .text.stops import StopStrings


@dataclass(eq=False)
class Request:
    """One request's state, passed from step to step of the loop (Engine.stream); nothing of a
    request lives on the engine between its steps."""

    prompt: list[int]
    opts: Options
    mode: str                  # the verify mode (Options.resolved_verify)
    rule: Rule
    policy: schedule.Policy
    ctx: int                   # the context's positions
    done: list[int]            # the resumed ids (Resume), committed after the prompt
    constraint: object = None  # jsonmask.Constraint under a JSON schema
    combo: object = None       # a combination (drafters/combo.py) whose member `drafter` is
    drafter: object = None     # what drafts the next cycle (passed to the backend); None: none
    pipelined: bool = False    # champion-only cycles go ahead (gpu/backend.py)
    # The drafter's setup (plan.use): its schedule, per drafter kind ("ngram", "model": the
    # stats and the receipt name members by kind, never by a name that may hold a file's path).
    scheds: dict = field(default_factory=dict)
    sched: schedule.Schedule | None = None
    in_cycle: bool = False     # drafts made on the device: every cycle may go ahead
    previewer: object = None   # a drafter free to ask (n-gram), scored in shadow at k = 0
    classify: object = None    # the drafter's classes of proposals, for the guard
    previews: list = field(default_factory=list)   # (position, drafts, class) not yet scored
    # Going ahead: `queued` is the next cycle, submitted before this one is read; `decided` a
    # k > 0 decided for the next cycle while a k = 0 one was in flight.
    queued: object = None
    decided: int | None = None
    limit: int = 0             # the most tokens the request may hold (prompt + max_tokens)
    # The text: tokens committed (prompt + resumed + generated, the list the conversation cache
    # holds), shown, and held for the next chunk.
    tokens: list[int] = field(default_factory=list)
    finish: str = "length"
    eog: set = field(default_factory=set)
    detok: object = None
    stops: StopStrings | None = None
    out_text: str = ""
    unsent: list[int] = field(default_factory=list)   # ids committed since the last chunk
    marks: list = field(default_factory=list)         # (kind, start) of each unsent id
    decoded: int = 0           # characters decoded so far
    # Counts and times.
    st: Stats = field(default_factory=Stats)
    t_start: float = 0.0
    t_prefill: float = 0.0
    ttft: float | None = None
    reused: int = 0

    @property
    def generated(self) -> int:
        return len(self.tokens) - len(self.prompt)

    @property
    def remaining(self) -> int:
        return self.opts.max_tokens - self.generated

    def chunk(self, text: str) -> Chunk:
        """A chunk of `text` with the ids committed since the last one (a cycle whose bytes end
        mid-character, or whose text is all held back for a stop string, yields none), so the
        chunks' ids are always exactly the tokens behind the text shown plus the held-back
        tail, which is a function of their text (stops.held_suffix): what a Resume needs."""
        c = Chunk(len(self.out_text), text, len(self.unsent), self.unsent,
                  self.st.champion_passes, [m[0] for m in self.marks],
                  [m[1] for m in self.marks])
        self.out_text, self.unsent, self.marks = self.out_text + text, [], []
        return c


def forced(constraint, generated: list[int], j: int) -> bool:
    """Did the schema allow exactly one token at generated[j]?"""
    constraint.state_after(generated)
    state = constraint.states[j]
    return (state is not None and state is not constraint.done
            and constraint.masker.mask(state).forced is not None)


def score_previews(previews: list[tuple[int, list[int], int | None]], tokens: list[int],
                    sched: schedule.Schedule) -> list[tuple[int, list[int], int | None]]:
    """Score each preview (position, drafts, class) whose fate the committed tokens now decide (a
    disagreement, or all of its drafts reached) with the schedule; return the rest."""
    waiting = []
    for at, draft, cls in previews:
        seen = tokens[at:at + len(draft)]
        agree = 0
        while agree < len(seen) and seen[agree] == draft[agree]:
            agree += 1
        if agree < len(seen) or len(seen) == len(draft):
            sched.shadow(len(draft), agree, cls)
        else:
            waiting.append((at, draft, cls))
    return waiting
