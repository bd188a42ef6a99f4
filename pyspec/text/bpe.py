"""Byte-level BPE over a GGUF vocabulary: the byte alphabet, special-token cuts, merges, decoding.

Scope: the GPT-2 byte <-> unicode alphabet, llama.cpp's special-token partition of a text, the
rank-ordered merge of one pre-tokenized word into token ids, the bytes of one token, and an
incremental decoder that never emits half a UTF-8 character. Pure functions over a vocabulary the
caller has already checked (`tokenizer.Tokenizer` builds and validates it, keeps the lookup tables
and the word cache, and raises `TokenizerError`); nothing here raises it. Standard library only.

Also llama.cpp's `clean_spaces` detokenizer rule, which the stream decoder applies where a
vocabulary sets it (`gpt-2`, `llama-bpe`; not `smollm`, `qwen2` nor SentencePiece).

Not in scope: splitting text into words (`pyspec/text/pretokenize.py`), chat templates
(`pyspec/text/chat.py`, `template.py`), reading GGUF metadata, the SentencePiece-style model
(`spm.py`), WordPiece / Unigram vocabularies.

Known divergences from llama.cpp, none of which the golden corpus exercises:
- If a merged piece or a byte is missing from the vocabulary (never in a well-formed vocabulary),
  llama.cpp looks up single UTF-8 bytes of the byte-encoded text and drops what it cannot find; this
  module looks up whole byte characters.
- A normal token whose text holds a character outside the GPT-2 byte alphabet decodes to that
  character's UTF-8 here; llama.cpp writes an `[UNK_BYTE_0x..]` marker.
"""

from __future__ import annotations

import codecs
import heapq
from typing import Mapping, Protocol

# GGUF token types (llama.cpp `llama_token_type`).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 2, 3, 4


# ---------------------------------------------------------------------------------------------
# GPT-2 byte <-> unicode alphabet (openai/gpt-2 encoder.py `bytes_to_unicode`, llama.cpp unicode.cpp)
# ---------------------------------------------------------------------------------------------

