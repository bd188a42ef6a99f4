"""Speculation length policies and the break-even guard.

A policy answers two questions: how many tokens may the draft propose this cycle (`next_k`), and
below which draft confidence should drafting stop (`conf_threshold`, applied by cycle.Rule.stops;
0 never stops). After verification it is told what happened (`observe`). K = 0 means plain
champion decoding.

  fixed:K        always K (no guard: what you ask for is what runs; tests rely on it)
  heuristic      start at 4; +1 after a fully accepted block, -1 after a rejection (1..K_MAX),
                 a ceiling for the guard, which drafts the fastest length up to it
  confidence:P   up to K_MAX drafts, stopping once the draft's own probability of its token < P

`heuristic` and `confidence` sit behind the break-even guard: from measured times it predicts
tokens per second for every k, E(k) / (k t_draft + t_verify(k)), with E(k) from the measured
acceptance by position, and compares it with champion-only 1 / t_verify(0). It drafts the j up
to the policy's k with the best predicted rate, among those that beat champion-only. When no k
pays it drafts nothing, and probes with one draft token after a wait that doubles while probes keep
failing. While speculation runs, champion-only is re-measured every PROBE_EVERY cycles.
Every decision is counted in `stats()`. How often champion-only is re-measured depends on the
lead: a speculation predicted at least LEAD times faster is re-measured every REMEASURE_LONG
cycles, since a drift that small would not change the decision, and each re-measurement is
cycles that do not speculate (on the H200, two of every 18: about the 5% the guarded trained
draft trailed fixed:2 by).

A drafter that costs nothing to ask (n-gram: `preview`) needs no probes. The engine scores its
previews against the tokens champion-only cycles emit (`shadow`), so the acceptance stays current
while speculation is off, and the guard turns speculation on the cycle the previews say it pays.
A request starts with SHADOW_MIN previews scored before its first draft. On a GPU that pipelines,
each probe cost two cycles read one at a time (about 6% of a 64-token request); see
bench/results/README.md for the measurement.

On an executor that pipelines champion-only cycles (gpu/backend.py), champion-only runs faster
than one cycle at a time: a cycle goes ahead while the one before is in flight. There the
champion-only rate is measured on such cycles (`t_ahead`: readback to readback), so a baseline
measurement is two k = 0 cycles, and the schedule decides each cycle's k while the cycle before
is still in flight (the engine observes every cycle, in order, one cycle late).

Where the drafts are looked up inside the cycle on the device (n-gram on a GPU: gpu/ngram.py),
every cycle goes ahead, speculative or not, and drafting costs no host time: all cycles are
measured alike (readback to readback), and the guard needs no previews before the first draft
(`in_cycle`): its rates decide from the first cycle, with the acceptance's prior, and the
previews and cycles then correct them. A wrong draft there costs only its verify row.

A drafter that can say how good its next proposal is before making it (n-gram: `classify`, the
length of the suffix it matched; a match of 4 tokens is right 4 times as often as one of 1,
bench/results/ngram-match.json (legacy)) has its acceptance kept per class as well: the guard
decides a cycle by the acceptance of the class at hand (each class's counts, drawn toward the pooled
estimate by costmodel.CLASS_PRIOR pseudo-counts), so a long match is drafted where extra rows
cost (the CPU engine: a pass over 4 rows costs 2 one-row passes) and a one-token match is not,
where the pooled acceptance would decide both alike. Class 0 (nothing matched) drafts nothing.
Only where drafts come from the host: the device lookup decides by the match itself
(gpu/ngram.py).

Trees (--tree): the guard picks the depth as it picks a chain's k, then `tree_pays` says whether
this cycle drafts the tree or that chain: the tree's rate is E over its acceptance by depth (its
own counts, drawn toward the chain's) per tree cycle, timed whole and kept apart from the
chain's times (a tree cycle's pass carries more rows than its depth, a draft model's tree
cycle runs alone where a chain pipelines, and tree cycles once read their logits rows back:
folded into the chain's verify times it made every chain look too slow, and the guard drafted
nothing); before a tree is measured, one draft step a depth plus a chain's pass
over as many rows. It must beat the best chain of at most that depth, else the chain runs, as
it would without --tree (on its own path: looked up or fed on the device, going ahead), and only
once the chain's acceptance at that depth has been learnt (from chains, and from the tests of
the trees' first branches, which are the chain's drafts: rules/tree.first_branch). With
drafts made in the cycle, a cycle that would switch kind (a tree after a chain, a chain after a
tree) is charged the refill such cycles were measured to cost (CostModel.t_switch). A fixed
policy always drafts the tree.

A draft position's acceptance is learnt only where it is drafted: the guard drafts one more than
its best until that position has been verified LEARN_MIN times in the request.

Not here: the running estimates the guard decides by, times and acceptance, and the rates they
predict (costmodel.py).
"""

