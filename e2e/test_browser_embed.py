"""The embedding example (web/embed-example.html) streams through client.js only, cancel()
stops a generation within one cycle, and a worker that dies mid-stream is replaced and the
request resumes from its committed ids (DESIGN §8)."""

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

    # Now cancel after a few chunks: Cancel is clicked in the page as the third chunk arrives
    # (a click from here waits for the page's turn, and on a loaded machine the worker could
    # finish the reply first, which leaves nothing to cancel).
    assert len(chunks) >= 5, "the full reply must outlast the third chunk"
    page.evaluate("""() => {
      let list = [];
      Object.defineProperty(embed, "chunks", { configurable: true, get: () => list, set: (v) => {
        list = v;
        const push = v.push.bind(v);
        v.push = (...items) => {
          const n = push(...items);
          if (n === 3) document.getElementById("cancel").click();
          return n;
        };
      } });
    }""")
    page.click("#go")
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


def _contiguous(chunks) -> str:
    offset = 0
    for c in chunks:
        assert c["offset"] == offset, (c, offset)
        offset += len(c["text"])
    return "".join(c["text"] for c in chunks)


def _run_once(page, prompt: str, drill: str | None = None) -> dict:
    page.evaluate("(drill) => { embed.drill = drill; }", drill)
    page.fill("#prompt", prompt)
    page.click("#go")
    page.wait_for_function("() => embed.result || embed.error")
    assert page.evaluate("() => embed.error && `${embed.error.code}: ${embed.error.message}`") is None
    return page.evaluate("() => ({result: embed.result, chunks: embed.chunks, "
                         "restarts: embed.decoder.restarts, notices: embed.decoder.notices})")


def test_a_terminated_worker_is_found_and_the_request_resumes(context):
    """worker.terminate() mid-stream fires nothing; the client notices (its Web Lock is handed
    over; else the stall timeout), starts a new worker and resumes from the committed ids: the
    page ends with exactly the undisturbed text, the chunk offsets are contiguous (nothing shown
    twice, nothing skipped), a notice is visible, and the receipt records the fault."""
    page = context.page("embed-example.html?model=tiny&max_tokens=120&k=fixed:3&drills=1")
    page.wait_for_function("() => window.embed && (embed.decoder || embed.error)")
    undisturbed = _run_once(page, "the dog ate")
    assert not undisturbed["notices"] and page.is_hidden("#notice")
    assert _contiguous(undisturbed["chunks"]) == undisturbed["result"]["text"]

    out = _run_once(page, "the dog ate", "worker-terminate@3")
    text = undisturbed["result"]["text"]
    assert _contiguous(out["chunks"]) == text == page.text_content("#out")
    assert out["result"]["text"] == text and out["result"]["tokens"] == undisturbed["result"]["tokens"]
    assert out["restarts"] == 1
    assert page.is_visible("#notice") and "worker_died" in page.text_content("#notice")
    receipt = out["result"]["receipt"]
    [fault] = receipt["faults"]
    assert fault["kind"] == "worker_died" and fault["cycle"] >= 3
    # Resumed, not replayed: the new worker generated only what was not yet committed.
    resumed = receipt["stats"]["resumed_tokens"]
    assert 0 < resumed == fault["at_token"] == out["notices"][0]["at_token"] < len(
        out["result"]["tokens"])
    assert out["result"]["stats"]["champion_passes"] < undisturbed["result"]["stats"]["champion_passes"]
    print(f"worker-terminate@3: recovery {fault['recovery_s']:.2f} s after {resumed} tokens")


def test_a_worker_that_dies_of_an_error_is_restarted_and_resumes(context):
    """An uncaught error in the worker (onerror): the same resume, nothing shown twice."""
    page = context.page("embed-example.html?model=tiny&max_tokens=120&k=fixed:3")
    page.wait_for_function("() => window.embed && (embed.decoder || embed.error)")
    undisturbed = _run_once(page, "the dog ate")["result"]["text"]

    page.click("#go")
    page.wait_for_function("() => embed.chunks.length >= 3")
    # The decoder's worker (worker.js), not the one that makes the start-up caches beside it.
    [decoder_worker] = [w for w in page.workers if w.url.endswith("/worker.js")]
    decoder_worker.evaluate("() => { setTimeout(() => { throw new Error('boom'); }); }")
    page.wait_for_function("() => embed.result || embed.error")
    assert page.evaluate("() => embed.error && embed.error.message") is None
    assert page.evaluate("() => embed.decoder.restarts") == 1
    chunks = page.evaluate("() => embed.chunks")
    assert _contiguous(chunks) == undisturbed == page.text_content("#out")
    result = page.evaluate("() => embed.result")
    assert result["text"] == undisturbed and result["receipt"]["stats"]["resumed_tokens"] > 0
    assert page.is_visible("#notice")


_STALL_DRILL = """async () => {
  const { SpecDecoder } = await import("./client.js");
  const d = await SpecDecoder.create({ champion: "tiny", drills: true, stallTimeoutMs: 5000 });
  const messages = [{ role: "user", content: "the dog ate" }];
  const config = { max_tokens: 60, k: "fixed:3" };
  const run = async (drill) => {
    let text = "";
    for await (const c of d.generate(messages, { ...config, drill })) text += c.text;
    return { text, result: d.lastResult };
  };
  const undisturbed = await run(null);
  const t0 = performance.now();
  const drilled = await run("worker-terminate@2");
  const out = { undisturbed: undisturbed.text, text: drilled.text, notices: d.notices,
                fault: drilled.result.receipt.faults[0], ms: performance.now() - t0 };
  d.terminate();
  return out;
}"""


def test_without_web_locks_the_stall_timeout_finds_a_dead_worker(browser, site_url):
    """The stated bound: where navigator.locks is missing, a terminated worker is found by the
    stall timeout (5 s here) and the request resumes to the undisturbed text."""
    from .pageutil import Context

    c = Context(browser, site_url)
    no_locks = "Object.defineProperty(Navigator.prototype, 'locks', { get: () => undefined });\n"
    c.ctx.add_init_script(no_locks)       # the page

    def worker_without_locks(route):
        response = route.fetch()   # keeps its headers: COEP must hold for the worker too
        route.fulfill(response=response, body=no_locks.replace("Navigator", "WorkerNavigator")
                      + response.text())

    c.ctx.route("**/worker.js", worker_without_locks)
    try:
        page = c.page("embed-example.html?model=none-such")   # its own decoder stops at once
        out = page.evaluate(_STALL_DRILL)
    finally:
        c.ctx.close()
    assert out["text"] == out["undisturbed"]
    assert out["fault"]["kind"] == "worker_died" and out["fault"]["restart_s"] >= 5
    assert "sent nothing for 5 s" in out["notices"][0]["message"]