def bytes_to_unicode() -> list[str]:
    """The printable character that stands for each byte 0..255 in token texts."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    extra = 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


_BYTE_TO_CHAR = bytes_to_unicode()
_CHAR_TO_BYTE = {ch: byte for byte, ch in enumerate(_BYTE_TO_CHAR)}
# latin-1 char i -> byte char of byte i, so `utf8.decode("latin-1").translate(...)` byte-encodes.
_LATIN1_TO_BYTE_CHAR = {byte: ch for byte, ch in enumerate(_BYTE_TO_CHAR)}


# ---------------------------------------------------------------------------------------------
# Vocabulary tables
# ---------------------------------------------------------------------------------------------

def special_tokens(tokens: list[str], token_types: list[int]) -> list[tuple[int, str, int]]:
    """(id, text, type) of the strings matched as one token before BPE, longest first.

    llama.cpp `cache_special_tokens`; sorted() is stable, so equal lengths keep id order.
    """
    return sorted(
        ((i, tokens[i], token_types[i]) for i in range(len(tokens))
         if token_types[i] in (TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED) and tokens[i]),
        key=lambda item: -len(item[1].encode("utf-8")))


# ---------------------------------------------------------------------------------------------
# Encode: special-token partition, then BPE of each word
# ---------------------------------------------------------------------------------------------

def partition(text: str, specials: list[tuple[int, str, int]], special: bool) -> list[str | int]:
    """Cut special-token strings out of `text` (llama.cpp `tokenizer_st_partition`).

    Each special string, longest first (`specials` as `special_tokens` orders them), is searched
    left to right in every text fragment left by the longer ones. Control and unknown tokens take
    part only when `special`; user-defined tokens always do.
    """
    fragments: list[str | int] = [text]
    for token_id, token_text, token_type in specials:
        if not special and token_type != TOKEN_USER_DEFINED:
            continue
        if not any(isinstance(f, str) and token_text in f for f in fragments):
            continue
        cut: list[str | int] = []
        for fragment in fragments:
            if isinstance(fragment, int) or token_text not in fragment:
                cut.append(fragment)
                continue
            for k, part in enumerate(fragment.split(token_text)):
                if k:
                    cut.append(token_id)
                if part:
                    cut.append(part)
        fragments = cut
    return fragments


def merge_pairs(symbols: list[str], priority) -> list[str]:
    """Merge adjacent symbols, the pair of lowest `priority(left, right)` first (None: never),
    the leftmost among equals: the loop of llama.cpp's BPE and SentencePiece-style sessions.
    Returns the merged symbols. Queue entries go stale when a neighbour merges; they are
    recognised by their text and skipped."""
    n = len(symbols)
    nxt = [*range(1, n), -1]  # (n,) linked list over symbols that are still alive ("" when gone)
    prv = list(range(-1, n - 1))
    queue: list[tuple] = []   # (priority, left, right, merged text)

    def push(left: int, right: int) -> None:
        if left >= 0 and right >= 0:
            p = priority(symbols[left], symbols[right])
            if p is not None:
                heapq.heappush(queue, (p, left, right, symbols[left] + symbols[right]))

    for i in range(n - 1):
        push(i, i + 1)
    while queue:
        _, left, right, merged = heapq.heappop(queue)
        if not symbols[left] or not symbols[right] or symbols[left] + symbols[right] != merged:
            continue
        symbols[left], symbols[right] = merged, ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prv[nxt[right]] = left
        push(prv[left], left)
        push(left, nxt[left])
    return [piece for piece in symbols if piece]


def merge_word(word: str, ranks: Mapping[tuple[str, str], int],
               token_to_id: Mapping[str, int], ignore_merges: bool = False) -> tuple[int, ...]:
    """Merge the byte characters of one word by rank (llama.cpp `llm_tokenizer_bpe_session`).

    The lowest-rank adjacent pair merges first, the leftmost among equal ranks (merge_pairs). With
    `ignore_merges` (Llama 3), a word that is a token as a whole is that token, merges or not.
    """
    encoded = word.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_BYTE_CHAR)
    if ignore_merges and encoded in token_to_id:
        return (token_to_id[encoded],)
    symbols = merge_pairs(list(encoded), lambda left, right: ranks.get((left, right)))
    ids: list[int] = []
    for piece in symbols:
        token_id = token_to_id.get(piece)
        if token_id is not None:
            ids.append(token_id)
        else:  # not in a well-formed vocabulary: fall back to one token per byte
            ids.extend(token_to_id[ch] for ch in piece if ch in token_to_id)
    return tuple(ids)


# ---------------------------------------------------------------------------------------------
# Decode
# ---------------------------------------------------------------------------------------------

def token_bytes(text: str, kind: int, special: bool) -> bytes:
    """The bytes of a token with this text and GGUF type (llama.cpp `token_to_piece`).

    Control and unknown tokens give their text when `special`, else nothing.
    """
    if kind == TOKEN_NORMAL:
        return b"".join(bytes([_CHAR_TO_BYTE[ch]]) if ch in _CHAR_TO_BYTE
                        else ch.encode("utf-8") for ch in text)
    if kind == TOKEN_USER_DEFINED or (special and kind in (TOKEN_CONTROL, TOKEN_UNKNOWN)):
        return text.encode("utf-8")
    return b""


def clean_spaces(text: str) -> str:
    """llama.cpp's `clean_spaces` detokenizer rule (`llama_vocab::impl::detokenize`), three passes:
    drop the space before `?!.,`; turn " ' " into "'"; drop the space before 's 'm 're 've.

    Each pass looks at most three characters past a space, so text cut after three non-space
    characters cleans piece by piece alike (`IncrementalDecoder` relies on it). The passes run
    on characters here and on bytes in llama.cpp: the same, as every character involved is ASCII.
    """
    out = text[:1]
    for ch in text[1:]:
        if ch in "?!.," and out[-1] == " ":
            out = out[:-1]
        out += ch
    chars, out, i, gone = out, out[:1], 1, -1
    while i < len(chars):
        if (chars[i] == "'" and i + 1 < len(chars) and chars[i - 1] == " " == chars[i + 1]
                and i - 1 != gone):   # llama.cpp blanks the space it drops after the quote
            out = out[:-1] + "'"
            gone = i + 1
            i += 2
            continue
        out += chars[i]
        i += 1
    chars, out = out, out[:1]
    for i in range(1, len(chars)):
        if (chars[i - 1] == " " and chars[i] == "'" and i + 1 < len(chars)
                and (chars[i + 1] in "sm" or chars[i + 1:i + 3] in ("re", "ve"))):
            out = out[:-1]
        out += chars[i]
    return out


class _TokenSource(Protocol):
    """What the stream decoder needs of a tokenizer (`tokenizer.Tokenizer` is one)."""

    strip_first_space: bool   # the first token's leading space is dropped (SentencePiece prefix)
    clean_spaces: bool        # llama.cpp's clean_spaces rule applies

    def token_bytes(self, token_id: int, special: bool = True) -> bytes: ...


class IncrementalDecoder:
    """Feed token ids one at a time and get back only the newly completed text.

    The bytes of a character split across tokens (emoji, CJK) are held until the character is
    complete, so no chunk ends in half a character. Where the vocabulary cleans spaces, text is
    also held until three non-space characters follow the last space (see `clean_spaces`).
    Invalid bytes become U+FFFD as in `decode`, and the concatenation of all chunks plus
    `flush()` equals `decode(ids)`.
    """

    def __init__(self, tokenizer: _TokenSource, special: bool = False):
        self._tokenizer = tokenizer
        self._special = special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._first = True
        self._held = ""   # decoded text not yet cleaned and shown

    def feed(self, token_id: int) -> str:
        data = self._tokenizer.token_bytes(int(token_id), self._special)
        if self._first and self._tokenizer.strip_first_space and data[:1] == b" ":
            data = data[1:]
        self._first = False
        text = self._utf8.decode(data)
        if not self._tokenizer.clean_spaces:
            return text
        self._held += text
        cut = len(self._held)
        while cut >= 3 and " " in self._held[cut - 3:cut]:
            cut -= 1
        if cut < 3:
            return ""
        out, self._held = clean_spaces(self._held[:cut]), self._held[cut:]
        return out

    def flush(self) -> str:
        """The held-back text (an unfinished character as U+FFFD); resets the decoder."""
        text = self._held + self._utf8.decode(b"", final=True)
        self._utf8.reset()
        self._first, self._held = True, ""
        return clean_spaces(text) if self._tokenizer.clean_spaces else text
