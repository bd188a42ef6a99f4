"""The demo page (web/index.html, app.js) as a person uses it, on the tiny models: choices made
while a model loads or a reply is written leave one worker and never cut the reply; a model that
fails to load gives way to the one that worked; Clear mid-reply stops it and starts afresh; a
request that fails before any text leaves no orphan turn; the drafter list offers only drafts
that can serve the chosen model. Every page counts the workers it started and did not stop.
`build.py demo --headless --model PATH` runs a local GGUF (the server adds it at local/NAME)."""

from __future__ import annotations

import hashlib
import json

import pytest

from .pageutil import TIMEOUT_S, Context

pytestmark = pytest.mark.browser

# Counts the page's live workers (those client.js starts; a worker's own helpers are not here).
COUNT_WORKERS = """(() => {
  const Real = window.Worker;
  window.liveWorkers = 0;
  window.Worker = class extends Real {
    constructor(...args) { super(...args); window.liveWorkers += 1; }
    terminate() {
      if (!this.gone) { this.gone = true; window.liveWorkers -= 1; }
      super.terminate();
    }
  };
})();"""

LOADED = """(draft) => {
  const d = pyspecApp.decoder();
  return d !== null && d.info.draft_model === draft && !document.getElementById("send").disabled;
}"""

# A long reply started and left running; window.reply settles with its result or error.
START = """() => {
  window.reply = pyspecApp.run("the cat sat on the mat", { max_tokens: 400, draft: "none" })
    .then((r) => ({ finish_reason: r.finish_reason, text: r.text }), (e) => ({ error: e.code }));
}"""
STREAMING = "() => (document.querySelector('.msg.assistant')?.textContent ?? '').length > 0"


@pytest.fixture(scope="module")
def demo(browser, site_url):
    c = Context(browser, site_url)
    c.ctx.add_init_script(COUNT_WORKERS)
    yield c
    c.ctx.close()
    assert not c.offsite, f"requests to other origins: {c.offsite}"


def wait(page, fn: str, arg=None):
    page.wait_for_function(fn, arg=arg, timeout=TIMEOUT_S * 1000)


def test_choices_made_while_loading_leave_one_worker(demo):
    page = demo.page("index.html?model=tiny")
    page.wait_for_selector("#drafter option[value='model:tiny-deep']", state="attached")
    page.select_option("#drafter", "model:tiny-close")   # while the first load runs
    page.select_option("#drafter", "model:tiny-deep")
    wait(page, LOADED, "tiny-deep")
    assert page.evaluate("() => liveWorkers") == 1
    assert page.evaluate("() => document.getElementById('notice').dataset.code ?? null") is None
    page.close()


def test_a_choice_made_mid_reply_waits_for_the_reply(demo):
    page = demo.page("index.html?model=tiny")
    wait(page, LOADED, None)
    page.evaluate(START)
    wait(page, STREAMING)
    page.select_option("#drafter", "model:tiny-close")
    assert page.get_attribute("#notice", "data-code") == "later"
    reply = page.evaluate("() => window.reply")
    assert reply.get("finish_reason") == "context" and reply["text"], reply   # to the end
    assert page.is_hidden("#error")
    wait(page, LOADED, "tiny-close")
    assert page.evaluate("() => liveWorkers") == 1
    # the note that the choice waits goes once the choice has loaded (the reply's own note,
    # answer_capped: 400 tokens ask for more than tiny's context holds, may stay)
    wait(page, "() => document.getElementById('notice').hidden || "
               "document.getElementById('notice').dataset.code !== 'later'")
    page.close()


def test_a_model_that_fails_to_load_gives_way_to_the_one_that_worked(demo):
    page = demo.page("index.html?model=tiny")
    wait(page, LOADED, None)
    page.evaluate("""() => document.getElementById("drafter").add(
                         new Option("a draft of another tokenizer", "model:tiny-mismatch"))""")
    page.select_option("#drafter", "model:tiny-mismatch")
    page.locator("#error").wait_for(state="visible", timeout=TIMEOUT_S * 1000)
    assert page.get_attribute("#error", "data-code") == "incompatible_draft"
    assert "back to tiny" in page.text_content("#error")
    wait(page, LOADED, None)
    assert page.input_value("#drafter") == "auto"
    assert page.evaluate("() => liveWorkers") == 1
    out = page.evaluate("() => pyspecApp.run('the cat', { max_tokens: 4 })")
    assert out["finish_reason"] == "length"
    page.close()


def test_clear_mid_reply_stops_it_and_starts_afresh(demo):
    page = demo.page("index.html?model=tiny")
    wait(page, LOADED, None)
    alone = page.evaluate("() => pyspecApp.run('the dog', { max_tokens: 4 })")
    page.evaluate(START)
    wait(page, STREAMING)
    page.click("#clear")
    assert page.evaluate("() => window.reply")["finish_reason"] == "cancelled"
    assert page.evaluate("() => document.querySelectorAll('#messages .msg').length") == 0
    assert page.text_content("#s-finish") == "–" and page.is_disabled("#receipt")
    # The next turn is the first of a new conversation: the old turns are not sent.
    page.fill("#prompt", "the dog")
    page.click("#send")
    wait(page, "() => document.querySelectorAll('#messages .msg.assistant').length === 1 && "
               "!document.querySelector('.msg.streaming')")
    sent = page.evaluate("() => pyspecApp.decoder().lastResult.stats.prompt_tokens")
    assert sent == alone["stats"]["prompt_tokens"]
    page.close()


