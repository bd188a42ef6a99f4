"""The page's engine: THE backend choice (make_engine: WebGPU on a hardware adapter, else the
numpy engine, with the reason in the receipt), the recovery after a GPU fault, the page's models
from their weights (open_gguf: streamed from OPFS a tensor at a time) and its draft model
(page_draft_model) with the lent dequantization kernels.

Not here: the session's state (session.py), the JSON boundary (wire.py).
"""

from __future__ import annotations

from ..cpu.executor import CPUBackend
from ..cpu.model import Config
from ..drafters import DraftSpecError
from ..drafters.eagle import is_eagle
from ..drafters.pairing import bind_borrowed, check_pair
from ..formats import quant
from ..cpu.fastcpu import FastModel
from ..engine import Engine
from ..errors import PyspecError
from ..formats.gguf import GGUFFile
from ..load import backend as backend_for
from ..load import GivenDraft, check_tensors, parse_reduced_head
from ..text.tokenizer import Tokenizer
from .wire import SessionError


BACKENDS = ("auto", "webgpu", "cpu")


async def browser_device():
    from ..gpu.browser import BrowserDevice

    return await BrowserDevice.create()


async def make_engine(file: GGUFFile, tokenizer: Tokenizer, draft, max_ctx: int,
                      previous: Engine | None = None, backend: str = "auto",
                      open_device=browser_device, given=None) -> Engine:
    """THE backend choice, in one place.

    "webgpu": the champion uploaded to a pyspec.gpu.browser device, the same GPU engine as
    natively. "cpu": the numpy engine (adapter "cpu-numpy") over a fastcpu.FastModel (products
    row by row, einsum in Pyodide). "auto" (the default): WebGPU on a hardware adapter; on a
    software adapter (SwiftShader: `is_cpu`, the adapter's isFallbackAdapter) the numpy engine,
    which runs the 135M champion far faster in wasm than SwiftShader runs its kernels (0.8 vs
    0.013 tokens/s measured on 2 cores with model.py's tiles, see bench/results/README.md).
    Whenever the GPU is not used the reason is in `engine.fallback_reason` and a code in the
    receipt's fallbacks (Engine fields).

    The CPU Model (which dequantizes every weight: about 540 MB for the champion in wasm) is made
    only when the CPU engine is chosen. The champion goes to the GPU once per session:
    `previous` (the engine this one replaces, for another drafter) lends its GPU model.
    `open_device()` (awaited) gives the WebGPU device: navigator.gpu's in the page; tests pass
    another. `given`: the page's draft model, which the draft spec `model` names
    (load.make_drafter)."""
    from ..gpu import GPUError, NoAdapterError
    from ..gpu.model import GPUModel

    if backend not in BACKENDS:
        raise SessionError("bad_config", f"unknown backend {backend!r}: use one of {BACKENDS}")
    fallbacks = previous.fallbacks if previous is not None else []
    if fallbacks:
        # This session already chose the CPU: keep that choice and its reason.
        kind, reason = fallbacks[0]["kind"], previous.fallback_reason
    elif backend == "cpu":
        kind, reason = "cpu_requested", "the CPU engine was requested (backend=cpu)"
    else:
        try:
            gpu_model = getattr(previous, "champion", None)
            if (not isinstance(gpu_model, GPUModel) or gpu_model.file is not file
                    or gpu_model.dev.lost is not None):
                from ..gpu import load_model
                from ..gpu.step import SLOT_CHAMPION

                dev = await open_device()
                if backend == "auto" and dev.is_cpu:
                    dev.destroy()
                    raise _SoftwareAdapter(f"the WebGPU adapter ({dev.name}) is a software "
                                           "renderer, slower than the CPU engine; "
                                           "pass backend=webgpu to use it anyway")
                try:
                    gpu_model = load_model(dev, file, max_ctx=max_ctx)
                    # Compile the forward's pipelines now: a shader this browser rejects falls
                    # back to the CPU here rather than failing the first request (and TTFT
                    # excludes it).
                    gpu_model.forward_dispatches(SLOT_CHAMPION)
                    await dev.check()
                except BaseException:
                    dev.destroy()   # the weights already uploaded go with it
                    raise
            return Engine(backend_for(gpu_model, draft, max_ctx, given=given), tokenizer,
                          recover=_recovery(gpu_model, file, max_ctx, open_device))
        except _SoftwareAdapter as e:
            kind, reason = "software_adapter", str(e)
        except NoAdapterError as e:
            kind, reason = "no_webgpu", str(e)
        except GPUError as e:   # ShapeError among them: a tensor the GPU kernels do not take
            kind, reason = "webgpu_error", str(e)
    champion = previous.champion if fallbacks else FastModel(file)
    return Engine(backend_for(champion, draft, max_ctx, given=given), tokenizer,
                  fallback_reason=reason,
                  fallbacks=[{"kind": kind, "adapter": "cpu-numpy"}])


def _recovery(gpu_model, file: GGUFFile, max_ctx: int, open_device):
    """The engine's `recover`: after a GPU fault the request goes on, champion-only,
    from its committed tokens. A lost device is replaced by a new one of the same adapter (its
    weights uploaded again); any other fault (a readback that threw or hung, an out-of-memory),
    or no new device, goes to the numpy champion. A device that failed but is not lost is
    destroyed, so its buffers go with it."""
    from ..gpu import GPUError, load_model
    from ..gpu.backend import GPUBackend

    current = [gpu_model]

    async def recover():
        failed = current[0]
        if failed is not None and failed.dev.lost is None:
            failed.dev.destroy()
        elif failed is not None:
            try:
                dev = await open_device()
                current[0] = load_model(dev, file, max_ctx=max_ctx)
                return GPUBackend(current[0], None, max_ctx)
            except GPUError:
                pass
        current[0] = None
        return CPUBackend(FastModel(file), None, max_ctx)

    return recover


