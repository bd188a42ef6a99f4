"""The OpenAI-style facade of client.js (`decoder.chat.completions.create`) on the tiny model:
streaming and not, its text equal to the SpecDecoder's own for the same request, the OpenAI
chunk and completion shapes, usage counts that add up, abort through an AbortSignal, and the
options it cannot honour refused with code bad_config. Then the embed example and the demo page
from a plain static server (no COOP/COEP/CORP headers, so not cross-origin isolated). One page
load serves the facade tests (the embed example's own decoder)."""

from __future__ import annotations

import pytest

from pyspec.cpu.model import Model
from pyspec.text.tokenizer import Tokenizer

from .pageutil import TIMEOUT_S, Context, native_generate

pytestmark = pytest.mark.browser

MESSAGES = [{"role": "user", "content": "the cat sat on the mat. the cat"}]
GREEDY = {"max_tokens": 40, "pyspec": {"k": "fixed:3"}}
SAMPLED = {"max_tokens": 40, "temperature": 0.8, "seed": 7, "pyspec": {"k": "fixed:3"}}


@pytest.fixture(scope="module")
def embed_page(browser, site_url):
    c = Context(browser, site_url)
    page = c.page("embed-example.html?model=tiny")
    page.wait_for_function("() => window.embed && (embed.decoder || embed.error)")
    assert page.evaluate("() => embed.error && `${embed.error.code}: ${embed.error.message}`") is None
    yield page
    c.ctx.close()
    assert not c.offsite, f"requests to other origins: {c.offsite}"


@pytest.fixture(scope="module")
def tiny_path(site_root):
    return str(site_root / "models" / "tiny.gguf")


_THREE_WAYS = """async ([messages, request]) => {
  const d = embed.decoder;
  const { pyspec = {}, ...openai } = request;
  let text = "";
  for await (const c of d.generate(messages, { ...openai, ...pyspec })) text += c.text;
  const { finish_reason, tokens, stats } = d.lastResult;
  const completion = await d.chat.completions.create({ messages, ...request });
  const chunks = [];
  for await (const c of await d.chat.completions.create({ messages, ...request, stream: true })) {
    chunks.push(c);
  }
  return { generate: { text, finish_reason, tokens, stats }, completion, chunks };
}"""


