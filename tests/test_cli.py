"""Tests for pyspec/apps/cli.py on tiny random test models (pyspec.testmodels, context 256).

Most cases call `pyspec.apps.cli.main([...])` in process and read stdout / stderr with capsys; a few run
`python -m pyspec` as a subprocess to check the real entry point: exit status and that a user error
prints one "error:" line and no traceback.

- generate: one JSON object (text, tokens, stats, receipt); every drafter (none, ngram, self:1, a
  GGUF copy of the champion, a perturbed GGUF) gives the champion's own greedy tokens at T = 0;
  sampling with a seed is repeatable and, in replay mode, the same whatever the drafter;
  --verify rejection runs.
- tokenize: --text and --jsonl (one JSON list per input line), --special.
- score: positions agree with a direct Model.forward (argmax exactly, log-probabilities to 1e-9).
- check-pair: a compatible pair exits 0; a different tokenizer or template exits 1 and says why.
- receipt: a receipt (or generate --json's output) is printed as JSON or key: value lines, exit 0;
  anything else (not JSON, not a receipt, a text field, an adapter description) exits 2.
- errors: bad options, a mismatched or corrupt GGUF, a prompt longer than the context,
  --max-tokens 0 and friends exit 2 with one clear "error:" line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import pyspec
from conftest import greedy_pick, reference_decode
from pyspec import receipts, testmodels
from pyspec.apps import cli, request
from pyspec.cpu.fastcpu import FastModel
from pyspec.cpu.model import Model
from pyspec.load import default_draft
from pyspec.text.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[1]
PROMPT = "the cat sat on the mat. the dog"
LONG_TEXT = "the cat sat on the mat. " * 100    # ~700 tokens > the tiny context of 256


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """name -> path of the tiny GGUFs the tests share."""
    d = tmp_path_factory.mktemp("cli")
    paths = {name: str(d / f"{name}.gguf") for name in
             ("champion", "copy", "draft", "merges40", "other_merges", "other_template",
              "unreadable")}
    weights = testmodels.write_model(paths["champion"], seed=0)
    testmodels.write_model(paths["copy"], weights=weights)
    testmodels.write_model(paths["draft"], weights=testmodels.perturb(weights, 0.3, seed=1))
    testmodels.write_model(paths["merges40"], seed=2,
                           tokenizer=testmodels.tokenizer_metadata(n_merges=40))
    # The same vocabulary size, different merges: only the fingerprint tells them apart.
    other = testmodels.tokenizer_metadata(corpus=testmodels.CORPUS.upper())
    testmodels.write_model(paths["other_merges"], seed=3, tokenizer=other)
    template = {**testmodels.tokenizer_metadata(), "tokenizer.chat_template": "{{ 'x' }}"}
    testmodels.write_model(paths["other_template"], weights=weights, tokenizer=template)
    # A tokenizer pyspec cannot read: its ids name no known text, so no bridge can be built.
    unreadable = {**testmodels.tokenizer_metadata(), "tokenizer.ggml.model": "llama"}
    testmodels.write_model(paths["unreadable"], weights=weights, tokenizer=unreadable)
    blob = Path(paths["champion"]).read_bytes()
    paths["corrupt"] = str(d / "corrupt.gguf")
    Path(paths["corrupt"]).write_bytes(blob[:3000])
    paths["d"] = str(d)
    return paths


def run(capsys, *argv) -> tuple[int, str, str]:
    """main(argv) in process -> (exit status, stdout, stderr); argparse's exits included."""
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def run_module(*argv) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", "pyspec", *map(str, argv)], capture_output=True,
                          text=True, env=env, timeout=120)


def generate_json(capsys, champion, *extra) -> dict:
    code, out, err = run(capsys, "generate", "--champion", champion, "--prompt", PROMPT, "--json",
                         *extra)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    return json.loads(lines[0])


def assert_one_error_line(code, err, *words):
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for word in words:
        assert word in err, err


# ---------------------------------------------------------------------------------------------
# generate
# ---------------------------------------------------------------------------------------------
def test_generate_json_shape(capsys, models):
    r = generate_json(capsys, models["champion"], "--max-tokens", 8, "--draft", "ngram")
    assert set(r) >= {"text", "tokens", "stats", "receipt"}
    assert isinstance(r["text"], str) and 1 <= len(r["tokens"]) <= 8
    assert all(isinstance(t, int) for t in r["tokens"])
    tok = Tokenizer.from_metadata(Model.load(models["champion"]).metadata)
    assert r["text"] == tok.decode(r["tokens"])
    s = r["stats"]
    for key in ("champion_passes", "draft_calls", "acceptance_rate", "accepted_by_position",
                "tokens_per_s", "adapter"):
        assert key in s, key
    assert 1 <= s["champion_passes"] <= len(r["tokens"])
    assert 0.0 <= s["acceptance_rate"] <= 1.0 and s["tokens_per_s"] > 0
    assert sum(s["accepted_by_position"]) == s["accepted"] <= s["drafted"]
    assert s["adapter"] == "cpu-numpy"
    receipt = json.dumps(r["receipt"])
    assert r["receipt"]["stats"]["champion_passes"] == s["champion_passes"]
    assert PROMPT not in receipt and models["d"] not in receipt   # no text, no paths


@pytest.fixture(scope="module")
def greedy_reference(models) -> list[int]:
    """The champion's own greedy tokens from conftest's plain loop (no engine), cut at the first
    end-of-generation token as generate does."""
    model = Model.load(models["champion"])
    tok = Tokenizer.from_metadata(model.metadata)
    ids = tok.encode(tok.render_chat([{"role": "user", "content": PROMPT}]), special=True)
    tokens = reference_decode(model, ids, 16, greedy_pick)
    stop = next((i for i, t in enumerate(tokens) if t in tok.eog_ids), len(tokens))
    return tokens[:stop]


@pytest.mark.parametrize("draft", ["none", "ngram", "self:1", "copy", "draft", "auto"])
def test_generate_every_draft_gives_the_champion_tokens(capsys, models, greedy_reference, draft):
    spec = models.get(draft, draft)
    r = generate_json(capsys, models["champion"], "--max-tokens", 16, "--draft", spec,
                      "--k", "fixed:3")
    assert r["tokens"] == greedy_reference
    if draft == "copy":   # a draft identical to the champion is always right
        assert r["stats"]["drafted"] > 0 and r["stats"]["acceptance_rate"] == 1.0
        assert r["stats"]["champion_passes"] < len(r["tokens"])


def test_the_default_draft_is_the_one_measured_fastest_on_the_backend(capsys, models,
                                                                       monkeypatch):
    # --draft defaults to auto: n-gram on the numpy engine and on CPU adapters, the trained
    # draft on a GPU (load.default_draft; the measurements are in its docstring).
    r = generate_json(capsys, models["champion"], "--max-tokens", 4)
    assert r["stats"]["drafter"] == "ngram"
    assert default_draft(Model.load(models["champion"])) == "ngram"
    gpu = lambda is_cpu: types.SimpleNamespace(dev=types.SimpleNamespace(is_cpu=is_cpu))
    assert default_draft(gpu(True)) == "ngram"          # lavapipe, SwiftShader
    assert default_draft(gpu(False)) == "trained"       # the checkout ships models/
    def missing():
        raise FileNotFoundError("no models/")
    monkeypatch.setattr(pyspec, "trained_draft_path", missing)
    assert default_draft(gpu(False)) == "ngram"         # a wheel without models/


