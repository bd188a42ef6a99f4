"""A vocabulary as byte strings: what each token id writes, and the ids of each byte string.

One index shared by the features that reason about tokens as text rather than as ids:
- the JSON-schema masks (which tokens' bytes a grammar state allows; a trie walks these strings),
- the bridge between a champion and a draft with another vocabulary (compat.py and
  drafters/bridge.py: `matched_with`, the one-to-one pairing of the tokens both vocabularies hold),
- reduced-vocabulary draft heads (which champion ids a head covers).
`sorted()` gives the text tokens sorted by bytes (`SortedBytes`): a prefix's tokens are a range.

`Vocab` is built once per tokenizer (about 0.1 s for 49,152 tokens) and holds plain lists and
dicts, so it runs the same in CPython and Pyodide. It does not tokenize or decode text
(tokenizer.py) and knows nothing of grammars or drafts.
"""

from __future__ import annotations

from bisect import bisect_left

from .bpe import TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_USER_DEFINED


class Vocab:
    """Token ids <-> byte strings for one tokenizer.

    `text_bytes[i]` is what token i writes into generated text: b"" for control and unknown tokens
    (<|im_end|> ends a turn; it writes nothing), the token's bytes otherwise. `is_text[i]` says
    whether i is a text token (normal or user-defined). `ids_of[b]` lists the text tokens whose
    bytes are b, lowest id first: a vocabulary may hold the same bytes twice. `control_ids[name]`
    is the lowest control token id spelt `name` ("<|im_end|>"): a control token writes no text,
    so its name is what identifies it across vocabularies."""

    def __init__(self, tokenizer):
        self.size = tokenizer.vocab_size
        types = tokenizer.token_types
        self.is_text = [t in (TOKEN_NORMAL, TOKEN_USER_DEFINED) for t in types]     # (vocab,)
        self.text_bytes = [tokenizer.token_bytes(i, special=False) if self.is_text[i] else b""
                           for i in range(self.size)]                                # (vocab,)
        self.ids_of: dict[bytes, list[int]] = {}
        for i, b in enumerate(self.text_bytes):
            if self.is_text[i] and b:
                self.ids_of.setdefault(b, []).append(i)
        self.control_ids: dict[str, int] = {}
        for i, t in enumerate(types):
            if t == TOKEN_CONTROL:
                self.control_ids.setdefault(tokenizer.tokens[i], i)

    def sorted(self) -> "SortedBytes":
        """The text tokens sorted by their bytes (built on first use, then kept)."""
        if getattr(self, "_sorted", None) is None:
            self._sorted = SortedBytes(self)
        return self._sorted

    def id_of(self, data: bytes) -> int | None:
        """The lowest text token id that writes exactly `data`, or None."""
        ids = self.ids_of.get(data)
        return ids[0] if ids else None

    def shared_with(self, other: "Vocab") -> dict[int, int]:
        """{id here: id in `other`} for every text token here whose bytes `other` also holds
        (to the lowest such id there): the token-level intersection of two vocabularies."""
        return {i: other.ids_of[b][0] for i, b in enumerate(self.text_bytes)
                if self.is_text[i] and b in other.ids_of}

    def matched_with(self, other: "Vocab") -> dict[int, int]:
        """{id here: id in `other`}, one to one: each byte string both vocabularies hold pairs
        the lowest text id here with the lowest there, and each control name both hold pairs
        their control ids. A second id with the same bytes (on either side) stays unpaired, so
        a draft's probability of a paired token is the probability of one champion id."""
        pairs = {ids[0]: other.ids_of[b][0] for b, ids in self.ids_of.items() if b in other.ids_of}
        pairs.update((i, other.control_ids[name]) for name, i in self.control_ids.items()
                     if name in other.control_ids)
        return pairs


class SortedBytes:
    """A vocabulary's text tokens sorted by their bytes: `keys[i]` (bytes) and `ids[i]` (their
    ids, lowest first among equal bytes). The tokens that start with a given prefix are one range
    of this list (`range_of`), so it serves as a trie without nodes (jsonmask.py walks it);
    `first[b]:first[b + 1]` is the range of the tokens whose first byte is b."""

    def __init__(self, vocab: Vocab):
        pairs = sorted((b, i) for i, b in enumerate(vocab.text_bytes) if vocab.is_text[i] and b)
        self.keys = [b for b, _ in pairs]        # (n,) bytes
        self.ids = [i for _, i in pairs]         # (n,)
        self.first = [bisect_left(self.keys, bytes((c,))) for c in range(256)] + [len(pairs)]

    def range_of(self, prefix: bytes, lo: int = 0, hi: int | None = None) -> tuple[int, int]:
        """[start, end) of the tokens in keys[lo:hi] that start with `prefix`."""
        hi = len(self.keys) if hi is None else hi
        start = bisect_left(self.keys, prefix, lo, hi)
        end = start
        while prefix and end == start:   # the first key after every extension of prefix
            last = prefix[-1]
            if last < 255:
                return start, bisect_left(self.keys, prefix[:-1] + bytes((last + 1,)), start, hi)
            prefix = prefix[:-1]
        return start, hi
