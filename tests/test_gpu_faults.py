"""A lost device natively (wgpu-py; lavapipe on CI): classified as device_lost, then recovered.

wgpu-py reports a call on a destroyed device as a GPUValidationError ("Parent device is lost");
gpu/native.py turns every such error into DeviceLostError, so the engine's `recover` finishes the
request on the numpy champion from the committed tokens (DESIGN §8). The oracle for the recovered
text is a run that switches backend at the same committed token: the undisturbed GPU run's first
`at_token` ids, then the numpy engine resumed from them (engine.Resume). The two backends agree
only away from near-ties, so comparing with an all-GPU or all-CPU run would test luck.

Each test opens its own device (the session's shared device, conftest.gpu_device, must live on).
The champion case runs at about a second per token on lavapipe, so it decodes 12 tokens.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from conftest import requires_gpu
from pyspec import champion_path
from pyspec.cpu.executor import CPUBackend
from pyspec.cpu.model import Model
from pyspec.engine import Engine, Resume
from pyspec.formats.gguf import GGUFFile
from pyspec.gpu import DeviceLostError, load_model, open_device
from pyspec.gpu.device import GPUTimeoutError
from pyspec.load import backend as backend_for
from pyspec.options import Options
from pyspec.text.tokenizer import Tokenizer

pytestmark = requires_gpu

MODES = {"greedy": {}, "replay": {"temperature": 0.8, "seed": 77}}


def lose_device_mid_stream(engine, dev, prompt, opts, after_chunks: int):
    """Stream a request and destroy `dev` once `after_chunks` chunks arrived (as a GPU reset
    would: between cycles, with the next cycle already due). Returns (report, chunks)."""
    report, chunks = {}, []

    async def run():
        async for c in engine.stream(prompt, opts, report):
            chunks.append(c)
            if len(chunks) == after_chunks:
                dev.destroy()

    asyncio.run(run())
    return report, chunks


def switched_reference(gpu_engine, cpu_engine, prompt, opts, at_token: int) -> str:
    """The text of a run that switches from the GPU to the numpy engine after `at_token`
    committed tokens: the undisturbed GPU run's first ids, then the CPU resumed from them."""
    gpu_ids = gpu_engine.generate(prompt, opts).tokens[:at_token]
    return cpu_engine.generate(prompt, opts, resume=Resume(gpu_ids)).text


def check_recovered(report, chunks, reference: str, adapter: str) -> dict:
    """The checks every recovered run passes; returns its fault record."""
    at = 0
    for c in chunks:
        assert c.offset == at, "chunk offsets must be contiguous: no gap, no overlap"
        at += len(c.text)
    assert "".join(c.text for c in chunks) == report["text"]
    assert report["text"].encode() == reference.encode()
    (fault,) = report["receipt"]["faults"]
    assert fault["kind"] == "device_lost" and fault["adapter"] == adapter
    assert fault["recovery_s"] >= 0 and fault["cycle"] >= 1
    assert report["stats"]["adapter"] == "cpu-numpy", "the request finished on the CPU"
    return fault


def test_every_call_on_a_destroyed_device_is_a_device_loss(tiny):
    dev = open_device()
    model = load_model(dev, GGUFFile.open(tiny.champion_path))
    buf = dev.buffer(64)
    dev.destroy()
    with pytest.raises(DeviceLostError) as e:
        dev.write(buf, bytes(64))
    assert e.value.code == "device_lost" and "Parent device" not in str(e.value)
    with pytest.raises(DeviceLostError):
        asyncio.run(dev.read(buf, 16))
    with pytest.raises(DeviceLostError):
        dev.submit(model.forward_dispatches(0))
    with pytest.raises(DeviceLostError):
        dev.buffer(64)


@pytest.mark.parametrize("mode", MODES)
def test_device_loss_mid_generation_recovers_to_the_switched_reference(tiny, mode):
    opts = lambda: Options(max_tokens=40, k="fixed:3", stop_at_eos=False, **MODES[mode])
    file = GGUFFile.open(tiny.champion_path)
    recover = lambda: CPUBackend(tiny.champion)
    dev = open_device()
    engine = Engine(backend_for(load_model(dev, file), "ngram"), tiny.tokenizer, recover=recover)
    report, chunks = lose_device_mid_stream(engine, dev, tiny.prompt, opts(), after_chunks=3)
    at = report["receipt"]["faults"][0]["at_token"]
    assert 0 < at < 40, "the fault must strike mid-generation"
    undisturbed = Engine(backend_for(tiny.on("gpu"), "ngram"), tiny.tokenizer)
    reference = switched_reference(undisturbed, Engine(recover(), tiny.tokenizer), tiny.prompt,
                                   opts(), at)
    check_recovered(report, chunks, reference, dev.adapter_class)


