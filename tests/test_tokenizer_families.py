"""The tokenizer families against llama.cpp's own tokenizer tests (pyspec/text/tokenizer.py).

The oracle: llama.cpp's test vocabularies and their cases (models/ggml-vocab-NAME.gguf with
.gguf.inp / .gguf.out, as tests/test-tokenizer-0.cpp reads them: cases separated by a
"__ggml_vocab_test__" line, each tokenized with add_special=false, parse_special=false), taken
from the llama-cpp-python 0.3.36 sdist into .cache/llama.cpp/ by `build.py setup`. Every test here
asks for them (the `llama_fixtures` fixture): missing, they skip, and fail under
PYSPEC_REQUIRE=llama (CI).
"""

from __future__ import annotations

import functools
import pathlib

import pytest

from pyspec.formats.gguf import GGUFFile
from pyspec.text.tokenizer import Tokenizer

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / ".cache" / "llama.cpp"
VOCABS = ["llama-bpe", "qwen2", "llama-spm", "phi-3", "gpt-2"]
SEPARATOR = "\n__ggml_vocab_test__\n"

needs_fixtures = pytest.mark.usefixtures("llama_fixtures")


@functools.lru_cache(maxsize=None)
def vocab_metadata(name: str) -> dict:
    return GGUFFile.open(FIXTURES / f"ggml-vocab-{name}.gguf").metadata


def vocab_tokenizer(name: str, **changes) -> Tokenizer:
    return Tokenizer.from_metadata({**vocab_metadata(name), **changes})


