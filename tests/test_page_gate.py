"""The page's gate (apps/page_gate.py through Session.measure, what web/worker.js calls): the
sample side by side with champion-only, judged by gate.py's own code; its verdicts merged into
the page's table, which "auto" then follows at the next load; progress, cancellation (no
verdict) and bad input (a named error), on the tiny models and the numpy engine."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from pyspec import verdicts
from pyspec.apps import gate, page_gate, session
from pyspec.apps.provenance import sha256_file
from pyspec.gpu.device import NoAdapterError


async def no_gpu():
    raise NoAdapterError("none here")


def sample(n=2, max_tokens=6) -> str:
    return "\n".join(json.dumps(
        {"id": f"{s}-{i}", "stratum": s, "max_tokens": max_tokens,
         "messages": [{"role": "user", "content": f"the cat sat on the mat. the cat {i}"}]})
        for s in ("copy", "chat") for i in range(n)) + "\n"


def loaded(tiny, draft_path=None, **opts) -> session.Session:
    s = session.Session(no_gpu)
    draft = Path(draft_path).read_bytes() if draft_path else None
    info = json.loads(asyncio.run(s.load(json.dumps({"max_ctx": 128, **opts}),
                                         Path(tiny.champion_path).read_bytes(), draft)))
    assert "error" not in info, info
    return s


@pytest.fixture
def full(monkeypatch):
    """The tiny samples here (2 prompts) count as full ones: their verdicts are recorded."""
    monkeypatch.setitem(gate.THRESHOLDS, "prompts", 1)


def measure(s, options=None, text=None, table=None, request_id=1, on_progress=None):
    out = asyncio.run(s.measure(request_id, json.dumps(options or {}),
                                sample() if text is None else text, table,
                                on_progress or (lambda *a: None)))
    return json.loads(out)


def test_the_page_measures_like_the_cli_and_auto_follows_its_verdict(tiny, full):
    s = loaded(tiny)
    progress = []
    old = verdicts.record(champion_sha256="0" * 64, draft="ngram", device_class="cpu-numpy",
                          verdict="promote", speedup={"median": 2, "low": 1.5, "high": 3},
                          rule_version=1, date="2026-12-05T00:00:00Z")
    table = json.dumps({"schema": verdicts.SCHEMA, "verdicts": [old]})
    out = measure(s, {"drafts": ["ngram", "self:1"], "per_stratum": 1, "max_tokens": 5},
                  table=table, on_progress=lambda *a: progress.append(a))
    result = out["result"]
    assert result["schema"] == gate.SCHEMA and result["device_class"] == "cpu-numpy"
    assert result["thresholds"] == gate.THRESHOLDS and result["rule_version"] == gate.RULE_VERSION
    assert set(result["drafters"]) == {"ngram", "self:1"}
    for d, m in result["drafters"].items():
        # gate's measurements and rule (whose minimum sample `full` lowered to 1 prompt)
        assert {k: m[k] for k in ("verdict", "reasons")} == {
            k: gate.judge(m)[k] for k in ("verdict", "reasons")}
        assert m["not_recorded"] is None and m["verdict_sha256"] is not None
        assert m["identical_to_baseline"] == 2 and m["speedup"]["n"] == 2
        assert f"{d}: keep off" in result["text"] and "TTFT change" in result["text"]
    assert result["text"] == gate.format_verdicts(result)
    sha = sha256_file(tiny.champion_path)
    assert {(v["draft"], v["champion_sha256"], v["device_class"]) for v in out["verdicts"]} == {
        ("ngram", sha, "cpu-numpy"), ("self:1", sha, "cpu-numpy")}
    merged = verdicts.parse(out["table"], "the table")
    assert old in merged and all(v in merged for v in out["verdicts"])
    # a warm-up of the 3 sides, 2 prompts x 3 sides (champion-only first or last,
    # alternating), then the end
    assert [p[:2] for p in progress] == [(i, 9) for i in range(9)] + [(9, 9)]
    assert [p[2] for p in progress[:3]] == ["warm-up none", "warm-up ngram", "warm-up self:1"]
    assert progress[3][2] in ("copy-0 none", "copy-0 self:1")
    # auto at the next load: today's rule picks ngram, whose verdict is keep off: no drafter
    again = loaded(tiny, draft="auto", verdicts=json.dumps(out["table"]))
    ngram = next(v for v in out["verdicts"] if v["draft"] == "ngram")
    assert again.default_draft == "none"
    assert again.auto_choice.receipt() == {"verdict": "keep off",
                                           "verdict_sha256": ngram["sha256"]}


def test_a_draft_model_is_named_by_its_sha256_as_natively(tiny, full):
    s = loaded(tiny, tiny.close_path, draft="model")
    out = measure(s, {"drafts": ["model", "ngram+model"], "per_stratum": 1, "max_tokens": 3})
    names = {v["draft"] for v in out["verdicts"]}
    assert names == {gate.identity(tiny.close_path), gate.identity(f"ngram+{tiny.close_path}")}
    assert page_gate.read_options("{}", True).drafts == ["ngram", "model"]
    assert page_gate.read_options("{}", False).drafts == ["ngram"]


def test_a_sample_under_the_minimum_records_nothing(tiny):
    old = v("ngram", "promote", "cpu-numpy")
    table = json.dumps({"schema": verdicts.SCHEMA, "verdicts": [old]})
    out = measure(loaded(tiny), {"drafts": ["ngram"], "per_stratum": 1, "max_tokens": 2},
                  table=table)
    ngram = out["result"]["drafters"]["ngram"]
    assert out["verdicts"] == [] and verdicts.parse(out["table"], "t") == [old]
    assert ngram["not_recorded"] == gate.unrecorded({"prompts": 2})
    assert ngram["verdict_sha256"] is None
    assert f"  not recorded: {ngram['not_recorded']}" in out["result"]["text"]


def test_a_cancelled_measurement_leaves_no_verdict(tiny):
    s = loaded(tiny)
    seen = []

    def on_progress(done, total, label):
        seen.append(done)
        if done == 1:
            s.cancel(9)
    out = measure(s, {"drafts": ["ngram"]}, request_id=9, on_progress=on_progress)
    assert out == {"cancelled": True} and seen[-1] == 1
    assert s.running is None and 9 not in s.cancelled
    # the session still serves, and measures again
    assert "result" in measure(s, {"drafts": ["ngram"], "per_stratum": 1, "max_tokens": 2})


@pytest.mark.parametrize("text, words", [
    ("", "the sample holds no prompts"),
    ("\n  \n", "holds no prompts"),
    ('{"id": "a", "stratum": "chat"}\n', "line 1: each line needs id, stratum and messages"),
    ("not json\n", "line 1 is not JSON"),
    (sample() + '{"id": 3, "stratum": "x", "messages": [{"role": "user", "content": "a"}]}',
     "line 5: id and stratum must be strings"),
], ids=["empty", "blank", "fields", "not-json", "id-type"])
def test_a_malformed_or_empty_sample_gets_a_named_error(tiny, text, words):
    out = measure(loaded(tiny), text=text)
    assert out["error"]["code"] == "bad_workload" and words in out["error"]["message"]


@pytest.mark.parametrize("options, words", [
    ({"drafts": ["none"]}, "champion-only is the side"),
    ({"drafts": ["model"]}, "needs a draft model"),
    ({"drafts": ["ngram", "ngram"]}, "name one twice"),
    ({"per_stratum": -1}, "per_stratum must be >= 0"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"repeat": 2}, "unknown measure options option repeat"),
], ids=["none", "no-model", "twice", "negative", "type", "unknown"])
def test_bad_measure_options_are_refused_before_anything_runs(tiny, options, words):
    out = measure(loaded(tiny), options)
    assert out["error"]["code"] == "bad_config" and words in out["error"]["message"]


def test_a_table_that_is_not_one_is_replaced_and_said_so(tiny, full):
    out = measure(loaded(tiny), {"drafts": ["ngram"], "per_stratum": 1, "max_tokens": 2},
                  table='[{"verdict": "promote"}]')
    assert "not a verdict" in out["result"]["replaced_table"]
    assert verdicts.parse(out["table"], "t") == out["verdicts"]


def test_before_a_load_it_is_not_ready():
    out = json.loads(asyncio.run(session.Session(no_gpu).measure(
        1, "{}", sample(), None, lambda *a: None)))
    assert out["error"]["code"] == "not_ready"


def v(draft: str, word: str, device: str, champion: str = "c" * 64) -> dict:
    return verdicts.record(champion_sha256=champion, draft=draft, device_class=device,
                           verdict=word, speedup={"median": 1.3, "low": 1.1, "high": 1.4},
                           rule_version=1, date="2026-12-05T00:00:00Z")


@pytest.mark.parametrize("webgpu, backend, table, fetch, decided", [
    # a hardware GPU: today's rule fetches the draft; its keep-off verdict stops the download
    ({"available": True, "vendor": "nvidia"}, "auto", [v("d" * 64, "keep off", "gpu:nvidia")],
     False, True),
    ({"available": True, "vendor": "nvidia"}, "auto", [v("d" * 64, "keep off", "gpu:amd")],
     True, False),                                  # another class: ignored
    ({"available": True, "vendor": "nvidia"}, "auto", [v("ngram", "promote", "gpu:nvidia")],
     False, True),                                  # n-gram promoted, the draft not measured
    # SwiftShader: the numpy engine runs (cpu-numpy) unless backend webgpu asks for it
    ({"available": True, "fallback": True}, "auto", [v("d" * 64, "promote", "cpu-numpy")],
     True, True),
    ({"available": True, "fallback": True}, "auto", [v("d" * 64, "promote", "software")],
     False, False),
    ({"available": True, "fallback": True}, "webgpu", [v("d" * 64, "promote", "software")],
     True, True),
    ({"available": False}, "auto", [v("d" * 64, "promote", "cpu-numpy", "e" * 64)],
     False, False),                                 # another champion's
    # a GPU that names its architecture: only a verdict of that architecture counts
    ({"available": True, "vendor": "nvidia", "architecture": "ampere"}, "auto",
     [v("d" * 64, "keep off", "gpu:nvidia/hopper")], True, False),
    ({"available": True, "vendor": "nvidia", "architecture": "ampere"}, "auto",
     [v("d" * 64, "keep off", "gpu:nvidia/ampere")], False, True),
], ids=["gpu-kept-off", "gpu-other-class", "gpu-ngram", "swiftshader-cpu", "swiftshader-other",
        "swiftshader-webgpu", "other-champion", "gpu-other-architecture", "gpu-architecture"])
def test_auto_fetches_the_draft_model_by_a_verdict_for_the_engine_it_will_run(
        webgpu, backend, table, fetch, decided):
    facts = {"has_model": True, "backend": backend, "webgpu": webgpu,
             "champion_sha256": "c" * 64, "draft_sha256": "d" * 64,
             "verdicts": json.dumps({"schema": verdicts.SCHEMA, "verdicts": table})}
    out = json.loads(session.Session(no_gpu).auto_draft(json.dumps(facts)))
    assert out["model"] is fetch
    assert ("a verdict measured on this device" in out["reason"]) is decided
