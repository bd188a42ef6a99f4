"""Champion/draft pairing checks (pyspec/compat.py)."""

from __future__ import annotations

import pytest

from pyspec import testmodels
from pyspec.compat import IncompatiblePairError, check_pair
from pyspec.gguf import GGUFFile


def metadata(path):
    return GGUFFile.open(path).metadata


def test_same_tokenizer_is_compatible(tiny):
    report = check_pair(metadata(tiny.champion_path), metadata(tiny.far_path))
    assert report.ok and not report.reasons
    report.raise_if_bad()


@pytest.mark.parametrize("change,reason", [
    ({"n_merges": 40}, "tokenizer vocabularies differ"),
    ({"template": "{{ messages }}"}, "chat templates differ"),
    ({"swap_merge": True}, "tokenizers differ"),
])
def test_mismatches_are_refused_with_the_reason(tiny, tmp_path, change, reason):
    md = testmodels.tokenizer_metadata(change.get("n_merges", 64))
    if "template" in change:
        md["tokenizer.chat_template"] = change["template"]
    if change.get("swap_merge"):
        md["tokenizer.ggml.merges"] = md["tokenizer.ggml.merges"][::-1]
    path = tmp_path / "draft.gguf"
    testmodels.write_model(path, tokenizer=md, seed=5)
    report = check_pair(metadata(tiny.champion_path), metadata(path))
    assert not report.ok and any(reason in r for r in report.reasons), report.reasons
    with pytest.raises(IncompatiblePairError, match="ngram"):
        report.raise_if_bad()