@pytest.mark.parametrize("request_", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_facade_equals_generate_in_the_openai_shape(embed_page, tiny_path, request_):
    out = embed_page.evaluate(_THREE_WAYS, [MESSAGES, request_])
    gen, completion, chunks = out["generate"], out["completion"], out["chunks"]
    assert gen["text"]
    want_finish = {"stop": "stop", "length": "length", "context": "length"}[gen["finish_reason"]]
    prompt_tokens = len(Tokenizer.from_metadata(Model.load(tiny_path).metadata)
                        .encode_chat(MESSAGES))
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(gen["tokens"]),
             "total_tokens": prompt_tokens + len(gen["tokens"])}

    # Not streaming: one chat.completion.
    assert completion["object"] == "chat.completion"
    assert completion["id"].startswith("chatcmpl-") and completion["model"] == "tiny"
    assert isinstance(completion["created"], int)
    [choice] = completion["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == want_finish
    assert choice["message"] == {"role": "assistant", "content": gen["text"]}
    assert completion["usage"] == usage
    stats = completion["pyspec"]["stats"]
    assert stats["generated_tokens"] == len(gen["tokens"]) and stats["drafted"] > 0
    assert stats["accepted"] == gen["stats"]["accepted"]
    assert completion["pyspec"]["receipt"]["stats"]["accepted"] == stats["accepted"]

    # Streaming: chat.completion.chunks, one id; the role first, finish_reason and usage last.
    assert len(chunks) >= 2
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"] != completion["id"]
    assert all(c["model"] == "tiny" and len(c["choices"]) == 1 for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant" and not any("role" in d for d in deltas[1:])
    assert "".join(d.get("content", "") for d in deltas) == gen["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + [
        want_finish]
    assert all("usage" not in c for c in chunks[:-1]) and chunks[-1]["usage"] == usage
    # Each content chunk names its tokens; they add up to completion_tokens.
    assert sum(c["pyspec"]["tokens"] for c in chunks[:-1]) == usage["completion_tokens"]
    assert chunks[-1]["pyspec"]["stats"]["accepted"] == stats["accepted"]


_ABORT = """async ([messages, request, abortAt]) => {
  const d = embed.decoder;
  const ac = new AbortController();
  const chunks = [];
  let at = null;
  const stream = await d.chat.completions.create({ messages, ...request, stream: true,
                                                   signal: ac.signal });
  for await (const c of stream) {
    chunks.push(c);
    if (chunks.length === abortAt) { ac.abort(); at = chunks.length; }
  }
  const early = new AbortController();
  early.abort();
  const preAborted = await d.chat.completions.create({ messages, ...request, signal: early.signal });
  const full = await d.chat.completions.create({ messages, ...request });
  return { chunks, at, preAborted, full };
}"""


def test_abort_signal_stops_the_stream_within_a_cycle(embed_page):
    request = {"max_tokens": 200, "pyspec": {"k": "fixed:3"}}
    out = embed_page.evaluate(_ABORT, [MESSAGES, request, 3])
    chunks, full = out["chunks"], out["full"]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "abort"
    assert last["pyspec"]["finish_reason"] == "cancelled"
    assert full["choices"][0]["finish_reason"] in ("length", "stop")
    full_text = full["choices"][0]["message"]["content"]
    assert full_text.startswith(text) and len(text) < len(full_text)
    # The cancel reaches the worker between cycles: at most a cycle or two still land.
    assert len(chunks) - 1 - out["at"] <= 2, len(chunks) - 1 - out["at"]
    assert last["usage"]["completion_tokens"] == sum(c["pyspec"]["tokens"] for c in chunks[:-1])
    assert last["usage"]["completion_tokens"] < full["usage"]["completion_tokens"]
    assert last["usage"]["prompt_tokens"] == full["usage"]["prompt_tokens"]
    # A signal aborted before the call: the request stops at its first chance.
    pre = out["preAborted"]
    assert pre["choices"][0]["finish_reason"] == "abort"
    assert full_text.startswith(pre["choices"][0]["message"]["content"])
    assert pre["usage"]["completion_tokens"] < full["usage"]["completion_tokens"]


_REFUSED = """async ([messages, options]) => {
  const out = [];
  for (const extra of options) {
    try {
      await embed.decoder.chat.completions.create({ messages, max_tokens: 4, ...extra });
      out.push(null);
    } catch (e) {
      out.push({ name: e.name, code: e.code, message: e.message });
    }
  }
  return out;
}"""


@pytest.mark.parametrize("option, value, words", [
    ("top_p", 0, "top_p must be a number in (0, 1]"),
    ("stop", 5, "stop must be a string or object"),
    ("logit_bias", {"a": 1}, "logit_bias key 'a'"),
    ("response_format", {"type": "json_object"}, "json_object without a schema"),
    ("n", 2, "n 2 is not supported: only 1"),
    ("logprobs", True, "logprobs true is not supported: only false"),
    ("stream_options", {"include_obfuscation": True}, "only {include_usage}"),
    ("best_of", 2, "unknown option best_of"),
    ("model", "gpt-4o", "model gpt-4o is not loaded"),
    ("temperature", "hot", "temperature must be a number"),
    # JSON would make these null, that is the default: refused by name instead
    ("temperature", float("nan"), "temperature must be a finite number, got NaN"),
    ("top_p", float("inf"), "top_p must be a finite number, got Infinity"),
    ("logit_bias", {"101": float("-inf")}, "logit_bias.101 must be a finite number"),
])
def test_options_it_cannot_honour_are_refused_by_name(embed_page, option, value, words):
    [refused, accepted] = embed_page.evaluate(_REFUSED, [MESSAGES, [{option: value}, {option: None}]])
    assert refused["name"] == "SpecError" and refused["code"] == "bad_config"
    assert words in refused["message"], refused
    assert accepted is None          # null means "not given", as in JSON: the request runs


_SEEDS = """async ([messages]) => {
  const d = embed.decoder;
  const ask = async (extra) => {
    const r = await d.chat.completions.create({
      messages, max_tokens: 12, temperature: 1.0, n: 1, logprobs: false,
      stream_options: { include_usage: true }, ...extra });
    return [r.choices[0].message.content, r.pyspec.receipt.seed];
  };
  const first = await ask({}), second = await ask({});
  return { first, second, again: await ask({ seed: first[1] }),
           greedy: await ask({ temperature: 0 }), given: await ask({ seed: 7 }) };
}"""


def test_a_sampled_request_without_a_seed_draws_its_own(embed_page):
    """As OpenAI's: above temperature 0, two requests without a seed sample with two seeds (a
    "regenerate" gets another answer); the receipt records the seed, and the same request with
    it gives the same text again. A given seed is the request's; at temperature 0 none is
    drawn (greedy reads no random numbers). n 1, logprobs false and stream_options are taken."""
    out = embed_page.evaluate(_SEEDS, [MESSAGES])
    first, second = out["first"], out["second"]
    assert first[1] != second[1]
    assert all(isinstance(s, int) and 0 <= s < 2 ** 53 for s in (first[1], second[1]))
    assert out["again"] == first
    assert out["greedy"][1] == 0 and out["given"][1] == 7


def test_sampling_controls_and_stop_through_the_facade_equal_native(embed_page, tiny_path):
    """OpenAI's top_p, frequency_penalty, logit_bias and stop, and repetition_penalty (as WebLLM
    takes it), through create(): the native engine's text for the same controls, cut before
    the stop string with finish_reason "stop"."""
    controls = {"top_p": 0.85, "frequency_penalty": 0.5, "repetition_penalty": 1.2,
                "logit_bias": {"101": 1.5}}
    uncut = native_generate(tiny_path, MESSAGES, "ngram", max_tokens=40, temperature=0.8,
                            seed=7, k="fixed:3", **controls)
    stop = uncut.text[len(uncut.text) // 2:][:2]
    native = native_generate(tiny_path, MESSAGES, "ngram", max_tokens=40, temperature=0.8,
                             seed=7, k="fixed:3", stop=(stop,), **controls)
    out = embed_page.evaluate(_THREE_WAYS, [MESSAGES, {**SAMPLED, **controls, "stop": stop}])
    assert out["completion"]["choices"][0]["message"]["content"] == native.text
    assert out["completion"]["choices"][0]["finish_reason"] == "stop"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in out["chunks"]) == \
        native.text
    assert out["generate"]["tokens"] == native.tokens


SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12}, "temp_c": {"type": "number"},
    "sky": {"enum": ["sunny", "rain"]}}, "required": ["city", "temp_c", "sky"]}


