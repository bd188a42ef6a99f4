"""Pipelined decoding on the GPU (gpu/backend.py): a champion-only cycle is submitted before the
one in flight is read, fed on the device by that cycle's token; with n-gram drafts looked up on
the device, or a draft model on the GPU fed on the device (gpu/ahead.py), a speculative cycle
too, fed by the verdict of the one before. Whatever ends the
request in the middle of the pipeline (max_tokens, an end token, a stop string, a cancel), the
text, the tokens, the finish reason and the cache left behind are those of the same request read
cycle by cycle. A lost device with two cycles in flight is in tests/test_gpu_faults.py; the
device lookup's proposals against the host's in tests/test_gpu_ngram.py.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from conftest import greedy_pick, reference_decode, requires_gpu
from pyspec.engine import Engine
from pyspec.gpu.processors import KINDS
from pyspec.load import backend as backend_for
from pyspec.options import Options

pytestmark = requires_gpu


@pytest.fixture(scope="module")
def reference(tiny):
    return reference_decode(tiny.champion, tiny.prompt, 40, greedy_pick)


def run(engine: Engine, prompt: list[int], opts: Options,
        cancel_after: int | None = None) -> tuple[dict, list]:
    """Stream a request; with cancel_after, should_stop says yes from its (cancel_after + 1)th
    question on. Returns the report and the chunks."""
    report, chunks, asked = {}, [], [0]

    def should_stop():
        asked[0] += 1
        return cancel_after is not None and asked[0] > cancel_after

    async def go():
        async for c in engine.stream(prompt, opts, report, should_stop=should_stop):
            chunks.append(c)

    asyncio.run(go())
    return report, chunks


def ends(tiny, reference) -> dict:
    """Requests that end mid-pipeline, each in its own way."""
    stop_text = tiny.tokenizer.decode(reference[9:11])
    return {
        "max_tokens": (Options(max_tokens=17, stop_at_eos=False), None),
        "end_token": (Options(max_tokens=40, stop_at_eos=False, stop_ids=(reference[12],)), None),
        "stop_string": (Options(max_tokens=40, stop_at_eos=False, stop=[stop_text]), None),
        "cancel": (Options(max_tokens=40, stop_at_eos=False), 7),
        "sampled": (Options(max_tokens=23, temperature=0.9, seed=5, stop_at_eos=False), None),
        "rejection": (Options(max_tokens=23, temperature=0.9, seed=5, stop_at_eos=False,
                              verify="rejection"), None),
    }


@pytest.mark.parametrize("draft", ["none", "ngram", "model"])
@pytest.mark.parametrize("end", ["max_tokens", "end_token", "stop_string", "cancel", "sampled",
                                 "rejection"])
def test_a_pipelined_request_ends_where_an_unpipelined_one_does(tiny, reference, end, draft):
    """Champion-only cycles, n-gram cycles of three drafts (the same drafts either way: the
    device lookup proposes what the host's does) and a draft model's cycles of three (the same
    drafts either way: the forward is batch-invariant, so the draft's rows do not depend on how
    it was fed), so the two runs verify the same rows and even rejection sampling gives the same
    bytes. The same drafts accepted in the same numbers, this turn and the next, say the draft's
    cache was left as the unpipelined run leaves it."""
    opts, cancel_after = ends(tiny, reference)[end]
    if draft != "none":
        opts = dataclasses.replace(opts, k="fixed:3")
    results = {}
    for pipelined in (True, False):
        engine = Engine(backend_for(tiny.on("gpu"), tiny.close_path if draft == "model" else draft,
                                    pipelined=pipelined,
                                    draft_ahead=True),   # off by default on a software adapter
                        tiny.tokenizer)
        report, chunks = run(engine, tiny.prompt, opts, cancel_after)
        timing = report["stats"]["backend_timing"]
        assert (timing["ahead"] > 0) == pipelined, timing
        assert timing["readbacks"] == timing["cycles"], "one readback per cycle"
        assert "".join(c.text for c in chunks) == report["text"]
        # The cache keeps the rows of verified tokens only (the last token's too when a stop
        # token came after it; those of a cycle's tokens after a stop string, which the next
        # turn does not reuse), none of a cycle that was never read.
        kv = engine.backend.kv
        follow = tiny.prompt + report["tokens"]
        assert kv.pending == 0 and len(follow) - 1 <= kv.committed <= len(follow) + 3
        # A next turn reuses the cache as it was left, and goes on exactly.
        assert engine.reusable(follow) == len(follow) - 1
        more = engine.generate(follow, Options(max_tokens=9, stop_at_eos=False, k="fixed:3"))
        results[pipelined] = (report["text"], report["tokens"], report["finish_reason"],
                              kv.committed, more.tokens, report["stats"]["accepted"],
                              more.stats["drafted"], more.stats["accepted"])
    assert results[True] == results[False]
    text, tokens, finish = results[True][:3]
    if end not in ("sampled", "rejection"):
        assert tokens == reference[:len(tokens)]
    expected = {"max_tokens": (17, "length"), "end_token": (12, "stop"), "sampled": (23, "length"),
                "rejection": (23, "length")}
    if draft == "none":   # a question per cycle; n-gram cycles emit several tokens
        expected["cancel"] = (7, "cancelled")
    if end in expected:
        assert (len(tokens), finish) == expected[end]
    elif end == "cancel":
        assert finish == "cancelled" and len(tokens) < 40
    else:   # the stop string is in tokens 9..10 (or earlier, by chance): never past them
        assert finish == "stop" and len(tokens) <= 11


def test_which_cycles_go_ahead(tiny):
    """Cycles go ahead only when nothing of the request runs on the host between cycles:
    champion-only ones, and n-gram ones whose drafts are looked up on the device. With drafts
    from the host every cycle (fixed:3, the device lookup off) or a host processor (top_k on
    the host) none does; with a drafter held at k = 0, top_k on the device, or device
    penalties, all but the first do; with the device lookup or a draft model fed on the device,
    every cycle but the first and those after a cycle that might reach max_tokens."""
    top_k = Options(max_tokens=12, stop_at_eos=False, top_k=3, temperature=0.8)
    drafts = Options(max_tokens=12, stop_at_eos=False, k="fixed:3")
    cases = [("ngram", drafts, False, False, 0),
             ("none", top_k, False, True, 0),
             ("none", top_k, True, True, 11),
             ("ngram", Options(max_tokens=12, stop_at_eos=False, k="fixed:0"), False, True, 11),
             ("none", Options(max_tokens=12, stop_at_eos=False, presence_penalty=0.5), False,
              True, 11),
             ("ngram", drafts, False, True, None),
             ("model", drafts, False, False, 0),
             ("model", drafts, False, True, None)]
    for draft, opts, device_filters, on_device, ahead in cases:
        engine = Engine(backend_for(tiny.on("gpu"), tiny.close_path if draft == "model" else draft,
                                    # top_k on the device or the host
                                    device_processors=KINDS if device_filters else KINDS[:2],
                                    device_ngram=on_device, draft_ahead=on_device),
                        tiny.tokenizer)
        emitted, read = [], engine.backend.read

        async def counted(c):
            out = await read(c)
            emitted.append(out.verdict.n_accepted + 1)
            return out

        engine.backend.read = counted
        r = engine.generate(tiny.prompt, opts)
        if ahead is None:   # a cycle of up to 3 drafts goes ahead unless the one before could
            # reach the 12th token: it started at s generated tokens with s + 4 >= 12
            starts = [sum(emitted[:i]) for i in range(len(emitted))]
            ahead = sum(s + 4 < 12 for s in starts)
            assert r.stats["drafted"] > 0 and ahead > 0
        assert r.stats["backend_timing"]["ahead"] == ahead, (draft, opts, device_filters)


def test_the_schedule_decides_one_cycle_late_and_stays_exact(tiny, reference, monkeypatch):
    """While a k = 0 cycle is in flight, the schedule decides the next cycle's k before it has
    observed the cycle in flight: k = 0 goes ahead at once, a k > 0 waits for the readback
    (its drafts need the token on the host) and runs next. Scripted decisions (a guard turning
    speculation off and on) make it exact to count: a cycle goes ahead exactly when it and the
    one before were decided k = 0, the output is the champion's, and every cycle that ran was
    observed once."""
    from pyspec import schedule

    script, calls = [0, 0, 0, 2, 0, 1, 0, 0, 3, 3, 0], []

    def next_k(self, cls=None):
        calls.append(script[len(calls) % len(script)])
        return calls[-1]

    monkeypatch.setattr(schedule.Schedule, "next_k", next_k)
    engine = Engine(backend_for(tiny.on("gpu"), "self:1"), tiny.tokenizer)
    r = engine.generate(tiny.prompt, Options(max_tokens=40, k="heuristic", stop_at_eos=False))
    assert r.tokens == reference
    assert sum(r.stats["schedule"]["k_histogram"].values()) == r.stats["champion_passes"]
    pairs = sum(a == b == 0 for a, b in zip(calls, calls[1:]))
    assert r.stats["backend_timing"]["ahead"] == pairs > 0


def test_a_cycle_whose_drafter_had_nothing_lets_the_next_go_ahead(tiny, reference, monkeypatch):
    """A host drafter (n-gram) that comes up empty makes its cycle champion-only: the next cycle,
    if decided k = 0, goes ahead as after any champion-only cycle. With a drafter that never
    proposes, every k = 0 decision after the first cycle goes ahead, including those after a
    cycle decided k > 0."""
    from pyspec import schedule
    from pyspec.drafters import Proposal
    from pyspec.drafters.ngram import NgramDrafter

    script, calls = [2, 0, 0, 3, 0, 1, 1, 0], []

    def next_k(self, cls=None):
        calls.append(script[len(calls) % len(script)])
        return calls[-1]

    monkeypatch.setattr(schedule.Schedule, "next_k", next_k)
    monkeypatch.setattr(NgramDrafter, "propose", lambda self, tokens, k, rule: Proposal())
    # the host's drafter, which the patch empties
    engine = Engine(backend_for(tiny.on("gpu"), "ngram", device_ngram=False), tiny.tokenizer)
    r = engine.generate(tiny.prompt, Options(max_tokens=40, k="heuristic", stop_at_eos=False))
    assert r.tokens == reference
    # Every cycle emits one token: cycle c (0-based) asks for call c + 1, capped at the tokens
    # left after the next one (40 - c - 2).
    expected = sum(min(calls[c + 1], 38 - c) == 0 for c in range(39))
    assert r.stats["backend_timing"]["ahead"] == expected > script.count(0)
    assert r.stats["drafted"] == 0


def test_speculative_cycles_are_decided_one_cycle_late(tiny, reference, monkeypatch):
    """With n-gram drafts looked up on the device, the schedule decides cycle c + 1's k while
    cycle c is in flight, before it observes cycle c: at most two decisions are ever outstanding,
    and two are whenever a cycle went ahead. Scripted decisions (a guard turning speculation off
    and on, k changing) make it exact to count. Each cycle is observed once, in order, with at
    most the drafts decided for it, and the output is the champion's."""
    from pyspec import schedule

    script, events = [0, 0, 3, 2, 0, 5, 1, 0, 4, 4], []
    observe = schedule.Schedule.observe

    def next_k(self, cls=None):
        events.append(("decide", script[sum(e == "decide" for e, _ in events) % len(script)]))
        return events[-1][1]

    def observed(self, k, n_accepted, *args):
        events.append(("observe", k))
        observe(self, k, n_accepted, *args)

    monkeypatch.setattr(schedule.Schedule, "next_k", next_k)
    monkeypatch.setattr(schedule.Schedule, "observe", observed)
    engine = Engine(backend_for(tiny.on("gpu"), "ngram"), tiny.tokenizer)
    r = engine.generate(tiny.prompt, Options(max_tokens=40, k="heuristic", stop_at_eos=False))
    assert r.tokens == reference
    decided = [k for e, k in events if e == "decide"]
    seen = [k for e, k in events if e == "observe"]
    assert len(seen) == len(decided) == r.stats["champion_passes"]   # none dropped at a length end
    assert all(s <= d for s, d in zip(seen, decided)) and sum(seen) == r.stats["drafted"] > 0
    outstanding, went_ahead = 0, 0   # a cycle went ahead when decided with another outstanding
    for e, _ in events:
        went_ahead += e == "decide" and outstanding == 1
        outstanding += 1 if e == "decide" else -1
        assert 0 <= outstanding <= 2
    assert r.stats["backend_timing"]["ahead"] == went_ahead > len(seen) // 2


def test_a_draft_model_is_fed_on_the_device_by_default_on_a_gpu_only(tiny):
    """By default a draft model's cycles are fed on the device on a GPU and from the host on a
    software adapter (where they measured slower); set either way, they go as told."""
    opts = Options(max_tokens=12, stop_at_eos=False, k="fixed:3")
    for setting in (None, True, False):
        given = {} if setting is None else {"draft_ahead": setting}
        engine = Engine(backend_for(tiny.on("gpu"), tiny.close_path, **given), tiny.tokenizer)
        fed = (not engine.backend.dev.is_cpu) if setting is None else setting
        r = engine.generate(tiny.prompt, opts)
        assert (r.stats["backend_timing"]["ahead"] > 0) == fed, setting


def test_a_draft_fed_on_the_device_catches_up_after_champion_only_cycles(tiny, monkeypatch):
    """A draft model's cycles fed on the device skip the draft while the guard holds k = 0, and
    the first cycle that drafts again feeds every token since (the host knows how many: each
    champion-only cycle emits one); past ROWS_MAX of them a champion-only cycle feeds the draft
    anyway. Scripted decisions, with runs of k = 0 longer than a pass holds, give both runs the
    same k every cycle, so the same accepted counts say the device-fed draft proposed what the
    host-fed one did: its cache held the same rows."""
    from pyspec import schedule
    from pyspec.gpu.constants import ROWS_MAX

    script = [0] * (ROWS_MAX + 3) + [3, 0, 2, 0, 0, 3, 1, 3] + [0] * 5 + [2]
    reference = reference_decode(tiny.champion, tiny.prompt, 60, greedy_pick)
    results, ahead = {}, {}
    for on_device in (True, False):
        calls = []

        def next_k(self, cls=None):
            calls.append(script[len(calls) % len(script)])
            return calls[-1]

        monkeypatch.setattr(schedule.Schedule, "next_k", next_k)
        engine = Engine(backend_for(tiny.on("gpu"), tiny.close_path, draft_ahead=on_device),
                        tiny.tokenizer)
        r = engine.generate(tiny.prompt, Options(max_tokens=60, k="heuristic",
                                                 stop_at_eos=False))
        assert r.tokens == reference
        ahead[on_device] = r.stats["backend_timing"]["ahead"]
        results[on_device] = (r.stats["drafted"], r.stats["accepted"],
                              r.stats["schedule"]["k_histogram"])
    assert results[True] == results[False] and results[True][1] > 0
    # Host-fed, only a champion-only cycle after another goes ahead; device-fed, every one after
    # the first.
    assert ahead[True] == r.stats["champion_passes"] - 1 > ahead[False]


@dataclasses.dataclass
class Submitted:
    ahead: bool     # whether it went ahead of the cycle in flight
    k: int
    tree: bool
    writes: int     # host writes (Device.writes) since the submission before it


def watch(engine, monkeypatch) -> list[Submitted]:
    """The cycles the engine submits from now on, as they are submitted."""
    b, dev, seen, writes = engine.backend, engine.backend.dev, [], [engine.backend.dev.writes, 0]
    submit_cycle, submit = b.submit, dev.submit

    def submitting(commands):
        writes[1], writes[0] = dev.writes - writes[0], dev.writes
        submit(commands)

    def submitting_cycle(rec):
        ahead, k, tree = rec.ahead, rec.k, rec.tree is not None
        out = submit_cycle(rec)
        seen.append(Submitted(ahead, k, tree, writes[1]))
        return out

    monkeypatch.setattr(dev, "submit", submitting)
    b.submit = submitting_cycle
    return seen


@pytest.mark.parametrize("draft, more", [("ngram", {}), ("ngram", {"tree": "2,2,1"}),
                                         ("model", {}), ("model", {"tree": "2,2,1"}),
                                         ("model", {"tree": "3,1", "temperature": 0.9,
                                                    "seed": 5}),
                                         ("model", {"temperature": 0.9, "seed": 5,
                                                    "verify": "rejection"})])
def test_a_cycle_gone_ahead_writes_nothing_from_the_host(tiny, monkeypatch, draft, more):
    """However k changes from cycle to cycle, a cycle whose drafts are made on the device and
    that goes ahead writes nothing from the host (a write costs the page a staging allocation:
    gpu/ahead.py): its Params are a block of a table written at the request's first cycle,
    copied on the device. Scripted decisions change k every cycle (under --tree, a tree where
    k is odd, else a chain); the tokens are those of the same request read cycle by cycle. A
    draft model's first request builds the plans of its steps as they are first used (their
    uniforms written once), so that backend serves one request first."""
    from pyspec import schedule

    script, calls = [2, 3, 1, 0, 3, 1, 2, 0, 0, 2, 3, 3], []

    def next_k(self, cls=None):
        calls.append(script[len(calls) % len(script)])
        return calls[-1]

    monkeypatch.setattr(schedule.Schedule, "next_k", next_k)
    monkeypatch.setattr(schedule.Schedule, "tree_pays", lambda self, k, *a, **kw: k % 2 == 1)
    opts = Options(max_tokens=30, k="heuristic", stop_at_eos=False, **more)
    tokens = {}
    for pipelined in (True, False):
        engine = Engine(backend_for(tiny.on("gpu"), tiny.close_path if draft == "model" else draft,
                                    pipelined=pipelined, draft_ahead=True), tiny.tokenizer)
        if draft == "model":
            engine.generate(tiny.prompt, opts)
            calls.clear()
        seen = watch(engine, monkeypatch)
        tokens[pipelined] = engine.generate(tiny.prompt, opts).tokens
        if pipelined:
            ahead = [c for c in seen if c.ahead]
            assert len(ahead) >= len(seen) // 2 and len({c.k for c in ahead}) >= 3, seen
            assert all(c.writes == 0 for c in ahead), seen
            if "tree" in more:
                assert {c.tree for c in ahead} == {True, False}, seen
    assert tokens[True] == tokens[False]
