"""The demo page on a tiny random model (pyspec.testmodels): exact output against the native
engine, offline loading and visible errors. One page load serves the module (Pyodide takes
15-30 s to start on two cores); its context blocks every off-site request."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import pytest

from pyspec import testmodels
from pyspec.cpu import fastcpu
from pyspec.cpu.model import Config
from pyspec.formats.gguf import GGUFFile
from pyspec.text.tokenizer import Tokenizer

from .pageutil import TIMEOUT_S, Context, native_generate, ready, run

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.browser

MESSAGES = [{"role": "user", "content": "the cat sat on the mat. the cat"}]
PROMPT = MESSAGES[0]["content"]


@pytest.fixture(scope="module")
def tiny_page(browser, site_url):
    c = Context(browser, site_url)
    page = c.page("index.html?model=tiny")
    info = ready(page)
    yield page, info, c
    c.ctx.close()
    assert not c.offsite, f"requests to other origins: {c.offsite}"


@pytest.fixture(scope="module")
def cpu_page(tiny_page, browser, site_url):
    """The page on its numpy engine (`backend=cpu`), whatever it picks on its own: the module's
    page where that already is the CPU engine (a software adapter, as on CI), else a page of
    its own, so the CPU engine's exactness tests run on every machine."""
    page, info, c = tiny_page
    if info["adapter"] == "cpu-numpy":
        yield page, info
        return
    own = Context(browser, site_url)
    page = own.page("index.html?model=tiny&backend=cpu")
    info = ready(page)
    assert info["adapter"] == "cpu-numpy", info["adapter"]
    yield page, info
    own.ctx.close()
    assert not own.offsite, f"requests to other origins: {own.offsite}"


@pytest.fixture(scope="module")
def tiny_path(site_root):
    return str(site_root / "models" / "tiny.gguf")


def test_page_loads_and_generates_offline(tiny_page):
    page, info, c = tiny_page
    assert info["weights"]["downloaded"] > 0
    assert page.locator("#progress").is_hidden()   # the label ends when loading ends
    assert info["webgpu"]["available"], "Chromium gave the page no WebGPU adapter"
    result = run(page, PROMPT, {"max_tokens": 8})
    assert result["stats"]["adapter"] == info["adapter"]   # whichever web.make_engine picked
    assert result["stats"]["generated_tokens"] == len(result["tokens"]) > 0
    assert page.locator(".msg.assistant").last.text_content() == result["text"]
    # Pyodide's numpy came from this origin (its lock file points nowhere else).
    assert any("/pyodide/numpy-2.0.2" in u for u in c.requests)
    assert not c.offsite


def test_the_offsite_guard_catches_requests(tiny_page):
    """The check every test relies on: an off-site request is blocked and recorded."""
    page, _, c = tiny_page
    url = "https://cdn.jsdelivr.net/pyodide/v0.27.7/full/pyodide-lock.json"
    assert page.evaluate("(u) => fetch(u).then(() => 'fetched', () => 'blocked')", url) == "blocked"
    assert c.offsite == [url]
    c.offsite.clear()


def test_greedy_speculative_equals_champion_only_and_native(tiny_page, tiny_path):
    page, _, _ = tiny_page
    n = 40
    native = native_generate(tiny_path, MESSAGES, "none", max_tokens=n)
    native_ngram = native_generate(tiny_path, MESSAGES, "ngram", max_tokens=n, k="fixed:3")
    champion_only = run(page, PROMPT, {"draft": "none", "max_tokens": n})
    ngram = run(page, PROMPT, {"draft": "ngram", "k": "fixed:3", "max_tokens": n})
    self_draft = run(page, PROMPT, {"draft": "self:1", "k": "fixed:2", "max_tokens": n})
    assert champion_only["tokens"] == native.tokens
    assert ngram["tokens"] == native.tokens
    assert self_draft["tokens"] == native.tokens
    assert ngram["stats"]["drafted"] > 0 and self_draft["stats"]["drafted"] > 0
    # The same accept decisions as the native engine, position by position.
    for key in ("drafted_by_position", "accepted_by_position", "champion_passes"):
        assert ngram["stats"][key] == native_ngram.stats[key], key


