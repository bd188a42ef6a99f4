"""JSON-schema decoding end to end on a tiny random model whose tokenizer has JSON punctuation
merges: speculative constrained decoding (forced tokens, n-gram, self:L, a draft model) equals
constrained champion-only decoding (k = 0, the reference): greedy token for token, replay per
seed, rejection in distribution; every finished output parses and validates; bad schemas and
options get named errors.

The reference's semantics is checked apart from the engine too: `masked_reference` decodes with
the model forward and the masks alone (jsonmask.Masker), sharing no code with engine.py or the
drafters."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_engine import (
    check_two_token_counts,
    exact_two_token_distribution,
    null_tv_quantile,
    seed_block,
)
from test_jsonmask import JSON_CORPUS
from test_jsonschema import SCHEMAS, validate

from pyspec import testmodels
from pyspec.cpu.model import Model
from pyspec.engine import Engine
from pyspec.errors import OptionsError
from pyspec.gpu.processors import KINDS
from pyspec.load import backend as backend_for
from pyspec.options import Options
from pyspec.rules import verify
from pyspec.rules.jsonmask import Masker
from pyspec.rules.jsonschema import SchemaError, compile_schema
from pyspec.text.tokenizer import Tokenizer
from pyspec.text.vocab import Vocab

DRAFTS = ["none", "ngram", "self:1", "close"]


class TinyJson:
    def __init__(self, root):
        tok_md = testmodels.tokenizer_metadata(n_merges=120, corpus=JSON_CORPUS)
        self.path = str(root / "json-champion.gguf")
        w = testmodels.write_model(self.path, seed=3, tokenizer=tok_md, ctx=512)
        self.close_path = str(root / "json-close.gguf")
        testmodels.write_model(self.close_path, tokenizer=tok_md, ctx=512,
                               weights=testmodels.perturb(w, 0.04, 8))
        self.champion = Model.load(self.path)
        self.tokenizer = Tokenizer.from_metadata(self.champion.metadata)
        self.prompt = self.tokenizer.encode_chat([{"role": "user", "content": "json please"}])
        self.engines = {}
        self._fast = None

    @property
    def fast(self):
        """The champion on the engine the CLI and the page run (fastcpu.FastModel)."""
        if self._fast is None:
            from pyspec.cpu.fastcpu import FastModel
            self._fast = FastModel.load(self.path)
        return self._fast

    def engine(self, draft: str, backend: str = "cpu") -> Engine:
        if (draft, backend) not in self.engines:
            spec = self.close_path if draft == "close" else draft
            champion = self.fast if backend == "fastcpu" else self.champion
            self.engines[draft, backend] = Engine(
                backend_for(champion, spec, load_draft=Model.load), self.tokenizer)
        return self.engines[draft, backend]


@pytest.fixture(scope="module")
def tj(tmp_path_factory) -> TinyJson:
    return TinyJson(tmp_path_factory.mktemp("tinyjson"))


def masked_reference(tj: TinyJson, schema: dict, n: int, model=None) -> list[int]:
    """Constrained greedy decoding from the forward (of `model`, default the numpy reference)
    and the masks only."""
    masker = Masker(compile_schema(schema), Vocab(tj.tokenizer), tj.tokenizer.eos_id)
    model = model or tj.champion
    kv = model.new_cache()
    logits = model.forward(tj.prompt, kv)[-1]
    kv.commit(len(tj.prompt))
    state, out = masker.initial(), []
    while len(out) < n:
        row = np.where(masker.mask(state).dense(len(logits)), logits, -np.inf)
        token = int(np.argmax(row))
        out.append(token)
        if token == tj.tokenizer.eos_id:
            break
        state = masker.advance(state, token)
        logits = model.forward([token], kv)[-1]
        kv.commit(1)
    return out


def run(tj, draft, schema, backend="cpu", **kw):
    opts = dict(max_tokens=200, json_schema=schema)
    return tj.engine(draft, backend).generate(tj.prompt, Options(**{**opts, **kw}))


@pytest.mark.parametrize("name", SCHEMAS)
def test_greedy_equals_constrained_champion_only(tj, name):
    schema = SCHEMAS[name]
    ref = run(tj, "none", schema, k="fixed:0")
    want = masked_reference(tj, schema, 200)
    assert ref.tokens == [t for t in want if t != tj.tokenizer.eos_id]
    if ref.finish_reason == "stop":
        assert validate(json.loads(ref.text), schema), ref.text
    assert ref.stats["drafted"] == 0 and ref.stats["forced_tokens"] > 0
    for draft in DRAFTS:
        for k in ("fixed:1", "fixed:4", "heuristic"):
            r = run(tj, draft, schema, k=k)
            assert r.tokens == ref.tokens and r.text == ref.text, (draft, k)
            assert r.stats["forced_tokens"] == ref.stats["forced_tokens"]
            assert r.stats["champion_passes"] <= ref.stats["champion_passes"]
    r = run(tj, "none", schema, k="fixed:4")   # forced tokens alone save passes
    assert r.stats["champion_passes"] < ref.stats["champion_passes"]


@pytest.mark.parametrize("name", ["order", "tags", "scores"])
def test_replay_equals_constrained_champion_only_per_seed(tj, name):
    for seed in range(3):
        kw = dict(temperature=0.9, seed=seed)
        ref = run(tj, "none", SCHEMAS[name], k="fixed:0", **kw)
        if ref.finish_reason == "stop":
            assert validate(json.loads(ref.text), SCHEMAS[name]), ref.text
        for draft in DRAFTS:
            r = run(tj, draft, SCHEMAS[name], k="fixed:3", **kw)
            assert r.tokens == ref.tokens, (draft, seed)


@pytest.mark.parametrize("name", ["order", "tags"])
def test_the_fast_cpu_engine_equals_its_constrained_champion_only(tj, name):
    """The engine the CLI and the page run (fastcpu.FastModel): greedy equals the masked
    reference on its own forward, and replay per seed equals its champion-only, every drafter."""
    schema, eos = SCHEMAS[name], tj.tokenizer.eos_id
    want = [t for t in masked_reference(tj, schema, 200, tj.fast) if t != eos]
    for draft in DRAFTS:
        for k in ("fixed:1", "fixed:4"):
            assert run(tj, draft, schema, "fastcpu", k=k).tokens == want, (draft, k)
    for seed in range(2):
        kw = dict(temperature=0.9, seed=seed)
        ref = run(tj, "none", schema, "fastcpu", k="fixed:0", **kw)
        for draft in DRAFTS:
            assert run(tj, draft, schema, "fastcpu", k="fixed:3", **kw).tokens == ref.tokens, \
                (draft, seed)


def test_max_tokens_cut_leaves_a_valid_prefix(tj):
    schema = SCHEMAS["order"]
    full = run(tj, "ngram", schema, k="fixed:3")
    g = compile_schema(schema)
    for n in (1, 5, 9):
        r = run(tj, "ngram", schema, k="fixed:3", max_tokens=n)
        assert r.finish_reason == "length" and r.tokens == full.tokens[:n]
        state = g.initial()
        for b in r.text.encode():
            state = g.step(state, b)
            assert state is not None


# --- rejection: the distribution of the tokens after the forced prefix -----------------------
SCHEMA_BOOLS = {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}


def exact_masked_joint(tj, masker, prefix, state, temperature):
    """P(t1, t2) of the two tokens after `prefix` (grammar at `state`) under the masked champion,
    by enumeration over t1."""
    model, kv = tj.champion, tj.champion.new_cache()
    vocab = model.config.vocab_size

    def masked(logits, st):
        return verify.softmax(np.where(masker.mask(st).dense(vocab), logits, -np.inf),
                              temperature)

    p1 = masked(model.forward(prefix, kv)[-1], state)
    kv.commit(len(prefix))
    joint = np.zeros((vocab, vocab))
    for t1 in np.flatnonzero(p1):
        kv.rollback()
        st = masker.advance(state, int(t1))
        if st is masker.advance(state, tj.tokenizer.eos_id) or st is None:
            continue
        joint[t1] = p1[t1] * masked(model.forward([int(t1)], kv)[-1], st)
    return joint


@pytest.mark.parametrize("draft", ["close", "ngram", "ngram-copy"])
def test_rejection_matches_the_masked_champion_distribution(tj, draft):
    """10,000 seeded runs (max_tokens=4, k fixed:3: the forced "[" then drafts in one block).
    "ngram-copy": the prompt holds boolean arrays, so the lookup drafts what followed "[" there
    (free tokens the champion may reject), not only the forced ones.
    Stated bounds (test_engine.check_two_token_counts): the TV of the joint of the two tokens
    after the forced "[", of each one's marginal and of the second given each of the three
    likeliest first, each below the 99.9th percentile of the TV that as many exact draws give.
    Teeth: the unmasked champion's joint is further than the bound."""
    tok = tj.tokenizer
    prompt = tj.prompt if draft != "ngram-copy" else tok.encode_chat(
        [{"role": "user", "content": "json please, like [true,false] or [false,true,true]"}])
    masker = Masker(compile_schema(SCHEMA_BOOLS), Vocab(tok), tok.eos_id)
    first = masker.mask(masker.initial()).forced
    assert tok.token_bytes(first) == b"["
    prefix = prompt + [first]
    exact = exact_masked_joint(tj, masker, prefix, masker.advance(masker.initial(), first), 1.0)
    bound = null_tv_quantile(exact, 10_000, 0.999)
    engine, counts = tj.engine(draft.removesuffix("-copy")), np.zeros_like(exact)
    drafted = accepted = 0

    def one(seed):
        r = engine.generate(prompt, Options(max_tokens=4, temperature=1.0, seed=seed,
                                            verify="rejection", k="fixed:3",
                                            json_schema=SCHEMA_BOOLS))
        seq = r.tokens + [tok.eos_id] * 2    # "[]" then EOS: the stop ended it (not in tokens)
        return (seq[:3], len(r.tokens) >= 3 or r.finish_reason == "stop",
                r.stats["drafted"], r.stats["accepted"])

    for seq, complete, d, a in map(one, seed_block(10_000)):
        assert seq[0] == first and complete
        counts[seq[1], seq[2]] += 1
        drafted, accepted = drafted + d, accepted + a
    check_two_token_counts(counts, exact, draft)
    if draft == "ngram":   # n-gram finds nothing in so short a text: forced drafts, all kept
        assert drafted > 0 and accepted == drafted
    else:   # the draft model's or the copied proposals are both accepted and rejected
        assert 0 < accepted < drafted, (accepted, drafted)
    # Teeth: the champion's own joint of the same two tokens, without the mask.
    raw = exact_two_token_distribution(tj.champion, prefix, 1.0)
    assert 0.5 * np.abs(raw - exact).sum() > bound


