"""pyspec/options.py: the request options' table (REQUEST) is the one source of their names,
types, defaults and ranges. Everything else that names them is generated from it or checked
here against it: the engine's Options and its check, the command line's flags, the page
session's field types, web/options.js (the client's facade) and web/client.d.ts."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest

from pyspec.apps import cli
from pyspec.errors import PyspecError
from pyspec.options import OPTION, REQUEST, Options, from_request
from webtools import optionsjs

ROOT = Path(__file__).resolve().parent.parent
DTS = (ROOT / "web" / "client.d.ts").read_text()


def test_options_js_is_written_from_the_table():
    assert optionsjs.JS.read_text() == optionsjs.render(), (
        "web/options.js is stale: run `python -m webtools.optionsjs` (or python3 build.py site)")


def test_options_defaults_are_the_tables():
    """Options' fields are the table's engine options (and two the front ends never send), with
    the table's defaults; a request of nothing but nulls is Options()."""
    own = {"stop_at_eos", "stop_ids"}
    engine = {o.name for o in REQUEST if o.engine}
    assert {f.name for f in dataclasses.fields(Options)} - own == engine
    defaults = Options()
    for name in engine:
        want = OPTION[name].default
        assert getattr(defaults, name) == want, name
    assert from_request({o.name: None for o in REQUEST}) == Options()
    assert from_request({"stop": "x", "top_p": 1, "k": ""}) == Options(stop=("x",), top_p=1.0)


def _bounds(text: str):
    """(low, low included, high, high included) of an interval "[a, b)" or ">= a" / "> a"."""
    number = lambda s: 2 ** 64 if s.strip() == "2^64" else float(s)   # noqa: E731
    m = re.fullmatch(r"([\[(])(.+), (.+)([\])])", text)
    if m:
        return number(m[2]), m[1] == "[", number(m[3]), m[4] == "]"
    m = re.fullmatch(r"(>=?) (.+)", text)
    return number(m[2]), m[1] == ">=", math.inf, False


def _accepts(name: str, value) -> bool:
    try:
        Options(**{name: value}).check()
    except PyspecError:
        return False
    return True


@pytest.mark.parametrize("option", [o for o in REQUEST if o.range], ids=lambda o: o.name)
def test_each_range_is_what_options_check_accepts(option):
    """The range the help shows is the one Options.check enforces, at both ends."""
    low, low_in, high, high_in = _bounds(option.range)
    integer = option.types == (int,)
    step = 1 if integer else 1e-9 * max(1.0, abs(low))
    kind = int if integer else float
    assert _accepts(option.name, kind(low)) == low_in, (option.name, low)
    assert _accepts(option.name, kind(low + step if not low_in else low - step)) == (not low_in)
    if high != math.inf:
        high_step = 1 if integer else 1e-9 * max(1.0, abs(high))
        assert _accepts(option.name, kind(high)) == high_in, (option.name, high)
        assert not _accepts(option.name, kind(high + high_step)), (option.name, high)


def test_every_option_with_a_flag_is_a_flag_of_generate_with_its_default():
    generate = cli.parser()._subparsers._group_actions[0].choices["generate"]
    flags = {a.dest: a for a in generate._actions}
    for o in (o for o in REQUEST if o.flag is not None):
        assert o.name in flags, o.name
        if "action" not in o.flag:
            assert flags[o.name].default == o.default, o.name
            assert tuple(flags[o.name].choices or ()) == tuple(o.choices or ()), o.name


def _interface(name: str) -> dict[str, str]:
    """The fields of a client.d.ts interface: name -> the rest of its line (type, comment)."""
    body = re.search(rf"export interface {name}\b[^{{]*\{{(.*?)\n\}}", DTS, re.S)[1]
    return dict(re.findall(r"^  (\w+)\?: (.*)$", body, re.M))


def test_client_dts_types_every_option_with_the_tables_default():
    """generate()'s config types every request option; a default it states is the table's;
    a number option is a number and a string option a string there."""
    config = {**_interface("SamplingConfig"), **_interface("GenerateConfig")}
    assert set(config) == set(OPTION)
    checked = 0
    for name, line in config.items():
        option = OPTION[name]
        if float in option.types or option.types == (int,):
            assert line.startswith("number | null"), name
        stated = re.search(r"default ([^\s;)]+)", line) or re.search(r'"(\w+)" \(default\)',
                                                                        line)
        if stated:
            assert stated[1] == str(option.default).removesuffix(".0"), (name, line)
            checked += 1
    assert checked >= 4     # max_tokens, temperature, seed, k
    assert "Default 128 (generate()'s)" in DTS and OPTION["max_tokens"].default == 128


def test_the_facade_request_types_every_option_with_an_openai_name():
    request = {**_interface("SamplingConfig"), **_interface("ChatCompletionRequest")}
    request.pop("json_schema")      # ChatCompletionRequest omits it: only response_format there
    openai = {o.openai for o in REQUEST if o.openai}
    assert openai <= set(request)
    pyspec_own = re.search(r'PyspecRequestOptions = Pick<GenerateConfig,\s*(.*?)>;', DTS, re.S)[1]
    assert set(re.findall(r'"(\w+)"', pyspec_own)) == {
        o.name for o in REQUEST if not o.openai and o.name in _interface("GenerateConfig")}