def test_the_cpu_engine_picks_the_kernel_and_tokens_of_cpython(cpu_page, tiny_path,
                                                               monkeypatch):
    """The page's CPU engine (fastcpu) chooses its row kernel by the rule CPython applies to a
    numpy without BLAS, and gives the tokens and accept decisions of that kernel natively."""
    page, info = cpu_page
    monkeypatch.setattr(fastcpu, "numpy_has_blas", lambda: False)   # Pyodide's numpy has none
    monkeypatch.delenv("PYSPEC_CPU_KERNEL", raising=False)
    kernel = fastcpu.choose_kernel()
    assert info["cpu_kernel"] == kernel == "einsum"
    load = functools.partial(fastcpu.FastModel.load, kernel=kernel)
    for draft, k in (("none", "heuristic"), ("ngram", "fixed:3")):
        native = native_generate(tiny_path, MESSAGES, draft, load=load, max_tokens=40, k=k)
        paged = run(page, PROMPT, {"draft": draft, "k": k, "max_tokens": 40})
        assert paged["tokens"] == native.tokens, draft
        for key in ("drafted_by_position", "accepted_by_position", "champion_passes"):
            assert paged["stats"][key] == native.stats[key], (draft, key)


def test_replay_equals_native_for_the_same_seed(tiny_page, tiny_path):
    page, _, _ = tiny_page
    opts = {"temperature": 0.8, "seed": 7, "max_tokens": 40}
    native = native_generate(tiny_path, MESSAGES, "none", **opts)
    browser_ngram = run(page, PROMPT, {"draft": "ngram", "k": "fixed:3", **opts})
    browser_none = run(page, PROMPT, {"draft": "none", **opts})
    assert browser_ngram["receipt"]["verify"] == "replay"
    assert browser_ngram["tokens"] == native.tokens
    assert browser_none["tokens"] == native.tokens


def test_rejection_equals_native_seed_by_seed(cpu_page, tiny_path):
    """Rejection sampling in the page's CPU engine: for each seed the tokens and accept
    decisions of the native engine with the page's kernel (its samples depend on the draft
    and K, not only on the seed, so drafters are compared with their own native runs). Its
    distribution is tested natively (tests/test_engine.py)."""
    page, info = cpu_page
    load = functools.partial(fastcpu.FastModel.load, kernel=info["cpu_kernel"])
    for seed in range(4):
        options = {"temperature": 0.9, "seed": seed, "verify": "rejection", "k": "fixed:2",
                   "max_tokens": 16}
        for draft in ("ngram", "self:1"):
            native = native_generate(tiny_path, MESSAGES, draft, load=load, **options)
            paged = run(page, PROMPT, {"draft": draft, **options})
            assert paged["receipt"]["verify"] == "rejection"
            assert paged["tokens"] == native.tokens, (draft, seed)
            for key in ("drafted_by_position", "accepted_by_position", "champion_passes"):
                assert paged["stats"][key] == native.stats[key], (draft, seed, key)