def test_generate_sampling_is_repeatable_and_drafter_invariant(capsys, models):
    args = ("--max-tokens", 8, "--temperature", 0.8, "--seed", 3)
    first = generate_json(capsys, models["champion"], *args, "--draft", "ngram")
    second = generate_json(capsys, models["champion"], *args, "--draft", "ngram")
    assert (first["tokens"], first["text"]) == (second["tokens"], second["text"])
    # replay mode (the default above 0): byte-identical to champion-only sampling, same seed
    for draft in ("none", "self:1", models["copy"]):
        assert generate_json(capsys, models["champion"], *args, "--draft", draft)["tokens"] == \
            first["tokens"]
    other_seed = generate_json(capsys, models["champion"], "--max-tokens", 8, "--temperature",
                               0.8, "--seed", 4)
    assert other_seed["tokens"] != first["tokens"]


def test_generate_rejection_runs(capsys, models):
    # Rejection sampling is exact in distribution but its tokens depend on k, and the default
    # heuristic picks k from measured times; a fixed k makes the run repeatable.
    args = ("--max-tokens", 8, "--temperature", 0.8, "--seed", 3, "--verify", "rejection",
            "--draft", models["draft"], "--k", "fixed:3")
    r = generate_json(capsys, models["champion"], *args)
    assert 1 <= len(r["tokens"]) <= 8 and r["receipt"]["verify"] == "rejection"
    assert generate_json(capsys, models["champion"], *args)["tokens"] == r["tokens"]


def test_generate_streams_text_and_stats(capsys, models):
    code, out, err = run(capsys, "generate", "--champion", models["champion"], "--prompt", PROMPT,
                         "--max-tokens", 6)
    assert code == 0, err
    r = generate_json(capsys, models["champion"], "--max-tokens", 6)
    assert out == r["text"] + "\n"
    assert "champion passes" in err and "tokens/s" in err


def test_generate_messages_json(capsys, models, tmp_path):
    path = tmp_path / "messages.json"
    path.write_text(json.dumps([{"role": "user", "content": PROMPT}]), encoding="utf-8")
    code, out, err = run(capsys, "generate", "--champion", models["champion"], "--messages-json",
                         path, "--json", "--max-tokens", 8)
    assert code == 0, err
    assert json.loads(out)["tokens"] == generate_json(capsys, models["champion"],
                                                      "--max-tokens", 8)["tokens"]
    path.write_bytes(b"\xff\xfe not json")
    code, _, err = run(capsys, "generate", "--champion", models["champion"], "--messages-json",
                       path)
    assert_one_error_line(code, err, "cannot read messages")
    # An editor's byte-order mark is read past; no messages at all is refused.
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps([{"role": "user", "content": PROMPT}]).encode())
    code, out, err = run(capsys, "generate", "--champion", models["champion"], "--messages-json",
                         path, "--json", "--max-tokens", 8)
    assert code == 0 and json.loads(out)["tokens"], err
    path.write_text("[]")
    code, _, err = run(capsys, "generate", "--champion", models["champion"], "--messages-json",
                       path)
    assert_one_error_line(code, err, "holds no messages")


def test_demo_refuses_a_bad_draft_before_it_runs(capsys, models):
    code, out, err = run(capsys, "demo", "--champion", models["champion"], "--draft", "ngrams",
                         "--max-tokens", "4")
    assert_one_error_line(code, err, "unknown draft 'ngrams'")
    assert out == ""
    missing = Path(models["d"]) / "missing.gguf"   # a flag is checked before the model loads
    for flag, value, words in [("--runs", 0, "--runs must be at least 1"),
                               ("--warmup", -1, "--warmup must be 0 or more"),
                               ("--max-tokens", 0, "--max-tokens must be a positive integer")]:
        code, out, err = run(capsys, "demo", "--champion", missing, flag, value)
        assert_one_error_line(code, err, words)


def test_demo_times_each_side_after_a_warm_up_and_shows_the_speedup_with_its_acceptance(
        capsys, models):
    """Each side streams its first timed run; the summary gives each side's median [min, max]
    of --runs runs, and the speedup only beside its tokens per pass and acceptance."""
    code, out, err = run(capsys, "demo", "--champion", models["champion"], "--draft",
                         models["draft"], "--max-tokens", 8, "--runs", 2)
    assert code == 0, err
    assert len([line for line in out.splitlines() if line]) == 2   # one text a side
    assert "(warming up: 1 unreported run a side)" in err
    assert "[run 1/2: champion only" in err and "[run 2/2: champion only" in err
    assert "tokens/s, median [min, max] of 2 runs a side after a warm-up:" in err
    speedup = next(line for line in err.splitlines() if line.startswith("speedup "))
    assert "tokens per champion pass, acceptance" in speedup, speedup
    assert err.rstrip().endswith("identical output: True")


def test_the_demo_alternates_the_sides_after_the_warm_up(monkeypatch):
    """Warm-up first (every side, unreported), then the sides take turns at going first; each
    side's first timed run is the one streamed."""
    from pyspec.apps import demo
    calls = []

    class Side:
        def __init__(self, name):
            self.name, self.draft_source = name, None

        def generate(self, ids, opts):
            calls.append(self.name)
            return types.SimpleNamespace(stats={"tokens_per_s": 1.0}, tokens=[1])

    def streamed(engine, ids, opts):
        calls.append(engine.name + " streamed")
        return {"stats": {"tokens_per_s": 1.0}, "tokens": [1]}

    monkeypatch.setattr(demo, "stream_to_stdout", streamed)
    monkeypatch.setattr(demo, "print_stats", lambda stats: None)
    stats, tokens = demo.timed_runs([Side("base"), Side("spec")], [0], None, runs=3, warmup=1)
    assert calls == ["base", "spec", "base streamed", "spec streamed", "spec", "base", "base",
                     "spec"]
    assert [len(s) for s in stats] == [3, 3] and tokens == [[[1]] * 3] * 2


# ---------------------------------------------------------------------------------------------
# tokenize
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tok(models) -> Tokenizer:
    return Tokenizer.from_metadata(Model.load(models["champion"]).metadata)


def test_tokenize_text(capsys, models, tok):
    code, out, err = run(capsys, "tokenize", "--model", models["champion"], "--text", PROMPT)
    assert code == 0, err
    assert json.loads(out) == tok.encode(PROMPT) and len(json.loads(out)) > 1


def test_tokenize_special(capsys, models, tok):
    text = "<|im_start|>user hi"
    code, out, _ = run(capsys, "tokenize", "--model", models["champion"], "--text", text,
                       "--special")
    ids = json.loads(out)
    assert code == 0 and ids[0] == 1 and ids.count(1) == 1       # <|im_start|> is id 1
    assert tok.decode(ids[1:]) == "user hi"
    code, out, _ = run(capsys, "tokenize", "--model", models["champion"], "--text", text)
    plain = json.loads(out)
    assert code == 0 and 1 not in plain and tok.decode(plain) == text


def test_tokenize_jsonl(capsys, models, tok, tmp_path):
    texts = ["the cat", "", "ünïcode ✓", "<|im_start|>x"]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in texts) + "\n\n", encoding="utf-8")
    code, out, err = run(capsys, "tokenize", "--model", models["champion"], "--jsonl", path,
                         "--special")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == len(texts)
    assert [json.loads(line) for line in lines] == [tok.encode(t, special=True) for t in texts]
    assert json.loads(lines[3]) == [1, *tok.encode("x")]


@pytest.mark.parametrize("content, words", [
    ('{"text": "ok"}\n[1, 2]\n', ["line 2"]),
    ('{"text": 5}\n', ["line 1"]),
    (b"\xff\xfe\n", ["line 1 is not valid UTF-8", "save the file as UTF-8"]),
    (b'{"text": "ok"}\n{"text": "caf\xe9"}\n', ["line 2 is not valid UTF-8", "byte 14"]),
    ('{"text": "ok"}\n\n{"text": "a\\ud800b"}\n', ["line 3", "lone surrogate", "remove it"]),
    (None, ["no such file; check the path"]),
], ids=["not-an-object", "not-a-string", "not-utf8", "not-utf8-line-2", "lone-surrogate",
        "missing"])
