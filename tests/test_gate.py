"""`python -m pyspec gate` (apps/gate.py) and the verdicts `auto` follows (verdicts.py,
load.auto_choice): the rule on constructed numbers, both outcomes and its edges; the JSON and its
provenance on a tiny model; a stored verdict followed, one of another device class ignored, the
receipt naming it; a cancelled run, a sample under the minimum and bad input leaving no
verdict."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from pyspec import receipts, testmodels, verdicts
from pyspec.apps import cli, gate
from pyspec.apps.provenance import sha256_file
from pyspec.engine import Engine
from pyspec.load import backend
from pyspec.options import Options


@pytest.fixture
def store(tmp_path, monkeypatch):
    """This test's own verdict file (never the user's)."""
    path = tmp_path / "verdicts.json"
    monkeypatch.setenv("PYSPEC_VERDICTS", str(path))
    return path


def paying(**change) -> dict:
    """A drafter's measurements that meet every threshold, with `change` applied."""
    m = {"prompts": 11, "drafted_cycles_share": 0.8, "identical_to_baseline": 11,
         "speedup": {"median": 1.30, "low": 1.12, "high": 1.41},
         "ttft_change_s": 0.002, "draft_pass_s": 0.004, "baseline_ttft_s": 0.2,
         "peak_bytes": 600_000_000}
    m |= change
    if "prompts" in change and "identical_to_baseline" not in change:
        m["identical_to_baseline"] = m["prompts"]
    return m


def test_a_draft_that_pays_is_promoted_one_that_cannot_is_kept_off():
    assert gate.judge(paying()) == {"verdict": "promote", "reasons": [],
                                    "ttft_allowed_s": pytest.approx(0.004 + 0.05 * 0.2)}
    slow = gate.judge(paying(speedup={"median": 0.97, "low": 0.91, "high": 1.02}))
    assert slow["verdict"] == "keep off" and len(slow["reasons"]) == 2
    idle = gate.judge(paying(drafted_cycles_share=0.05, identical_to_baseline=11))
    assert idle["verdict"] == "keep off" and "did not draft" in idle["reasons"][0]
    wrong = gate.judge(paying(identical_to_baseline=10))
    assert wrong["reasons"] == ["1 of 11 outputs differ from champion-only: not exact (a bug: "
                                "report it)"]


@pytest.mark.parametrize("change, verdict", [
    ({"prompts": 8}, "promote"),                         # at the floor
    ({"prompts": 7}, "keep off"),
    ({"speedup": {"median": 1.05, "low": 1.01, "high": 1.1}}, "promote"),   # median at 1.05
    ({"speedup": {"median": 1.30, "low": 1.00, "high": 1.4}}, "keep off"),  # low must be above 1
    ({"ttft_change_s": 0.004 + 0.01}, "promote"),        # one draft pass + 5% of TTFT, exactly
    ({"ttft_change_s": 0.004 + 0.0101}, "keep off"),
    ({"identical_to_baseline": None}, "promote"),        # rejection sampling: not compared
    ({"drafted_cycles_share": 0.10}, "promote"),
], ids=["prompts-8", "prompts-7", "median-at", "low-at", "ttft-at", "ttft-over", "rejection",
        "drafted-at"])
def test_the_thresholds_edges(change, verdict):
    assert gate.judge(paying(**change))["verdict"] == verdict


def test_a_memory_budget_is_a_line_of_the_rule():
    assert gate.judge(paying(), memory_budget=600_000_000)["verdict"] == "promote"
    over = gate.judge(paying(), memory_budget=599_999_999)
    assert over["verdict"] == "keep off" and "peak memory" in over["reasons"][0]


def test_the_interval_is_a_bootstrap_of_the_median():
    sp = gate.speedup_interval([1.1, 1.2, 1.3, 1.25, 1.15, 0.9, 1.4, 1.22])
    assert sp["min"] <= sp["low"] <= sp["median"] <= sp["high"] <= sp["max"]
    assert sp["n"] == 8 and sp == gate.speedup_interval([1.1, 1.2, 1.3, 1.25, 1.15, 0.9, 1.4,
                                                          1.22])   # seeded: the same every run