def test_the_sampling_section_equals_native(tiny_page, tiny_path):
    """top_p, repetition_penalty and a stop string typed into the page's Sampling section give
    the native numpy engine's tokens and text for the same controls (the stop string taken
    from the uncut output, so it does cut it)."""
    page, _, _ = tiny_page
    opts = {"temperature": 0.8, "seed": 7, "max_tokens": 40}
    controls = {"top_p": 0.8, "repetition_penalty": 1.3}
    uncut = native_generate(tiny_path, MESSAGES, "none", **opts, **controls)
    stop = uncut.text[len(uncut.text) // 2:][:2]
    native = native_generate(tiny_path, MESSAGES, "none", **opts, **controls, stop=(stop,))
    assert native.finish_reason == "stop" and native.text == uncut.text[:uncut.text.find(stop)]
    fields = {"#top-p": "0.8", "#repetition-penalty": "1.3",
              "#stop-strings": stop.replace("\n", "\\n")}
    try:
        for selector, value in fields.items():
            page.fill(selector, value)
        paged = run(page, PROMPT, {"draft": "ngram", "k": "fixed:3", **opts})
    finally:
        for selector in fields:
            page.fill(selector, "")
    assert paged["receipt"]["sampling"]["top_p"] == 0.8
    assert paged["receipt"]["sampling"]["stop"] == 1
    assert (paged["text"], paged["tokens"], paged["finish_reason"]) == \
        (native.text, native.tokens, "stop")
    assert page.locator(".msg.assistant").last.text_content() == native.text


def test_prompt_over_the_context_shows_an_error(tiny_page):
    page, _, _ = tiny_page
    page.fill("#prompt", "the cat sat on the mat. " * 80)   # the tiny model's context is 256
    page.click("#send")
    error = page.locator("#error")
    error.wait_for(state="visible", timeout=60_000)
    assert error.get_attribute("data-code") == "prompt_too_long"
    assert "context" in error.text_content()
    # The page recovers: the next request works.
    assert run(page, PROMPT, {"max_tokens": 4})["tokens"]


_CONVERSE = """async ([messages, config]) => {
  const d = pyspecApp.decoder();
  for await (const _ of d.generate(messages, config)) {}
  return d.lastResult;
}"""


def test_a_follow_up_turn_reuses_the_cache_and_equals_native(tiny_page, tiny_path):
    """The worker's engine keeps its cache between requests: the next turn of a conversation
    prefills only its new tokens, and gives what a fresh native engine gives."""
    page, _, _ = tiny_page
    opts = {"max_tokens": 12, "draft": "ngram", "k": "fixed:3"}
    first = page.evaluate(_CONVERSE, [MESSAGES, opts])
    second_turn = MESSAGES + [{"role": "assistant", "content": first["text"]},
                              {"role": "user", "content": "the dog ate the bone."}]
    second = page.evaluate(_CONVERSE, [second_turn, opts])
    native = native_generate(tiny_path, second_turn, "ngram", max_tokens=12, k="fixed:3")
    assert second["tokens"] == native.tokens
    assert second["stats"]["reused_tokens"] > len(first["tokens"]) // 2
    assert second["stats"]["prefill_tokens"] < native.stats["prefill_tokens"]


def test_a_max_tokens_past_the_context_says_where_the_answer_ends(tiny_page):
    """No turn is left out for a max_tokens no count of turns could make room for: the answer
    runs to the context's end and the notice (answer_capped) says how far it can go."""
    page, _, _ = tiny_page
    result = page.evaluate(_CONVERSE, [[{"role": "user", "content": "the cat"}],
                                       {"max_tokens": 400, "draft": "none"}])
    assert "The answer can run to" in result["notice"], result["notice"]
    assert result["receipt"]["context"]["dropped_messages"] == 0
    assert page.locator("#notice").get_attribute("data-code") == "answer_capped"


def test_a_conversation_longer_than_the_context_drops_old_turns_with_a_notice(tiny_page,
                                                                              tiny_path):
    page, _, _ = tiny_page
    messages = []
    for i in range(8):
        messages += [{"role": "user", "content": f"question {i}: the cat sat on the mat"},
                     {"role": "assistant", "content": f"answer {i}: the dog ate the bone"}]
    messages.append({"role": "user", "content": "last: the cat"})
    result = page.evaluate(_CONVERSE, [messages, {"max_tokens": 8, "draft": "none"}])
    dropped = result["receipt"]["context"]["dropped_messages"]
    assert dropped >= 2 and dropped % 2 == 0
    assert str(dropped) in result["notice"]
    notice = page.locator("#notice")
    assert notice.is_visible() and notice.get_attribute("data-code") == "context_trimmed"
    native = native_generate(tiny_path, messages[dropped:], "none", max_tokens=8)
    assert result["tokens"] == native.tokens
    refused = page.evaluate("""async (messages) => {
      try { for await (const _ of pyspecApp.decoder().generate(messages,
              {max_tokens: 8, context_overflow: "error"})) {} return null; }
      catch (e) { return e.code; } }""", messages)
    assert refused == "prompt_too_long"


def test_the_page_styles_each_token_by_kind_as_the_stats_count(tiny_page):
    """The demo shows speculation at work: one span per token, classed by its kind; the spans
    classed accepted number stats.accepted, all of them the tokens generated, their text the
    answer; the switch turns the styles off and keeps the text."""
    page, _, _ = tiny_page
    result = run(page, PROMPT, {"draft": "ngram", "k": "fixed:3", "max_tokens": 40})
    bubble = page.locator(".msg.assistant").last
    counts = bubble.evaluate("""(el) => Object.fromEntries(["champion", "accepted", "corrected",
        "bonus", "forced"].map((k) => [k, el.querySelectorAll(".tok-" + k).length]))""")
    stats = result["stats"]
    assert counts["accepted"] == stats["accepted"] > 0
    assert sum(counts.values()) == stats["generated_tokens"] == len(result["tokens"])
    assert counts["champion"] + counts["corrected"] + counts["bonus"] == stats["champion_passes"]
    assert bubble.text_content() == result["text"]
    style = "(el) => getComputedStyle(el.querySelector('.tok-accepted')).textDecorationLine"
    assert bubble.evaluate(style) == "underline"
    page.uncheck("#show-kinds")
    assert bubble.evaluate(style) == "none" and bubble.text_content() == result["text"]
    page.check("#show-kinds")


_RELOAD = "async (options) => pyspecApp.decoder().reload(options)"

_STREAM = """async ([messages, config]) => {
  const d = pyspecApp.decoder(), chunks = [];
  for await (const c of d.generate(messages, config)) chunks.push([c.offset, c.text]);
  return { ...d.lastResult, chunks };
}"""


def test_an_8000_token_prompt_runs_to_the_end_of_an_8192_context(tiny_page, site_root):
    """max_ctx 8192 in the page: tiny-long (testmodels.LONG_CONTEXT, a GGUF of 8,192 positions),
    loaded in the module's worker, takes an 8,000-token prompt and generates to the end of the
    context: the native numpy engine's tokens and text, finish_reason context, contiguous
    chunks, the KV cache's bytes from its shape."""
    page, _, _ = tiny_page
    ctx, n_prompt = testmodels.LONG_CONTEXT["ctx"], 8000
    path = str(site_root / "models" / "tiny-long.gguf")
    metadata = GGUFFile.open(path).metadata
    tokenizer = Tokenizer.from_metadata(metadata)
    text = testmodels.CORPUS * (1 + 4 * n_prompt // len(testmodels.CORPUS))
    lo, hi = 0, len(text)    # the most characters whose chat prompt has at most n_prompt tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        fits = len(tokenizer.encode_chat([{"role": "user", "content": text[:mid]}])) <= n_prompt
        lo, hi = (mid, hi) if fits else (lo, mid - 1)
    messages = [{"role": "user", "content": text[:lo]}]
    assert len(tokenizer.encode_chat(messages)) == n_prompt
    opts = {"max_tokens": ctx, "k": "fixed:3"}
    native = native_generate(path, messages, "ngram", **opts)
    assert native.finish_reason == "context" and len(native.tokens) == ctx + 1 - n_prompt
    try:
        info = page.evaluate(_RELOAD, {"champion": "tiny-long", "maxCtx": ctx})
        assert info["context"] == ctx
        result = page.evaluate(_STREAM, [messages, {**opts, "draft": "ngram"}])
    finally:   # the module's other tests expect the tiny model
        page.evaluate(_RELOAD, {"champion": "tiny", "maxCtx": None})
    assert result["finish_reason"] == "context"
    assert (result["tokens"], result["text"]) == (native.tokens, native.text)
    assert result["stats"]["prompt_tokens"] == n_prompt and result["stats"]["drafted"] > 0
    chunks = result["chunks"]
    starts = [sum(len(t) for _, t in chunks[:i]) for i in range(len(chunks))]
    assert [o for o, _ in chunks] == starts
    assert "".join(t for _, t in chunks) == native.text
    cfg = Config.from_metadata(metadata)
    kv_bytes = 2 * cfg.n_layers * ctx * cfg.n_kv_heads * cfg.head_dim * 4
    assert result["stats"]["peak_bytes"]["kv"] == kv_bytes


JSON_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                                "sky": {"enum": ["sunny", "rain", "snow"]}},
               "required": ["ok", "sky"], "additionalProperties": False}

