"""Speculation-length policies and the break-even guard (pyspec/schedule.py)."""

from __future__ import annotations

import random

import pytest

from pyspec import costmodel, schedule
from pyspec.cycle import Rule


def test_parse_policies():
    assert schedule.parse("fixed:0").next_k() == 0
    assert schedule.parse("fixed:8").next_k() == 8
    assert isinstance(schedule.parse("heuristic"), schedule.Heuristic)
    assert schedule.parse("confidence:0.4").conf_threshold == 0.4
    for bad in ("fixed", "fixed:-1", "fixed:x", "heuristic:3", "confidence:2", "often", ""):
        with pytest.raises(schedule.ScheduleError, match="fixed:K"):
            schedule.parse(bad)


def test_heuristic_moves_by_one_within_bounds():
    h = schedule.Heuristic()
    assert h.next_k() == 4
    h.observe(4, 4)
    assert h.next_k() == 5
    h.observe(5, 2)
    assert h.next_k() == 4
    for _ in range(20):
        h.observe(h.next_k(), 0)
    assert h.next_k() == 1
    for _ in range(20):
        k = h.next_k()
        h.observe(k, k)
    assert h.next_k() == schedule.K_MAX


def test_confidence_stops_below_threshold():
    rule = Rule("greedy", conf_threshold=schedule.Confidence(0.5).conf_threshold)
    assert not rule.stops(0.9) and not rule.stops(0.5) and rule.stops(0.49)
    assert not Rule("greedy", conf_threshold=schedule.Heuristic().conf_threshold).stops(0.0)


def test_expected_tokens_formula():
    cost = costmodel.CostModel()
    # With no data every position has the prior acceptance 1/2: E(k) = (1 - a^(k+1)) / (1 - a).
    for k in range(6):
        assert cost.expected_tokens(k) == pytest.approx((1 - 0.5 ** (k + 1)) / 0.5)


def run_guard(t_target, t_verify_per_row, t_draft, accept_prob, cycles=200):
    """Drive a guarded schedule with a synthetic machine; returns the k histogram."""
    sched = schedule.Schedule(schedule.Heuristic())
    for c in range(cycles):
        k = sched.next_k()
        # deterministic acceptance pattern with rate accept_prob per position
        n_acc = 0
        for i in range(k):
            if ((c * 7 + i * 3) % 100) < accept_prob * 100:
                n_acc += 1
            else:
                break
        sched.observe(k, n_acc, k * t_draft, t_target + k * t_verify_per_row)
    return sched


def test_guard_turns_speculation_off_when_it_cannot_pay():
    # Verify cost grows with every row as fast as a full pass (a compute-bound adapter) and
    # drafts are rarely accepted: speculation loses, so the guard must switch it off.
    sched = run_guard(t_target=1.0, t_verify_per_row=1.0, t_draft=0.1, accept_prob=0.1)
    hist = sched.stats()["k_histogram"]
    assert hist.get(0, 0) > 150, hist
    assert sched.stats()["guard_off"] > 100
    assert sched.stats()["probes"] > 0, "it must probe again later"


def test_guard_keeps_speculation_when_it_pays():
    # Verify costs nearly the same for any k (memory-bound) and drafts are usually accepted.
    sched = run_guard(t_target=1.0, t_verify_per_row=0.01, t_draft=0.01, accept_prob=0.9)
    hist = sched.stats()["k_histogram"]
    assert sum(v for k, v in hist.items() if k > 0) > 150, hist


def test_a_wide_lead_is_re_measured_less_often():
    # Each champion-only re-measurement is a cycle that does not speculate. Where speculation
    # leads by far (here about 4x), a drift of LEAD would not change the decision, so champion-
    # only is re-measured every REMEASURE_LONG cycles; a narrow lead (about 1.1x: accepted
    # less often, rows that cost) keeps the short interval.
    wide = run_guard(t_target=1.0, t_verify_per_row=0.01, t_draft=0.01, accept_prob=0.9,
                     cycles=400)
    narrow = run_guard(t_target=1.0, t_verify_per_row=0.1, t_draft=0.1, accept_prob=0.28,
                       cycles=400)
    best = lambda s: max(s.cost.rate(k) for k in range(1, 5)) / s.cost.rate(0)  # noqa: E731
    assert 1.05 < best(narrow) < schedule.LEAD < 2 < best(wide)
    assert sum(v for k, v in narrow.k_history.items() if k > 0) > 300, narrow.k_history
    assert wide.counts["baseline"] <= 400 // schedule.REMEASURE_LONG + 2, wide.counts
    assert narrow.counts["baseline"] >= 400 // (schedule.PROBE_EVERY + 1) - 2, narrow.counts


