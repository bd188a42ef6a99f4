"""The grammar of an answer that may call tools: the JSON-schema automaton
(jsonschema.py) with four more kinds of node, and its masks (jsonmask.py's, with a fast path
for free text).

One mechanism for output control: a tool call's name and arguments are the next
grammar. The answer, in the call format the template writes (text/toolcalls.py: prefix + NAME +
mid + ARGS + suffix, calls separated by `sep`), is by `tool_choice`:
  required  one call or more (one where parallel_tool_calls is false or the format takes one);
  NAME      the same, every call to that tool;
  auto      free text, until the text writes the format's trigger (`<tool_call>` anywhere,
            Llama 3's `{` as the answer's first byte): from there on, calls as under required;
  none      free text that never writes the trigger.
NAME is one of the tools' names, ARGS valid against that tool's `parameters` (the subset
jsonschema.py follows, written as `tojson` writes it: spaced separators), and after the last
call only an end-of-generation token. The new nodes:
  SEQ     nodes one after another (frame: the index of the next);
  PICK    one of several literals, each followed by its own node (a tool's name and mid, then
          its arguments): the literals are prefix-free (a name holds no quote);
  REPEAT  an item, then `again` items (separator included) up to a count;
  TEXT    free text over bytes; the trigger's bytes (followed by KMP, or only at the start)
          hand over to the calls, or are refused where none may follow.
Masks: jsonmask.Masker's, except in free text, where every text token is allowed but those that
complete the trigger, which must fit the call after it (a few tokens, checked one by one), and
every end-of-generation token may end the answer. After the calls, the end is the token the
template writes there (ToolFormat.end; every end-of-generation token where it writes none). Forced tokens (a call's prefix, a single
tool's name, mid and suffix) are drafted free by drafters/forced.py, as under a JSON schema.
Not here: the formats and parsing the answer (text/toolcalls.py), the request (plan.py).
"""

from __future__ import annotations

import json

import numpy as np

from ..text.toolcalls import Tool, ToolFormat
from ..text.vocab import Vocab
from .jsonmask import Constraint, Masker
from .jsonschema import LIT, Grammar, compile_into

SEQ, PICK, REPEAT, TEXT = range(10, 14)   # after jsonschema.py's kinds
DEAD = -1   # a TEXT frame past the point where the trigger could start


class CallGrammar(Grammar):
    """jsonschema.Grammar with SEQ, PICK, REPEAT and TEXT nodes (module docstring)."""

    def __init__(self):
        super().__init__(spaced=True)

    def start(self, node: int) -> tuple:
        kind, data = self.nodes[node]
        if kind == PICK:
            return (node, 0, (1 << len(data)) - 1)
        return (node, 0, 0) if kind in (SEQ, REPEAT, TEXT) else super().start(node)

    def can_end(self, frame: tuple) -> bool:
        kind, data = self.nodes[frame[0]]
        if kind in (SEQ, PICK):
            return False
        if kind == REPEAT:
            return frame[1] >= 1
        return True if kind == TEXT else super().can_end(frame)

    def _firsts(self, f: tuple) -> set[int]:
        kind, data = self.nodes[f[0]]
        if kind == SEQ:
            return self._firsts(self.start(data[f[1]]))
        if kind == PICK:
            return {lit[f[1]] for j, (lit, _) in enumerate(data)
                    if f[2] >> j & 1 and f[1] < len(lit)}
        if kind == REPEAT:
            first, again, hi = data
            if f[1] and hi is not None and f[1] >= hi:
                return set()
            return self._firsts(self.start(again if f[1] else first))
        return set(range(256)) if kind == TEXT else super()._firsts(f)

    def _step_frame(self, f: tuple, b: int) -> tuple | None:
        node = f[0]
        kind, data = self.nodes[node]
        if kind == SEQ:
            r = self._step_frame(self.start(data[f[1]]), b)
            if r is None:
                return None
            return ((node, f[1] + 1, 0),) + r if f[1] + 1 < len(data) else r
        if kind == PICK:
            off, alive = f[1], f[2]
            keep = [j for j, (lit, _) in enumerate(data)
                    if alive >> j & 1 and off < len(lit) and lit[off] == b]
            if not keep:
                return None
            done = [j for j in keep if len(data[j][0]) == off + 1]
            if done:   # the literal is whole (prefix-free): its node next
                return (self.start(data[done[0]][1]),)
            return ((node, off + 1, sum(1 << j for j in keep)),)
        if kind == REPEAT:
            first, again, hi = data
            if f[1] and hi is not None and f[1] >= hi:
                return None
            r = self._step_frame(self.start(again if f[1] else first), b)
            return None if r is None else ((node, f[1] + 1, 0),) + r
        if kind == TEXT:
            trigger, delta, after = data
            m = DEAD if f[1] == DEAD else delta[f[1]][b]
            if m == len(trigger):
                return None if after is None else (self.start(after),)
            return ((node, m, 0),)
        return super()._step_frame(f, b)

    # --- building -------------------------------------------------------------------------------
    def lit(self, data: bytes) -> int:
        return self._add(LIT, (data,))


