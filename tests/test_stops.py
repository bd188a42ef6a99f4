"""Stop strings (pyspec/text/stops.py) and the engine's use of them: the output ends right before the
first stop string to complete, wherever token and cycle boundaries fall; the stream never shows
a partial stop string; speculative runs stop where champion-only does; a resume from the chunks'
ids shows each character once.

Oracle: the champion-only greedy text (reference_decode), cut by hand at the stop string.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from conftest import greedy_pick, reference_decode
from pyspec.cpu.model import Model
from pyspec.engine import Engine, Resume
from pyspec.errors import OptionsError
from pyspec.load import backend as backend_for
from pyspec.options import Options
from pyspec.text.stops import StopStrings, held_suffix

N = 40


def feed_all(pieces, stops):
    """Feed pieces; return (shown text, index of the piece that completed a stop or None, and
    every intermediate shown text)."""
    s, shown, seen = StopStrings(stops), "", []
    for i, p in enumerate(pieces):
        out, hit = s.feed(p)
        shown += out
        seen.append(shown)
        if hit:
            return shown, i, seen
    return shown + s.flush(), None, seen


def test_the_cut_does_not_depend_on_how_the_text_is_split():
    gen = np.random.default_rng(0)
    text = "abcab the end. abXcd ..!! done"
    for stops, cut in [(("ab",), 0), (("abX",), 15), (("Xc", "abXcd"), 17), (("bX", "b"), 1),
                       (("!!",), 23), (("zz",), None), (("abXcd", "cd"), 15),
                       (("end. abXcd", "bXc"), 16)]:
        expected = text if cut is None else text[:cut]
        for _ in range(60):
            bounds = sorted(set(gen.integers(0, len(text) + 1, gen.integers(0, 12)).tolist()))
            pieces = [text[a:b] for a, b in zip([0] + bounds, bounds + [len(text)])]
            shown, at, seen = feed_all(pieces, stops)
            assert shown == expected, (stops, pieces)
            assert (at is None) == (cut is None)
            # never shown, then taken back: every intermediate text is a prefix of the answer
            assert all(expected.startswith(s) for s in seen), (stops, pieces)


def test_held_suffix():
    assert held_suffix("hello wor", ("world",)) == 3
    assert held_suffix("hello", ("lo!", "o!!")) == 2
    assert held_suffix("hello", ("xyz",)) == 0
    assert held_suffix("ab", ("ab",)) == 0      # a whole stop is not a proper prefix


def engine_for(tiny, draft, backend="cpu") -> Engine:
    spec = {"close": tiny.close_path}.get(draft, draft)
    return Engine(backend_for(tiny.on(backend), spec, load_draft=Model.load), tiny.tokenizer)


@pytest.fixture(scope="module")
def spanning(tiny):
    """The greedy reference's text, and stop strings that span token boundaries: (stop,
    character where it starts, tokens up to the one whose streamed text completes it)."""
    tokens = reference_decode(tiny.champion, tiny.prompt, N, greedy_pick)
    pieces = [tiny.tokenizer.decode([t]) for t in tokens]
    assert "".join(pieces) == tiny.tokenizer.decode(tokens)   # the tiny model's bytes are whole
    ends = np.cumsum([len(p) for p in pieces])
    text = "".join(pieces)
    cases = []
    for first in (14, 23, 29):     # start mid-token `first`, end mid-token first + 2
        start = int(ends[first - 1]) + len(pieces[first]) // 2
        end = int(ends[first + 1]) + max(1, len(pieces[first + 2]) // 2)
        stop = text[start:end]
        at = text.find(stop)     # the first occurrence decides
        # the token after which the streamed text first holds it (a byte that is not a whole
        # character shows, as U+FFFD, only when the next token's bytes decide it)
        detok, shown = tiny.tokenizer.stream_decoder(), ""
        for last, t in enumerate(tokens):
            shown += detok.feed(t)
            if stop in shown:
                break
        cases.append((stop, at, tokens[:last + 1]))
    return text, cases


@pytest.mark.parametrize("draft", ["none", "ngram", "close"])
def test_a_stop_string_across_tokens_ends_the_text_before_it(tiny, spanning, draft, backend):
    text, cases = spanning
    engine = engine_for(tiny, draft, backend)
    for stop, at, toks in cases:
        for k in ("fixed:1", "fixed:4"):
            report, chunks = {}, []

            async def run():
                opts = Options(max_tokens=N, k=k, stop_at_eos=False, stop=("zzz", stop))
                async for c in engine.stream(tiny.prompt, opts, report):
                    chunks.append(c)
                    assert text[:at].startswith("".join(c.text for c in chunks))

            asyncio.run(run())
            assert report["text"] == text[:at], (stop, draft, k)
            assert report["finish_reason"] == "stop"
            assert report["tokens"] == toks
            assert "".join(c.text for c in chunks) == text[:at]
            ids = [t for c in chunks for t in c.ids]    # a chunk only where text is shown
            assert ids == toks[:len(ids)]


def test_resume_from_the_chunks_with_text_held_back(tiny, spanning):
    """A stop string that never completes but whose beginnings keep appearing (the text's own
    characters): the text held back between chunks is recomputed from the ids on resume."""
    text, _ = spanning
    engine = engine_for(tiny, "ngram")
    common = sorted(set(text), key=lambda c: -text.count(c))[:4]
    stops = tuple(c + "\x00" for c in common)     # each of these characters starts one
    opts = Options(max_tokens=N, k="fixed:3", stop_at_eos=False, stop=stops)
    report, chunks = {}, []

    async def run(resume=None, into=None):
        async for c in engine.stream(tiny.prompt, opts, report if into is None else into,
                                     resume=resume):
            (chunks if into is None else into.setdefault("chunks", [])).append(c)

    asyncio.run(run())
    assert report["text"] == text and report["finish_reason"] == "length"
    held = 0
    for j in range(len(chunks) + 1):
        shown = "".join(c.text for c in chunks[:j])
        ids = [t for c in chunks[:j] for t in c.ids]
        held += shown != tiny.tokenizer.decode(ids)
        again: dict = {}
        asyncio.run(run(Resume(ids), again))
        for c in again.get("chunks", []):
            assert c.offset == len(shown), j
            shown += c.text
        assert shown == text and again["text"] == text, j
    assert held > 3, "the chunks must end with text held back, or this tests nothing"


def test_bad_stop_lists_are_refused(tiny):
    engine = engine_for(tiny, "none")
    for bad in (["a", "b", "c", "d", "e"], [""], "abc", [3]):
        with pytest.raises(OptionsError, match="stop"):
            engine.generate(tiny.prompt, Options(max_tokens=2, stop=bad))
