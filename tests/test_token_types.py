"""Token types as llama.cpp applies them at load (pyspec/text/tokentypes.py, through Tokenizer).

The oracle: llama.cpp itself (the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp, through
scripts/llama_tokenize.cpp), recorded by scripts/record_golden_token_types.py into
tests/golden/token_types.json: for a vocabulary per pre-tokenizer and three variants of each
(tests/token_type_cases.py), each token's attributes and `is_eog` after loading, and the ids of
texts holding every special and control-looking string, with parse_special false and true.
"""

from __future__ import annotations

import functools
import hashlib
import json
import pathlib

import pytest

import token_type_cases as cases
from pyspec.text.bpe import TOKEN_CONTROL, TOKEN_UNKNOWN
from pyspec.text.tokenizer import Tokenizer, TokenizerError
from test_tokenizer_families import FIXTURES, vocab_metadata

GOLDEN = pathlib.Path(__file__).parent / "golden" / "token_types.json"
# llama_token_attr bits (llama.h)
UNKNOWN, UNUSED, NORMAL, CONTROL, USER_DEFINED, BYTE, RSTRIP = 1, 2, 4, 8, 16, 32, 256
NAMES = [b if v is None else f"{b}+v{v}" for b in cases.BASES for v in (None, *cases.VARIANTS)]


@functools.lru_cache(maxsize=1)
def golden() -> dict:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=None)
def base_metadata(base: str) -> dict:
    from pyspec import champion_path, testmodels
    from pyspec.formats.gguf import GGUFFile

    if base == "gemma3-settings":
        return testmodels.gemma3_tokenizer_metadata()
    path = champion_path() if base == "smollm" else FIXTURES / f"ggml-vocab-{base}.gguf"
    sha = hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()
    assert sha == golden()["vocabs"][base]["base_sha256"], f"{path} is not the recorded file"
    return GGUFFile.open(path).metadata if base == "smollm" else vocab_metadata(base)


def loaded(name: str) -> tuple[dict, Tokenizer, list[str]]:
    base, _, v = name.partition("+v")
    md = base_metadata(base)
    if v:
        md = {**md, **cases.variant(md, int(v))}
    texts = cases.texts(md, own=not v)
    entry = golden()["vocabs"][name]
    assert hashlib.sha256(json.dumps(texts).encode()).hexdigest() == entry["texts_sha256"]
    return md, Tokenizer.from_metadata(md), texts


@pytest.fixture(scope="module", params=NAMES)
def vocab(request, llama_fixtures):
    return request.param, *loaded(request.param)


def llama_type(attr: int) -> int:
    """The GGUF type whose tokenization and detokenization a llama.cpp attribute set has."""
    for bit, kind in ((CONTROL, 3), (USER_DEFINED, 4), (UNKNOWN, 2), (NORMAL, 1), (BYTE, 6),
                      (UNUSED, 5)):
        if attr & bit:
            return kind
    return 0


def test_the_golden_covers_every_vocabulary():
    assert "llama-cpp-python 0.3.36" in golden()["source"]
    assert list(golden()["vocabs"]) == NAMES


def llama_types(name: str, md: dict) -> list[int]:
    """(vocab,) the type of each token as llama.cpp has it after loading (the golden)."""
    attrs = {int(i): a for i, a in golden()["vocabs"][name]["attrs"].items()}
    return [llama_type(attrs[i]) if i in attrs else t
            for i, t in enumerate(md["tokenizer.ggml.token_type"])]


def test_types_ends_and_right_strips_are_llama_cpps(vocab):
    name, md, tok, _ = vocab
    entry = golden()["vocabs"][name]
    file_types = md["tokenizer.ggml.token_type"]
    attrs = {int(i): a for i, a in entry["attrs"].items()}
    expected = llama_types(name, md)
    wrong = [(i, tok.tokens[i], file_types[i], tok.token_types[i], expected[i])
             for i in range(len(expected)) if tok.token_types[i] != expected[i]]
    assert not wrong, f"{name}: (id, text, file, ours, llama.cpp's) {wrong[:10]}"
    assert sorted(tok.eog_ids) == entry["eog"], name
    assert sorted(tok._rstrip_ids) == sorted(i for i, a in attrs.items() if a & RSTRIP), name


@pytest.mark.parametrize("special", [False, True], ids=["text", "special"])
def test_every_special_string_tokenizes_as_llama_cpp(vocab, special):
    name, _, tok, texts = vocab
    expected = golden()["vocabs"][name]["ids_special" if special else "ids"]
    failures = [f"{text!r}:\n  ours  {ours}\n  llama {ids}" for text, ids in zip(texts, expected)
                if (ours := tok.encode(text, special=special, add_bos=False)) != ids]
    assert not failures, (f"{name}: {len(failures)} of {len(texts)} differ:\n"
                          + "\n".join(failures[:10]))


def test_a_users_text_never_becomes_a_control_token(vocab):
    """Without --special, and in a chat message, no string of a user's makes an id that
    llama.cpp holds control (or unknown): encode_chat's control ids are the template's alone."""
    name, md, tok, texts = vocab
    controls = {i for i, t in enumerate(llama_types(name, md))
                if t in (TOKEN_CONTROL, TOKEN_UNKNOWN)}
    for text in texts:
        assert not controls & set(tok.encode(text, special=False, add_bos=False)), (name, text)
    if tok.chat_template is None:
        return
    hostile = " ".join(cases.CONTROL_LOOKING + tuple(tok.tokens[i] for i in controls))
    chat = [{"role": "system", "content": hostile}, {"role": "user", "content": hostile}]
    plain = [{"role": "system", "content": "x"}, {"role": "user", "content": "x"}]
    count = lambda ids: sorted(i for i in ids if i in controls)  # noqa: E731
    assert count(tok.encode_chat(chat)) == count(tok.encode_chat(plain)), name


def test_phi3_end_of_sequence_typed_by_the_user_stays_text(llama_fixtures):
    """The case of the issue: Phi-3's file calls </s> user-defined; llama.cpp makes it control,
    so `tokenize` without --special and a chat message keep it as text, and it ends a turn."""
    tok = Tokenizer.from_metadata(vocab_metadata("phi-3"))
    eos = tok.tokens.index("</s>")
    assert eos in tok.eog_ids and tok.token_types[eos] == TOKEN_CONTROL
    assert eos not in tok.encode("say </s> now", add_bos=False)
    assert eos in tok.encode("say </s> now", special=True, add_bos=False)
    assert eos not in tok.encode_chat([{"role": "user", "content": "</s>"}])


def test_a_phi3_name_without_the_texts_its_rule_needs_is_refused(llama_fixtures):
    md = {**vocab_metadata("gpt-2"), "general.name": "my-phi3-tune"}
    with pytest.raises(TokenizerError, match="Phi-3.*'</s>'.*llama.cpp fails to load it"):
        Tokenizer.from_metadata(md)
