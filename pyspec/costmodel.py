"""The break-even guard's running estimates (`CostModel`): what a cycle costs and what it yields.

From each cycle's measured times and accepted drafts it keeps the medians of the last WINDOW
verify times by rows (one slow cycle must not fool the guard for long), the draft time per token,
the time of a champion-only cycle gone ahead (pipelined executors), and the acceptance by draft
position: the request's own counts drawn toward the drafter's earlier requests (HISTORY_PRIOR
pseudo-counts), and per proposal class where the drafter classifies (CLASS_PRIOR pseudo-counts of
the pooled estimate). From them it predicts tokens per second for every k,
E(k) / (k t_draft + t_verify(k)), and for trees (`tree_rate`) E over the acceptance by depth (its
own counts, drawn toward the chain's) per tree cycle, timed whole and apart from the chain's
(before the first: one draft step a depth plus a chain's pass over as many rows); a tree's first
branch is its chain, and what its walk says of it is scored as the chain's acceptance. The cycles
whose times say nothing of their kind's (a refill: a chain after a tree or champion-only, a tree
after a chain) teach what such a refill costs beyond a cycle of that kind (`t_switch`), which
the guard charges to a cycle that would switch (`extra`).

Not here: the policies and the guard that decides k from these predictions (schedule.py).
"""

from __future__ import annotations

import statistics

K_MAX = 8           # the longest a guarded policy drafts, and the acceptance tables' length
WINDOW = 7          # timing samples kept per quantity; estimates are their median
CLASS_PRIOR = 2.0   # pseudo-counts of the pooled acceptance in a class's own
HISTORY_PRIOR = 4.0  # pseudo-counts of the drafter's earlier requests in a request's acceptance


