"""A request from the command line: its flags, written from the options table (options.py
REQUEST), its prompt (--prompt, --messages-json, --raw) fitted to the context, the Options the
flags give, and an engine error in the flags' words.

Not here: the commands (generate.py, tools.py), the parser (cli.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from ..errors import PromptTooLongError, UsageError, path_problem
from ..options import OPTION, REQUEST, Options, from_request
from ..text import conversation
from ..text.conversation import Fitted
from ..text.tokenizer import Tokenizer


# The engine's and the page's names for options, which its errors use, and the flags a user of
# this command line typed for them.
_OPTION_NAMES = re.compile(r"(?<![\w.-])(" + "|".join(
    o.name for o in REQUEST if o.flag is not None and "_" in o.name) + r")(?!\w)")


def cli_words(message: str) -> str:
    """An engine error in the command line's words: its option names as the flags (max_tokens
    -> --max-tokens, verify=greedy -> --verify greedy, the context length -> --ctx)."""
    message = _OPTION_NAMES.sub(lambda m: "--" + m.group(1).replace("_", "-"), message)
    message = re.sub(r"\bverify=(\w+)", r"--verify \1", message)
    return message.replace("raise the context length", "raise the context length (--ctx)")


def cli_error(e: Exception) -> str:
    """An error in the command line's words (cli_words) that names the flag of the option it is
    about (`e.option`, errors.about) where its words do not already: "temperature must be ..."
    reads "--temperature must be ...", "unknown speculation policy ..." "--k: unknown ..."."""
    text = cli_words(str(e))
    name = getattr(e, "option", None)
    if name not in OPTION or OPTION[name].flag is None:
        return text
    flag = "--" + name.replace("_", "-")
    if re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text):
        return text
    if re.match(rf"{name}\b", text):
        return flag + text[len(name):]
    return f"{flag}: {text}"


def read_json(path: str, what: str):
    """The JSON value of a UTF-8 file, or a UsageError that says why not."""
    try:
        with open(path, encoding="utf-8-sig") as f:   # a byte-order mark, as some editors write
            return json.load(f)
    except OSError as e:
        raise UsageError(path_problem(path, e)) from e
    # ValueError: not UTF-8, not JSON, or an integer of more digits than Python converts.
    except ValueError as e:
        raise UsageError(f"cannot read {what} from {path}: {e}") from e
    except RecursionError:
        raise UsageError(f"cannot read {what} from {path}: its JSON is nested too deeply") from None


def read_messages(path: str) -> list[dict]:
    """The messages of a JSON file (OpenAI's shapes: an assistant's tool_calls, tool messages);
    the tokenizer checks each one when it renders them."""
    data = read_json(path, "messages")
    if isinstance(data, dict):
        data = data.get("messages")
    if not isinstance(data, list):
        raise UsageError(f"{path} must hold a list of {{role, content}} messages "
                       "(or an object with a 'messages' list)")
    if not data:
        raise UsageError(f"{path} holds no messages: give at least one {{role, content}}")
    return data


def utf8(text: str) -> bool:
    """Whether text is valid Unicode (no lone surrogate), so that it has a UTF-8 encoding."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_tools(path: str | None) -> list | None:
    """--tools FILE: OpenAI's tools list (or an object with a 'tools' list); Options.check
    checks each tool."""
    if not path:
        return None
    data = read_json(path, "tools")
    if isinstance(data, dict) and "tools" in data:
        data = data["tools"]
    if not isinstance(data, list):
        raise UsageError(f"{path} must hold OpenAI's tools list ([{{type: 'function', function: "
                         "{name, description, parameters}}]) or an object with a 'tools' list")
    return data