def test_the_guard_drafts_the_fastest_length_up_to_the_policys_k():
    # A draft model: every draft is a serial step costing a quarter of a pass, and each later
    # position is accepted less often (0.7, then 0.4, 0.2, 0.1 given the ones before). Rates,
    # in one-row passes: k = 1 gives 1.70 / 1.27, k = 3 gives 2.04 / 1.81 (both beat champion-
    # only), k = 4 loses. The walk's k often reaches 3, which pays, but 1 pays more: the guard
    # drafts 1.
    rng = random.Random(7)
    conditional = [0.7, 0.4, 0.2, 0.1] + [0.1] * schedule.K_MAX
    sched = schedule.Schedule(schedule.Heuristic())
    for _ in range(400):
        k = sched.next_k()
        n_acc = 0
        while n_acc < k and rng.random() < conditional[n_acc]:
            n_acc += 1
        sched.observe(k, n_acc, k * 0.25, 1.0 + 0.02 * k)
    hist = sched.stats()["k_histogram"]
    drafted = {k: v for k, v in hist.items() if k > 0}
    assert max(drafted, key=drafted.get) == 1, hist
    assert sum(v for k, v in drafted.items() if k >= 3) <= 10, hist
    assert sched.cost.rate(1) > sched.cost.rate(3) > sched.cost.rate(0), hist


def drive(sched, conditional, t_draft, t_verify, cycles, rng):
    """Cycles of a guarded schedule on a synthetic machine: position i of a block is accepted
    with probability conditional[i] given the ones before; t_verify(k) seconds per pass."""
    for _ in range(cycles):
        k = sched.next_k()
        n_acc = 0
        while n_acc < k and rng.random() < conditional[min(n_acc, len(conditional) - 1)]:
            n_acc += 1
        sched.observe(k, n_acc, k * t_draft, t_verify(k))
    return sched.stats()["k_histogram"]


def test_a_length_never_measured_is_tried_once_when_its_rows_could_be_free():
    # A GPU whose row tile holds 4 rows: 2 to 4 rows cost what 1 extra row costs. Drafts cost
    # 0.15 of a pass each and are accepted 60% of the time at every position. Extrapolated from
    # 0 and 1 draft, 2 drafts would cost 1.3 passes and lose to 1 draft (1.96 / 1.60 against
    # 1.60 / 1.30); measured, they cost 1.15 and win (1.96 / 1.45). The guard must try 2 to see.
    t_verify = lambda k: 1.0 if k == 0 else 1.15
    sched = schedule.Schedule(schedule.Heuristic())
    hist = drive(sched, [0.6], 0.15, t_verify, 400, random.Random(3))
    assert sum(v for k, v in hist.items() if k >= 2) > hist.get(1, 0), hist
    assert sched.cost.t_verify[2] == pytest.approx(1.15)


def test_a_request_starts_from_the_acceptance_of_the_drafters_earlier_requests():
    # One request where the draft pays (70% at the first position); the next starts with three
    # rejections in a row. Its own three cycles alone would say 1/5 and turn drafting off; with
    # the earlier request's acceptance as a prior it keeps drafting.
    t_verify = lambda k: 1.0 + 0.2 * k
    timing: dict = {}
    drive(schedule.Schedule(schedule.Heuristic(), timing=timing), [0.7, 0.3], 0.05, t_verify,
          200, random.Random(5))
    for shared, drafts_after in ((timing, True), ({**timing, "history": None}, False)):
        if shared["history"] is None:
            del shared["history"]
        sched = schedule.Schedule(schedule.Heuristic(), timing=shared)
        for _ in range(3):
            sched.observe(1, 0, 0.05, t_verify(1))
        assert (sched.next_k() > 0) == drafts_after, sched.cost.acceptance(0)


