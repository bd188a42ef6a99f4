"""Every option of a generate request, once (REQUEST): its name, types, default, range, help and
OpenAI name; the `Options` the engine reads, with its defaults from the table; and the check that
a request's values are usable.

The front ends are written from REQUEST: the command line's flags (apps/cli.py), the page
session's field checks (apps/session.py), web/options.js (the client's facade fields, written by
webtools/optionsjs.py), and tests/test_options.py ties web/client.d.ts and the ranges of
`Options.check` to it. A new option is a new row here (and a field of Options if the engine reads
it); the tests say which file to regenerate or extend.

Not here: what the options do (the engine, rules/processors.py, text/stops.py,
rules/jsonschema.py); the load options (a model, a drafter, a backend), whose values differ by
front end (paths and native backends on the command line, manifest names and WebGPU in the page).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields

import numpy as np

from . import schedule
from .cycle import VERIFY_MODES
from .errors import OptionsError, about
from .rules.jsonschema import Grammar, compile_into, compile_schema
from .rules.processors import Sampling
from .rules.tree import parse_tree
from .text.conversation import POLICIES
from .text.stops import MAX_STOPS
from .text.toolcalls import check_choice, check_tools


@dataclass(frozen=True)
class Option:
    """One request option. `types`: the JSON values it takes (int, float, str, list, dict,
    bool; a bool is no int); null or absent means `default`. `range`: the values it takes, as an
    interval ("[-2, 2]", "(0, 1]", ">= 0"; tests/test_options.py checks Options.check against
    it) or words. `openai`: its name in a chat.completions request (OpenAI's, or as WebLLM and
    vLLM take it; None: only under the facade's `pyspec`). `flag`: the command line's argparse
    extras (metavar, action), or None for no flag. `engine`: an Options field; else the
    session's own (the drafter, a drill). `sampling`: one of the sampling controls (applied in
    the order of the table). `api`: the help in the words of a request's field (generate(),
    docs/embedding.md's table), where the command line's differs (a flag given again, a file)."""
    name: str
    types: tuple
    default: object
    help: str
    range: str = ""
    choices: tuple | None = None
    openai: str | None = None
    flag: dict | None = field(default_factory=dict)
    engine: bool = True
    sampling: bool = False
    api: str = ""

    def line(self) -> str:
        """The help line: the range first, where it has one."""
        return f"{self.range}; {self.help}" if self.range else self.help


NUMBER = (int, float)
REQUEST = (
    Option("max_tokens", (int,), 128, "tokens to generate at most", ">= 1",
           openai="max_tokens"),
    Option("temperature", NUMBER, 0.0, "0 is greedy", ">= 0", openai="temperature"),
    Option("seed", (int,), 0, "the sampling seed (the same seed gives the same text)",
           "[0, 2^64)", openai="seed"),
    Option("verify", (str,), None, "default: greedy at temperature 0, replay above",
           choices=VERIFY_MODES),
    Option("k", (str,), "heuristic", "drafts per cycle: fixed:K (0..64) | heuristic (the "
           "break-even guard picks) | confidence:P (0..1: draft while the draft is this sure)"),
    Option("tree", (str,), None, "verify a tree of drafts per pass: widths per depth W1,W2,... "
           "(e.g. 2,2,1) or auto (from the draft's confidence); with n-gram or a draft model, on "
           "the CPU engines and the GPU (in the page a draft model's trees of widths, greedy or "
           "replay), without sampling controls or a schema; default: chains",
           flag={"metavar": "SHAPE"}),
    Option("draft", (str,), None, "this request's drafter (default: the loaded one)",
           flag=None, engine=False),
    Option("drill", (str,), None, "a fault drill KIND@CYCLE (a session loaded with drills on)",
           flag=None, engine=False),
    Option("context_overflow", (str,), "drop_oldest", "a conversation too long for the "
           "context: leave out its oldest turns (default) or refuse it", choices=POLICIES,
           engine=False),
    # The sampling controls, applied in this order (processors.py; docs/sampling-and-json.md).
    Option("logit_bias", (dict,), {}, "add BIAS in [-100, 100] to a token's logit (repeatable)",
           openai="logit_bias", flag={"action": "append", "metavar": "ID=BIAS"}, sampling=True,
           api="{token id: bias}, each bias in [-100, 100], added to that token's logit"),
    Option("repetition_penalty", NUMBER, 1.0, "divides positive / multiplies negative logits "
           "of tokens in the prompt and output (HF); 1 = off", "(0, 1e6]",
           openai="repetition_penalty", sampling=True),
    Option("presence_penalty", NUMBER, 0.0, "subtracted once from each token in the output "
           "(OpenAI)", "[-2, 2]", openai="presence_penalty", sampling=True),
    Option("frequency_penalty", NUMBER, 0.0, "subtracted per occurrence in the output (OpenAI)",
           "[-2, 2]", openai="frequency_penalty", sampling=True),
    Option("top_k", (int,), 0, "keep the K likeliest tokens; 0 = off", ">= 0", openai="top_k",
           sampling=True),
    Option("top_p", NUMBER, 1.0, "keep the smallest set of likeliest tokens with mass >= P",
           "(0, 1]", openai="top_p", sampling=True),
    Option("min_p", NUMBER, 0.0, "drop tokens below P times the top probability", "[0, 1]",
           openai="min_p", sampling=True),
    Option("stop", (str, list), (), f"end the output before TEXT (repeatable, up to "
           f"{MAX_STOPS}); \\n, \\t and \\\\ in TEXT are a newline, a tab and a backslash",
           openai="stop", flag={"action": "append", "metavar": "TEXT"}, sampling=True,
           api=f"a string or up to {MAX_STOPS}: the output ends before the first to appear "
               "(finish_reason stop)"),
    # Constrained output: a JSON schema, or OpenAI's response_format (apps/session.py reads it).
    Option("json_schema", (dict,), None, "a JSON schema file: the output is compact JSON that "
           "follows it (the subset in docs/sampling-and-json.md)", flag={"metavar": "FILE"},
           api="a JSON schema: the output is compact JSON that follows it (the subset in "
               "docs/sampling-and-json.md); in chat.completions.create, give response_format"),
    Option("response_format", (dict,), None, "OpenAI's {type: 'json_schema', json_schema: "
           "{name, schema, strict}} or {type: 'text'}", openai="response_format", flag=None,
           engine=False),
    # Tool calls (rules/toolgrammar.py, text/toolcalls.py; docs/sampling-and-json.md).
    Option("tools", (list,), None, "a JSON file of OpenAI's tools list ([{type: 'function', "
           "function: {name, description, parameters}}]): the model may call them, each call "
           "decoded under its parameters' schema", openai="tools", flag={"metavar": "FILE"},
           api="OpenAI's tools list ([{type: 'function', function: {name, description, "
           "parameters}}]): the model may call them, each call decoded under its parameters' "
           "schema"),
    Option("tool_choice", (str, dict), None, "with tools: auto (the model chooses; the "
           "default) | none (no call) | required (at least one call) | NAME (that tool)",
           openai="tool_choice", flag={"metavar": "auto|none|required|NAME"},
           api="with tools: 'auto' (the model chooses; the default) | 'none' (no call) | "
           "'required' (at least one call) | {type: 'function', function: {name}} (that tool)"),
    Option("parallel_tool_calls", (bool,), True, "several calls in one answer where the "
           "template's format takes them (else one)", openai="parallel_tool_calls",
           flag={"action": argparse.BooleanOptionalAction}),
)
OPTION = {o.name: o for o in REQUEST}


def _default(name: str):
    value = OPTION[name].default
    if isinstance(value, (dict, list)):
        return field(default_factory=lambda: type(value)(value))
    return field(default=value)


@dataclass
class Options:
    """A request's options as the engine reads them; the defaults are REQUEST's."""
    max_tokens: int = _default("max_tokens")
    temperature: float = _default("temperature")
    seed: int = _default("seed")
    verify: str | None = _default("verify")   # None: greedy at T = 0, replay above
    k: str = _default("k")
    tree: str | None = _default("tree")   # rules/tree.parse_tree: widths, "auto" or None
    stop_at_eos: bool = True
    stop_ids: tuple = ()          # more token ids that end generation, besides the model's EOG
    # The sampling controls (processors.py: their order, counting, ties), OpenAI-style names.
    top_k: int = _default("top_k")
    top_p: float = _default("top_p")
    min_p: float = _default("min_p")
    repetition_penalty: float = _default("repetition_penalty")  # prompt and output tokens (HF)
    presence_penalty: float = _default("presence_penalty")      # output tokens only (OpenAI)
    frequency_penalty: float = _default("frequency_penalty")    # output tokens only (OpenAI)
    logit_bias: dict = _default("logit_bias")     # token id -> bias in [-100, 100]
    stop: tuple = _default("stop")                # stop strings (stops.py), cut from the output
    json_schema: dict | str | None = _default("json_schema")   # the output follows it
    tools: list | None = _default("tools")                 # OpenAI's tools list
    tool_choice: str | dict | None = _default("tool_choice")   # None: auto with tools
    parallel_tool_calls: bool = _default("parallel_tool_calls")

    def sampling(self) -> Sampling:
        return Sampling(logit_bias=self.logit_bias, repetition_penalty=self.repetition_penalty,
                        presence_penalty=self.presence_penalty,
                        frequency_penalty=self.frequency_penalty, top_k=self.top_k,
                        top_p=self.top_p, min_p=self.min_p)

    def resolved_verify(self) -> str:
        """T = 0 is always greedy: every rule reduces to argmax there."""
        if self.temperature == 0:
            return "greedy"
        return self.verify or "replay"

    def check(self) -> None:
        """Raise a PyspecError (bad_config) for the first unusable value; the error's `option`
        names the option it is about (errors.about), which a front end shows in its own words."""
        with about("max_tokens"):
            if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
                raise OptionsError(f"max_tokens must be a positive integer, got "
                                   f"{self.max_tokens!r}")
        with about("temperature"):
            if not (self.temperature >= 0 and np.isfinite(self.temperature)):
                raise OptionsError(f"temperature must be a finite number >= 0, got "
                                   f"{self.temperature}")
        with about("verify"):
            if self.verify not in (None, *VERIFY_MODES):
                raise OptionsError(f"unknown verify mode {self.verify!r}: use one of "
                                   f"{VERIFY_MODES}")
            if self.verify == "greedy" and self.temperature > 0:
                raise OptionsError("verify=greedy needs temperature 0; use replay or rejection")
        with about("seed"):
            if not isinstance(self.seed, int) or not 0 <= self.seed < 1 << 64:
                raise OptionsError(f"seed must be an integer in [0, 2^64), got {self.seed!r}")
        with about("k"):
            schedule.parse(self.k)
        with about("tree"):
            parse_tree(self.tree)
        self.sampling().check()     # its errors name their control (SamplingError.option)
        with about("stop"):
            self._check_stop()
        if self.json_schema is not None:
            with about("json_schema"):
                if not self.stop_at_eos:
                    raise OptionsError("json_schema needs stop_at_eos: the end-of-text token is "
                                       "what ends the JSON value")
                compile_schema(self.json_schema)   # a SchemaError names what is not supported
        with about("tools"):
            self.check_tools()

    def _check_stop(self) -> None:
        stop = self.stop
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
            raise OptionsError(f"stop must be a string or a list of strings, got {stop!r}")
        if len(stop) > MAX_STOPS:
            raise OptionsError(f"stop takes at most {MAX_STOPS} strings, got {len(stop)}")
        if not all(stop):
            raise OptionsError("stop strings must not be empty")

    def check_tools(self) -> tuple[list, str]:
        """(the tools checked, the choice as "auto" | "none" | "required" | a tool's name);
        ToolError or SchemaError name what is wrong (every tool's parameters compiled)."""
        if not isinstance(self.parallel_tool_calls, bool):
            raise OptionsError(f"parallel_tool_calls must be true or false, got "
                               f"{self.parallel_tool_calls!r}")
        tools = None if self.tools is None else check_tools(self.tools)
        choice = check_choice(self.tool_choice, tools)
        if tools is None:
            return [], choice
        if self.json_schema is not None:
            raise OptionsError("give tools or json_schema (response_format), not both: a "
                               "call's arguments follow its tool's parameters")
        if not self.stop_at_eos:
            raise OptionsError("tools need stop_at_eos: the end-of-turn token ends the calls")
        for i, tool in enumerate(tools):
            compile_schema_at(tool.parameters, f"tools[{i}].function.parameters")
        return tools, choice


def compile_schema_at(schema: dict, where: str) -> None:
    """Compile a schema that sits at `where` in the request (a SchemaError names it there)."""
    compile_into(Grammar(spaced=True), schema, where)


def from_request(values: dict) -> Options:
    """The Options of a request's fields (their types already checked; null or absent: the
    default; "" for a string option: its default too). A number option is a float, a stop
    string alone a list of one (as in the OpenAI API). Options.check judges the values."""
    out = {}
    for name in (f.name for f in fields(Options)):
        option, value = OPTION.get(name), values.get(name)
        if option is None or value is None or value == "":
            continue
        if float in option.types and not isinstance(value, bool):
            value = float(value)
        elif name == "stop":
            value = tuple([value] if isinstance(value, str) else value)
        out[name] = value
    return Options(**out)
