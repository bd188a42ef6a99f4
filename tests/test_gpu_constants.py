"""The constants Python and WGSL share have one source (pyspec/gpu/constants.py, and rng.py for the
stream ids): no shader declares its own copy, every shader is loaded with the generated block,
and the block states the values the Python side uses. No GPU needed."""

from __future__ import annotations

import re

import pytest

from pyspec.gpu import constants, device, ops, sampling, step
from pyspec.rules import rng

SHADERS = sorted(device.shader_dir().glob("*.wgsl"))
CONST = re.compile(r"^\s*const\s+(\w+)\s*:", re.M)


def _strip_comments(wgsl: str) -> str:
    return re.sub(r"//[^\n]*", "", wgsl)


def test_shaders_exist():
    assert {p.stem for p in SHADERS} >= {"accept", "matmul", "sample", "step"}


@pytest.mark.parametrize("path", SHADERS, ids=lambda p: p.name)
def test_no_shader_declares_a_shared_constant(path):
    declared = set(CONST.findall(_strip_comments(path.read_text())))
    copies = declared & set(constants.values())
    assert not copies, f"{path.name} declares {sorted(copies)}: use the generated constants"


@pytest.mark.parametrize("path", SHADERS, ids=lambda p: p.name)
def test_every_shader_gets_the_generated_block_once(path):
    text = device.load_shader(path.stem)
    block = constants.wgsl()
    assert text.startswith(block) and text.count(block) == 1
    # After expansion no name is declared twice (an include cannot bring back a copy either).
    declared = CONST.findall(_strip_comments(text))
    assert len(declared) == len(set(declared)), sorted(n for n in declared if declared.count(n) > 1)


def test_the_block_states_the_python_values():
    parsed = {name: int(value, 0) for name, value in
              re.findall(r"^const (\w+): u32 = (\w+?)u;", constants.wgsl(), re.M)}
    expected = {
        "ROWS_MAX": device.ROWS_MAX, "WG": ops.WG, "MATMUL_OUTS": ops.MATMUL_OUTS,
        "WG_ROW": sampling.WG_ROW, "RNG_FILL_WG": sampling.RNG_FILL_WG, "NONE": sampling.NONE,
        "ARGMAX_CHUNK": sampling.ARGMAX_CHUNK,
        "ATTN_WG": ops.ATTN_WG, "ATTN_WG_CPU": ops.ATTN_WG_CPU,
        "FLAG_ONE_HOT": step.FLAG_ONE_HOT, "FLAG_TREE": step.FLAG_TREE,
        "TREE_NO_PARENT": step.TREE_NO_PARENT,
        "MODE_GREEDY": step.MODES["greedy"], "MODE_REPLAY": step.MODES["replay"],
        "MODE_REJECTION": step.MODES["rejection"],
        **{f"KIND_{kind.upper()}": code for kind, code in ops.BLOCK_KINDS.items()},
        "STREAM_ACCEPT": rng.STREAM_ACCEPT, "STREAM_RESIDUAL": rng.STREAM_RESIDUAL,
        "STREAM_BONUS": rng.STREAM_BONUS, "STREAM_DRAFT": rng.STREAM_DRAFT,
        "STREAM_GUMBEL": rng.STREAM_GUMBEL,
    }
    expected |= {name: getattr(sampling, name) for name in dir(sampling)
                 if name.startswith(("ACCEPT_", "HOW_"))}
    assert parsed == expected == constants.values()
    # The values the kernels were written for (a change here is a change of every kernel).
    assert (parsed["ROWS_MAX"], parsed["WG"], parsed["WG_ROW"], parsed["MATMUL_OUTS"]) == \
        (16, 64, 128, 4)
    assert parsed["NONE"] == 0xFFFFFFFF
    # The accept words: a 4-word header, then tokens, tests, p and q of ROWS_MAX words each.
    starts = [parsed[n] for n in ("ACCEPT_TOKENS", "ACCEPT_TESTS", "ACCEPT_P", "ACCEPT_Q",
                                  "ACCEPT_WORDS")]
    assert starts == [4 + i * parsed["ROWS_MAX"] for i in range(5)]
    assert sampling.HOW.keys() == {parsed[n] for n in parsed if n.startswith("HOW_")}


def test_a_value_that_is_not_u32_is_refused(monkeypatch):
    monkeypatch.setattr(constants, "NONE", -1)
    with pytest.raises(ValueError, match="NONE = -1"):
        constants.wgsl()


@pytest.mark.parametrize("path", SHADERS, ids=lambda p: p.name)
def test_shaders_use_the_names_they_are_given(path):
    """A literal where a shared constant belongs (a workgroup size, an accept offset) is a copy."""
    text = _strip_comments(path.read_text())
    assert not re.search(r"@workgroup_size\(\s*\d", text), "literal workgroup size"
    assert not re.search(r"out\[params\.out_offset \+ \d", text), "literal accept offset"
    assert not re.search(r"mode\s*[!=]=\s*\d", text), "literal verify mode"
    assert not re.search(r"\bhow = \d", text), "literal accept `how`"