def test_tokenize_jsonl_errors(capsys, models, tmp_path, content, words):
    """Each error names the line (invalid UTF-8 too) and says what to do, in the CLI's terms."""
    path = tmp_path / "in.jsonl"
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    elif content is not None:
        path.write_bytes(content)
    code, _, err = run(capsys, "tokenize", "--model", models["champion"], "--jsonl", path)
    assert_one_error_line(code, err, *words)
    assert "surrogatepass" not in err


def test_tokenize_text_that_is_not_utf8(models):
    """--text with bytes that are not UTF-8 (argv hands them over as lone surrogates) says
    what a CLI user can do, not what Python's codecs could."""
    p = subprocess.run([sys.executable, "-m", "pyspec", "tokenize", "--model", models["champion"],
                        "--text", b"caf\xe9"], capture_output=True, timeout=120, cwd=REPO)
    err = p.stderr.decode("utf-8", "replace")
    assert_one_error_line(p.returncode, err, "--text is not valid UTF-8", "--jsonl")
    assert "surrogatepass" not in err and p.stdout == b""


# ---------------------------------------------------------------------------------------------
# score
# ---------------------------------------------------------------------------------------------
def test_score_matches_direct_forward(capsys, models, tok):
    continuation = tok.encode(" sat on the mat")
    code, out, err = run(capsys, "score", "--champion", models["champion"], "--prompt", PROMPT,
                         "--continuation-ids", json.dumps(continuation), "--top", 3, "--json")
    assert code == 0, err
    positions = json.loads(out)["positions"]
    assert len(positions) == len(continuation)

    model = FastModel.load(models["champion"])   # the engine `score` runs on (--backend cpu)
    prompt = tok.encode(tok.render_chat([{"role": "user", "content": PROMPT}]), special=True)
    seq = prompt + continuation
    logits = model.forward(seq[:-1], model.new_cache(len(seq)))[len(prompt) - 1:]
    for pos, row, token in zip(positions, logits.astype(np.float64), continuation):
        assert pos["argmax"] == int(np.argmax(row))
        top = pos["top"]
        assert len(top) == 3 and top[0][0] == pos["argmax"]
        assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)
        assert all(v == pytest.approx(row[i], rel=1e-6) for i, v in top)
        logz = row.max() + np.log(np.exp(row - row.max()).sum())
        assert pos["logprob"] <= 0 and pos["logprob"] == pytest.approx(row[token] - logz,
                                                                       abs=1e-9)


def test_score_raw(capsys, models, tok):
    code, out, err = run(capsys, "score", "--champion", models["champion"], "--raw", "--prompt",
                         "the", "--continuation-ids", json.dumps(tok.encode(" cat")), "--top", 1)
    assert code == 0, err
    positions = json.loads(out)["positions"]
    assert len(positions) == len(tok.encode(" cat")) and len(positions[0]["top"]) == 1


@pytest.mark.parametrize("extra, words", [
    (["--prompt", "the", "--continuation-ids", "[1, 2"], ["JSON list"]),
    (["--prompt", "the", "--continuation-ids", "[]"], ["empty"]),
    (["--prompt", "the", "--continuation-ids", "[5, 100000]"], ["vocabulary"]),
    (["--prompt", "the", "--continuation-ids", "[-1]"], ["vocabulary"]),
    (["--raw", "--prompt", "", "--continuation-ids", "[5, 6]"], ["prompt is empty"]),
    (["--raw", "--prompt", LONG_TEXT, "--continuation-ids", "[5]"], ["context"]),
    (["--prompt", "the", "--continuation-ids", "[1.5]"], ["integer token ids"]),
    (["--prompt", "the", "--continuation-ids", "[true]"], ["integer token ids"]),
    (["--prompt", "the", "--continuation-ids", '["19"]'], ["integer token ids"]),
    (["--prompt", "the", "--continuation-ids", "[1e400]"], ["integer token ids"]),
], ids=["bad-json", "empty", "past-vocab", "negative", "empty-prompt", "too-long", "float",
        "bool", "string", "huge"])
def test_score_errors(capsys, models, extra, words):
    code, _, err = run(capsys, "score", "--champion", models["champion"], *extra)
    assert_one_error_line(code, err, *words)


# ---------------------------------------------------------------------------------------------
# check-pair
# ---------------------------------------------------------------------------------------------
def test_check_pair_compatible(capsys, models):
    code, out, err = run(capsys, "check-pair", "--champion", models["champion"], "--draft",
                         models["draft"])
    assert code == 0, err
    assert out.startswith("compatible")
    code, out, _ = run(capsys, "check-pair", "--champion", models["champion"], "--draft",
                       models["draft"], "--json")
    assert code == 0 and json.loads(out)["ok"] is True and json.loads(out)["reasons"] == []