from __future__ import annotations

from .costmodel import K_MAX, CostModel
from .errors import PyspecError

PROBE_EVERY = 16    # cycles between champion-only re-measurements, and the first probe delay
REMEASURE_LONG = 64  # ... where speculation leads by LEAD or more
LEAD = 1.15
PROBE_MAX = 128     # longest wait between probes while speculation is off
PROBE_K = 1         # drafts in a probe: enough to measure, cheap when it fails
SHADOW_MIN = 4      # previews scored before a shadowed drafter first drafts
MARGIN = 1.02       # speculation must beat champion-only by 2% to be chosen
LEARN_MIN = 4       # times a draft position is verified in a request before its estimate may
                    # keep it out; a tree is drafted only at a depth its chain has learnt


class ScheduleError(PyspecError, ValueError):
    """An unknown or malformed --k policy."""

    code = "bad_config"


class Policy:
    """Base policy: fixed length, never stops early."""

    guarded = False
    conf_threshold = 0.0   # drafting stops before a draft whose confidence is below this

    def __init__(self, k: int, k_max: int = K_MAX):
        self.k = k
        self.k_max = k_max

    def next_k(self) -> int:
        return self.k

    def observe(self, k: int, n_accepted: int) -> None:
        pass

    def describe(self) -> str:
        return f"fixed:{self.k}"


class Heuristic(Policy):
    guarded = True

    def __init__(self, k_max: int = K_MAX):
        super().__init__(4, k_max)

    def observe(self, k: int, n_accepted: int) -> None:
        if k == 0:
            return
        self.k = min(self.k + 1, self.k_max) if n_accepted == k else max(self.k - 1, 1)

    def describe(self) -> str:
        return "heuristic"


class Confidence(Policy):
    guarded = True

    def __init__(self, threshold: float, k_max: int = K_MAX):
        super().__init__(k_max, k_max)
        self.conf_threshold = threshold

    def describe(self) -> str:
        return f"confidence:{self.conf_threshold:g}"


def parse(spec: str) -> Policy:
    """'fixed:K' | 'heuristic' | 'confidence:P' -> Policy."""
    name, _, arg = spec.partition(":")
    usage = "use fixed:K (0 <= K <= 64), heuristic, or confidence:P (0 <= P <= 1)"
    if name == "heuristic" and not arg:
        return Heuristic()
    number = None
    try:
        number = int(arg) if name == "fixed" else float(arg) if name == "confidence" else None
    except ValueError:
        pass
    if name == "fixed" and number is not None:
        if not 0 <= number <= 64:
            raise ScheduleError(f"speculation policy {spec!r}: K {number} is outside 0..64; "
                                f"{usage}")
        return Policy(number, max(number, K_MAX))
    if name == "confidence" and number is not None:
        if not 0 <= number <= 1:   # (NaN too)
            raise ScheduleError(f"speculation policy {spec!r}: P {arg} is outside [0, 1]; "
                                f"{usage}")
        return Confidence(number)
    raise ScheduleError(f"unknown speculation policy {spec!r}: {usage}")


