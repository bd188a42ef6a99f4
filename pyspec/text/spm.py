"""The SentencePiece-style model (GGUF `tokenizer.ggml.model = "llama"`), as llama.cpp runs it.

Scope: the escaped text of one fragment (spaces as U+2581, the leading space where the vocabulary
adds one), the merge of its characters into tokens by score (llama.cpp `llm_tokenizer_spm_session`:
the adjacent pair whose concatenation is the highest-scoring token merges first, the leftmost among
equal scores; this is not unigram Viterbi), byte fallback (a character no token holds becomes the
`<0xXX>` tokens of its UTF-8 bytes), and the bytes of one token. Pure functions over tables the
caller built and checked (`tokenizer.Tokenizer`, which raises `TokenizerError`); nothing here
raises except a KeyError for a byte the vocabulary has no token for, which the caller reports.

Not in scope: special-token cuts (`bpe.partition`, shared with byte-level BPE), SentencePiece's
unigram model (llama.cpp's `ugm`), normalisation (llama.cpp applies none for this model).
"""

from __future__ import annotations

from typing import Mapping

from .bpe import (
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TOKEN_USER_DEFINED,
    merge_pairs,
)

TOKEN_BYTE = 6  # GGUF token type of `<0xXX>` tokens (llama.cpp LLAMA_TOKEN_TYPE_BYTE)
SPACE = "\u2581"  # '▁': how SentencePiece spells a space inside tokens


def byte_token_text(byte: int) -> str:
    """The text of the byte-fallback token for `byte` (llama.cpp `byte_to_token`)."""
    return f"<0x{byte:02X}>"


def merge_text(text: str, token_to_id: Mapping[str, int], scores: list[float],
               byte_ids: Mapping[int, int]) -> list[int]:
    """Token ids of one escaped text fragment, merged by score.

    `byte_ids[b]` is the token for byte b (`<0xXX>`, else the one-character token of that byte,
    as llama.cpp looks it up); a byte with neither raises KeyError. The pair whose merge is the
    token of highest score merges first (bpe.merge_pairs).
    """
    def priority(left: str, right: str):
        token_id = token_to_id.get(left + right)
        return None if token_id is None else -scores[token_id]   # the highest score first

    symbols = merge_pairs(list(text), priority)
    ids: list[int] = []
    for piece in symbols:
        token_id = token_to_id.get(piece)
        if token_id is not None:
            ids.append(token_id)
        else:  # only a single character no token holds: its UTF-8 bytes
            ids.extend(byte_ids[b] for b in piece.encode("utf-8"))
    return ids


def token_bytes(text: str, kind: int, special: bool) -> bytes:
    """The bytes of a token with this text and GGUF type (llama.cpp `token_to_piece`, SPM)."""
    if kind == TOKEN_NORMAL:
        return text.replace(SPACE, " ").encode("utf-8")
    if kind == TOKEN_BYTE:
        return bytes([int(text[3:5], 16)])
    if kind == TOKEN_USER_DEFINED or (special and kind in (TOKEN_CONTROL, TOKEN_UNKNOWN)):
        return text.encode("utf-8")
    return b""  # control / unknown without `special`, unused and undefined types
