"""Token types as llama.cpp applies them at load, over the types a GGUF declares.

llama.cpp reads each token's type from `tokenizer.ggml.token_type`, then re-types some tokens by
their text (`llama_vocab::impl::load`, src/llama-vocab.cpp of the llama.cpp that the
llama-cpp-python 0.3.36 sdist vendors), in this order:
1. Roles found by text. For each of end of turn, end of message and the six fill-in-the-middle
   roles that the file does not declare by id (`ROLE_KEYS`), the token spelt like the role
   (`ROLE_TEXTS`) becomes a control token: "control-looking token ... its type will be
   overridden".
2. End of generation. Every token spelt like an end (`EOG_TEXTS`) becomes a control token and ends
   generation, as do the FIM pad, repo and separator tokens and the eos, eot and eom ids.
3. gpt-oss: `<|channel|>`, `<|message|>`, `<|start|>` and `<|constrain|>` become user-defined
   (matched in any text, always rendered).
4. o200k_harmony / solar-open: with `<|return|>` and `<|call|>` (or `<|calls|>` and `<|flush|>`)
   among the ends, `<|end|>` ends nothing and becomes user-defined.
5. Gemma 4 / PLaMo: with `<|tool_response>` or `<|plamo:eos|>` among the ends, `</s>` ends
   nothing and becomes a normal token.
6. By model name: a `general.name` holding 'phi-3' or 'phi3' gives every special token (control,
   user-defined, unknown; after 1-5) and `</s>` the right strip (the ASCII whitespace after it
   goes), except `<unk>`, `<s>` and `<|endoftext|>`; llama.cpp fails to load such a model that
   lacks one of those four texts.
A control token is cut out of a text only when special tokens are parsed (`--special`); a
user-defined one in any text. So in a Phi-3 vocabulary, whose `</s>` the file calls user-defined,
a user's `</s>` stays text, as in llama.cpp.

llama.cpp keeps bit sets where this module keeps one GGUF type per token: a normal, unknown,
unused, undefined or user-defined token that rule 1 or 2 makes control is, in llama.cpp, that
type | control, which it tokenizes (cut out only with parse_special) and detokenizes (its text
only with special) exactly as a control token; so here it is control. Only the text decides
(llama.cpp's `token_to_id`: of two tokens with one text, the later id).

Known divergence: where a vocabulary holds two texts of one undeclared role (two FIM prefix
spellings, say), llama.cpp re-types the first its hash table yields; here every one becomes
control, and every such pad, repo or separator token ends generation.
Not here: the left strip of `<mask>` / `[MASK]` (jina-v2, nomic-bert-moe, modern-bert: WordPiece
and Unigram vocabularies, which pyspec refuses); the `unused` mark of control tokens spelt with
'unused' (it changes neither tokenization nor decoding). Pure functions; nothing here raises but
a KeyError naming a text rule 6 needs (the tokenizer reports it).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

from .bpe import TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED

# Rule 1: the texts llama.cpp searches for a role the file does not declare, and the metadata
# keys that declare it (tokenizer.ggml.*; a later key of a role overrides an earlier one).
ROLE_TEXTS = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
            "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
            "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
ROLE_KEYS = {
    "eot": ("eot_token_id",), "eom": ("eom_token_id",),
    "fim_pre": ("fim_pre_token_id", "prefix_token_id"),
    "fim_suf": ("fim_suf_token_id", "suffix_token_id"),
    "fim_mid": ("fim_mid_token_id", "middle_token_id"),
    "fim_pad": ("fim_pad_token_id",), "fim_rep": ("fim_rep_token_id",),
    "fim_sep": ("fim_sep_token_id",),
}
# Rule 2: texts that end generation wherever a vocabulary holds them (llama.cpp special_eog_ids).
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
             "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
             "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
             "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[")
GPT_OSS_TEXTS = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")      # rule 3
RSTRIP_NAMES = ("phi-3", "phi3")                                                   # rule 6
RSTRIP_KEPT = ("<unk>", "<s>", "<|endoftext|>")
# Every text a rule above reads: what the tests put into texts (tests/test_token_types.py).
CONTROL_LOOKING = tuple(dict.fromkeys(
    [t for texts in ROLE_TEXTS.values() for t in texts] + [*EOG_TEXTS, *GPT_OSS_TEXTS,
                                                           "<|plamo:eos|>", *RSTRIP_KEPT]))


class LoadedTypes(NamedTuple):
    types: list[int]          # (vocab,) GGUF token type of each token after the rules
    eog: frozenset[int]       # ids that end generation (llama.cpp `is_eog`)
    rstrip: frozenset[int]    # specials that eat the ASCII whitespace after them (rule 6)


def apply(tokens: list[str], file_types: list[int], token_to_id: Mapping[str, int],
          get: Callable[[str], Any], ends: Mapping[str, int | None],
          name: Any) -> LoadedTypes:
    """The types, ends and right-stripping ids llama.cpp has after loading this vocabulary.

    `get(key)` reads `tokenizer.ggml.<key>`; `ends` holds the checked eos, eot and eom ids (or
    None); `name` is general.name. Raises KeyError(text) for a text rule 6 needs that the
    vocabulary lacks."""
    types = list(file_types)
    roles = {role: _declared(get, keys, len(tokens)) for role, keys in ROLE_KEYS.items()}
    control: set[int] = set()
    for role, texts in ROLE_TEXTS.items():                                  # rule 1
        if roles[role] is None:
            roles[role] = [token_to_id[t] for t in texts if t in token_to_id]
            control.update(roles[role])
    eog = {i for role in ("fim_pad", "fim_rep", "fim_sep") for i in roles[role] or ()}
    for text in EOG_TEXTS:                                                  # rule 2
        if text in token_to_id:
            eog.add(token_to_id[text])
            control.add(token_to_id[text])
    for i in control:
        types[i] = TOKEN_CONTROL
    for text in GPT_OSS_TEXTS:                                              # rule 3
        if text in token_to_id:
            types[token_to_id[text]] = TOKEN_USER_DEFINED
    eog.update(i for i in ends.values() if i is not None)
    for role in ("eot", "eom"):
        eog.update(roles[role] or ())
    ending = {tokens[i] for i in eog}
    calls = "<|call|>" in ending or "<|calls|>" in ending                        # rule 4
    if "<|end|>" in ending and calls and ("<|return|>" in ending or "<|flush|>" in ending):
        end = max(i for i in eog if tokens[i] == "<|end|>")   # the last of llama.cpp's sorted set
        eog.discard(end)
        types[end] = TOKEN_USER_DEFINED
    if "</s>" in ending and ending & {"<|tool_response>", "<|plamo:eos|>"}:     # rule 5
        s = max(i for i in eog if tokens[i] == "</s>")
        eog.discard(s)
        types[s] = TOKEN_NORMAL
    return LoadedTypes(types, frozenset(eog), _rstrip(name, tokens, types, token_to_id))


def _declared(get: Callable[[str], Any], keys: tuple[str, ...], n: int) -> list[int] | None:
    """The id the last valid key declares, as a one-id list; None if none does (llama.cpp
    ignores an id outside the vocabulary, with a warning, and then searches by text)."""
    found = None
    for key in keys:
        value = get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < n:
            found = [value]
    return found


def _rstrip(name: Any, tokens: list[str], types: list[int],
            token_to_id: Mapping[str, int]) -> frozenset[int]:
    """Rule 6: llama.cpp's by-name RSTRIP attribute."""
    if not isinstance(name, str) or not any(k in name.lower() for k in RSTRIP_NAMES):
        return frozenset()
    for text in ("</s>", *RSTRIP_KEPT):
        if text not in token_to_id:
            raise KeyError(text)
    ids = {i for i, kind in enumerate(types)
           if kind in (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNKNOWN) and tokens[i]}
    ids.add(token_to_id["</s>"])
    return frozenset(ids - {token_to_id[t] for t in RSTRIP_KEPT})
