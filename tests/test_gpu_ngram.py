"""The n-gram drafter on the device (shaders/ngram.wgsl, pyspec/gpu/ngram.py) against the host's
(drafters/ngram.py): for the same tokens it proposes the same drafts, appends the cycle before's
emitted tokens to its history, caps the drafts at the budget and the context, and writes the
pass's token list and Step. Its Params are a block of a table, copied on the device: the fields
a write would have put, the table written once per request. Skipped where no WebGPU adapter
exists."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from conftest import gpu_device
from pyspec.drafters.ngram import NgramDrafter
from pyspec.gpu import sampling
from pyspec.gpu.constants import (
    ACCEPT_N_ACCEPTED,
    ACCEPT_TOKENS,
    ACCEPT_WORDS,
    FLAG_ONE_HOT,
)
from pyspec.gpu.device import ROWS_MAX
from pyspec.gpu.ngram import (
    PARAMS_BYTES,
    PARAMS_WORDS,
    STATE_WORDS,
    STEP_OFFSET,
    DeviceNgram,
    pack_params,
)
from pyspec.gpu.step import MODES, STEP_WORDS, pack_step

pytestmark = pytest.mark.usefixtures("gpu")   # a native adapter (root conftest.py)

CTX = 512


@pytest.fixture(scope="module")
def dev():
    return gpu_device()   # the session's native device (conftest.py)


@pytest.fixture(scope="module")
def lookup(dev):
    words = dev.buffer(4 * ACCEPT_WORDS, label="words")
    tokens = dev.buffer(4 * ROWS_MAX, label="tokens")
    return DeviceNgram(dev, CTX, words, tokens), words, tokens


def advance(dev, lookup, k_cap: int, limit: int = 10**6, seed: int = 7, temperature=0.0,
            mode="greedy") -> tuple[list[int], np.ndarray, int]:
    """One advance dispatch: (the pass's drafts, its Step words, the history's length)."""
    ng, words, tokens = lookup
    dev.submit([ng.params_copy(k_cap, limit, seed, temperature, mode), ng.plan])
    row = asyncio.run(dev.read_array(tokens, np.uint32, (ROWS_MAX,)))
    state = asyncio.run(dev.read_array(ng.state, np.uint32, (STATE_WORDS,)))
    step = state[STEP_OFFSET // 4:STEP_OFFSET // 4 + STEP_WORDS]
    k = int(step[5])
    return [int(t) for t in row[:k + 1]], step, int(state[0])


def sequences():
    """Token lists where suffixes recur at several lengths, and some where none does."""
    rnd = random.Random(3)
    out = [[5], [5, 5], [1, 2, 3], [1, 2, 1], [4, 4, 4, 4, 4], [9, 8, 7, 9, 8, 7, 9, 8]]
    for _ in range(60):
        alphabet = rnd.choice([2, 3, 5, 40, 50_000])
        n = rnd.choice([2, 7, 30, 200, CTX - ROWS_MAX])   # room for every k after it
        out.append([rnd.randrange(alphabet) for _ in range(n)])
    return out


def test_it_proposes_what_the_host_drafter_proposes(dev, lookup):
    ng = lookup[0]
    checked = 0
    for seq in sequences():
        for k in (1, 4, ROWS_MAX - 1):
            ng.start(seq)
            row, step, n = advance(dev, lookup, k)
            expected = NgramDrafter().preview(seq, k)
            assert row == [seq[-1]] + expected, (seq[-12:], k)
            assert n == len(seq)
            assert list(step) == list(pack_step(len(expected) + 1, len(seq) - 1, 7, 0.0,
                                                len(expected), "greedy", one_hot=True))
            checked += bool(expected)
    assert checked > 100   # most cases drafted something


def test_it_appends_the_tokens_the_cycle_before_emitted(dev, lookup):
    """After a fresh start, each advance appends the words' n_accepted + 1 tokens, then looks
    up in the longer history: the same as the host drafter on the host's tokens."""
    ng, words, _ = lookup
    rnd = random.Random(11)
    seq = [rnd.randrange(6) for _ in range(40)]
    ng.start(seq)
    advance(dev, lookup, 4)
    for _ in range(20):
        emitted = [rnd.randrange(6) for _ in range(rnd.randrange(1, 6))]
        w = np.full(ACCEPT_WORDS, sampling.NONE, np.uint32)
        w[ACCEPT_N_ACCEPTED] = len(emitted) - 1
        w[ACCEPT_TOKENS:ACCEPT_TOKENS + len(emitted)] = emitted
        dev.write(words, w)
        seq += emitted
        row, step, n = advance(dev, lookup, 5)
        assert n == len(seq)
        assert row == [seq[-1]] + NgramDrafter().preview(seq, 5)
        assert step[1] == len(seq) - 1


