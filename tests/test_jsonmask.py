"""pyspec/rules/jsonmask.py: token masks against brute force (every token's bytes run through the
grammar), the forced-token rule, the constraint's incremental states, on a tiny vocabulary with
JSON punctuation merges and on the real champion's vocabulary."""

from __future__ import annotations

import random

import numpy as np
import pytest
from test_jsonschema import SCHEMAS, dump, sample

from pyspec import champion_path
from pyspec.formats.gguf import GGUFFile
from pyspec.rules.jsonmask import Constraint, JsonMask, Masker
from pyspec.rules.jsonschema import compile_schema
from pyspec.testmodels import tokenizer_metadata
from pyspec.text.tokenizer import Tokenizer
from pyspec.text.vocab import Vocab

JSON_CORPUS = ('{"name":"Ann","age":31,"tags":["red","blue"],"ok":true,"x":null}\n'
               '[{"sku":"A1","qty":2},{"sku":"B22","qty":10}] {"city":"Paris","temp_c":-1.5}\n'
               "the cat sat on the mat. ") * 3


def json_tokenizer() -> Tokenizer:
    return Tokenizer.from_metadata(tokenizer_metadata(n_merges=120, corpus=JSON_CORPUS))


@pytest.fixture(scope="module")
def tiny_vocab():
    tok = json_tokenizer()
    return tok, Vocab(tok)


@pytest.fixture(scope="module")
def champion_vocab():
    tok = Tokenizer.from_metadata(GGUFFile.open(champion_path()).metadata)
    return tok, Vocab(tok)


def brute_force(masker: Masker, state) -> set[int]:
    """The tokens whose bytes fit from `state` (EOS when complete), then the forced-token rule."""
    g, vocab = masker.grammar, masker.vocab
    forced = g.forced(state)
    if forced:
        return {next(vocab.id_of(forced[:n]) for n in range(len(forced), 0, -1)
                     if vocab.id_of(forced[:n]) is not None)}
    return {t for t in range(vocab.size) if masker.advance(state, t) is not None}


def states_along(masker: Masker, schema: dict, seed: int, n_docs: int):
    """Grammar states after every byte-prefix of random documents of the schema."""
    r = random.Random(seed)
    for _ in range(n_docs):
        state = masker.initial()
        yield state
        for b in dump(sample(schema, r)):
            state = masker.grammar.step(state, b)
            yield state


@pytest.mark.parametrize("name", SCHEMAS)
def test_masks_equal_brute_force_on_a_tiny_vocabulary(tiny_vocab, name):
    tok, vocab = tiny_vocab
    masker = Masker(compile_schema(SCHEMAS[name]), vocab, tok.eos_id)
    for state in states_along(masker, SCHEMAS[name], seed=1, n_docs=6):
        m = masker.mask(state)
        want = brute_force(masker, state)
        assert set(np.flatnonzero(m.dense(vocab.size)).tolist()) == want
        assert m.count == len(want) and (m.forced is not None) == (len(want) == 1)


@pytest.mark.parametrize("name", ["order", "tags", "nested"])
def test_masks_equal_brute_force_on_the_champion_vocabulary(champion_vocab, name):
    tok, vocab = champion_vocab
    masker = Masker(compile_schema(SCHEMAS[name]), vocab, tok.eos_id)
    states = list(states_along(masker, SCHEMAS[name], seed=2, n_docs=1))
    for state in random.Random(0).sample(states, min(8, len(states))):
        m = masker.mask(state)
        assert set(np.flatnonzero(m.dense(vocab.size)).tolist()) == brute_force(masker, state)


def test_forced_tokens_are_the_longest_prefix_and_eos_ends(champion_vocab):
    tok, vocab = champion_vocab
    masker = Masker(compile_schema(SCHEMAS["order"]), vocab, tok.eos_id)
    c = Constraint(masker, prompt_len=0)
    written = []
    for _ in range(3):   # {"  id  ":
        m = masker.mask(c.state_after(written))
        assert m.forced is not None
        written.append(m.forced)
    assert b"".join(vocab.text_bytes[t] for t in written) == b'{"id":'
    text = b'12,"items":[],"paid":true}'
    ids = tok.encode(text.decode())
    assert c.state_after(written + ids) is not None
    assert masker.mask(c.state_after(written + ids)).forced == tok.eos_id
    assert c.state_after(written + ids + [tok.eos_id]) is c.done
    assert c.state_after(written + ids[:-1] + [tok.eos_id]) is None   # EOS before the end


def test_constraint_follows_diverging_paths_and_the_processor_masks_rows(tiny_vocab):
    tok, vocab = tiny_vocab
    masker = Masker(compile_schema(SCHEMAS["person"]), vocab, tok.eos_id)
    c = Constraint(masker, prompt_len=2)
    a = tok.encode('{"name":"Ann","age":3}')
    b = tok.encode('{"name":"Bo","age":44}')
    for ids in (a, b, a[:4], b):   # the kept path is cut where a later call diverges
        fresh = Constraint(masker, prompt_len=2)
        assert c.state_after(ids) == fresh.state_after(ids)
    logits = np.random.default_rng(0).standard_normal((3, vocab.size))   # (r, vocab)
    prefix = [7, 7] + b[:2]
    out = JsonMask(c).apply(logits, prefix, b[2:4])
    for i in range(3):
        allowed = masker.mask(c.state_after(b[:2 + i])).dense(vocab.size)
        assert np.array_equal(np.isfinite(out[i]), allowed)
        assert np.array_equal(out[i][allowed], logits[i][allowed])


def test_sorted_bytes_ranges_are_the_tokens_with_a_prefix(tiny_vocab):
    _, vocab = tiny_vocab
    index = vocab.sorted()
    assert index.keys == sorted(index.keys) and len(index.keys) == len(index.ids)
    for prefix in (b"", b"t", b"th", b'"', b'":', b"\xff", b"zzz", b"{\""):
        start, end = index.range_of(prefix)
        want = sorted(i for i, b in enumerate(vocab.text_bytes)
                      if vocab.is_text[i] and b and b.startswith(prefix))
        assert sorted(index.ids[start:end]) == want, prefix
