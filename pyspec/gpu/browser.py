"""The browser adapter: WebGPU through `navigator.gpu`, from Python in Pyodide (`pyodide.ffi`).

Only where the device, buffers and readback come from lives here; device.py holds the rest, and
the WGSL, the kernel wrappers and the cycle are the same files native.py runs.

    dev = await BrowserDevice.create()        # requestAdapter + requestDevice (async in JS)
    champion = load_model(dev, GGUFFile(buf), max_ctx=2048)

Differences from wgpu-py that shape this file:
  - JS WebGPU never throws on a validation error; it reports through error scopes, whose result
    is a Promise. The primitives are synchronous (STYLE: calls stay synchronous up to `submit`),
    so pipeline and bind-group creation push a 'validation' scope and keep the popped Promise;
    the next `read` (or `check`) awaits them and raises GPUError naming the object. Errors outside
    any scope (a bad submission) arrive as `uncapturederror` events and are raised the same way.
  - `device.lost` is a Promise: its handler records the loss and every later call raises
    DeviceLostError.
  - Writes hand WebGPU a Uint8Array *view* of the Python buffer in wasm memory (no copy in
    JavaScript; writeBuffer itself copies into the GPU process). A readback is one call
    (webgpu.js readBuffer: map, copy out, unmap, and the watchdog's timer) and one more to take
    its bytes into Python.
  - A readback that never resolves (a hung GPU process) would stall the request for good, and
    the worker's event loop stays free, so client.js's heartbeat sees nothing wrong: a watchdog
    (`readback_timeout`) raises GPUTimeoutError instead, and the engine recovers.
  - A call from Python into JS costs about 90 us, so `submit` crosses once per submission: the
    commands become a u32 array of op words over a JS table of pipelines, bind groups and
    buffers (each registered once, when first seen), and one JS function encodes them. It does
    what Device.submit does natively; the e2e tests compare the page's tokens with native ones.
Not here: choosing this device over the CPU (web.py's make_engine), the kernels, the cycle.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from .device import (
    Copy,
    Device,
    DeviceLostError,
    Dispatch,
    GPUError,
    GPUTimeoutError,
    NoAdapterError,
)

try:  # only Pyodide has these; natively this module imports but `create` refuses
    import js
    import pyspec_webgpu
    from pyodide.ffi import create_proxy, to_js
except ImportError:  # pragma: no cover - exercised outside Pyodide
    js = None

# The write and submission helpers are web/webgpu.js, which worker.js registers as the module
# `pyspec_webgpu`: code in a file, not a string run_js evaluates, so the page needs no
# 'unsafe-eval' in its Content-Security-Policy.

# adapter.limits names (JS) and the keys device.limits uses everywhere (native.py's spelling)
_LIMITS = {"maxStorageBufferBindingSize": "max-storage-buffer-binding-size",
           "maxBufferSize": "max-buffer-size",
           "maxComputeWorkgroupStorageSize": "max-compute-workgroup-storage-size",
           "maxStorageBuffersPerShaderStage": "max-storage-buffers-per-shader-stage"}


def _desc(obj):
    """A Python dict/list tree as a plain JS object tree (WebGPU descriptors)."""
    return to_js(obj, dict_converter=js.Object.fromEntries)


async def _wait(promise):
    """A JS Promise as a coroutine, for asyncio.wait_for."""
    return await promise


async def _answer(promise, what: str):
    """An adapter or device request's answer; NoAdapterError when the browser gives none in
    ANSWER_TIMEOUT_S (a GPU process that is restarting or wedged never answers: the page then
    goes on without the GPU instead of waiting for ever)."""
    try:
        return await asyncio.wait_for(_wait(promise), ANSWER_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise NoAdapterError(f"{what} gave no answer in {ANSWER_TIMEOUT_S} s (the browser's GPU "
                             "process may be restarting); reload the page to try the GPU "
                             "again") from None


def _adapter_name(adapter) -> str:
    """e.g. 'swiftshader (google, WebGPU)' or 'NVIDIA GeForce RTX 3060 (nvidia, WebGPU)'."""
    info = getattr(adapter, "info", None)
    get = (lambda key: str(getattr(info, key, "") or "")) if info is not None else (lambda k: "")
    main = get("description") or get("device") or get("architecture") or "unknown adapter"
    return f"{main} ({get('vendor') or '?'}, WebGPU)"


# The readback watchdog: a readback that waits for pipelines made since the last one (they
# compile before their first dispatch runs: minutes for a big model on SwiftShader) waits
# READBACK_FIRST_S, as the first does (READBACK_FIRST_CPU_S on a software adapter: a 1.5B model's
# first prefill with its compiles took over 300 s on SwiftShader, 2 loaded cores); any other
# READBACK_FACTOR times the slowest such readback, and never less than READBACK_MIN_S. The
# staging buffer of a readback it gives up on is never reused (Device.abandon).
READBACK_FIRST_S = 300.0
READBACK_FIRST_CPU_S = 3600.0
READBACK_FACTOR = 20
READBACK_MIN_S = 5.0
# How long requestAdapter / requestDevice may take to answer (they answer in milliseconds; a GPU
# process that crashed and is restarting can leave them unanswered).
ANSWER_TIMEOUT_S = 20.0


# Every BrowserDevice not yet lost or destroyed: what `live` counts (a leak check: a device the
# session stopped using but never destroyed keeps its buffers).
_LIVE: set = set()


def live() -> dict:
    """{"gpu_devices": devices alive, "gpu_bytes": the bytes of their buffers}."""
    for dev in [d for d in _LIVE if d.lost is not None]:
        _LIVE.discard(dev)
    return {"gpu_devices": len(_LIVE), "gpu_bytes": sum(d.allocated for d in _LIVE)}


class BrowserDevice(Device):
    """A GPUDevice of the browser. Make one with `await BrowserDevice.create()`."""

    def __init__(self, adapter, device):
        super().__init__()
        self.adapter = adapter
        self.device = device
        self.queue = device.queue
        self.name = _adapter_name(adapter)
        self.features = frozenset(str(f) for f in adapter.features)
        # What the browser reports, not a guess from the name: a software adapter is a
        # "fallback adapter" (GPUAdapterInfo.isFallbackAdapter; GPUAdapter.isFallbackAdapter in
        # older browsers). Chromium's SwiftShader says true.
        info = getattr(adapter, "info", None)
        fallback = getattr(info, "isFallbackAdapter", None) if info is not None else None
        self.is_cpu = bool(getattr(adapter, "isFallbackAdapter", False)
                           if fallback is None else fallback)
        self.vendor = getattr(info, "vendor", None)        # GPUAdapterInfo.vendor, e.g. "nvidia"
        self.architecture = getattr(info, "architecture", None) or None   # e.g. "ampere"
        self.limits = {key: int(getattr(device.limits, js_key)) for js_key, key in _LIMITS.items()}
        self._slowest: float | None = None   # seconds of the slowest readback with no compile
        self._compiling = True               # pipelines made since the last readback
        _LIVE.add(self)
        self._scopes: list = []          # (what, Promise of GPUError | null) not yet checked
        # Event state lives in a plain dict the JS callbacks close over (not `self`), so a
        # dropped device is not kept alive by its own handlers.
        self._events = events = {"lost": None, "errors": []}

        def on_lost(info):
            events["lost"] = f"{info.reason}: {info.message}" if info.message else str(info.reason)

        def on_error(event):
            events["errors"].append(str(event.error.message))

        self._on_lost = create_proxy(on_lost)
        self._on_error = create_proxy(on_error)
        device.lost.then(self._on_lost)
        device.addEventListener("uncapturederror", self._on_error)
        self._write_js = pyspec_webgpu.writeBuffer
        self._encode_js = pyspec_webgpu.encode
        self._read_js = pyspec_webgpu.readBuffer
        self._objs = js.Array.new()      # JS handles the op words index
        self._index: dict[int, int] = {}  # id(handle) -> its index in _objs
        self._held: list = []            # _objs' handles here too, so no id is ever reused
        self._words: dict[int, tuple] = {}  # id(Dispatch or plan) -> (op words, it)

    @classmethod
    async def create(cls, power_preference: str = "high-performance") -> "BrowserDevice":
        """requestAdapter + requestDevice with the adapter's own storage/buffer limits (the
        defaults, 128 MiB bindings and 8 storage buffers, are lower than most adapters give)."""
        if js is None:
            raise NoAdapterError("BrowserDevice runs only in Pyodide; natively use "
                                 "pyspec.gpu.open_device() (wgpu-py)")
        gpu = getattr(js.navigator, "gpu", None)
        if gpu is None:
            raise NoAdapterError("this browser has no WebGPU (navigator.gpu is undefined); use "
                                 "Chrome/Edge 113+ or enable WebGPU")
        try:
            adapter = await _answer(gpu.requestAdapter(_desc({"powerPreference": power_preference})),
                                    "navigator.gpu.requestAdapter")
        except NoAdapterError:
            raise
        except Exception as e:  # noqa: BLE001 - a JS error from the browser
            raise NoAdapterError(f"navigator.gpu.requestAdapter failed: {e}") from e
        if adapter is None:
            raise NoAdapterError("navigator.gpu gave no adapter (WebGPU is blocked or there is "
                                 "no usable GPU driver)")
        limits = {js_key: getattr(adapter.limits, js_key) for js_key in _LIMITS}
        try:
            device = await _answer(adapter.requestDevice(_desc({"requiredLimits": limits,
                                                                "label": "pyspec"})),
                                   "adapter.requestDevice")
        except NoAdapterError:
            raise
        except Exception as e:  # noqa: BLE001
            raise NoAdapterError(f"adapter.requestDevice failed: {e}") from e
        return cls(adapter, device)

    # --- errors -----------------------------------------------------------------------------
    @property
    def lost(self) -> str | None:
        """Why the device was lost (GPUDeviceLostInfo reason: message), or None while alive."""
        return self._events["lost"]

    def _alive(self) -> None:
        if self._events["lost"] is not None:
            raise DeviceLostError(f"the WebGPU device was lost ({self._events['lost']}); "
                                  "make a new device and reload the model")

    def _scoped(self, what: str, make):
        """make() inside a validation error scope, checked at the next `check`."""
        self._alive()
        self.device.pushErrorScope("validation")
        try:
            return make()
        finally:
            self._scopes.append((what, self.device.popErrorScope()))

    async def check(self) -> None:
        """Raise the first validation error of the objects made since the last check, or of a
        submission (an uncaptured error); DeviceLostError if the device was lost."""
        scopes, self._scopes = self._scopes, []
        for what, promise in scopes:
            error = await promise
            if error is not None:
                raise GPUError(f"{what}: {error.message}")
        if self._events["errors"]:
            message = self._events["errors"][0]
            self._events["errors"].clear()
            raise GPUError(f"WebGPU error: {message}")
        self._alive()

    # --- adapter primitives -------------------------------------------------------------------
    def _create_buffer(self, nbytes, usage, label):
        self._alive()
        U = js.GPUBufferUsage
        flags = {"storage": U.STORAGE | U.COPY_SRC | U.COPY_DST,
                 "uniform": U.UNIFORM | U.COPY_DST,
                 "readback": U.MAP_READ | U.COPY_DST}[usage]
        limit = self.limits["max-buffer-size"]
        if nbytes > limit:
            raise GPUError(f"buffer {label} needs {nbytes} bytes; this adapter allows at most "
                           f"{limit} per buffer (lower max_ctx)")
        # No error scope here: an out-of-memory would be reported asynchronously anyway, and
        # buffer descriptors are checked above.
        return self.device.createBuffer(_desc({"size": nbytes, "usage": flags, "label": label}))

    def size_of(self, buffer) -> int:
        return int(buffer.size)

    def _create_pipeline(self, wgsl, entry, label):
        def make():
            module = self.device.createShaderModule(_desc({"code": wgsl, "label": label}))
            self._compiling = True
            return self.device.createComputePipeline(_desc({
                "layout": "auto", "compute": {"module": module, "entryPoint": entry},
                "label": label}))
        return self._scoped(f"pipeline {label}", make)

    def _create_bind_group(self, pipeline, entries, label):
        def make():
            return self.device.createBindGroup(_desc({
                "layout": pipeline.getBindGroupLayout(0), "label": label,
                "entries": [{"binding": i, "resource": {"buffer": b, "offset": o, "size": s}}
                            for i, (b, o, s) in enumerate(entries)]}))
        return self._scoped(f"bind group {label}", make)

    def _write(self, buffer, data, offset=0):
        self._alive()
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data)   # a view when it already is (weights are)
        self._write_js(self.queue, buffer, offset, memoryview(data).cast("B"))

    def _handle(self, obj) -> int:
        """obj's index in the JS table, registering it (one JS call) the first time."""
        i = self._index.get(id(obj))
        if i is None:
            i = self._index[id(obj)] = len(self._held)
            self._held.append(obj)
            self._objs.push(obj)
        return i

    def _op_words(self, c) -> np.ndarray:
        if isinstance(c, list):  # a plan: its words are made once, kept with it (stable id)
            cached = self._words.get(id(c))
            if cached is None or len(cached[1]) != len(c):
                words = (np.concatenate([self._op_words(d) for d in c]) if c
                         else np.zeros(0, np.uint32))
                cached = self._words[id(c)] = (words, c)
            return cached[0]
        if isinstance(c, Dispatch):
            cached = self._words.get(id(c))
            if cached is None:  # the Dispatch is kept with its words, so its id stays its own
                words = np.array([0, self._handle(c.pipeline), self._handle(c.bind_group),
                                  *c.workgroups], np.uint32)
                cached = self._words[id(c)] = (words, c)
            return cached[0]
        if isinstance(c, Copy):
            return np.array([1, self._handle(c.src), c.src_offset, self._handle(c.dst),
                             c.dst_offset, c.nbytes], np.uint32)
        raise TypeError(f"cannot encode {c!r}")

    def submit(self, commands: list) -> None:
        """One JS call per submission (see the module docstring); the op words of a Dispatch or
        a plan are made once, as they are."""
        self._alive()
        words = (np.concatenate([self._op_words(c) for c in commands]) if commands
                 else np.zeros(0, np.uint32))
        self._encode_js(self.device, self.queue, self._objs, memoryview(words))
        self.submissions += 1

    def readback_timeout(self) -> float:
        """Seconds the watchdog lets a readback take (READBACK_* above)."""
        if self._slowest is None or self._compiling:
            return READBACK_FIRST_CPU_S if self.is_cpu else READBACK_FIRST_S
        return max(READBACK_MIN_S, READBACK_FACTOR * self._slowest)

    async def read(self, buffer, nbytes, offset=0):
        self._alive()
        return await Device.read(self, buffer, nbytes, offset)

    async def _map_read(self, staging, size, nbytes):
        """One JS call maps, copies and unmaps (webgpu.js readBuffer), one more takes the bytes;
        its watchdog (`readback_timeout`) runs in JavaScript."""
        self._alive()
        drill, self.drill = self.drill, None
        timeout, t0 = self.readback_timeout(), time.perf_counter()
        compiled, self._compiling = self._compiling, False
        try:
            if drill == "gpu-oom":
                await self._oversized_buffer()
            data = (await self._read_js(staging, size, nbytes, int(1000 * timeout),
                                        drill)).to_bytes()
        except GPUError:
            raise
        except Exception as e:  # noqa: BLE001 - a JS error: the watchdog, a map, a range
            if getattr(e, "name", None) == "PyspecTimeout" or "PyspecTimeout" in str(e):
                rule = ("the allowance of a readback after new pipelines" if compiled
                        or self._slowest is None else f"{READBACK_FACTOR}x the slowest "
                        f"readback, at least {READBACK_MIN_S:.0f} s")
                raise GPUTimeoutError(f"a readback of {nbytes} bytes did not finish in "
                                      f"{timeout:.0f} s (the watchdog: {rule}); the GPU seems "
                                      "hung") from None
            await self.check()   # a lost device says so
            raise GPUError(f"reading back {nbytes} bytes failed: {e}") from e
        if not compiled:
            self._slowest = max(self._slowest or 0.0, time.perf_counter() - t0)
        # The scopes of the objects made since the last read, and errors of the submissions
        # this read waited for: data computed by an invalid pipeline is never returned.
        await self.check()
        return data

    async def _oversized_buffer(self):
        """The gpu-oom drill: a buffer past the adapter's max-buffer-size, made for real; raises
        the GPUError WebGPU reports for it (validation, or out-of-memory where it gets that far)."""
        size = self.limits["max-buffer-size"] + 1024
        self.device.pushErrorScope("out-of-memory")
        self.device.pushErrorScope("validation")
        buffer = self.device.createBuffer(_desc({"size": size, "usage": js.GPUBufferUsage.STORAGE,
                                                 "label": "oversized"}))
        errors = [await self.device.popErrorScope(), await self.device.popErrorScope()]
        buffer.destroy()
        error = next((e for e in errors if e is not None), None)
        raise GPUError(f"a buffer of {size} bytes: "
                       f"{error.message if error is not None else 'refused'}")

    def destroy(self):
        # Lost from now on (the device.lost promise settles later): the next call raises
        # DeviceLostError, and a recovery knows it needs a new device.
        self._events["lost"] = self._events["lost"] or "destroyed"
        _LIVE.discard(self)
        self.device.destroy()