@pytest.mark.parametrize("draft, words", [
    ("merges40", ["compatible: token-level intersection of 299 tokens (92.6% of the champion's 323"]),
    ("other_merges", ["compatible: token-level intersection of"]),
    ("other_template", ["compatible: identical", "chat templates differ"]),
])
def test_check_pair_classes(capsys, models, draft, words):
    """A pair is classified from the files alone (compat.py): what it is and what it implies."""
    code, out, err = run(capsys, "check-pair", "--champion", models["champion"], "--draft",
                         models[draft])
    assert code == 0, err
    for word in words:
        assert word in out
    code, out, _ = run(capsys, "check-pair", "--champion", models["champion"], "--draft",
                       models[draft], "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] is True and report["class"] in ("tli", "identical")
    # the share of the champion's vocabulary the draft can propose, for every class
    if report["class"] == "identical":
        assert report["shared_tokens"] == 323 and report["share"] == 1.0
    else:
        assert 0 < report["shared_tokens"] < 323 and report["share"] < 1.0


def test_check_pair_notes_a_draft_with_a_shorter_context(capsys, models, tmp_path):
    """Past the draft's own context the champion decodes alone: check-pair says so."""
    short = str(tmp_path / "short.gguf")
    testmodels.write_model(short, seed=0, ctx=80)
    code, out, err = run(capsys, "check-pair", "--champion", models["champion"], "--draft", short)
    assert code == 0, err
    assert "the draft's context is 80 positions, the champion's 256" in out
    code, out, _ = run(capsys, "check-pair", "--champion", models["champion"], "--draft",
                       models["draft"])
    assert "context" not in out


def test_generate_notes_a_draft_context_shorter_than_the_request(capsys, models, tmp_path):
    """A draft model of 80 positions with a request that runs past them: a note says where the
    champion goes on alone, and the output is still the champion's."""
    short = str(tmp_path / "short.gguf")
    testmodels.write_model(short, seed=0, ctx=80)
    alone = generate_json(capsys, models["champion"], "--draft", "none", "--max-tokens", 100)
    code, out, err = run(capsys, "generate", "--champion", models["champion"], "--prompt",
                         PROMPT, "--json", "--draft", short, "--max-tokens", 100)
    assert code == 0 and "note: the draft's context is 80 positions" in err
    assert json.loads(out)["tokens"] == alone["tokens"]
    code, out, err = run(capsys, "generate", "--champion", models["champion"], "--prompt",
                         PROMPT, "--json", "--draft", short, "--max-tokens", 8)
    assert code == 0 and "note:" not in err


def test_check_pair_auto_checks_the_model_auto_may_draft_with(capsys, models):
    code, out, err = run(capsys, "check-pair", "--champion", models["champion"], "--draft",
                         "auto", "--json")
    report = json.loads(out)
    assert code == (0 if report["ok"] else 1), err
    assert any(n.startswith("--draft auto drafts with this model on a GPU") for n in report["notes"])


def test_check_pair_reads_a_reduced_head_sidecar(capsys, models, tmp_path):
    """A draft's DRAFT.vocab.json (load.reduced_head_ids) is checked with the pair: a good one is
    named, a bad one makes the pair fail with what to do."""
    draft = tmp_path / "d.gguf"
    draft.write_bytes(Path(models["draft"]).read_bytes())
    side = tmp_path / "d.vocab.json"
    side.write_text(json.dumps({"schema": "pyspec.draft-vocab/1", "head_rows": 100,
                                "ids": list(range(300, 0, -1))}))
    code, out, err = run(capsys, "check-pair", "--champion", models["champion"], "--draft",
                         str(draft))
    assert code == 0, err
    assert "head cut to the 100 ids d.vocab.json ranks first" in out
    side.write_text(json.dumps({"schema": "pyspec.draft-vocab/1", "head_rows": 2,
                                "ids": [5, 5]}))
    code, out, _ = run(capsys, "check-pair", "--champion", models["champion"], "--draft",
                       str(draft))
    assert code == 1 and "NOT compatible" in out and "delete it" in out
    for broken in (b"\xff\xfe", b'{"schema": "pyspec.draft-vocab/1", "head_rows": 1e400, '
                   b'"ids": [1]}', b"[" * 100_000 + b"]" * 100_000):
        side.write_bytes(broken)     # not UTF-8, a number past int, nested past recursion
        code, out, err = run(capsys, "check-pair", "--champion", models["champion"], "--draft",
                             str(draft))
        assert code == 1 and "NOT compatible" in out and "delete it" in out, err
        assert "Traceback" not in err
        code, _, err = run(capsys, "generate", "--champion", models["champion"], "--prompt",
                           "hi", "--max-tokens", "2", "--draft", str(draft))
        assert_one_error_line(code, err, "d.vocab.json", "delete it")


def test_check_pair_reads_the_tensors_generate_would_load(capsys, models, tmp_path):
    """A draft whose metadata pairs but whose tensors do not make the model it says (one
    missing, more layers than it holds, a product of another width) fails check-pair, as it
    would fail generate, naming the tensor."""
    from pyspec.formats.gguf import GGUFFile
    from pyspec.formats.ggufwrite import RawTensor, write

    src = GGUFFile.open(models["draft"])
    tensors = {n: RawTensor(src.raw(n).copy(), src.tensor(n).shape, src.tensor(n).type_id)
               for n in src.tensors}
    cases = {"missing": ({}, "blk.1.ffn_down.weight", "is missing"),
             "layers": ({"llama.block_count": src.metadata["llama.block_count"] + 1}, None,
                        "blk.2.attn_norm.weight"),
             "width": ({"llama.feed_forward_length": 96}, None, "has shape")}
    for name, (meta, drop, words) in cases.items():
        path = tmp_path / f"{name}.gguf"
        write(path, {**src.metadata, **meta}, {n: t for n, t in tensors.items() if n != drop})
        code, out, err = run(capsys, "check-pair", "--champion", models["champion"], "--draft",
                             str(path))
        assert code == 1 and "NOT compatible" in out and words in out, (name, out, err)
        code, _, err = run(capsys, "generate", "--champion", models["champion"], "--prompt",
                           "hi", "--max-tokens", "2", "--draft", str(path))
        assert code == 2 and "Traceback" not in err, err


def test_a_tensor_of_another_shape_names_its_file(capsys, models, tmp_path):
    """A GGUF whose metadata makes a tensor another shape than it holds: loading it as the
    champion (either CPU backend) or as the draft, and check-pair, name the file and say to
    pick another model."""
    from pyspec.formats.gguf import GGUFFile
    from pyspec.formats.ggufwrite import RawTensor, write

    src = GGUFFile.open(models["draft"])
    tensors = {n: RawTensor(src.raw(n).copy(), src.tensor(n).shape, src.tensor(n).type_id)
               for n in src.tensors}
    path = tmp_path / "wide.gguf"
    write(path, {**src.metadata, "llama.feed_forward_length": 96}, tensors)
    words = ("wide.gguf: tensor", "'blk.0.ffn_gate.weight' has shape", "pick another model")
    for backend in ("cpu", "numpy"):
        code, out, err = run(capsys, "generate", "--champion", path, "--prompt", "hi",
                             "--backend", backend)
        assert_one_error_line(code, err, *words)
        code, out, err = run(capsys, "generate", "--champion", models["champion"], "--prompt",
                             "hi", "--backend", backend, "--draft", path)
        assert_one_error_line(code, err, *words)
    code, out, err = run(capsys, "check-pair", "--champion", models["champion"], "--draft", path)
    assert code == 1 and all(w in out for w in words), out


def test_a_draft_with_broken_weights_costs_speed_and_is_named(capsys, models, tmp_path):
    """A draft whose weights decode to NaN (every byte of its embedding 0xff) costs speed, not
    the request: the text is champion-only's, and a note names the draft and what to do."""
    from pyspec.formats.gguf import GGUFFile
    from pyspec.formats.ggufwrite import RawTensor, write

    src = GGUFFile.open(models["draft"])
    tensors = {n: RawTensor(src.raw(n).copy(), src.tensor(n).shape, src.tensor(n).type_id)
               for n in src.tensors}
    tensors["token_embd.weight"].data[:] = 0xFF
    path = tmp_path / "nan.gguf"
    write(path, dict(src.metadata), tensors)
    code, out, err = run(capsys, "generate", "--champion", models["champion"], "--prompt", "hi",
                         "--max-tokens", "4", "--k", "fixed:2", "--draft", str(path), "--json")
    assert code == 0, err
    assert "note: the draft model's logits were NaN" in err and "--draft ngram or none" in err
    got = json.loads(out)
    assert got["receipt"]["faults"][0]["kind"] == "bad_draft"
    code, alone, err = run(capsys, "generate", "--champion", models["champion"], "--prompt", "hi",
                           "--max-tokens", "4", "--draft", "none", "--json")
    assert code == 0 and got["tokens"] == json.loads(alone)["tokens"], err


def test_a_champion_with_broken_weights_is_named(capsys, models, tmp_path):
    """A champion whose weights decode to NaN (every byte of its weight data 0xff) stops
    generate and score with one error line that names the champion's weights and what to do,
    not the forward pass."""
    from pyspec.formats.gguf import GGUFFile
    from pyspec.formats.ggufwrite import RawTensor, write

    src = GGUFFile.open(models["champion"])
    tensors = {n: RawTensor(src.raw(n).copy(), src.tensor(n).shape, src.tensor(n).type_id)
               for n in src.tensors}
    for tensor in tensors.values():
        tensor.data[:] = 0xFF
    path = tmp_path / "nan-champion.gguf"
    write(path, dict(src.metadata), tensors)
    for argv in (["generate", "--max-tokens", "4", "--draft", "none"],
                 ["generate", "--max-tokens", "4", "--draft", "ngram", "--temperature", "0.8"],
                 ["score", "--continuation-ids", "[5]"]):
        code, out, err = run(capsys, *argv, "--champion", path, "--prompt", "hi")
        assert_one_error_line(code, err, "champion model's logits are NaN",
                              "weights may be corrupt", "download the model again")
        assert "forward pass" not in err and out == ""


def test_check_pair_says_a_drafter_is_not_a_draft_model(capsys, models):
    for draft in ("ngram", "self:1", "none"):
        code, out, err = run(capsys, "check-pair", "--champion", models["champion"], "--draft",
                             draft)
        assert_one_error_line(code, err, f"--draft {draft} needs no draft model",
                              "check-pair checks")
    # `model` is the page's draft model given at init: here it needs a path
    for draft in ("model", "ngram+model"):
        code, out, err = run(capsys, "check-pair", "--champion", models["champion"], "--draft",
                             draft)
        assert_one_error_line(code, err, "given to the page at init", "model:PATH")


def test_generate_names_what_model_means_on_the_command_line(capsys, models):
    for draft in ("model", "ngram+model"):
        code, _, err = run(capsys, "generate", "--champion", models["champion"], "--prompt",
                           PROMPT, "--draft", draft, "--max-tokens", 4)
        assert_one_error_line(code, err, f"draft {draft!r}", "given to the page at init",
                              "model:PATH")
        assert "None" not in err


def test_a_draft_file_of_any_name_is_a_draft_model(capsys, models, tmp_path):
    """An existing file is a draft model whatever its name ends in; a name that is neither a
    drafter nor a file says how to spell a path."""
    renamed = tmp_path / "draft.bin"
    renamed.write_bytes(Path(models["draft"]).read_bytes())
    alone = generate_json(capsys, models["champion"], "--draft", "none", "--max-tokens", 8)
    for spec in (str(renamed), f"model:{renamed}", f"ngram+{renamed}"):
        got = generate_json(capsys, models["champion"], "--draft", spec, "--max-tokens", 8,
                            "--k", "fixed:2")
        assert got["tokens"] == alone["tokens"] and got["stats"]["drafted"] > 0, spec
    code, _, err = run(capsys, "generate", "--champion", models["champion"], "--prompt", PROMPT,
                       "--draft", "nosuchdraft", "--max-tokens", 4)
    assert_one_error_line(code, err, "unknown draft 'nosuchdraft'", "model:PATH",
                          "no file 'nosuchdraft' exists here")


def test_a_combination_reports_its_draft_models_bridge(capsys, models):
    """ngram+PATH with a draft of another vocabulary: stats.bridge and the receipt's
    draft.bridge are the bridge's, as for the draft model alone."""
    alone = generate_json(capsys, models["champion"], "--draft", models["merges40"])
    combo = generate_json(capsys, models["champion"], "--draft", f"ngram+{models['merges40']}")
    for got in (alone, combo):
        assert got["stats"]["bridge"]["kind"] == "tli", got["stats"]
        assert got["stats"]["bridge"]["shared_tokens"] == 299
        assert got["receipt"]["draft"]["bridge"]["kind"] == "tli"
    assert combo["receipt"]["draft"]["kind"] == "combo"


def test_a_verify_mode_at_temperature_zero_is_noted(capsys, models):
    """replay or rejection at T = 0 run as greedy (every rule picks the argmax): said on stderr,
    and the receipt says greedy."""
    code, out, err = run(capsys, "generate", "--champion", models["champion"], "--prompt",
                         PROMPT, "--verify", "rejection", "--max-tokens", 4, "--json")
    assert code == 0 and "note: --verify rejection at temperature 0 runs as greedy" in err
    assert json.loads(out)["receipt"]["verify"] == "greedy"
    code, out, err = run(capsys, "generate", "--champion", models["champion"], "--prompt",
                         PROMPT, "--verify", "rejection", "--temperature", 0.7, "--max-tokens",
                         4, "--json")
    assert code == 0 and "note:" not in err


def test_check_pair_incompatible(capsys, models):
    code, out, err = run(capsys, "check-pair", "--champion", models["champion"], "--draft",
                         models["unreadable"])
    assert code == 1, err
    assert out.startswith("NOT compatible") and "a tokenizer cannot be read" in out
    code, out, _ = run(capsys, "check-pair", "--champion", models["champion"], "--draft",
                       models["unreadable"], "--json")
    report = json.loads(out)
    assert code == 1 and report["ok"] is False and report["class"] is None


def test_generate_with_mismatched_draft_is_refused(models):
    """The real entry point: exit 2, one error line that says why, no traceback."""
    p = run_module("generate", "--champion", models["champion"], "--prompt", PROMPT,
                   "--draft", models["unreadable"], "--max-tokens", 4)
    assert_one_error_line(p.returncode, p.stderr, "a tokenizer cannot be read",
                          "cannot be used with this champion")
    assert p.stdout == ""


def test_generate_with_a_bridged_draft_equals_champion_only(capsys, models):
    """--draft with another vocabulary runs through the bridge (drafters/bridge.py): the same
    greedy text as champion-only, the intersection in the stats and the receipt."""
    alone = generate_json(capsys, models["champion"], "--draft", "none", "--max-tokens", 24)
    bridged = generate_json(capsys, models["champion"], "--draft", models["merges40"],
                            "--max-tokens", 24, "--k", "fixed:3")
    assert bridged["tokens"] == alone["tokens"] and bridged["text"] == alone["text"]
    assert bridged["stats"]["bridge"]["kind"] == "tli"
    assert bridged["stats"]["bridge"]["shared_tokens"] == 299
    assert bridged["receipt"]["draft"]["bridge"]["shared_tokens"] == 299
    assert bridged["stats"]["drafted"] > 0


# ---------------------------------------------------------------------------------------------
# receipt
# ---------------------------------------------------------------------------------------------
def test_receipt_validates_and_prints(capsys, models, tmp_path):
    """A receipt from generate --json, and that whole output, are valid: printed as JSON equal to
    the receipt, or as one `key: value` line per leaf."""
    receipt = generate_json(capsys, models["champion"], "--max-tokens", 4)["receipt"]
    path = tmp_path / "receipt.json"
    path.write_text(json.dumps(receipt))
    whole = tmp_path / "generate.json"
    whole.write_text(json.dumps({"text": "hi", "tokens": [1], "receipt": receipt}))
    for source in (path, whole):
        code, out, err = run(capsys, "receipt", source, "--json")
        assert code == 0 and err == "" and json.loads(out) == receipt
    code, out, err = run(capsys, "receipt", path)
    assert code == 0 and err == ""
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    assert lines["schema"] == receipts.SCHEMA and lines["stats.adapter"] == "cpu-numpy"
    assert lines["draft.kind"] == "ngram" and lines["draft.sha256"] == "null"
    assert json.loads(lines["stats.accepted_by_position"]) == \
        receipt["stats"]["accepted_by_position"]


@pytest.mark.parametrize("content, words", [
    (b"{not json", "cannot read a receipt"),
    (b"\xff\xfe", "cannot read a receipt"),
    (b"[" * 100_000, "cannot read a receipt"),
    (b"[]", "not a pyspec receipt"),
    (b'{"text": "hi"}', "not a pyspec receipt"),
    (b'{"schema": "other/1"}', "not a pyspec receipt"),
    (None, "holds a string"),            # a text field added to a real receipt
    (None, "class"),                     # an adapter description instead of its class
    (None, "not a receipt's"),           # token ids added to a real receipt
    (None, "not a mode temperature"),    # a setting out of its range
])
def test_receipt_refuses_what_is_not_a_valid_receipt(capsys, models, tmp_path, content, words):
    path = tmp_path / "receipt.json"
    if content is None:
        receipt = generate_json(capsys, models["champion"], "--max-tokens", 2)["receipt"]
        if words == "class":
            receipt["stats"]["adapter"] = "llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan, wgpu-py)"
        elif words == "not a receipt's":
            receipt["tokens"] = [19556, 665]
        elif words == "not a mode temperature":
            receipt["verify"] = "bogus"
        else:
            receipt["prompt"] = "the cat sat"
        content = json.dumps(receipt).encode()
    path.write_bytes(content)
    code, out, err = run(capsys, "receipt", path)
    assert_one_error_line(code, err, words)
    assert out == ""
    code, _, err = run(capsys, "receipt", tmp_path / "missing.json")
    assert_one_error_line(code, err, "missing.json: no such file; check the path.")


# ---------------------------------------------------------------------------------------------
# errors a user can fix
# ---------------------------------------------------------------------------------------------
def test_module_entry_point_and_bad_options():
    p = run_module("generate", "--prompt", "hi", "--bogus")
    assert p.returncode == 2 and "unrecognized arguments" in p.stderr
    assert "Traceback" not in p.stderr
    p = run_module()
    assert p.returncode == 2 and "usage:" in p.stderr


@pytest.mark.parametrize("extra, words", [
    (["--verify", "bogus"], ["invalid choice: 'bogus'"]),
    (["--max-tokens", "many"], ["invalid int value"]),
    (["--nope"], ["unrecognized arguments: --nope"]),
    (["--temperature", "hot"], ["invalid float value"]),
], ids=["verify", "max-tokens", "unknown", "temperature"])
def test_generate_argparse_errors(capsys, models, extra, words):
    code, out, err = run(capsys, "generate", "--champion", models["champion"], "--prompt", "hi",
                         *extra)
    assert code == 2 and out == ""
    for word in words:
        assert word in err, err


@pytest.mark.parametrize("extra, words", [
    (["--k", "foo"], ["unknown speculation policy 'foo'"]),
    (["--k", "fixed:-1"], ["fixed:K"]),
    (["--max-tokens", "0"], ["--max-tokens must be a positive integer"]),
    (["--max-tokens", "-3"], ["--max-tokens"]),
    (["--temperature", "-1"], ["temperature"]),
    (["--temperature", "0.8", "--verify", "greedy"], ["--verify greedy needs temperature 0"]),
    (["--draft", "self:9"], ["L must be an integer in 1..1"]),
    (["--draft", "self:x"], ["L must be an integer"]),
    (["--raw", "--prompt", LONG_TEXT], ["context holds 256"]),
], ids=["k-foo", "k-negative", "max-tokens-0", "max-tokens-negative", "temperature", "greedy-hot",
        "self-too-deep", "self-not-int", "prompt-too-long"])
def test_generate_user_errors(capsys, models, extra, words):
    argv = ["generate", "--champion", models["champion"], "--max-tokens", "4"]
    if "--prompt" not in extra:
        argv += ["--prompt", "hi"]
    code, out, err = run(capsys, *argv, *extra)
    assert_one_error_line(code, err, *words)
    assert out == ""


@pytest.mark.parametrize("command", ["generate", "chat"])
@pytest.mark.parametrize("extra, words", [
    (["--temperature", "-1"], "--temperature must be a finite number >= 0, got -1.0"),
    (["--seed", "-1"], "--seed must be an integer in [0, 2^64), got -1"),
    (["--stop", "a"] * 5, "--stop takes at most 4 strings, got 5"),
    (["--stop", ""], "--stop strings must not be empty"),
    (["--k", "foo"], "--k: unknown speculation policy 'foo'"),
    (["--tree", "2,x"], "--tree '2,x': give widths per depth"),
    (["--top-p", "0"], "--top-p must be a number in (0, 1]"),
    (["--verify", "greedy", "--temperature", "1"], "--verify greedy needs temperature 0"),
    (["--draft", "ngrams"], "unknown draft 'ngrams'"),
], ids=["temperature", "seed", "stop-count", "stop-empty", "k", "tree", "top-p", "verify",
        "draft"])
def test_an_option_error_names_the_flag_before_the_model_loads(capsys, models, command, extra,
                                                              words):
    """The champion named here does not exist: the error about the flag comes first, so it was
    checked before any model was read."""
    missing = Path(models["d"]) / "missing.gguf"
    argv = [command, "--champion", missing, *extra]
    code, out, err = run(capsys, *argv, *(["--prompt", "hi"] if command == "generate" else []))
    assert_one_error_line(code, err, words)
    assert "missing.gguf" not in err and out == ""


def test_a_missing_file_reads_alike_in_every_command(capsys, models, tmp_path):
    """One wording for a path that names no file, whatever the command and the file's role."""
    missing = str(tmp_path / "missing.json")
    champion = ["--champion", models["champion"]]
    for argv in (["info", missing], ["generate", "--champion", missing, "--prompt", "hi"],
                 ["generate", *champion, "--messages-json", missing],
                 ["generate", *champion, "--prompt", "hi", "--json-schema", missing],
                 ["receipt", missing],
                 ["tokenize", "--model", models["champion"], "--jsonl", missing],
                 ["check-pair", *champion, "--draft", missing],
                 ["bench", *champion, "--workload", missing, "--out", tmp_path / "o"],
                 ["demo", "--champion", missing]):
        code, out, err = run(capsys, *argv)
        assert_one_error_line(code, err, f"{missing}: no such file; check the path.")


def test_the_error_policy_refuses_a_prompt_that_leaves_too_little_room(capsys, models):
    """--context-overflow error refuses a --prompt (chat or raw) that leaves fewer than
    max_tokens positions, as it does a --messages-json conversation; drop_oldest (the default)
    generates to the context's end."""
    for raw in ([], ["--raw"]):
        argv = ["generate", "--champion", models["champion"], "--prompt", "the cat sat on the mat",
                "--max-tokens", "100", "--ctx", "80", "--draft", "none", *raw]
        code, out, err = run(capsys, *argv, "--context-overflow", "error")
        assert_one_error_line(code, err, "--max-tokens 100", "context holds 80")
        assert out == ""
        code, out, err = run(capsys, *argv, "--json")
        assert code == 0 and json.loads(out)["finish_reason"] == "context", err


def test_a_closed_output_pipe_ends_quietly(models):
    """`pyspec generate ... | head -c 1`: no traceback when the reader goes away."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    p = subprocess.run(f"{sys.executable} -m pyspec generate --champion {models['champion']} "
                       "--prompt hi --max-tokens 48 --draft none | head -c 1", shell=True,
                       capture_output=True, env=env, timeout=120)
    err = p.stderr.decode("utf-8", "replace")
    assert len(p.stdout) == 1 and "Traceback" not in err and "Error" not in err, err


def test_corrupt_or_missing_gguf(capsys, models):
    for argv in (["generate", "--champion", models["corrupt"], "--prompt", "hi"],
                 ["generate", "--champion", models["champion"], "--prompt", "hi", "--draft",
                  models["corrupt"]],
                 ["tokenize", "--model", models["corrupt"], "--text", "hi"],
                 ["check-pair", "--champion", models["champion"], "--draft", models["corrupt"]]):
        code, out, err = run(capsys, *argv)
        assert_one_error_line(code, err, "corrupt.gguf", "at byte ", "download it again")
        assert out == ""
    missing = str(Path(models["d"]) / "missing.gguf")
    for argv, words in [(["generate", "--champion", missing, "--prompt", "hi"],
                         [missing, "no such file; check the path"]),
                        (["generate", "--champion", models["d"], "--prompt", "hi"],
                         [models["d"], "is a folder, not a GGUF file"]),
                        (["tokenize", "--model", missing, "--text", "hi"], ["no such file"]),
                        (["check-pair", "--champion", models["champion"], "--draft", missing],
                         ["no such file"])]:
        code, _, err = run(capsys, *argv)
        assert_one_error_line(code, err, *words)
        assert "corrupt" not in err and "download" not in err


@pytest.mark.parametrize("backend", ["cpu", "wgpu"])
def test_a_missing_draft_is_named_as_typed(capsys, models, backend, request):
    """--draft ngram+PATH with no file at PATH names the spec as the user wrote it, and PATH,
    never a spelling of it they never typed (model:PATH); the numpy and the GPU engines alike."""
    if backend == "wgpu":
        request.getfixturevalue("gpu")
    missing = str(Path(models["d"]) / "nope.gguf")
    for draft in (f"ngram+{missing}", missing, f"ngram+model:{missing}"):
        code, _, err = run(capsys, "generate", "--champion", models["champion"], "--prompt",
                           "hi", "--max-tokens", 2, "--draft", draft, "--backend", backend)
        assert_one_error_line(code, err, f"draft '{draft}'", f"no GGUF draft model at "
                              f"'{missing}'")
        assert "model:" not in err.replace(draft, "")


def test_draft_typo_and_bad_workload_are_clear_errors(tiny, tmp_path, capsys):
    code = cli.main(["generate", "--champion", tiny.champion_path, "--prompt", "hi",
                     "--draft", "ngrams", "--max-tokens", "2"])
    assert code == 2 and "unknown draft 'ngrams'" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "stratum": "s", "messages": [{"role": "user", "content": "hi"}]}'
                   '\nnot json\n')
    code = cli.main(["bench", "--workload", str(bad), "--champion", tiny.champion_path,
                     "--out", str(tmp_path / "o")])
    assert code == 2 and "line 2 is not JSON" in capsys.readouterr().err


@pytest.mark.parametrize("lines, extra, words", [
    (['"max_tokens": "3"'], [], ["line 1", "max_tokens must be a positive integer"]),
    (['"max_tokens": null'], [], ["line 1", "max_tokens"]),
    (['"id": ["a"]'], [], ["line 1", "id and stratum must be strings"]),
    (['"stratum": ["chat"]'], [], ["line 1", "strings"]),
    (["", '"messages": [{"role": "usr", "content": "x"}]'], [], ["line 2 (p2)", "usr"]),
    ([""], ["--max-tokens", "-1"], ["--max-tokens must be >= 1 (0: no cap)"]),
    ([""], ["--per-stratum", "-1"], ["--per-stratum must be >= 1"]),
    ([""], ["--repeat", "0"], ["--repeat must be >= 1"]),
    ([""], ["--drafts", ","], ["--drafts names no drafter"]),
    ([""], ["--out", "FILE"], ["is a file", "name a folder"]),
    ([""], ["--out", "FILE/sub"], ["--out", "cannot write there", "Not a directory"]),
    ([""], ["--out", "/proc/nope"], ["--out /proc/nope", "cannot write there"]),
    (['"id": ["a"]'], ["--out", "NEW/a/b"], ["line 1"]),
], ids=["max-tokens-str", "max-tokens-null", "id-list", "stratum-list", "messages-line-2",
        "cap-negative", "per-stratum", "repeat", "no-drafts", "out-file", "out-under-file",
        "out-unwritable", "out-nested-left-unmade"])
def test_bench_refuses_bad_input_before_anything_runs(tiny, tmp_path, capsys, lines, extra,
                                                      words):
    """Each workload line and option is checked before a prompt runs: one error line naming the
    line (and the prompt's id where the template refuses its messages), nothing written; an
    --out that cannot be written is found then, not after the run, and the folders --out names
    are not left behind by a refused run."""
    if "/proc/nope" in extra and not os.path.isdir("/proc"):
        pytest.skip("no /proc here")
    workload = tmp_path / "w.jsonl"
    rows = []
    for n, fields in enumerate(lines, 1):
        base = {"id": f"p{n}", "stratum": "chat", "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}]}
        rows.append(json.dumps({**base, **json.loads("{" + fields + "}")}))
    workload.write_text("\n".join(rows) + "\n")
    (tmp_path / "FILE").write_text("keep me")
    out = tmp_path / "out"
    extra = [str(tmp_path / x) if x.startswith(("FILE", "NEW")) else x for x in extra]
    argv = ["bench", "--workload", str(workload), "--champion", tiny.champion_path,
            "--drafts", "ngram", "--out", str(out), *extra]
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert_one_error_line(code, err, *words)
    assert not out.exists() and (tmp_path / "FILE").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE", "w.jsonl"]


def test_generate_sampling_controls_and_stop(capsys, models):
    """The sampling flags reach the engine as Options (the same tokens as Engine.generate with
    them), --stop cuts the text before the stop string, and bad values get one error line."""
    from pyspec.engine import Engine
    from pyspec.load import backend
    from pyspec.options import Options
    flags = ("--max-tokens", 12, "--temperature", 0.9, "--seed", 5, "--top-p", 0.8, "--top-k",
             30, "--min-p", 0.01, "--repetition-penalty", 1.3, "--presence-penalty", 0.5,
             "--frequency-penalty", 0.2, "--logit-bias", "101=3", "--logit-bias", "65=-100")
    r = generate_json(capsys, models["champion"], *flags)
    model = Model.load(models["champion"])
    tok = Tokenizer.from_metadata(model.metadata)
    ids = tok.encode_chat([{"role": "user", "content": PROMPT}])
    opts = Options(max_tokens=12, temperature=0.9, seed=5, top_p=0.8, top_k=30, min_p=0.01,
                   repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2,
                   logit_bias={101: 3.0, 65: -100.0})
    assert r["tokens"] == Engine(backend(model, "ngram"), tok).generate(ids, opts).tokens
    assert r["receipt"]["sampling"]["logit_bias"] == 2 and 65 not in r["tokens"]
    stop = r["text"][3:5]
    cut = generate_json(capsys, models["champion"], *flags, "--stop", "zz", "--stop", stop)
    assert cut["text"] == r["text"][:r["text"].find(stop)] and cut["finish_reason"] == "stop"
    for extra, words in [(["--top-p", "0"], ["--top-p must be a number in (0, 1]"]),
                         (["--min-p", "1.5"], ["--min-p"]), (["--top-k", "-2"], ["--top-k"]),
                         (["--repetition-penalty", "0"], ["--repetition-penalty"]),
                         (["--presence-penalty", "9"], ["--presence-penalty"]),
                         (["--logit-bias", "7"], ["TOKEN_ID=BIAS"]),
                         (["--logit-bias", "99999=1"], ["--logit-bias key"]),
                         (["--stop", "a"] * 5, ["at most 4"])]:
        code, out, err = run(capsys, "generate", "--champion", models["champion"], "--prompt",
                             "hi", "--max-tokens", 2, *extra)
        assert_one_error_line(code, err, *words)


def test_stop_reads_backslash_escapes(capsys, models, tok):
    """--stop "\\n" (what a shell passes for "\\n": a backslash and an n) stops at a newline, as
    the demo page reads its stop strings; \\t is a tab, \\\\ a backslash, other backslashes stay."""
    assert request.unescape(r"\n\n") == "\n\n" and request.unescape(r"a\tb") == "a\tb"
    assert request.unescape(r"\\n") == "\\n" and request.unescape(r"\x\\") == "\\x\\"
    newline = tok.encode("\n")
    assert len(newline) == 1
    flags = ("--max-tokens", 6, "--draft", "none", "--logit-bias", f"{newline[0]}=100")
    r = generate_json(capsys, models["champion"], *flags)
    assert r["text"].startswith("\n") and r["finish_reason"] == "length"
    cut = generate_json(capsys, models["champion"], *flags, "--stop", r"\n")
    assert cut["text"] == "" and cut["finish_reason"] == "stop"
    literal = generate_json(capsys, models["champion"], *flags, "--stop", r"\\n")
    assert literal["text"] == r["text"] and literal["finish_reason"] == "length"


def test_raw_applies_to_prompt_only(capsys, models, tmp_path):
    """--raw with --messages-json would be ignored: generate and score refuse it by name."""
    path = tmp_path / "chat.json"
    path.write_text(json.dumps([{"role": "user", "content": "hi"}]))
    for argv in (["generate", "--max-tokens", 2], ["score", "--continuation-ids", "[5]"]):
        code, out, err = run(capsys, *argv, "--champion", models["champion"], "--messages-json",
                             path, "--raw")
        assert_one_error_line(code, err, "--raw applies to --prompt only")
        assert out == ""


def test_ctx_beyond_the_model_is_refused_naming_its_context(capsys, models):
    """--ctx above the model's own context (256 here) is refused with the maximum named, not
    cut silently; a prompt too long for the context says how far the context can go, or that
    it is the model's whole context already."""
    for command in (["generate", "--prompt", "hi"], ["chat"]):
        code, out, err = run(capsys, *command, "--champion", models["champion"], "--ctx", 257)
        assert_one_error_line(code, err, "--ctx 257", "its context is 256", "at most 256")
        assert out == ""
    for raw in ([], ["--raw"]):
        base = ["generate", "--champion", models["champion"], "--prompt", LONG_TEXT, *raw,
                "--context-overflow", "error", "--max-tokens", 4]
        code, _, err = run(capsys, *base, "--ctx", 128)
        assert_one_error_line(code, err, "raise the context length (--ctx) (up to the model's 256)")
        code, _, err = run(capsys, *base)
        assert_one_error_line(code, err, "256 positions is the model's whole context")
        assert "raise" not in err


def test_prompt_too_long_for_the_engine_names_the_models_context(models):
    """The engine's own refusal (a prompt that fills the context) names how far the context
    can be raised, or that it is the model's whole context."""
    from pyspec.engine import Engine
    from pyspec.errors import PromptTooLongError
    from pyspec.load import backend

    model = Model.load(models["champion"])
    tok = Tokenizer.from_metadata(model.metadata)
    ids = tok.encode(LONG_TEXT)
    for ctx, words in [(64, "raise the context length, up to the model's 256"),
                       (None, "256 positions is the model's whole context")]:
        with pytest.raises(PromptTooLongError, match=words):
            Engine(backend(model, "none", ctx), tok).generate(ids)


def test_help_lists_every_command():
    p = run_module("--help")
    assert p.returncode == 0
    description = p.stdout.split("positional arguments")[0]
    for command in cli.parser()._subparsers._group_actions[0].choices:
        assert command in description, (command, description)


# ---------------------------------------------------------------------------------------------
# what a new user meets: help, versions, messages in the command line's words
# ---------------------------------------------------------------------------------------------
def test_bare_command_lists_the_commands_and_version_prints(capsys):
    code, out, err = run(capsys)
    assert code == 2 and "generate" in err and "check-pair" in err and "Traceback" not in err
    code, out, err = run(capsys, "--version")
    assert code == 0 and out.strip() == f"pyspec {pyspec.__version__}"
    code, out, err = run(capsys, "generate", "--help")
    assert code == 0 and "(default: 128)" in out and "(default: heuristic)" in out


def test_a_model_without_a_chat_template_points_to_raw(capsys, models, tmp_path):
    bare = tmp_path / "bare.gguf"
    tok = {k: v for k, v in testmodels.tokenizer_metadata().items()
           if k != "tokenizer.chat_template"}
    testmodels.write_model(bare, seed=0, tokenizer=tok)
    code, out, err = run(capsys, "generate", "--champion", bare, "--prompt", "the cat")
    assert_one_error_line(code, err, "no chat template", "--raw")
    code, out, err = run(capsys, "generate", "--champion", bare, "--prompt", "the cat", "--raw",
                         "--max-tokens", 2)
    assert code == 0, err
    import io
    sys.stdin = io.StringIO("hello\n")
    try:
        code, out, err = run(capsys, "chat", "--champion", bare)
    finally:
        sys.stdin = sys.__stdin__
    assert_one_error_line(code, err, "chat needs a model with a chat template")


def test_check_pair_notes_a_pair_that_cannot_pay(capsys, models):
    code, out, err = run(capsys, "check-pair", "--champion", models["champion"], "--draft",
                         models["copy"], "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"]
    assert any("as large as the champion" in n for n in report["notes"]), report["notes"]


def test_out_of_range_numbers_are_named_as_such(capsys, models, tmp_path):
    for k, words in [("fixed:1000", "K 1000 is outside 0..64"),
                     ("confidence:2", "P 2 is outside [0, 1]")]:
        code, out, err = run(capsys, "generate", "--champion", models["champion"], "--prompt",
                             "hi", "--k", k)
        assert_one_error_line(code, err, words)
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "p1", "stratum": "chat", "max_tokens": 2, "messages": [
        {"role": "user", "content": "hi"}]}) + "\n")
    code, out, err = run(capsys, "bench", "--workload", workload, "--champion",
                         models["champion"], "--drafts", "ngram,,none", "--out", tmp_path / "o")
    assert_one_error_line(code, err, "empty entry")


