"""client.js as an embedding app meets it, on the tiny model, decoders made in one page: weights
given by URL alone are cached by their sha256; a decoder that fails to start, or is terminated,
leaves no worker and refuses later calls; unknown options are refused by name; cancel() and an
AbortSignal reach a request that waits behind another; two requests stopped by one worker
death both resume on one new worker; a reload that fails leaves the decoder's champion as it
was."""

from __future__ import annotations

import json

import pytest

from .pageutil import Context

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def page(browser, site_url):
    c = Context(browser, site_url)
    # The example's own decoder fails at once (no such model): the tests make their own.
    p = c.page("embed-example.html?model=none-such")
    p.wait_for_function("() => window.embed && (embed.decoder || embed.error)")
    yield p
    c.ctx.close()
    assert not c.offsite, f"requests to other origins: {c.offsite}"


# Helpers every script below starts with: the client, a prompt, a generator drained to its
# text and result, and the code of what a call throws.
PRELUDE = """
const { SpecDecoder } = await import("./client.js");
const messages = [{ role: "user", content: "the cat sat on the mat. the cat" }];
const drain = async (gen) => {
  let text = "", step;
  while (!(step = await gen.next()).done) text += step.value.text;
  return { text, finish_reason: step.value.finish_reason };
};
const codeOf = async (f) => { try { await f(); return null; } catch (e) { return e.code; } };
"""

BY_URL = """async ([url, sha256]) => {%s
  const dir = await (await navigator.storage.getDirectory())
    .getDirectoryHandle("pyspec-weights", { create: true });
  await dir.removeEntry(`${sha256}.gguf`).catch(() => {});    // a first visit
  const loads = [];
  for (let i = 0; i < 2; i++) {
    const d = await SpecDecoder.create({ champion: { url, sha256 } });
    const { text } = await drain(d.generate(messages, { max_tokens: 8 }));
    loads.push({ weights: d.info.weights, notices: d.notices, text });
    d.terminate();
  }
  return loads;
}""" % PRELUDE


def test_weights_given_by_url_alone_are_cached_by_their_sha256(page, site_root):
    """{url, sha256} without a size (as the npm README writes it): the second load reads OPFS
    and downloads nothing, and nothing is reported damaged."""
    manifest = json.loads((site_root / "manifest.json").read_text())
    tiny = next(a for a in manifest["artifacts"] if a.get("model") == "tiny")
    first, second = page.evaluate(BY_URL, [tiny["url"], tiny["sha256"]])
    assert first["weights"] == {"downloaded": tiny["size"], "cached": False, "corrupt": 0}
    assert second["weights"] == {"downloaded": 0, "cached": True, "corrupt": 0}
    assert first["notices"] == second["notices"] == []
    assert first["text"] and second["text"] == first["text"]


LIFECYCLE = """async () => {%s
  const Real = window.Worker;
  let live = 0;      // workers made and not terminated
  window.Worker = class extends Real {
    constructor(...args) { super(...args); live += 1; }
    terminate() { if (!this.gone) { this.gone = true; live -= 1; } super.terminate(); }
  };
  try {
    const out = {};
    out.unknownModel = await codeOf(() => SpecDecoder.create({ champion: "none-such" }));
    out.liveAfterFailure = live;
    out.unknownOption = await codeOf(() => SpecDecoder.create({ champion: "tiny",
                                                                 workerURL: "./worker.js" }));
    out.liveAfterRefusal = live;
    const d = await SpecDecoder.create({ champion: "tiny" });
    out.liveReady = live;
    out.misspelt = await codeOf(() => drain(d.generate(messages, { max_tokens: 4,
                                                                    temprature: 1 })));
    out.notObject = await codeOf(() => drain(d.generate(messages, "fixed:3")));
    out.uncloneable = await codeOf(() => drain(d.generate(messages, { max_tokens: 4,
                                                                       seed: () => 1 })));
    out.stillWorks = (await drain(d.generate(messages, { max_tokens: 4 }))).finish_reason;
    d.terminate();
    out.liveAfterTerminate = live;
    out.generateAfter = await codeOf(() => drain(d.generate(messages, { max_tokens: 4 })));
    out.statsAfter = await codeOf(() => d.stats());
    out.liveEnd = live;
    return out;
  } finally {
    window.Worker = Real;
  }
}""" % PRELUDE


def test_a_decoder_that_fails_or_is_terminated_leaves_no_worker(page):
    """A failed create() terminates the worker it started; an unknown create() option or a
    misspelt generate() option is refused (bad_config) by name; a config that cannot be sent
    to a worker is bad_request and the decoder goes on; after terminate() every call throws
    "terminated" and no worker is started again."""
    out = page.evaluate(LIFECYCLE)
    assert out == {"unknownModel": "unknown_model", "liveAfterFailure": 0,
                   "unknownOption": "bad_config", "liveAfterRefusal": 0, "liveReady": 1,
                   "misspelt": "bad_config", "notObject": "bad_config",
                   "uncloneable": "bad_request", "stillWorks": "length",
                   "liveAfterTerminate": 0, "generateAfter": "terminated",
                   "statsAfter": "terminated", "liveEnd": 0}


CONCURRENT = """async () => {%s
  const d = await SpecDecoder.create({ champion: "tiny", drills: true });
  const out = {};
  // cancel() stops the running request and the one queued behind it.
  const running = drain(d.generate(messages, { max_tokens: 400, draft: "none" }));
  const queued = drain(d.generate(messages, { max_tokens: 400, draft: "none" }));
  out.cancelled = await d.cancel();
  out.cancel = await Promise.all([running, queued]);
  // An AbortSignal stops its own request, waiting behind another, and no other.
  const undisturbed = await drain(d.generate(messages, { max_tokens: 40, k: "fixed:3" }));
  const ac = new AbortController();
  const first = drain(d.generate(messages, { max_tokens: 40, k: "fixed:3" }));
  const stream = await d.chat.completions.create({ messages, stream: true, max_tokens: 40,
                                                   signal: ac.signal });
  ac.abort();
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  out.abort = { first: await first, undisturbed, chunks: chunks.length,
                finish: chunks.at(-1).choices[0].finish_reason,
                engine: chunks.at(-1).pyspec.finish_reason };
  // A reload that fails keeps the champion, for this worker and the next one.
  out.reload = await codeOf(() => d.reload({ champion: "none-such" }));
  // Two requests stopped by one death: both resume on one new worker.
  const a = drain(d.generate(messages, { max_tokens: 40, k: "fixed:3",
                                         drill: "worker-terminate@2" }));
  const b = drain(d.generate(messages, { max_tokens: 40, k: "fixed:3" }));
  out.death = { results: await Promise.all([a, b]), restarts: d.restarts,
                champion: d.info.champion };
  d.terminate();
  return out;
}""" % PRELUDE


def test_cancel_abort_and_a_death_reach_requests_that_wait(page):
    out = page.evaluate(CONCURRENT)
    assert out["cancelled"] is True
    running, queued = out["cancel"]
    assert running["finish_reason"] == queued["finish_reason"] == "cancelled"
    assert queued["text"] == ""                       # it never ran
    abort = out["abort"]
    assert abort["first"] == abort["undisturbed"]     # the other request ran to its end
    assert abort["first"]["finish_reason"] == "length"
    assert (abort["chunks"], abort["finish"], abort["engine"]) == (1, "abort", "cancelled")
    assert out["reload"] == "unknown_model"
    death = out["death"]
    assert death["results"] == [abort["undisturbed"], abort["undisturbed"]]
    assert death["restarts"] == 2 and death["champion"] == "tiny"
