"""Tool calls decoded under their grammar (pyspec/rules/toolgrammar.py), on tiny random models of
each supported template family (testmodels.templated_tokenizer with llama.cpp's copies of the
real templates): every tool_choice mode, greedy and replay, speculative output equal to
champion-only output under the same grammar, the calls schema-valid even from random weights,
the grammar's bytes exactly what the template renders for a call, and the conversation's cache
kept across the round trip of a call and its result."""

from __future__ import annotations

import json

import pytest

from pyspec import testmodels
from pyspec.cpu.model import Model
from pyspec.engine import Engine
from pyspec.load import backend
from pyspec.options import Options
from pyspec.rules import toolgrammar
from pyspec.text import toolcalls
from pyspec.text.tokenizer import Tokenizer
from test_template import template_source
from test_tokenizer_families import needs_fixtures

pytestmark = needs_fixtures

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "the weather",
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string", "maxLength": 10, "description": "a city"},
         "unit": {"type": "string", "enum": ["c", "f"], "description": "the unit"},
         "days": {"type": "integer", "description": "how many"}},
         "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
        "type": "object", "properties": {
            "a": {"type": "integer", "description": "a"},
            "b": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3,
                  "description": "b"}},
        "required": ["a", "b"]}}},
]
FAMILIES = {   # family: (architecture, template file)
    "qwen2.5": ("qwen2", "templates/Qwen-Qwen2.5-7B-Instruct.jinja"),
    "llama3": ("llama", "templates/meta-llama-Llama-3.2-3B-Instruct.jinja"),
}
MESSAGES = [{"role": "user", "content": "the weather in the cat sat on the mat?"}]
MODES = ["required", "add", "auto", "none"]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    arch, where = FAMILIES[request.param]
    path = tmp_path_factory.mktemp("tools") / f"{request.param}.gguf"
    testmodels.write_family_model(path, arch, seed=1, ctx=2048, tokenizer=testmodels.templated_tokenizer(
        request.param, template_source(where)))
    model = Model.load(str(path))
    return request.param, model, Tokenizer.from_metadata(model.metadata)


def valid(value, schema) -> bool:
    """`value` against a schema of the subset (for the tests' checks)."""
    t = schema.get("type")
    if "enum" in schema:
        return value in schema["enum"]
    if t == "object":
        props = schema.get("properties", {})
        return (isinstance(value, dict) and set(value) <= set(props)
                and set(schema.get("required", [])) <= set(value)
                and all(valid(v, props[k]) for k, v in value.items()))
    if t == "array":
        return (isinstance(value, list) and len(value) <= schema.get("maxItems", 1 << 30)
                and all(valid(v, schema["items"]) for v in value))
    if t == "string":
        return isinstance(value, str) and len(value) <= schema.get("maxLength", 1 << 30)
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "boolean":
        return isinstance(value, bool)
    return False


def run(model, tok, ids, draft, **opts):
    return Engine(backend(model, draft), tok).generate(ids, Options(tools=TOOLS, **opts))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "seed": 5}],
                         ids=["greedy", "replay"])
def test_speculative_equals_champion_only_in_every_mode(family, mode, sampling):
    name, model, tok = family
    ids = tok.encode_chat(MESSAGES, tools=TOOLS)
    opts = {"max_tokens": 60, "tool_choice": mode, **sampling}
    alone = run(model, tok, ids, "none", k="fixed:0", **opts)   # champion-only, masked
    assert alone.stats["tokens_per_pass"] == 1
    for draft, k in (("none", "heuristic"), ("ngram", "heuristic"), ("ngram", "fixed:4")):
        spec = run(model, tok, ids, draft, k=k, **opts)   # forced drafts (+ n-gram)
        assert spec.tokens == alone.tokens and spec.text == alone.text, (draft, k)
        assert spec.tool_calls == alone.tool_calls and spec.finish_reason == alone.finish_reason
        if mode in ("required", "add"):
            assert spec.stats["forced_tokens"] > 0 and spec.stats["tokens_per_pass"] > 2


