"""JSON-schema decoding with the real champion (SmolLM2-135M-Instruct) on the CPU, over the 8
bounded schemas of test_jsonschema.SCHEMAS: every output parses and validates, speculative
decoding (forced tokens + n-gram) equals constrained champion-only token for token, and a run
cut by max_tokens ends with finish_reason "length" and a prefix the grammar accepts."""

from __future__ import annotations

import json

import pytest
from test_jsonschema import SCHEMAS, validate

from pyspec.engine import Engine
from pyspec.load import backend, load_champion
from pyspec.options import Options
from pyspec.rules.jsonschema import compile_schema

pytestmark = pytest.mark.champion

PROMPTS = {
    "person": "Tom Baker is 52; his email is tom@example.org. Give him as JSON.",
    "colors": "Which of red, green and blue are in the flag of Italy? JSON array.",
    "point": "The point is 3.5 right of the origin and 2 below it. JSON with x and y.",
    "order": "Order 5521: two of SKU A-100, one of SKU B-7, paid. As JSON.",
    "weather": "Light rain in Dublin, 9 degrees. The weather as JSON.",
    "tags": "Title and tags as JSON for: growing tomatoes on a balcony.",
    "nested": "Alice is an administrator; no note. As JSON with user and note.",
    "scores": "Scores 72, 85, 90, 64 and their mean, as JSON.",
}
MAX_TOKENS = 160   # enough for every schema's output with this champion (greedy)


@pytest.fixture(scope="module")
def champion():
    return load_champion(None)


def test_every_output_parses_validates_and_speculation_equals_champion_only(champion):
    model, tok = champion
    reference = Engine(backend(model, "none"), tok)
    speculative = Engine(backend(model, "ngram"), tok)
    forced = 0
    for name, schema in SCHEMAS.items():
        ids = tok.encode_chat([{"role": "user", "content": PROMPTS[name]}])
        ref = reference.generate(ids, Options(max_tokens=MAX_TOKENS, k="fixed:0",
                                              json_schema=schema))
        assert ref.finish_reason == "stop", (name, ref.text)
        assert validate(json.loads(ref.text), schema), (name, ref.text)
        spec = speculative.generate(ids, Options(max_tokens=MAX_TOKENS, k="fixed:4",
                                                 json_schema=schema))
        assert spec.tokens == ref.tokens and spec.text == ref.text, name
        assert spec.stats["champion_passes"] < ref.stats["champion_passes"], name
        forced += spec.stats["forced_tokens"]
    assert forced > 0


def test_a_run_cut_by_max_tokens_is_a_valid_prefix(champion):
    model, tok = champion
    engine = Engine(backend(model, "ngram"), tok)
    schema = SCHEMAS["order"]
    ids = tok.encode_chat([{"role": "user", "content": PROMPTS["order"]}])
    r = engine.generate(ids, Options(max_tokens=7, k="fixed:4", json_schema=schema))
    assert r.finish_reason == "length" and len(r.tokens) == 7
    g = compile_schema(schema)
    state = g.initial()
    for b in r.text.encode():
        state = g.step(state, b)
        assert state is not None, r.text
