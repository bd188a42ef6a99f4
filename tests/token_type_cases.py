"""The vocabularies and texts of tests/test_token_types.py, shared with the script that records
llama.cpp's ids and token attributes for them (scripts/record_golden_token_types.py).

`CONTROL_LOOKING`: every token text that llama.cpp's vocabulary loader compares a token with
(`llama_vocab::impl::load`, src/llama-vocab.cpp in the llama-cpp-python 0.3.36 sdist), written out
from that source apart from pyspec/text/tokentypes.py; the recorder checks that it holds every
`t.first == "..."` and `text == "..."` of that function.

`BASES`: one vocabulary per pre-tokenizer pyspec reads (smollm: the champion's; gpt-2, llama-bpe,
qwen2: llama.cpp's test vocabularies) and the SentencePiece-style ones (llama-spm; phi-3, named
Phi3, so right-stripping; Gemma 3's settings from pyspec.testmodels). `variant(md, v)` appends the
control-looking texts a base lacks, with assorted file types, so that each load rule meets a
token it changes: v=0 one spelling per undeclared role, v=1 another spelling, harmony's
<|return|> <|call|> <|end|> and Gemma 4's <|tool_response>; v=2 every role declared by id (so
nothing is searched), solar-open's <|calls|> <|flush|> and an eos <|plamo:eos|>.
`texts(md)` holds each special and control-looking string twice, inside words and between
whitespace, and all of them joined.
"""

from __future__ import annotations

CONTROL_LOOKING = (
    # end of turn, end of message (also ends of generation)
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>", "<|eom_id|>",
    # fill in the middle: prefix, suffix, middle, pad, repo, separator
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>",
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
    "<|code_suffix|>", "<|suffix|>",
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
    "<|code_middle|>", "<|middle|>",
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
    "<|file_sep|>",
    # other ends of generation
    "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "</s>", "[EOS]", "<eos>", "<turn|>",
    "<|tool_response>", "[e~[", "<|plamo:eos|>",
    # gpt-oss, Phi-3's kept ones, and lookalikes no rule names
    "<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", "<unk>", "<s>",
    "<unused0>", "<|im_start|>", "<|end_of_turn|>", "</S>",
)
ROLES = {  # the spellings of each role, in llama.cpp's order, and the keys that declare it
    "fim_pre": (CONTROL_LOOKING[12:20], ("fim_pre_token_id", "prefix_token_id")),
    "fim_suf": (CONTROL_LOOKING[20:28], ("fim_suf_token_id", "suffix_token_id")),
    "fim_mid": (CONTROL_LOOKING[28:36], ("fim_mid_token_id", "middle_token_id")),
    "fim_pad": (CONTROL_LOOKING[36:41], ("fim_pad_token_id",)),
    "fim_rep": (CONTROL_LOOKING[41:46], ("fim_rep_token_id",)),
    "fim_sep": (CONTROL_LOOKING[46:47], ("fim_sep_token_id",)),
}
BASES = ("smollm", "gpt-2", "llama-bpe", "qwen2", "llama-spm", "phi-3", "gemma3-settings")
VARIANTS = (0, 1, 2)
# File types the appended tokens take in turn: user-defined, normal, undefined, unused, unknown,
# control (GGUF tokenizer.ggml.token_type).
TYPES = (4, 1, 0, 5, 2, 3)


def variant(md: dict, v: int) -> dict:
    """The metadata keys that variant `v` of the vocabulary `md` changes (see the docstring)."""
    tokens = md["tokenizer.ggml.tokens"]
    have = set(tokens)
    key = "tokenizer.ggml."
    skip = set()
    if v == 0:
        skip.update(("<|plamo:eos|>", "<|tool_response>", "<|return|>", "<|flush|>"))
    if v in (0, 1):   # one spelling a role, so that no hash-table order decides (tokentypes.py)
        for role, (spellings, _) in ROLES.items():
            present = [s for s in spellings if s in have]
            keep = present[:1] or [spellings[v % len(spellings)]]
            skip.update(s for s in spellings if s not in keep)
    if v == 1:
        skip.update(("<|calls|>", "<|flush|>", "<|plamo:eos|>"))
    if v == 2:
        skip.update(("<|return|>", "<|call|>", "<|tool_response>"))
    added = [t for t in CONTROL_LOOKING if t not in have and t not in skip]
    types = [TYPES[(k + v) % len(TYPES)] for k in range(len(added))]
    ids = {t: len(tokens) + k for k, t in enumerate(added)}
    changes = {key + "tokens": tokens + added,
               key + "token_type": md[key + "token_type"] + types}
    if key + "scores" in md:
        changes[key + "scores"] = md[key + "scores"] + [0.0] * len(added)
    if v == 2:
        id_of = {t: i for i, t in enumerate(changes[key + "tokens"])}
        for role, (spellings, keys) in ROLES.items():
            for k, name in enumerate(keys):   # a later key of a role overrides an earlier one
                changes[key + name] = id_of[spellings[(2 + k) % len(spellings)]]
        normal = max(i for i, t in enumerate(md[key + "token_type"]) if t == 1)
        changes[key + "eot_token_id"] = normal             # declared: ends, keeps its type
        if "<|plamo:eos|>" in ids:
            changes[key + "token_type"][ids["<|plamo:eos|>"]] = 3
            changes[key + "eos_token_id"] = ids["<|plamo:eos|>"]
    return changes


def specials(md: dict) -> list[str]:
    """The texts of the file's unknown, control and user-defined tokens."""
    return [t for t, kind in zip(md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"])
            if kind in (2, 3, 4) and t]


def texts(md: dict, own: bool = True) -> list[str]:
    """Every control-looking string, and with `own` every special string of the file (a variant
    leaves them as its base has them), inside a word and between whitespace (where Phi-3's right
    strip and a SentencePiece space prefix act), then all of them joined."""
    strings = list(dict.fromkeys([*CONTROL_LOOKING, *(specials(md) if own else ())]))
    out = [t for s in strings for t in (f"x{s}y", f" {s} \n z")]
    return out + ["".join(strings), " ".join(strings) + " \n"]
