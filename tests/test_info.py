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
from pyspec.cpu import memory
from pyspec.cpu.model import Config
from pyspec.formats import gguf, ggufwrite
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


def test_the_cpu_verdicts_name_the_largest_model_that_fits(monkeypatch):
    """cpu/memory.py's rule: natively float32 weights within half the memory and the cache
    within all of it; in the page all of it with the runtime within the heap. A
    verdict that does not fit names the largest parameter count that would."""
    small = info.backends(params=100_000_000, kv=1 << 20, largest=1 << 20, file_bytes=60 << 20)
    assert small["page-cpu"]["fits"]
    assert small["page-cpu"]["needs"] == 400_000_000 + (1 << 20) + info.PAGE_RUNTIME_BYTES
    big = info.backends(params=2_000_000_000, kv=1 << 20, largest=600 << 20, file_bytes=1 << 30)
    b = big["page-cpu"]
    budget = memory.float32_budget(page=True)
    assert not b["fits"] and b["largest_params"] == budget // 4
    assert f"the largest model that fits has {budget // 4 / 1e6:,.0f}M parameters" in b["why"]
    at_most = info.backends(params=budget // 4, kv=0, largest=1, file_bytes=1 << 30)
    assert at_most["page-cpu"]["fits"]
    cache = info.backends(params=budget // 4, kv=1 << 30, largest=1, file_bytes=1 << 30)
    assert not cache["page-cpu"]["fits"] and "shorter context" in cache["page-cpu"]["why"]
    host = 8 << 30
    monkeypatch.setattr(info, "memory_host", lambda: host)
    monkeypatch.setattr(memory, "memory_host", lambda: host)
    native = info.backends(params=2_000_000_000, kv=1 << 20, largest=1, file_bytes=1 << 30)["cpu"]
    assert not native["fits"] and native["largest_params"] == (host // 2) // 4
    assert native["needs"] == 8_000_000_000 + (1 << 20) and "8.00 GiB of memory" in native["why"]
    assert info.backends(params=(host // 2) // 4, kv=1 << 20, largest=1,
                         file_bytes=1 << 30)["cpu"]["fits"]


def test_a_file_pyspec_cannot_run_gets_the_loads_reason(tmp_path, tiny):
    f = GGUFFile.open(str(tiny))
    md = dict(f.metadata)
    md["general.architecture"] = "mamba"
    path = tmp_path / "mamba.gguf"
    ggufwrite.write(path, md, {})
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
    assert "missing.gguf: no such file; check the path." in capsys.readouterr().err


def header_card(path, step=64, **kw):
    """The header-only card, read as the page's worker reads it: a range grown until it parses."""
    data = path.read_bytes()
    n = step
    while True:
        try:
            return info.card_from_header(data[:n], len(data), path.name, **kw), n
        except gguf.HeaderIncompleteError as e:
            assert e.needed > n
            n = max(e.needed, 2 * n)


def test_the_header_card_equals_the_full_card(tiny, tmp_path):
    head, n = header_card(tiny)
    assert n < tiny.stat().st_size   # the tensor data was never read
    assert head == info.card(str(tiny))
    f = GGUFFile(tiny.read_bytes()[:n], "tiny", total_size=tiny.stat().st_size)
    with pytest.raises(gguf.GGUFError, match="only the header"):
        f.raw(next(iter(f.tensors)))
    # refusals agree too: a truncated file, an architecture pyspec does not run
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[:-10])
    assert header_card(cut)[0]["refusal"] == info.card(str(cut))["refusal"]
    md = dict(GGUFFile.open(str(tiny)).metadata)
    md["general.architecture"] = "mamba"
    mamba = tmp_path / "mamba.gguf"
    ggufwrite.write(mamba, md, {})
    c = header_card(mamba)[0]
    assert c == info.card(str(mamba)) and c["code"] == "bad_model"


def test_the_adapters_limits_decide_the_webgpu_verdict(tiny):
    c = info.card(str(tiny))
    largest = c["gpu_buffer"]["bytes"]
    roomy = {"maxBufferSize": 1 << 30, "maxStorageBufferBindingSize": 1 << 30}
    tight = {"maxBufferSize": 1 << 30, "maxStorageBufferBindingSize": largest - 4}
    assert header_card(tiny, limits=roomy)[0]["backends"]["webgpu"]["fits"]
    b = header_card(tiny, limits=tight)[0]["backends"]["webgpu"]
    assert not b["fits"] and b["limit"] == largest - 4 and "CPU engine" in b["why"]
    assert str(largest) in b["why"] and str(largest - 4) in b["why"]   # the numbers


def test_a_vocabulary_table_past_the_binding_limit_goes_in_row_parts(tiny):
    """The embedding is the tiny model's largest tensor; under a binding limit below it (and
    above every layer's fused weights) the card still fits: it goes in row parts."""
    c = info.card(str(tiny))
    assert c["largest_tensor"]["name"] == "token_embd.weight"
    assert c["gpu_buffer"]["bytes"] < c["largest_tensor"]["bytes"]
    split = {"maxBufferSize": 1 << 30, "maxStorageBufferBindingSize": c["gpu_buffer"]["bytes"]}
    assert header_card(tiny, limits=split)[0]["backends"]["webgpu"]["fits"]


def test_the_page_refuses_what_no_engine_here_holds(tiny, tmp_path):
    c = info.card(str(tiny))
    assert info.page_refusal(c, webgpu=True) is None
    tight = {"maxBufferSize": 64, "maxStorageBufferBindingSize": 64}
    small = header_card(tiny, limits=tight)[0]
    assert info.page_refusal(small, webgpu=True) is None            # the CPU engine holds it
    e = info.page_refusal(small, webgpu=True, backend="webgpu")
    assert e.code == "model_too_large" and "binding limit" in str(e)
    md = dict(GGUFFile.open(str(tiny)).metadata)
    md["general.architecture"] = "mamba"
    ggufwrite.write(tmp_path / "mamba.gguf", md, {})
    e = info.page_refusal(info.card(str(tmp_path / "mamba.gguf")), webgpu=True)
    assert e.code == "bad_model" and "mamba" in str(e)
