"""Resume, not replay (DESIGN §8): a request goes on from the committed ids of an interrupted run.

Greedy and replay key every random number by position, so a run resumed at any token count ends
with exactly the text and tokens of the undisturbed run (the oracle: that run, on the same
backend). Rejection mode resumes to a valid continuation of the resumed ids, and the receipt says
it resumed. The chunks' ids are all a client keeps, so a resume from the ids of the chunks it
received must continue its text at the next offset, without a repeat or a gap.
"""

from __future__ import annotations

import asyncio

import pytest

from pyspec.engine import Engine, Resume
from pyspec.errors import OptionsError, PromptTooLongError
from pyspec.load import backend as backend_for
from pyspec.options import Options

MODES = {"greedy": {}, "replay": {"temperature": 0.8, "seed": 77}}
N = 40


def engine_for(tiny, backend: str, draft: str = "ngram") -> Engine:
    return Engine(backend_for(tiny.on(backend), draft), tiny.tokenizer)


def options(mode: str, **kw) -> Options:
    return Options(max_tokens=N, k="fixed:3", stop_at_eos=False, **{**MODES.get(mode, {}), **kw})


def stream(engine, prompt, opts, resume=None):
    report, chunks = {}, []

    async def run():
        async for c in engine.stream(prompt, opts, report, resume=resume):
            chunks.append(c)

    asyncio.run(run())
    return report, chunks


@pytest.mark.parametrize("mode", MODES)
def test_resumed_at_any_token_count_gives_the_undisturbed_text(tiny, backend, mode):
    engine = engine_for(tiny, backend)
    full = engine.generate(tiny.prompt, options(mode))
    assert len(full.tokens) == N
    for cut in (0, 1, 2, 7, 13, 21, N - 1, N):
        # a new engine, as on a new worker after a fault: nothing of the interrupted run's
        # cache or drafter state, the prompt and the resumed ids prefilled afresh
        fresh = engine_for(tiny, backend)
        r = fresh.generate(tiny.prompt, options(mode), Resume(full.tokens[:cut]))
        assert r.stats["reused_tokens"] == 0
        assert r.tokens == full.tokens, (mode, cut)
        assert r.text == full.text, (mode, cut)
        assert r.stats["resumed_tokens"] == r.receipt["stats"]["resumed_tokens"] == cut
        assert r.stats["generated_tokens"] == N     # the resumed ids count toward max_tokens
        assert r.receipt["faults"] == []            # a resume without a fault records none


@pytest.mark.parametrize("mode", MODES)
def test_a_client_resuming_from_its_chunks_shows_each_character_once(tiny, backend, mode):
    """What client.js does: keep the chunks received, resume from their ids, append the new
    chunks by offset. Every cut between chunks (a cut mid-character included when the tiny
    model's bytes make one) gives contiguous offsets and exactly the undisturbed text."""
    engine = engine_for(tiny, backend)
    full, chunks = stream(engine, tiny.prompt, options(mode))
    assert [t for c in chunks for t in c.ids] == full["tokens"]   # the ids cover every token
    assert all(c.n_tokens == len(c.ids) for c in chunks)
    for j in range(len(chunks) + 1):
        got = chunks[:j]
        shown = "".join(c.text for c in got)
        ids = [t for c in got for t in c.ids]
        r, more = stream(engine, tiny.prompt, options(mode), Resume(ids))
        assert r["text"] == full["text"] and r["tokens"] == full["tokens"], (mode, j)
        for c in more:
            assert c.offset == len(shown), (mode, j)
            shown += c.text
        assert shown == full["text"], (mode, j)


def test_rejection_resumes_to_a_valid_continuation_and_the_receipt_says_so(tiny, backend):
    engine = engine_for(tiny, backend, "ngram")
    opts = options("rejection", temperature=0.9, seed=5, verify="rejection")
    full = engine.generate(tiny.prompt, opts)
    cut = 11
    fault = {"kind": "worker_died", "cycle": 4, "restart_s": 0.25}
    r = engine.generate(tiny.prompt, opts, Resume(full.tokens[:cut], fault))
    assert r.tokens[:cut] == full.tokens[:cut] and len(r.tokens) == N
    assert all(0 <= t < tiny.tokenizer.vocab_size for t in r.tokens)
    assert r.text == tiny.tokenizer.decode(r.tokens)
    assert r.receipt["verify"] == "rejection"
    assert r.receipt["stats"]["resumed_tokens"] == cut
    [recorded] = r.receipt["faults"]
    assert {k: recorded[k] for k in ("kind", "cycle", "at_token")} == {
        "kind": "worker_died", "cycle": 4, "at_token": cut}
    assert recorded["recovery_s"] >= 0.25 and recorded["adapter"] == engine.adapter_class
    # Exact where it can be: champion-only, each token is sampled from its own position's key,
    # so a resumed request continues as the uninterrupted one did, token for token.
    alone = engine_for(tiny, backend, "none")
    whole = alone.generate(tiny.prompt, opts)
    for at in (1, cut, 25):
        assert alone.generate(tiny.prompt, opts, Resume(whole.tokens[:at])).tokens == \
            whole.tokens, at


def test_a_resume_past_max_tokens_or_an_end_token_stops_at_once(tiny):
    engine = engine_for(tiny, "cpu")
    full = engine.generate(tiny.prompt, options("greedy"))
    r = engine.generate(tiny.prompt, options("greedy"), Resume(full.tokens))
    assert r.tokens == full.tokens and r.finish_reason == "length"
    assert r.stats["champion_passes"] == 0


def test_bad_resume_ids_are_refused_with_what_to_send(tiny):
    engine = engine_for(tiny, "cpu")
    vocab = tiny.tokenizer.vocab_size
    for ids in ([vocab], [-1], ["a"], [True], [1.5], "12"):
        with pytest.raises(OptionsError, match="resume ids"):
            engine.generate(tiny.prompt, options("greedy"), Resume(ids))
    with pytest.raises(PromptTooLongError):
        engine.generate(tiny.prompt, options("greedy"), Resume([5] * engine.kv.max_ctx))
