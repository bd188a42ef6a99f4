"""The page's worker in Node (webtools/dawn.mjs): the same code path as in the browser, without one.

On the numpy engine it runs on every machine, and its tokens equal the native engine's. Under
Dawn's WebGPU it needs an adapter Dawn accepts (a hardware GPU: Dawn passes over Mesa 22's
lavapipe, and names why); where there is none the test skips with Dawn's own message, and
PYSPEC_REQUIRE=dawn makes that a failure.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from e2e.pageutil import native_generate
from webtools import dawn

MESSAGES = [{"role": "user", "content": "the cat sat on the mat. the cat"}]


@pytest.fixture(scope="module")
def harness(need):
    try:
        probe = dawn.run(probe=True, timeout=120)
    except dawn.DawnError as e:
        need("browser", f"the Node harness cannot run: {e}")
    return probe


@pytest.fixture(scope="module")
def tiny_path(site_root):
    return str(site_root / "models" / "tiny.gguf")


def test_the_worker_in_node_gives_the_native_tokens_on_the_cpu_engine(harness, site_root,
                                                                       tiny_path):
    native = native_generate(tiny_path, MESSAGES, "none", max_tokens=12)
    out = dawn.run(tiny_path, site=site_root, backend="cpu", draft="none",
                   prompt=MESSAGES[0]["content"], max_tokens=12)
    assert out.ready["adapter"] == "cpu-numpy"
    assert out.runs[0]["tokens"] == native.tokens
    assert out.runs[0]["text"] == native.text


def test_the_worker_under_dawn_gives_the_native_tokens(harness, need, site_root, tiny_path):
    if harness.adapter is None:
        need("dawn", harness.why_no_adapter())
    native = native_generate(tiny_path, MESSAGES, "none", max_tokens=12)
    ngram = dawn.run(tiny_path, site=site_root, backend="webgpu", draft="ngram", k="fixed:3",
                     prompt=MESSAGES[0]["content"], max_tokens=12)
    alone = dawn.run(tiny_path, site=site_root, backend="webgpu", draft="none",
                     prompt=MESSAGES[0]["content"], max_tokens=12)
    assert ngram.ready["adapter"] != "cpu-numpy", ngram.ready
    # Greedy speculation is exact on the device it runs on; the device and the CPU agree on a
    # tiny model's peaked logits (tests/test_gpu_model.py holds the margins).
    assert ngram.runs[0]["tokens"] == alone.runs[0]["tokens"] == native.tokens


def test_the_worker_drafts_with_a_draft_model_file_on_the_device_under_dawn(harness, need,
                                                                             site_root,
                                                                             tiny_path):
    """`--draft-model` (as scripts/h200.sh runs the trained draft): on the numpy engine the
    draft runs on the host, under Dawn on the device (stats draft_path), with champion-only's
    tokens either way."""
    close = str(site_root / "models" / "tiny-close.gguf")
    native = native_generate(tiny_path, MESSAGES, "none", max_tokens=12)
    sides = [("cpu", "host")] + ([("webgpu", "device")] if harness.adapter is not None else [])
    for backend, where in sides:
        out = dawn.run(tiny_path, site=site_root, backend=backend, draft_model=close,
                       k="fixed:3", prompt=MESSAGES[0]["content"], max_tokens=12)
        assert out.ready["draft"] == "model", out.ready
        stats = out.runs[0]["stats"]
        assert out.runs[0]["tokens"] == native.tokens, backend
        assert stats["draft_path"] == where and stats["drafted"] > 0, (backend, stats)
    if harness.adapter is None:
        need("dawn", harness.why_no_adapter())


@pytest.mark.parametrize("backend, drafting", [
    ("cpu", {"draft": "ngram", "tree": "2,2,1"}),
    ("webgpu", {"draft": "ngram", "tree": "auto"}),
    ("webgpu", {"draft_model": "tiny-close", "tree": "2,2,1"})])
def test_the_harness_asks_the_worker_for_a_tree(harness, need, site_root, tiny_path, backend,
                                                drafting):
    """`--tree` (as scripts/h200.sh's ngram-tree and trained-tree sides run it) is each
    request's tree option: the worker drafts trees (stats: tree cycles) and its tokens are the
    native engine's champion-only ones, on the numpy engine and, where Dawn finds an adapter,
    on the device (n-gram's auto, the draft model's 2,2,1 grown there)."""
    if backend == "webgpu" and harness.adapter is None:
        need("dawn", harness.why_no_adapter())
    if "draft_model" in drafting:
        drafting = {**drafting, "draft_model": str(site_root / "models" / "tiny-close.gguf")}
    native = native_generate(tiny_path, MESSAGES, "none", max_tokens=16)
    out = dawn.run(tiny_path, site=site_root, backend=backend, k="fixed:3",
                   prompt=MESSAGES[0]["content"], max_tokens=16, **drafting)
    run = out.runs[0]
    assert run["tokens"] == native.tokens
    assert run["stats"]["schedule"]["trees"] > 0, run["stats"]


@pytest.mark.parametrize("drafting", [{"draft": "none"}, {"draft": "ngram", "k": "fixed:3"},
                                      {"draft_model": "tiny-close", "k": "fixed:3"}])
def test_the_pages_cycle_is_one_submission_and_one_readback_on_a_null_gpu(harness, site_root,
                                                                          tiny_path, drafting):
    """The worker's whole stack (Pyodide, the session, gpu/browser.py, web/webgpu.js) on a
    WebGPU that computes nothing (webtools/nullgpu.mjs), counting what each cycle asks of it:
    one submission and one mapped readback a cycle, the next cycle submitted before one is read
    (champion-only, n-gram looked up on the device, the draft model fed on the device), and the
    draft model's steps in the cycle's submission (draft_path device: no readback per draft
    token). Its readbacks say "no draft accepted", so the tokens mean nothing here."""
    if "draft_model" in drafting:
        drafting = {**drafting, "draft_model": str(site_root / "models" / "tiny-close.gguf")}
    out = dawn.run(tiny_path, site=site_root, null_gpu=True, backend="webgpu", max_tokens=16,
                   prompt=MESSAGES[0]["content"], **drafting)
    run = out.runs[0]
    timing, asked = run["stats"]["backend_timing"], run["null_gpu"]
    cycles = timing["cycles"]
    assert cycles == run["stats"]["champion_passes"] >= 8, timing
    # (A cycle that may reach max_tokens is read before the next goes: the last few.)
    assert timing["submissions"] == cycles and timing["ahead"] >= cycles // 2, timing
    # The prefills' waits (the chat prefix warmed after ready, the prompt's) are the few more.
    assert cycles <= asked["maps"] <= cycles + 3, (asked, timing)
    if "draft_model" in drafting:
        assert run["stats"]["draft_path"] == "device" and timing["drafted_on_host"] == 0


def test_sides_run_interleaved_in_one_process_each_with_its_own_options(harness, site_root,
                                                                        tiny_path, tmp_path):
    """`--sides` (scripts/h200.sh dawn_mixed): every prompt once per side in one process, the
    sides' order rotating by prompt, each request with its side's options (its drafter, its
    tree), greedy tokens champion-only's on every side; `--split` writes one answer per side,
    as one process per side would have."""
    close = str(site_root / "models" / "tiny-close.gguf")
    workload = tmp_path / "w.jsonl"
    prompts = ["the cat sat on the mat. the cat", "one two three one two three one",
               "a b c a b c a b"]
    workload.write_text("".join(json.dumps({"id": f"p{i}", "stratum": "s", "messages": [
        {"role": "user", "content": p}]}) + "\n" for i, p in enumerate(prompts)))
    sides = {"none": {"draft": "none"}, "ngram-tree": {"draft": "ngram", "tree": "auto"},
             "model": {"draft": "model", "k": "fixed:3"}}
    argv = ["--champion", tiny_path, "--site", str(site_root), "--backend", "cpu",
            "--draft-model", close, "--workload", str(workload), "--max-tokens", "12",
            "--sides", json.dumps(sides), "--split", str(tmp_path / "split")]
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert dawn.main(argv) == 0
    runs = json.loads(printed.getvalue())["runs"]
    assert [r["side"] for r in runs] == ["none", "ngram-tree", "model",
                                         "ngram-tree", "model", "none",
                                         "model", "none", "ngram-tree"]
    drafter = {"none": "none", "ngram-tree": "ngram", "model": "model:tiny-close.gguf"}
    alone = {r["id"]: r["tokens"] for r in runs if r["side"] == "none"}
    for r in runs:
        assert r["stats"]["drafter"] == drafter[r["side"]], r["stats"]
        assert r["tokens"] == alone[r["id"]], r["side"]
    assert any(r["stats"]["schedule"].get("trees") for r in runs if r["side"] == "ngram-tree")
    assert all(r["stats"]["drafted"] > 0 for r in runs if r["side"] == "model")
    for side in sides:
        part = json.loads((tmp_path / "split" / f"dawn-{side}.json").read_text())
        assert [r["id"] for r in part["runs"]] == ["p0", "p1", "p2"]
        assert {r["side"] for r in part["runs"]} == {side} and part["ready"]["draft"] == "model"
