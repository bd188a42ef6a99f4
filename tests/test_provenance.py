"""Results that say where they came from (pyspec/apps/provenance.py) and the counts built on it
(pyspec/apps/benchstats.py): a mismatching output is counted as a mismatch, and can be recounted
from the hashes; a drafter that barely drafted is "did not draft", never "identical"."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from pyspec.apps import benchstats, cli, provenance


def stats(passes=10, first_drafts=5, tps=10.0) -> dict:
    """Engine stats with what the summaries read: `first_drafts` of `passes` cycles drafted."""
    return {"drafted_by_position": [first_drafts, 0], "accepted_by_position": [first_drafts, 0],
            "drafted": first_drafts, "accepted": first_drafts, "champion_passes": passes,
            "tokens_per_pass": 1.5, "ttft_s": 0.1, "draft_calls": first_drafts,
            "tokens_per_s": tps, "verify_s": 1.0, "schedule": {"policy": "fixed:2"},
            "peak_bytes": {"weights": 1, "kv": 1, "scratch": 1}}


def rows(outputs: list[list[int]], base: list[int], first_drafts=5) -> list[dict]:
    return [benchstats.compare({"id": f"p{i}", "stratum": "chat"}, stats(first_drafts=first_drafts),
                               out, stats(first_drafts=0), base)
            for i, out in enumerate(outputs)]


def test_a_mismatching_output_is_counted_and_recounted_as_a_mismatch():
    rs = rows([[5, 6, 7], [5, 6, 8]], base=[5, 6, 7])
    assert [r["identical"] for r in rs] == [True, False]
    summary = benchstats.summarize(rs)
    assert summary["identical_to_baseline"] == 1
    assert summary["outcome"] == "1 of 2 differ"
    lines = benchstats.prompt_lines({"d": rs})["d"]
    assert provenance.recount_identical(lines) == 1
    assert lines[1]["tokens_sha256"] != lines[1]["baseline_tokens_sha256"]


def test_a_differing_repeat_makes_the_row_a_mismatch():
    row = rows([[1, 2]], base=[1, 2])[0]
    benchstats.identity_over_repeats(row, [[1, 2], [1, 3], [1, 2]], [1, 2])
    assert row["identical"] is False
    assert row["tokens_sha256"] == provenance.tokens_sha256([1, 3])
    assert provenance.recount_identical(benchstats.prompt_lines({"d": [row]})["d"]) == 0


def test_a_drafter_that_barely_drafted_did_not_draft():
    # 0.9 of 10 cycles drafted on average (9 of 100 over the stratum): below 10%
    rs = rows([[1]] * 10, base=[1], first_drafts=0)
    rs[0]["stats"] = stats(first_drafts=9)
    summary = benchstats.summarize(rs)
    assert summary["identical_to_baseline"] == 10
    assert summary["drafted_cycles_share"] == 0.09
    assert summary["outcome"] == "did not draft"
    assert benchstats.summarize(rows([[1]], base=[1], first_drafts=1))["outcome"] == "identical"


def test_token_hashes_tell_orders_and_widths_apart():
    h = provenance.tokens_sha256
    assert h([1, 2]) != h([2, 1]) and h([256]) != h([0, 1]) and h([]) != h([0])
    assert h([1, 2]) == hashlib.sha256(bytes([1, 0, 0, 0, 2, 0, 0, 0])).hexdigest()


def test_a_result_file_records_where_it_came_from(tiny, tmp_path):
    """The bench's JSON: commit, date, machine, adapter, the sha256 of the champion, the draft
    model and the workload (the files' own bytes), and a token hash per output."""
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "a", "stratum": "chat", "max_tokens": 6, "messages":
                                    [{"role": "user", "content": "the cat sat on the mat"}]}))
    out = tmp_path / "out"
    assert cli.main(["bench", "--workload", str(workload), "--champion", tiny.champion_path,
                     "--drafts", f"ngram,{tiny.close_path}", "--out", str(out)]) == 0
    result = json.loads((out / "bench-cpu.json").read_text())
    origin = result["provenance"]
    assert len(origin["commit"]) == 40 and isinstance(origin["dirty"], bool)
    assert origin["command"].startswith("python ") and len(origin["load"]["end"]) == 3
    assert origin["date"].endswith("+00:00") and origin["machine"]["cpus"] >= 1
    assert origin["adapter"] == result["adapter"] and origin["backend"] == "cpu"

    def sha(path):
        return hashlib.sha256(open(path, "rb").read()).hexdigest()
    assert origin["champion"]["sha256"] == sha(tiny.champion_path)
    assert origin["workload"] == {"file": "w.jsonl", "sha256": sha(workload)}
    assert origin["drafts"]["ngram"] is None
    assert origin["drafts"][tiny.close_path]["sha256"] == sha(tiny.close_path)
    for d, lines in result["prompts"].items():
        assert provenance.recount_identical(lines) == \
            result["drafters"][d]["overall"]["identical_to_baseline"] == 1


