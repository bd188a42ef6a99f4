"""Pre-tokenization: cut a text into the words that byte-level BPE then encodes one by one.

Scope: llama.cpp's `smollm` pre-tokenizer (src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_SMOLLM), that
is every \\p{N} character alone and then the GPT-2 split of each gap, with \\p{L}, \\p{N} and \\s
classed as llama.cpp classes them (src/unicode-data.cpp). Standard library only.

Not in scope: other pre-tokenizers, Unicode normalisation (llama.cpp applies none for this
family), special-token strings (cut out before this step, see `bpe.partition`), byte encoding and
merges (`pyspec/text/bpe.py`). Nothing here raises: every str splits.

Known divergence from llama.cpp: character classes come from `unicodedata` plus the letters /
numbers added in Unicode 15.0 and 15.1 (llama.cpp's table is Unicode 15.1). On a Python whose
`unicodedata` is newer than 15.1, code points assigned after 15.1 are classed as letters / numbers
here but as "other" by llama.cpp.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

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

def split_smollm(text: str) -> list[str]:
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
