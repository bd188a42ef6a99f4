"""Pre-tokenization: cut a text into the words that byte-level BPE then encodes one by one.

Scope: llama.cpp's pre-tokenizers (src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_*) of the families
pyspec reads: `gpt-2` (the GPT-2 regex), `smollm` (every \\p{N} character alone, then the GPT-2
split of each gap), `llama-bpe` (Llama 3) and `qwen2` (Llama 3's regex with single digits), each
written as the hand-coded splitter llama.cpp runs for its regex (src/unicode.cpp
`unicode_regex_split_custom_*`), with \\p{L}, \\p{N} and \\s classed as llama.cpp classes them
(src/unicode-data.cpp). Hand-coded, not `re`: Python's `re` has no \\p{L}, and the `regex` module
is not in the runtime (it would be one more wheel for the page). Standard library only.

Not in scope: which pre-tokenizer a file names (`tokenizer.py`), Unicode normalisation (llama.cpp
applies none for these families), special-token strings (cut out before this step, see `bpe.partition`), byte encoding and
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
                words.extend(split_gpt2(text[start:pos]))
            words.append(ch)
            start = pos + 1
    if start < len(text):
        words.extend(split_gpt2(text[start:]))
    return words


def split_gpt2(text: str) -> list[str]:
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


def split_llama3(text: str) -> list[str]:
    """Llama 3's split (pre `llama-bpe`): digits in runs of up to three."""
    return _split_llama3_family(text, 3)


def split_qwen2(text: str) -> list[str]:
    """Qwen2's split (pre `qwen2`): Llama 3's regex with every digit alone."""
    return _split_llama3_family(text, 1)


def _split_llama3_family(text: str, digits: int) -> list[str]:
    """`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,digits}|
    ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+` and gaps, as llama.cpp's
    `unicode_regex_split_custom_llama3` / `_qwen2` run it (alternatives tried in this order)."""
    n = len(text)
    classes = [_char_class(ch) for ch in text] + [_OUT]  # (n+1,) sentinel past the end
    words: list[str] = []
    begin = pos = 0
    while pos < n:
        ch, cls = text[pos], classes[pos]
        if ch == "'" and pos + 1 < n:  # contractions, either case (ASCII: nothing else lowers to these)
            if text[pos + 1] in "sStTmMdD":
                pos += 2
            elif pos + 2 < n and text[pos + 1:pos + 3].lower() in ("re", "ve", "ll"):
                pos += 3
        if pos == begin and ch not in "\r\n" and cls != _NUMBER and _LETTER in (cls, classes[pos + 1]):
            pos += 1  # one optional non-letter, then letters
            while classes[pos] == _LETTER:
                pos += 1
        elif pos == begin and cls == _NUMBER:
            while pos - begin < digits and classes[pos] == _NUMBER:
                pos += 1
        elif pos == begin and (classes[pos + 1] if ch == " " else cls) == _OTHER:
            pos += ch == " "  # an optional space, punctuation, then line breaks
            while classes[pos] == _OTHER:
                pos += 1
            while pos < n and text[pos] in "\r\n":
                pos += 1
        elif pos == begin:
            pos = _whitespace_end(text, classes, pos)
        words.append(text[begin:pos])
        begin = pos
    return words


def _whitespace_end(text: str, classes: list[int], pos: int) -> int:
    """End of `\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+` at `pos`, or pos + 1 when none matches."""
    run, line_end = 0, 0
    while classes[pos + run] == _SPACE:
        if text[pos + run] in "\r\n":
            line_end = pos + run + 1
        run += 1
    if line_end:                             # \s*[\r\n]+: up to the last line break of the run
        return line_end
    if run > 1 and pos + run < len(text):    # \s+(?!\S): leave one space to the next word
        return pos + run - 1
    return pos + max(run, 1)