def test_the_drafts_stop_at_the_budget_and_the_context(dev, lookup):
    """k + 1 emitted tokens never pass `limit` (prompt + max_tokens), and the pass's rows never
    pass the cache's last position."""
    ng = lookup[0]
    seq = list(range(12)) * 4                      # the lookup finds 12 tokens to copy
    for limit, k in [(len(seq) + 1, 0), (len(seq) + 3, 2), (len(seq) + 40, 8)]:
        ng.start(seq)
        row, _, _ = advance(dev, lookup, 8, limit=limit)
        assert len(row) - 1 == k
    near = [1, 2, 3, 4] * (CTX // 4 - 1) + [1, 2]   # CTX - 2 tokens: 2 rows left
    ng.start(near)
    row, step, _ = advance(dev, lookup, 8)
    assert len(row) - 1 == 2 and step[1] + step[0] - 1 <= CTX - 1


def test_the_step_carries_the_request(dev, lookup):
    ng = lookup[0]
    ng.start([3, 1, 3])
    _, step, _ = advance(dev, lookup, 4, seed=2**40 + 9, temperature=0.75, mode="rejection")
    assert step[2] == 9 and step[3] == 2**8
    assert step[4] == np.float32(0.75).view(np.uint32)
    assert step[6] == MODES["rejection"] and step[7] == FLAG_ONE_HOT


def advance_tree(dev, lookup, k_cap: int, widths, nodes: int, limit: int = 10**6):
    """One advance_tree dispatch: (the tree drafted, depth-first, its Step words)."""
    from pyspec.rules.tree import ROOT, depth_first_order, reorder

    ng, words, tokens = lookup
    params = ng.params_copy(k_cap, limit, 7, 0.0, "greedy", tree=(widths, nodes))
    dev.submit([params, ng.tree_plan])
    row = asyncio.run(dev.read_array(tokens, np.uint32, (ROWS_MAX,)))
    state = asyncio.run(dev.read_array(ng.state, np.uint32, (STATE_WORDS,)))
    step = state[STEP_OFFSET // 4:STEP_OFFSET // 4 + STEP_WORDS]
    n_nodes = int(step[0]) - 1
    table = step[12:12 + 1 + n_nodes]
    parents = [ROOT if (w >> 16) == 0 else int(w >> 16) - 1 for w in table[1:]]
    assert [int(w & 0xFFFF) for w in table[1:]] == [
        1 if p == ROOT else int(table[1 + p] & 0xFFFF) + 1 for p in parents]
    return reorder(row[1:1 + n_nodes], parents, depth_first_order(parents)), step, int(row[0])


@pytest.mark.parametrize("shape", [(2, 2, 1), "auto", (3, 1), (1, 1, 1, 1, 1)])
def test_its_trees_are_the_hosts(dev, shape):
    """advance_tree drafts drafters/tree.ngram_tree's tree for the same tokens (its widths, its
    node cap in the order nodes are added, the depth the cycle asks), in a tree Step rooted at
    row n - 1; at the budget a tree is no deeper than the tokens it may emit less one."""
    from pyspec.drafters.tree import ngram_tree, ngram_widths
    from pyspec.gpu.constants import FLAG_TREE

    words = dev.buffer(4 * ACCEPT_WORDS, label="words")
    tokens = dev.buffer(4 * ROWS_MAX, label="tokens")
    lookup = (DeviceNgram(dev, CTX, words, tokens), words, tokens)
    widths, trees = ngram_widths(shape), 0
    for seq in sequences()[::3]:
        for k, nodes in ((3, 15), (ROWS_MAX - 1, 15), (4, 5)):
            lookup[0].start(seq)
            tree, step, root = advance_tree(dev, lookup, k, widths, nodes)
            host = ngram_tree(seq, shape, k, max_nodes=nodes).tree
            assert tree == host, (seq[-12:], k, nodes)
            assert root == seq[-1] and step[1] == step[8] == len(seq) - 1
            assert bool(step[7] & FLAG_TREE) == (len(host) > 0)
            trees += len(host) > 1
    assert trees > 20
    seq = list(range(6)) * 5                          # every depth is there to take
    lookup[0].start(seq)
    tree, _, _ = advance_tree(dev, lookup, 8, widths, 15, limit=len(seq) + 2)
    assert int(tree.depths().max()) == 1              # 2 tokens left: one draft and its bonus


def test_each_cycle_copies_the_params_a_write_would_have_put(dev, lookup):
    """For every k (past the cap too), a chain's and a tree's, the block the copy takes is
    pack_params of the cycle's fields (what the host wrote into the params buffer before the
    table), and it fills the whole params buffer."""
    ng, tree = lookup[0], ((2, 2, 1), 9)
    for mode, seed, temperature in (("greedy", 7, 0.0), ("rejection", 2**40 + 9, 0.75)):
        ng.expect_tree(tree)
        copies = {(k, t): ng.params_copy(k, 300, seed, temperature, mode, tree=t)
                  for k in range(ROWS_MAX + 2) for t in (None, tree)}
        held = asyncio.run(dev.read_array(ng.table, np.uint32, (2 * ROWS_MAX * PARAMS_WORDS,)))
        for (k, t), c in copies.items():
            assert (c.src, c.dst, c.dst_offset) == (ng.table, ng.params, 0)
            assert c.nbytes == PARAMS_BYTES == dev.size_of(ng.params)
            block = held[c.src_offset // 4:c.src_offset // 4 + PARAMS_WORDS]
            assert list(block) == list(pack_params(k, 300, CTX, seed, temperature, mode,
                                                   *(t or ()))), (k, t)


def test_the_table_is_written_once_per_request(dev, lookup):
    """k changing every cycle, and chains and trees taking turns, write nothing once the
    request's tree is expected (a write costs the page a staging allocation); a request's fields
    changing write the table again."""
    ng, tree = lookup[0], ((2, 2), 6)
    ng.expect_tree(tree)
    before = dev.writes
    ng.params_copy(3, 100, 5, 0.0, "greedy")
    for k in (1, 2, 3, 1, 0, ROWS_MAX - 1, 2):
        ng.params_copy(k, 100, 5, 0.0, "greedy", tree=tree if k % 2 else None)
    assert dev.writes == before + 1
    ng.params_copy(1, 101, 5, 0.0, "greedy")
    assert dev.writes == before + 2