def test_a_dirty_tree_is_refused_unless_allowed_and_then_the_file_says_so(monkeypatch):
    monkeypatch.delenv(provenance.ALLOW_DIRTY, raising=False)
    monkeypatch.setattr(provenance, "git_commit", lambda: {"commit": "a" * 40, "dirty": True})
    with pytest.raises(provenance.DirtyTreeError, match="--allow-dirty"):
        provenance.check_tree()
    assert provenance.check_tree("--allow-dirty")["dirty_allowed"] == "--allow-dirty"
    monkeypatch.setenv(provenance.ALLOW_DIRTY, "a test")
    origin = provenance.record(champion=None, drafts={}, workload=None, adapter="a",
                               backend="cpu")
    assert origin["dirty"] is True and origin["dirty_allowed"] == "a test"
    assert origin["command"].startswith("python ")
    assert provenance.problems({"provenance": origin}) == []
    del origin["dirty_allowed"]
    assert provenance.problems({"provenance": origin}) == \
        ["a dirty tree, not declared (dirty_allowed)"]


def test_the_writer_refuses_a_result_that_cannot_be_recounted(tmp_path):
    origin = {"commit": "b" * 40, "dirty": False, "date": "2026-12-06T00:00:00+00:00",
              "command": "python -m pyspec bench", "machine": {"cpus": 2},
              "champion": {"file": "c.gguf", "sha256": "c" * 64},
              "workload": {"file": "w.jsonl", "sha256": None}, "drafts": {"ngram": None}}
    line = {"id": "p", "tokens_sha256": "d" * 64, "baseline_tokens_sha256": "D" * 64}
    result = {"provenance": origin, "prompts": {"ngram": [line]}}
    assert provenance.problems(result) == ["workload w.jsonl: sha256 None",
                                           "ngram p: no token hash of both sides"]
    with pytest.raises(ValueError, match="not a recountable result"):
        provenance.write(str(tmp_path / "r.json"), result)
    assert not (tmp_path / "r.json").exists()
    origin["workload"]["sha256"], line["baseline_tokens_sha256"] = "e" * 64, "d" * 64
    provenance.write(str(tmp_path / "r.json"), result)
    written = json.loads((tmp_path / "r.json").read_text())["provenance"]
    assert "end" in written["load"]
    # outside a git checkout (an installed pyspec) a run may write, but it is no claim
    origin["commit"] = origin["dirty"] = None
    assert provenance.problems(result, claim=False) == []
    assert provenance.problems(result) == ["commit None is not a 40-digit hex id"]
    # a result whose "prompts" is not a bench's (a list of ids) has no prompt lines to check
    assert provenance.problems({**result, "prompts": ["p"]}, claim=False) == []


def test_only_the_top_of_a_checkout_names_a_commit(monkeypatch):
    """A tree copy unpacked inside another checkout must not take that checkout's commit: there
    PYSPEC_COMMIT (set by the runner that made the copy) names it, or nothing does."""
    inner = os.path.join(provenance.ROOT, "pyspec")
    monkeypatch.delenv("PYSPEC_COMMIT", raising=False)
    assert provenance.git_commit(inner) == {"commit": None, "dirty": None}
    monkeypatch.setenv("PYSPEC_COMMIT", "c" * 40)
    assert provenance.git_commit(inner)["commit"] == "c" * 40
    assert len(provenance.git_commit()["commit"]) == 40


def test_a_recorded_command_names_no_path_of_its_machine(monkeypatch):
    """The command a result file keeps reads the same wherever it ran: the checkout's own paths
    relative, the GPU machine's work folder $W, the output folder {out}. A file quoting
    $W/payload/champ.gguf written out (provenance.DEVICE_DIR) or /root/out/native names one
    machine's folders."""
    root = provenance.ROOT
    monkeypatch.setattr(provenance.sys, "orig_argv", [
        "/usr/bin/python3", "-m", "pyspec", "bench", "--champion",
        f"{provenance.DEVICE_DIR}/payload/champ.gguf",
        "--workload", f"{root}/workloads/public.jsonl", "--out", "/root/out/native",
        f"{root}/models/draft-l4.gguf", "--out=/tmp/experiment-x"])
    assert provenance.command() == (
        "python -m pyspec bench --champion '$W/payload/champ.gguf' --workload "
        "workloads/public.jsonl --out '{out}' models/draft-l4.gguf '--out={out}'")
