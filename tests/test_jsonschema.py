"""pyspec/rules/jsonschema.py: the schema subset and its byte automaton. Oracles: `validate` below (a
small validator of the subset, written here, sharing nothing with the grammar) and Python's
json module; random documents are drawn from each schema and mutated."""

from __future__ import annotations

import json
import random

import pytest

from pyspec.rules.jsonschema import SchemaError, compile_schema

# Eight bounded schemas (every string and array has a maximum): the real-champion tests and the
# bench use them too.
SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
        "email": {"type": "string", "maxLength": 40}}, "required": ["name", "age"],
        "additionalProperties": False},
    "colors": {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]},
               "minItems": 1, "maxItems": 4},
    "point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
              "required": ["x", "y"]},
    "order": {"type": "object", "properties": {
        "id": {"type": "integer"},
        "items": {"type": "array", "maxItems": 3, "items": {
            "type": "object", "properties": {"sku": {"type": "string", "maxLength": 12},
                                             "qty": {"type": "integer"}},
            "required": ["sku", "qty"]}},
        "paid": {"type": "boolean"}}, "required": ["id", "items", "paid"]},
    "weather": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "temp_c": {"type": "number"},
        "sky": {"type": "string", "enum": ["sunny", "cloudy", "rain", "snow"]}},
        "required": ["city", "temp_c", "sky"]},
    "tags": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 30},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10},
                 "maxItems": 5}}, "required": ["title", "tags"]},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 16},
            "admin": {"type": "boolean"}}, "required": ["name", "admin"]},
        "note": {"type": ["string", "null"], "maxLength": 20}},
        "required": ["user", "note"]},
    "scores": {"type": "object", "properties": {
        "scores": {"type": "array", "items": {"type": "integer"}, "minItems": 2,
                   "maxItems": 5},
        "mean": {"type": "number"}}, "required": ["scores", "mean"]},
}


def validate(value, s: dict) -> bool:
    """The subset's semantics, independently: does `value` satisfy schema `s`?"""
    if "enum" in s:
        return any(value == v and type(value) is type(v) for v in s["enum"])
    types = s["type"] if isinstance(s["type"], list) else [s["type"]]
    return any(_validate_type(value, s, t) for t in types)


def _validate_type(value, s, t) -> bool:
    if t == "null":
        return value is None
    if t == "boolean":
        return isinstance(value, bool)
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t == "string":
        return isinstance(value, str) and len(value) <= s.get("maxLength", len(value))
    if t == "array":
        return (isinstance(value, list) and s.get("minItems", 0) <= len(value)
                <= s.get("maxItems", len(value)) and all(validate(v, s["items"]) for v in value))
    props = s.get("properties", {})
    return (isinstance(value, dict) and set(value) <= set(props)
            and set(s.get("required", [])) <= set(value)
            and all(validate(v, props[k]) for k, v in value.items()))


def sample(s: dict, r: random.Random):
    """A random value of schema s (keys in the schema's order)."""
    if "enum" in s:
        return r.choice(s["enum"])
    t = r.choice(s["type"]) if isinstance(s["type"], list) else s["type"]
    if t == "null":
        return None
    if t == "boolean":
        return r.random() < 0.5
    if t == "integer":
        return r.randint(-10**6, 10**6)
    if t == "number":
        return r.choice([r.randint(-99, 99), round(r.uniform(-1e3, 1e3), r.randint(0, 6)), 1.5e-7])
    if t == "string":
        alphabet = 'ab c"\\/\n\té€😀\u0001'
        n = r.randint(0, s.get("maxLength", 8))
        return "".join(r.choice(alphabet) for _ in range(n))
    if t == "array":
        n = r.randint(s.get("minItems", 0), s.get("maxItems", 4))
        return [sample(s["items"], r) for _ in range(n)]
    req = s.get("required", [])
    return {k: sample(v, r) for k, v in s.get("properties", {}).items()
            if k in req or r.random() < 0.5}


def accepts(grammar, data: bytes) -> bool:
    state = grammar.initial()
    for b in data:
        state = grammar.step(state, b)
        if state is None:
            return False
    return grammar.complete(state)