def test_bad_schemas_and_options_get_named_errors(tj):
    with pytest.raises(SchemaError, match="'pattern'"):
        run(tj, "none", {"type": "string", "pattern": "x"})
    with pytest.raises(OptionsError, match="stop_at_eos"):
        run(tj, "none", SCHEMAS["person"], stop_at_eos=False)


def test_a_plain_request_after_a_schema_request_is_unchanged(tj):
    engine = tj.engine("ngram")
    before = engine.generate(tj.prompt, Options(max_tokens=30, stop_at_eos=False))
    run(tj, "ngram", SCHEMAS["person"])
    assert engine.drafter.name == "ngram"
    after = engine.generate(tj.prompt, Options(max_tokens=30, stop_at_eos=False))
    assert after.tokens == before.tokens and after.stats["forced_tokens"] == 0


def test_cli_generate_json_schema(tj, tmp_path, capsys):
    from pyspec.apps import cli
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMAS["weather"]))
    argv = ["generate", "--champion", tj.path, "--messages-json", None, "--json",
            "--json-schema", str(schema_file), "--max-tokens", "120", "--k", "fixed:3"]
    messages = tmp_path / "messages.json"
    messages.write_text(json.dumps([{"role": "user", "content": "json please"}]))
    argv[4] = str(messages)
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    want = run(tj, "ngram", SCHEMAS["weather"], max_tokens=120, k="fixed:3")
    assert out["text"] == want.text and out["stats"]["forced_tokens"] > 0
    schema_file.write_text(json.dumps({"type": "string", "format": "email"}))
    assert cli.main(argv) == 2
    assert "'format'" in capsys.readouterr().err