def prompt_ids(tok: Tokenizer, args, ctx: int | None = None,
               most: int | None = None, tools: list | None = None) -> list[int] | Fitted:
    """--prompt TEXT is one user message (or raw text with --raw); --messages-json a chat;
    `tools` (--tools) go to the chat template. When
    ctx is given either is fitted to the context by the context-full policy (--context-overflow:
    `error` refuses a prompt that leaves less than max_tokens; one message has no older turn to
    leave out); `most`, the model's own context, is what an error's advice names."""
    if args.messages_json and getattr(args, "raw", False):
        raise UsageError("--raw applies to --prompt only: a --messages-json conversation is "
                         "always rendered with the chat template; leave out --raw")
    if tok.chat_template is None and not getattr(args, "raw", False):
        raise UsageError("this model has no chat template: pass --raw with --prompt to use the "
                         "text as it is" + (" (a --messages-json conversation needs a template)"
                                            if args.messages_json else ""))
    if args.messages_json:
        messages = read_messages(args.messages_json)
        if ctx is None:
            return tok.encode_chat(messages, tools=tools)
        return conversation.fit(tok, messages, args.max_tokens, ctx, args.context_overflow, most,
                                tools)
    if not utf8(args.prompt):
        # Why: Python hands argv bytes that are not UTF-8 over as lone surrogates.
        raise UsageError("--prompt is not valid UTF-8 text; pass UTF-8, or put the text in a "
                         "--messages-json file")
    if getattr(args, "raw", False):
        ids = tok.encode(args.prompt)
        short = ctx is not None and len(ids) + args.max_tokens > ctx
        if short and args.context_overflow == "error":
            raise PromptTooLongError(f"the prompt needs {len(ids)} tokens + max_tokens "
                                     f"{args.max_tokens} but the context holds {ctx}; "
                                     + conversation.room_advice("shorten it", ctx, most))
        if short and len(ids) < ctx:     # the answer is cut at the context: said, not hidden
            return Fitted(ids, answer_room=ctx - len(ids))
        return ids
    messages = [{"role": "user", "content": args.prompt}]
    if ctx is None:
        return tok.encode_chat(messages, tools=tools)
    return conversation.fit(tok, messages, args.max_tokens, ctx, args.context_overflow, most,
                            tools)


def options(args) -> Options:
    """The Options of the request flags (a missing one: the option's default)."""
    if args.verify in ("replay", "rejection") and args.temperature == 0:
        print(f"note: --verify {args.verify} at temperature 0 runs as greedy (every rule picks "
              "the argmax there); add --temperature (e.g. 0.7) to sample", file=sys.stderr)
    for text in args.stop or ():
        if not utf8(text):   # argv bytes that are not UTF-8: a stop string that never matches
            raise UsageError("a --stop string is not valid UTF-8 text; pass UTF-8")
    values = {name: getattr(args, name, None) for name in OPTION}
    values.update(logit_bias=logit_bias(args.logit_bias),
                  stop=[unescape(s) for s in args.stop or ()],
                  json_schema=(read_json(args.json_schema, "JSON schema")
                               if getattr(args, "json_schema", None) else None),
                  tools=read_tools(getattr(args, "tools", None)))
    return from_request(values)


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def unescape(text: str) -> str:
    """A --stop value with \\n, \\t and \\\\ read as a newline, a tab and a backslash, as the
    demo page reads its stop strings: a shell passes "\\n" on as a backslash and an n. Any
    other backslash stays as it is."""
    return re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m.group(1)], text)


def logit_bias(items: list[str] | None) -> dict:
    """--logit-bias ID=BIAS (repeatable) as {id: bias}; the ranges are Options.check's."""
    out = {}
    for item in items or ():
        tid, sep, bias = item.partition("=")
        try:
            out[int(tid)] = float(bias)
        except ValueError:
            raise UsageError(f"--logit-bias {item!r}: write TOKEN_ID=BIAS, e.g. 1234=-100 "
                             "(bias in [-100, 100])") from None
    return out


def request_flags(p: argparse.ArgumentParser, *, but: tuple = ()) -> None:
    """A flag for each request option of the table that has one (but those in `but`), in its
    order; the sampling controls in a group of their own."""
    group = None
    for o in REQUEST:
        if o.flag is None or o.name in but:
            continue
        extra = dict(o.flag)
        if "action" not in extra:      # a flag of one value, defaulting to the option's default
            extra["default"] = o.default
            if float in o.types or o.types == (int,):
                extra["type"] = float if float in o.types else int
        if o.choices:
            extra["choices"] = list(o.choices)
        if o.sampling and group is None:
            # The sampling controls, applied in this order (processors.py;
            # docs/sampling-and-json.md).
            group = p.add_argument_group("sampling controls (applied in this order)")
        (group if o.sampling else p).add_argument("--" + o.name.replace("_", "-"),
                                                  help=o.line(), **extra)


def prompt_source(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", help="one user message (rendered with the chat template)")
    g.add_argument("--messages-json", help="a JSON file with a list of {role, content} messages")
    p.add_argument("--raw", action="store_true",
                   help="tokenize --prompt as is, no chat template (not with --messages-json)")
