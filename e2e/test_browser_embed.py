"""The embedding example (web/embed-example.html) streams through client.js only, and cancel()
stops a generation within one cycle."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser


def test_embed_streams_and_cancel_stops_within_one_cycle(context):
    page = context.page("embed-example.html?model=tiny&max_tokens=200&k=fixed:3")
    page.wait_for_function("() => window.embed && (embed.decoder || embed.error)")
    assert page.evaluate("() => embed.error && `${embed.error.code}: ${embed.error.message}`") is None

    # A full run first: offsets are contiguous and the page shows exactly the streamed text.
    page.fill("#prompt", "the cat sat")
    page.click("#go")
    page.wait_for_function("() => embed.result || embed.error")
    chunks = page.evaluate("() => embed.chunks")
    offset = 0
    for c in chunks:
        assert c["offset"] == offset
        offset += len(c["text"])
    assert page.text_content("#out") == "".join(c["text"] for c in chunks)
    full = page.evaluate("() => embed.result")
    assert full["finish_reason"] in ("length", "stop")
    assert "".join(c["text"] for c in chunks) == full["text"]

    # Now cancel after a few chunks.
    page.click("#go")
    page.wait_for_function("() => embed.chunks.length >= 3")
    page.click("#cancel")
    page.wait_for_function("() => embed.result || embed.error")
    state = page.evaluate("() => ({result: embed.result, cancelled: embed.cancelled, "
                          "ackAt: embed.ackAt, n: embed.chunks.length, "
                          "text: document.getElementById('out').textContent, "
                          "tokens: embed.chunks.reduce((s, c) => s + c.tokens, 0)})")
    assert state["cancelled"] is True
    assert state["result"]["finish_reason"] == "cancelled"
    assert state["n"] - state["ackAt"] <= 1, "more than one cycle ran after cancel()"
    assert state["tokens"] < sum(c["tokens"] for c in chunks)
    assert full["text"].startswith(state["text"])
    assert page.text_content("#status") == "cancelled"


def test_a_dead_worker_is_restarted_and_nothing_shows_twice(context):
    """Kill the worker mid-generation (an uncaught error in it): client.js starts a new worker,
    replays the request from the start, and trims by offset what was already shown, so the page
    ends with exactly the text of an undisturbed run."""
    page = context.page("embed-example.html?model=tiny&max_tokens=120&k=fixed:3")
    page.wait_for_function("() => window.embed && (embed.decoder || embed.error)")
    page.fill("#prompt", "the dog ate")
    page.click("#go")
    page.wait_for_function("() => embed.result || embed.error")
    undisturbed = page.evaluate("() => embed.result.text")

    page.click("#go")
    page.wait_for_function("() => embed.chunks.length >= 3")
    page.workers[-1].evaluate("() => { setTimeout(() => { throw new Error('boom'); }); }")
    page.wait_for_function("() => embed.result || embed.error")
    assert page.evaluate("() => embed.error && embed.error.message") is None
    assert page.evaluate("() => embed.decoder.restarts") == 1
    assert page.text_content("#out") == undisturbed
    assert page.evaluate("() => embed.result.text") == undisturbed