def test_fixed_is_never_overridden():
    sched = schedule.Schedule(schedule.parse("fixed:3"))
    for _ in range(50):
        k = sched.next_k()
        assert k == 3
        sched.observe(k, 0, 10.0, 100.0)
    assert sched.stats()["k_histogram"] == {3: 50}


def test_guard_waits_longest_when_even_perfect_drafts_would_lose():
    # A software adapter: k + 1 rows cost k + 1 passes. Even drafts that are always accepted
    # cannot beat champion-only, so after its one probe the guard waits PROBE_MAX cycles.
    sched = run_guard(t_target=1.0, t_verify_per_row=1.0, t_draft=0.0, accept_prob=1.0)
    hist = sched.stats()["k_histogram"]
    assert sched.probe_every == schedule.PROBE_MAX
    assert sum(v for k, v in hist.items() if k > 0) <= 3, hist


def test_drafts_made_in_the_cycle_are_judged_hopeless_by_the_verify_pass_alone():
    # Drafts made in the cycle (a draft model fed on the device) have their time estimated as a
    # share of the cycle's. Here that estimate says a draft costs a whole pass, so with the
    # drafts counted even always-right drafts would lose; the verify pass alone (rows nearly
    # free) says they would win. Drafted in the cycle, the guard must keep probing (waits that
    # double) rather than wait PROBE_MAX; drafted on the host, the old verdict stands.
    def drive(in_cycle: bool) -> schedule.Schedule:
        sched = schedule.Schedule(schedule.Heuristic(), in_cycle=in_cycle)
        for _ in range(60):
            k = sched.next_k()
            sched.observe(k, 0, 1.0 * k, 1.0 + 0.05 * k)
        return sched

    host, device = drive(False), drive(True)
    assert host.probe_every == schedule.PROBE_MAX
    assert device.probe_every < schedule.PROBE_MAX
    assert device.counts["probes"] >= 2 > host.counts["probes"], (device.counts, host.counts)


def test_a_pipelining_executor_measures_champion_only_ahead():
    """Where champion-only cycles go ahead (gpu/backend.py), a baseline is two k = 0 cycles and
    the champion-only rate is the pipelined one: drafting that beats a cycle-by-cycle champion
    but not a pipelined one is turned off; the same machine without pipelining speculates."""
    def drive(pipelined: bool) -> dict:
        sched = schedule.Schedule(schedule.Heuristic(), pipelined=pipelined)
        last = None
        for c in range(200):
            k = sched.next_k()
            n_acc = next((i for i in range(k) if (c * 7 + i * 3) % 100 >= 60), k)
            ahead = pipelined and k == 0 and last == 0
            # one row costs 4 ms cycle by cycle, 2.5 ms ahead; each more row 0.2 ms; a draft
            # 0.5 ms: with acceptance 0.6, 340-365 tok/s, against 250 and 400 champion-only
            t_verify = 0.0025 if ahead else 0.004 + 0.0002 * k
            sched.observe(k, n_acc, 0.0005 * k, t_verify, ahead)
            last = k
        return sched

    plain = drive(False)
    assert plain.cost.t_ahead is None
    assert sum(v for k, v in plain.k_history.items() if k > 0) > 100   # drafting pays
    piped = drive(True)
    assert piped.cost.t_ahead == pytest.approx(0.0025)
    assert piped.cost.rate(0) == pytest.approx(1 / 0.0025)
    assert piped.counts["guard_off"] > 0
    assert sum(v for k, v in piped.k_history.items() if k > 0) < 30      # only probes


