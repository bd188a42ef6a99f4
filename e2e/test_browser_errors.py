"""Errors a user can cause show a visible message in the page (#error, role=alert), never a hang.
(A prompt over the context is in test_browser_tiny.py, on the already loaded page.) Malformed
requests posted straight to the worker get a typed error and leave it serving valid ones."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser


@pytest.mark.parametrize("query, code, words", [
    ("model=models/nope.gguf", "download_failed", "404"),
    ("model=nope", "unknown_model", "tiny"),
    ("model=tiny&draft=tiny-mismatch", "incompatible_draft", "tokenizer"),
    # a draft borrowing tiny's embedding, against another champion's bytes (gguf.py)
    ("model=tiny-close&draft=tiny-borrowing", "incompatible_draft", "other bytes"),
])
def test_visible_error(context, query, code, words):
    page = context.page(f"index.html?{query}")
    error = page.locator("#error")
    error.wait_for(state="visible", timeout=240_000)
    assert error.get_attribute("data-code") == code
    assert words in error.text_content()
    assert page.locator("#send").is_disabled()


# Malformed requests posted straight to a worker, then valid ones on the same worker. Runs in a
# page of the site's origin that starts no worker of its own (manifest.json).
_HOSTILE = """async ([seconds]) => {
  const w = new Worker("worker.js", { type: "module" });
  const inbox = [];
  let wake = null;
  w.onmessage = (e) => { inbox.push(e.data); wake?.(); };
  const TERMINAL = ["ready", "done", "error", "cancel_ack", "stats", "receipt"];
  const reply = async (id) => {
    for (;;) {
      const i = inbox.findIndex((m) => m.id === id && TERMINAL.includes(m.type));
      if (i >= 0) return inbox.splice(i, 1)[0];
      await new Promise((r) => { wake = r; });
    }
  };
  const ask = (msg, id) => { w.postMessage(msg); return reply(id); };
  const cyclic = {};
  cyclic.self = cyclic;
  const chat = [{ role: "user", content: "the cat sat on the mat" }];
  const work = (async () => {
    const out = {};
    out.string = await ask("garbage", null);
    out.null = await ask(null, null);
    out.array = await ask([1, 2], null);
    out.no_type = await ask({ id: 1 }, 1);
    out.number_type = await ask({ type: 7, id: 2 }, 2);
    out.stats_before_init = await ask({ type: "stats", id: 3 }, 3);
    out.max_ctx_string = await ask({ type: "init", id: 4, champion: "tiny", maxCtx: "big" }, 4);
    out.champion_number = await ask({ type: "init", id: 5, champion: 5 }, 5);
    out.messages_string = await ask({ type: "generate", id: 6, messages: "hi" }, 6);
    out.config_array = await ask({ type: "generate", id: 7, messages: chat, config: [1] }, 7);
    out.target_object = await ask({ type: "cancel", id: 8, target: {} }, 8);
    // a sha256 of another form would turn the check off ("") or fail every download
    out.sha_empty = await ask({ type: "init", id: 15, champion: { url: "m.gguf", sha256: "" } },
                              15);
    out.sha_short = await ask({ type: "init", id: 16, draft: { url: "d.gguf", sha256: "ab" } },
                              16);
    out.ready = await ask({ type: "init", id: 9, champion: "tiny", draft: "ngram", maxCtx: 128 }, 9);
    out.no_content = await ask({ type: "generate", id: 10, messages: [{ role: "user" }] }, 10);
    out.max_tokens_string = await ask({ type: "generate", id: 11, messages: chat,
                                        config: { max_tokens: "8" } }, 11);
    out.cyclic = await ask({ type: "generate", id: 12, messages: [{ ...chat[0], x: cyclic }] }, 12);
    // posted straight to the worker, NaN would reach Python as null (the default): refused
    out.nan_option = await ask({ type: "generate", id: 17, messages: chat,
                                 config: { temperature: NaN } }, 17);
    out.done = await ask({ type: "generate", id: 13, messages: chat, config: { max_tokens: 8 } }, 13);
    out.receipt = await ask({ type: "receipt", id: 14 }, 14);
    return out;
  })();
  const timeout = new Promise((_, reject) =>
    setTimeout(() => reject(new Error(`timed out after ${seconds} s`)), seconds * 1000));
  try { return await Promise.race([work, timeout]); } finally { w.terminate(); }
}"""


def test_malformed_requests_get_typed_errors_and_the_worker_stays_usable(context):
    page = context.page("manifest.json")
    out = page.evaluate(_HOSTILE, [240])
    expected = {"string": "bad_request", "null": "bad_request", "array": "bad_request",
                "no_type": "bad_request", "number_type": "bad_request",
                "stats_before_init": "not_ready", "max_ctx_string": "bad_request",
                "champion_number": "bad_request", "messages_string": "bad_request",
                "config_array": "bad_request", "target_object": "bad_request",
                "sha_empty": "bad_request", "sha_short": "bad_request",
                "no_content": "bad_config", "max_tokens_string": "bad_config",
                "cyclic": "bad_request", "nan_option": "bad_config"}
    for name, code in expected.items():
        reply = out[name]
        assert reply["type"] == "error" and reply["code"] == code, (name, reply)
        assert reply["fatal"] is False and reply["message"], (name, reply)
    assert "sha256" in out["sha_empty"]["message"] and "sha256" in out["sha_short"]["message"]
    assert "config.temperature must be a finite number" in out["nan_option"]["message"]
    assert out["ready"]["type"] == "ready", out["ready"]
    done = out["done"]
    assert done["type"] == "done", done
    assert done["text"] and 0 < len(done["tokens"]) <= 8
    assert out["receipt"]["receipt"] == done["receipt"]