def test_a_max_tokens_past_the_context_says_where_the_answer_ends(capsys, models):
    code, out, err = run(capsys, "generate", "--champion", models["champion"], "--prompt", "hi",
                         "--max-tokens", 400, "--json")
    assert code == 0 and "The answer can run to" in err, err
    assert json.loads(out)["finish_reason"] in ("context", "stop")


def test_wgpu_gets_a_runtime_dir_where_the_session_has_none(monkeypatch):
    from pyspec.gpu import native

    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    native._runtime_dir()
    made = os.environ["XDG_RUNTIME_DIR"]
    assert os.path.isdir(made) and (os.stat(made).st_mode & 0o777) == 0o700
    native._runtime_dir()                      # one that exists is kept
    assert os.environ["XDG_RUNTIME_DIR"] == made


def test_detokenize_inverts_tokenize(capsys, models):
    text = "the cat sat on the mat. ünïcode"
    code, out, err = run(capsys, "tokenize", "--model", models["champion"], "--text", text)
    assert code == 0, err
    code, back, err = run(capsys, "detokenize", "--model", models["champion"], "--ids",
                          out.strip())
    assert code == 0 and json.loads(back) == text, (back, err)
    for bad, words in [("[99999]", "outside the vocabulary"), ("[]", "is empty"),
                       ("x", "JSON list of integer token ids")]:
        code, out, err = run(capsys, "detokenize", "--model", models["champion"], "--ids", bad)
        assert_one_error_line(code, err, words)


