"""The tokenizer as the rest of pyspec sees it: built from GGUF metadata, checked, composed.

Scope: the tokenizer families pyspec reads, each reproducing llama.cpp's `llama_tokenize` token for
token: byte-level BPE (GGUF `tokenizer.ggml.model = "gpt2"`) with the pre-tokenizers `smollm` (the
champion; checked against llama-cpp-python 0.3.36 by `tests/golden/tokenizer_ids.json`),
`gpt-2`, `llama-bpe` (Llama 3) and `qwen2`, and the SentencePiece-style model (`"llama"`: Llama 2,
Gemma 3), checked against llama.cpp's own vocabulary tests and its ids of seeded random texts
(`tests/test_tokenizer_families.py`, `tests/golden/family_ids.json`). Also the
end-of-generation ids, the model's own chat template, and an incremental decoder that never emits
half a UTF-8 character. Runs on CPython >= 3.11 and Pyodide (Python 3.12).

This module is the facade: `Tokenizer.from_metadata` validates the metadata, `Tokenizer` keeps the
vocabulary tables and checks every caller's input, and `TokenizerError` (and its `TemplateError`)
is raised only from here. The work itself lives in modules that raise nothing of their own:
- `pretokenize.py`: the split of a text into words, per pre-tokenizer;
- `bpe.py`: byte alphabet, special-token cuts, merges, token bytes, `IncrementalDecoder`;
- `spm.py`: the SentencePiece-style merge by score, byte fallback, token bytes;
- `tokentypes.py`: the types llama.cpp gives tokens at load (a control-looking token becomes
  control whatever the file says), the end-of-generation ids, Phi-3's right strip;
- `chat.py`: the ChatML fast path; `template.py`: any other template, through jinja2.

Not in scope: WordPiece / Unigram vocabularies and other pre-tokenizers (they raise
`TokenizerError`), Unicode normalisation (llama.cpp applies none for these families). Known
divergences from llama.cpp: those in `pretokenize.py`, `bpe.py` and `tokentypes.py`.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Iterable, Mapping

from ..errors import PyspecError
from . import spm, tokentypes
from .bpe import (
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TOKEN_USER_DEFINED,
    IncrementalDecoder,
    clean_spaces,
    merge_word,
    partition,
    special_tokens,
)
from .bpe import bytes_to_unicode as _bytes_to_unicode  # noqa: F401  (pyspec.testmodels imports it)
from .bpe import token_bytes as bpe_token_bytes
from .chat import chatml_segments, parse_chatml
from .pretokenize import split_gpt2, split_llama3, split_qwen2, split_smollm
from .template import RenderError, render_segments
from .toolcalls import check_tool_message

__all__ = ["Tokenizer", "TokenizerError", "TemplateError", "IncrementalDecoder", "SUPPORTED_MODELS",
           "SUPPORTED_PRE", "TOKEN_NORMAL", "TOKEN_UNKNOWN", "TOKEN_CONTROL", "TOKEN_USER_DEFINED"]

SUPPORTED_MODELS = ("gpt2", "llama")
# Per BPE pre-tokenizer, as llama.cpp's `llama_vocab::impl::load` sets them (src/llama-vocab.cpp):
# (split, clean_spaces, ignore_merges, add_bos unless the file says otherwise).
_BPE_PRE = {
    "smollm": (split_smollm, False, False, False),
    "gpt-2": (split_gpt2, True, False, False),
    "llama-bpe": (split_llama3, True, True, True),
    "qwen2": (split_qwen2, False, False, False),
}
SUPPORTED_PRE = tuple(_BPE_PRE)
# The SentencePiece-style model: llama.cpp's defaults for tokenizer.ggml.model = "llama".
_SPM_DEFAULT_IDS = {"bos": 1, "eos": 2, "unknown": 0}

_WORD_CACHE_LIMIT = 1 << 16  # words whose BPE result is memoised per tokenizer

_BYTE_TOKEN = re.compile(r"<0x[0-9A-F]{2}>")
TOKEN_UNUSED = 5  # GGUF token type (llama.cpp LLAMA_TOKEN_TYPE_UNUSED)


class TokenizerError(PyspecError):
    """The tokenizer metadata, a text or a chat is not something this module can handle. A model
    whose tokenizer is refused is a bad model; the browser session reports malformed messages
    as bad_config."""

    code = "bad_model"


class TemplateError(TokenizerError):
    """The model's chat template failed to render: it raised, ran past its time or size bounds,
    or used something the sandbox forbids."""


class Tokenizer:
    """A GGUF vocabulary (byte-level BPE or SentencePiece-style). Build it with `from_metadata`."""

    def __init__(self, *, tokens: list[str], loaded: tokentypes.LoadedTypes, merges: list[str],
                 scores: list[float] | None, model: str, pre: str | None,
                 special_ids: dict[str, int | None], add_bos: bool, add_space_prefix: bool,
                 chat_template: str | None):
        self.tokens = tokens
        self.token_types = loaded.types  # as llama.cpp types them after loading (tokentypes.py)
        self.merges = merges
        self.scores = scores
        self.model, self.pre = model, pre
        self.special_ids = special_ids  # bos, eos, eot, eom, unknown, padding -> id or None
        self._bos_id, self._eos_id = special_ids["bos"], special_ids["eos"]
        self.unk_id, self.pad_id = special_ids["unknown"], special_ids["padding"]
        self.add_bos = add_bos
        self.add_space_prefix = add_space_prefix
        self._fingerprint: str | None = None
        self.chat_template = chat_template
        self._token_to_id = dict(zip(tokens, range(len(tokens))))  # last duplicate wins, as in llama.cpp
        self._specials = special_tokens(tokens, loaded.types)  # (id, text, type), longest first
        self._rstrip_ids = loaded.rstrip  # specials that eat the whitespace after them (Phi-3)
        self._word_cache: dict[str, tuple[int, ...]] = {}
        self._chatml_system = parse_chatml(chat_template)
        self._eog = loaded.eog
        if model == "llama":
            self._split, self.clean_spaces, self._ignore_merges = None, False, False
            self._byte_ids = self._spm_byte_ids()
            self.strip_first_space = add_space_prefix
        else:
            self._split, self.clean_spaces, self._ignore_merges, _ = _BPE_PRE[pre]
            self._ranks = self._merge_ranks(merges)
            self.strip_first_space = False

    @staticmethod
    def _merge_ranks(merges: list[str]) -> dict[tuple[str, str], int]:
        """{(left, right): rank}. Built with comprehensions, not a loop of calls: the page builds
        this on every start. A merge's two parts: cut at the first space after the first
        character, as llama.cpp."""
        cuts = [merge.find(" ", 1) for merge in merges]
        if -1 in cuts:
            rank = cuts.index(-1)
            raise TokenizerError(f"merge {rank} ({merges[rank]!r}) has no space between its two "
                                 "parts; the GGUF's tokenizer.ggml.merges is corrupt, re-export "
                                 "the model")
        pairs = [(merge[:cut], merge[cut + 1:]) for merge, cut in zip(merges, cuts)]
        # The first rank of a repeated pair wins: later ranks are written first.
        return {pair: rank for rank, pair in zip(range(len(pairs) - 1, -1, -1), reversed(pairs))}

    def _spm_byte_ids(self) -> dict[int, int]:
        """{byte: token} for byte fallback: `<0xXX>`, else the one-byte token (llama.cpp)."""
        out: dict[int, int] = {}
        for i, (text, kind) in enumerate(zip(self.tokens, self.token_types)):
            if kind == spm.TOKEN_BYTE:
                if not _BYTE_TOKEN.fullmatch(text):
                    raise TokenizerError(f"token {i} ({text!r}) has the byte type but is not spelt "
                                         "<0xXX>; the GGUF's tokenizer.ggml.token_type is corrupt")
                out.setdefault(int(text[3:5], 16), i)
        for byte in range(128):
            if byte not in out and chr(byte) in self._token_to_id:
                out[byte] = self._token_to_id[chr(byte)]
        return out

    @classmethod
    def from_metadata(cls, md: Mapping[str, Any]) -> "Tokenizer":
        """Build from GGUF metadata (keys `tokenizer.ggml.*`, values as plain Python objects)."""
        def get(key: str, default: Any = None) -> Any:
            return md.get("tokenizer.ggml." + key, default)

        model, pre = get("model"), get("pre")
        if model not in SUPPORTED_MODELS:
            raise TokenizerError(f"tokenizer model {model!r} is not supported; this tokenizer handles "
                                 f"tokenizer.ggml.model in {SUPPORTED_MODELS} (byte-level BPE, "
                                 "SentencePiece-style)")
        if model == "gpt2" and pre not in SUPPORTED_PRE:
            raise TokenizerError(f"pre-tokenizer {pre!r} is not supported; this tokenizer handles "
                                 f"tokenizer.ggml.pre in {SUPPORTED_PRE}. Use a model exported with one "
                                 "of these, or add its split rules to pyspec/text/pretokenize.py")
        if model == "llama" and pre not in (None, "default"):
            raise TokenizerError(f"pre-tokenizer {pre!r} with the SentencePiece-style model: llama.cpp "
                                 "splits nothing before this model, so the file is inconsistent; "
                                 "re-export it with tokenizer.ggml.pre 'default'")
        tokens, merges, scores = get("tokens"), get("merges"), get("scores")
        template = md.get("tokenizer.chat_template")
        if template is not None and not isinstance(template, str):
            raise TokenizerError(f"tokenizer.chat_template is a {type(template).__name__}, not text; "
                                 "the GGUF metadata is corrupt, re-export the model")
        if not isinstance(tokens, list) or not tokens or (model == "gpt2" and merges is None) or (model == "llama" and scores is None):
            raise TokenizerError(f"GGUF metadata lacks tokenizer.ggml.tokens or tokenizer.ggml."
                                 f"{'merges' if model == 'gpt2' else 'scores'}; the file has no "
                                 "usable vocabulary, re-export it with its tokenizer")
        merges = [] if model == "llama" else merges
        token_types = get("token_type", [TOKEN_NORMAL] * len(tokens))
        checks = [("tokens", tokens, {str}), ("merges", merges, {str}), ("token_type", token_types, {int})]
        if model == "llama":
            checks.append(("scores", scores, {float, int}))
        for name, values, kinds in checks:
            # Exact types (a bool is no int here), checked at C speed: 147,000 values.
            if not isinstance(values, list) or not set(map(type, values)) <= kinds:
                raise TokenizerError(f"tokenizer.ggml.{name} must be a list of "
                                     f"{'/'.join(k.__name__ for k in kinds)}; the GGUF metadata is "
                                     "corrupt, re-export the model")
        for name, values in (("token_type", token_types), ("scores", scores or tokens)):
            if len(values) != len(tokens):
                raise TokenizerError(f"tokenizer.ggml.{name} has {len(values)} entries for "
                                     f"{len(tokens)} tokens; the GGUF metadata is inconsistent")
        special_ids = _special_ids(get, tokens, token_types, model)
        add_bos = bool(get("add_bos_token", model == "llama" or _BPE_PRE.get(pre, (0, 0, 0, False))[3]))
        if add_bos and special_ids["bos"] is None:
            raise TokenizerError("the tokenizer adds a BOS token (tokenizer.ggml.add_bos_token) but "
                                 "declares none (tokenizer.ggml.bos_token_id); the metadata "
                                 "contradicts itself, re-export the model")
        try:
            loaded = tokentypes.apply(tokens, token_types, dict(zip(tokens, range(len(tokens)))),
                                      get, {k: special_ids[k] for k in ("eos", "eot", "eom")},
                                      md.get("general.name"))
        except KeyError as exc:
            raise TokenizerError(f"general.name {md.get('general.name')!r} names a Phi-3 model, "
                                 f"whose special tokens llama.cpp sets up by text, but the "
                                 f"vocabulary has no {exc.args[0]!r} (llama.cpp fails to load it "
                                 "too); rename the model or re-export its vocabulary") from None
        return cls(tokens=list(tokens), loaded=loaded, merges=list(merges),
                   scores=[float(x) for x in scores] if model == "llama" else None,
                   model=model, pre=pre, special_ids=special_ids, add_bos=add_bos,
                   add_space_prefix=model == "llama" and bool(get("add_space_prefix", True)),
                   chat_template=template)

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
        """Ids that end generation (llama.cpp `is_eog`): the declared eos, eot and eom, every
        token whose text llama.cpp reads as an end, the FIM pad, repo and separator tokens
        (tokentypes.py)."""
        return set(self._eog)

    def fingerprint(self) -> str:
        """sha256 over everything that decides ids: model, pre, tokens, types (as loaded),
        merges, scores, special ids, the right-stripping specials. Computed once (every receipt
        carries it; about 16 ms natively, more in wasm)."""
        if self._fingerprint is None:
            self._fingerprint = self._hash_ids()
        return self._fingerprint

    def _hash_ids(self) -> str:
        fields = {"model": self.model, "pre": self.pre, "tokens": self.tokens,
                  "token_types": self.token_types, "merges": self.merges,
                  "bos": self._bos_id, "eos": self._eos_id, "unk": self.unk_id, "pad": self.pad_id,
                  "add_bos": self.add_bos}
        # Fields added with the families, written only where they say something, so that the
        # champion's fingerprint (in receipts) stays what it was.
        fields.update({k: self.special_ids[k] for k in ("eot", "eom") if self.special_ids[k] is not None})
        if self._rstrip_ids:
            fields["rstrip"] = sorted(self._rstrip_ids)
        if self.model == "llama":
            fields.update(scores=self.scores, add_space_prefix=self.add_space_prefix)
        canonical = json.dumps(fields, ensure_ascii=False, separators=(",", ":"))
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
        _check_unicode(text, "text")
        ids: list[int] = []
        if self.add_bos if add_bos is None else add_bos:
            if self._bos_id is None:
                raise TokenizerError("add_bos was asked for but the model declares no BOS token; "
                                     "call encode(..., add_bos=False)")
            ids.append(self._bos_id)
        return ids + self._encode_fragments(partition(text, self._specials, special))

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: list | None = None) -> list[int]:
        """Token ids of a chat, where only the template's own text may hold control tokens.

        Equal to encode(render_chat(messages), special=True, add_bos=...) whenever no message
        contains a control-token string; the BOS the model adds is left out when the template
        already wrote one. Text a message wrote (a user typing '<|im_end|>') is encoded as plain
        text, so message content can never forge a turn boundary; nor can any string of
        `tools` (OpenAI's tools list, which the template renders).
        """
        fragments: list[str | int] = []
        for text, trusted in self._chat_segments(messages, add_generation_prompt, tools):
            for fragment in partition(text, self._specials, trusted):
                if isinstance(fragment, str) and fragments and isinstance(fragments[-1], str):
                    fragments[-1] += fragment  # text runs across segments, as in one string
                else:
                    fragments.append(fragment)
        ids = self._encode_fragments(fragments)
        if self.add_bos and ids[:1] != [self._bos_id]:
            ids.insert(0, self._bos_id)
        return ids

    def _encode_fragments(self, fragments: list[str | int]) -> list[int]:
        """Special ids as they are; each text fragment pre-tokenized and merged."""
        ids: list[int] = []
        after_special = True  # SentencePiece: a space starts the text and follows every special
        for k, fragment in enumerate(fragments):
            if isinstance(fragment, str) and k and fragments[k - 1] in self._rstrip_ids:
                fragment = fragment.lstrip(_C_SPACE)
            if isinstance(fragment, int):
                ids.append(fragment)
                after_special = True
            elif self._split is None:
                if not fragment:  # an empty text is no fragment in llama.cpp: no space prefix
                    continue
                text = (" " if self.add_space_prefix and after_special else "") + fragment
                ids.extend(self._merge_spm(text.replace(" ", spm.SPACE)))
                after_special = False
            else:
                for word in self._split(fragment):
                    ids.extend(self._encode_word(word))
        return ids

    def _merge_spm(self, text: str) -> list[int]:
        try:
            return spm.merge_text(text, self._token_to_id, self.scores, self._byte_ids)
        except KeyError as exc:
            raise TokenizerError(f"the text holds a character that no token spells and the "
                                 f"vocabulary has no byte token <0x{exc.args[0]:02X}> to fall back "
                                 "to; this model cannot encode it") from None

    def _encode_word(self, word: str) -> tuple[int, ...]:
        ids = self._word_cache.get(word)
        if ids is None:
            if len(self._word_cache) >= _WORD_CACHE_LIMIT:  # keep a long-lived worker's memory bounded
                self._word_cache.clear()
            ids = self._word_cache[word] = merge_word(word, self._ranks, self._token_to_id,
                                                      self._ignore_merges)
        return ids

    # --- decode ---------------------------------------------------------------------------------

    def token_bytes(self, token_id: int, special: bool = True) -> bytes:
        """The bytes one token stands for (llama.cpp `token_to_piece`).

        Control and unknown tokens give their text when `special`, else nothing.
        """
        if not 0 <= token_id < len(self.tokens):
            raise TokenizerError(f"token id {token_id} is outside the vocabulary of "
                                 f"{len(self.tokens)} tokens")
        piece = spm.token_bytes if self.model == "llama" else bpe_token_bytes
        return piece(self.tokens[token_id], self.token_types[token_id], special)

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """Text of `ids` as llama.cpp's `llama_detokenize(remove_special=False, unparse_special=
        special)`: the first token's leading space dropped where the vocabulary adds one, invalid
        UTF-8 as U+FFFD, and llama.cpp's `clean_spaces` rule where the vocabulary sets it."""
        pieces = [self.token_bytes(int(i), special) for i in ids]
        if pieces and self.strip_first_space and pieces[0][:1] == b" ":
            pieces[0] = pieces[0][1:]
        text = b"".join(pieces).decode("utf-8", errors="replace")
        return clean_spaces(text) if self.clean_spaces else text

    def stream_decoder(self, special: bool = False) -> IncrementalDecoder:
        return IncrementalDecoder(self, special)

    # --- chat template --------------------------------------------------------------------------

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: list | None = None) -> str:
        """The prompt text the model's own `tokenizer.chat_template` renders for `messages`.

        ChatML templates take a fast path (`chat.parse_chatml`); any other is rendered by jinja2 in
        a sandbox as HF renders it (`template.py`). To tokenize a chat prefer encode_chat(),
        which keeps message content from forming control tokens.
        """
        return "".join(text for text, _ in self._chat_segments(messages, add_generation_prompt,
                                                              tools))

    def _chat_segments(self, messages: list[dict], add_generation_prompt: bool,
                       tools: list | None = None) -> list[tuple[str, bool]]:
        """Check the template and the messages, then render them as (text, from template) pieces."""
        if self.chat_template is None:
            raise TokenizerError("the model has no tokenizer.chat_template; build the prompt text "
                                 "yourself and call encode()")
        _check_messages(messages)
        messages = [check_tool_message(k, m) for k, m in enumerate(messages)]
        if self._chatml_system is not None:
            return chatml_segments(messages, self._chatml_system[0], add_generation_prompt)
        names = {k: self.tokens[self.special_ids[k]] if self.special_ids[k] is not None else ""
                 for k in ("bos", "eos")}
        controls = [text for _, text, kind in self._specials if kind != TOKEN_USER_DEFINED]
        try:
            return render_segments(self.chat_template, messages, add_generation_prompt,
                                   bos_token=names["bos"], eos_token=names["eos"],
                                   controls=controls, tools=tools)
        except RenderError as exc:
            raise TemplateError(f"chat template (sha256 {self.template_hash()[:12]}) did not render: "
                                f"{exc}. Build the prompt text yourself and call encode(), or use a "
                                "model whose template renders") from None


_C_SPACE = " \t\n\v\f\r"  # C isspace(), as llama.cpp's strip tests each byte


def _special_ids(get, tokens: list[str], token_types: list[int], model: str) -> dict[str, int | None]:
    """The declared special ids, checked: each in the vocabulary, and none naming a byte or an
    unused token (an end of turn that is a byte would end generation inside a character)."""
    out: dict[str, int | None] = {}
    for key in ("bos", "eos", "eot", "eom", "unknown", "padding"):
        value = get(key + "_token_id")
        if value is None and model == "llama" and key in _SPM_DEFAULT_IDS:
            value = _SPM_DEFAULT_IDS[key] if _SPM_DEFAULT_IDS[key] < len(tokens) else None
        if value is None:
            out[key] = None
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(tokens):
            raise TokenizerError(f"tokenizer.ggml.{key}_token_id = {value} is outside the "
                                 f"vocabulary of {len(tokens)} tokens; the GGUF metadata is corrupt")
        if key != "padding" and token_types[value] in (spm.TOKEN_BYTE, TOKEN_UNUSED):
            raise TokenizerError(f"tokenizer.ggml.{key}_token_id = {value} names {tokens[value]!r}, "
                                 f"a {'byte' if token_types[value] == spm.TOKEN_BYTE else 'unused'} "
                                 "token; the special ids contradict the vocabulary, re-export the model")
        out[key] = int(value)
    return out


def _check_unicode(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TokenizerError(f"{what} holds a lone surrogate at index {exc.start}, which is not "
                             "valid Unicode; clean it (e.g. encode with 'surrogatepass' and decode "
                             "with 'replace') first") from None


def _check_messages(messages: Any) -> None:
    """A list of dicts whose role is system, user, assistant or tool and whose content is a str
    (an assistant's that calls tools may be null)."""
    if not isinstance(messages, list):
        raise TokenizerError(f"messages must be a list of dicts, got {type(messages).__name__}")
    for k, message in enumerate(messages):
        if not isinstance(message, dict):
            raise TokenizerError(f"messages[{k}] must be a dict with 'role' and 'content', "
                                 f"got {type(message).__name__}")
        if message.get("role") not in ("system", "user", "assistant", "tool"):
            raise TokenizerError(f"messages[{k}]['role'] is {message.get('role')!r}; "
                                 "use 'system', 'user', 'assistant' or 'tool'")
        if message.get("content") is None and message.get("tool_calls"):
            continue   # an assistant's call with no text (toolcalls.check_tool_message)
        if not isinstance(message.get("content"), str):
            raise TokenizerError(f"messages[{k}]['content'] must be a str, "
                                 f"got {type(message.get('content')).__name__}")
        _check_unicode(message["content"], f"messages[{k}]['content']")