@pytest.mark.parametrize("mode", ["required", "add"])
def test_a_forced_call_is_valid_even_from_random_weights(family, mode):
    """required and a named choice: the answer is calls (one or more, each a tool of the list,
    its arguments valid against its parameters), then the end of the turn."""
    name, model, tok = family
    ids = tok.encode_chat(MESSAGES, tools=TOOLS)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for seed in range(3):
        r = run(model, tok, ids, "ngram", max_tokens=200, tool_choice=mode, temperature=1.0,
                seed=seed)
        assert r.finish_reason == "tool_calls" and r.tool_calls and r.content is None
        for call in r.tool_calls:
            fn = call["function"]
            assert fn["name"] == mode or mode == "required"
            assert valid(json.loads(fn["arguments"]), schemas[fn["name"]]), fn
        if name == "llama3":
            assert len(r.tool_calls) == 1        # Llama 3's format: one call per turn


def test_auto_starts_a_call_when_the_model_writes_the_trigger(family):
    """auto: free text until the trigger; biased toward it, the model starts a call and the
    grammar finishes it. none: the same bias never gets a call."""
    name, model, tok = family
    trigger = tok.encode("<tool_call>" if name == "qwen2.5" else "{", add_bos=False)[0]
    ids = tok.encode_chat(MESSAGES, tools=TOOLS)
    bias = {"logit_bias": {trigger: 30.0}, "max_tokens": 120}
    auto = run(model, tok, ids, "ngram", tool_choice="auto", **bias)
    assert auto.finish_reason == "tool_calls" and auto.tool_calls, auto.text
    none = run(model, tok, ids, "ngram", tool_choice="none", **bias)
    assert not none.tool_calls and none.finish_reason != "tool_calls"
    fmt = toolcalls.detect(tok)
    assert fmt.trigger not in none.text if fmt.anywhere else not none.text.startswith("{")


def test_one_call_without_parallel_tool_calls(family):
    """Biased toward a newline after a call (the separator's start): several calls where the
    format takes them (Qwen's), one without parallel_tool_calls or in Llama 3's format."""
    name, model, tok = family
    ids = tok.encode_chat(MESSAGES, tools=TOOLS)
    newline = tok.encode("\n", add_bos=False)[0]
    for parallel in (True, False):
        counts = [len(run(model, tok, ids, "ngram", max_tokens=300, tool_choice="required",
                          temperature=1.0, seed=s, parallel_tool_calls=parallel,
                          logit_bias={newline: 10.0}).tool_calls) for s in range(3)]
        assert (max(counts) > 1) == (parallel and name == "qwen2.5"), (parallel, counts)
        assert min(counts) >= 1


def test_the_grammar_writes_what_the_template_renders(family):
    """A call as the template renders it in history (its tojson arguments) walks the grammar
    from start to end, byte for byte: the answer re-renders to the same text."""
    name, model, tok = family
    fmt = toolcalls.detect(tok)
    g = toolgrammar.build(fmt, toolcalls.check_tools(TOOLS), "required", True)
    call = {"id": "c", "type": "function",
            "function": {"name": "get_weather",
                         "arguments": {"city": "Paris", "unit": "c", "days": 3}}}
    text = tok.render_chat(MESSAGES + [{"role": "assistant", "content": None,
                                        "tool_calls": [call]}], False, TOOLS)
    body = fmt.call_text("get_weather", call["function"]["arguments"])
    assert body in text
    state = g.initial()
    for b in body.encode():
        state = g.step(state, b)
        assert state is not None, body
    assert g.complete(state)


def test_the_round_trip_keeps_the_conversation_cache(family):
    """The call goes back as the assistant's tool_calls, the result as a tool message: the next
    request reuses the cache rows of the whole first prompt and the call's tokens."""
    name, model, tok = family
    engine = Engine(backend(model, "ngram"), tok)
    ids = tok.encode_chat(MESSAGES, tools=TOOLS)
    first = engine.generate(ids, Options(tools=TOOLS, tool_choice="add", max_tokens=200,
                                         parallel_tool_calls=False))
    [call] = first.tool_calls
    messages = MESSAGES + [{"role": "assistant", "content": None, "tool_calls": [call]},
                           {"role": "tool", "tool_call_id": call["id"], "content": "42"}]
    again = tok.encode_chat(messages, tools=TOOLS)
    assert again[:len(ids)] == ids
    second = engine.generate(again, Options(tools=TOOLS, max_tokens=8))
    assert second.stats["reused_tokens"] >= len(ids) + len(first.tokens) // 2
