"""Token masks for a JSON-schema grammar (jsonschema.py) over a vocabulary (vocab.py), the
constraint a request tracks, and the mask as the first logits processor.

Which tokens may come next, from a grammar state:
  - forced: where every continuation starts with the same bytes F (a key, a colon, a closing
    brace), the one allowed token is the LONGEST vocabulary token that is a prefix of F. So a
    forced stretch has exactly one tokenization, which the drafter appends for free (q = 1);
    after a complete value with nothing else possible, the one allowed token is EOS;
  - otherwise every token whose bytes the grammar accepts from the state (EOS too when the value
    is complete). Inside a string, where almost every token fits, a per-vocabulary table (each
    token's character count as string content, or where its closing quote falls and what
    follows) gives the mask with a few numpy operations; elsewhere a walk over the sorted byte
    strings (a trie without nodes: the tokens sharing a prefix are a range of the sorted list)
    visits only the prefixes the grammar accepts.
Masks are cached per grammar state (states are hashable tuples) as packed bits (vocab / 8
bytes, little bit order: the layout a GPU masking step would take), in an LRU.

The target distribution under a schema is the champion's, masked to the allowed tokens and
renormalised: `JsonMask.apply` sets the excluded logits to -inf, and the
rules (verify.py) do the rest; constrained champion-only decoding is the reference.
Not here: the grammar (jsonschema.py), forced drafts (drafters/forced.py), the loop (engine.py).
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections import OrderedDict

import numpy as np

from ..text.vocab import SortedBytes, Vocab
from .jsonschema import S_NORMAL, STR, Grammar, compile_schema, string_byte

CACHE_STATES = 512        # masks kept per grammar
_DONE = ("done",)         # the state after EOS: nothing may follow


class StringTable:
    """Each token's bytes read as string content from the normal sub-state: `inside[t]` its
    character count when all of it is content (-1 otherwise); for a token with a closing quote
    after valid content, `close_ids`, `close_chars` and `close_suffix` (the bytes after it)."""

    def __init__(self, vocab):
        self.inside = np.full(vocab.size, -1, np.int64)   # (vocab,)
        close = []
        for t, data in enumerate(vocab.text_bytes):
            if not vocab.is_text[t] or not data:
                continue
            sub, chars = S_NORMAL, 0
            for j, b in enumerate(data):
                if sub == S_NORMAL and b == 0x22:
                    close.append((t, chars, data[j + 1:]))
                    break
                r = string_byte(sub, b)
                if r is None:
                    break
                sub, chars = r[0], chars + r[1]
            else:
                self.inside[t] = chars
        self.close_ids = np.array([t for t, _, _ in close], np.int64)     # (c,)
        self.close_chars = np.array([c for _, c, _ in close], np.int64)   # (c,)
        self.close_suffix = [s for _, _, s in close]


def tables(vocab) -> tuple[SortedBytes, StringTable]:
    """The per-vocabulary tables, built once per Vocab (about a second for 49,152 tokens)."""
    t = getattr(vocab, "_json_tables", None)
    if t is None:
        sorted_bytes = vocab.sorted()
        sorted_bytes.id_array = np.array(sorted_bytes.ids, np.int64)   # (n,) for fancy indexing
        t = vocab._json_tables = (sorted_bytes, StringTable(vocab))
    return t


class Mask:
    """The allowed tokens of one state: `bits` (ceil(vocab / 8),) uint8, little bit order;
    `forced` the one allowed token where there is exactly one, else None; `count`."""

    __slots__ = ("bits", "forced", "count")

    def __init__(self, allowed: np.ndarray):   # (vocab,) bool
        self.bits = np.packbits(allowed, bitorder="little")
        self.count = int(allowed.sum())
        self.forced = int(np.flatnonzero(allowed)[0]) if self.count == 1 else None

    def allows(self, token: int) -> bool:
        return bool(self.bits[token >> 3] >> (token & 7) & 1)

    def dense(self, vocab: int) -> np.ndarray:
        return np.unpackbits(self.bits, count=vocab, bitorder="little").view(bool)


class Masker:
    """Masks of one grammar over one vocabulary, cached per state; `advance` moves a state by a
    token (None when its bytes do not fit; `_DONE` after EOS when the value is complete)."""

    def __init__(self, grammar: Grammar, vocab, eos_id: int):
        self.grammar, self.vocab, self.eos = grammar, vocab, eos_id
        self.index, self.strings = tables(vocab)
        self._masks: OrderedDict = OrderedDict()
        self._close_ok: dict = {}
        self._advance: dict = {}

    def initial(self) -> tuple:
        return self.grammar.initial()

    def advance(self, state, token: int):
        if state is None or state is _DONE:
            return None
        key = (state, token)
        if key in self._advance:
            return self._advance[key]
        data = self.vocab.text_bytes[token] if self.vocab.is_text[token] else b""
        if token == self.eos:
            out = _DONE if self.grammar.complete(state) else None
        elif not data:
            out = None   # a control token other than EOS writes nothing the grammar can use
        else:
            out = state
            for b in data:
                out = self.grammar.step(out, b)
                if out is None:
                    break
        if len(self._advance) > 200_000:
            self._advance.clear()
        self._advance[key] = out
        return out

    def mask(self, state) -> Mask:
        m = self._masks.get(state)
        if m is not None:
            self._masks.move_to_end(state)
            return m
        m = Mask(self._allowed(state))
        self._masks[state] = m
        if len(self._masks) > CACHE_STATES:
            self._masks.popitem(last=False)
        return m

    # --- computing a mask -----------------------------------------------------------------------
    def _allowed(self, state) -> np.ndarray:
        """(vocab,) bool: the allowed tokens of `state` (module docstring)."""
        g, allowed = self.grammar, np.zeros(self.vocab.size, bool)
        forced = g.forced(state)
        if forced:
            for n in range(len(forced), 0, -1):
                t = self.vocab.id_of(forced[:n])
                if t is not None:
                    allowed[t] = True
                    return allowed
        top = state[-1] if state else None
        if top is not None and g.nodes[top[0]][0] == STR and top[1] == 1 and top[4] == S_NORMAL:
            self._string(state, allowed)
        else:
            hits: list[int] = []
            self._walk(state, 0, len(self.index.keys), 0, hits)
            allowed[self.index.id_array[hits]] = True
        if g.complete(state):
            allowed[self.eos] = True
        return allowed

    def _string(self, state, allowed: np.ndarray) -> None:
        """Inside a string in the normal sub-state: the table, not a walk."""
        top = state[-1]
        limit = self.grammar.nodes[top[0]][1]
        room = (1 << 62) if limit is None else limit - top[2]
        s = self.strings
        allowed |= (s.inside >= 0) & (s.inside <= room)
        rest = state[:-1]   # the frames that go on once the string is closed
        ok = self._close_ok.get(rest)
        if ok is None:
            ok = np.array([self._fits(rest, suffix) for suffix in s.close_suffix], bool)
            self._close_ok[rest] = ok
        allowed[s.close_ids[ok & (s.close_chars <= room)]] = True

    def _fits(self, state, data: bytes) -> bool:
        for b in data:
            state = self.grammar.step(state, b)
            if state is None:
                return False
        return True

    def _walk(self, state, lo: int, hi: int, depth: int, hits: list) -> None:
        """Collect into `hits` the sorted positions in [lo, hi) (the tokens sharing their first
        `depth` bytes, which took the grammar to `state`) whose remaining bytes it accepts."""
        keys, step = self.index.keys, self.grammar.step
        while lo < hi and len(keys[lo]) == depth:
            hits.append(lo)   # the prefix itself is a token
            lo += 1
        if depth == 0:    # the root: jump straight to the first bytes the grammar accepts
            first = self.index.first
            for b in self.grammar.allowed(state):
                if first[b] < first[b + 1]:
                    self._walk(step(state, b), first[b], first[b + 1], 1, hits)
            return
        if lo >= hi:
            return
        allowed = self.grammar.allowed(state) if hi - lo > 8 else None
        if allowed is not None and len(allowed) <= 16:
            # Few bytes can come next (a number, a key, a literal): find each one's range
            # rather than visit every child of this prefix.
            prefix = keys[lo][:depth]
            for b in allowed:
                start, end = self.index.range_of(prefix + bytes((b,)), lo, hi)
                if start < end:
                    self._walk(step(state, b), start, end, depth + 1, hits)
            return
        while lo < hi:
            key = keys[lo]
            b = key[depth]
            end = hi if b == 255 else bisect_left(keys, key[:depth] + bytes((b + 1,)), lo, hi)
            nxt = step(state, b)
            if nxt is not None:
                self._walk(nxt, lo, end, depth + 1, hits)
            lo = end


class Constraint:
    """One request's position in the grammar: the state after any token sequence that extends
    the prompt, computed incrementally (the committed path is kept; drafts extend it and are
    cut off when a later call diverges)."""

    done = _DONE   # the state after EOS

    def __init__(self, masker: Masker, prompt_len: int):
        self.masker, self.prompt_len = masker, prompt_len
        self.ids: list[int] = []                       # the path's tokens after the prompt
        self.states: list = [masker.initial()]         # len(ids) + 1 states

    def state_after(self, generated: list[int]):
        """The state after the tokens `generated` (those past the prompt); None if invalid."""
        n = len(self.ids)
        if generated[:n] != self.ids:
            same = [a == b for a, b in zip(generated, self.ids)] + [False]
            n = same.index(False)
            del self.ids[n:], self.states[n + 1:]
        for t in generated[n:]:
            self.ids.append(int(t))
            self.states.append(self.masker.advance(self.states[-1], int(t)))
        return self.states[len(generated)]

    def forced_ahead(self, generated: list[int], limit: int) -> int:
        """How many tokens in a row the masks force right after `generated` (at most `limit`)."""
        state, n = self.state_after(generated), 0
        while n < limit and state is not None and state is not _DONE:
            forced = self.masker.mask(state).forced
            if forced is None:
                break
            state, n = self.masker.advance(state, forced), n + 1
        return n

    def forced_count(self, generated: list[int]) -> int:
        """How many of `generated` were written where the mask allowed exactly one token."""
        self.state_after(generated)
        return sum(self.masker.mask(s).forced is not None
                   for s in self.states[:len(generated)] if s is not None and s is not _DONE)


class JsonMask:
    """The schema's mask as a logits processor (processors.Processor's interface), first in
    the chain: row i of the logits gets -inf outside the tokens allowed after prefix +
    drafts[:i]. A row whose context is already
    outside the grammar (after a draft the mask forbids) is returned as it is: the rule rejects
    that draft first, so such a row is never used."""

    def __init__(self, constraint: Constraint):
        self.constraint = constraint

    def masks(self, prefix, drafts, rows: int):
        """Row i's Mask for i < rows, or None where its context has left the grammar (or ended)."""
        generated = list(prefix[self.constraint.prompt_len:])
        for i in range(rows):
            state = self.constraint.state_after(generated + list(drafts[:i]))
            yield None if state is None or state is _DONE else self.constraint.masker.mask(state)

    def apply(self, logits, prefix, drafts):
        out = np.array(logits, dtype=np.float64)      # (r, vocab)
        vocab = out.shape[1]
        for i, mask in enumerate(self.masks(prefix, drafts, out.shape[0])):
            if mask is not None:
                out[i][~mask.dense(vocab)] = -np.inf
        return out

    def words(self, prefix, drafts, rows: int, vocab: int) -> np.ndarray:
        """The rows' masks as the GPU's masking step takes them (shaders/filter.wgsl): (rows,
        ceil(vocab / 32)) uint32, bit t % 32 of word t // 32 set where token t is allowed (the
        packed bits read as little-endian words); every bit set in a row with no mask."""
        out = np.full((rows, 4 * -(-vocab // 32)), 0xFF, np.uint8)   # (rows, bytes)
        for i, mask in enumerate(self.masks(prefix, drafts, rows)):
            if mask is not None:
                out[i, :mask.bits.size] = mask.bits
                out[i, mask.bits.size:] = 0
        return out.view("<u4")


def constrain(cache: dict, tokenizer, schema, prompt_len: int) -> Constraint:
    """A request's Constraint for `schema` (a dict or JSON text), with the vocabulary index and
    each schema's Masker (and so its cached masks) kept in `cache` across requests."""
    key = schema if isinstance(schema, str) else json.dumps(schema)
    masker = cache.get(key)
    if masker is None:
        if "vocab" not in cache:
            cache["vocab"] = Vocab(tokenizer)
        masker = Masker(compile_schema(schema), cache["vocab"], tokenizer.eos_id)
        schemas = [k for k in cache if k != "vocab"]
        for old in schemas[:len(schemas) - 3]:   # keep the last few schemas' masks
            del cache[old]
        cache[key] = masker
    return Constraint(masker, prompt_len)