@pytest.mark.parametrize("draft", ["none", "ngram", "model"])
def test_device_loss_with_two_cycles_in_flight(tiny, draft):
    """Champion-only decoding is pipelined, and so are n-gram cycles whose drafts the device
    looks up and a draft model's cycles fed on the device: when the device is lost after the
    third chunk, the next cycle is already submitted and unread. Both are dropped; the request
    finishes on the CPU from the committed tokens, with no text twice and none missing."""
    opts = lambda: Options(max_tokens=30, stop_at_eos=False,
                           k="heuristic" if draft == "none" else "fixed:3")
    spec = tiny.close_path if draft == "model" else draft
    recover = lambda: CPUBackend(tiny.champion)
    dev = open_device()
    engine = Engine(backend_for(load_model(dev, GGUFFile.open(tiny.champion_path)), spec,
                                draft_ahead=True),   # off by default on a software adapter
                    tiny.tokenizer, recover=recover)
    gpu = engine.backend
    report, chunks = lose_device_mid_stream(engine, dev, tiny.prompt, opts(), after_chunks=3)
    assert gpu.timing["ahead"] >= 2, "the cycles went ahead of their readbacks"
    at = report["receipt"]["faults"][0]["at_token"]
    assert 0 < at < 30
    undisturbed = Engine(backend_for(tiny.on("gpu"), spec), tiny.tokenizer)
    reference = switched_reference(undisturbed, Engine(recover(), tiny.tokenizer), tiny.prompt,
                                   opts(), at)
    check_recovered(report, chunks, reference, dev.adapter_class)


@pytest.mark.champion
def test_device_loss_mid_generation_on_the_champion():
    """The real champion on native WebGPU, greedy: the device destroyed after the third chunk;
    the request finishes on the numpy champion with the switched reference's exact text."""
    file = GGUFFile.open(champion_path())
    tok = Tokenizer.from_metadata(file.metadata)
    prompt = tok.encode_chat([{"role": "user", "content": "Name three colours of the rainbow."}])
    opts = lambda: Options(max_tokens=12, k="fixed:2", stop_at_eos=False)
    cpu_model = Model(file)
    recover = lambda: CPUBackend(cpu_model, None, 256)
    dev = open_device()
    gpu = load_model(dev, file, max_ctx=256)
    engine = Engine(backend_for(gpu, "ngram", 256), tok, recover=recover)
    report, chunks = lose_device_mid_stream(engine, dev, prompt, opts(), after_chunks=3)
    fault = report["receipt"]["faults"][0]
    assert 0 < fault["at_token"] < 12
    # The undisturbed GPU run on a fresh device (the lost one is gone for good).
    undisturbed = Engine(backend_for(load_model(open_device(), file, max_ctx=256), "ngram", 256),
                         tok)
    reference = switched_reference(undisturbed, Engine(recover(), tok), prompt, opts(),
                                   fault["at_token"])
    check_recovered(report, chunks, reference, dev.adapter_class)


@pytest.mark.parametrize("fault", [GPUTimeoutError("the watchdog gave up"),
                                   asyncio.CancelledError()])
def test_a_readback_given_up_on_never_lends_its_staging_buffer(fault, monkeypatch):
    """A readback the watchdog gave up on (or whose wait was cancelled) may still have its map
    pending, and WebGPU refuses a submission that copies into such a buffer ('used in submit
    while pending map', seen in the page on a 1.5B model): its staging buffer is destroyed, and
    the next readback, on the same device, gets another and reads the right bytes."""
    dev = open_device()
    data = np.arange(16, dtype=np.uint32)
    buf = dev.buffer(data.nbytes, data=data)
    readback = dev.stage(buf, data.nbytes)
    dev.submit([readback.copy])
    dev.expect(readback)

    async def give_up(*_):
        raise fault

    monkeypatch.setattr(dev, "_map_read", give_up)
    with pytest.raises(type(fault)):
        asyncio.run(dev.redeem(readback))
    monkeypatch.undo()
    assert all(s is not readback.staging for s in dev._idle_staging)
    again = dev.stage(buf, data.nbytes)
    assert again.staging is not readback.staging
    dev.submit([again.copy])
    assert np.frombuffer(asyncio.run(dev.redeem(again)), np.uint32).tolist() == data.tolist()
    dev.destroy()