@pytest.fixture(scope="module")
def tools_model(tmp_path_factory, need_llama):
    """A tiny qwen2 model under Qwen 2.5's own template (llama.cpp's copy), and a tools file."""
    from test_template import template_source
    from test_tokenizer_families import FIXTURES
    where = "templates/Qwen-Qwen2.5-7B-Instruct.jinja"
    need_llama(FIXTURES)          # fails under PYSPEC_REQUIRE=llama, never skips there
    d = tmp_path_factory.mktemp("tools")
    testmodels.write_family_model(d / "qwen.gguf", "qwen2", seed=1, ctx=2048, tokenizer=testmodels
                                  .templated_tokenizer("qwen2.5", template_source(where)))
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"]}}}]
    (d / "tools.json").write_text(json.dumps({"tools": tools}))
    return str(d / "qwen.gguf"), str(d / "tools.json")


def test_generate_json_has_the_calls(capsys, tools_model):
    model, tools = tools_model
    args = ["generate", "--champion", model, "--tools", tools, "--tool-choice", "get_weather",
            "--prompt", "weather?", "--max-tokens", "128", "--json"]
    assert cli.main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["finish_reason"] == "tool_calls" and out["content"] is None
    [call] = out["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
    assert set(json.loads(call["function"]["arguments"])) == {"city"}
    assert out["stats"]["forced_tokens"] > 0 and out["stats"]["tokens_per_pass"] > 1
    assert cli.main(args[:-1]) == 0    # streamed: the text, then the call on stderr
    streamed = capsys.readouterr()
    assert streamed.out.strip() == out["text"]
    assert f"tool call {call['id']}: get_weather {call['function']['arguments']}" in streamed.err


def test_chat_answers_a_call_with_tool(capsys, tools_model, monkeypatch):
    """A reply that calls a tool is listed; each `/tool RESULT` answers its call and the model
    goes on (here under tool_choice required: another call each time)."""
    import io
    model, tools = tools_model
    monkeypatch.setattr(sys, "stdin", io.StringIO('weather?\n/tool {"temp": 21}\n/tool x\n'))
    code = cli.main(["chat", "--champion", model, "--tools", tools, "--tool-choice", "required",
                     "--max-tokens", "128", "--stats"])
    err = capsys.readouterr().err
    assert err.count("tool call call_") == 3 and "answer each call with /tool" in err
    assert "none is waiting" not in err and code == 0
