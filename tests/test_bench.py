"""`python -m pyspec bench` end to end on a tiny model and a two-stratum workload."""

from __future__ import annotations

import json

from pyspec import cli


def test_bench_writes_json_and_plot(tiny, tmp_path):
    workload = tmp_path / "w.jsonl"
    lines = [{"id": f"{s}-{i}", "stratum": s, "max_tokens": 12,
              "messages": [{"role": "user", "content": f"the cat sat on the mat {i}"}]}
             for s in ("copy", "chat") for i in range(2)]
    workload.write_text("\n".join(json.dumps(x) for x in lines))
    out = tmp_path / "out"
    assert cli.main(["bench", "--workload", str(workload), "--champion", tiny.champion_path,
                     "--drafts", "ngram,self:1", "--out", str(out)]) == 0
    result = json.loads((out / "bench-cpu.json").read_text())
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
