"""A model's own Jinja chat template, rendered by jinja2 as HF renders it, bounded, with provenance.

Scope: any `tokenizer.chat_template` (the ChatML fast path is `chat.py`). The environment is what
HF transformers builds (`ImmutableSandboxedEnvironment`, trim_blocks, lstrip_blocks, the
loopcontrols extension, `tojson`, `raise_exception`, `strftime_now`; the variables messages,
tools (None, or OpenAI's tools list), documents=None, add_generation_prompt, bos_token,
eos_token). Messages may carry `tool_calls` (an assistant's) and be of role `tool`
(text/toolcalls.py checks them).

Provenance. Control tokens must come only from the template's own text, never from a message or
a tool (its name, description, schema, a call's arguments). Every string in them is rendered
with every control-token string in it, and any piece at its
(whitespace-trimmed) ends that could join the template's text into one, replaced by a placeholder:
one private-use character of plane 16 per distinct literal (kept as it is by `tojson`). The
template works on the content as
it is otherwise (a `trim`, a `split('</think>')` behave as on the real text). The rendered text is
then cut at the placeholders: each becomes its literal as message text (`(text, False)`), the rest
is template text (`(text, True)`). So the text equals the plain render, and the caller parses
control tokens only in template text. Limit: a template that cuts a message in the middle and puts
a half-token of it against its own half-token could still join them; no template we know does.

Bounds, inside the render (Pyodide has no threads or signals): every loop step, call, operator and
concatenation counts against a step and time budget, operators and string methods that would build
a string or list past the size bound are refused before they run, and the output is measured as it
is produced. Any failure (the template raises, loops, explodes, breaks the sandbox) is a
`RenderError` naming it. jinja2 is imported on first use: a ChatML model never loads it.

Not here: checking messages and turning the pieces into ids (`tokenizer.Tokenizer`).
"""

from __future__ import annotations

import functools
import json
import re
import time
from datetime import datetime
from functools import lru_cache

MAX_STEPS = 2_000_000        # loop steps, calls and operators in one render
MAX_SECONDS = 5.0            # wall time of one render
BASE_OUTPUT = 1 << 20        # characters a render may produce, plus 4 per character of content
_PLANE16 = 0x100000          # placeholders: U+100000 + k (private use, plane 16)
_PLANE16_RE = re.compile("[\U00100000-\U0010FFFF]")


_first_render_ms: float | None = None   # this process's first render; see first_render_ms


class RenderError(Exception):
    """The template did not render; `tokenizer.py` reports it as a TemplateError."""


class _Budget:
    """Steps, time and size left to one render."""

    def __init__(self, max_chars: int):
        self.max_chars = max_chars
        self.steps = 0
        self.deadline = time.monotonic() + MAX_SECONDS

    def tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise RenderError(f"the template ran past {MAX_STEPS} steps (a runaway loop?)")
        if not self.steps & 1023 and time.monotonic() > self.deadline:
            raise RenderError(f"the template ran past {MAX_SECONDS} s")

    def size(self, n: int) -> None:
        if n > self.max_chars:
            raise RenderError(f"the template built a value of {n} characters or items, past "
                              f"the bound of {self.max_chars}")


def render_segments(source: str, messages: list[dict], add_generation_prompt: bool, *,
                    bos_token: str, eos_token: str, controls: list[str],
                    tools: list | None = None) -> list[tuple[str, bool]]:
    """The rendered chat as (text, comes from the template) pieces; see the module docstring.

    `messages` are checked already (dicts with a str 'content'); `controls` are the texts of the
    vocabulary's control tokens; `tools` OpenAI's tools list, or None.
    """
    global _first_render_ms
    start = time.perf_counter()
    if _PLANE16_RE.search(source):
        raise RenderError("the template holds private-use characters of plane 16, which the "
                          "renderer keeps for its placeholders")
    literals: list[str] = []
    protect = _protector(tuple(sorted(set(controls), key=len, reverse=True)), literals)
    escaped = _protected(messages, protect)
    tools = None if tools is None else _protected(tools, protect)
    size = sum(len(m["content"]) for m in messages) + (len(json.dumps(tools)) if tools else 0)
    budget = _Budget(BASE_OUTPUT + 4 * size + sum(len(json.dumps(m.get("tool_calls") or ""))
                                                   for m in messages))
    text = _render(source, budget, messages=escaped, add_generation_prompt=add_generation_prompt,
                   bos_token=bos_token, eos_token=eos_token, tools=tools, documents=None)
    if _first_render_ms is None:
        _first_render_ms = 1000 * (time.perf_counter() - start)
    marks = _PLANE16_RE.findall(text)
    segments: list[tuple[str, bool]] = []
    for k, piece in enumerate(_PLANE16_RE.split(text)):
        if k:  # the placeholder that stood between this piece and the one before
            segments.append((literals[ord(marks[k - 1]) - _PLANE16], False))
        if piece:
            segments.append((piece, True))
    return segments