_SENT = """() => { const m = document.querySelector(".msg.assistant");
  return (m && !m.classList.contains("streaming")) || !document.getElementById("error").hidden; }"""


def test_the_json_toggle_gives_the_native_schema_output_with_forced_tokens(tiny_page, tiny_path):
    """The Output section's JSON toggle, driven as a user would (tick it, type a schema, Send):
    the reply parses and follows the schema, equals the native engine's under the same schema
    and controls, and shows its forced tokens as such. A schema box holding bad JSON shows the
    page's error and starts no request."""
    page, _, _ = tiny_page
    native = native_generate(tiny_path, MESSAGES, "ngram", max_tokens=40, k="fixed:3",
                             json_schema=JSON_SCHEMA)
    assert native.finish_reason == "stop" and native.stats["forced_tokens"] > 0
    schema_box = page.input_value("#json-schema")
    try:
        page.click("#clear")
        page.check("#json")
        page.fill("#json-schema", json.dumps(JSON_SCHEMA))
        page.fill("#max-tokens", "40")
        page.fill("#k", "fixed:3")
        page.fill("#prompt", PROMPT)
        page.click("#send")
        page.wait_for_function(_SENT, timeout=1000 * TIMEOUT_S)
        assert page.locator("#error").is_hidden(), page.locator("#error").text_content()
        result = page.evaluate("() => pyspecApp.decoder().lastResult")
        bubble = page.locator(".msg.assistant").last
        text = bubble.text_content()
        value = json.loads(text)
        assert list(value) == ["ok", "sky"] and isinstance(value["ok"], bool)
        assert value["sky"] in JSON_SCHEMA["properties"]["sky"]["enum"]
        assert (text, result["tokens"], result["finish_reason"]) == \
            (native.text, native.tokens, "stop")
        assert result["stats"]["forced_tokens"] == native.stats["forced_tokens"]
        forced = bubble.locator(".tok-forced")
        assert forced.count() == native.stats["forced_tokens"]
        assert '"sky":' in "".join(forced.all_text_contents())   # a key is forced

        # Bad JSON in the box: the page's own message, and no request (no new bubble, the
        # decoder's last result unchanged).
        page.evaluate("() => { window.lastBeforeBadSchema = pyspecApp.decoder().lastResult; }")
        bubbles = page.locator(".msg").count()
        page.fill("#json-schema", '{"type": "object",')
        page.fill("#prompt", PROMPT)    # (a sent prompt leaves the box)
        page.click("#send")
        error = page.locator("#error")
        error.wait_for(state="visible", timeout=10_000)
        assert "the JSON schema box does not hold valid JSON" in error.text_content()
        assert page.locator(".msg").count() == bubbles
        assert page.evaluate("() => pyspecApp.decoder().lastResult === window.lastBeforeBadSchema")
        assert page.locator("#send").is_enabled()
    finally:   # the module's other tests expect the page's defaults
        page.uncheck("#json")
        page.fill("#json-schema", schema_box)
        page.fill("#max-tokens", "64")
        page.fill("#k", "heuristic")
        page.click("#clear")