class Schedule:
    """A policy plus, when the policy is guarded, the break-even guard. One per request."""

    def __init__(self, policy: Policy, pipelined: bool = False, timing: dict | None = None,
                 shadowed: bool = False, in_cycle: bool = False, tree_nodes=None):
        self.policy = policy
        self.tree_nodes = tree_nodes   # under --tree: depth -> the tree's nodes (TreeDrafter.nodes)
        self.pipelined = pipelined   # champion-only cycles go ahead: baselines are two cycles
        self.shadowed = shadowed     # previews are scored (`shadow`): no probes needed
        self.in_cycle = in_cycle     # drafts looked up in the cycle: no previews needed first
        self._baseline_left = 0
        self.cost = CostModel(max(policy.k_max, K_MAX), timing)
        self.cycle = 0
        self.since_probe = 0
        self.off = False
        self.probe_every = PROBE_EVERY // 2
        self.remeasure_every = PROBE_EVERY
        self.counts = {"guard_off": 0, "probes": 0, "baseline": 0, "previews": 0,
                       "trees": 0, "tree_off": 0, "untimed": 0}
        self.k_history: dict[int, int] = {}
        self._last_kind = 0   # the kind of the cycle observed last (0: champion-only or none)
        self._planned = 0     # the kind of the cycle decided last (the engine observes late)
        self._probe_left = 0  # drafting cycles a probe has left (drafts made in the cycle: 2)

    def next_k(self, cls: int | None = None) -> int:
        """The k for this cycle; `cls`: the class of the drafter's proposal at hand, where it
        classifies (0: it has nothing to propose)."""
        self.cycle += 1
        k = self.policy.next_k()
        if self.policy.guarded and k > 0:
            k = 0 if cls == 0 else self._guard(k, cls)
        self._planned = self._planned if k else 0
        return k

    def tree_pays(self, depth: int, nodes: int, count: bool = True) -> bool:
        """Whether a tree `depth` deep (of about `nodes` nodes) is drafted this cycle rather
        than a chain: always under a fixed policy (what you ask for runs); under the guard
        where its predicted rate beats the best chain of at most that depth and
        champion-only, or while its pass over that many rows is unmeasured (once measured,
        the model decides). A measured tree with no chain measured beside it drafts the chain:
        tree cycles teach neither the chain's verify time nor the draft's, and without the
        draft's time the guard asks for one draft every cycle, so a tree that only ever beat
        champion-only would be drafted at depth 1 for the whole request (n-gram's `--tree auto`
        through Dawn, bench/results/h100-dawn.json: 0.9x its chain). With drafts made in the
        cycle, a switch (a tree after a chain, a chain after a tree) is charged its refill
        (CostModel.t_switch, measured on such cycles) on the side that would switch: through
        Dawn the guarded `--tree 2,2,1` swapped depth-1 trees in among its chain's cycles, 33
        to 36 refills over the sample against its chain's 11, for no more tokens a pass
        (bench/results/h100-dawn-609d0a7*.json). `count`: whether the decision is counted in
        the stats (not when the engine only looks ahead to the next cycle)."""
        pays = True
        if self.policy.guarded:
            tree = self.cost.tree_rate(depth, nodes, extra=self._switch("tree"))
            rates = self.cost.rates(depth, extra=self._switch("chain"))
            best = max((r for r in rates if r is not None), default=None)
            if tree is not None and (self.cost.t_draft is None
                                     or self.cost.reached[depth - 1] < LEARN_MIN):
                pays = False   # measure the chain (the draft's time, its acceptance) first
            else:
                pays = tree is None or best is None or tree > MARGIN * best
        if count:
            self.counts["trees" if pays else "tree_off"] += 1
        self._planned = "tree" if pays else "chain"
        return pays

    def shadow(self, k: int, n_accepted: int, cls: int | None = None) -> None:
        """A preview: what the drafter would have proposed (k drafts, 0: nothing) at a
        champion-only cycle,
        scored against the tokens the champion then chose (n_accepted leading ones agree). It
        teaches the acceptance what a probe would, without the probe's cost; under sampling the
        chance that the champion's token equals a one-hot draft is the chance that rejection
        sampling keeps it, so the estimate is the same."""
        self.cost.previews += 1
        self.cost.empty += k == 0
        self.cost.score(k, n_accepted, cls)
        self.counts["previews"] += 1

    def _guard(self, k: int, cls: int | None) -> int:
        cost = self.cost
        if self._baseline_left:
            self._baseline_left -= 1
            return 0
        if self._probe_left:   # a probe's second cycle: the one timed (observe)
            self._probe_left -= 1
            return min(k, PROBE_K)
        if 0 not in cost.t_verify or (self.pipelined and cost.t_ahead is None):
            # Measure champion-only first: one plain step, which also emits a token.
            return self._baseline()
        if self.shadowed and ((cost.reached[0] < SHADOW_MIN and not self.in_cycle)
                              or (cost.t_draft is None and not self._could_pay(k, cls))):
            # Free evidence first; then one probe for the draft's time, and only if drafts at
            # the champion-only pass's own cost would pay.
            self.counts["guard_off"] += 1
            return 0
        if cost.t_draft is None:
            return min(k, PROBE_K)  # first draft: measure it cheaply
        self.since_probe += 1
        if self.off and not self.shadowed:
            if self.since_probe < self.probe_every:
                self.counts["guard_off"] += 1
                return 0
            # A cheap probe refreshes the draft's time and acceptance.
            self.since_probe = 0
            self.counts["probes"] += 1
            self.off = False
            self._probe_left = 1 if self.in_cycle else 0
            return min(k, PROBE_K)
        if not self.off and self.since_probe >= self.remeasure_every:
            # Re-measure champion-only, so that a drifting machine does not fool the guard.
            self.since_probe = 0
            return self._baseline()
        rates = cost.rates(k, cls)
        base = rates[0]
        # E(k)/cost(k) is not monotone in k: the policy's k is a ceiling, and the guard drafts
        # the j <= k predicted fastest among those that beat champion-only. Where each draft is a
        # serial step of a model and later positions are accepted less often, that is often
        # fewer than k (on the H200 the trained draft at fixed:2 ran 1.34x, at fixed:4 1.00x).
        paying = [j for j in range(1, k + 1) if (rates[j] or 0) > MARGIN * base]
        tree = 0 if paying else self._tree_depth(k, base)
        if tree:   # no chain pays, a measured tree does: tree_pays then drafts it
            return tree
        if paying:
            return self._best_chain(k, cls, rates, paying)
        return self._nothing_pays(k, base)

    def _best_chain(self, k: int, cls: int | None, rates: list, paying: list[int]) -> int:
        """Where some chain of at most k drafts beats champion-only (`paying`): the k to draft."""
        base = rates[0]
        if self.off:   # shadowed: the previews say it pays now
            self.off, self.since_probe = False, 0
        self.probe_every = PROBE_EVERY
        best = max(paying, key=rates.__getitem__)
        self.remeasure_every = REMEASURE_LONG if rates[best] >= LEAD * base else PROBE_EVERY
        # One length longer, never measured, is tried once if it would be faster with its
        # extra row free: extrapolating the verify time from shorter passes says a row
        # costs what the last one did, but a row that fills a GPU's tile costs almost
        # nothing (H200: 2 to 4 rows cost the same), and the guard never learns that of a
        # length it never drafts.
        # So is one longer whose last draft has been verified fewer than LEARN_MIN times in
        # this request: a position's acceptance is learnt only where it is drafted, so two
        # unlucky tries would keep it out for the request (chains of one draft for the rest
        # of a request where two paid: tests/test_guard_sim.py, seed 8).
        j = best + 1
        if j <= k and j not in self.cost.t_verify:
            hopeful = self.cost.rates(j, cls, optimistic=True)[j]
            if hopeful is not None and hopeful > rates[best]:
                return j
        if j <= k and self.cost.reached[best] < LEARN_MIN:
            return j
        return best

    def _nothing_pays(self, k: int, base: float) -> int:
        """Where neither a chain nor a tree beats champion-only: 0, and when the next probe."""
        # Nothing pays: off (shadowed: until the previews say otherwise), else wait twice as long
        # before the next probe (up to PROBE_MAX); at once PROBE_MAX when even a draft that is
        # always right would lose, as on a software GPU adapter, whose pass over k + 1 rows
        # costs about k + 1 one-row passes. Where the drafts are made in the cycle, their time
        # is a share of the cycle's by command count, an estimate: there only the verify pass
        # (drafts free and always right) can make that verdict. On the H200 a draft whose
        # 2-draft cycles cost about 1.5 passes was kept off for whole requests without a probe,
        # which only this verdict does (bench/results/README.md, "A trap in the guard").
        if not self.off:
            self.off = True
            self.since_probe = 0
            t_draft = 0.0 if self.in_cycle else (self.cost.t_draft or 0.0)
            hopeless = all((j + 1) / (j * t_draft + self.cost.verify_time(j)) <= MARGIN * base
                           for j in range(1, k + 1))
            self.probe_every = PROBE_MAX if hopeless else min(2 * self.probe_every, PROBE_MAX)
        self.counts["guard_off"] += 1
        return 0

    def _tree_depth(self, k: int, base: float) -> int:
        """Under --tree, once a tree has been measured: the depth (at most k) whose tree is
        predicted fastest (a switch from a chain charged its refill), where that beats
        champion-only; else 0. Where no chain pays, this keeps `--tree` drafting its trees
        rather than nothing (a tree verifies more tokens a pass than its chain for a little
        more time)."""
        if self.tree_nodes is None or not self.cost.trees_measured:
            return 0
        rates = {j: self.cost.tree_rate(j, self.tree_nodes(j), extra=self._switch("tree"))
                 or 0.0 for j in range(1, k + 1)}
        best = max(rates, key=rates.__getitem__)
        return best if rates[best] > MARGIN * base else 0

    def _switch(self, kind: str) -> float:
        """The refill a cycle of `kind` costs after the cycle decided last, where drafts are
        made in the cycle and that one was of the other drafting kind (0 otherwise)."""
        return (self.cost.t_switch if self.in_cycle and self._planned not in (0, kind)
                else 0.0)

    def _could_pay(self, k: int, cls: int | None = None) -> bool:
        """Whether some j <= k would beat champion-only if drafting were free and a pass over
        j + 1 rows cost what a one-row pass costs: the measured acceptance's upper bound."""
        cost, h = self.cost, self.cost.proposing(cls)
        return any((h * cost.expected_tokens(j, cls) + 1 - h) / cost.t_verify[0]
                   > MARGIN * cost.rate(0) for j in range(1, k + 1))

    def _baseline(self) -> int:
        """A champion-only measurement: one cycle, or two where the second goes ahead."""
        self.counts["baseline"] += 1
        self._baseline_left = 1 if self.pipelined else 0
        return 0

    def observe(self, k: int, n_accepted: int, t_draft: float, t_verify: float,
                ahead: bool = False, cls: int | None = None, nodes: int = 0,
                chain: tuple[int, int] | None = None) -> None:
        """k is what ran: after the engine's caps and any drafter shortfall; `ahead`: a k = 0
        cycle submitted while the one before was in flight; `cls`: its proposal's class;
        `nodes`: a tree's (k its depth), and `chain` what its walk says of its first branch
        (drafts tested, accepted: rules/tree.first_branch), the chain's acceptance. With drafts
        made in the cycle, a drafting cycle after one of another kind (champion-only, or first
        in its request; a tree after a chain, a chain after a tree) teaches its acceptance but
        not its times: it refills what the cycle before left (the draft's catch-up on the
        tokens it sat out, the pipeline, a tree's rows moved into place), so it costs more
        than one in a run of its kind (the trained draft natively on an H100, a diagnostic log
        of every cycle kept in no result file: 2.3 ms against 1.4 after champion-only, up to
        3.6 after a tree). Timed, every probe measured that refill and the guard turned
        speculation off at each: through Dawn `--tree 2,2,1` guarded drafted 1.32 tokens a pass
        against its chain's 2.00 (bench/results/h100-dawn-6179483.json). A probe is two
        drafting cycles, the second timed."""
        self.k_history[k] = self.k_history.get(k, 0) + 1
        kind = 0 if not k else "tree" if nodes else "chain"
        timed = not (self.in_cycle and kind and kind != self._last_kind)
        self.counts["untimed"] += not timed
        self._last_kind = kind
        self.cost.observe(k, n_accepted, t_draft, t_verify, ahead, cls, nodes, timed, chain)
        self.policy.observe(k, n_accepted)

    def stats(self) -> dict:
        return {"policy": self.policy.describe(), "k_histogram": dict(sorted(self.k_history.items())),
                **self.counts}


def merged_stats(scheds: dict[str, Schedule]) -> dict:
    """A request's schedule stats: its schedule's, or where a combination of drafters ran
    (drafters/combo.py; one schedule per member, by kind: "ngram", "model") their counts
    summed, and each member's own under "by_drafter"."""
    if len(scheds) == 1:
        return next(iter(scheds.values())).stats()
    parts = {name: s.stats() for name, s in scheds.items()}
    merged: dict = {"policy": next(iter(parts.values()))["policy"], "k_histogram": {}}
    for part in parts.values():
        for k, v in part.items():
            if k == "k_histogram":
                for j, n in v.items():
                    merged[k][j] = merged[k].get(j, 0) + n
            elif k != "policy":
                merged[k] = merged.get(k, 0) + v
    merged["k_histogram"] = dict(sorted(merged["k_histogram"].items()))
    merged["by_drafter"] = parts
    return merged