def _protected(value, protect):
    """`value` (messages, tools: JSON values) with every string in it, keys too, protected."""
    if isinstance(value, str):
        return protect(value)
    if isinstance(value, dict):
        return {protect(k) if isinstance(k, str) else k: _protected(v, protect)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_protected(v, protect) for v in value]
    return value


def _protector(controls: tuple[str, ...], literals: list[str]):
    """A function content -> content with its dangerous pieces as placeholders (in `literals`)."""
    index: dict[str, int] = {}
    whole = re.compile("|".join(map(re.escape, controls)) + "|[\U00100000-\U0010FFFF]"
                       if controls else "[\U00100000-\U0010FFFF]")
    prefixes = {c[:k] for c in controls for k in range(1, len(c))}
    suffixes = {c[k:] for c in controls for k in range(1, len(c))}
    longest = max(map(len, controls), default=1)

    def mark(literal: str) -> str:
        if literal not in index:
            if len(literals) >= 0x10000 - 2:
                raise RenderError("the messages hold too many distinct control-token pieces")
            index[literal] = len(literals)
            literals.append(literal)
        return chr(_PLANE16 + index[literal])

    def protect(content: str) -> str:
        body = whole.sub(lambda m: mark(m.group()), content)
        core = body.strip()
        if not core:
            return body
        lead, trail = body[:len(body) - len(body.lstrip())], body[len(body.rstrip()):]
        head = next((n for n in range(min(longest, len(core)), 0, -1) if core[:n] in suffixes), 0)
        tail = next((n for n in range(min(longest, len(core) - head), 0, -1)
                     if core[len(core) - n:] in prefixes), 0)
        middle = core[head:len(core) - tail]
        return (lead + (mark(core[:head]) if head else "") + middle
                + (mark(core[len(core) - tail:]) if tail else "") + trail)

    return protect


def first_render_ms() -> float | None:
    """This process's first render's milliseconds, jinja2's import and the template's compile
    included (the start-up cost that a ChatML model never pays), or None before one."""
    return _first_render_ms


def _render(source: str, budget: _Budget, **context) -> str:
    """jinja2's render of `source`, bounded by `budget`; any failure is a RenderError."""
    try:
        env, template = _compiled(source)
        env.budget = budget
        out: list[str] = []
        produced = 0
        for chunk in template.generate(**context):
            produced += len(chunk)
            budget.size(produced)
            budget.tick()
            out.append(chunk)
        return "".join(out)
    except RenderError:
        raise
    except RecursionError:
        raise RenderError("the template recursed too deeply") from None
    except MemoryError:
        raise RenderError("the template ran out of memory") from None
    except Exception as exc:  # a template's own error, a sandbox refusal, a syntax error
        raise RenderError(f"{type(exc).__name__}: {exc}") from None