@pytest.mark.parametrize("n, low, high", [(7, 2, 6), (17, 5, 13)])
def test_the_interval_is_the_percentile_bootstrap_of_the_median_known_case(n, low, high):
    """A known case. A resample's median of n distinct values (n odd) is an order statistic
    x_(j), with P(median <= x_(j)) = P(Binomial(n, j/n) >= (n + 1)/2): for n = 7 that is
    0.010, 0.108, ..., 0.892, 0.990 at j = 1, 2, ..., 5, 6, for n = 17 0.008 at j = 4, 0.036
    at 5, 0.964 at 12, 0.992 at 13. So the 95% percentile interval is [x_(2), x_(6)], resp.
    [x_(5), x_(13)], whatever the values (each crossing is 3 or more standard errors of 2,000
    resamples from 2.5% and 97.5%); a 90% interval would be [x_(6), x_(12)] at n = 17, the
    mean's bootstrap no order statistic."""
    gen = np.random.default_rng(n)
    for _ in range(3):
        x = np.sort(gen.lognormal(0.1, 0.3, n))
        sp = gate.speedup_interval(list(gen.permutation(x)))
        assert (sp["low"], sp["high"]) == (x[low - 1], x[high - 1])


def test_the_interval_covers_the_median_as_often_as_it_should():
    """Coverage against the known value: for continuous speedups and n = 17 the interval is
    [x_(5), x_(13)] (above), which holds the true median with probability
    P(5 <= Binomial(17, 1/2) <= 12) = 0.951. Over 1,000 samples of 17 lognormal speedups
    (median e^0.1, skewed) the share of intervals holding e^0.1 is within 4 standard errors
    (0.027) of 0.951; a 90% interval (0.857) or one around the mean would fall outside."""
    from math import comb

    expected = sum(comb(17, k) for k in range(5, 13)) / 2 ** 17                # 0.951
    gen = np.random.default_rng(20261207)
    hits = 0
    for _ in range(1000):
        sp = gate.speedup_interval(list(gen.lognormal(0.1, 0.3, 17)))
        hits += sp["low"] <= np.exp(0.1) <= sp["high"]
    assert abs(hits / 1000 - expected) < 4 * np.sqrt(expected * (1 - expected) / 1000), hits


def workload(tmp_path, n=2, max_tokens=10):
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(json.dumps(
        {"id": f"{s}-{i}", "stratum": s, "max_tokens": max_tokens,
         "messages": [{"role": "user", "content": f"the cat sat on the mat {i}"}]})
        for s in ("copy", "chat") for i in range(n)))
    return path


def gate_run(tiny, tmp_path, *extra) -> list[str]:
    return ["gate", "--workload", str(workload(tmp_path)), "--champion", tiny.champion_path,
            "--draft", "ngram", "--out", str(tmp_path / "out"), *extra]


def test_gate_writes_json_with_provenance_and_records_each_verdict(tiny, tmp_path, store,
                                                                    capsys, monkeypatch):
    monkeypatch.setitem(gate.THRESHOLDS, "prompts", 4)     # the 4 prompts are a full sample
    assert cli.main(gate_run(tiny, tmp_path, "--draft", tiny.close_path)) == 0
    result = json.loads((tmp_path / "out" / "gate-cpu.json").read_text())
    assert result["schema"] == gate.SCHEMA and result["device_class"] == "cpu-numpy"
    assert result["thresholds"] == gate.THRESHOLDS and result["interval"] == gate.INTERVAL
    prov = result["provenance"]
    assert prov["champion"]["sha256"] == sha256_file(tiny.champion_path)
    assert prov["drafts"][tiny.close_path]["sha256"] == sha256_file(tiny.close_path)
    assert prov["drafts"]["ngram"] is None and "commit" in prov
    table = verdicts.load()
    assert len(table) == 2 and result["recorded_in"] == str(store)
    for d, m in result["drafters"].items():
        assert m["verdict"] in verdicts.VERDICTS and m["identical_to_baseline"] == 4
        assert m["not_recorded"] is None
        sp = m["speedup"]
        assert sp["n"] == 4 and sp["min"] <= sp["low"] <= sp["median"] <= sp["high"] <= sp["max"]
        assert len(m["acceptance_by_position"]) >= 1 and m["peak_bytes"] > 0
        assert m["tokens_per_pass"]["median"] >= 1 and "ttft_change_s" in m
        mine = next(v for v in table if v["sha256"] == m["verdict_sha256"])
        assert mine["draft"] == gate.identity(d) and mine["device_class"] == "cpu-numpy"
    assert {v["draft"] for v in table} == {"ngram", sha256_file(tiny.close_path)}
    printed = capsys.readouterr().out
    assert "speedup" in printed and "TTFT change" in printed
    assert f"recorded in {store}: ngram {result['drafters']['ngram']['verdict']} " \
           f"({result['drafters']['ngram']['verdict_sha256'][:12]})" in printed