def test_a_schedule_sharing_timing_starts_from_the_times_measured_before():
    """An engine keeps the guard's times across requests: the next request's schedule needs no
    champion-only baseline or first-draft probe, only its own acceptance."""
    timing: dict = {}
    first = schedule.Schedule(schedule.Heuristic(), timing=timing)
    assert first.next_k() == 0 and first.counts["baseline"] == 1
    first.observe(0, 0, 0.0, 0.004)
    assert first.next_k() == 1          # the first draft, measured cheaply
    first.observe(1, 1, 0.0003, 0.0042)
    second = schedule.Schedule(schedule.Heuristic(), timing=timing)
    assert second.cost.t_verify == {0: 0.004, 1: 0.0042} and second.cost.t_draft == 0.0003
    assert second.next_k() > 0 and second.counts["baseline"] == 0
    assert second.cost.reached == [0] * len(second.cost.reached)   # acceptance starts afresh


def drive_shadowed(agree_from: int, cycles: int = 120, empty_every: int = 0) -> list[int]:
    """A pipelined GPU-like machine (2.7 ms a cycle read alone, 1.95 ms ahead, 0.05 ms a row)
    with a free drafter whose previews are all wrong before cycle `agree_from` and all right
    after it (every `empty_every`-th one proposes nothing). Returns the k of every cycle."""
    sched = schedule.Schedule(schedule.Heuristic(), pipelined=True, shadowed=True)
    ks, last = [], None
    for c in range(cycles):
        k = sched.next_k()
        right = c >= agree_from
        ahead = k == 0 and last == 0
        sched.observe(k, k if right else 0, 1e-5 * k, 0.00195 if ahead else 0.0027 + 5e-5 * k,
                      ahead)
        if k == 0:
            empty = empty_every and c % empty_every == 0
            sched.shadow(0 if empty else 4, 4 if right and not empty else 0)
        ks.append(k)
        last = k
    return ks, sched


def test_a_shadowed_guard_needs_no_probes_while_previews_fail():
    """Previews scored against the champion's tokens stand in for probes: while they fail, a
    free drafter never drafts (beyond the first draft's one cheap timing probe) and no cycle
    leaves the pipeline for a probe."""
    ks, sched = drive_shadowed(agree_from=10 ** 9)
    assert sched.counts["probes"] == 0 and sched.counts["previews"] > 100
    assert sum(k > 0 for k in ks) == 0, ks


def test_a_shadowed_guard_turns_on_as_soon_as_previews_agree():
    """The first draft (a timing probe) waits for previews that say drafting could pay; after
    that, speculation follows the previews within a few cycles."""
    ks, sched = drive_shadowed(agree_from=40)
    assert sum(k > 0 for k in ks[:40]) == 0
    first = next(c for c, k in enumerate(ks) if k > 0)
    assert 40 <= first <= 50, ks
    assert sum(k > 0 for k in ks[60:]) > 40, ks
    assert sched.counts["probes"] == 0


def test_empty_previews_count_against_speculation():
    """A speculative cycle whose drafter has nothing is a champion-only cycle that could not go
    ahead: the rate the guard predicts falls with the share of empty previews."""
    def cost_with(empty: int, full: int) -> costmodel.CostModel:
        sched = schedule.Schedule(schedule.Heuristic(), pipelined=True, shadowed=True)
        sched.observe(0, 0, 0.0, 0.0027)
        sched.observe(0, 0, 0.0, 0.00195, True)
        sched.observe(2, 2, 2e-5, 0.0028)
        for _ in range(empty):
            sched.shadow(0, 0)
        for _ in range(full):
            sched.shadow(4, 4)
        return sched.cost

    assert cost_with(0, 20).proposing() == pytest.approx(21 / 22)
    assert cost_with(0, 20).rate(2) > cost_with(20, 20).rate(2) > cost_with(60, 20).rate(2)
    h, cost = 21 / 62, cost_with(40, 20)
    tokens, seconds = cost.expected_tokens(2), 2 * 1e-5 + 0.0028
    assert cost.rate(2) == pytest.approx((h * tokens + 1 - h) / (h * seconds + (1 - h) * 0.0027))
    assert costmodel.CostModel().proposing() == 1.0, "a draft model always proposes"
    # The guard's one-pass rates are rate() for every k.
    assert cost.rates(6) == pytest.approx([cost.rate(j) for j in range(7)])


