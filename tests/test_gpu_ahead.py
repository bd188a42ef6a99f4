"""A GPU draft's cycles fed on the device (pyspec/gpu/ahead.py): the Params a cycle's advance
dispatch sees are a block of a table, copied on the device, and equal what packing that cycle's
fields gives; however k and m change from cycle to cycle, the host writes the table once per
request. A draft model's tree cycles: their blocks, and the Steps advance writes from their
templates against the host's packing. The cycles themselves, end to end, in
tests/test_pipelined.py and tests/test_gpu_tree.py. Skipped where no WebGPU adapter exists."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from conftest import gpu_device
from pyspec.gpu.ahead import PARAMS_BYTES, PARAMS_WORDS, TABLE_SHAPE, DeviceFeed, pack_params
from pyspec.gpu.constants import ACCEPT_WORDS, ROWS_MAX
from pyspec.gpu.step import SLOT_BYTES

pytestmark = pytest.mark.usefixtures("gpu")   # a native adapter (root conftest.py)

CTX = 512


@pytest.fixture(scope="module")
def dev():
    return gpu_device()   # the session's native device (conftest.py)


@pytest.fixture()
def feed(dev):
    words = dev.buffer(4 * ACCEPT_WORDS, label="words")
    return DeviceFeed(dev, CTX, words, dev.buffer(4 * ROWS_MAX, label="feed"),
                      dev.buffer(4 * ROWS_MAX, label="tokens"))


def table(dev, feed) -> np.ndarray:
    """The table as the device holds it, flat."""
    n = int(np.prod(TABLE_SHAPE)) * PARAMS_WORDS
    return asyncio.run(dev.read_array(feed.table, np.uint32, (n,)))


@pytest.mark.parametrize("mode, seed, temperature", [("greedy", 7, 0.0),
                                                     ("rejection", 2**40 + 9, 0.75)])
def test_each_cycle_copies_the_params_a_write_would_have_put(dev, feed, mode, seed, temperature):
    """For every k (past the cap too), m and one-hot flag, the block the copy takes is
    pack_params of those fields (what the host wrote into the params buffer before the table),
    and it fills the whole params buffer."""
    limit = 300
    copies = {(k, m, o): feed.params_copy(k, m, limit, seed, temperature, mode, one_hot=o)
              for k in range(ROWS_MAX + 2) for m in range(ROWS_MAX + 1) for o in (False, True)}
    held = table(dev, feed)
    for (k, m, o), c in copies.items():
        assert (c.src, c.dst, c.dst_offset) == (feed.table, feed.params, 0)
        assert c.nbytes == PARAMS_BYTES == dev.size_of(feed.params)
        block = held[c.src_offset // 4:c.src_offset // 4 + PARAMS_WORDS]
        assert list(block) == list(pack_params(k, m, limit, CTX, seed, temperature, mode, o)), \
            (k, m, o)


def test_the_table_is_written_once_per_request(dev, feed):
    """k and m changing every cycle write nothing (a write costs the page a staging allocation);
    a request's fields (its budget, seed, temperature, mode) changing write the table again."""
    before = dev.writes
    feed.params_copy(3, 2, 100, 5, 0.0, "greedy", one_hot=True)
    assert dev.writes == before + 1
    for k, m in [(1, 2), (2, 1), (3, 2), (0, 2), (1, 3), (ROWS_MAX - 1, 2), (0, ROWS_MAX)]:
        feed.params_copy(k, m, 100, 5, 0.0, "greedy", one_hot=k == 0)
    assert dev.writes == before + 1
    feed.params_copy(1, 2, 100, 6, 0.0, "greedy", one_hot=True)
    assert dev.writes == before + 2


def test_a_feed_past_a_pass_is_refused(feed):
    with pytest.raises(ValueError, match="at most"):
        feed.params_copy(1, ROWS_MAX + 1, 100, 5, 0.0, "greedy", one_hot=True)


def test_a_tree_cycle_copies_the_params_of_its_depth(dev, feed):
    """A tree cycle's block (depth D, m) is pack_params of a tree D deep: its 1 + D slots from
    the template of depth D, no chain steps; written with the chains' table, once."""
    before = dev.writes
    copies = {(d, m): feed.params_copy(0, m, 300, 7, 0.5, "replay", True, tree_depth=d)
              for d in range(1, ROWS_MAX) for m in range(ROWS_MAX + 1)}
    assert dev.writes == before + 1
    held = table(dev, feed)
    for (d, m), c in copies.items():
        block = held[c.src_offset // 4:c.src_offset // 4 + PARAMS_WORDS]
        want = pack_params(0, m, 300, CTX, 7, 0.5, "replay", True, tree_depth=d)
        assert list(block) == list(want) and want[9] == d + 1, (d, m)
    with pytest.raises(ValueError, match="deep"):
        feed.params_copy(0, 2, 300, 7, 0.5, "replay", True, tree_depth=ROWS_MAX)


@pytest.mark.parametrize("m", [1, 4, 7])
def test_a_tree_cycles_steps_are_the_hosts_moved_to_its_root(dev, feed, m):
    """advance writes a tree cycle's Steps as the host path packs them (gpu/treedraft.encode,
    gpu/tree.accept) for a root at row n - 1: the template of its depth moved there and given
    the request's fields, the draft's first pass a chain of m rows at n - m."""
    from pyspec.gpu.step import STEP_WORDS, pack_step
    from pyspec.gpu.treedraft import layout, pass_steps, template
    from pyspec.rules.tree import ROOT

    shape = layout((2, 2, 1), 3, 15, 100)
    feed.trees({1: template(layout((2,), 1, 15, 100)), 3: template(shape)})
    tokens = list(range(50, 90))
    feed.start(tokens)
    dev.submit([feed.params_copy(0, m, 300, 7, 0.5, "replay", True, tree_depth=3), feed.plan])
    steps = asyncio.run(dev.read_array(feed.steps, np.uint32, (ROWS_MAX, SLOT_BYTES // 4)))
    base, fields = len(tokens) - 1, dict(seed=7, temperature=0.5, mode="replay")
    parents = [ROOT] + [p + 1 for p in shape.parents]
    want = [pack_step(len(parents), base, tree=(base, parents), **fields)]
    want += [pack_step(**step, **fields) for step in pass_steps(shape, m, base)]
    assert len(want) == 1 + len(shape.levels)
    for slot, words in enumerate(want):
        assert list(steps[slot, :STEP_WORDS]) == list(words), slot