def test_the_worker_config_takes_json_schema_or_openai_response_format():
    from pyspec.apps.wire import SessionError, schema_of
    schema = SCHEMAS["point"]
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema, "strict": True}}
    assert schema_of({"response_format": fmt}) == schema
    assert schema_of({"json_schema": schema}) == schema
    assert schema_of({"response_format": {"type": "text"}}) is None and schema_of({}) is None
    for bad in ({"response_format": {"type": "json_object"}},
                {"response_format": {"type": "json_schema", "json_schema": {"schema": "x"}}},
                {"response_format": fmt, "json_schema": schema}):
        with pytest.raises(SessionError) as e:
            schema_of(bad)
        assert e.value.code == "bad_config"


@pytest.mark.parametrize("draft", ["ngram", "self:1"])
def test_gpu_schema_requests_equal_constrained_champion_only(tj, gpu, draft):
    """On WebGPU a schema request drafts on the host (forced + n-gram; a GPU self:L draft gives
    way to n-gram) and masks on the device (filter.wgsl, the bits uploaded per cycle): its
    tokens equal the GPU's constrained champion-only run, which equals the CPU reference on this
    model, and the host accept's run (the rows read back, the mask applied by numpy) byte for
    byte: greedy, and replay at T = 0.8 with top_k and min_p on the device too."""
    from conftest import gpu_device
    from pyspec.formats.gguf import GGUFFile
    from pyspec.gpu import load_model

    model = load_model(gpu_device(), GGUFFile.open(tj.path))
    for name in ("order", "nested"):
        ref = Engine(backend_for(model, "none"), tj.tokenizer).generate(
            tj.prompt, Options(max_tokens=120, k="fixed:0", json_schema=SCHEMAS[name]))
        assert ref.tokens == run(tj, "none", SCHEMAS[name], k="fixed:0").tokens
        engine = Engine(backend_for(model, draft), tj.tokenizer)
        r = engine.generate(tj.prompt, Options(max_tokens=120, k="fixed:4",
                                               json_schema=SCHEMAS[name]))
        assert r.tokens == ref.tokens and r.stats["forced_tokens"] > 0
        assert r.stats["champion_passes"] < ref.stats["champion_passes"]
        assert engine.drafter.name == draft    # given back after the request
        timing = r.stats["backend_timing"]
        assert "mask_s" in timing and "host_accept_s" not in timing
        sampled = dict(max_tokens=120, k="fixed:4", json_schema=SCHEMAS[name], temperature=0.8,
                       seed=5, top_k=6, min_p=0.02)
        # the filters on the device also on a software adapter; then the host accept
        on_device = Engine(backend_for(model, draft, device_processors=KINDS),
                           tj.tokenizer).generate(tj.prompt, Options(**sampled))
        host_engine = Engine(backend_for(model, draft, device_processors=()), tj.tokenizer)
        host = host_engine.generate(tj.prompt, Options(max_tokens=120, k="fixed:4",
                                                       json_schema=SCHEMAS[name]))
        host_sampled = host_engine.generate(tj.prompt, Options(**sampled))
        assert host.tokens == r.tokens and host_sampled.tokens == on_device.tokens
        # replay's reference is constrained champion-only sampling with the same seed, on the
        # GPU and on the CPU (the two agree on this model), not another speculative run
        alone = {**sampled, "k": "fixed:0"}
        sampled_ref = Engine(backend_for(model, "none"), tj.tokenizer).generate(
            tj.prompt, Options(**alone))
        cpu_ref = run(tj, "none", SCHEMAS[name],
                      **{k: v for k, v in alone.items() if k != "json_schema"})
        assert on_device.tokens == sampled_ref.tokens == cpu_ref.tokens
        assert on_device.stats["accepted"] > 0
        assert "host_accept_s" in host.stats["backend_timing"]
        assert "host_accept_s" not in on_device.stats["backend_timing"]