def _delta(trigger: bytes, anywhere: bool) -> list[list[int]]:
    """The trigger's matcher: delta[m][b] = the bytes of it matched after byte b, from m
    matched (KMP where it may come anywhere; DEAD after any other first byte where it must
    start the text)."""
    out = []
    for m in range(len(trigger)):
        row = []
        for b in range(256):
            if trigger[m] == b:
                row.append(m + 1)
            elif not anywhere:
                row.append(DEAD)
            else:
                seen = trigger[:m] + bytes((b,))
                row.append(next(k for k in range(m, -1, -1) if seen.endswith(trigger[:k])))
        out.append(row)
    return out


def build(fmt: ToolFormat, tools: list[Tool], choice: str, parallel: bool) -> CallGrammar:
    """The answer's grammar for `choice` ("auto", "none", "required" or a tool's name)."""
    g = CallGrammar()
    enc = str.encode
    chosen = [t for t in tools if choice in ("auto", "required", "none") or t.name == choice]
    pick = g._add(PICK, tuple((enc(t.name + fmt.mid),
                               compile_into(g, t.parameters, f"tools[{tools.index(t)}]"
                                            ".function.parameters")) for t in chosen))
    suffix = g.lit(enc(fmt.suffix))
    call = g._add(SEQ, (g.lit(enc(fmt.prefix)), pick, suffix))
    hi = None if parallel and fmt.sep is not None else 1
    again = g._add(SEQ, (g.lit(enc(fmt.sep + fmt.prefix)), pick, suffix)) if hi is None else call
    trigger = enc(fmt.trigger)
    if choice == "none":
        g.root = g._add(TEXT, (trigger, _delta(trigger, fmt.anywhere), None))
    elif choice == "auto":
        rest = g._add(SEQ, (g.lit(enc(fmt.prefix)[len(trigger):]), pick, suffix))
        calls = g._add(REPEAT, (rest, again, hi))
        g.root = g._add(TEXT, (trigger, _delta(trigger, fmt.anywhere), calls))
    else:
        g.root = g._add(REPEAT, (call, again, hi))
    return g


class ToolMasker(Masker):
    """jsonmask.Masker over a CallGrammar: `call_ends` end the answer after its calls, `ends`
    (the end-of-generation ids) a free text; masks in free text come from a fast path."""

    def __init__(self, grammar: CallGrammar, vocab: Vocab, call_ends: set[int],
                 ends: set[int]):
        super().__init__(grammar, vocab, min(call_ends))
        self.call_ends, self.ends = frozenset(call_ends), frozenset(ends)
        self._text = np.array([vocab.is_text[t] and bool(vocab.text_bytes[t])
                               for t in range(vocab.size)], bool)   # (vocab,)
        self._could_trigger: dict[int, list[int]] = {}

    def advance(self, state, token: int):
        if state is not None and state is not Constraint.done and token in (
                self.ends if self._free(state) else self.call_ends):
            return Constraint.done if self.grammar.complete(state) else None
        return super().advance(state, token)

    def _free(self, state) -> bool:
        return bool(state) and self.grammar.nodes[state[-1][0]][0] == TEXT

    def _allowed(self, state) -> np.ndarray:
        if not self._free(state):
            allowed = super()._allowed(state)
            if allowed[self.eos]:
                allowed[list(self.call_ends)] = True
            return allowed
        top = state[-1]
        # Free text: every text token, but one that completes the trigger must fit the call
        # after it; those hold the trigger's last byte, a few tokens, each walked.
        allowed = self._text.copy()
        if top[1] != DEAD:
            last = self.grammar.nodes[top[0]][1][0][-1]
            for t in self._triggering(last):
                allowed[t] = self.advance(state, t) is not None
        allowed[list(self.ends)] = True
        return allowed

    def _triggering(self, last: int) -> list[int]:
        ids = self._could_trigger.get(last)
        if ids is None:
            byte = bytes((last,))
            ids = self._could_trigger[last] = [t for t, data in enumerate(self.vocab.text_bytes)
                                               if byte in data]
        return ids


def constrain(cache: dict, tokenizer, fmt: ToolFormat, tools: list[Tool], choice: str,
              parallel: bool, prompt_len: int) -> Constraint:
    """A request's Constraint for its tools (jsonmask.constrain's cache: the vocabulary index
    and each grammar's masker kept across requests, so a conversation's next turn reuses them)."""
    key = "tools:" + json.dumps([fmt.name, fmt.sep, fmt.end, [(t.name, t.parameters) for t in tools],
                                 choice, parallel])
    masker = cache.get(key)
    if masker is None:
        if "vocab" not in cache:
            cache["vocab"] = Vocab(tokenizer)
        ends = set(tokenizer.eog_ids)
        masker = ToolMasker(build(fmt, tools, choice, parallel), cache["vocab"],
                            {fmt.end} if fmt.end is not None else ends, ends)
        cache[key] = masker
    return Constraint(masker, prompt_len)
