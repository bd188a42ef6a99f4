"""Tool calls as text: the call format a model's chat template writes, read from the
template itself; OpenAI's `tools`, `tool_choice` and tool messages checked; and a generated
answer split into its content and its calls, as it streams and at its end.

The format. A template is rendered (template.py) with a probe conversation, an assistant turn
that calls a probe function, and the text it writes for that call is matched against the call
formats pyspec reads:
  hermes   `<tool_call>\\n{"name": "F", "arguments": ARGS}\\n</tool_call>`, calls one after
           another separated by what the template writes between two (Qwen 2.5 and 3, Hermes 2
           Pro and 3, and their kin); a call may follow some content (after a newline);
  llama3   `{"name": "F", "parameters": ARGS}` as the whole answer, one call per turn (Llama
           3.1 / 3.2 / 3.3's JSON tool calling).
ARGS is the arguments object as the template's `tojson` writes it (json.dumps's separators).
A template that never reads `tools`, or writes the probe call any other way (Mistral's
[TOOL_CALLS], Functionary, Command R, Granite, XML calls, ...), is refused by name
(ToolFormatError). The grammar a call is decoded under is rules/toolgrammar.py's.

Not here: the grammar and its masks (rules/toolgrammar.py), rendering (template.py, chat.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

from ..errors import PyspecError

NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")   # OpenAI's rule for a function's name
CHOICES = ("auto", "none", "required")


class ToolError(PyspecError, ValueError):
    """A `tools` list, `tool_choice` or tool message that is malformed; the message names it."""

    code = "bad_config"


class ToolFormatError(PyspecError, ValueError):
    """The model's chat template takes no tools, or writes calls in a format pyspec does not
    read."""

    code = "bad_config"


@dataclass(frozen=True)
class ToolFormat:
    """How a template writes a call: prefix + NAME + mid + ARGS + suffix."""
    name: str
    prefix: str
    mid: str
    suffix: str
    trigger: str       # the text that starts a call (a prefix of `prefix`)
    lead: str          # what the template writes between content and the first call
    anywhere: bool     # a call may follow content (else only at the answer's start)
    sep: str | None = None   # between two calls; None: one call per turn (read from the template)
    end: int | None = None   # the end-of-generation token the template writes after the calls

    def call_text(self, name: str, arguments: dict) -> str:
        return self.prefix + name + self.mid + json.dumps(arguments, ensure_ascii=False) \
            + self.suffix


FORMATS = (
    ToolFormat("hermes", '<tool_call>\n{"name": "', '", "arguments": ', '}\n</tool_call>',
               trigger="<tool_call>", lead="\n", anywhere=True),
    ToolFormat("llama3", '{"name": "', '", "parameters": ', "}", trigger="{", lead="",
               anywhere=False),
)


# --- the requests' checks -------------------------------------------------------------------
@dataclass(frozen=True)
class Tool:
    name: str
    parameters: dict      # its arguments' JSON schema (an object schema)


def check_tools(tools) -> list[Tool]:
    """OpenAI's `tools` ([{type: "function", function: {name, description, parameters,
    strict}}]) checked: names by OpenAI's rule and distinct, parameters an object schema (their
    subset is rules/jsonschema.py's, checked when compiled). ToolError names what is wrong."""
    if not isinstance(tools, list) or not tools:
        raise ToolError("tools must be a non-empty list of {type: 'function', function: {name, "
                        "description, parameters}}")
    out: list[Tool] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(
                tool.get("function"), dict) or set(tool) - {"type", "function"}:
            raise ToolError(f"{where} must be {{type: 'function', function: {{name, description, "
                            "parameters}}}} (the only tool type there is)")
        fn = tool["function"]
        unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise ToolError(f"{where}.function has unknown field(s) {', '.join(unknown)}: it "
                            "takes name, description, parameters, strict")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ToolError(f"{where}.function.name must be 1-64 letters, digits, '_' or '-' "
                            f"(OpenAI's rule), got {name!r:.80}")
        if any(t.name == name for t in out):
            raise ToolError(f"{where}.function.name {name!r} names two tools: give each tool "
                            "its own name")
        if not isinstance(fn.get("description", ""), str):
            raise ToolError(f"{where}.function.description must be a string")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict) or params.get("type") != "object":
            raise ToolError(f"{where}.function.parameters must be a JSON schema of type "
                            "'object' (the arguments are an object)")
        out.append(Tool(name, params))
    return out


