"""A champion-only cycle's Step copied on the device (pyspec/gpu/after.py): the slot its copies
put is the one the host would have written (Steps.upload) at every position, the template is
written once per request, and a champion-only decode of many cycles, going ahead
(gpu/backend.submit_after), writes nothing from the host after its first cycle, greedy and
sampled, with the tokens of the same request read cycle by cycle and of the numpy engine.
Skipped where no WebGPU adapter exists."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from conftest import gpu_device, greedy_pick, reference_decode
from pyspec.engine import Engine
from pyspec.gpu.after import StepTemplate
from pyspec.gpu.step import SLOT_BYTES, STEP_WORDS, Steps
from pyspec.load import backend as backend_for
from pyspec.options import Options

pytestmark = pytest.mark.usefixtures("gpu")   # a native adapter (root conftest.py)

CAPACITY = 300
SLOT = 1   # a slot other than the first: the copies land at its offset


@pytest.fixture(scope="module")
def dev():
    return gpu_device()   # the session's native device (conftest.py)


def readable_steps(dev) -> Steps:
    """Step slots in a storage buffer (a uniform one cannot be read back), the slots beyond
    SLOT filled with a pattern nothing may overwrite."""
    steps = Steps(dev, SLOT + 2)
    steps.buffer = dev.buffer(steps.n * SLOT_BYTES, label="steps (readable)")
    dev.write(steps.buffer, np.full(steps.n * SLOT_BYTES // 4, 0xA5A5A5A5, np.uint32))
    return steps


def held(dev, steps) -> np.ndarray:
    return asyncio.run(dev.read_array(steps.buffer, np.uint32, (steps.n, SLOT_BYTES // 4)))


@pytest.mark.parametrize("mode, seed, temperature", [("greedy", 0, 0.0), ("replay", 5, 0.9),
                                                     ("rejection", 2**40 + 9, 0.75)])
def test_the_copies_put_the_slot_the_host_would_have_written(dev, mode, seed, temperature):
    """At each position (the table's first and last too), the Step a kernel binds after the
    copies equals the one Steps.upload writes for the same fields, and nothing past it (the
    slot's padding, the next slot) is touched."""
    written, copied = readable_steps(dev), readable_steps(dev)
    template = StepTemplate(dev, copied, SLOT, CAPACITY)
    for pos in (0, 1, 2, 17, 200, CAPACITY - 1):
        fields = dict(rows=1, pos=pos, seed=seed, temperature=temperature, n_draft=0, mode=mode,
                      one_hot=True)
        written.set(SLOT, **fields)
        written.upload(SLOT + 1)
        copied.set(SLOT, **fields)
        dev.submit(template.copies(pos))
        want, got = held(dev, written), held(dev, copied)
        assert got[SLOT, :STEP_WORDS].tolist() == want[SLOT, :STEP_WORDS].tolist(), pos
        assert (got[SLOT, STEP_WORDS:] == 0xA5A5A5A5).all() and (got[SLOT + 1] == 0xA5A5A5A5).all()


def test_the_template_is_written_once_per_request(dev):
    """A position changing every cycle writes nothing; the request's fields changing write the
    template again; a position past the table is refused."""
    steps = readable_steps(dev)
    template = StepTemplate(dev, steps, SLOT, CAPACITY)
    before = dev.writes
    for pos in range(40):
        steps.set(SLOT, rows=1, pos=pos, seed=3, temperature=0.5, mode="replay", one_hot=True)
        template.copies(pos)
    assert dev.writes == before + 1
    steps.set(SLOT, rows=1, pos=40, seed=4, temperature=0.5, mode="replay", one_hot=True)
    template.copies(40)
    assert dev.writes == before + 2
    with pytest.raises(ValueError, match="past"):
        template.copies(CAPACITY)


def decode(engine: Engine, prompt: list[int], opts: Options) -> tuple[list, list, int]:
    """(the tokens; per cycle, whether it went ahead and the host writes since the cycle
    before was submitted, up to its own submission included; the request's host writes)."""
    b = engine.backend
    dev, submit, cycles = b.dev, b.submit, []
    marks = [dev.writes]

    def submitting(rec):
        ahead = rec.ahead
        out = submit(rec)
        cycles.append((ahead, dev.writes - marks[-1]))
        marks.append(dev.writes)
        return out

    b.submit = submitting
    try:
        tokens = engine.generate(prompt, opts).tokens
    finally:
        del b.submit
    return tokens, cycles, dev.writes - marks[0]


SAMPLED = [{}, {"temperature": 0.9, "seed": 5},
           {"temperature": 0.9, "seed": 5, "verify": "rejection"}]


@pytest.mark.parametrize("more", SAMPLED, ids=["greedy", "replay", "rejection"])
def test_a_champion_only_decode_writes_nothing_per_cycle(tiny, more):
    """A request of 40 champion-only cycles, all but the first gone ahead, writes nothing from
    the host between its cycles' submissions, and no more in all than a request of 12: its
    position comes from a table on the device, not a write of its Step. Its tokens are those of
    the same request read cycle by cycle and of the numpy engine (and greedy, of the plainest
    decode)."""
    engine = Engine(backend_for(tiny.on("gpu"), "none"), tiny.tokenizer)
    short, long = (Options(max_tokens=n, stop_at_eos=False, **more) for n in (12, 40))
    engine.generate(tiny.prompt, long)   # plans and pipelines built, the cache's prefix kept
    tokens, cycles, writes = decode(engine, tiny.prompt, long)
    _, _, writes_short = decode(engine, tiny.prompt, short)
    assert len(cycles) == 40 and [a for a, _ in cycles] == [False] + [True] * 39, cycles
    # Between two cycles going ahead the host writes nothing (the first cycle's input token
    # comes from the host, as does the template at a request's first champion-only cycle).
    assert [w for a, w in cycles if a] == [0] * 39, cycles
    assert writes == writes_short, (writes, writes_short)
    unpipelined = Engine(backend_for(tiny.on("gpu"), "none", pipelined=False), tiny.tokenizer)
    numpy = Engine(backend_for(tiny.on("cpu"), "none"), tiny.tokenizer)
    assert tokens == unpipelined.generate(tiny.prompt, long).tokens
    assert tokens == numpy.generate(tiny.prompt, long).tokens
    if not more:
        assert tokens == reference_decode(tiny.champion, tiny.prompt, 40, greedy_pick)
