"""client.js as an embedding app meets it, on the tiny model, decoders made in one page: weights
given by URL alone are cached by their sha256 (in either case); a decoder that fails to start, or
is terminated (even from onNotice during a restart), leaves no worker and refuses later calls;
unknown options and malformed sha256s are refused by name; cancel() and an AbortSignal reach a
request that waits behind another or for a new worker; two requests stopped by one worker death
both resume on one new worker, however late one of them is pulled; a reload that fails leaves
the decoder's champion as it was."""

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
  for (const hash of [sha256, sha256.toUpperCase()]) {    // either case names one cache file
    const d = await SpecDecoder.create({ champion: { url, sha256: hash } });
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


CACHE = """async ([url, sha256]) => {%s
  const d = await SpecDecoder.create({ champion: { url, sha256: sha256.toUpperCase() } });
  const out = { listed: (await SpecDecoder.cachedModels()).find((m) => m.sha256 === sha256) };
  out.keep = await SpecDecoder.clearCache({ keep: [sha256] });
  out.clear = await SpecDecoder.clearCache();
  out.after = (await SpecDecoder.cachedModels()).some((m) => m.sha256 === sha256);
  out.stillServes = (await drain(d.generate(messages, { max_tokens: 4 }))).finish_reason;
  out.badKeep = await codeOf(() => SpecDecoder.clearCache({ keep: ["tiny"] }));
  d.terminate();
  return out;
}""" % PRELUDE


def test_cached_weights_are_listed_and_cleared(page, site_root):
    """SpecDecoder.cachedModels() lists the weights kept in OPFS by sha256 with their size;
    clearCache({keep}) keeps those named and clearCache() removes the rest; a decoder that
    loaded them goes on serving (its weights are in memory). A keep that is not a list of
    sha256s is bad_config."""
    manifest = json.loads((site_root / "manifest.json").read_text())
    tiny = next(a for a in manifest["artifacts"] if a.get("model") == "tiny")
    sha = tiny["sha256"]
    out = page.evaluate(CACHE, [tiny["url"], sha])
    assert out["listed"] == {"sha256": sha, "bytes": tiny["size"]}, out
    assert sha in out["keep"]["kept"] and sha not in out["keep"]["removed"], out
    assert sha in out["clear"]["removed"] and not out["clear"]["busy"], out
    assert out["after"] is False and out["stillServes"] == "length"
    assert out["badKeep"] == "bad_config"


WRONG_SHA = """async ([url, sha256]) => {%s
  try {
    (await SpecDecoder.create({ champion: { url, sha256 } })).terminate();
    return null;
  } catch (e) {
    return { code: e.code, message: e.message };
  }
}""" % PRELUDE


def test_a_wrong_sha256_names_both_digests(page, site_root):
    """Weights whose bytes do not hash to the sha256 given (a mistyped hash, or a server sending
    another file): corrupt_download, the message giving the bytes' own sha256 beside the one
    given, so that a typo shows as one."""
    manifest = json.loads((site_root / "manifest.json").read_text())
    tiny = next(a for a in manifest["artifacts"] if a.get("model") == "tiny")
    out = page.evaluate(WRONG_SHA, [tiny["url"], "0" * 64])
    assert out is not None and out["code"] == "corrupt_download", out
    assert f"its bytes hash to {tiny['sha256']}" in out["message"], out
    assert f"the sha256 given is {'0' * 64}" in out["message"], out


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
    out.emptySha = await codeOf(() => SpecDecoder.create({
      champion: { url: "models/tiny.gguf", sha256: "" } }));
    out.missingWorker = await codeOf(() => SpecDecoder.create({ champion: "tiny",
                                                                 workerUrl: "./nope/worker.js" }));
    out.badWorkerUrl = await codeOf(() => SpecDecoder.create({ workerUrl: "http://[bad" }));
    out.badCallback = await codeOf(() => SpecDecoder.create({ champion: "tiny", onProgress: 5 }));
    // An AbortSignal stops a load under way (at its first progress report), or one not begun.
    const ac = new AbortController();
    out.aborted = await codeOf(() => SpecDecoder.create({ champion: "tiny", signal: ac.signal,
                                                          onProgress: () => ac.abort() }));
    out.abortedBefore = await codeOf(() => SpecDecoder.create({ champion: "tiny",
                                                                signal: AbortSignal.abort() }));
    out.badSignal = await codeOf(() => SpecDecoder.create({ champion: "tiny", signal: 5 }));
    // Checked before anything loads, not after the weights have downloaded.
    out.badBackend = await codeOf(() => SpecDecoder.create({ champion: "tiny", backend: "gpu" }));
    out.badMaxCtx = await codeOf(() => SpecDecoder.create({ champion: "tiny", maxCtx: "big" }));
    out.liveAfterAbort = live;
    // The constructor alone starts nothing: a request is not_ready, and no fault is recorded.
    const unstarted = new SpecDecoder({ champion: "tiny" });
    out.unstarted = await codeOf(() => drain(unstarted.generate(messages, { max_tokens: 4 })));
    out.unstartedNotices = unstarted.notices.length + unstarted.restarts;
    const secure = Object.getOwnPropertyDescriptor(window, "isSecureContext");
    Object.defineProperty(window, "isSecureContext", { value: false, configurable: true });
    out.insecure = await codeOf(() => SpecDecoder.create({ champion: "tiny" }));
    if (secure) Object.defineProperty(window, "isSecureContext", secure);
    else delete window.isSecureContext;
    out.liveAfterFaults = live;
    const d = await SpecDecoder.create({ champion: "tiny" });
    out.liveReady = live;
    out.misspelt = await codeOf(() => drain(d.generate(messages, { max_tokens: 4,
                                                                    temprature: 1 })));
    out.notObject = await codeOf(() => drain(d.generate(messages, "fixed:3")));
    out.uncloneable = await codeOf(() => drain(d.generate(messages, { max_tokens: 4,
                                                                       seed: () => 1 })));
    out.stillWorks = (await drain(d.generate(messages, { max_tokens: 4 }))).finish_reason;
    out.reloadMisspelt = await codeOf(() => d.reload({ champoin: "tiny" }));
    d.terminate();
    out.liveAfterTerminate = live;
    out.generateAfter = await codeOf(() => drain(d.generate(messages, { max_tokens: 4 })));
    out.statsAfter = await codeOf(() => d.stats());
    out.cancelAfter = await codeOf(() => d.cancel());
    // terminate() from onNotice, as the worker is about to be replaced: none is started.
    const t = await SpecDecoder.create({ champion: "tiny", drills: true,
                                         onNotice: (n) => n.code === "worker_died" &&
                                                          t.terminate() });
    out.terminatedInRestart = await codeOf(() => drain(t.generate(messages, {
      max_tokens: 40, k: "fixed:3", drill: "worker-terminate@2" })));
    out.liveEnd = live;
    return out;
  } finally {
    window.Worker = Real;
  }
}""" % PRELUDE


PYODIDE_FILES = """async () => {%s
  const limit = new Promise((resolve) => setTimeout(() => resolve("pending after 90 s"), 90000));
  const made = SpecDecoder.create({ champion: "tiny", snapshot: false })
    .then((d) => { d.terminate(); return "ready"; }, (e) => ({ code: e.code, message: e.message }));
  return await Promise.race([made, limit]);
}""" % PRELUDE


@pytest.mark.parametrize("file, fault, words", [
    ("pyodide.asm.wasm", 404, ["pyodide/pyodide.asm.wasm: HTTP 404"]),
    ("pyodide.asm.wasm", "application/octet-stream",
     ["pyodide/pyodide.asm.wasm is served as 'application/octet-stream'", "application/wasm"]),
    ("python_stdlib.zip", 404, ["pyodide/python_stdlib.zip: HTTP 404"]),
], ids=["wasm-404", "wasm-type", "stdlib-404"])
def test_pyodide_files_a_host_serves_wrong_are_download_failed(browser, site_url, file, fault,
                                                               words):
    """A host that lacks one of Pyodide's files, or serves its wasm as another type (Pyodide's
    loader then neither rejects nor returns), makes create() reject with download_failed
    naming the file, before Python starts."""
    c = Context(browser, site_url)

    def broken(route):
        if fault == 404:
            route.fulfill(status=404, body="")
        else:
            response = route.fetch()
            route.fulfill(response=response, headers={**response.headers, "content-type": fault})

    out = create_under_route(c, f"**/pyodide/{file}", broken)
    assert isinstance(out, dict) and out["code"] == "download_failed", out
    for word in words:
        assert word in out["message"], out


def create_under_route(c: Context, pattern: str, handler):
    """What create() of the tiny model gives in a new page of `c` whose requests matching
    `pattern` go to `handler` (a host that serves them wrong); the context is closed after."""
    c.ctx.route(pattern, handler)
    try:
        p = c.page("embed-example.html?model=none-such")
        p.wait_for_function("() => window.embed && (embed.decoder || embed.error)")
        return p.evaluate(PYODIDE_FILES)
    finally:
        c.ctx.close()


def test_a_manifest_answered_with_a_page_is_download_failed_naming_it(browser, site_url):
    """A host whose single-page-app fallback answers a missing manifest.json with its HTML page
    (200, text/html): create() rejects with download_failed naming manifest.json and what it
    was served as, not an internal JSON parse error."""
    out = create_under_route(Context(browser, site_url), "**/manifest.json",
                             lambda route: route.fulfill(status=200,
                                                         body="<!doctype html><title>app</title>",
                                                         headers={"content-type": "text/html"}))
    assert isinstance(out, dict) and out["code"] == "download_failed", out
    assert "manifest.json next to worker.js is not JSON" in out["message"], out
    assert "text/html" in out["message"], out


def test_a_decoder_that_fails_or_is_terminated_leaves_no_worker(page):
    """A failed create() terminates the worker it started (a sha256 that is not 64 hex digits,
    a worker.js that is not there, a workerUrl that is no URL, an onProgress that is no
    function, an insecure page: each a SpecError by its code), and so does one its AbortSignal
    stops ("terminated"); a decoder made by the
    constructor alone is not_ready, with no fault recorded; an unknown create() or reload() option or a misspelt generate()
    option is refused (bad_config) by name; a config that cannot be sent to a worker is
    bad_request and the decoder goes on; after terminate() every call throws "terminated" and
    no worker is started again, even by a restart under way."""
    out = page.evaluate(LIFECYCLE)
    assert out == {"unknownModel": "unknown_model", "liveAfterFailure": 0,
                   "unknownOption": "bad_config", "liveAfterRefusal": 0,
                   "emptySha": "bad_request", "missingWorker": "download_failed",
                   "badWorkerUrl": "bad_config", "badCallback": "bad_config",
                   "aborted": "terminated", "abortedBefore": "terminated",
                   "badSignal": "bad_config", "badBackend": "bad_config",
                   "badMaxCtx": "bad_config", "liveAfterAbort": 0,
                   "unstarted": "not_ready", "unstartedNotices": 0,
                   "insecure": "insecure_context",
                   "liveAfterFaults": 0, "liveReady": 1,
                   "misspelt": "bad_config", "notObject": "bad_config",
                   "uncloneable": "bad_request", "stillWorks": "length",
                   "reloadMisspelt": "bad_config",
                   "liveAfterTerminate": 0, "generateAfter": "terminated",
                   "statsAfter": "terminated", "cancelAfter": "terminated",
                   "terminatedInRestart": "terminated", "liveEnd": 0}


IDLE_DEATH = """async () => {%s
  const Real = window.Worker, made = [];
  window.Worker = class extends Real {
    constructor(...args) { super(...args); made.push(this); }
  };
  const noticed = async (d, n) => {        // the liveness check's notice, within 5 s
    for (let i = 0; i < 100 && d.notices.length < n; i++) {
      await new Promise((r) => setTimeout(r, 50));
    }
    return d.notices.slice(n - 1).map((x) => x.code);
  };
  try {
    const d = await SpecDecoder.create({ champion: "tiny" });
    const out = {};
    const first = await drain(d.generate(messages, { max_tokens: 6 }));
    made.at(-1).terminate();                // the worker dies between requests
    out.noticed = await noticed(d, 1);
    out.stats = await codeOf(() => d.stats());
    const again = d.generate(messages, { max_tokens: 6 });
    let step, text = "";
    while (!(step = await again.next()).done) text += step.value.text;
    out.same = text === first.text;
    out.faults = step.value.receipt.faults.length;
    out.restarts = d.restarts;
    out.workers = made.length;
    made.at(-1).terminate();                // and again, then a reload
    out.noticedAgain = await noticed(d, 2);
    out.reloaded = (await d.reload()).champion;
    out.workersAfterReload = made.length;
    out.statsAfterReload = typeof (await d.stats());
    out.notices = d.notices.length;
    d.terminate();
    return out;
  } finally {
    window.Worker = Real;
  }
}""" % PRELUDE


def test_a_worker_that_dies_between_requests_is_replaced_by_the_next_one(page):
    """A worker that dies while no request runs (here terminate() on it, as a browser may kill
    an idle worker) is noticed by the liveness check (a worker_died notice at once); stats()
    then says the worker is not running, and the next generate() starts a new worker before it
    runs: the same text as before, no fault in its receipt (it was never interrupted), no
    restart counted. reload() after such a death starts a new worker too."""
    out = page.evaluate(IDLE_DEATH)
    assert out == {"noticed": ["worker_died"], "stats": "worker_died", "same": True,
                   "faults": 0, "restarts": 0, "workers": 2, "noticedAgain": ["worker_died"],
                   "reloaded": "tiny", "workersAfterReload": 3, "statsAfterReload": "object",
                   "notices": 2}


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
  // create() resolves when the request's turn comes: abort while it waits.
  const created = d.chat.completions.create({ messages, stream: true, max_tokens: 40,
                                              signal: ac.signal });
  ac.abort();
  const stream = await created;
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


# A decoder whose workers are counted, and whose onNotice calls window.hook.
COUNTED = """
const Real = window.Worker;
let made = 0;
window.Worker = class extends Real { constructor(...args) { super(...args); made += 1; } };
window.hook = null;
const d = await SpecDecoder.create({ champion: "tiny", drills: true,
                                     onNotice: (n) => window.hook?.(n) });
