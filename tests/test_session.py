"""The worker's Python side (pyspec/apps/session.py) without a browser: make_engine's backend choice and the
Session's JSON protocol, on the tiny model.

WebGPU here is either the native device (lavapipe on CI), standing in for navigator.gpu's, or a
fake that only answers make_engine's questions (a software adapter, no adapter, a shader error):
the fakes test plumbing, the native device tests that the page's GPU path serves requests.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import requires_gpu
from pyspec.drafters import parse_draft
from pyspec.formats.gguf import GGUFFile
from pyspec.gpu.device import GPUError, NoAdapterError
from pyspec.options import Options
from pyspec.apps import page_engine, page_load, session

ROOT = Path(__file__).resolve().parent.parent
MESSAGES = json.dumps([{"role": "user", "content": "the cat sat on the mat. the cat"}])


class SoftwareAdapter:
    """A device that says it is a software renderer (SwiftShader's isFallbackAdapter)."""

    name, is_cpu, destroyed = "SwiftShader (fake)", True, False

    def destroy(self):
        self.destroyed = True


def opener(result):
    async def open_device():
        if isinstance(result, Exception):
            raise result
        return result
    return open_device


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def champion_bytes(tiny):
    return Path(tiny.champion_path).read_bytes()


def engine(tiny, champion_bytes, backend="auto", open_device=None, previous=None):
    file = GGUFFile(champion_bytes, "champion")
    return run(session.make_engine(file, tiny.tokenizer, "ngram", 256, previous, backend,
                               open_device or opener(NoAdapterError("no adapter"))))


# --- make_engine: the backend choice -----------------------------------------------------------
@pytest.mark.parametrize("backend, device, kind", [
    ("cpu", SoftwareAdapter(), "cpu_requested"),
    ("auto", SoftwareAdapter(), "software_adapter"),
    ("auto", NoAdapterError("navigator.gpu is undefined"), "no_webgpu"),
    ("webgpu", GPUError("shader rejected"), "webgpu_error"),
])
def test_make_engine_falls_back_to_numpy_and_says_why(tiny, champion_bytes, backend, device,
                                                      kind):
    e = engine(tiny, champion_bytes, backend, opener(device))
    assert e.adapter == "cpu-numpy"
    assert e.fallbacks == [{"kind": kind, "adapter": "cpu-numpy"}]
    assert e.fallback_reason
    if isinstance(device, SoftwareAdapter) and backend == "auto":
        assert device.destroyed, "a refused adapter's device is given back"
    r = e.generate(tiny.prompt, Options(max_tokens=4))
    assert r.receipt["fallbacks"] == e.fallbacks


def test_make_engine_keeps_a_cpu_choice_for_the_next_drafter(tiny, champion_bytes):
    first = engine(tiny, champion_bytes, "auto", opener(SoftwareAdapter()))
    second = run(session.make_engine(GGUFFile(champion_bytes, "c"), tiny.tokenizer, "self:1", 256,
                                 first, "auto", opener(AssertionError("not asked again"))))
    assert second.champion is first.champion
    assert second.fallbacks == first.fallbacks and second.fallback_reason == first.fallback_reason


def test_make_engine_refuses_an_unknown_backend(tiny, champion_bytes):
    with pytest.raises(session.SessionError) as e:
        engine(tiny, champion_bytes, "metal")
    assert e.value.code == "bad_config"


@requires_gpu
def test_make_engine_uses_a_hardware_adapter_and_recovers_on_a_new_device_or_the_cpu(
        tiny, champion_bytes):
    from pyspec.gpu import open_device

    devices = [open_device(), open_device()]   # its own: recover destroys them
    given = iter(devices)

    async def open_next():
        return next(given)

    e = engine(tiny, champion_bytes, "webgpu", open_next)
    assert e.adapter == devices[0].name and e.fallbacks == [] and e.recover is not None
    cpu = engine(tiny, champion_bytes, "cpu")
    opts = Options(max_tokens=12, stop_at_eos=False)
    assert e.generate(tiny.prompt, opts).tokens == cpu.generate(tiny.prompt, opts).tokens
    # Another drafter reuses the champion already on the device.
    again = run(session.make_engine(e.champion.file, tiny.tokenizer, "self:1", 256, e, "webgpu",
                                opener(AssertionError("the device is not opened twice"))))
    assert again.champion is e.champion
    # A lost device is replaced by a new one; any other fault (the device still alive) gives
    # that device back and goes on on the CPU.
    devices[0].destroy()
    replaced = run(e.recover())
    assert replaced.champion.dev is devices[1] and replaced.drafter is None
    assert run(e.recover()).adapter == "cpu-numpy" and devices[1].lost is not None


# --- Session: the JSON protocol ----------------------------------------------------------------
def test_session_serves_requests_and_reports_errors_by_code(tiny, champion_bytes):
    s = session.Session(opener(NoAdapterError("none here")))
    err = json.loads(run(s.generate(1, MESSAGES, "{}", lambda *a: None)))["error"]
    assert err["code"] == "not_ready"

    info = json.loads(run(s.load(json.dumps({"max_ctx": 128}), champion_bytes)))
    assert info["adapter"] == "cpu-numpy" and info["context"] == 128 and info["draft"] == "ngram"
    assert info["fallback"] and info["fallback_kind"] == "no_webgpu"

    chunks = []
    done = json.loads(run(s.generate(2, MESSAGES, json.dumps({"max_tokens": 8}),
                                     lambda offset, text, n, ids, cycle, marks:
                                     chunks.append((offset, text, n)))))
    assert "".join(t for _, t, _ in chunks) == done["text"]
    assert [o for o, _, _ in chunks] == sorted(o for o, _, _ in chunks)
    assert done["stats"]["generated_tokens"] == len(done["tokens"]) <= 8
    assert json.loads(s.stats())["stats"] == done["stats"]
    assert json.loads(s.receipt())["receipt"] == done["receipt"]

    def code(config, messages=MESSAGES):
        out = json.loads(run(s.generate(3, messages, json.dumps(config), lambda *a: None)))
        return out["error"]["code"]

    assert code({"k": "often"}) == "bad_config"
    assert code({"draft": "self:99"}) == "bad_config"
    assert code({"draft": "model"}) == "bad_config"   # no draft model was given at init
    assert code({"temperature": -1}) == "bad_config"
    assert code({}, messages='[{"role": "user"}]') == "bad_config"
    # A misspelt option is refused by name, never run with the default.
    out = json.loads(run(s.generate(3, MESSAGES, json.dumps({"temprature": 1, "max_tokens": 4}),
                                    lambda *a: None)))
    assert out["error"]["code"] == "bad_config" and "temprature" in out["error"]["message"]
    assert json.loads(run(s.load('{"max_ctx": 64, "warmup": true}', champion_bytes))
                      )["error"]["code"] == "bad_config"
    long = json.dumps([{"role": "user", "content": "the cat " * 200}])
    assert code({}, messages=long) == "prompt_too_long"

    bad = json.loads(run(s.load("{}", champion_bytes[:len(champion_bytes) // 2])))["error"]
    assert bad["code"] == "bad_model"
    assert json.loads(run(s.load("[]", champion_bytes)))["error"]["code"] == "bad_config"


def test_the_client_checks_the_backends_the_session_takes():
    """The client refuses a backend before anything loads (web/checks.js, its own BACKENDS): the
    list must be page_engine.py's, or a backend the engine takes would be refused in the page,
    or the reverse."""
    source = (Path(__file__).resolve().parent.parent / "web" / "checks.js").read_text()
    listed = re.search(r"const BACKENDS = \[([^\]]*)\]", source)
    assert listed, "web/checks.js has no BACKENDS list"
    assert tuple(re.findall(r'"([^"]+)"', listed.group(1))) == page_engine.BACKENDS


def test_a_model_too_large_for_memory_is_out_of_memory_and_the_old_one_stays(
        tiny, champion_bytes, monkeypatch):
    """A MemoryError while loading (the page's wasm heap cannot hold the model) is
    out_of_memory saying what to do, not internal with a traceback; the model loaded before
    still serves."""
    s = session.Session(opener(NoAdapterError("none here")))
    run(s.load(json.dumps({"max_ctx": 64}), champion_bytes))

    def too_large(*args, **kw):
        raise MemoryError
    monkeypatch.setattr(session, "make_engine", too_large)
    err = json.loads(run(s.load(json.dumps({"max_ctx": 128}), champion_bytes)))["error"]
    assert err["code"] == "out_of_memory", err
    assert "does not fit in this page's memory (MemoryError)" in err["message"]
    assert "smaller model" in err["message"] and "Traceback" not in err["message"]
    monkeypatch.undo()
    out = json.loads(run(s.generate(1, MESSAGES, json.dumps({"max_tokens": 3}), lambda *a: None)))
    assert out["stats"]["generated_tokens"] == 3


def test_a_warm_session_prefills_the_chat_prefix_before_the_first_request(tiny, champion_bytes):
    """init option warm: the template's system turn is in the cache when the first request comes
    (load returns first and starts nothing; warm(), which the worker calls once ready is posted,
    starts it; generate waits for it), and the request gives the same tokens and the same cache
    rows as a cold session. A request that comes before warm() prefills for itself."""
    async def first_request(warm: bool, early: bool = False):
        s = session.Session(opener(NoAdapterError("none here")))
        await s.load(json.dumps({"max_ctx": 128, "warm": warm}), champion_bytes)
        assert s.warming is None and (s.warm_next is not None) == warm
        if not early:
            s.warm()
        assert (s.warming is not None) == (warm and not early)
        done = await s.generate(1, MESSAGES, json.dumps({"max_tokens": 12}), lambda *a: None)
        s.warm()   # too late: the request took the cache
        assert s.warming is None and s.warm_next is None
        return s, json.loads(done)

    prefix = page_load.chat_prefix(tiny.tokenizer)
    (warm_s, warm), (cold_s, cold) = run(first_request(True)), run(first_request(False))
    _, early = run(first_request(True, early=True))
    assert early["tokens"] == cold["tokens"] and early["stats"]["reused_tokens"] == 0
    assert 0 < len(prefix) < warm["stats"]["prompt_tokens"]
    assert warm["tokens"] == cold["tokens"]
    assert warm["stats"]["reused_tokens"] == len(prefix) and cold["stats"]["reused_tokens"] == 0
    assert warm["stats"]["prefill_tokens"] == cold["stats"]["prefill_tokens"] - len(prefix)
    n = warm_s.engine.kv.committed
    assert n == cold_s.engine.kv.committed
    assert np.array_equal(warm_s.engine.kv.k[:, :n], cold_s.engine.kv.k[:, :n])
    assert np.array_equal(warm_s.engine.kv.v[:, :n], cold_s.engine.kv.v[:, :n])


def test_session_cancel_only_touches_the_running_request(tiny, champion_bytes):
    s = session.Session(opener(NoAdapterError("none here")))
    run(s.load("{}", champion_bytes))
    assert json.loads(s.cancel(7)) == {"cancelled": False}
    seen = []

    def on_chunk(offset, text, n, ids, cycle, marks):
        seen.append(text)
        marks = json.loads(marks)
        assert len(marks["kinds"]) == len(marks["starts"]) == n == len(json.loads(ids))
        if len(seen) == 2:
            assert json.loads(s.cancel(9)) == {"cancelled": True}

    done = json.loads(run(s.generate(9, MESSAGES, json.dumps({"max_tokens": 40, "k": "fixed:0"}),
                                     on_chunk)))
    assert done["finish_reason"] == "cancelled" and len(seen) == 2
    assert s.running is None and not s.cancelled


def test_a_request_cancelled_while_it_waits_ends_before_its_first_cycle(tiny, champion_bytes):
    """worker.js cancels a request it holds queued behind another (or being set up) with
    waiting=True: the request then ends at once when its turn comes, text empty, finish_reason
    cancelled, and the session forgets the id; the next request runs as usual."""
    s = session.Session(opener(NoAdapterError("none here")))
    run(s.load("{}", champion_bytes))
    assert json.loads(s.cancel(4, waiting=True)) == {"cancelled": True}
    seen = []
    done = json.loads(run(s.generate(4, MESSAGES, json.dumps({"max_tokens": 8}),
                                     lambda *a: seen.append(a))))
    assert done == {"text": "", "tokens": None, "finish_reason": "cancelled", "stats": None,
                    "receipt": None}
    assert not seen and not s.cancelled and s.running is None
    after = json.loads(run(s.generate(5, MESSAGES, json.dumps({"max_tokens": 4}),
                                      lambda *a: None)))
    assert after["finish_reason"] == "length" and after["stats"]["generated_tokens"] == 4


def test_session_resumes_from_the_ids_its_chunks_carried(tiny, champion_bytes):
    """What client.js does after a worker death: a new Session, the same request with resume
    {ids of the chunks received, fault}; its chunks continue at the next offset and the result is
    the undisturbed one (greedy and replay); the receipt records the fault, never the ids."""
    for config in ({"max_tokens": 24, "k": "fixed:3"},
                   {"max_tokens": 24, "k": "fixed:3", "temperature": 0.8, "seed": 9}):
        s = session.Session(opener(NoAdapterError("none here")))
        run(s.load("{}", champion_bytes))
        chunks = []
        full = json.loads(run(s.generate(1, MESSAGES, json.dumps(config),
                                         lambda *a: chunks.append(a))))
        assert [t for c in chunks for t in json.loads(c[3])] == full["tokens"]
        assert [c[4] for c in chunks] == sorted(c[4] for c in chunks)   # cycle counts grow
        got = chunks[:len(chunks) // 2]
        shown = "".join(c[1] for c in got)
        resume = {"ids": [t for c in got for t in json.loads(c[3])],
                  "fault": {"kind": "worker_died", "cycle": got[-1][4], "restart_s": 1.5}}
        fresh = session.Session(opener(NoAdapterError("none here")))
        run(fresh.load("{}", champion_bytes))
        more = []
        done = json.loads(run(fresh.generate(2, MESSAGES, json.dumps(config),
                                             lambda *a: more.append(a), json.dumps(resume))))
        assert more[0][0] == len(shown)
        assert shown + "".join(c[1] for c in more) == full["text"] == done["text"]
        assert done["tokens"] == full["tokens"]
        [fault] = done["receipt"]["faults"]
        assert fault["kind"] == "worker_died" and fault["cycle"] == got[-1][4]
        assert fault["at_token"] == len(resume["ids"]) and fault["recovery_s"] >= 1.5
        assert done["receipt"]["stats"]["resumed_tokens"] == len(resume["ids"])
        assert json.dumps(resume["ids"][:4])[1:-1] not in json.dumps(done["receipt"])
    for bad in ('{"ids": "1 2"}', "[1, 2]", '{"ids": [1], "fault": {"kind": "my text"}}',
                '{"ids": [1], "fault": {"kind": "worker_died", "cycle": -1}}',
                '{"ids": [99999]}'):
        err = json.loads(run(fresh.generate(3, MESSAGES, "{}", lambda *a: None, bad)))["error"]
        assert err["code"] == "bad_config", bad


def test_fault_drills_need_drills_switched_on(tiny, champion_bytes):
    s = session.Session(opener(NoAdapterError("none here")))
    run(s.load("{}", champion_bytes))
    assert json.loads(s.lose_device())["error"]["code"] == "bad_request"
    drill = json.dumps({"drill": "device-lost@2"})
    err = json.loads(run(s.generate(1, MESSAGES, drill, lambda *a: None)))["error"]
    assert err["code"] == "bad_config" and "drills on" in err["message"]
    run(s.load('{"drills": true}', champion_bytes))
    assert json.loads(s.lose_device()) == {"lost": False}     # the CPU engine has no device
    for spec, why in (("device-lost@2", "WebGPU engine"), ("meteor@2", "KIND@CYCLE"),
                      ("device-lost", "KIND@CYCLE")):
        err = json.loads(run(s.generate(1, MESSAGES, json.dumps({"drill": spec}),
                                        lambda *a: None)))["error"]
        assert err["code"] == "bad_config" and why in err["message"], spec


# Requests a page (or a hostile embedder) may send: each gets a typed error, never `internal`.
MALFORMED_CONFIGS = [
    "", "{", "null", "[]", "5", '"x"', "[" * 10_000 + "]" * 10_000,
    '{"max_tokens": 1' + "0" * 5000 + "}",
    '{"max_tokens": "8"}', '{"max_tokens": 8.5}', '{"max_tokens": true}', '{"max_tokens": 0}',
    '{"max_tokens": -3}', '{"temperature": "hot"}', '{"temperature": [1]}', '{"temperature": -1}',
    '{"seed": 1.5}', '{"seed": -1}', '{"seed": 18446744073709551616}', '{"verify": 1}',
    '{"verify": "maybe"}', '{"verify": "greedy", "temperature": 0.5}', '{"k": 3}', '{"k": {}}',
    '{"k": "fixed:-1"}', '{"draft": 5}', '{"draft": "self:99"}',
    '{"draft": "model"}', '{"draft": "/etc/passwd.gguf"}',
]
MALFORMED_MESSAGES = [
    "", "not json", "null", "5", '"hi"', '{"role": "user", "content": "x"}', "[1]", "[null]",
    '[{"content": "x"}]', '[{"role": "user"}]', '[{"role": "robot", "content": "x"}]',
    '[{"role": "user", "content": 5}]', '[{"role": "user", "content": ["x"]}]',
    '[{"role": "user", "content": "\\ud800"}]', "[" * 10_000 + "]" * 10_000,
]
MALFORMED_OPTIONS = ["", "[]", "null", '{"max_ctx": "big"}', '{"max_ctx": 0}',
                     '{"max_ctx": -1}', '{"max_ctx": 1.5}', '{"backend": "metal"}',
                     '{"backend": 1}', '{"draft": 3}', '{"draft": "self:99"}',
                     '{"draft": "model"}', '{"champion_name": ["x"]}']


def test_session_refuses_malformed_requests_by_code_and_stays_usable(tiny, champion_bytes):
    s = session.Session(opener(NoAdapterError("none here")))
    run(s.load(json.dumps({"max_ctx": 64}), champion_bytes))
    good = json.dumps({"max_tokens": 4})
    reference = json.loads(run(s.generate(1, MESSAGES, good, lambda *a: None)))
    assert reference["text"] is not None

    def refused(out: str, what) -> None:
        err = json.loads(out).get("error")
        assert err is not None, what
        assert err["code"] == "bad_config", (what, err)
        assert "Traceback" not in err["message"], (what, err)

    for config in MALFORMED_CONFIGS:
        refused(run(s.generate(2, MESSAGES, config, lambda *a: None)), config[:60])
    for messages in MALFORMED_MESSAGES:
        refused(run(s.generate(3, messages, good, lambda *a: None)), messages[:60])
    for options in MALFORMED_OPTIONS:
        refused(run(s.load(options, champion_bytes)), options)
    # A failed init changed nothing: the model loaded before still serves, with its context.
    assert s.max_ctx == 64 and s.default_draft == "ngram" and s.running is None
    again = json.loads(run(s.generate(4, MESSAGES, good, lambda *a: None)))
    assert again["text"] == reference["text"] and again["tokens"] == reference["tokens"]
    # null is the default, as an absent field is.
    nulls = json.dumps({"max_tokens": 4, "temperature": None, "seed": None, "k": None,
                        "verify": None, "draft": None})
    assert json.loads(run(s.generate(5, MESSAGES, nulls, lambda *a: None)))["tokens"] == \
        reference["tokens"]


def test_only_reading_the_request_is_blamed_on_it(tiny, champion_bytes, monkeypatch):
    """bad_config is for a request that fails its checks; an engine that cannot be built for a
    valid one is worker_oom when memory ran out (client.js resumes on a new worker), else
    internal. A checked request calls on_start once before it runs (worker.js's `started`,
    which the facade's create() waits for); a refused one never does."""
    s = session.Session(opener(NoAdapterError("none here")))
    run(s.load(json.dumps({"max_ctx": 64}), champion_bytes))
    started = []

    def generate(config):
        return json.loads(run(s.generate(1, MESSAGES, json.dumps(config), lambda *a: None,
                                         "null", lambda: started.append(len(started)))))

    assert generate({"max_tokens": 2})["tokens"] and started == [0]
    assert generate({"top_p": 0})["error"]["code"] == "bad_config" and started == [0]
    for failure, code in [(MemoryError("wasm heap"), "worker_oom"), (RuntimeError("a bug"),
                                                                      "internal")]:
        async def failing(*args, failure=failure, **kwargs):
            raise failure
        monkeypatch.setattr(session, "make_engine", failing)
        err = generate({"max_tokens": 2, "draft": "none"})["error"]   # a new engine for "none"
        assert err["code"] == code, err
    assert started == [0]


# --- the one rule the page keeps about drafts --------------------------------------------------
def test_session_takes_the_sampling_controls_by_their_openai_names(tiny, champion_bytes):
    """A generate config's sampling controls and stop reach the engine (the same tokens as
    Engine.generate with those Options); wrong types and values are bad_config by name."""
    s = session.Session(opener(NoAdapterError("none here")))
    run(s.load(json.dumps({"max_ctx": 128, "draft": "ngram"}), champion_bytes))
    config = {"max_tokens": 10, "temperature": 0.9, "seed": 4, "top_p": 0.8, "top_k": 40,
              "min_p": 0.02, "repetition_penalty": 1.3, "presence_penalty": 0.4,
              "frequency_penalty": 0.3, "logit_bias": {"101": 2}}
    done = json.loads(run(s.generate(1, MESSAGES, json.dumps(config), lambda *a: None)))
    prompt = tiny.tokenizer.encode_chat(json.loads(MESSAGES))
    opts = Options(**{**config, "logit_bias": {101: 2}})
    assert done["tokens"] == s.engine.generate(prompt, opts).tokens
    stop = done["text"][2:4]
    cut = json.loads(run(s.generate(2, MESSAGES, json.dumps({**config, "stop": stop}),
                                    lambda *a: None)))
    assert cut["text"] == done["text"][:done["text"].find(stop)]
    assert cut["finish_reason"] == "stop"
    for bad, word in [({"top_p": "0.5"}, "top_p"), ({"top_p": 0}, "top_p"),
                      ({"logit_bias": [1]}, "logit_bias"), ({"logit_bias": {"x": 1}}, "x"),
                      ({"stop": ["a"] * 5}, "stop"), ({"stop": 3}, "stop"),
                      ({"repetition_penalty": -1}, "repetition_penalty")]:
        err = json.loads(run(s.generate(3, MESSAGES, json.dumps(bad), lambda *a: None)))["error"]
        assert err["code"] == "bad_config" and word in err["message"], (bad, err)


def test_worker_js_knows_which_drafts_need_weights():
    """web/worker.js fetches draft weights into OPFS unless the draft matches NON_MODEL_DRAFTS;
    that must be exactly parse_draft's `needs_weights`."""
    source = (ROOT / "web" / "worker.js").read_text()
    pattern = re.search(r"const NON_MODEL_DRAFTS = /(.+)/;", source).group(1)
    for spec in ("none", "ngram", "self:1", "self:12", "self:29", "model", "model:d.gguf",
                 "drafts/d.gguf", "smollm2-draft", "ngram+model", "ngram+d.gguf"):
        try:
            needs = parse_draft(spec).needs_weights
        except ValueError:   # not a spec pyspec knows: the worker resolves it as a model name
            needs = True
        assert (re.fullmatch(pattern, spec) is None) == needs, spec


def test_an_unanswered_adapter_request_is_no_adapter_not_a_hang(monkeypatch):
    """requestAdapter / requestDevice that never answer (a GPU process restarting) end in
    NoAdapterError after ANSWER_TIMEOUT_S, which make_engine turns into the CPU fallback."""
    from pyspec.gpu import browser
    from pyspec.gpu.device import NoAdapterError

    monkeypatch.setattr(browser, "ANSWER_TIMEOUT_S", 0.05)

    async def go():
        never = asyncio.get_running_loop().create_future()
        return await browser._answer(never, "navigator.gpu.requestAdapter")

    with pytest.raises(NoAdapterError, match="requestAdapter gave no answer in 0.05 s"):
        asyncio.run(go())


def test_the_page_combines_ngram_with_its_draft_model(tiny, champion_bytes):
    """draft "ngram+model": n-gram where the text repeats, the draft model given at init
    elsewhere (drafters/combo.py); the tokens are champion-only's. Without a draft model it is
    bad_config, as "model" is."""
    s = session.Session(opener(NoAdapterError("none here")))
    run(s.load(json.dumps({"max_ctx": 128, "draft": "none"}), champion_bytes,
               Path(tiny.close_path).read_bytes()))
    config = {"max_tokens": 24, "k": "fixed:3"}
    alone = json.loads(run(s.generate(1, MESSAGES, json.dumps({**config, "draft": "none"}),
                                      lambda *a: None)))
    both = json.loads(run(s.generate(2, MESSAGES, json.dumps({**config, "draft": "ngram+model"}),
                                     lambda *a: None)))
    assert both["tokens"] == alone["tokens"] and both["stats"]["drafted"] > 0
    assert both["stats"]["drafter"].startswith("ngram+") and both["receipt"]["draft"]["kind"] == \
        "combo"
    bare = session.Session(opener(NoAdapterError("none here")))
    run(bare.load(json.dumps({"max_ctx": 128}), champion_bytes))
    err = json.loads(run(bare.generate(1, MESSAGES, json.dumps({"draft": "ngram+model"}),
                                       lambda *a: None)))["error"]
    assert err["code"] == "bad_config" and "ngram+model" in err["message"]


def test_the_page_runs_its_draft_with_the_reduced_head_it_is_given(tiny, champion_bytes):
    """init's draft_vocab (the site's DRAFT.vocab.json, fetched by the worker) cuts the draft's
    head as the CLI's sidecar does (load.parse_reduced_head, Model.reduce_head): the ready
    message says how many rows, the tokens are champion-only's though the champion says ids the
    head cut, and a broken one is bad_model, naming the file, with the session as it was."""
    ids = [i for i in range(tiny.champion.config.vocab_size) if i % 3]
    vocab = json.dumps({"schema": "pyspec.draft-vocab/1", "head_rows": len(ids), "ids": ids})
    s = session.Session(opener(NoAdapterError("none here")))
    draft = Path(tiny.close_path).read_bytes()
    info = json.loads(run(s.load(json.dumps({"max_ctx": 128, "draft": "none",
                                             "draft_name": "close.gguf",
                                             "draft_vocab": vocab}), champion_bytes, draft)))
    assert info["draft_head_rows"] == len(ids) and len(s.draft_model.head_ids) == len(ids)
    config = {"max_tokens": 32}
    alone = json.loads(run(s.generate(1, MESSAGES, json.dumps({**config, "draft": "none"}),
                                      lambda *a: None)))
    assert any(t % 3 == 0 for t in alone["tokens"]), "the champion must say an id the head cut"
    cut = json.loads(run(s.generate(2, MESSAGES, json.dumps({**config, "draft": "model",
                                                             "k": "fixed:3"}), lambda *a: None)))
    assert cut["tokens"] == alone["tokens"]
    assert 0 < cut["stats"]["accepted"] < cut["stats"]["drafted"]
    bad = json.dumps({"schema": "pyspec.draft-vocab/1", "head_rows": 2, "ids": [1, 99999]})
    err = json.loads(run(s.load(json.dumps({"draft_name": "close.gguf", "draft_vocab": bad}),
                                champion_bytes, draft)))["error"]
    assert err["code"] == "bad_model" and "close.gguf's vocab.json" in err["message"]
    assert "delete it" in err["message"] and len(s.draft_model.head_ids) == len(ids)
    plain = json.loads(run(s.load(json.dumps({"max_ctx": 128}), champion_bytes, draft)))
    assert plain["draft_head_rows"] is None


def test_the_sites_reduced_head_is_left_out_for_a_draft_of_another_vocabulary(
        tiny, champion_bytes, tmp_path):
    """The worker sends the site's DRAFT.vocab.json with a manifest draft whatever the champion
    (draft_vocab_shipped): with another vocabulary the draft runs bridged on its full head, as
    in the CLI; a reduced head the caller gave for such a draft is refused by name."""
    from pyspec import testmodels

    foreign = tmp_path / "foreign.gguf"
    testmodels.write_model(foreign, seed=2, tokenizer=testmodels.tokenizer_metadata(n_merges=40))
    ids = list(range(0, 300, 2))
    vocab = json.dumps({"schema": "pyspec.draft-vocab/1", "head_rows": len(ids), "ids": ids})
    s = session.Session(opener(NoAdapterError("none here")))
    load = {"max_ctx": 128, "draft": "model", "draft_name": "foreign.gguf", "draft_vocab": vocab}
    info = json.loads(run(s.load(json.dumps({**load, "draft_vocab_shipped": True}),
                                 champion_bytes, foreign.read_bytes())))
    assert "error" not in info and info["draft_head_rows"] is None
    alone = json.loads(run(s.generate(1, MESSAGES, json.dumps({"max_tokens": 16,
                                                               "draft": "none"}),
                                      lambda *a: None)))
    bridged = json.loads(run(s.generate(2, MESSAGES, json.dumps({"max_tokens": 16,
                                                                 "k": "fixed:2"}),
                                        lambda *a: None)))
    assert bridged["tokens"] == alone["tokens"] and bridged["stats"]["drafted"] > 0
    assert bridged["stats"]["bridge"]["kind"] == "tli"
    err = json.loads(run(s.load(json.dumps(load), champion_bytes, foreign.read_bytes())))["error"]
    assert err["code"] == "bad_config" and "drop it" in err["message"]


@pytest.mark.parametrize("draft", ["trained", "ngram+trained"])
def test_the_page_says_how_to_draft_with_the_trained_draft(tiny, champion_bytes, draft):
    """"trained" is the CLI's file in models/: the page says to give the draft at init."""
    s = session.Session(opener(NoAdapterError("none here")))
    run(s.load(json.dumps({"max_ctx": 128}), champion_bytes))
    err = json.loads(run(s.generate(1, MESSAGES, json.dumps({"draft": draft}),
                                    lambda *a: None)))["error"]
    assert err["code"] == "bad_config"
    assert "give the draft model at init" in err["message"] and "build.py" not in err["message"]


def test_the_guard_remembers_a_drafter_across_engines(tiny, champion_bytes):
    """Choosing another drafter rebuilds the engine (a fresh cache); the guard's times and
    acceptance per (adapter, drafter) stay with the session, so a drafter chosen again needs no
    champion-only baseline first (as in one native engine). A new init forgets them."""
    s = session.Session(opener(NoAdapterError("none here")))
    draft = Path(tiny.close_path).read_bytes()
    run(s.load(json.dumps({"max_ctx": 128, "draft": "none"}), champion_bytes, draft))
    config = {"max_tokens": 16, "k": "heuristic"}

    def schedule(draft):
        r = json.loads(run(s.generate(1, MESSAGES, json.dumps({**config, "draft": draft}),
                                      lambda *a: None)))
        return r["stats"]["schedule"]

    assert schedule("model")["baseline"] >= 1
    schedule("none")
    assert s.engine.guard_timing is s.guard_timing
    assert schedule("model")["baseline"] == 0
    run(s.load(json.dumps({"max_ctx": 128, "draft": "none"}), champion_bytes, draft))
    assert schedule("model")["baseline"] >= 1


def test_the_page_auto_draft_uses_its_draft_model_only_where_it_pays(tiny, champion_bytes):
    """draft "auto" (worker.js sends the draft model only for a hardware adapter, autoDraft):
    on the numpy engine, where a draft model does not pay, the session drafts with n-gram and
    says why (ready.draft_auto); without a draft model it is n-gram with nothing to say; a
    request's "auto" follows the same rule. Tokens are champion-only's either way."""
    draft = Path(tiny.close_path).read_bytes()
    s = session.Session(opener(NoAdapterError("none here")))
    info = json.loads(run(s.load(json.dumps({"max_ctx": 128, "draft": "auto"}), champion_bytes,
                                 draft)))
    assert info["draft"] == "ngram" and "cpu-numpy" in info["draft_auto"], info
    assert s.draft_model is not None, "kept: a request may still ask for draft 'model'"
    config = {"max_tokens": 16, "k": "fixed:2"}
    alone = json.loads(run(s.generate(1, MESSAGES, json.dumps({**config, "draft": "none"}),
                                      lambda *a: None)))
    for i, ask in enumerate([None, "auto"]):
        out = json.loads(run(s.generate(2 + i, MESSAGES, json.dumps({**config, "draft": ask}),
                                        lambda *a: None)))
        assert out["tokens"] == alone["tokens"] and out["stats"]["drafter"] == "ngram"
    bare = session.Session(opener(NoAdapterError("none here")))
    info = json.loads(run(bare.load(json.dumps({"max_ctx": 128, "draft": "auto"}),
                                    champion_bytes)))
    assert info["draft"] == "ngram" and info["draft_auto"] is None


@requires_gpu
def test_the_page_auto_draft_drafts_with_its_model_on_a_hardware_adapter(tiny, champion_bytes):
    """On a WebGPU adapter that is not a software one, "auto" is the draft model, as the CLI's
    load.default_draft chooses natively; the same adapter marked as software (SwiftShader's
    isFallbackAdapter, with backend webgpu forced) gets n-gram. The native device stands in for
    navigator.gpu's; only its is_cpu flag is set here."""
    from pyspec.gpu import open_device

    draft = Path(tiny.close_path).read_bytes()
    for software in (False, True):
        dev = open_device()
        dev.is_cpu = software
        s = session.Session(opener(dev))
        try:
            info = json.loads(run(s.load(json.dumps({"max_ctx": 128, "draft": "auto",
                                                     "backend": "webgpu"}),
                                         champion_bytes, draft)))
            assert info["adapter"] == dev.name, info
            assert info["draft"] == ("ngram" if software else "model"), info
            assert (info["draft_auto"] is not None) == software
            out = json.loads(run(s.generate(1, MESSAGES, json.dumps({"max_tokens": 12,
                                                                     "k": "fixed:2"}),
                                            lambda *a: None)))
            assert (out["stats"]["drafter"] == "ngram") == software, out["stats"]["drafter"]
        finally:
            s.engine.close()
            dev.destroy()


@requires_gpu
@pytest.mark.parametrize("software", [False, True])
def test_the_pages_draft_model_drafts_on_the_device_one_readback_a_cycle(tiny, champion_bytes,
                                                                          software):
    """The page's draft model, given as bytes at init, drafts on the device as a --draft file
    does natively (load.GivenDraft, gpu/draft.GPUDraft): its steps sample inside the cycle's one
    submission, each cycle has one readback, and on a hardware adapter the cycles are fed on the
    device and go ahead (gpu/sources.FedDraft); on a software one (draft_ahead off) they are
    read one at a time, still on the device. Never dequantized for the host. The native device
    stands in for navigator.gpu's (is_cpu set as SwiftShader's isFallbackAdapter would)."""
    from pyspec.gpu import open_device
    from pyspec.gpu.draft import GPUDraft

    draft = Path(tiny.close_path).read_bytes()
    dev = open_device()
    dev.is_cpu = software
    s = session.Session(opener(dev))
    try:
        info = json.loads(run(s.load(json.dumps({"max_ctx": 128, "draft": "model",
                                                 "backend": "webgpu"}), champion_bytes, draft)))
        assert info["adapter"] == dev.name, info
        assert isinstance(s.engine.backend.drafter, GPUDraft)
        assert s.draft_model._host is None, "a GPU page never dequantizes its draft"
        config = {"max_tokens": 24}
        alone = json.loads(run(s.generate(1, MESSAGES, json.dumps({**config, "draft": "none"}),
                                          lambda *a: None)))
        for k in ("fixed:1", "fixed:3"):
            before = dev.readbacks
            out = json.loads(run(s.generate(2, MESSAGES, json.dumps({**config, "k": k}),
                                            lambda *a: None)))
            st, timing = out["stats"], out["stats"]["backend_timing"]
            assert out["tokens"] == alone["tokens"], k
            assert st["draft_path"] == "device" and st["drafted"] > 0, st
            assert timing["drafted_on_device"] > 0 and timing["drafted_on_host"] == 0
            # One submission and one readback a cycle (and the prefill's wait, where the rows
            # of the request before did not hold the prompt).
            assert timing["submissions"] == timing["cycles"] == st["champion_passes"], timing
            assert dev.readbacks - before - timing["cycles"] in (0, 1), (dev.readbacks, timing)
            assert (timing["ahead"] > 0) == (not software), timing
    finally:
        s.engine.close()
        dev.destroy()


def test_the_pages_draft_model_drafts_on_the_host_on_the_numpy_engine(tiny, champion_bytes):
    """Without a GPU the page's draft model is dequantized for the host, once, when the numpy
    engine first drafts with it; the stats say so."""
    s = session.Session(opener(NoAdapterError("none here")))
    run(s.load(json.dumps({"max_ctx": 128, "draft": "model"}), champion_bytes,
               Path(tiny.close_path).read_bytes()))
    assert s.draft_model._host is not None
    out = json.loads(run(s.generate(1, MESSAGES, json.dumps({"max_tokens": 12, "k": "fixed:2"}),
                                    lambda *a: None)))
    assert out["stats"]["draft_path"] == "host" and out["stats"]["drafted"] > 0


# --- trees: the request option `tree` ---------------------------------------------------------
def _ask(s, config: dict) -> dict:
    return json.loads(run(s.generate(1, MESSAGES, json.dumps(config), lambda *a: None)))


@pytest.mark.parametrize("draft", ["ngram", "model"])
def test_a_pages_tree_request_gives_champion_only_tokens_on_the_numpy_engine(tiny, champion_bytes,
                                                                             draft):
    """A generate config's `tree` reaches the engine through the page's protocol: on the numpy
    engine n-gram's and the draft model's trees (widths and auto) are drafted and verified
    (stats: tree cycles), and the tokens are champion-only's, greedy and replay."""
    s = session.Session(opener(NoAdapterError("none here")))
    run(s.load(json.dumps({"max_ctx": 128, "draft": draft}), champion_bytes,
               Path(tiny.close_path).read_bytes()))
    for sampling in ({}, {"temperature": 0.8, "seed": 3}):
        config = {"max_tokens": 24, "k": "fixed:3", **sampling}
        alone = _ask(s, {**config, "draft": "none"})
        for tree in ("2,2,1", "auto"):
            out = _ask(s, {**config, "tree": tree})
            assert out["tokens"] == alone["tokens"], (tree, sampling)
            assert out["stats"]["schedule"]["trees"] > 0, (tree, out["stats"]["schedule"])


def test_a_bad_tree_is_refused_by_name_and_the_session_stays_usable(tiny, champion_bytes):
    """A tree shape that is not W1,W2,... or auto, one of more nodes than a pass verifies, a
    tree that is not a string, and a tree with sampling controls are bad_config, each message
    naming the option `tree`; the next request runs."""
    s = session.Session(opener(NoAdapterError("none here")))
    run(s.load(json.dumps({"max_ctx": 128, "draft": "ngram"}), champion_bytes))
    for bad, words in [({"tree": "2,x"}, "tree '2,x': give widths per depth"),
                       ({"tree": "0,2"}, "tree '0,2': give widths per depth"),
                       ({"tree": "8,8"}, "tree '8,8' has 72 nodes"),
                       ({"tree": 2}, "field 'tree' must be str"),
                       ({"tree": "2", "temperature": 1.0, "top_k": 5},
                        "tree does not take sampling controls")]:
        err = _ask(s, {"max_tokens": 4, **bad})["error"]
        assert err["code"] == "bad_config" and words in err["message"], (bad, err)
    assert _ask(s, {"max_tokens": 4, "tree": "2"})["tokens"]


@requires_gpu
def test_the_pages_webgpu_drafts_trees_and_refuses_an_auto_tree_of_its_draft_model(
        tiny, champion_bytes, monkeypatch):
    """On WebGPU (the native device standing in for navigator.gpu's, reading back only later as
    the page's does: reads_now off, no synchronous readback), n-gram's trees (auto, guarded and
    fixed; 2,2,1) and the draft model's 2,2,1 (grown on the device) give champion-only's tokens;
    the draft model's `auto` tree, which grows a depth a pass read back at once, is refused by
    name (GPUBackend.tree_refusal), saying what to give instead."""
    from pyspec.gpu import open_device

    dev = open_device()
    monkeypatch.setattr(dev, "reads_now", False)
    monkeypatch.setattr(dev, "redeem_now", lambda readback: pytest.fail("read back at once"))
    s = session.Session(opener(dev))
    try:
        run(s.load(json.dumps({"max_ctx": 128, "draft": "model", "backend": "webgpu"}),
                   champion_bytes, Path(tiny.close_path).read_bytes()))
        assert s.engine.adapter == dev.name
        config = {"max_tokens": 24, "k": "fixed:3"}
        alone = _ask(s, {**config, "draft": "none"})
        for draft, tree, k in [("ngram", "auto", "heuristic"), ("ngram", "auto", "fixed:3"),
                               ("ngram", "2,2,1", "fixed:3"), ("model", "2,2,1", "fixed:3")]:
            out = _ask(s, {**config, "draft": draft, "tree": tree, "k": k})
            assert out["tokens"] == alone["tokens"], (draft, tree, k)
            assert k == "heuristic" or out["stats"]["schedule"]["trees"] > 0, (draft, tree)
        err = _ask(s, {**config, "draft": "model", "tree": "auto"})["error"]
        assert err["code"] == "bad_config", err
        assert err["message"].startswith("tree auto with a draft model") and \
            "fixed widths (e.g. 2,2,1)" in err["message"], err
    finally:
        s.engine.close()
        dev.destroy()


def test_the_worker_asks_the_session_for_the_auto_draft():
    """worker.js holds no copy of the "auto" rule: it sends what it knows before any draft
    downloads (a trained draft in the manifest, init's backend, the WebGPU adapter) and fetches
    the draft model only where Session.auto_draft (drafters/auto.py, the CLI's rule too) says."""
    s = session.Session()
    hardware = {"available": True, "fallback": False, "description": "a GPU"}

    def ask(has_model, backend, webgpu):
        return json.loads(s.auto_draft(json.dumps({"has_model": has_model, "backend": backend,
                                                   "webgpu": webgpu})))

    out = ask(True, "auto", hardware)
    assert out["model"] is True and "a GPU" in out["reason"]
    assert ask(True, "webgpu", hardware)["model"] is True
    software = ask(True, "webgpu", {**hardware, "fallback": True})
    assert software["model"] is False and "software WebGPU adapter" in software["reason"]
    for facts in [(False, "auto", hardware), (True, "cpu", hardware), (True, "auto", None),
                  (True, "auto", {"available": False})]:
        out = ask(*facts)
        assert out["model"] is False and out["reason"].endswith("prompt n-gram"), facts



# --- streamed weights (page_engine.open_gguf) and lowered limits (page_engine.capped) ----------
class Source:
    """What web/stream.js weightSource hands Python: size, sha256 and read(offset, into), which
    fills the bytearray it is lent. Records the largest read."""

    def __init__(self, blob: bytes):
        import hashlib

        self.blob, self.size = blob, len(blob)
        self.sha256 = hashlib.sha256(blob).hexdigest()
        self.largest = 0

    def read(self, offset, into):
        into[:] = self.blob[offset:offset + len(into)]
        self.largest = max(self.largest, len(into))


def test_a_session_streams_its_weights_a_tensor_at_a_time(tiny, champion_bytes):
    """A model read through its source decodes as the same model from its bytes, and no read
    is larger than its largest tensor or the header's first read (1 MiB, from_reader)."""
    source = Source(champion_bytes)
    texts = []
    for weights in (champion_bytes, source):
        s = session.Session(opener(NoAdapterError("none here")))
        assert "error" not in json.loads(run(s.load(json.dumps({"max_ctx": 128}), weights)))
        done = json.loads(run(s.generate(1, MESSAGES, json.dumps({"max_tokens": 8}),
                                         lambda *a: None)))
        texts.append(done["tokens"])
        assert done["receipt"]["champion_sha256"] == source.sha256
    assert texts[0] == texts[1]
    f = GGUFFile(champion_bytes)
    assert source.largest <= max(max(t.nbytes for t in f.tensors.values()), 1 << 20)


class Capped:
    limits = {"max-buffer-size": 1 << 30, "max-storage-buffer-binding-size": 1 << 27}


def test_gpu_limits_lower_the_devices_limits_and_are_checked():
    dev = run(page_engine.capped(opener(Capped()), {"maxStorageBufferBindingSize": 4096})())
    assert dev.limits == {"max-buffer-size": 1 << 30, "max-storage-buffer-binding-size": 4096}
    same = opener(Capped())
    assert page_engine.capped(same, None) is same
    s = session.Session(opener(NoAdapterError("none here")))
    for bad in ({"maxBufferSize": -1}, {"maxBindings": 4}):
        out = json.loads(run(s.load(json.dumps({"gpu_limits": bad}), b"")))
        assert out["error"]["code"] == "bad_config"


@requires_gpu
def test_tables_split_under_lowered_limits_decode_the_same_tokens(tiny, champion_bytes):
    """The embedding (the tiny model's largest tensor) past a lowered binding limit goes in row
    parts (weights.upload_rows), streamed from its source: the tokens equal the whole table's."""
    from pyspec.apps import info
    from pyspec.gpu import open_device
    from pyspec.gpu.weights import RowParts

    card = info.card(tiny.champion_path)
    caps = {"maxStorageBufferBindingSize": card["gpu_buffer"]["bytes"]}
    outs = []
    for limits in (None, caps):
        s = session.Session(opener(open_device()))
        opts = {"max_ctx": 128, "backend": "webgpu", "gpu_limits": limits}
        assert "error" not in json.loads(run(s.load(json.dumps(opts), Source(champion_bytes))))
        assert isinstance(s.engine.champion.tok_embd, RowParts) == (limits is not None)
        done = json.loads(run(s.generate(1, MESSAGES, json.dumps({"max_tokens": 8}),
                                         lambda *a: None)))
        outs.append(done["tokens"])
    assert outs[0] == outs[1]


@requires_gpu
def test_a_read_that_fails_midway_is_named_and_frees_the_gpu_weights(tiny, champion_bytes):
    """A source whose file changed while it streamed (NotReadableError in the page): the load
    fails with weights_changed and the device holding the tensors uploaded so far is destroyed."""
    from pyspec.gpu import open_device

    class Changed(Source):
        reads = 0

        def read(self, offset, into):
            self.reads += 1
            if self.reads > 4:                 # the header and a few tensors went through
                raise OSError("NotReadableError: the file changed")
            super().read(offset, into)

    dev = open_device()
    s = session.Session(opener(dev))
    out = json.loads(run(s.load(json.dumps({"backend": "webgpu"}), Changed(champion_bytes))))
    assert out["error"]["code"] == "weights_changed", out
    assert "load the model again" in out["error"]["message"]
    assert dev.lost is not None and s.file is None
