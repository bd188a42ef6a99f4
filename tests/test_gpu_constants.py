"""The constants Python and WGSL share have one source (pyspec/gpu/constants.py): no shader
declares its own copy, and every shader is loaded with the generated block. No GPU needed."""

from __future__ import annotations

import re

from pyspec import rng
from pyspec.gpu import constants, device, sampling, step

SHADERS = sorted(device.shader_dir().glob("*.wgsl"))


def test_no_shader_declares_a_shared_constant():
    shared = set(constants.values())
    for path in SHADERS:
        declared = set(re.findall(r"^\s*const\s+(\w+)\s*:", path.read_text(), re.M))
        assert not declared & shared, f"{path.name} declares {sorted(declared & shared)}"


def test_every_shader_gets_the_generated_block_once():
    block = constants.wgsl()
    for path in SHADERS:
        text = device.load_shader(path.stem)
        assert text.startswith(block) and text.count(block) == 1, path.name


def test_the_block_states_the_python_values():
    parsed = {name: int(value) for name, value in
              re.findall(r"^const (\w+): u32 = (\d+)u;$", constants.wgsl(), re.M)}
    assert parsed == constants.values()
    # The values the host code uses are the same objects.
    assert parsed["ROWS_MAX"] == device.ROWS_MAX
    assert parsed["WG_ROW"] == sampling.WG and parsed["ACCEPT_WORDS"] == sampling.ACCEPT_WORDS
    assert {f"MODE_{m.upper()}": v for m, v in step.MODES.items()}.items() <= parsed.items()
    assert parsed["FLAG_ONE_HOT"] == step.FLAG_ONE_HOT
    for name in ("STREAM_ACCEPT", "STREAM_RESIDUAL", "STREAM_BONUS", "STREAM_DRAFT",
                 "STREAM_GUMBEL"):
        assert parsed[name] == getattr(rng, name)
    # The accept words: tokens, tests, p and q of ROWS_MAX each after a 4-word header.
    assert parsed["ACCEPT_WORDS"] == 4 + 4 * parsed["ROWS_MAX"]


def test_shaders_use_the_names_they_are_given():
    """A literal where a shared constant belongs (a workgroup size, an accept offset) is a copy."""
    for path in SHADERS:
        text = path.read_text()
        assert not re.search(r"@workgroup_size\(\d", text), f"{path.name}: literal workgroup size"
        assert not re.search(r"out\[params\.out_offset \+ \d", text), f"{path.name}: accept offset"