const settle = (p) => p.then((r) => r, (e) => ({ error: `${e.code}: ${e.message}` }));
const short = { max_tokens: 40, k: "fixed:3" }, long = { max_tokens: 300, k: "fixed:3" };
"""

LATE_PULL = """async () => {%s%s
  try {
    const refs = [await drain(d.generate(messages, short)),
                  await drain(d.generate(messages, long))];
    // B runs, A waits behind it; B's drill kills the worker at B's second chunk (chunk i has
    // run at least i cycles). A restarts the worker; B's consumer pulls only once A runs there.
    const b = d.generate(messages, { ...long, drill: "worker-terminate@2" });
    let bText = (await b.next()).value.text;
    const a = d.generate(messages, short);
    const aFirst = a.next();
    bText += (await b.next()).value.text;
    const aText = (await aFirst).value.text;
    const [bRest, aRest] = await Promise.all([settle(drain(b)), settle(drain(a))]);
    return { refs, made, notices: d.notices.map((n) => n.code),
             a: { text: aText + aRest.text, finish_reason: aRest.finish_reason ?? aRest.error },
             b: { text: bText + bRest.text, finish_reason: bRest.finish_reason ?? bRest.error } };
  } finally {
    window.Worker = Real;
    d.terminate();
  }
}""" % (PRELUDE, COUNTED)


def test_a_request_pulled_late_after_a_death_goes_on_on_the_new_worker(page):
    """Two requests stopped by one death, one of them pulled only after the other restarted
    the worker: the late one resumes there, not on a third worker that would replace the
    first one's under it; both end as undisturbed runs do."""
    out = page.evaluate(LATE_PULL)
    short, long = out["refs"]
    # both were stopped by it (answer_capped: "long" asks for more than tiny's context holds)
    assert [n for n in out["notices"] if n != "answer_capped"] == ["worker_died", "worker_died"]
    assert out["made"] == 2                                     # the first worker and one new
    assert out["a"] == short and out["b"] == long