def test_a_draft_that_borrows_from_its_champion_in_the_page(tiny_page, tiny_path):
    """A draft that holds only its layers and borrows the champion's embedding and head
    (`draft=tiny-borrowing`, gguf.py): the worker binds it to the champion's bytes and drafts
    with it, and the tokens are champion-only's."""
    _, _, c = tiny_page
    page = c.page("index.html?model=tiny&draft=tiny-borrowing")
    ready(page)
    n = 24
    native = native_generate(tiny_path, MESSAGES, "none", max_tokens=n)
    paged = run(page, PROMPT, {"draft": "model", "k": "fixed:3", "max_tokens": n})
    assert paged["tokens"] == native.tokens
    assert paged["stats"]["drafted"] > 0 and paged["stats"]["accepted"] > 0, paged["stats"]
    page.close()


def test_a_draft_model_and_ngram_plus_it_in_the_page(tiny_page, tiny_path):
    """The page with a draft model given at init (`draft=tiny-close`): "model" and
    "ngram+model" (n-gram where the text repeats, the draft model elsewhere:
    pyspec/drafters/combo.py) give champion-only's tokens. The drafter list offers a trained
    draft both alone and after n-gram."""
    _, _, c = tiny_page
    page = c.page("index.html?model=tiny&draft=tiny-close")
    ready(page)
    n = 24
    native = native_generate(tiny_path, MESSAGES, "none", max_tokens=n)
    for draft in ("model", "ngram+model"):
        paged = run(page, PROMPT, {"draft": draft, "k": "fixed:3", "max_tokens": n})
        assert paged["tokens"] == native.tokens, draft
        assert paged["stats"]["drafted"] > 0, draft
        assert paged["stats"]["drafter"].startswith("ngram+") == (draft != "model"), paged["stats"]
    options = page.eval_on_selector_all("#drafter option",
                                        "os => os.map(o => [o.value, o.textContent])")
    trained = [v[6:] for v, label in options if label.startswith("trained draft")]
    assert trained == ["tiny-borrowing"], options   # made for tiny (draft_for)
    for name in trained:
        assert [f"combo:{name}", f"n-gram + trained draft {name}"] in options, options
    # Only drafts that can serve this champion: its tokenizer, not itself, not another's draft.
    values = [v for v, _ in options]
    assert "model:tiny-deep" in values and "model:tiny" not in values
    assert "model:draft-l4" not in values and "model:tiny-mismatch" not in values
    page.close()