def test_a_sample_under_the_minimum_records_nothing_and_says_so(tiny, tmp_path, store, capsys):
    """The issue-55 case: a quick trial run printed `keep off` and stored it for `auto`."""
    old = verdict(tiny, "self:1", "promote")
    verdicts.save([old])
    before = store.read_bytes()
    assert cli.main(gate_run(tiny, tmp_path)) == 0
    printed = capsys.readouterr().out
    why = "4 prompts measured, fewer than the 8 a verdict needs to be recorded"
    assert "ngram: keep off" in printed and f"  not recorded: {why}" in printed
    assert printed.rstrip().endswith(f"nothing recorded: {why} (more prompts: --per-stratum, or "
                                     "the whole workload by default); `--draft auto` goes on "
                                     "as before")
    assert store.read_bytes() == before       # the table as it was, its verdicts untouched
    assert cli.main(gate_run(tiny, tmp_path, "--json")) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["recorded_in"] is None and result["schema"] == gate.SCHEMA
    ngram = result["drafters"]["ngram"]
    assert ngram["not_recorded"] == why and ngram["verdict_sha256"] is None
    assert json.loads((tmp_path / "out" / "gate-cpu.json").read_text()) == result
    assert store.read_bytes() == before


def test_a_store_that_is_not_one_is_named_before_anything_runs(tiny, tmp_path, store, capsys,
                                                               monkeypatch):
    store.write_text("not json")
    monkeypatch.setattr(gate, "load_champion", lambda *a: pytest.fail("the champion loaded"))
    assert cli.main(gate_run(tiny, tmp_path)) == 2
    assert f"error: {store}: not JSON" in capsys.readouterr().err


def verdict(tiny, draft: str, word: str, device: str = "cpu-numpy", median=1.3) -> dict:
    return verdicts.record(champion_sha256=sha256_file(tiny.champion_path), draft=draft,
                           device_class=device, verdict=word,
                           speedup={"median": median, "low": 1.1, "high": 1.4},
                           rule_version=gate.RULE_VERSION, date="2026-12-05T00:00:00Z")


def auto_receipt(tiny) -> dict:
    engine = Engine(backend(tiny.champion, "auto"), tiny.tokenizer)
    receipt = engine.generate(tiny.tokenizer.encode("the cat sat"),
                              Options(max_tokens=4)).receipt
    receipts.validate(receipt)
    return receipt


def test_auto_follows_a_stored_verdict_and_the_receipt_names_it(tiny, store):
    assert auto_receipt(tiny)["draft"]["auto"] == {"verdict": None, "verdict_sha256": None}
    promoted = verdict(tiny, "self:1", "promote")
    verdicts.save([verdict(tiny, "ngram", "promote", median=1.1), promoted,
                   verdict(tiny, "self:1", "keep off", device="gpu:nvidia")])
    draft = auto_receipt(tiny)["draft"]
    assert (draft["kind"], draft["layers"]) == ("self", 1)     # the faster promoted one
    assert draft["auto"] == {"verdict": "promote", "verdict_sha256": promoted["sha256"]}