class CostModel:
    """Running estimates: verify time by rows, draft time per token, acceptance by position."""

    def __init__(self, k_max: int = K_MAX, timing: dict | None = None):
        # Medians of the last WINDOW samples, not running means: one slow cycle (a first-use
        # shader compile, a GC pause, a busy neighbour) must not fool the guard for long.
        # `timing` holds the sample lists and may be shared: an engine keeps one per drafter and
        # adapter, so a request starts from the times the last ones measured. The acceptance is
        # the request's own (it depends on the text), drawn toward what the drafter's earlier
        # requests accepted by HISTORY_PRIOR pseudo-counts: without them a request's first few
        # rejections could turn a drafter off that pays on average (on the H200 the trained draft
        # stayed off for 60 of 64 tokens of prompts where fixed:1 gave 1.4x).
        timing = {} if timing is None else timing
        self._verify_samples: dict[int, list[float]] = timing.setdefault("verify", {})
        self._draft_samples: list[float] = timing.setdefault("draft", [])
        self._ahead_samples: list[float] = timing.setdefault("ahead", [])
        med = lambda xs: statistics.median(xs) if xs else None
        # k -> median seconds of a k-draft verify pass
        self.t_verify: dict[int, float] = {k: med(v) for k, v in self._verify_samples.items() if v}
        self.t_draft: float | None = med(self._draft_samples)   # median seconds per draft token
        self.t_ahead: float | None = med(self._ahead_samples)   # ... of a k = 0 cycle gone ahead
        self.reached = [0] * k_max               # how often draft position i was verified
        self.accepted = [0] * k_max              # ... and accepted
        # every earlier request's counts (shared), and this request's prior from them
        self._history: list[list[int]] = timing.setdefault("history", [[0] * k_max, [0] * k_max])
        self._prior = [((a + 1) / (r + 2), HISTORY_PRIOR) if r else (0.5, 2.0)
                       for r, a in zip(*self._history)] + [(0.5, 2.0)] * k_max
        self.by_class: dict[int, tuple[list[int], list[int]]] = {}   # class -> (reached, accepted)
        self.tree_reached = [0] * k_max          # trees: how often depth i + 1 was verified
        self.tree_accepted = [0] * k_max         # ... and a node there accepted
        self._tree_nodes: list[float] = timing.setdefault("tree_nodes", [])
        # depth -> a tree cycle's whole seconds (drafting, pass, readback and walk), its own:
        # never the chain's verify times, which a tree cycle would poison (its pass carries more
        # rows than its depth; on a GPU a draft model's tree cycle is read alone, where a
        # chain pipelines, and its draft passes are part of it)
        self._tree_samples: dict[int, list[float]] = timing.setdefault("tree_cycle", {})
        self.previews = self.empty = 0           # previews scored, and those that drafted nothing
        # what a refill cycle cost beyond one of its kind in a run (median, seconds; 0 unmeasured)
        self._switch_samples: list[float] = timing.setdefault("switch", [])
        self.t_switch: float = med(self._switch_samples) or 0.0
        self._verify_time: dict[int, float | None] = {}   # verify_time's answers until t_verify moves

    def observe(self, k: int, n_accepted: int, t_draft: float, t_verify: float,
                ahead: bool = False, cls: int | None = None, nodes: int = 0,
                timed: bool = True, chain: tuple[int, int] | None = None) -> None:
        """`nodes`: a tree cycle's (k is its depth): its whole time (drafts and pass) and its
        acceptance by depth are kept apart from the chain's (`tree_rate`); `chain`: its first
        branch's drafts tested and accepted, scored as a chain's (rules/tree.first_branch: the
        first branch is the chain, tested as the chain would have been). Without it a chain
        whose first drafts were rejected early stayed at that estimate while trees ran: no
        chain paid by it, and trees one level deep ran the rest of the request slower than the
        chain would have (tests/test_guard_sim.py). `timed`: False for a cycle whose times say
        nothing of its kind's (Schedule.observe): only its acceptance is kept, and what it
        cost beyond a timed cycle of its kind (`t_switch`)."""
        if not timed and k:
            self._refill(k, t_draft + t_verify, nodes)
        if ahead:   # pipelined champion-only: its own estimate, the champion-only rate's
            self.t_ahead = _push_median(self._ahead_samples, t_verify)
            return
        if nodes:
            if timed:
                _push_median(self._tree_nodes, nodes)
                _push_median(self._tree_samples.setdefault(k, []), t_draft + t_verify)
            for i in range(min(k, n_accepted + 1, len(self.tree_reached))):
                self.tree_reached[i] += 1
                self.tree_accepted[i] += i < n_accepted
            if chain is not None:
                self.score(*chain, cls)
            return
        if timed:
            self.t_verify[k] = _push_median(self._verify_samples.setdefault(k, []), t_verify)
            self._verify_time.clear()
            if k:
                self.t_draft = _push_median(self._draft_samples, t_draft / k)
        self.score(k, n_accepted, cls)

    @property
    def trees_measured(self) -> bool:
        """Whether any tree cycle has been timed (`tree_rate` then predicts from it)."""
        return any(self._tree_samples.values())

    def _refill(self, k: int, seconds: float, nodes: int) -> None:
        """An untimed drafting cycle's excess over the median timed cycle of its kind and
        length (a tree: depth), where there is one (never below zero)."""
        if nodes:
            samples = self._tree_samples.get(k)
            predicted = statistics.median(samples) if samples else None
        else:
            t_v = self.t_verify.get(k)
            predicted = None if t_v is None or self.t_draft is None else k * self.t_draft + t_v
        if predicted is not None:
            self.t_switch = _push_median(self._switch_samples, max(seconds - predicted, 0.0))

    def tree_rate(self, depth: int, nodes: int, extra: float = 0.0) -> float | None:
        """Predicted tokens per second of trees `depth` deep: E = 1 + sum_j prod_{i<=j} a_i with
        a_i a tree's acceptance at depth i + 1, drawn toward the chain's (which a tree's first
        branch is) by 2 pseudo-counts, per the median tree cycle of that depth (else of the
        nearest depth measured, scaled by depth); before any tree is measured, per one draft
        step a depth and a chain's pass over as many rows as the tree has nodes (`nodes`, or
        the median of those verified), which gets a tree tried once where that pays. `extra`:
        seconds added to the cycle (a switch's refill)."""
        measured = sorted(self._tree_samples, key=lambda d: (abs(d - depth), d))
        if measured and self._tree_samples[measured[0]]:
            near = measured[0]
            seconds = statistics.median(self._tree_samples[near]) * max(depth, 1) / max(near, 1)
        else:
            nodes = round(statistics.median(self._tree_nodes)) if self._tree_nodes else nodes
            t_v = self.verify_time(nodes)
            if t_v is None or self.t_draft is None:
                return None
            seconds = depth * self.t_draft + t_v
        e, run = 1.0, 1.0
        for i in range(depth):
            a = ((self.tree_accepted[i] + 2.0 * self.acceptance(i))
                 / (self.tree_reached[i] + 2.0))
            run *= a
            e += run
        return e / (seconds + extra)

    def score(self, k: int, n_accepted: int, cls: int | None = None) -> None:
        """Acceptance by position from one proposal of k drafts, n_accepted of them kept (pooled,
        and in its class's counts when the drafter classified it)."""
        tables = [(self.reached, self.accepted), tuple(self._history)]
        if cls is not None:
            n = len(self.reached)
            tables.append(self.by_class.setdefault(cls, ([0] * n, [0] * n)))
        for reached, accepted in tables:
            for i in range(min(k, len(reached))):
                reached[i] += 1
                accepted[i] += i < n_accepted
                if i >= n_accepted:
                    break

    def acceptance(self, i: int, cls: int | None = None) -> float:
        """P(draft i accepted | drafts < i accepted): pooled, with a prior of what the drafter's
        earlier requests accepted at i (HISTORY_PRIOR pseudo-counts; none yet: 1/2, weight 2);
        for a class, its own counts with CLASS_PRIOR pseudo-counts of the pooled estimate."""
        prior, weight = self._prior[i]
        pooled = (self.accepted[i] + weight * prior) / (self.reached[i] + weight)
        if cls is None:
            return pooled
        reached, accepted = self.by_class.get(cls, (self.reached, self.accepted))
        if reached is self.reached:
            return pooled
        return (accepted[i] + CLASS_PRIOR * pooled) / (reached[i] + CLASS_PRIOR)

    def proposing(self, cls: int | None = None) -> float:
        """P(the drafter proposes anything), from previews (1 without them: a draft model always
        proposes; 1 for a class, which is one that matched), with a weak prior of 1/2. A
        speculative cycle whose drafter comes up empty is a champion-only cycle that could not go
        ahead."""
        if not self.previews or cls is not None:
            return 1.0
        return (self.previews - self.empty + 1) / (self.previews + 2)

    def expected_tokens(self, k: int, cls: int | None = None) -> float:
        """E(k) = 1 + sum_j prod_{i<=j} a_i: tokens per cycle (the +1 is the bonus/correction)."""
        e, run = 1.0, 1.0
        for i in range(k):
            run *= self.acceptance(i, cls)
            e += run
        return e

    def verify_time(self, k: int, optimistic: bool = False) -> float | None:
        """Measured t_verify(k); else linear between the measured k around it, or along the line
        through the two largest measured k below it (a pass costs a fixed part plus a part per
        row); else the nearest measured smaller k. `optimistic`: above the largest measured k,
        that k's time (rows that cost nothing: a GPU's row tile is often not full)."""
        if optimistic and self.t_verify and max(self.t_verify) < k:
            return self.t_verify[max(self.t_verify)]
        if k not in self._verify_time:
            self._verify_time[k] = self._interpolate(k)
        return self._verify_time[k]

    def _interpolate(self, k: int) -> float | None:
        if k in self.t_verify:
            return self.t_verify[k]
        below = sorted(j for j in self.t_verify if j < k)
        above = sorted(j for j in self.t_verify if j > k)
        if below and above:
            a, b = below[-1], above[0]
            ta, tb = self.t_verify[a], self.t_verify[b]
            return ta + (tb - ta) * (k - a) / (b - a)
        if len(below) >= 2:
            (a, ta), (b, tb) = [(j, self.t_verify[j]) for j in below[-2:]]
            return max(tb, tb + (tb - ta) * (k - b) / (b - a))
        return self.t_verify[below[-1]] if below else None

    def rate(self, k: int, cls: int | None = None) -> float | None:
        """Predicted tokens per second at length k, or None while unmeasured (champion-only:
        pipelined where measured so)."""
        return self._rate(k, self.expected_tokens(k, cls), cls)

    def rates(self, k: int, cls: int | None = None, optimistic: bool = False,
              extra: float = 0.0) -> list[float | None]:
        """[rate(0), ..., rate(k)] in one pass over the acceptance (the guard asks every cycle);
        `optimistic`: see verify_time; `extra`: seconds added to each drafting cycle (a
        switch's refill)."""
        out, e, run = [self._rate(0, 1.0)], 1.0, 1.0
        for i in range(k):
            run *= self.acceptance(i, cls)
            e += run
            out.append(self._rate(i + 1, e, cls, optimistic, extra))
        return out

    def _rate(self, k: int, tokens: float, cls: int | None = None,
              optimistic: bool = False, extra: float = 0.0) -> float | None:
        t_v = (self.t_ahead if k == 0 and self.t_ahead is not None
               else self.verify_time(k, optimistic))
        if t_v is None or (k and self.t_draft is None):
            return None
        seconds = k * (self.t_draft or 0.0) + t_v + (extra if k else 0.0)
        h = self.proposing(cls) if k else 1.0
        if h < 1.0:   # the cycles whose drafter has nothing emit one token at a one-row pass's cost
            tokens, seconds = h * tokens + (1 - h), h * seconds + (1 - h) * self.t_verify.get(0, t_v)
        return tokens / seconds


def _push_median(samples: list[float], x: float) -> float:
    samples.append(x)
    del samples[:-WINDOW]
    return statistics.median(samples)