def check_choice(choice, tools: list[Tool] | None) -> str:
    """`tool_choice` as "auto", "none", "required" or a tool's name: OpenAI's forms (a word, or
    {type: "function", function: {name}}) or a tool's name alone (the command line's)."""
    if tools is None:
        if choice is not None:
            raise ToolError("tool_choice needs tools: give the tools the model may call")
        return "none"
    if choice is None:
        return "auto"
    if isinstance(choice, dict):
        fn = choice.get("function")
        if choice.get("type") != "function" or not isinstance(fn, dict) or not isinstance(
                fn.get("name"), str):
            raise ToolError("tool_choice must be 'auto', 'none', 'required' or {type: "
                            "'function', function: {name}}")
        choice = fn["name"]
        if choice not in [t.name for t in tools]:
            raise ToolError(f"tool_choice names {choice!r}, which is not one of tools "
                            f"({', '.join(t.name for t in tools)})")
        return choice
    if not isinstance(choice, str) or (choice not in CHOICES
                                       and choice not in [t.name for t in tools]):
        raise ToolError(f"tool_choice must be one of {CHOICES} or a tool's name "
                        f"({', '.join(t.name for t in tools)}), got {choice!r:.80}")
    return choice


def check_tool_message(k: int, message: dict) -> dict:
    """A message as the template reads it: an assistant's `tool_calls` ([{id, type: 'function',
    function: {name, arguments}}], the arguments a JSON object or its text, as OpenAI sends
    them) with their arguments as objects and null content as ""; a `tool` message's
    content a string. Other messages as they are."""
    role, calls = message.get("role"), message.get("tool_calls")
    if role == "tool":
        if "tool_call_id" in message and not isinstance(message["tool_call_id"], str):
            raise ToolError(f"messages[{k}].tool_call_id must be a string (the call's id)")
        return message
    if calls is None or role != "assistant":
        if calls is not None:
            raise ToolError(f"messages[{k}] has tool_calls but role {role!r}: only an "
                            "assistant message calls tools")
        return message
    if not isinstance(calls, list) or not calls:
        raise ToolError(f"messages[{k}].tool_calls must be a non-empty list of calls")
    out = []
    for j, call in enumerate(calls):
        where = f"messages[{k}].tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ToolError(f"{where} must be {{id, type: 'function', function: {{name, "
                            "arguments}}}}")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                raise ToolError(f"{where}.function.arguments is not valid JSON: send the "
                                "arguments the call came with") from None
        if not isinstance(args, dict):
            raise ToolError(f"{where}.function.arguments must be a JSON object")
        out.append({**call, "type": "function", "function": {**fn, "arguments": args}})
    content = message.get("content")
    return {**message, "content": "" if content is None else content, "tool_calls": out}


# --- the format, read from the template -----------------------------------------------------
_PROBE_TOOL = {"type": "function", "function": {
    "name": "probe_fn", "description": "a probe", "parameters": {
        "type": "object", "properties": {"probe_key": {"type": "string"}}}}}


def _probe_call(n: int) -> dict:
    return {"id": f"call_{n}", "type": "function",
            "function": {"name": f"probe_fn{n}", "arguments": {"probe_key": "probe_value"}}}


def detect(tokenizer) -> ToolFormat:
    """The call format `tokenizer`'s chat template writes (kept on the tokenizer), or
    ToolFormatError."""
    found = getattr(tokenizer, "_tool_format", None)
    if found is None:
        found = tokenizer._tool_format = _detect(tokenizer)
    return found


def _render(tokenizer, messages, tools) -> str | None:
    try:
        return tokenizer.render_chat(messages, add_generation_prompt=False, tools=tools)
    except PyspecError:
        return None


def _detect(tokenizer) -> ToolFormat:
    where = f"the model's chat template (sha256 {tokenizer.template_hash()[:12]})"
    user = [{"role": "user", "content": "probe"}]
    if tokenizer.chat_template is None or _render(tokenizer, user, [_PROBE_TOOL]) == \
            _render(tokenizer, user, None):
        raise ToolFormatError(f"{where} takes no tools: the model was not trained to call "
                              "functions. Leave out tools, or use a model whose template "
                              "reads them (Qwen 2.5, Llama 3.2, Hermes)")
    one = _render(tokenizer, user + [{"role": "assistant", "content": None,
                                      "tool_calls": [_probe_call(1)]}], [_PROBE_TOOL]) or ""
    two = _render(tokenizer, user + [{"role": "assistant", "content": None,
                                      "tool_calls": [_probe_call(1), _probe_call(2)]}],
                  [_PROBE_TOOL]) or ""
    args = {"probe_key": "probe_value"}
    for fmt in FORMATS:
        first = fmt.call_text("probe_fn1", args)
        if first not in one:
            continue
        second = fmt.call_text("probe_fn2", args)
        between = two[two.find(first) + len(first):two.find(second)] if first in two \
            and second in two and two.find(first) < two.find(second) else None
        sep = between if fmt.anywhere and between is not None and len(between) < 8 else None
        after = one[one.find(first) + len(first):]
        end = next((t for t in sorted(tokenizer.eog_ids)
                    if after.startswith(tokenizer.tokens[t])), None)
        return ToolFormat(fmt.name, fmt.prefix, fmt.mid, fmt.suffix, fmt.trigger, fmt.lead,
                          fmt.anywhere, sep, end)
    raise ToolFormatError(f"{where} writes tool calls in a format pyspec does not read; it "
                          "reads Qwen 2.5 / Hermes <tool_call> JSON and Llama 3.x JSON calls. "
                          "Use a model with one of those templates, or leave out tools")


# --- the answer, split ------------------------------------------------------------------------
@dataclass
class CallSpan:
    """One call in the answer's text: its name and where its arguments are (text[start:end];
    `closed` once the arguments' object has ended)."""
    name: str
    start: int
    end: int
    closed: bool


@dataclass
class Split:
    """The answer's text so far as content and calls: text[:content_end] is content (a tail
    that may yet start a call is held back while it streams)."""
    content_end: int
    calls: list[CallSpan] = field(default_factory=list)


def split(text: str, fmt: ToolFormat, final: bool = False) -> Split:
    """The content and calls of `text`, a prefix of an answer (the whole of it when `final`)."""
    start = text.find(fmt.trigger) if fmt.anywhere else (0 if text.startswith(fmt.trigger)
                                                         else -1)
    if start < 0:
        return Split(len(text) if final else len(text) - _held(text, fmt))
    out = Split(start - len(fmt.lead) if fmt.lead and text[:start].endswith(fmt.lead)
                else start)
    i = start
    while True:
        if out.calls:
            if fmt.sep is None or not text.startswith(fmt.sep + fmt.prefix, i):
                return out
            i += len(fmt.sep)
        if not text.startswith(fmt.prefix, i):
            return out
        i += len(fmt.prefix)
        quote = text.find('"', i)    # a name holds no quote (NAME_RE)
        if quote < 0 or not text.startswith(fmt.mid, quote):
            return out
        args = quote + len(fmt.mid)
        end = _object_end(text, args)
        out.calls.append(CallSpan(text[i:quote], args, len(text) if end is None else end,
                                  end is not None))
        if end is None or not text.startswith(fmt.suffix, end):
            return out
        i = end + len(fmt.suffix)


def _held(text: str, fmt: ToolFormat) -> int:
    """How much of the end of `text` could still become the start of a call."""
    if not fmt.anywhere:
        return len(text) if text and fmt.trigger.startswith(text) else 0
    starts = (fmt.lead + fmt.trigger, fmt.trigger)
    return next((n for n in range(min(len(starts[0]), len(text)), 0, -1)
                 if any(s.startswith(text[-n:]) for s in starts)), 0)


def _object_end(text: str, i: int) -> int | None:
    """The index after the JSON object starting at text[i], or None where it has not ended."""
    depth, in_string, escaped = 0, False, False
    for j in range(i, len(text)):
        c = text[j]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
    return None


def salt(prompt: list[int]) -> str:
    """The ids' salt of a request: its prompt's hash (a conversation's turns differ in it)."""
    return hashlib.sha256(json.dumps(list(prompt)).encode()).hexdigest()[:16]


def call_id(salt: str, index: int) -> str:
    """A call's id: from the request (its prompt's hash) and the call's place, so that the same
    request names its calls alike, and a resumed stream too."""
    return "call_" + hashlib.sha256(f"{salt}:{index}".encode()).hexdigest()[:24]


def result(text: str, fmt: ToolFormat, salt: str) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of a finished answer in OpenAI's shape: the calls whose arguments
    are whole (a call cut by max_tokens is left out), the content before them (None where
    there is none)."""
    s = split(text, fmt, final=True)
    calls = [{"id": call_id(salt, n), "type": "function",
              "function": {"name": c.name, "arguments": text[c.start:c.end]}}
             for n, c in enumerate(s.calls) if c.closed]
    content = text[:s.content_end]
    return (content if content.strip() or not calls else None), calls