def drive_in_cycle(right: bool, per_row: float, cycles: int = 80) -> tuple[list[int], object]:
    """Drafts looked up inside the cycle (n-gram on a GPU, every cycle ahead): a cycle costs
    1.95 ms plus `per_row` a verify row, drafting nothing on the host. The drafts are all right
    or all wrong; a champion-only cycle's preview says the same. Returns the k of every cycle."""
    sched = schedule.Schedule(schedule.Heuristic(), shadowed=True, in_cycle=True)
    ks = []
    for c in range(cycles):
        k = sched.next_k()
        sched.observe(k, k if right else 0, 0.0, 0.00195 + per_row * k)
        if k == 0:
            sched.shadow(4, 4 if right else 0)
        ks.append(k)
    return ks, sched


def test_drafts_in_the_cycle_need_no_previews_first():
    """With drafts looked up in the cycle, the guard drafts from its second cycle (after one
    champion-only measurement) on the acceptance's prior, without waiting for SHADOW_MIN
    previews; drafts that keep failing turn it off; and where each verify row costs as much as
    a pass (a software adapter), it never drafts beyond the first probes (two: the first, after a
    champion-only cycle, is not timed: test_a_probe_is_not_judged_by_its_refill)."""
    ks, _ = drive_in_cycle(right=True, per_row=5e-5)
    assert ks[0] == 0 and ks[1] > 0 and sum(k > 0 for k in ks) > 70, ks
    ks, _ = drive_in_cycle(right=False, per_row=5e-5)
    assert sum(k > 0 for k in ks[20:]) <= 3, ks
    ks, _ = drive_in_cycle(right=True, per_row=0.00195)
    assert sum(k > 0 for k in ks) <= 2, ks
    # Without in_cycle, the same machine waits for previews first.
    sched = schedule.Schedule(schedule.Heuristic(), shadowed=True)
    first = []
    for c in range(12):
        first.append(sched.next_k())
        sched.observe(first[-1], first[-1], 0.0, 0.00195)
        if first[-1] == 0:
            sched.shadow(4, 4)
    assert first[:schedule.SHADOW_MIN] == [0] * schedule.SHADOW_MIN, first


def drive_classes(classed: bool, cycles: int = 200) -> tuple[list[tuple[int, int]], object]:
    """A CPU-engine-like machine (a pass over k + 1 rows costs 1 + 0.45 k one-row passes, as the
    numpy engine's rows measured: bench/results/README.md) with a free drafter whose proposals
    alternate between two classes: class 4 (a long n-gram match) always right, class 1 always
    wrong. `classed`: the engine passes the class (else the guard pools them). Returns (class, k)
    of every cycle."""
    sched = schedule.Schedule(schedule.Heuristic(), shadowed=True)
    out = []
    for c in range(cycles):
        cls = 4 if c % 2 else 1
        seen = cls if classed else None
        k = sched.next_k(seen)
        right = cls == 4
        sched.observe(k, k if right else 0, 1e-6 * k, 0.07 * (1 + 0.45 * k), cls=seen)
        if k == 0:
            sched.shadow(4 if right else 1, 4 if right else 0, seen)
        out.append((cls, k))
    return out, sched


def test_the_guard_decides_by_the_class_of_the_proposal_at_hand():
    """Where a verify row costs half a pass, drafts pay only when they are likely right: with
    the drafter's class, the guard drafts on the always-right class and never on the
    always-wrong one; pooled, it cannot tell them apart and decides both alike. Class 0
    (nothing matched) never drafts."""
    ks, sched = drive_classes(classed=True)
    late = ks[40:]
    assert all(k == 0 for cls, k in late if cls == 1), late
    assert sum(k > 0 for cls, k in late if cls == 4) >= 0.9 * len(late) / 2, late
    assert sched.cost.acceptance(0, 4) > 0.9 > 0.1 > sched.cost.acceptance(0, 1)
    pooled, _ = drive_classes(classed=False)
    share = [sum(k > 0 for c, k in pooled[40:] if c == cls) / (len(pooled[40:]) / 2)
             for cls in (1, 4)]
    assert abs(share[0] - share[1]) < 0.2, share
    assert sched.next_k(0) == 0
    # A class never seen yet starts from the pooled estimate.
    assert sched.cost.acceptance(2, 7) == sched.cost.acceptance(2)
