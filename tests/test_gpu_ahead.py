"""A GPU draft's cycles fed on the device (pyspec/gpu/ahead.py): the Params a cycle's advance
dispatch sees are a block of a table, copied on the device, and equal what packing that cycle's
fields gives; however k and m change from cycle to cycle, the host writes the table once per
request. The cycles themselves, end to end, in tests/test_pipelined.py. Skipped where no WebGPU
adapter exists."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from conftest import gpu_device
from pyspec.gpu.ahead import PARAMS_BYTES, PARAMS_WORDS, TABLE_SHAPE, DeviceFeed, pack_params
from pyspec.gpu.constants import ACCEPT_WORDS, ROWS_MAX

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