def vocab_cases(name: str) -> list[tuple[str, list[int]]]:
    """(text, ids) of each case, split as test-tokenizer-0.cpp splits them."""
    raw = (FIXTURES / f"ggml-vocab-{name}.gguf.inp").read_bytes().decode("utf-8")
    texts = raw.split(SEPARATOR)
    if raw.endswith(SEPARATOR):
        texts.pop()  # the file ends with a separator: no case after it
    outs = (FIXTURES / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").splitlines()
    assert len(texts) == len(outs), f"{name}: {len(texts)} inputs, {len(outs)} outputs"
    return [(t, [int(x) for x in o.split()]) for t, o in zip(texts, outs)]


@pytest.fixture(scope="module", params=VOCABS)
def family(request, llama_fixtures):
    return request.param, vocab_tokenizer(request.param), vocab_cases(request.param)


@needs_fixtures
def test_every_case_matches_llama_cpp(family):
    name, tok, cases = family
    assert len(cases) >= 40
    failures = [f"{text!r}:\n  ours  {ours}\n  llama {ids}" for text, ids in cases
                if (ours := tok.encode(text, special=False, add_bos=False)) != ids]
    assert not failures, f"{name}: {len(failures)} of {len(cases)} cases differ:\n" + "\n".join(failures)


@needs_fixtures
def test_decode_inverts_encode_as_llama_cpp_detokenizes(family):
    """llama.cpp's detokenizer gives the text back, less what its `clean_spaces` rule removes
    (gpt-2, llama-bpe) and with the SentencePiece prefix space dropped (llama-spm, phi-3)."""
    from pyspec.text.bpe import clean_spaces

    name, tok, cases = family
    assert tok.clean_spaces == (name in ("gpt-2", "llama-bpe"))
    assert tok.strip_first_space == (name in ("llama-spm", "phi-3"))
    for text, ids in cases:
        assert tok.decode(ids) == (clean_spaces(text) if tok.clean_spaces else text), text


@needs_fixtures
def test_streamed_text_equals_the_decode_of_the_whole(family):
    name, tok, cases = family
    texts = [text for text, _ in cases] + ["Hello , world . It ' s ok ' re 've 'm 's", " ' ' ' x"]
    for text in texts:
        ids = tok.encode(text)
        for special in (False, True):
            decoder = tok.stream_decoder(special)
            chunks = [decoder.feed(i) for i in ids]
            assert "".join(chunks) + decoder.flush() == tok.decode(ids, special), (name, text)


# As llama.cpp prints them at load ("EOG token = ..."); qwen2's </s> is a normal token that
# llama.cpp re-types as control, phi-3's a user-defined one (tests/test_token_types.py).
EOG = {"llama-bpe": {"<|end_of_text|>", "<|eot_id|>"},
       "qwen2": {"<|endoftext|>", "<|im_end|>", "</s>"}, "llama-spm": {"</s>"},
       "phi-3": {"<|endoftext|>", "<|end|>", "</s>"}, "gpt-2": {"<|endoftext|>"}}


@needs_fixtures
def test_end_of_generation_ids_are_llama_cpps(family):
    """The declared eos, and the end-of-turn tokens llama.cpp finds by their text."""
    name, tok, _ = family
    assert {tok.tokens[i] for i in tok.eog_ids} == EOG[name]


@needs_fixtures
def test_bos_rules(family):
    """llama.cpp's add_bos: the file's add_bos_token, else on for Llama 3 and SentencePiece."""
    name, tok, _ = family
    assert tok.add_bos == (name in ("llama-bpe", "llama-spm", "phi-3"))
    assert tok.encode("Hi")[:1] == ([tok.bos_id] if tok.add_bos else tok.encode("Hi", add_bos=False)[:1])


@needs_fixtures
def test_specials_parse_only_when_asked(family):
    name, tok, _ = family
    eos = tok.tokens[tok.eos_id]
    assert tok.encode(f"a{eos}b", special=True, add_bos=False).count(tok.eos_id) == 1
    assert tok.eos_id not in tok.encode(f"a{eos}b", special=False, add_bos=False)


@needs_fixtures
def test_phi3_specials_eat_the_whitespace_after_them():
    """llama.cpp's by-name RSTRIP: a model named Phi-3 drops the ASCII whitespace after every
    special token but <unk>, <s> and <|endoftext|>; another name keeps it."""
    tok = vocab_tokenizer("phi-3")
    end, eot = (tok.encode(t, special=True, add_bos=False) for t in ("<|end|>", "<|endoftext|>"))
    x = tok.encode("x", add_bos=False)
    assert tok.encode("<|end|> \n\t x", special=True, add_bos=False) == end + x
    assert tok.encode("<|endoftext|> x", special=True, add_bos=False) != eot + x
    other = vocab_tokenizer("phi-3", **{"general.name": "other"})
    assert other.encode("<|end|> x", special=True, add_bos=False) != end + x
    assert other.fingerprint() != tok.fingerprint()


GOLDEN = pathlib.Path(__file__).parent / "golden" / "family_ids.json"


@needs_fixtures
def test_random_texts_match_llama_cpp():
    """Seeded random texts (code, emoji, CJK, RTL, whitespace and digit runs, control-token
    strings) against llama.cpp's own tokenizer, per vocabulary; the Gemma 3 settings vocabulary
    is pyspec.testmodels.gemma3_tokenizer_metadata, written to GGUF by the recording script."""
    import hashlib
    import json

    from pyspec import testmodels

    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert "llama-cpp-python 0.3.36" in golden["source"]
    assert set(golden["vocabs"]) == {*VOCABS, "gemma3-settings"}
    failures = []
    for name, entry in golden["vocabs"].items():
        if name == "gemma3-settings":
            tok = Tokenizer.from_metadata(testmodels.gemma3_tokenizer_metadata())
        else:
            path = FIXTURES / f"ggml-vocab-{name}.gguf"
            assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
            tok = vocab_tokenizer(name)
        assert len(entry["cases"]) >= 100
        failures += [f"{name} {text!r} special={special}:\n  ours  {ours}\n  llama {ids}"
                     for text, special, ids in entry["cases"]
                     if (ours := tok.encode(text, special=special, add_bos=False)) != ids]
    assert not failures, f"{len(failures)} cases differ:\n" + "\n".join(failures[:20])
