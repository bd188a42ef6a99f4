"""Each streamed token's kind and character offset (engine.Chunk.kinds / starts), what the demo
page styles: the kinds agree with the stats (accepted drafts, one champion token per pass) and the
offsets with the text, on the tiny models with drafts that are often accepted and often not."""

from __future__ import annotations

import asyncio

import pytest

from pyspec.cpu.model import Model
from pyspec.chunks import TOKEN_KINDS
from pyspec.engine import Engine
from pyspec.load import backend as backend_for
from pyspec.options import Options


def stream(tiny, draft: str, opts: Options):
    spec = {"close": tiny.close_path, "far": tiny.far_path}.get(draft, draft)
    engine = Engine(backend_for(tiny.champion, spec, load_draft=Model.load), tiny.tokenizer)
    report: dict = {}

    async def go():
        return [c async for c in engine.stream(tiny.prompt, opts, report)]

    return asyncio.run(go()), report


@pytest.mark.parametrize("draft", ["none", "ngram", "close", "far"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_kinds_add_up_to_the_stats_and_offsets_to_the_text(tiny, draft, temperature):
    chunks, r = stream(tiny, draft, Options(max_tokens=40, k="fixed:3", temperature=temperature,
                                            seed=5, stop_at_eos=False))
    kinds = [k for c in chunks for k in c.kinds]
    starts = [s for c in chunks for s in c.starts]
    ids = [t for c in chunks for t in c.ids]
    stats = r["stats"]
    assert ids == r["tokens"] and len(kinds) == len(starts) == len(ids)
    assert set(kinds) <= set(TOKEN_KINDS) - {"forced"}
    assert kinds.count("accepted") == stats["accepted"]
    # Every pass emits exactly one champion token (max_tokens never cuts a block).
    assert sum(k in ("champion", "corrected", "bonus") for k in kinds) == stats["champion_passes"]
    if draft == "none":   # a drafter with no proposal (ngram without a match) also runs k = 0
        assert set(kinds) == {"champion"}
    if draft == "close":
        assert kinds.count("accepted") > 0 and kinds.count("corrected") + kinds.count("bonus") > 0
    # Offsets: where each token's text begins in the output, by an independent decode.
    detok, expected, at = tiny.tokenizer.stream_decoder(), [], 0
    for t in ids:
        expected.append(at)
        at += len(detok.feed(t))
    assert starts == expected
    assert "".join(c.text for c in chunks) == r["text"]


def test_the_worker_counts_offsets_in_utf16_units_as_javascript_does():
    """web.py's chunks carry UTF-16 offsets: an emoji is one code point but two units, and
    client.js compares offsets with JavaScript string lengths to never show text twice."""
    from pyspec.apps.wire import Utf16

    u, text = Utf16(), ""
    for piece in ["ab", "🐙c", "", "d😀😀", "e"]:
        u.add(piece)
        text += piece
        for i in range(len(text) + 1):
            assert u.at(i) == len(text[:i].encode("utf-16-le")) // 2
    assert u.at(len(text)) == len(text) + 3
