"""Receipts carry no prompt or output text and no token id sequences (pyspec/receipts.py).

Checked on every prompt of the public workload, tokenized by the champion's real tokenizer, with
a tiny random model that uses that tokenizer (the receipt's content does not depend on weights).
"""

from __future__ import annotations

import json
import os
import re

import pytest

import pyspec

from pyspec import champion_path, receipts, testmodels
from pyspec.engine import Engine, Options
from pyspec.load import backend
from pyspec.gguf import GGUFFile
from pyspec.model import Model
from pyspec.tokenizer import Tokenizer

WORKLOAD = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "workloads",
                        "public.jsonl")
HEX = re.compile(r"^[0-9a-f]{64}$")
ALLOWED = {
    # enum values a receipt may hold
    receipts.SCHEMA, pyspec.__version__, "greedy", "replay", "rejection", "cpu-numpy", "stop", "length", "context",
    "ngram", "self", "model", "none", "custom", "heuristic", "fixed:2", "confidence:0.5",
}


def workload():
    path = os.path.normpath(WORKLOAD)
    if not os.path.exists(path):
        pytest.fail(f"the public workload is missing at {path} (shared/ sits beside the repo)")
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
