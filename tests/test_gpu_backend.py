"""The GPU backend's own buffers (pyspec/gpu/backend.py): an engine rebuilt around a lent GPU model
(the page's reload, or a drafter change: web.make_engine) frees what its backend made when it is
closed, and leaves the model's buffers and plans to the next engine.

Measure: the device's live buffers and their bytes (Device.live_buffers, Device.allocated), which
`buffer` adds to and `free` takes off; in the page they are what `memory()` reports. Before
close() existed each rebuild left its backend's buffers behind: 17 buffers of 107 KB a rebuild
with the n-gram drafter (the per-cycle buffers), 81 of 909 KB with a draft model (its weights,
cache and plans too), and a self:L draft left its plans in the champion's plan cache.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from conftest import requires_gpu
from pyspec.cpu.model import Model
from pyspec.engine import Engine
from pyspec.load import backend as backend_for
from pyspec.options import Options

REBUILDS = 20


@requires_gpu
@pytest.mark.parametrize("draft", ["model", "self:1", "ngram"])
def test_engines_rebuilt_around_a_lent_model_free_their_buffers(tiny, draft):
    model = tiny.on("gpu")
    dev = model.dev
    spec = tiny.close_path if draft == "model" else draft
    # Device penalties: the plans a backend builds only when a request first needs them too.
    opts = Options(max_tokens=6, repetition_penalty=1.1, k="fixed:2")   # drafts, whatever the guard

    def rebuild(close: bool = True):
        engine = Engine(backend_for(model, spec, load_draft=Model.load), tiny.tokenizer)
        result = engine.generate(tiny.prompt, opts)
        if close:
            engine.close()
        return engine, result

    _, first = rebuild()
    before = (dev.live_buffers, dev.allocated)
    results = [rebuild()[1] for _ in range(REBUILDS)]
    growth = (dev.live_buffers - before[0], dev.allocated - before[1])
    # The bound: none. After the first engine (which builds the champion's own plans, kept for
    # the next) the live buffers and bytes do not grow at all. Without close() the 20 rebuilds
    # left (1620 buffers, 18.2 MB) with the draft model, (602, 2.1 MB) with self:1, (340, 2.1 MB)
    # with n-gram.
    assert growth == (0, 0), f"{REBUILDS} rebuilt engines left {growth} (buffers, bytes)"
    # The lent model serves every engine as it served the first.
    assert all(r.tokens == first.tokens for r in results)
    assert first.stats["drafted"] > 0
    # The measure sees an engine's buffers: one left open holds some, and close frees them.
    engine, _ = rebuild(close=False)
    assert dev.live_buffers > before[0] and dev.allocated > before[1]
    engine.close()
    assert (dev.live_buffers, dev.allocated) == before


@requires_gpu
def test_prepared_plans_record_what_the_plain_loop_records(tiny, monkeypatch):
    """Natively, a plan is recorded through its Prepared raw handles (native.py); the same
    requests recorded dispatch by dispatch give the same tokens and the same cache rows."""
    from pyspec.gpu.native import NativeDevice
    model = tiny.on("gpu")
    assert isinstance(model.dev, NativeDevice)   # the tests' GPU is wgpu-py's

    def run():
        engine = Engine(backend_for(model, "self:1"), tiny.tokenizer)
        r = engine.generate(tiny.prompt, Options(max_tokens=12, k="fixed:2", stop_at_eos=False))
        rows = asyncio.run(model.read_kv(engine.kv.committed))
        engine.close()
        return r.tokens, rows

    tokens, (k_rows, v_rows) = run()
    assert model.dev._prepared_plans, "the plans went through Prepared"
    monkeypatch.setattr(NativeDevice, "_prepared", lambda self, plan: plan)
    plain_tokens, (k_plain, v_plain) = run()
    assert tokens == plain_tokens
    assert np.array_equal(k_rows, k_plain) and np.array_equal(v_rows, v_plain)


@requires_gpu
@pytest.mark.parametrize("temperature, verify", [(0.0, None), (0.9, None), (0.9, "rejection")],
                         ids=["greedy", "replay", "rejection"])
def test_the_split_rows_decode_what_one_workgroup_per_row_does(tiny, temperature, verify):
    """A GPU's per-row kernels split over each row (argmax_parts + argmax_merge, softmax_parts +
    softmax_write, sample_parts + sample_pick: sampling.py), forced on the software adapter,
    which takes one workgroup per row: the champion's choices and a draft model's (with their
    confidences) give the same tokens and the same drafts accepted, greedy, in replay and (on
    this tiny vocabulary, one part per row, so the softmax's bits agree too) under rejection;
    the parts' scratch buffers are the backend's, freed on close. (The kernels against numpy,
    rows of 1 to 48 parts: tests/test_gpu_sampling.py.)"""
    model = tiny.on("gpu")
    dev = model.dev
    opts = Options(max_tokens=16, temperature=temperature, seed=3, stop_at_eos=False,
                   k="fixed:3", verify=verify)

    def request():
        engine = Engine(backend_for(model, tiny.close_path, load_draft=Model.load,
                                    split_rows=split), tiny.tokenizer)
        result = engine.generate(tiny.prompt, opts)
        engine.close()
        return result

    runs = {}
    for split in (False, True):
        request()   # the champion's own plans, kept for the next engine
        before = (dev.live_buffers, dev.allocated)
        r = request()
        assert (dev.live_buffers, dev.allocated) == before, split
        runs[split] = (r.tokens, r.stats["drafted"], r.stats["accepted"])
    assert runs[True] == runs[False]
    assert runs[True][1] > 0


@requires_gpu
def test_peak_bytes_report_what_the_device_holds(tiny):
    """On a GPU `peak_bytes.device` is every byte the device's buffers hold (weights, caches,
    the fixed scratch), as allocated, so more than the weights and the cache the other fields
    count; the numpy engine has no device (None)."""
    model = tiny.on("gpu")
    engine = Engine(backend_for(model, "ngram"), tiny.tokenizer)
    peak = engine.generate(tiny.prompt, Options(max_tokens=6)).stats["peak_bytes"]
    assert peak["device"] == model.dev.allocated
    assert peak["device"] > peak["weights"] + peak["kv"] + peak["scratch"]
    engine.close()
    cpu = Engine(backend_for(tiny.on("cpu"), "ngram"), tiny.tokenizer)
    assert cpu.generate(tiny.prompt, Options(max_tokens=2)).stats["peak_bytes"]["device"] is None


# Requests of every cycle shape: greedy, replay, rejection (q rows on the device), and the usual
# sampling controls (on the software adapter the filters run in the host accept: the champion's
# rows come back in the cycle's one readback).
CYCLE_REQUESTS = {
    "greedy": {},
    "replay": {"temperature": 0.8, "seed": 3},
    "rejection": {"temperature": 0.8, "seed": 3, "verify": "rejection"},
    "controls": {"temperature": 0.8, "seed": 3, "repetition_penalty": 1.1, "top_p": 0.9},
}


@requires_gpu
@pytest.mark.parametrize("draft", ["model", "self:1", "ngram", "none"])
def test_every_cycle_is_one_submission_and_one_readback(tiny, draft):
    """DESIGN §7's cycle, counted at the device: after the prefill, every queue submission of a
    request is a cycle's (drafting, the champion's pass, the accept kernel and the readback's
    copy in one), and every readback is a cycle's one. A submission more is a cycle that went
    ahead and was dropped unread at the request's end, counted by `drop`. Fails if a step (a
    draft's catch-up, a q row, a penalty count, a host accept's gather) submits on its own or
    reads back twice."""
    model = tiny.on("gpu")
    dev = model.dev
    spec = tiny.close_path if draft == "model" else draft
    engine = Engine(backend_for(model, spec, load_draft=Model.load), tiny.tokenizer)
    backend = engine.backend
    marks, dropped = {}, []
    prefill, drop = backend.prefill, backend.drop

    async def counted_prefill(*args, **kw):
        await prefill(*args, **kw)
        marks["after_prefill"] = (dev.submissions, dev.readbacks)

    def counted_drop(c):
        dropped.append(c)
        drop(c)

    backend.prefill, backend.drop = counted_prefill, counted_drop
    greedy = engine.generate(tiny.prompt, Options(max_tokens=20, stop_at_eos=False)).tokens
    # ... and one that a stop id ends early, past cycles that went ahead (dropped unread)
    requests = {**CYCLE_REQUESTS, "stopped": {"stop_ids": (greedy[12],)}}
    for name, extra in requests.items():
        dropped.clear()
        opts = Options(max_tokens=20, k="fixed:2", stop_at_eos=False, **extra)
        result = engine.generate(tiny.prompt, opts)
        submissions, readbacks = marks.pop("after_prefill")
        cycles = backend.timing["cycles"]
        # (a stop id ends the text before it: it is not emitted)
        assert len(result.tokens) == (20 if name != "stopped" else greedy.index(greedy[12]))
        assert cycles >= len(result.tokens) // 3, name
        if draft != "none":
            assert result.stats["drafted"] > 0, name
        assert dev.readbacks - readbacks == cycles, name
        assert dev.submissions - submissions == cycles + len(dropped), name
    engine.close()