def dump(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


@pytest.mark.parametrize("name", SCHEMAS)
def test_every_sampled_value_is_accepted_and_every_mutation_judged_like_the_validator(name):
    s, r = SCHEMAS[name], random.Random(name)
    g = compile_schema(s)
    for _ in range(150):
        value = sample(s, r)
        assert validate(value, s)
        data = dump(value)
        assert accepts(g, data), data
        # Mutations: drop, repeat or change one byte; whatever the grammar accepts must parse
        # and validate (the converse does not hold: other spacing, key order, \u escapes).
        for _ in range(6):
            i = r.randrange(len(data))
            bad = r.choice([data[:i] + data[i + 1:], data[:i] + data[i:i + 1] * 2 + data[i + 1:],
                            data[:i] + bytes([r.choice(b'{}[]",:0a-.e\\')]) + data[i + 1:]])
            if accepts(g, bad):
                assert validate(json.loads(bad), s), bad
        for cut in range(len(data)):   # a proper prefix is never complete, except numbers'
            if accepts(g, data[:cut]):
                assert validate(json.loads(data[:cut]), s)


def test_what_is_written_keys_in_order_no_spaces_bounded_numbers_strings():
    g = compile_schema(SCHEMAS["person"])
    assert accepts(g, b'{"name":"Ann","age":3}')
    assert accepts(g, b'{"name":"Ann","age":3,"email":"a@b"}')
    assert not accepts(g, b'{"age":3,"name":"Ann"}')           # schema order
    assert not accepts(g, b'{"name": "Ann","age":3}')          # no whitespace
    assert not accepts(g, b'{"name":"Ann","age":3.5}')         # integer
    assert not accepts(g, b'{"name":"Ann","age":012}')
    assert accepts(g, b'{"name":"Ann","age":' + b"9" * 15 + b"}")
    assert not accepts(g, b'{"name":"Ann","age":' + b"9" * 16 + b"}")
    assert accepts(g, '{"name":"😀é\\u00e9\\n","age":-0}'.encode())
    assert not accepts(g, b'{"name":"\\ud83d\\ude00","age":1}')  # no surrogate escapes
    assert not accepts(g, b'{"name":"\xed\xa0\x80","age":1}')     # no UTF-8 surrogates
    assert not accepts(g, b'{"name":"\xc0\xaf","age":1}')        # no overlong forms
    assert not accepts(g, b'{"name":"a\nb","age":1}')            # no raw control bytes
    assert not accepts(g, ('{"name":"' + "x" * 25 + '","age":1}').encode())   # maxLength 24
    n = compile_schema({"type": "number"})
    for ok in (b"0", b"-1.5", b"1e5", b"2.25E-12", b"0.000001"):
        assert accepts(n, ok), ok
    for bad in (b"01", b"1.", b".5", b"+1", b"1e", b"1e123", b"1." + b"1" * 16, b"-"):
        assert not accepts(n, bad), bad


def test_forced_bytes_and_allowed():
    g = compile_schema(SCHEMAS["order"])
    assert g.forced(g.initial()) == b'{"id":'
    state = g.initial()
    for b in b'{"id":12':
        state = g.step(state, b)
    assert g.allowed(state) == sorted(b',0123456789')
    assert g.forced(g.step(state, ord(","))) == b'"items":['


@pytest.mark.parametrize("schema, words", [
    ({"type": "string", "pattern": "a+"}, ["'pattern'", "string"]),
    ({"type": "object", "properties": {"a": {"type": "string", "format": "date"}}},
     ["schema.properties.a", "'format'"]),
    ({"anyOf": [{"type": "string"}]}, ["'anyOf'"]),
    ({"$ref": "#/defs/a"}, ["'$ref'"]),
    ({"type": "object", "additionalProperties": True}, ["additionalProperties"]),
    ({"type": "object", "properties": {}, "required": ["a"]}, ["'a'", "not in properties"]),
    ({"type": "array"}, ["items"]),
    ({"type": "array", "items": {"type": "null"}, "minItems": 3, "maxItems": 1}, ["minItems"]),
    ({"type": "string", "maxLength": -1}, ["maxLength"]),
    ({"type": "date"}, ["'date'"]),
    ({"type": ["integer", "number"]}, ["integer and number"]),
    ({"type": "string", "enum": [1]}, ["enum value 1"]),
    ({"properties": {}}, ["needs a \"type\""]),
    ({}, ["needs a \"type\""]),
    ("{not json", ["not valid JSON"]),
    ([1], ["must be a JSON object"]),
])
def test_bad_schemas_get_named_errors(schema, words):
    with pytest.raises(SchemaError) as e:
        compile_schema(schema)
    assert e.value.code == "bad_config"
    for w in words:
        assert w in str(e.value)
