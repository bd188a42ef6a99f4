"""Byte-level BPE tokenizer built from GGUF metadata, its chat template and a streaming detokenizer.

Scope: the tokenizer family of the champion (GGUF `tokenizer.ggml.model = "gpt2"` with pre-tokenizer
`"smollm"`), reproducing llama.cpp's `llama_tokenize` token for token (checked against llama-cpp-python
0.3.36 by `tests/golden/tokenizer_ids.json`), the ChatML family of chat templates rendered by hand
(no jinja2 at runtime), and an incremental decoder that never emits half a UTF-8 character.
Runs on CPython >= 3.11 and Pyodide (Python 3.12) with the standard library only.

Not in scope: SentencePiece / WordPiece / Unigram vocabularies, other pre-tokenizers (they raise
`TokenizerError`), Unicode normalisation (llama.cpp applies none for this family), and llama.cpp's
`clean_spaces` detokenizer option (off for `smollm`).

Known divergences from llama.cpp, none of which the golden corpus exercises:
- Character classes come from `unicodedata` plus the letters / numbers added in Unicode 15.0 and 15.1
  (llama.cpp's table is Unicode 15.1). On a Python whose `unicodedata` is newer than 15.1, code
  points assigned after 15.1 are classed as letters / numbers here but as "other" by llama.cpp.
- If a merged piece or a byte is missing from the vocabulary (never in a well-formed vocabulary),
  llama.cpp looks up single UTF-8 bytes of the byte-encoded text and drops what it cannot find; this
  module looks up whole byte characters.
- A normal token whose text holds a character outside the GPT-2 byte alphabet decodes to that
  character's UTF-8 here; llama.cpp writes an `[UNK_BYTE_0x..]` marker.
"""

from __future__ import annotations

import codecs
import hashlib
import heapq
import json
import re
import unicodedata
from functools import lru_cache
from typing import Any, Iterable, Mapping

SUPPORTED_MODELS = ("gpt2",)
SUPPORTED_PRE = ("smollm",)

# GGUF token types (llama.cpp `llama_token_type`).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 2, 3, 4

_WORD_CACHE_LIMIT = 1 << 16  # words whose BPE result is memoised per tokenizer

# Tokens that end a turn besides EOS (a subset of llama.cpp's EOG list that ChatML models use).
_EOG_TEXTS = ("<|im_end|>", "<|endoftext|>")


class TokenizerError(Exception):
    """The tokenizer metadata, a text or a chat is not something this module can handle."""


# ---------------------------------------------------------------------------------------------
# GPT-2 byte <-> unicode alphabet (openai/gpt-2 encoder.py `bytes_to_unicode`, llama.cpp unicode.cpp)
# ---------------------------------------------------------------------------------------------

def _bytes_to_unicode() -> list[str]:
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


_BYTE_TO_CHAR = _bytes_to_unicode()
_CHAR_TO_BYTE = {ch: byte for byte, ch in enumerate(_BYTE_TO_CHAR)}
# latin-1 char i -> byte char of byte i, so `utf8.decode("latin-1").translate(...)` byte-encodes.
_LATIN1_TO_BYTE_CHAR = {byte: ch for byte, ch in enumerate(_BYTE_TO_CHAR)}


# ---------------------------------------------------------------------------------------------
# Character classes for \p{L}, \p{N}, \s as llama.cpp defines them (src/unicode-data.cpp)
# ---------------------------------------------------------------------------------------------

_OUT, _LETTER, _NUMBER, _SPACE, _OTHER = 0, 1, 2, 3, 4

