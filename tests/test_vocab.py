"""pyspec/text/vocab.py: byte strings per id, the reverse index and the intersection of two vocabularies,
on the real champion's tokenizer (its bytes must decode back to what the tokenizer writes) and on
tiny vocabularies built here."""

from pyspec import champion_path
from pyspec.formats.gguf import GGUFFile
from pyspec.text.tokenizer import Tokenizer
from pyspec.text.vocab import Vocab


def tiny(tokens, types=None):
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
          "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": [],
          "tokenizer.ggml.token_type": types or [1] * len(tokens)}
    return Tokenizer.from_metadata(md)


def test_bytes_index_and_control_tokens():
    v = Vocab(tiny(["a", "b", "<|im_end|>", "ab", "a"], [1, 1, 3, 1, 1]))
    assert v.text_bytes == [b"a", b"b", b"", b"ab", b"a"]
    assert v.is_text == [True, True, False, True, True]
    assert v.ids_of[b"a"] == [0, 4] and v.id_of(b"a") == 0
    assert v.id_of(b"<|im_end|>") is None and v.id_of(b"zz") is None


def test_shared_with_maps_each_shared_byte_string():
    here = Vocab(tiny(["x", "a", "b", "ab"]))
    there = Vocab(tiny(["ab", "b", "c"]))
    assert here.shared_with(there) == {2: 1, 3: 0}
    assert there.shared_with(here) == {0: 3, 1: 2}


def test_champion_bytes_equal_the_decoder():
    champion_tokenizer = Tokenizer.from_metadata(GGUFFile.open(champion_path()).metadata)
    v = Vocab(champion_tokenizer)
    assert v.size == champion_tokenizer.vocab_size == 49152
    for i in range(0, v.size, 97):
        assert v.text_bytes[i] == champion_tokenizer.token_bytes(i, special=False)
    assert all(v.id_of(v.text_bytes[i]) is not None for i in range(v.size) if v.is_text[i])


def test_matched_with_pairs_one_to_one_and_control_tokens_by_name():
    here = Vocab(tiny(["<|im_end|>", "a", "b", "ab", "a", "<|x|>"], [3, 1, 1, 1, 1, 3]))
    there = Vocab(tiny(["ab", "<|im_end|>", "b", "a", "c", "a"], [1, 3, 1, 1, 1, 1]))
    assert here.control_ids == {"<|im_end|>": 0, "<|x|>": 5}
    # The second "a" on either side stays unpaired; <|x|> has no partner.
    assert here.matched_with(there) == {0: 1, 1: 3, 2: 2, 3: 0}
    assert there.matched_with(here) == {1: 0, 3: 1, 2: 2, 0: 3}
