"""`python -m pyspec bench` end to end on a tiny model and a two-stratum workload; the page
bench's --drafts parsing."""

from __future__ import annotations

import json

import pytest

from conftest import requires_gpu
from pyspec.apps import cli


def test_bench_writes_json_and_plot(tiny, tmp_path):
    workload = tmp_path / "w.jsonl"
    lines = [{"id": f"{s}-{i}", "stratum": s, "max_tokens": 12,
              "messages": [{"role": "user", "content": f"the cat sat on the mat {i}"}]}
             for s in ("copy", "chat") for i in range(2)]
    workload.write_text("\n".join(json.dumps(x) for x in lines))
    out = tmp_path / "out"
    assert cli.main(["bench", "--workload", str(workload), "--champion", tiny.champion_path,
                     "--drafts", "ngram,self:1", "--repeat", "3", "--out", str(out)]) == 0
    result = json.loads((out / "bench-cpu.json").read_text())
    assert result["repeat"] == 3
    for row in result["prompts"]["ngram"]:   # the guard's decisions, per prompt
        assert sum(row["guard"]["k_histogram"].values()) > 0 and "previews" in row["guard"]
    assert (out / "bench-cpu.png").stat().st_size > 1000
    assert result["champion_tok_s"] > 0 and result["ttft_s"] > 0
    assert result["champion_tok_s_long"] is None       # no `long` stratum in this workload
    assert "prefill_tok_s" in result
    for d in ("ngram", "self:1"):
        res = result["drafters"][d]
        assert set(res["strata"]) == {"copy", "chat"}
        overall = res["overall"]
        assert overall["prompts"] == 4
        assert overall["identical_to_baseline"] == 4, "greedy output must match the baseline"
        for key in ("speedup", "tokens_per_pass", "ttft_s", "tokens_per_s"):
            assert overall[key]["min"] <= overall[key]["median"] <= overall[key]["max"]
        assert set(overall["peak_bytes"]) >= {"weights", "kv", "scratch"}
        assert len(overall["acceptance_by_position"]) == 8


def small_workload(tmp_path, strata=("copy", "chat"), n=2, max_tokens=12):
    workload = tmp_path / "w.jsonl"
    lines = [{"id": f"{s}-{i}", "stratum": s, "max_tokens": max_tokens,
              "messages": [{"role": "user", "content": f"the cat sat on the mat {i}"}]}
             for s in strata for i in range(n)]
    workload.write_text("\n".join(json.dumps(x) for x in lines))
    return workload


@pytest.mark.parametrize("verify", [None, "rejection"])
def test_bench_samples_at_a_temperature(tiny, tmp_path, capsys, verify):
    """--temperature: both sides sample with the prompt's seed. Under replay (the default above
    0) every output must still equal champion-only's; under rejection only the distribution
    does, so identity is not counted (null in the JSON, "-" in the table)."""
    out = tmp_path / "out"
    extra = ["--verify", verify] if verify else []
    assert cli.main(["bench", "--workload", str(small_workload(tmp_path)), "--champion",
                     tiny.champion_path, "--drafts", f"ngram,{tiny.close_path}", "--k", "fixed:3",
                     "--temperature", "0.9", "--seed", "5", *extra, "--out", str(out)]) == 0
    result = json.loads((out / "bench-cpu.json").read_text())
    assert (result["temperature"], result["seed"]) == (0.9, 5)
    assert result["verify"] == (verify or "replay")
    for d, res in result["drafters"].items():
        same = res["overall"]["identical_to_baseline"]
        assert same == (None if verify else 4), d
        assert res["overall"]["prompts"] == 4 and res["overall"]["acceptance"] > 0
    table = capsys.readouterr().out
    assert ("not compared" in table) == bool(verify)


