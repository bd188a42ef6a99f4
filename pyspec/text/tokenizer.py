"""The tokenizer as the rest of pyspec sees it: built from GGUF metadata, checked, composed.

Scope: the tokenizer family of the champion (GGUF `tokenizer.ggml.model = "gpt2"` with pre-tokenizer
`"smollm"`), reproducing llama.cpp's `llama_tokenize` token for token (checked against llama-cpp-python
0.3.36 by `tests/golden/tokenizer_ids.json`), the ChatML family of chat templates, and an
incremental decoder that never emits half a UTF-8 character. Runs on CPython >= 3.11 and Pyodide
(Python 3.12) with the standard library only.

This module is the facade: `Tokenizer.from_metadata` validates the metadata, `Tokenizer` keeps the
vocabulary tables and checks every caller's input, and `TokenizerError` is raised only from here.
The work itself lives in three modules that raise nothing of their own:
- `pyspec/text/pretokenize.py`: the `smollm` split of a text into words;
- `pyspec/text/bpe.py`: byte alphabet, special-token cuts, merges, token bytes, `IncrementalDecoder`;
- `pyspec/text/chat.py`: recognising and rendering ChatML templates.

Not in scope: SentencePiece / WordPiece / Unigram vocabularies, other pre-tokenizers (they raise
`TokenizerError`), Unicode normalisation (llama.cpp applies none for this family). The known
divergences from llama.cpp are listed in `pretokenize.py` and `bpe.py`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable, Mapping

from ..errors import PyspecError
from .bpe import (
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TOKEN_USER_DEFINED,
    IncrementalDecoder,
    merge_word,
    partition,
    special_tokens,
    token_bytes,
)
from .bpe import bytes_to_unicode as _bytes_to_unicode  # noqa: F401  (pyspec.testmodels imports it)
from .chat import chatml_segments, parse_chatml
from .pretokenize import split_smollm

__all__ = ["Tokenizer", "TokenizerError", "IncrementalDecoder", "SUPPORTED_MODELS", "SUPPORTED_PRE",
           "TOKEN_NORMAL", "TOKEN_UNKNOWN", "TOKEN_CONTROL", "TOKEN_USER_DEFINED"]

SUPPORTED_MODELS = ("gpt2",)
SUPPORTED_PRE = ("smollm",)

_WORD_CACHE_LIMIT = 1 << 16  # words whose BPE result is memoised per tokenizer

# Tokens that end a turn besides EOS (a subset of llama.cpp's EOG list that ChatML models use).
_EOG_TEXTS = ("<|im_end|>", "<|endoftext|>")


class TokenizerError(PyspecError):
    """The tokenizer metadata, a text or a chat is not something this module can handle. A model
    whose tokenizer is refused is a bad model; the browser session reports malformed messages
    as bad_config."""

    code = "bad_model"


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
        self._fingerprint: str | None = None
        self.chat_template = chat_template
        self._token_to_id = dict(zip(tokens, range(len(tokens))))  # last duplicate wins, as in llama.cpp
        # Built with comprehensions, not a loop of calls: the page builds this on every start.
        # A merge's two parts: cut at the first space after the first character, as llama.cpp.
        cuts = [merge.find(" ", 1) for merge in merges]
        if -1 in cuts:
            rank = cuts.index(-1)
            raise TokenizerError(f"merge {rank} ({merges[rank]!r}) has no space between its two "
                                 "parts; the GGUF's tokenizer.ggml.merges is corrupt, re-export "
                                 "the model")
        pairs = [(merge[:cut], merge[cut + 1:]) for merge, cut in zip(merges, cuts)]
        # The first rank of a repeated pair wins: later ranks are written first.
        self._ranks: dict[tuple[str, str], int] = {
            pair: rank for rank, pair in zip(range(len(pairs) - 1, -1, -1), reversed(pairs))}
        self._specials = special_tokens(tokens, token_types)  # (id, text, type), longest first
        self._word_cache: dict[str, tuple[int, ...]] = {}
        self._chatml_system = parse_chatml(chat_template)

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
                                 "of these, or add its split rules to pyspec/text/pretokenize.py")
        tokens, merges = get("tokens"), get("merges")
        if not tokens or merges is None:
            raise TokenizerError("GGUF metadata lacks tokenizer.ggml.tokens or tokenizer.ggml.merges; "
                                 "the file has no BPE vocabulary, re-export it with its tokenizer")
        token_types = get("token_type", [TOKEN_NORMAL] * len(tokens))
        for name, values, kind in (("tokens", tokens, str), ("merges", merges, str),
                                   ("token_type", token_types, int)):
            # Exact types (a bool is no int here), checked at C speed: 147,000 values.
            if not isinstance(values, list) or not set(map(type, values)) <= {kind}:
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

        return cls(tokens=list(tokens), token_types=token_types,
                   merges=list(merges), model=model, pre=pre,
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
        """sha256 over everything that decides ids: model, pre, tokens, types, merges, special ids.
        Computed once (every receipt carries it; it costs about 16 ms natively, more in wasm)."""
        if self._fingerprint is None:
            self._fingerprint = self._hash_ids()
        return self._fingerprint

    def _hash_ids(self) -> str:
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
        return ids + self._encode_fragments(partition(text, self._specials, special))

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a chat, where only the template's own text may hold control tokens.

        Equal to encode(render_chat(messages), special=True) whenever no message contains a
        control-token string. When one does (a user typing '<|im_end|>'), that text is encoded as
        plain text, so message content can never forge a turn boundary.
        """
        fragments: list[str | int] = []
        for text, trusted in self._chat_segments(messages, add_generation_prompt):
            for fragment in partition(text, self._specials, trusted):
                if isinstance(fragment, str) and fragments and isinstance(fragments[-1], str):
                    fragments[-1] += fragment  # text runs across segments, as in one string
                else:
                    fragments.append(fragment)
        return self._encode_fragments(fragments)

    def _encode_fragments(self, fragments: list[str | int]) -> list[int]:
        """Special ids as they are; each text fragment pre-tokenized and BPE-encoded."""
        ids: list[int] = []
        for fragment in fragments:
            if isinstance(fragment, int):
                ids.append(fragment)
            else:
                for word in split_smollm(fragment):
                    ids.extend(self._encode_word(word))
        return ids

    def _encode_word(self, word: str) -> tuple[int, ...]:
        ids = self._word_cache.get(word)
        if ids is None:
            if len(self._word_cache) >= _WORD_CACHE_LIMIT:  # keep a long-lived worker's memory bounded
                self._word_cache.clear()
            ids = self._word_cache[word] = merge_word(word, self._ranks, self._token_to_id)
        return ids

    # --- decode ---------------------------------------------------------------------------------

    def token_bytes(self, token_id: int, special: bool = True) -> bytes:
        """The bytes one token stands for (llama.cpp `token_to_piece`).

        Control and unknown tokens give their text when `special`, else nothing.
        """
        if not 0 <= token_id < len(self.tokens):
            raise TokenizerError(f"token id {token_id} is outside the vocabulary of "
                                 f"{len(self.tokens)} tokens")
        return token_bytes(self.tokens[token_id], self.token_types[token_id], special)

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """Text of `ids`; invalid UTF-8 becomes U+FFFD. special=True renders control tokens."""
        data = b"".join(self.token_bytes(int(i), special) for i in ids)
        return data.decode("utf-8", errors="replace")

    def stream_decoder(self, special: bool = False) -> IncrementalDecoder:
        return IncrementalDecoder(self, special)

    # --- chat template --------------------------------------------------------------------------

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text the model's own `tokenizer.chat_template` renders for `messages`.

        Only the ChatML family is rendered (recognised by structure, see `chat.parse_chatml`); any
        other template raises. To tokenize a chat prefer encode_chat(), which keeps message
        content from forming control tokens.
        """
        return "".join(text for text, _ in self._chat_segments(messages, add_generation_prompt))

    def _chat_segments(self, messages: list[dict],
                       add_generation_prompt: bool) -> list[tuple[str, bool]]:
        """Check the template and the messages, then render them as (text, from template) pieces."""
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
            try:
                message["content"].encode("utf-8")
            except UnicodeEncodeError as exc:
                raise TokenizerError(f"messages[{k}]['content'] holds a lone surrogate at index "
                                     f"{exc.start}, which is not valid Unicode; clean the text "
                                     "first") from None
        return chatml_segments(messages, self._chatml_system[0], add_generation_prompt)
