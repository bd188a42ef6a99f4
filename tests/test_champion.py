"""The real champion (SmolLM2-135M-Instruct Q4_1) on the CPU: greedy speculative output equals
champion-only output byte for byte, on 8 prompts of the public workload (one per stratum for
8 strata), with the n-gram and the self:L drafters."""

from __future__ import annotations

import pytest
from test_receipts import workload

from pyspec.engine import Engine
from pyspec.load import backend, load_champion
from pyspec.options import Options

pytestmark = pytest.mark.champion

PROMPT_IDS = ["chat-1", "conflict-1", "memory-2", "summary-1", "rewrite-1", "json-1",
              "repetitive-1", "multilingual-1"]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def champion():
    return load_champion(None)


@pytest.fixture(scope="module")
def prompts(champion):
    _, tok = champion
    items = {it["id"]: it for it in workload()}
    return [(pid, tok.encode_chat(items[pid]["messages"]))
            for pid in PROMPT_IDS]


@pytest.fixture(scope="module")
def baseline(champion, prompts):
    model, tok = champion
    engine = Engine(backend(model, "none"), tok)
    return {pid: engine.generate(ids, Options(max_tokens=MAX_TOKENS)) for pid, ids in prompts}


@pytest.mark.parametrize("draft,k", [("ngram", "heuristic"), ("self:20", "fixed:3")])
def test_greedy_speculative_equals_champion_only(champion, prompts, baseline, draft, k):
    model, tok = champion
    engine = Engine(backend(model, draft), tok)
    drafted = 0
    for pid, ids in prompts:
        r = engine.generate(ids, Options(max_tokens=MAX_TOKENS, k=k))
        base = baseline[pid]
        assert r.tokens == base.tokens, f"{pid}: token ids differ with draft {draft}"
        assert r.text.encode() == base.text.encode(), f"{pid}: text differs with draft {draft}"
        drafted += r.stats["drafted"]
    assert drafted > 0, f"draft {draft} never proposed: the comparison would be vacuous"