def test_enter_sends_and_a_reply_starts_with_blank_stats(demo):
    """Enter in the prompt box sends (Shift+Enter is a new line) and empties the box; while the
    next reply streams, no stat of the last reply is shown (each is "–"), nor its receipt."""
    page = demo.page("index.html?model=tiny&draft=none&max_tokens=4")
    wait(page, LOADED, None)
    page.fill("#prompt", "the dog")
    page.press("#prompt", "Shift+Enter")
    assert page.input_value("#prompt") == "the dog\n"
    page.fill("#prompt", "the dog")
    page.press("#prompt", "Enter")
    wait(page, "() => document.querySelectorAll('#messages .msg.assistant').length === 1 && "
               "!document.querySelector('.msg.streaming')")
    assert page.input_value("#prompt") == ""
    assert page.text_content("#s-finish") == "length" and page.is_enabled("#receipt")
    assert page.text_content("#s-acc") == "– (no drafts)"
    page.evaluate(START)
    wait(page, "() => document.querySelectorAll('.msg.assistant')[1]?.textContent.length > 0")
    stats = page.evaluate("""() => ["s-finish", "s-tpp", "s-acc", "s-passes", "s-ttft",
                                     "s-guard"].map((id) => document.getElementById(id)
                                                                     .textContent)""")
    assert stats == ["–"] * 6 and page.is_disabled("#receipt")
    page.click("#stop")
    assert page.evaluate("() => window.reply")["finish_reason"] == "cancelled"
    page.close()


def test_a_request_refused_before_any_text_leaves_no_turn(demo):
    page = demo.page("index.html?model=tiny")
    wait(page, LOADED, None)
    err = page.evaluate("""() => pyspecApp.run("the fox", { k: "bogus" })
                                   .then(() => null, (e) => e.code)""")
    assert err == "bad_config"
    assert page.evaluate("() => document.querySelectorAll('#messages .msg').length") == 0
    assert page.input_value("#prompt") == "the fox"
    page.close()


def test_the_drafter_list_fits_the_model(demo):
    """The champion's trained draft and its n-gram combination are offered for it alone; test
    drafts only for a champion of their tokenizer, never the champion itself or a draft of
    another tokenizer."""
    page = demo.page("index.html?model=tiny-close")
    page.wait_for_selector("#drafter option[value='model:tiny']", state="attached")
    values = page.eval_on_selector_all("#drafter option", "os => os.map(o => o.value)")
    assert "model:tiny-close" not in values and "model:tiny-mismatch" not in values
    assert "model:tiny-borrowing" not in values        # made for tiny: other bytes
    assert "auto" not in values                        # no trained draft of its own
    assert all(not v.endswith("draft-l4") for v in values)
    page.select_option("#model", "tiny")
    values = page.eval_on_selector_all("#drafter option", "os => os.map(o => o.value)")
    assert {"model:tiny-close", "model:tiny-borrowing", "combo:tiny-borrowing"} <= set(values)
    assert "model:tiny" not in values
    assert page.text_content("#drafter-help").startswith("prompt n-gram")
    assert values[0] == "auto"   # tiny has a trained draft; tiny-close (above) had none
    page.close()


def test_auto_is_the_default_drafter_and_says_what_it_chose(demo):
    """For a model with a trained draft (tiny: tiny-borrowing) the page's default drafter is
    auto; on this software adapter the worker chooses n-gram without downloading the draft,
    and the help line under the list says so. A model without one offers no auto."""
    page = demo.page("index.html?model=tiny")
    wait(page, LOADED, None)
    assert page.input_value("#drafter") == "auto"
    info = page.evaluate("() => pyspecApp.decoder().info")
    assert info["draft"] == "ngram" and info["draft_model"] is None, info
    assert "software WebGPU adapter" in info["draft_auto"]
    assert page.text_content("#drafter-help") == f"auto: {info['draft_auto']}"
    out = page.evaluate("() => pyspecApp.run('the cat sat on the mat. the cat', "
                        "{ max_tokens: 8 })")
    assert out["stats"]["drafter"] == "ngram"
    page.select_option("#model", "tiny-close")
    values = page.eval_on_selector_all("#drafter option", "os => os.map(o => o.value)")
    assert "auto" not in values and page.input_value("#drafter") == "ngram"
    page.close()


def test_the_headless_demo_runs_a_local_gguf(site_root, tmp_path, monkeypatch, capfd):
    """`build.py demo --headless --model PATH --json`: the server adds the file at local/NAME,
    the page opens it by that URL, the text is the champion's own (greedy), and stdout holds
    the JSON alone."""
    from concurrent.futures import ThreadPoolExecutor

    from pyspec import testmodels
    from webtools import browser

    from .pageutil import native_generate

    path = tmp_path / "my model.gguf"
    testmodels.write_model(path, seed=1)
    prompt = "the cat sat on the mat. the cat"
    monkeypatch.setattr(browser.site, "build", lambda **kw: site_root / "manifest.json")
    argv = ["--headless", "--model", str(path), "--prompt", prompt, "--max-tokens", "16",
            "--json"]
    with ThreadPoolExecutor(1) as pool:   # its own Playwright, beside the session's
        code = pool.submit(browser.main, argv).result()
    out, err = capfd.readouterr()
    assert code == 0, err
    result = json.loads(out)            # the whole of stdout: nothing else there
    native = native_generate(str(path), [{"role": "user", "content": prompt}], max_tokens=16)
    assert result["tokens"] == native.tokens and result["text"] == native.text
    assert result["receipt"]["champion_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