class WeightsChangedError(PyspecError):
    """A streamed model's file changed under it (open_gguf)."""

    code = "weights_changed"


# init's gpuLimits (JS names) -> the keys device.limits uses
_CAPS = {"maxBufferSize": "max-buffer-size",
         "maxStorageBufferBindingSize": "max-storage-buffer-binding-size"}


def capped(open_device, caps: dict | None):
    """`open_device`, its device's buffer and binding limits lowered to `caps` (init's
    gpuLimits: {"maxBufferSize", "maxStorageBufferBindingSize"} in bytes, either optional), as
    the weights' upload reads them: a small model's vocabulary tables then go in row parts as a
    large model's do on a real adapter (weights.upload_rows), and a tensor past them is refused
    with the numbers. The device itself keeps its limits. No caps: `open_device` itself."""
    bad = [k for k, v in (caps or {}).items()
           if k not in _CAPS or not isinstance(v, int) or v <= 0]
    if bad:
        raise SessionError("bad_config", f"gpu_limits takes positive integers for "
                           f"{', '.join(_CAPS)}; got {caps!r}")
    if not caps:
        return open_device

    async def open_capped():
        dev = await open_device()
        for js_key, key in _CAPS.items():
            if js_key in caps:
                dev.limits[key] = min(dev.limits[key], caps[js_key])
        return dev

    return open_capped


class _SoftwareAdapter(Exception):
    """auto chose the CPU over a software WebGPU adapter."""


def lend_dequant_kernels() -> None:
    """In the page, dequantize with web/dequant.js (worker.js registers it as `pyspec_dequant`):
    bit-identical to quant.py's numpy, and ten times faster in wasm, the bulk of model load."""
    try:
        import pyspec_dequant
    except ImportError:   # natively, and in tests: numpy's own
        return
    quant.use_kernels({"Q4_1": pyspec_dequant.q4_1, "Q8_0": pyspec_dequant.q8_0})


def open_gguf(weights, name: str) -> GGUFFile:
    """A model's GGUFFile from what the worker hands over: the weights' source (web/stream.js
    weightSource: {size, sha256, read(offset, nbytes) -> bytearray}, its sha256 checked as it
    streamed), whose tensors are read a tensor at a time as they go to the GPU (or the CPU
    engine), so the wasm heap never holds the whole file; or the file's bytes (tests)."""
    if isinstance(weights, (bytes, bytearray, memoryview)):
        return GGUFFile(weights, name)

    def read(offset: int, nbytes: int) -> bytearray:
        out = bytearray(nbytes)      # Python's own, lent to JS for the call, which fills it
        try:
            weights.read(offset, out)
        except Exception as e:  # noqa: BLE001 - a JS error (NotReadableError), named here
            raise WeightsChangedError(f"the weights of {name} could not be read at byte "
                                      f"{offset} ({e}): their file in the browser's cache "
                                      "changed while in use (another page of this site wrote "
                                      "it again?); load the model again") from e
        return out

    return GGUFFile.from_reader(read, int(weights.size), name, sha256=str(weights.sha256))


def page_draft_model(file: GGUFFile, draft_buf, opts: dict) -> GivenDraft:
    """The page's draft model from its buffer, checked against the champion `file` (its pair
    class, borrowed tensors), with its reduced head (init's draft_vocab) or its bridge (another
    vocabulary). Its weights are read where it drafts (load.GivenDraft): on a GPU champion's
    device, or dequantized for the host the first time the host drafts with it."""
    draft_file = open_gguf(draft_buf, opts.get("draft_name") or "draft")
    pair = check_pair(file.metadata, draft_file.metadata)   # its class (compat.py)
    pair.raise_if_bad()
    bind_borrowed(draft_file, file)     # its embedding may be the champion's
    if is_eagle(draft_file.metadata):
        raise DraftSpecError(f"{draft_file.source} is an EAGLE-style head: it runs in the numpy "
                             "engine of the CLI so far, not in the page; give a draft model, "
                             "or use ngram")
    check_tensors(draft_file)   # a tensor missing or of another shape: refused now, by name
    vocab = opts.get("draft_vocab")
    if vocab is not None and pair.bridge is not None:
        if not opts.get("draft_vocab_shipped"):
            raise DraftSpecError(f"{draft_file.source} has another vocabulary than the "
                                 "champion: a reduced head (draft_vocab) is for a draft with "
                                 "the champion's tokenizer; drop it")
        # The site's, which the worker sends with the draft whatever the champion: with
        # another vocabulary the draft runs bridged on its full head, as in the CLI.
        vocab = None
    head = None
    if vocab is not None:
        # Its reduced head (load.reduced_head_ids' sidecar, fetched by the worker): the numpy
        # engine's draft steps shrink; a GPU draft keeps its full head.
        n_vocab = Config.from_metadata(draft_file.metadata).vocab_size
        head = parse_reduced_head(vocab, n_vocab, f"{draft_file.source}'s vocab.json")
    return GivenDraft(draft_file, pair.bridge, head)
