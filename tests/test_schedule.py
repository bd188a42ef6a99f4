"""Speculation-length policies and the break-even guard (pyspec/schedule.py)."""

from __future__ import annotations

import pytest

from pyspec import schedule
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
    cost = schedule.CostModel()
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
