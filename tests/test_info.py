"""The model card (pyspec/apps/info.py): what a file is and what pyspec can do with it, before a load.

Its numbers come from the header (parameters, types, context) and the stated memory rule; a file
pyspec cannot run gets the same reason a load would give, and a broken file a card that says so.
"""

from __future__ import annotations

import json
import math

import pytest

from pyspec import testmodels
from pyspec.apps import info
from pyspec.cpu.model import Config
from pyspec.formats import gguf
from pyspec.formats.gguf import GGUFFile


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("info") / "tiny.gguf"
    testmodels.write_model(path)
    return path


def test_the_card_reads_the_header(tiny):
    c = info.card(str(tiny))
    f = GGUFFile.open(str(tiny))
    cfg = Config.from_metadata(f.metadata)
    assert c["runs"] and c["refusal"] is None
    assert c["architecture"] == "llama"
    assert c["parameters"] == sum(math.prod(t.shape) for t in f.tensors.values())
    assert sum(c["tensor_types"].values()) == len(f.tensors)
    assert c["context"] == cfg.context_length and c["layers"] == cfg.n_layers
    assert c["kv_bytes"] == 2 * cfg.n_layers * cfg.context_length * cfg.n_kv_heads * cfg.head_dim * 4
    assert c["template"] == "ChatML"
    # the memory rule: float32 weights on the CPU, the file's own bytes on a GPU
    assert c["backends"]["cpu"]["needs"] == 4 * c["parameters"] + c["kv_bytes"]
    assert c["backends"]["webgpu"]["needs"] == c["bytes"] + c["kv_bytes"]
    assert all(b["fits"] for b in c["backends"].values())
    text = info.render(c)
    assert "architecture  llama" in text and "page-cpu" in text


def test_a_smaller_context_shrinks_the_cache(tiny):
    assert info.card(str(tiny), ctx=64)["kv_bytes"] * 4 == info.card(str(tiny))["kv_bytes"]


def test_a_model_too_large_for_the_page_says_so():
    b = info.backends(params=2_000_000_000, kv=0, largest=600 << 20, file_bytes=1 << 30)
    assert not b["page-cpu"]["fits"]
    assert "maxStorageBufferBindingSize" in b["webgpu"]["why"]


def test_a_file_pyspec_cannot_run_gets_the_loads_reason(tmp_path, tiny):
    f = GGUFFile.open(str(tiny))
    md = dict(f.metadata)
    md["general.architecture"] = "mamba"
    path = tmp_path / "mamba.gguf"
    gguf.write(path, md, {})
    c = info.card(str(path))
    assert not c["runs"]
    assert "mamba" in c["refusal"]
    assert "cannot run it" in info.render(c)


def test_a_truncated_file_gets_a_card_that_says_so(tmp_path, tiny):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[:200])
    c = info.card(str(cut))
    assert not c["runs"] and c["refusal"]
    assert "cannot run it" in info.render(c)


def test_the_info_command_prints_the_card_and_says_by_its_status(tiny, tmp_path, capsys):
    from pyspec.apps import cli
    assert cli.main(["info", str(tiny)]) == 0
    assert "architecture  llama" in capsys.readouterr().out
    assert cli.main(["info", str(tiny), "--json", "--ctx", "64"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_context"] == 64
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[:100])
    assert cli.main(["info", str(cut)]) == 1
    assert cli.main(["info", str(tmp_path / "missing.gguf")]) == 2
    assert "no file at" in capsys.readouterr().err