# \s: the Unicode White_Space property (PropList.txt), the set llama.cpp uses. It is not
# `str.isspace()`, which also holds for U+001C..U+001F.
_WHITESPACE = frozenset(
    [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
     0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
)
# Letters and numbers assigned in Unicode 15.0 and 15.1 (UnicodeData.txt 15.1), the version of
# llama.cpp's table; CPython 3.11 ships Unicode 14.0 and 3.12 ships 15.0, which call them Cn.
_NEWER_LETTERS = (
    (0x1123F, 0x11240), (0x11F02, 0x11F02), (0x11F04, 0x11F10), (0x11F12, 0x11F33),
    (0x1342F, 0x1342F), (0x13441, 0x13446), (0x1B132, 0x1B132), (0x1B155, 0x1B155),
    (0x1DF25, 0x1DF2A), (0x1E030, 0x1E06D), (0x1E4D0, 0x1E4EB), (0x2B739, 0x2B739),
    (0x2EBF0, 0x2EE5D), (0x31350, 0x323AF),
)
_NEWER_NUMBERS = ((0x11F50, 0x11F59), (0x1D2C0, 0x1D2D3), (0x1E4F0, 0x1E4F9))


@lru_cache(maxsize=None)
def _char_class(ch: str) -> int:
    """Class of one character: letter (\\p{L}), number (\\p{N}), whitespace (\\s) or other."""
    cp = ord(ch)
    if cp in _WHITESPACE:
        return _SPACE
    category = unicodedata.category(ch)
    if category == "Cn":
        if any(lo <= cp <= hi for lo, hi in _NEWER_LETTERS):
            return _LETTER
        if any(lo <= cp <= hi for lo, hi in _NEWER_NUMBERS):
            return _NUMBER
    return {"L": _LETTER, "N": _NUMBER}.get(category[0], _OTHER)


# ---------------------------------------------------------------------------------------------
# Pre-tokenizer (llama.cpp src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_SMOLLM)
# ---------------------------------------------------------------------------------------------

def _split_smollm(text: str) -> list[str]:
    """Words of `text`: every \\p{N} character alone, then the GPT-2 split of each gap.

    llama.cpp applies the regex list `["\\p{N}", GPT2]` in turn; each regex splits every piece
    of the previous one and keeps the gaps between its matches as pieces. So a digit is always its
    own word and never takes a leading space (`"a 1"` is `"a"`, `" "`, `"1"`).
    """
    words: list[str] = []
    start = 0
    for pos, ch in enumerate(text):
        if _char_class(ch) == _NUMBER:
            if pos > start:
                words.extend(_split_gpt2(text[start:pos]))
            words.append(ch)
            start = pos + 1
    if start < len(text):
        words.extend(_split_gpt2(text[start:]))
    return words


def _split_gpt2(text: str) -> list[str]:
    """`'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)` and gaps.

    A transcription of llama.cpp's `unicode_regex_split_custom_gpt2`, which is what llama.cpp runs
    for this regex (not std::regex); a lone whitespace that the regex does not match becomes its
    own word, as a gap would.
    """
    n = len(text)
    classes = [_char_class(ch) for ch in text] + [_OUT]  # (n+1,) sentinel past the end
    words: list[str] = []
    begin = pos = 0
    while pos < n:
        ch = text[pos]
        if ch == "'" and pos + 1 < n:  # contractions, lower case only
            if text[pos + 1] in "stmd":
                pos += 2
                words.append(text[begin:pos])
                begin = pos
                continue
            if pos + 2 < n and text[pos + 1:pos + 3] in ("re", "ve", "ll"):
                pos += 3
                words.append(text[begin:pos])
                begin = pos
                continue
        # An optional leading space joins the run that follows it.
        cls = classes[pos + 1] if ch == " " else classes[pos]
        if cls in (_LETTER, _NUMBER, _OTHER):
            pos += ch == " "
            while classes[pos] == cls:
                pos += 1
        else:
            run = 0
            while classes[pos + run] == _SPACE:
                run += 1
            # \s+(?!\S): before a non-space, leave the last whitespace to prefix the next word.
            pos += run - 1 if run > 1 and pos + run < n else run
        words.append(text[begin:pos])
        begin = pos
    return words


# ---------------------------------------------------------------------------------------------
# The tokenizer
# ---------------------------------------------------------------------------------------------

class Tokenizer:
    """Byte-level BPE over a GGUF vocabulary. Build it with `Tokenizer.from_metadata`."""

    def __init__(self, *, tokens: list[str], token_types: list[int], merges: list[str],
                 model: str, pre: str, bos_id: int | None, eos_id: int | None,
                 unk_id: int | None, pad_id: int | None, add_bos: bool,
                 chat_template: str | None):
        self.tokens = tokens
        self.token_types = token_types
        self.merges = merges
        self.model, self.pre = model, pre
        self._bos_id, self._eos_id, self.unk_id, self.pad_id = bos_id, eos_id, unk_id, pad_id
        self.add_bos = add_bos
        self.chat_template = chat_template
        self._token_to_id = {text: i for i, text in enumerate(tokens)}  # last duplicate wins, as in llama.cpp
        self._ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(merges):
            cut = merge.find(" ", 1)  # the first space after the first character, as llama.cpp
            if cut < 0:
                raise TokenizerError(f"merge {rank} ({merge!r}) has no space between its two parts; "
                                     "the GGUF's tokenizer.ggml.merges is corrupt, re-export the model")
            self._ranks.setdefault((merge[:cut], merge[cut + 1:]), rank)
        # Strings matched as one token before BPE, longest first (llama.cpp `cache_special_tokens`);
        # sorted() is stable, so equal lengths keep id order.
        self._specials = sorted(
            ((i, tokens[i], token_types[i]) for i in range(len(tokens))
             if token_types[i] in (TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED) and tokens[i]),
            key=lambda item: -len(item[1].encode("utf-8")))
        self._word_cache: dict[str, tuple[int, ...]] = {}
        self._chatml_system = _parse_chatml(chat_template)

    @classmethod
    def from_metadata(cls, md: Mapping[str, Any]) -> "Tokenizer":
        """Build from GGUF metadata (keys `tokenizer.ggml.*`, values as plain Python objects)."""
        def get(key: str, default: Any = None) -> Any:
            return md.get("tokenizer.ggml." + key, default)

        model, pre = get("model"), get("pre")
        if model not in SUPPORTED_MODELS:
            raise TokenizerError(f"tokenizer model {model!r} is not supported; this tokenizer handles "
                                 f"tokenizer.ggml.model in {SUPPORTED_MODELS} (byte-level BPE)")
        if pre not in SUPPORTED_PRE:
            raise TokenizerError(f"pre-tokenizer {pre!r} is not supported; this tokenizer handles "
                                 f"tokenizer.ggml.pre in {SUPPORTED_PRE}. Use a model exported with one "
                                 "of these, or add its split rules to pyspec/tokenizer.py")
        tokens, merges = get("tokens"), get("merges")
        if not tokens or merges is None:
            raise TokenizerError("GGUF metadata lacks tokenizer.ggml.tokens or tokenizer.ggml.merges; "
                                 "the file has no BPE vocabulary, re-export it with its tokenizer")
        token_types = get("token_type", [TOKEN_NORMAL] * len(tokens))
        for name, values, kind in (("tokens", tokens, str), ("merges", merges, str),
                                   ("token_type", token_types, int)):
            if not isinstance(values, list) or not all(
                    isinstance(v, kind) and not isinstance(v, bool) for v in values):
                raise TokenizerError(f"tokenizer.ggml.{name} must be a list of {kind.__name__}; "
                                     "the GGUF metadata is corrupt, re-export the model")
        if len(token_types) != len(tokens):
            raise TokenizerError(f"tokenizer.ggml.token_type has {len(token_types)} entries for "
                                 f"{len(tokens)} tokens; the GGUF metadata is inconsistent")

        def special(key: str) -> int | None:
            value = get(key + "_token_id")
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(tokens):
                raise TokenizerError(f"tokenizer.ggml.{key}_token_id = {value} is outside the "
                                     f"vocabulary of {len(tokens)} tokens; the GGUF metadata is corrupt")
            return int(value)

        return cls(tokens=[str(t) for t in tokens], token_types=token_types,
                   merges=[str(m) for m in merges], model=model, pre=pre,
                   bos_id=special("bos"), eos_id=special("eos"), unk_id=special("unknown"),
                   pad_id=special("padding"), add_bos=bool(get("add_bos_token", False)),
                   chat_template=md.get("tokenizer.chat_template"))

    # --- identity -------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @property
    def bos_id(self) -> int | None:
        return self._bos_id

    @property
    def eos_id(self) -> int | None:
        return self._eos_id

    @property
    def eog_ids(self) -> set[int]:
        """Ids that end generation: EOS and the end-of-turn tokens present in the vocabulary."""
        ids = {self._token_to_id[t] for t in _EOG_TEXTS if t in self._token_to_id}
        if self._eos_id is not None:
            ids.add(self._eos_id)
        return ids

    def fingerprint(self) -> str:
        """sha256 over everything that decides ids: model, pre, tokens, types, merges, special ids."""
        canonical = json.dumps(
            {"model": self.model, "pre": self.pre, "tokens": self.tokens,
             "token_types": self.token_types, "merges": self.merges,
             "bos": self._bos_id, "eos": self._eos_id, "unk": self.unk_id, "pad": self.pad_id,
             "add_bos": self.add_bos},
            ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def template_hash(self) -> str:
        """sha256 of the chat template text ('' when the model has none)."""
        return hashlib.sha256((self.chat_template or "").encode("utf-8")).hexdigest()

    # --- encode ---------------------------------------------------------------------------------

    def encode(self, text: str, special: bool = False, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`, as llama.cpp's `llama_tokenize(text, add_special, parse_special)`.

        special=True matches control-token strings (e.g. '<|im_start|>') in the text as single
        tokens; with special=False they are ordinary text. add_bos=None follows the model's
        `tokenizer.ggml.add_bos_token`.
        """
        if not isinstance(text, str):
            raise TokenizerError(f"encode() takes a str, got {type(text).__name__}; decode bytes first")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise TokenizerError(f"text holds a lone surrogate at index {exc.start}, which is not "
                                 "valid Unicode; clean it (e.g. encode with 'surrogatepass' and decode "
                                 "with 'replace') first") from None
        ids: list[int] = []
        if self.add_bos if add_bos is None else add_bos:
            if self._bos_id is None:
                raise TokenizerError("add_bos was asked for but the model declares no BOS token; "
                                     "call encode(..., add_bos=False)")
            ids.append(self._bos_id)
        return ids + self._encode_fragments(self._partition(text, special))

    def _encode_fragments(self, fragments: list[str | int]) -> list[int]:
        """Special ids as they are; each text fragment pre-tokenized and BPE-encoded."""
        ids: list[int] = []
        for fragment in fragments:
            if isinstance(fragment, int):
                ids.append(fragment)
            else:
                for word in _split_smollm(fragment):
                    ids.extend(self._encode_word(word))
        return ids

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a chat, where only the template's own text may hold control tokens.

        Equal to encode(render_chat(messages), special=True) whenever no message contains a
        control-token string. When one does (a user typing '<|im_end|>'), that text is encoded as
        plain text, so message content can never forge a turn boundary.
        """
        fragments: list[str | int] = []
        for text, trusted in self._chat_segments(messages, add_generation_prompt):
            for fragment in self._partition(text, trusted):
                if isinstance(fragment, str) and fragments and isinstance(fragments[-1], str):
                    fragments[-1] += fragment  # text runs across segments, as in one string
                else:
                    fragments.append(fragment)
        return self._encode_fragments(fragments)

    def _partition(self, text: str, special: bool) -> list[str | int]:
        """Cut special-token strings out of `text` (llama.cpp `tokenizer_st_partition`).

        Each special string, longest first, is searched left to right in every text fragment left
        by the longer ones. Control and unknown tokens take part only when `special`; user-defined
        tokens always do.
        """
        fragments: list[str | int] = [text]
        for token_id, token_text, token_type in self._specials:
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

    def _encode_word(self, word: str) -> tuple[int, ...]:
        ids = self._word_cache.get(word)
        if ids is None:
            if len(self._word_cache) >= _WORD_CACHE_LIMIT:  # keep a long-lived worker's memory bounded
                self._word_cache.clear()
            ids = self._word_cache[word] = self._bpe(word)
        return ids

    def _bpe(self, word: str) -> tuple[int, ...]:
        """Merge the byte characters of one word by rank (llama.cpp `llm_tokenizer_bpe_session`).

        The lowest-rank adjacent pair merges first, the leftmost among equal ranks. Queue entries
        go stale when a neighbour merges; they are recognised by their text and skipped.
        """
        symbols = list(word.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_BYTE_CHAR))
        n = len(symbols)
        nxt = [*range(1, n), -1]  # (n,) linked list over symbols that are still alive
        prv = list(range(-1, n - 1))
        ranks = self._ranks
        queue: list[tuple[int, int, int, str]] = []  # (rank, left, right, merged text)

        def push(left: int, right: int) -> None:
            if left >= 0 and right >= 0:
                rank = ranks.get((symbols[left], symbols[right]))
                if rank is not None:
                    heapq.heappush(queue, (rank, left, right, symbols[left] + symbols[right]))

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

        ids: list[int] = []
        for piece in symbols:
            if not piece:
                continue
            token_id = self._token_to_id.get(piece)
            if token_id is not None:
                ids.append(token_id)
            else:  # not in a well-formed vocabulary: fall back to one token per byte
                ids.extend(self._token_to_id[ch] for ch in piece if ch in self._token_to_id)
        return tuple(ids)

    # --- decode ---------------------------------------------------------------------------------

    def token_bytes(self, token_id: int, special: bool = True) -> bytes:
        """The bytes one token stands for (llama.cpp `token_to_piece`).

        Control and unknown tokens give their text when `special`, else nothing.
        """
        if not 0 <= token_id < len(self.tokens):
            raise TokenizerError(f"token id {token_id} is outside the vocabulary of "
                                 f"{len(self.tokens)} tokens")
        text, kind = self.tokens[token_id], self.token_types[token_id]
        if kind == TOKEN_NORMAL:
            return b"".join(bytes([_CHAR_TO_BYTE[ch]]) if ch in _CHAR_TO_BYTE
                            else ch.encode("utf-8") for ch in text)
        if kind == TOKEN_USER_DEFINED or (special and kind in (TOKEN_CONTROL, TOKEN_UNKNOWN)):
            return text.encode("utf-8")
        return b""

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """Text of `ids`; invalid UTF-8 becomes U+FFFD. special=True renders control tokens."""
        data = b"".join(self.token_bytes(int(i), special) for i in ids)
        return data.decode("utf-8", errors="replace")

    def stream_decoder(self, special: bool = False) -> "IncrementalDecoder":
        return IncrementalDecoder(self, special)

    # --- chat template --------------------------------------------------------------------------

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text the model's own `tokenizer.chat_template` renders for `messages`.

        Only the ChatML family is rendered (recognised by structure, see `_parse_chatml`); any
        other template raises. To tokenize a chat prefer encode_chat(), which keeps message
        content from forming control tokens.
        """
        return "".join(text for text, _ in self._chat_segments(messages, add_generation_prompt))

    def _chat_segments(self, messages: list[dict],
                       add_generation_prompt: bool) -> list[tuple[str, bool]]:
        """The rendered chat as (text, comes from the template) pieces."""
        if self.chat_template is None:
            raise TokenizerError("the model has no tokenizer.chat_template; build the prompt text "
                                 "yourself and call encode()")
        if self._chatml_system is None:
            raise TokenizerError(
                f"chat template (sha256 {self.template_hash()[:12]}) is not one this renderer "
                "reproduces exactly; supported: ChatML, with or without a default system message")
        if not isinstance(messages, list):
            raise TokenizerError(f"messages must be a list of dicts, got {type(messages).__name__}")
        for k, message in enumerate(messages):
            if not isinstance(message, dict):
                raise TokenizerError(f"messages[{k}] must be a dict with 'role' and 'content', "
                                     f"got {type(message).__name__}")
            if message.get("role") not in ("system", "user", "assistant"):
                raise TokenizerError(f"messages[{k}]['role'] is {message.get('role')!r}; "
                                     "use 'system', 'user' or 'assistant'")
            if not isinstance(message.get("content"), str):
                raise TokenizerError(f"messages[{k}]['content'] must be a str, "
                                     f"got {type(message.get('content')).__name__}")
        segments: list[tuple[str, bool]] = []
        default_system = self._chatml_system[0]
        if messages and default_system is not None and messages[0]["role"] != "system":
            segments.append((f"<|im_start|>system\n{default_system}<|im_end|>\n", True))
        for message in messages:
            segments += [(f"<|im_start|>{message['role']}\n", True), (message["content"], False),
                         ("<|im_end|>\n", True)]
        if add_generation_prompt:
            segments.append(("<|im_start|>assistant\n", True))
        return segments


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


def _parse_chatml(template: str | None) -> tuple[str | None] | None:
    """(default system message or None,) for a ChatML template, None for anything else."""
    if template is None:
        return None
    match = _CHATML_RE.fullmatch(template)
    return None if match is None else (match.group("system"),)


# ---------------------------------------------------------------------------------------------
# Streaming detokenizer
# ---------------------------------------------------------------------------------------------

class IncrementalDecoder:
    """Feed token ids one at a time and get back only the newly completed text.

    The bytes of a character split across tokens (emoji, CJK) are held until the character is
    complete, so no chunk ends in half a character. Invalid bytes become U+FFFD as in `decode`,
    and the concatenation of all chunks plus `flush()` equals `decode(ids)`.
    """

    def __init__(self, tokenizer: Tokenizer, special: bool = False):
        self._tokenizer = tokenizer
        self._special = special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        return self._utf8.decode(self._tokenizer.token_bytes(int(token_id), self._special))

    def flush(self) -> str:
        """The held-back bytes of an unfinished character, as U+FFFD; resets the decoder."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