@lru_cache(maxsize=8)
def _compiled(source: str):
    """(environment, template) of a template text, compiled once; the caller sets the budget."""
    env = _environment_class()(_Budget(0))
    return env, env.from_string(source)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """HF transformers' `tojson` filter (json.dumps, non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message):
    raise RenderError(f"the template raised: {message}")


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


_SIZED_METHODS = ("center", "ljust", "rjust", "zfill")


def _format_size(fmt: str) -> int:
    """An upper bound on the padding a %-format asks for (its widths and precisions)."""
    return len(fmt) + sum(int(n) for pair in re.findall(r"%[-+ #0]*(\d*)(?:\.(\d+))?", fmt)
                          for n in pair if n)


def _binop_size(operator: str, left, right) -> int:
    """An upper bound on the size of `left operator right`, before it is made (0: small)."""
    if operator == "*":
        seq, n = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
            return len(seq) * n
    elif operator == "**" and isinstance(left, int) and isinstance(right, int):
        return int(abs(right) * max(abs(left), 1).bit_length() / 3.3)   # its decimal digits
    elif operator == "+" and isinstance(left, (str, list, tuple)) and hasattr(right, "__len__"):
        return len(left) + len(right)
    elif operator == "%" and isinstance(left, str):
        return _format_size(left)
    return 0


def _call_size(obj, args: tuple) -> int:
    """An upper bound on the size of a str method's result (center, replace, ...; 0: small)."""
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if not isinstance(owner, str):
        return 0
    if name in _SIZED_METHODS and args and isinstance(args[0], int):
        return args[0]
    if name == "replace" and len(args) >= 2:
        count = owner.count(str(args[0])) if args[0] else len(owner) + 1
        return len(owner) + count * len(str(args[1]))
    if name == "expandtabs":
        return len(owner) * (args[0] if args and isinstance(args[0], int) else 8)
    return 0


def _guard_class(nodes, NodeTransformer):
    """The AST pass that routes every for-loop's iterable and every `~` through the budget."""

    class Guard(NodeTransformer):
        def visit_For(self, node):
            self.generic_visit(node)
            node.iter = nodes.Call(nodes.Name("__pyspec_iter", "load"), [node.iter], [], None, None)
            return node

        def visit_Concat(self, node):
            self.generic_visit(node)
            return nodes.Call(nodes.Name("__pyspec_concat", "load"), [nodes.List(node.nodes)],
                              [], None, None)

    return Guard


@lru_cache(maxsize=None)
def _environment_class():
    """The bounded environment class, built on first use so that jinja2 loads only then."""
    try:
        from jinja2 import nodes
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from jinja2.visitor import NodeTransformer
    except ImportError:
        raise RenderError("jinja2 is not installed in this runtime; install it (pip install "
                          "jinja2), or use a ChatML model, which renders without it") from None

    Guard = _guard_class(nodes, NodeTransformer)

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**", "+", "%", "//"])

        def __init__(self, budget: _Budget):
            super().__init__(trim_blocks=True, lstrip_blocks=True,
                             extensions=["jinja2.ext.loopcontrols"])
            self.budget = budget
            self.filters["tojson"] = _tojson
            self.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                                __pyspec_iter=self._iter, __pyspec_concat=self._concat)
            base_range = self.globals["range"]
            self.globals["range"] = lambda *a: self._sized(base_range(*a))
            self._guard_filter("replace", lambda ctx, s, old, new, *a, **k: len(str(s)) + (
                str(s).count(str(old)) if old else len(str(s)) + 1) * len(str(new)))
            self._guard_filter("center", lambda value, width=80, *a, **k: width)
            self._guard_filter("indent", lambda s, width=4, *a, **k: len(str(s)) * (
                1 + (width if isinstance(width, int) else len(str(width)))))
            self._guard_filter("format", lambda value, *a, **k: _format_size(str(value)))

        def _guard_filter(self, name, size_of):
            """Refuse a filter call whose result would pass the size bound, before it runs."""
            original = self.filters[name]

            @functools.wraps(original)  # keeps jinja2's pass-context mark
            def guarded(*args, **kwargs):
                self.budget.tick()
                self.budget.size(size_of(*args, **kwargs))
                return original(*args, **kwargs)

            self.filters[name] = guarded

        def _parse(self, source, name, filename):
            return Guard().visit(super()._parse(source, name, filename))

        def _sized(self, value):
            if hasattr(value, "__len__"):
                self.budget.size(len(value))
            return value

        def _iter(self, iterable):
            for item in iterable:
                self.budget.tick()
                yield item

        def _concat(self, parts):
            parts = [str(p) for p in parts]
            self.budget.size(sum(map(len, parts)))
            self.budget.tick()
            return "".join(parts)

        def call_binop(self, context, operator, left, right):
            self.budget.tick()
            self.budget.size(_binop_size(operator, left, right))
            return self._sized(super().call_binop(context, operator, left, right))

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's signature)
            __self.budget.tick()
            __self.budget.size(_call_size(__obj, args))
            return __self._sized(super().call(__context, __obj, *args, **kwargs))

    return Bounded
