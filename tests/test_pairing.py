"""Champion/draft pairing (pyspec/drafters/pairing.py): the three classes, found from the GGUFs alone, and the
pairs that no exact bridge can serve. The expected intersections are counted here from the
token lists, independently of vocab.py."""

from __future__ import annotations

import numpy as np
import pytest

from pyspec import testmodels
from pyspec.drafters.pairing import IncompatiblePairError, check_pair
from pyspec.formats.gguf import GGUFFile
from pyspec.text.bpe import token_bytes


def metadata(path):
    return GGUFFile.open(path).metadata


def token_keys(md) -> set:
    """What identifies each token across vocabularies: its bytes (text) or its name (control)."""
    keys = set()
    for text, kind in zip(md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]):
        keys.add(("name", text) if kind == 3 else ("bytes", token_bytes(text, kind, False)))
    return keys


def test_same_tokenizer_is_identical(tiny):
    report = check_pair(metadata(tiny.champion_path), metadata(tiny.far_path))
    assert report.ok and not report.reasons and report.kind == "identical"
    assert report.bridge is None and report.describe().startswith("compatible: identical")
    report.raise_if_bad()


def test_renamed_ids_are_an_id_map(tiny, foreign):
    report = check_pair(metadata(tiny.champion_path), metadata(foreign.perm_path))
    assert report.ok and report.kind == "idmap", report.reasons
    b = report.bridge
    assert b.size == tiny.tokenizer.vocab_size and b.share == 1.0 and b.same_segmentation
    assert sorted(b.to_draft) == list(range(b.size)), "a permutation of every id"
    assert not np.array_equal(b.to_draft, np.arange(b.size))
    assert "id map" in report.describe()


def test_other_vocabulary_is_a_token_level_intersection(tiny, foreign):
    champion_md, draft_md = metadata(tiny.champion_path), metadata(foreign.tli_path)
    champion_keys, draft_keys = token_keys(champion_md), token_keys(draft_md)
    assert champion_keys - draft_keys and draft_keys - champion_keys, "extra and missing tokens"
    report = check_pair(champion_md, draft_md)
    assert report.ok and report.kind == "tli", report.reasons
    assert report.bridge.size == len(champion_keys & draft_keys)
    assert f"intersection of {report.bridge.size} tokens" in report.describe()
    assert report.to_json()["shared_tokens"] == report.bridge.size
    assert 0 < report.to_json()["share"] < 1


def test_other_merges_over_the_same_tokens_are_re_encoded(tiny):
    """Every token pairs (an id map) but the merges rank differently: the draft cuts text its
    own way, so its context is re-encoded, not translated."""
    champion_md = metadata(tiny.champion_path)
    md = testmodels.tokenizer_metadata()
    md["tokenizer.ggml.merges"] = md["tokenizer.ggml.merges"][::-1]
    report = check_pair(champion_md, {**champion_md, **md})
    assert report.ok and report.kind == "idmap" and not report.bridge.same_segmentation
    assert "re-encoded" in report.describe()


def test_a_different_template_is_reported_not_refused(tiny):
    """The champion's template renders the prompt; the draft's is never used (speed only)."""
    champion_md = metadata(tiny.champion_path)
    report = check_pair(champion_md, {**champion_md, "tokenizer.chat_template": "{{ messages }}"})
    assert report.ok and report.kind == "identical"
    assert any("chat templates differ" in n for n in report.notes)


def test_an_unknown_pre_tokenizer_only_shapes_the_drafts_view(tiny):
    champion_md = metadata(tiny.champion_path)
    report = check_pair(champion_md, {**champion_md, "tokenizer.ggml.pre": "falcon"})
    assert report.ok and report.kind == "idmap" and not report.bridge.same_segmentation
    assert any("'falcon' is read as 'smollm'" in n for n in report.notes)


def test_a_known_pre_tokenizer_of_another_family_is_read_as_itself(tiny):
    """qwen2 and llama-bpe drafts are read with their own split: same tokens, other cuts."""
    champion_md = metadata(tiny.champion_path)
    for pre in ("qwen2", "llama-bpe", "gpt-2"):
        report = check_pair(champion_md, {**champion_md, "tokenizer.ggml.pre": pre})
        assert report.ok and report.kind == "idmap" and not report.bridge.same_segmentation
        assert not any("is read as" in n for n in report.notes)
        assert any(f"byte-level BPE ({pre})" in n for n in report.notes)


def test_the_same_family_at_another_size_shares_ids(tiny):
    champion_md = metadata(tiny.champion_path)
    draft_md = metadata(tiny.far_path)
    report = check_pair(champion_md, draft_md)
    assert report.ok and report.kind == "identical"
    note = next(n for n in report.notes if "one tokenizer" in n)
    assert "the same family (llama)" in note and "shared ids" in note


def test_a_sentencepiece_draft_for_a_bpe_champion_is_bridged_by_bytes(tiny):
    """Gemma 3's tokenizer settings against the byte-level BPE champion: their byte strings
    meet (a piece "▁the" is the bytes " the"), so the pair is a token-level intersection."""
    champion_md = metadata(tiny.champion_path)
    gemma = testmodels.gemma3_tokenizer_metadata()
    draft_md = {**champion_md, **gemma, "llama.vocab_size": len(gemma["tokenizer.ggml.tokens"])}
    report = check_pair(champion_md, draft_md)
    assert report.ok and report.kind == "tli", report.reasons
    assert 0 < report.bridge.size < len(gemma["tokenizer.ggml.tokens"])
    assert any("SentencePiece-style" in n and "byte strings" in n for n in report.notes)


@pytest.mark.parametrize("change, reason", [
    ({"tokenizer.ggml.model": "llama"}, "a tokenizer cannot be read"),
    ({"llama.vocab_size": 999}, "the draft's output head has 999 rows but its tokenizer 323"),
    ({"tokenizer.ggml.tokens": [f"zq{i}" for i in range(323)], "tokenizer.ggml.merges": [],
      "tokenizer.ggml.token_type": [1] * 323}, "share no token"),
], ids=["unreadable", "head", "disjoint"])
def test_pairs_without_an_exact_bridge_are_refused_with_the_reason(tiny, change, reason):
    champion_md = metadata(tiny.champion_path)
    report = check_pair(champion_md, {**champion_md, **change})
    assert not report.ok and report.kind is None
    assert any(reason in r for r in report.reasons), report.reasons
    assert report.describe().startswith("NOT compatible")
    with pytest.raises(IncompatiblePairError, match="ngram") as e:
        report.raise_if_bad()
    assert e.value.code == "incompatible_draft"