def test_gpu_schema_requests_under_the_guard_run_cycle_by_cycle(tj, gpu):
    """A schema's mask follows the tokens on the host, so under the guard (heuristic, which
    drafts every run of forced tokens) an n-gram request on WebGPU neither looks its drafts up
    on the device nor lets a cycle go ahead, and its tokens are constrained champion-only's."""
    from conftest import gpu_device
    from pyspec.formats.gguf import GGUFFile
    from pyspec.gpu import load_model

    if not hasattr(tj, "gpu_model"):
        tj.gpu_model = load_model(gpu_device(), GGUFFile.open(tj.path))
    schema = SCHEMAS["order"]
    ref = Engine(backend_for(tj.gpu_model, "none"), tj.tokenizer).generate(
        tj.prompt, Options(max_tokens=120, k="fixed:0", json_schema=schema))
    r = Engine(backend_for(tj.gpu_model, "ngram"), tj.tokenizer).generate(
        tj.prompt, Options(max_tokens=120, k="heuristic", json_schema=schema))
    assert r.tokens == ref.tokens and r.stats["forced_tokens"] > 0
    assert r.stats["backend_timing"]["ahead"] == 0


def test_the_guard_never_leaves_out_forced_tokens(tj):
    """Under the heuristic policy the break-even guard may choose k = 0 (verify rows cost on the
    CPU), but forced tokens are free: every run of them is still drafted, so a constrained
    request makes fewer champion passes than constrained champion-only, with the same tokens."""
    schema = SCHEMAS["order"]
    ref = run(tj, "none", schema, k="fixed:0")
    r = run(tj, "none", schema, k="heuristic")
    assert r.tokens == ref.tokens
    assert r.stats["champion_passes"] < ref.stats["champion_passes"]
    assert r.stats["accepted"] >= ref.stats["forced_tokens"] - r.stats["champion_passes"]