_CUT_DRAFT = """async ({ vocabSha, config }) => {
  const { SpecDecoder } = await import("./client.js");
  const draft = { url: "models/tiny-close.gguf",
                  vocab: { url: "models/tiny-close.cut.vocab.json", sha256: vocabSha } };
  let d;
  try {
    d = await SpecDecoder.create({ champion: "tiny", draft, backend: "cpu" });
  } catch (e) {
    return { error: { code: e.code, message: e.message } };
  }
  const messages = [{ role: "user", content: "the cat sat on the mat. the cat" }];
  for await (const _ of d.generate(messages, config)) ;
  const out = { info: d.info, result: d.lastResult };
  d.terminate();
  return out;
}"""


def test_a_draft_with_a_reduced_head_in_the_page(tiny_page, tiny_path, site_root):
    """A draft given by URL with its reduced head ({url, vocab: {url, sha256}}, client.d.ts
    ModelSpec; the site ships draft-l4's so): the worker fetches and checks the ranking, the
    numpy engine's draft keeps those head rows (ready's draft_head_rows), and the tokens are
    champion-only's though the champion says ids the head cut. A ranking that is not the one
    named is corrupt_download, and nothing loads."""
    _, _, c = tiny_page
    page = c.page("embed-example.html?model=none-such")   # its own decoder stops at once
    side = site_root / "models" / "tiny-close.cut.vocab.json"
    kept = json.loads(side.read_text())["head_rows"]
    n = 32
    native = native_generate(tiny_path, MESSAGES, "none", max_tokens=n)
    assert any(t % 3 == 0 for t in native.tokens), "the champion must say an id the head cut"
    out = page.evaluate(_CUT_DRAFT, {"vocabSha": hashlib.sha256(side.read_bytes()).hexdigest(),
                                     "config": {"draft": "model", "k": "fixed:3",
                                                "max_tokens": n}})
    assert "error" not in out, out
    assert out["info"]["draft_head_rows"] == kept and out["info"]["adapter"] == "cpu-numpy"
    assert out["result"]["tokens"] == native.tokens
    stats = out["result"]["stats"]
    assert 0 < stats["accepted"] < stats["drafted"], stats
    bad = page.evaluate(_CUT_DRAFT, {"vocabSha": "0" * 64, "config": {}})
    assert bad["error"]["code"] == "corrupt_download", bad
    assert "tiny-close.cut.vocab.json" in bad["error"]["message"]
    page.close()
    # The site's own trained draft brings its ranking by name (worker.js resolveModel).
    shipped = ROOT / "models" / "draft-l4.vocab.json"
    listed = [a for a in json.loads((site_root / "manifest.json").read_text())["artifacts"]
              if a["kind"] == "draft-vocab"]
    assert [(a["model"], a["sha256"]) for a in listed] == \
        [("draft-l4", hashlib.sha256(shipped.read_bytes()).hexdigest())], listed
