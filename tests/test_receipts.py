"""Receipts carry no prompt or output text and no token id sequences (pyspec/receipts.py).

Checked on every prompt of the public workload, tokenized by the champion's real tokenizer, with
a tiny random model that uses that tokenizer (the receipt's content does not depend on weights).
The adapter is named by its class only: no adapter description, no file path and no user text in
any field, on the numpy engine, on a native WebGPU device, and with a fault and a fallback.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import pyspec
from conftest import gpu_device
from pyspec import champion_path, receipts, testmodels
from pyspec.cpu.executor import CPUBackend
from pyspec.cpu.model import Model
from pyspec.drafters import NgramDrafter
from pyspec.engine import Engine
from pyspec.formats.gguf import GGUFFile
from pyspec.load import backend
from pyspec.options import Options
from pyspec.text.tokenizer import Tokenizer

WORKLOAD = os.path.join(os.path.dirname(__file__), "..", "workloads", "public.jsonl")
HEX = re.compile(r"^[0-9a-f]{64}$")
ALLOWED = {
    # enum values a receipt may hold
    receipts.SCHEMA, pyspec.__version__, "greedy", "replay", "rejection", "stop", "length",
    "context", "ngram", "self", "model", "none", "custom", "heuristic", "fixed:2", "confidence:0.5",
    *receipts.ADAPTER_CLASSES,
    # fault and fallback kinds (engine.py, web.make_engine)
    "device_lost", "gpu_error", "no_webgpu", "software_adapter", "webgpu_error", "cpu_requested",
}


def workload():
    path = os.path.normpath(WORKLOAD)
    if not os.path.exists(path):
        pytest.fail(f"the public workload is missing at {path} (workloads/ in the repository)")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def engine_factory(tmp_path_factory):
    md = GGUFFile.open(champion_path()).metadata
    tok_md = {k: v for k, v in md.items() if k.startswith("tokenizer.")}
    path = str(tmp_path_factory.mktemp("rc") / "smollm-tok.gguf")
    testmodels.write_model(path, tokenizer=tok_md, d=32, n_heads=2, n_kv=1, d_ff=64, ctx=4096)
    model = Model.load(path)
    tok = Tokenizer.from_metadata(model.metadata)
    return lambda draft: Engine(backend(model, draft), tok)


def int_lists(node, out):
    if isinstance(node, dict):
        for v in node.values():
            int_lists(v, out)
    elif isinstance(node, list):
        if all(isinstance(v, int) for v in node):
            out.append(node)
        for v in node:
            int_lists(v, out)
    return out


def contains_run(haystack: list[int], needle: list[int], run: int = 3) -> bool:
    grams = {tuple(needle[i:i + run]) for i in range(len(needle) - run + 1)}
    return any(tuple(haystack[i:i + run]) in grams for i in range(len(haystack) - run + 1))


@pytest.mark.parametrize("draft,k,temperature", [("ngram", "heuristic", 0.0),
                                                 ("self:1", "fixed:2", 0.7)])
def test_receipts_hold_no_user_content(engine_factory, draft, k, temperature):
    engine = engine_factory(draft)
    tok = engine.tokenizer
    for item in workload():
        text = tok.render_chat(item["messages"])
        ids = tok.encode(text, special=True)
        r = engine.generate(ids, Options(max_tokens=12, temperature=temperature, seed=7, k=k,
                                         stop_at_eos=False))
        blob = json.dumps(r.receipt)
        # 1. every string value is a known enum value or a sha256 digest; keys are identifiers
        for _, s in receipts.string_fields(r.receipt):
            assert s in ALLOWED or HEX.match(s), (item["id"], s)
        for key in re.findall(r'"([^"]*)":', blob):
            assert re.fullmatch(r"[a-z0-9_]+", key), (item["id"], key)
        # 2. no piece of the prompt or the output text (12+ characters) appears anywhere
        for source in (text, r.text):
            for i in range(0, max(len(source) - 12, 0), 5):
                piece = source[i:i + 12]
                assert piece not in blob, (item["id"], piece)
        # 3. no run of 3 prompt or output ids appears in any integer list
        for lst in int_lists(r.receipt, []):
            assert not contains_run(lst, ids) and not contains_run(lst, r.tokens), item["id"]
        # 4. no file path
        assert "/" not in blob.replace(receipts.SCHEMA, "")


def test_check_refuses_text_fields():
    with pytest.raises(ValueError, match="carry no text"):
        receipts.check({"schema": receipts.SCHEMA, "note": "hello"})


def test_validate_refuses_what_is_not_a_receipt(tiny):
    """`pyspec receipt` (receipts.validate): a real receipt passes; token ids, a stats object that
    is not one, a sha256 that is not one, settings out of range and numbers that are not finite
    (JSON cannot hold them) are refused."""
    engine = Engine(backend(tiny.champion, "ngram"), tiny.tokenizer)
    real = engine.generate(tiny.prompt, Options(max_tokens=4)).receipt
    receipts.validate(real)
    for change, words in [({"tokens": [19556, 665]}, "not a receipt's"),
                          ({"prompt_ids": [1, 2]}, "not a receipt's"),
                          ({"stats": 5}, "stats must be"),
                          ({"stats": {**real["stats"], "text_ids": [3]}}, "'text_ids' is not one"),
                          ({"champion_sha256": "zz"}, "64 lowercase hex"),
                          ({"temperature": -1}, "temperature"),
                          ({"max_tokens": 0}, "max_tokens"),
                          ({"max_tokens": float("inf")}, "finite"),
                          ({"seed": float("nan")}, "finite")]:
        with pytest.raises(ValueError, match=words):
            receipts.validate({**real, **change})
    for gone in ("champion_sha256", "stats", "verify", "draft", "sampling", "seed"):
        with pytest.raises(ValueError, match=f"needs {gone}"):
            receipts.validate({k: v for k, v in real.items() if k != gone})
    with pytest.raises(ValueError, match="schema"):
        receipts.validate({**real, "schema": "other/1"})


def test_check_refuses_an_adapter_description():
    receipts.check({"stats": {"adapter": "software"}, "faults": [{"adapter": "gpu:amd"}]})
    for description in ("NVIDIA GeForce RTX 4090 (nvidia, WebGPU)",
                        "llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan, wgpu-py)", "nvidia", ""):
        with pytest.raises(ValueError, match="class"):
            receipts.check({"stats": {"adapter": description}})


@pytest.mark.parametrize("vendor, software, expected", [
    ("nvidia", False, "gpu:nvidia"), ("NVIDIA Corporation", False, "gpu:nvidia"),
    (0x10DE, False, "gpu:nvidia"), ("amd", False, "gpu:amd"), (0x1002, False, "gpu:amd"),
    ("intel", False, "gpu:intel"), (0x8086, False, "gpu:intel"), ("apple", False, "gpu:apple"),
    ("qualcomm", False, "gpu:other"), ("", False, "gpu:other"), (None, False, "gpu:other"),
    (0x10005, False, "gpu:other"),                    # Mesa's id, on a hardware driver
    ("google", True, "software"), (0x10005, True, "software"), ("nvidia", True, "software"),
])
def test_adapter_class(vendor, software, expected):
    assert receipts.adapter_class(vendor, software) == expected
    assert expected in receipts.ADAPTER_CLASSES


class DescribedBackend:
    """A backend whose adapter has a full description (as a browser's GPU would), a class, and
    a lost device at its second cycle."""

    adapter = "NVIDIA GeForce RTX 4090 Laptop GPU (nvidia, WebGPU) driver 555.85"
    adapter_class = receipts.adapter_class("nvidia", False)

    def __init__(self, inner):
        self.inner, self.cycles = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def read(self, handle):
        from pyspec.gpu.device import DeviceLostError

        self.cycles += 1
        if self.cycles == 2:
            raise DeviceLostError("the device was lost: GPU hang on RTX 4090, driver 555.85")
        return await self.inner.read(handle)


def private_strings(receipt) -> list[str]:
    """Every string value of a receipt and every key."""
    return [s for _, s in receipts.string_fields(receipt)] + re.findall(r'"([^"]*)":',
                                                                          json.dumps(receipt))


def test_no_field_carries_a_description_a_path_or_user_text(tmp_path):
    """A champion under a user's home-like path, a prompt with a name in it, an adapter with a
    full description, a fault and a fallback: the receipt holds none of them."""
    home = tmp_path / "home" / "alice.smith" / "models"
    home.mkdir(parents=True)
    path = home / "my-private-model.gguf"
    testmodels.write_model(path, seed=3)
    model = Model.load(path)
    tok = Tokenizer.from_metadata(model.metadata)
    engine = Engine(DescribedBackend(CPUBackend(model, NgramDrafter())), tok,
                    recover=lambda: CPUBackend(model),
                    fallbacks=[{"kind": "webgpu_error", "adapter": "cpu-numpy"}],
                    fallback_reason=f"shader rejected by {DescribedBackend.adapter}")
    secret = "Alice Smith, 12 Rue de la Paix, password hunter2"
    r = engine.generate(tok.encode_chat([{"role": "user", "content": secret}]),
                        Options(max_tokens=16, stop_at_eos=False, k="fixed:2"))
    receipt = r.receipt
    fault = receipt["faults"][0]
    assert receipt["faults"] == [{"kind": "device_lost", "at_token": fault["at_token"],
                                  "cycle": fault["cycle"], "recovery_s": fault["recovery_s"],
                                  "adapter": "gpu:nvidia"}]
    assert receipt["stats"]["adapter"] == r.stats["adapter"] == "cpu-numpy"   # finished there
    blob = json.dumps(receipt)
    # (numbers such as the driver's 555 could occur in timings by chance; words cannot)
    forbidden = [DescribedBackend.adapter, "RTX", "(nvidia", "driver", "laptop", str(path),
                 "alice", "home", "my-private-model", ".gguf", secret, "hunter2", "paix"]
    for word in forbidden:
        assert word.lower() not in blob.lower(), word
    for s in private_strings(receipt):   # no path: no separator but the schema's
        assert s == receipts.SCHEMA or ("/" not in s and "\\" not in s), s
    for _, value in receipts.string_fields(receipt):   # so no output text either
        assert value in ALLOWED or HEX.match(value), value


@pytest.mark.parametrize("name", ["cpu", "fastcpu"])
def test_a_draft_under_a_private_path_leaves_no_trace_in_the_receipt(tiny, tmp_path, name):
    """A draft model alone and in the n-gram combination (whose members' stats the receipt
    keeps, by kind), from a home-like path: the receipt names neither the path nor the file,
    and records the draft's sha256. A key holding a path is refused by check."""
    home = tmp_path / "home" / "alice.smith" / "drafts"
    home.mkdir(parents=True)
    path = home / "my-private-draft.gguf"
    path.write_bytes(Path(tiny.close_path).read_bytes())
    for draft in (str(path), f"ngram+{path}"):
        engine = Engine(backend(tiny.on(name), draft), tiny.tokenizer)
        r = engine.generate(tiny.prompt, Options(max_tokens=24, stop_at_eos=False, k="fixed:2"))
        blob = json.dumps(r.receipt).lower()
        for word in ("alice", "home", "my-private-draft", ".gguf", str(tmp_path).lower()):
            assert word not in blob, (draft, word)
        assert HEX.match(r.receipt["draft"]["sha256"]), r.receipt["draft"]
        if draft.startswith("ngram+"):
            assert set(r.receipt["stats"]["schedule"]["by_drafter"]) == {"ngram", "model"}
    bad = json.loads(json.dumps(r.receipt))
    bad["stats"]["schedule"]["by_drafter"] = {f"model:{path}": {}}
    with pytest.raises(ValueError, match="receipt key"):
        receipts.check(bad)


def test_receipt_names_the_adapter_class_on_each_backend(tiny, backend):
    """The real adapters: "cpu-numpy" for numpy; for a native WebGPU device its class ("software"
    on lavapipe), and never its description."""
    engine = Engine(backend_for(tiny, backend), tiny.tokenizer)
    r = engine.generate(tiny.prompt, Options(max_tokens=4))
    assert r.receipt["stats"]["adapter"] == engine.adapter_class in receipts.ADAPTER_CLASSES
    if backend in ("cpu", "fastcpu"):
        assert engine.adapter_class == "cpu-numpy"
    else:
        dev = gpu_device()
        assert engine.adapter_class == dev.adapter_class
        assert (dev.adapter_class == "software") == dev.is_cpu
        assert dev.name not in json.dumps(r.receipt) and r.stats["adapter"] == dev.name


def backend_for(tiny, name):
    return backend(tiny.on(name), "ngram")


def test_validate_refuses_settings_out_of_their_range(tiny):
    """The settings a receipt records are checked by the rules a request's are (the sampling
    controls by processors.Sampling.check): the verify mode (the one its temperature runs), the
    seed, each control; counts are never negative and draft.kind is one of DRAFT_KINDS (a
    drafter of the caller's own is recorded as "custom")."""
    engine = Engine(backend(tiny.champion, "ngram"), tiny.tokenizer)
    real = engine.generate(tiny.prompt, Options(max_tokens=4)).receipt
    hot = engine.generate(tiny.prompt, Options(max_tokens=4, temperature=0.7, seed=3,
                                               verify="rejection", top_p=0.9)).receipt
    receipts.validate(hot)
    sampling, stats, draft = real["sampling"], real["stats"], real["draft"]
    for change, words in [
            ({"verify": "bogus"}, "verify 'bogus' is not a mode temperature 0"),
            ({"verify": None}, "verify None is not a mode temperature 0"),
            ({"verify": "replay"}, "not a mode temperature 0.0 runs \\(greedy\\)"),
            ({**hot, "verify": "greedy"}, "runs \\(replay or rejection\\)"),
            ({"seed": -5}, "seed must be an integer in \\[0, 2\\^64\\)"),
            ({"seed": 1 << 64}, "seed"),
            ({"seed": 2.5}, "seed"),
            ({"sampling": {**sampling, "top_p": 7}}, "top_p must be a number in \\(0, 1\\]"),
            ({"sampling": {**sampling, "min_p": -1}}, "min_p"),
            ({"sampling": {**sampling, "top_k": "5"}}, "top_k"),
            ({"sampling": {**sampling, "presence_penalty": 3}}, "presence_penalty"),
            ({"sampling": {**sampling, "repetition_penalty": 0}}, "repetition_penalty"),
            ({"sampling": {**sampling, "stop": -1}}, "sampling.stop is a count"),
            ({"sampling": {**sampling, "extra": 1}}, "sampling must be an object"),
            ({"sampling": 3}, "sampling must be an object"),
            ({"stats": {**stats, "generated_tokens": -1}}, "'generated_tokens' is -1"),
            ({"stats": {**stats, "accepted_by_position": [1, -2]}}, "accepted_by_position"),
            ({"stats": {**stats, "peak_bytes": {**stats["peak_bytes"], "kv": -8}}},
             "never negative"),
            ({"faults": [{"kind": "device_lost", "at_token": -1}]}, "'at_token' is -1"),
            ({"draft": {**draft, "kind": "whatever"}}, "draft.kind must be one of"),
            ({"draft": None}, "draft.kind"),
    ]:
        with pytest.raises(ValueError, match=words):
            receipts.validate({**real, **change})
    # negative penalties are settings, not counts
    receipts.validate({**hot, "sampling": {**hot["sampling"], "presence_penalty": -1.5}})
    for kind in receipts.DRAFT_KINDS:
        receipts.validate({**real, "draft": {**draft, "kind": kind}})


@pytest.mark.parametrize("draft, opts", [
    ("none", {}), ("self:1", {}), ("ngram", {"json_schema": {"type": "integer"}}),
    ("none", {"json_schema": {"type": "integer"}}),
    ("ngram", {"temperature": 1.0, "verify": "replay", "seed": (1 << 64) - 1, "top_k": 3,
               "min_p": 0.1, "frequency_penalty": -2, "logit_bias": {5: -100}, "stop": ("x",)}),
])
def test_every_kind_of_real_receipt_validates(tiny, draft, opts):
    """build validates each receipt it makes: a drafter of each kind, a schema request (with and
    without a drafter: draft.kind "forced"), every control set."""
    engine = Engine(backend(tiny.champion, draft), tiny.tokenizer)
    receipt = engine.generate(tiny.prompt, Options(max_tokens=4, **opts)).receipt
    receipts.validate(receipt)
    assert receipt["draft"]["kind"] in receipts.DRAFT_KINDS


def test_a_drafter_of_the_callers_own_is_recorded_as_custom(tiny):
    """A drafter the caller writes may call itself anything: its receipt says "custom" (a
    receipt's kinds are the library's), and the request is not refused for it."""
    from test_engine import scripted

    from conftest import greedy_pick, reference_decode

    truth = reference_decode(tiny.champion, tiny.prompt, 8, greedy_pick)
    r = scripted(tiny, truth).generate(
        tiny.prompt, Options(max_tokens=8, k="fixed:3", stop_at_eos=False))
    assert r.receipt["draft"]["kind"] == "custom"
    receipts.validate(r.receipt)