def test_auto_ignores_another_device_class_and_falls_back(tiny, store):
    verdicts.save([verdict(tiny, "self:1", "promote", device="gpu:nvidia"),
                   verdict(tiny, "ngram", "promote", device="software")])
    draft = auto_receipt(tiny)["draft"]
    assert draft["kind"] == "ngram" and draft["auto"]["verdict"] is None   # today's rule


def test_a_kept_off_default_turns_auto_off(tiny, store):
    off = verdict(tiny, "ngram", "keep off")
    verdicts.save([off])
    draft = auto_receipt(tiny)["draft"]
    assert draft["kind"] == "none" and draft["auto"]["verdict_sha256"] == off["sha256"]


def test_a_named_drafter_has_no_auto_field_and_the_receipt_check_refuses_a_bad_one(tiny):
    engine = Engine(backend(tiny.champion, "ngram"), tiny.tokenizer)
    receipt = engine.generate(tiny.tokenizer.encode("the cat"), Options(max_tokens=2)).receipt
    assert receipt["draft"]["auto"] is None
    for bad in ({"verdict": "promote", "verdict_sha256": None},
                {"verdict": "maybe", "verdict_sha256": "0" * 64},
                {"verdict": "promote", "verdict_sha256": "/home/me/x.gguf"}):
        with pytest.raises(ValueError, match="draft.auto"):
            receipts.validate({**receipt, "draft": {**receipt["draft"], "auto": bad}})


def test_a_cancelled_run_leaves_no_verdict(tiny, tmp_path, store, monkeypatch):
    monkeypatch.setitem(gate.THRESHOLDS, "prompts", 1)    # a finished run would record
    calls = []
    generate = Engine.generate

    def interrupted(self, *a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return generate(self, *a, **k)
    monkeypatch.setattr(Engine, "generate", interrupted)
    out = tmp_path / "out"
    assert cli.main(["gate", "--workload", str(workload(tmp_path)), "--champion",
                     tiny.champion_path, "--draft", "ngram", "--out", str(out)]) == 130
    assert not store.exists() and not (out / "gate-cpu.json").exists()


@pytest.mark.parametrize("text, words", [
    ("", "holds no prompts"),
    ('{"id": "a", "stratum": "chat", "messages": []}\n', "line 1: messages must be"),
    ("not json\n", "line 1 is not JSON"),
], ids=["empty", "no-messages", "not-json"])
def test_a_bad_workload_is_named_and_leaves_no_verdict(tiny, tmp_path, store, capsys, text,
                                                       words):
    path = tmp_path / "w.jsonl"
    path.write_text(text)
    assert cli.main(["gate", "--workload", str(path), "--champion", tiny.champion_path,
                     "--draft", "ngram", "--out", str(tmp_path / "o")]) == 2
    assert words in capsys.readouterr().err and not store.exists()


def test_a_pair_that_cannot_be_exact_is_refused_before_anything_runs(tiny, tmp_path, store,
                                                                     monkeypatch, capsys):
    md = testmodels.tokenizer_metadata()
    n = len(md["tokenizer.ggml.tokens"])
    alien = tmp_path / "alien.gguf"     # a vocabulary sharing no token with the champion's
    testmodels.write_model(alien, seed=3, tokenizer={
        **md, "tokenizer.ggml.tokens": [f"zq{i}" for i in range(n)],
        "tokenizer.ggml.merges": [], "tokenizer.ggml.token_type": [1] * n})
    monkeypatch.setattr(gate, "load_champion", lambda *a: pytest.fail("the champion loaded"))
    assert cli.main(["gate", "--workload", str(workload(tmp_path)), "--champion",
                     tiny.champion_path, "--draft", str(alien),
                     "--out", str(tmp_path / "o")]) == 2
    assert "cannot be used with this champion" in capsys.readouterr().err
    assert not store.exists()


def test_a_broken_verdict_file_gets_a_named_error(tmp_path, store):
    store.write_text('{"schema": "pyspec.verdicts/1", "verdicts": [{"verdict": "promote"}]}')
    with pytest.raises(verdicts.VerdictStoreError, match="delete the file"):
        verdicts.load()


def test_the_docs_state_the_thresholds_in_code():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "gate.md").read_text()
    table = text.split("<!-- thresholds")[1].split("<!-- /thresholds -->")[0]
    rows = dict(re.findall(r"^\| `(\w+)` \| ([\d.]+) \|", table, re.M))
    assert {k: float(v) for k, v in rows.items()} == gate.THRESHOLDS
    # the minimum sample, as the docs quote it
    assert f"not recorded: {gate.unrecorded({'prompts': 2})}" in " ".join(text.split())