def test_response_format_json_schema_equals_native(embed_page, tiny_path):
    """OpenAI's response_format {type: "json_schema", ...} through create() and generate(): the
    native engine's text under the same schema, which parses and follows it (forced tokens
    counted); a keyword outside the subset is refused by name."""
    import json

    native = native_generate(tiny_path, MESSAGES, "ngram", max_tokens=120, k="fixed:3",
                             json_schema=SCHEMA)
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA, "strict": True}}
    out = embed_page.evaluate(_THREE_WAYS, [MESSAGES, {**GREEDY, "max_tokens": 120,
                                                       "response_format": fmt}])
    assert out["completion"]["choices"][0]["message"]["content"] == native.text
    assert out["generate"]["tokens"] == native.tokens
    assert out["generate"]["stats"]["forced_tokens"] == native.stats["forced_tokens"] > 0
    if native.finish_reason == "stop":
        value = json.loads(native.text)
        assert list(value) == ["city", "temp_c", "sky"] and len(value["city"]) <= 12
    bad = {"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "a"}}}
    [err] = embed_page.evaluate(_REFUSED, [MESSAGES, [{"response_format": bad}]])
    assert err["code"] == "bad_config" and "'pattern'" in err["message"]


_STREAM_REFUSED = """async ([messages, options]) => {
  const out = [];
  for (const extra of options) {
    let at = "create";     // where it was refused
    try {
      const stream = await embed.decoder.chat.completions.create({ messages, max_tokens: 4,
                                                                   stream: true, ...extra });
      at = "stream";
      let text = "";
      for await (const c of stream) text += c.choices[0].delta.content ?? "";
      out.push({ text });
    } catch (e) {
      out.push({ at, code: e.code, message: e.message });
    }
  }
  return out;
}"""


def test_a_streaming_request_is_checked_before_create_resolves(embed_page):
    """A value only the worker judges (top_p 0, a k policy it does not know) rejects the
    `await create({stream: true})` itself, as the OpenAI SDK's does, not the first chunk."""
    out = embed_page.evaluate(_STREAM_REFUSED, [MESSAGES, [{"top_p": 0},
                                                           {"pyspec": {"k": "often"}},
                                                           {"top_p": 0.9}]])
    for refused, word in zip(out, ["top_p", "often"]):
        assert refused["at"] == "create" and refused["code"] == "bad_config", refused
        assert word in refused["message"], refused
    assert out[2]["text"], out[2]


def test_a_bad_request_from_the_worker_keeps_its_code(embed_page):
    [err] = embed_page.evaluate(_REFUSED, [MESSAGES, [{"pyspec": {"k": "often"}}]])
    assert err["code"] == "bad_config" and "often" in err["message"]
    [err] = embed_page.evaluate(_REFUSED, [[{"role": "user"}], [{}]])
    assert err["code"] == "bad_config"


_NO_HEADERS = """async ([messages, request]) => {
  const completion = await embed.decoder.chat.completions.create({ messages, ...request });
  return { isolated: self.crossOriginIsolated, sab: typeof SharedArrayBuffer,
           content: completion.choices[0].message.content, adapter: embed.decoder.info.adapter };
}"""


def test_embed_example_runs_from_a_plain_static_server(browser, plain_site_url, tiny_path):
    """No COOP/COEP/CORP headers (GitHub Pages, a bare CDN): the page is not cross-origin
    isolated, and the client still loads and decodes exactly."""
    c = Context(browser, plain_site_url)
    try:
        page = c.ctx.new_page()
        response = page.goto(plain_site_url + "embed-example.html?model=tiny")
        headers = {k.lower() for k in response.all_headers()}
        assert not headers & {"cross-origin-opener-policy", "cross-origin-embedder-policy",
                              "cross-origin-resource-policy"}
        page.wait_for_function("() => window.embed && (embed.decoder || embed.error)",
                               timeout=1000 * TIMEOUT_S)
        assert page.evaluate(
            "() => embed.error && `${embed.error.code}: ${embed.error.message}`") is None
        out = page.evaluate(_NO_HEADERS, [MESSAGES, GREEDY])
        # The page's own button (generate() streaming into the page) works too.
        page.fill("#prompt", MESSAGES[0]["content"])
        page.click("#go")
        page.wait_for_function("() => embed.result || embed.error")
        shown = page.text_content("#out")
    finally:
        c.ctx.close()
    assert not c.offsite, f"requests to other origins: {c.offsite}"
    assert out["isolated"] is False
    native = native_generate(tiny_path, MESSAGES, "ngram", max_tokens=40, k="fixed:3")
    assert out["content"] == native.text
    assert shown and native_generate(tiny_path, MESSAGES, "ngram", max_tokens=128).text == shown


def test_the_site_ships_the_types(site_root):
    """client.d.ts goes to the site beside client.js, its SpecErrorCode union up to date."""
    from webtools import errorcodes

    shipped = (site_root / "client.d.ts").read_text()
    assert shipped == errorcodes.DTS.read_text()
    assert errorcodes.render(shipped, errorcodes.codes()) == shipped


def test_demo_page_runs_from_a_plain_static_server(browser, plain_site_url, tiny_path):
    from .pageutil import ready, run

    c = Context(browser, plain_site_url)
    try:
        page = c.page("index.html?model=tiny")
        ready(page)
        assert page.evaluate("() => self.crossOriginIsolated") is False
        result = run(page, MESSAGES[0]["content"], {"max_tokens": 24, "k": "fixed:3"})
    finally:
        c.ctx.close()
    assert not c.offsite, f"requests to other origins: {c.offsite}"
    assert result["text"] == native_generate(tiny_path, MESSAGES, "none", max_tokens=24).text
