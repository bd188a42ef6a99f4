"""`--draft ngram+MODEL` (drafters/combo.py): n-gram lookup where the context repeats itself, the
draft model elsewhere, one of them per cycle. Exactness: greedy output and replay output (a
seed) equal champion-only's, on the numpy engine and on native WebGPU, where the members'
cycles go ahead on the device and a switch waits for the cycle in flight. Both members must
actually draft in each run, or the test would not test the switching.
"""

from __future__ import annotations

import pytest

from conftest import requires_gpu
from pyspec import receipts
from pyspec.drafters import Combo, DraftSpec, DraftSpecError, parse_draft
from pyspec.drafters import combo as combo_mod
from pyspec.drafters.ngram import NgramDrafter
from pyspec.engine import Engine
from pyspec.load import backend as backend_for
from pyspec.options import Options


def test_parse_a_combination():
    assert parse_draft("ngram+model:d.gguf") == DraftSpec("combo", path="d.gguf")
    assert parse_draft("ngram+d.gguf").model == DraftSpec("model", path="d.gguf")
    assert parse_draft("ngram+model") == DraftSpec("combo")           # the page's draft model
    assert str(parse_draft("ngram+model:d.gguf")) == "ngram+model:d.gguf"
    assert parse_draft("ngram+model").needs_weights
    for bad in ("ngram+", "ngram+ngram", "ngram+none", "ngram+self:2", "ngram+bogus"):
        with pytest.raises(DraftSpecError):
            parse_draft(bad, n_layers=4)


def prompt_of(tiny) -> list[int]:
    """A prompt whose end repeats an earlier span (n-gram drafts first); the tiny random
    champion's own text then repeats nothing (the draft model's turn)."""
    return tiny.tokenizer.encode("the cat sat on the mat. a dog ran far. the cat sat on the mat."
                                 " a dog ran far. the cat sat on the")


def outputs(tiny, champion, draft, opts, paths=None):
    engine = Engine(backend_for(champion, draft, **(paths or {})), tiny.tokenizer)
    r = engine.generate(prompt_of(tiny), opts)
    return r, engine


def check_against_champion_only(tiny, champion, paths=None):
    cases = {"greedy": Options(max_tokens=40, stop_at_eos=False, k="fixed:3"),
             "replay": Options(max_tokens=40, stop_at_eos=False, k="fixed:3", temperature=0.9,
                               seed=11, verify="replay")}
    ahead = {}   # per case, the cycles that went ahead (a GPU backend's timing)
    for name, opts in cases.items():
        alone, _ = outputs(tiny, champion, "none", opts)
        both, engine = outputs(tiny, champion, f"ngram+{tiny.close_path}", opts, paths)
        assert both.tokens == alone.tokens, name
        members = both.stats["schedule"]["by_drafter"]
        assert set(members) == {"ngram", "model"}, members   # by kind: no name, no path
        for member, stats in members.items():   # each member drafted some cycles
            assert sum(n for k, n in stats["k_histogram"].items() if k > 0) > 0, (name, member)
        assert both.stats["drafter"] == engine.backend.combo.name
        assert both.stats["drafted"] > 0 and both.stats["draft_calls"] > 0
        r = both.receipt
        assert r["draft"]["kind"] == "combo" and r["draft"]["sha256"]
        receipts.check(r)
        ahead[name] = engine.backend.timing.get("ahead", 0)
    return ahead


@pytest.mark.parametrize("backend", ["cpu", "fastcpu"])
def test_a_combination_gives_the_champions_output_on_numpy(tiny, backend):
    check_against_champion_only(tiny, tiny.on(backend))


@requires_gpu
def test_a_combination_gives_the_champions_output_on_webgpu(tiny):
    """Fed on the device, both members' cycles go ahead (n-gram looked up on the device, the
    draft fed by the verdict before); fed from the host (the default on a software adapter),
    the draft's cycles are read one at a time. Both give champion-only's tokens; the two ways
    are two paths: more cycles go ahead fed on the device (the same tokens, the same choices)."""
    ahead = {}
    for fed_on_device in (True, False):
        ahead[fed_on_device] = check_against_champion_only(tiny, tiny.on("gpu"),
                                                           dict(draft_ahead=fed_on_device))
    for case in ahead[True]:
        assert ahead[True][case] > ahead[False][case], (case, ahead)


def test_the_choice_follows_the_match():
    class Model:
        name, weight_bytes, kv_bytes, calls = "model:m.gguf", 0, 0, 0
    c = Combo(NgramDrafter(), Model())
    assert combo_mod.MATCH == 3
    assert c.choose([5, 6, 7, 8, 5, 6, 7]) is c.ngram   # 5 6 7 seen before: 3 tokens
    assert c.choose([5, 6, 7, 8, 9, 6, 7]) is c.model   # 6 7 only
    assert c.name == "ngram+model:m.gguf"
