"""ChatML chat templates, recognised by structure and rendered by hand: the fast path (no jinja2).

Scope: deciding whether a GGUF `tokenizer.chat_template` is the ChatML template as HF ships it
(optionally with a default system message), and rendering a list of messages the way that template
would, as pieces marked by whether the template or a message wrote them, so that the caller can
let only the template's own text form control tokens.

Not in scope: any other template family (`template.py` renders those through jinja2), checking
the messages or raising `TokenizerError` (`tokenizer.Tokenizer` checks the template and the
messages before rendering), and tokenization (`tokenizer.Tokenizer.encode_chat` turns the pieces
into ids). Standard library only.
"""

from __future__ import annotations

import re

# The ChatML template as HF ships it, optionally with a default system message. Whitespace is
# allowed only inside `{% %}` / `{{ }}` delimiters, where it changes nothing; there is no literal
# text between tags, so trim markers (`-`) change nothing either. The system message must be a
# plain string literal: no quote, backslash or brace.
_CHATML_RE = re.compile(
    r"\{%-?\s*for message in messages\s*-?%\}"
    r"(?:\{%-?\s*if loop\.first and messages\[0\]\['role'\] != 'system'\s*-?%\}"
    r"\{\{-?\s*'<\|im_start\|>system\n(?P<system>[^'\\{}]*)<\|im_end\|>\n'\s*-?\}\}"
    r"\{%-?\s*endif\s*-?%\})?"
    r"\{\{-?\s*'<\|im_start\|>' \+ message\['role'\] \+ '\n' \+ message\['content'\] \+ "
    r"'<\|im_end\|>' \+ '\n'\s*-?\}\}"
    r"\{%-?\s*endfor\s*-?%\}"
    r"\{%-?\s*if add_generation_prompt\s*-?%\}"
    r"\{\{-?\s*'<\|im_start\|>assistant\n'\s*-?\}\}"
    r"\{%-?\s*endif\s*-?%\}\n?")  # jinja2 drops one trailing newline of a template


def parse_chatml(template: str | None) -> tuple[str | None] | None:
    """(default system message or None,) for a ChatML template, None for anything else."""
    if template is None:
        return None
    match = _CHATML_RE.fullmatch(template)
    return None if match is None else (match.group("system"),)


def chatml_segments(messages: list[dict], default_system: str | None,
                    add_generation_prompt: bool) -> list[tuple[str, bool]]:
    """The rendered chat as (text, comes from the template) pieces.

    `messages` must already be checked: a list of dicts whose 'role' is system, user or assistant
    and whose 'content' is a str. `default_system` is what `parse_chatml` found, or None.
    """
    segments: list[tuple[str, bool]] = []
    if messages and default_system is not None and messages[0]["role"] != "system":
        segments.append((f"<|im_start|>system\n{default_system}<|im_end|>\n", True))
    for message in messages:
        segments += [(f"<|im_start|>{message['role']}\n", True), (message["content"], False),
                     ("<|im_end|>\n", True)]
    if add_generation_prompt:
        segments.append(("<|im_start|>assistant\n", True))
    return segments