CANCEL_IN_RESTART = """async () => {%s%s
  try {
    const ref = await drain(d.generate(messages, long));
    let asked = null;
    // cancel() once the new worker is loading (a task after the notice).
    window.hook = (n) => { setTimeout(() => { asked = settle(d.cancel()); }, 0); };
    const cut = await settle(drain(d.generate(messages, { ...long,
                                                          drill: "worker-terminate@2" })));
    window.hook = null;
    const after = await drain(d.generate(messages, long));
    return { ref, cut, asked: await asked, made, after };
  } finally {
    window.Worker = Real;
    d.terminate();
  }
}""" % (PRELUDE, COUNTED)


def test_a_cancel_while_the_worker_restarts_ends_the_request_there(page):
    """cancel() while a request waits for its new worker resolves true (never not_ready) and
    the request ends "cancelled" with the text shown before the death, instead of running to
    max_tokens on the new worker, which then serves the next request."""
    out = page.evaluate(CANCEL_IN_RESTART)
    assert out["asked"] is True, out["asked"]
    assert out["cut"]["finish_reason"] == "cancelled", out["cut"]
    assert out["ref"]["text"].startswith(out["cut"]["text"])
    assert len(out["cut"]["text"]) < len(out["ref"]["text"])
    assert out["made"] == 2 and out["after"] == out["ref"]