@pytest.mark.parametrize("extra, words", [
    (["--temperature", "-1"], "temperature"),
    (["--temperature", "0.7", "--seed", "-3"], "seed"),
])
def test_bench_refuses_bad_sampling_options_before_loading(tmp_path, capsys, extra, words):
    code = cli.main(["bench", "--workload", str(small_workload(tmp_path)), "--champion",
                     str(tmp_path / "absent.gguf"), *extra, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and words in err and "absent.gguf" not in err, err


def test_bench_reads_zero_as_all_as_the_page_bench_does():
    """--per-stratum 0 and --max-tokens 0 mean every prompt and no cap, in build.py bench (the
    page's) and here alike; a negative value is refused."""
    import argparse

    from pyspec.apps.bench import check_options
    from pyspec.errors import UsageError

    args = argparse.Namespace(max_tokens=0, per_stratum=0, ctx=None, repeat=1, drafts="ngram",
                              out="absent-folder", temperature=0.0, seed=0, verify=None)
    check_options(args)
    assert args.max_tokens is None and args.per_stratum is None
    args.per_stratum = -1
    with pytest.raises(UsageError, match="--per-stratum must be >= 1"):
        check_options(args)


@requires_gpu
def test_bench_on_the_gpu_reports_the_pass_fields(tiny, tmp_path):
    """On native WebGPU the JSON leads with the fast-pass fields (issue: dispatches per pass,
    GPU ms per pass and per cycle, host time, wall over GPU, one readback per cycle) and the
    pipelining table, every output identical; each drafter that has one comes with its A/B of
    cycles drafted on the host (ngram@host, and D@host for a draft model D)."""
    workload = tmp_path / "w.jsonl"
    lines = [{"id": f"chat-{i}", "stratum": "chat", "max_tokens": 6,
              "messages": [{"role": "user", "content": f"the cat sat on the mat {i}"}]}
             for i in range(2)]
    workload.write_text("\n".join(json.dumps(x) for x in lines))
    out = tmp_path / "out"
    assert cli.main(["bench", "--workload", str(workload), "--champion", tiny.champion_path,
                     "--drafts", f"ngram,{tiny.close_path}", "--backend", "wgpu",
                     "--out", str(out)]) == 0
    result = json.loads((out / "bench-wgpu.json").read_text())
    assert list(result["drafters"]) == ["ngram", tiny.close_path, "ngram@host",
                                        tiny.close_path + "@host"]
    for d, res in result["drafters"].items():
        assert res["overall"]["identical_to_baseline"] == 2, d
    assert result["dispatches_per_pass"] > 0
    assert result["gpu_ms_per_cycle"] > 0 and result["wall_over_gpu"] > 0
    assert result["host_s_per_cycle"] > 0 and result["readbacks_per_cycle"] == 1.0
    host = result["host_s_cycle"]     # each cycle's own host time: median and range
    assert host["n"] > 0 and 0 < host["min"] <= host["median"] <= host["max"]
    alone = result["host_s_cycle_alone"]   # a request's first cycle; pipelined ones follow
    assert 0 < alone["n"] < host["n"] and host["min"] <= alone["min"]
    if result["gpu"].get("gpu_pass_s"):     # timestamps: the whole pass, at 1 and 8 rows
        assert set(result["gpu_ms_per_pass"]) == {"1", "8"}
    assert result["pipelining"]["identical"] == result["pipelining"]["prompts"] == 2


def test_the_page_bench_names_at_most_one_draft_model():
    """`build.py bench --drafts`: ngram, auto and self:L are drafters; anything else is the one
    draft model the page loads ("trained": the site's trained draft), and two are refused."""
    from webtools.bench import draft_model, names_a_model
    from webtools.site import TRAINED_DRAFT

    assert [names_a_model(d) for d in ("none", "ngram", "auto", "self:20", "trained",
                                       "tiny-close")] == [False, False, False, False, True, True]
    assert draft_model(["ngram", "self:20", "auto"]) is None
    assert draft_model(["ngram", "trained"]) == TRAINED_DRAFT
    with pytest.raises(SystemExit, match="2 draft models"):
        draft_model(["trained", "tiny-close"])


def test_the_page_bench_keeps_each_sides_median_run():
    """`build.py bench --repeat N`: the run with the median tokens/s stands for a side (the lower
    middle one of an even count, as in `python -m pyspec bench`), and --repeat is an option."""
    from webtools.bench import median_run, parser

    runs = [{"stats": {"tokens_per_s": v}, "tokens": [i]} for i, v in enumerate([9.0, 3.0, 5.0])]
    assert median_run(runs)["tokens"] == [2]
    assert median_run(runs[:2])["tokens"] == [1]
    assert median_run(runs[:1])["tokens"] == [0]
    assert parser().parse_args(["--repeat", "3"]).repeat == 3
    assert parser().parse_args([]).repeat == 1