def test_the_page_session_follows_a_verdict_table_given_at_init(tiny, tmp_path):
    """The page keeps verdicts in OPFS and hands their text to Session.load (init option
    `verdicts`): "auto" follows one for this champion and the engine's class; a request that
    leaves the drafter to auto carries it in its receipt, one that names its drafter does not."""
    import asyncio
    from pathlib import Path

    from pyspec.apps import session
    from pyspec.gpu.device import NoAdapterError

    async def no_gpu():
        raise NoAdapterError("none here")
    champion = Path(tiny.champion_path).read_bytes()
    messages = json.dumps([{"role": "user", "content": "the cat sat on the mat. the cat"}])
    chosen = verdict(tiny, "self:1", "promote")
    table = json.dumps({"schema": verdicts.SCHEMA, "verdicts": [chosen]})
    s = session.Session(no_gpu)
    info = json.loads(asyncio.run(s.load(json.dumps({"draft": "auto", "verdicts": table,
                                                      "max_ctx": 128}), champion)))
    assert info["draft"] == "self:1" and info["draft_verdict"] == chosen["sha256"]
    assert info["draft_auto"] == (
        f"drafter self:1, chosen by the recorded gate verdict {chosen['sha256'][:12]} ("
        f"{verdicts.describe(chosen)}) in this browser (OPFS verdicts.json); "
        "SpecDecoder.clearVerdicts() removes it")

    def receipt(config):
        out = asyncio.run(s.generate(1, messages, json.dumps({"max_tokens": 4, **config}),
                                     lambda *a: None))
        return json.loads(out)["receipt"]["draft"]
    assert receipt({})["auto"] == {"verdict": "promote", "verdict_sha256": chosen["sha256"]}
    assert receipt({"draft": "ngram"})["auto"] is None
    bad = json.loads(asyncio.run(s.load(json.dumps({"draft": "auto", "verdicts": "[{}]"}),
                                        champion)))
    assert bad["error"]["code"] == "bad_config"
    plain = json.loads(asyncio.run(s.load('{"draft": "auto"}', champion)))
    assert plain["draft_verdict"] is None and plain["draft_auto"] is None


@pytest.mark.parametrize("adapter, architecture, expected", [
    ("gpu:nvidia", "hopper", "gpu:nvidia/hopper"),
    ("gpu:amd", "RDNA-3 (gfx1100)", "gpu:amd/rdna-3gfx1100"),    # a name, kept to its letters
    ("gpu:other", "", "gpu:other"),                              # none named: the vendor's
    ("gpu:intel", None, "gpu:intel"),
    ("software", "swiftshader", "software"),                     # one class, whatever renders
    ("cpu-numpy", None, "cpu-numpy"),
])
def test_the_device_class_is_the_adapter_class_and_a_gpus_architecture(adapter, architecture,
                                                                        expected):
    assert verdicts.device_class(adapter, architecture) == expected


def test_a_verdict_for_another_gpu_architecture_is_not_followed(tiny, store):
    """auto natively on a GPU: the device's class names its architecture (here a fake device's
    class: the numpy engine has one class only, and this test runs anywhere)."""
    ampere = verdict(tiny, "self:1", "promote", device="gpu:nvidia/ampere")
    verdicts.save([ampere])
    table = verdicts.load()
    candidates = {"self:1": "self:1"}
    sha = sha256_file(tiny.champion_path)
    assert verdicts.choose(table, sha, "gpu:nvidia/hopper", candidates, "ngram") is None
    assert verdicts.choose(table, sha, "gpu:nvidia/ampere", candidates, "ngram").drafter == "self:1"
