"""The device interface every GPU adapter implements, and the logic both adapters share.

An adapter (native.py over wgpu-py, browser.py over navigator.gpu) provides only the primitives
that differ between the two worlds, the methods marked "adapter" below: making buffers, pipelines
and bind groups, writing a buffer, encoding + submitting a list of dispatches, and one awaitable
readback. Everything else lives here, once: shader loading (with `//!include`), pipeline and
uniform caching, byte accounting, and the validation-error scope around object creation.

Calls are synchronous up to `submit`; only `read` is awaited (STYLE: one path, two devices).
Not here: what a kernel computes (ops.py, sampling.py), the forward (model.py), the cycle
(cycle.py, backend.py).
"""

from __future__ import annotations

import asyncio
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import PyspecError
from ..receipts import adapter_class
from ..verdicts import device_class
from .constants import ROWS_MAX, wgsl  # noqa: F401 (the GPU modules read ROWS_MAX from here)


class GPUError(PyspecError, RuntimeError):
    """The GPU rejected something (a shader, a buffer, a dispatch) or was lost."""

    code = "gpu_error"


class NoAdapterError(GPUError):
    """No WebGPU adapter is available here."""

    code = "no_webgpu"


class DeviceLostError(GPUError):
    """The device was lost mid-run; committed tokens are safe, the cycle in flight is dropped."""

    code = "device_lost"


class GPUTimeoutError(GPUError):
    """A readback did not finish within the device's watchdog (a hung GPU or driver)."""

    code = "gpu_timeout"


# Fault drills a device can be armed with (web.py, drills on): each strikes for real at the next
# readback, in the adapter's own way (browser.py): an oversized buffer's WebGPU error, an
# exception thrown by the readback itself, a readback that never resolves.
DEVICE_DRILLS = ("gpu-oom", "readback-throw", "readback-hang")


class ShapeError(GPUError):
    """A kernel wrapper was given buffers or shapes that do not fit together, or a tensor the
    kernels do not take (the browser then falls back to the CPU engine)."""


def binding_size(dev: "Device", binding) -> int:
    """Bytes a kernel can reach through a binding, in either form the wrappers take: a buffer
    (all of it), (buffer, byte offset, size) (ops.py: `size`), or (buffer, element offset)
    (sampling.py: the buffer past that many 4-byte elements)."""
    if not isinstance(binding, tuple):
        return dev.size_of(binding)
    if len(binding) == 3:
        return binding[2]
    buffer, element_offset = binding
    return dev.size_of(buffer) - 4 * element_offset


def need(dev: "Device", binding, nbytes: int, what: str) -> None:
    """The size check of every kernel wrapper (ops.py, sampling.py): `binding` must hold nbytes,
    else a ShapeError names it, e.g. what = "matmul x (ROWS_MAX, 576)"."""
    have = binding_size(dev, binding)
    if have < nbytes:
        raise ShapeError(f"{what} holds {have} bytes but the kernel needs {nbytes}; allocate it "
                         "for that shape (activations for ROWS_MAX rows)")


@dataclass(frozen=True)
class Dispatch:
    """One compute dispatch: a pipeline, its bind group (group 0) and a workgroup count."""
    kernel: str                  # pipeline key: "<shader file stem>.<entry point>"
    pipeline: object             # adapter handle
    bind_group: object           # adapter handle
    workgroups: tuple[int, int, int]


@dataclass(frozen=True)
class Prepared:
    """A plan of dispatches (a list built once and replayed every cycle) with what an adapter
    needs to record it in one tight loop (native.py: its raw handles), made once per plan.
    Its first dispatch sets its pipeline whatever came before."""
    plan: list
    raw: tuple


def flatten(commands: list):
    """The commands of a list that may hold plans (lists of commands), in order."""
    for c in commands:
        if isinstance(c, list):
            yield from c
        else:
            yield c


def count_commands(commands: list) -> int:
    return sum(len(c) if isinstance(c, list) else 1 for c in commands)


@dataclass(frozen=True)
class Copy:
    """A buffer-to-buffer copy encoded in the same submission (e.g. a token into the next step)."""
    src: object
    src_offset: int
    dst: object
    dst_offset: int
    nbytes: int


@dataclass(frozen=True)
class Readback:
    """A readback staged by `Device.stage`: `copy` goes into a submission (the cycle's own), and
    `Device.redeem` later waits for that submission and returns the bytes. Each has its own
    staging buffer, so several may be in flight at once (pipelined cycles)."""
    staging: object
    nbytes: int
    size: int            # bytes copied: nbytes rounded up to 16
    copy: Copy


STAGING_KEPT = 4   # idle staging buffers a device keeps for the next readbacks


def shader_dir() -> Path:
    """shaders/ beside the package in a checkout; pyspec/_shaders inside a built wheel."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent / "shaders", here / "_shaders"):
        if candidate.is_dir():
            return candidate
    raise GPUError("the WGSL shaders are missing: expected shaders/ beside pyspec/ (checkout) or "
                   "pyspec/_shaders (wheel); reinstall pyspec")


_INCLUDE = re.compile(r"^//!include\s+(\S+)\s*$", re.MULTILINE)


def load_shader(name: str, directory: Path | None = None) -> str:
    """The WGSL text of shaders/<name>.wgsl with `//!include other.wgsl` lines expanded (once),
    after the block of constants that WGSL shares with Python (constants.py), so no shader keeps
    its own copy of ROWS_MAX, a workgroup size, a mode or a stream id."""
    directory = directory or shader_dir()
    seen: set[str] = set()

    def expand(file: str) -> str:
        if file in seen:
            return ""
        seen.add(file)
        path = directory / file
        if not path.is_file():
            raise GPUError(f"shader {file} not found in {directory}")
        return _INCLUDE.sub(lambda m: expand(m.group(1)), path.read_text())

    return wgsl() + expand(f"{name}.wgsl")


class Device:
    """Shared device logic. Subclasses implement the adapter primitives."""

    name = "unknown"          # adapter description, e.g. "llvmpipe (LLVM 15)" or "NVIDIA H200"
    features: frozenset = frozenset()
    # A software adapter running on the CPU (lavapipe, SwiftShader): kernels pick a work split
    # without workgroup barriers there (ops.matmul). Set by each adapter from what it reports.
    is_cpu = False
    # The adapter's vendor: a WebGPU vendor name ("nvidia") or a PCI vendor id; only
    # `adapter_class` reads it.
    vendor: str | int | None = None
    architecture: str | None = None   # as the adapter names it ("hopper"); `device_class` reads it

    lost: str | None = None   # why the device was lost (browser.py reports it), None while alive
    drill: str | None = None  # a DEVICE_DRILLS kind armed for the next readback (web.py)

    def __init__(self):
        self._steps = None    # the Step slots (steps), made with the first model
        self._pipelines: dict[str, object] = {}
        self.allocated = 0    # bytes of the live buffers made through `buffer` (not yet `free`d)
        self.live_buffers = 0 # ... and how many
        self._owners: list[list] = []   # the `owned` scopes open, innermost last
        self.submissions = 0
        self.writes = 0       # queue writes from the host (tests: a pipelined cycle makes none)
        self.readbacks = 0
        self.read_bytes = 0   # the bytes those readbacks brought back
        self._idle_staging: list = []   # staging buffers of redeemed (or dropped) readbacks

    @property
    def adapter_class(self) -> str:
        """What a receipt may say about this adapter (receipts.adapter_class), never `name`."""
        return adapter_class(self.vendor, self.is_cpu)

    @property
    def device_class(self) -> str:
        """What a gate verdict is keyed by (verdicts.device_class): the class and architecture."""
        return device_class(self.adapter_class, self.architecture)

    # --- adapter primitives -------------------------------------------------------------------
    def _create_buffer(self, nbytes: int, usage: str, label: str):
        """usage: 'storage' (read/write in shaders, copy src/dst), 'uniform', or 'readback'."""
        raise NotImplementedError

    def _create_pipeline(self, wgsl: str, entry: str, label: str):
        raise NotImplementedError

    def _create_bind_group(self, pipeline, entries: list[tuple[object, int, int]], label: str):
        """entries[i] = (buffer, offset, size) bound at binding i of group 0."""
        raise NotImplementedError

    def _write(self, buffer, data, offset: int = 0) -> None:
        """Queue a write of `data` (bytes-like or ndarray) at `offset`; ordered before the next
        submit."""
        raise NotImplementedError

    def _begin_encoder(self):
        raise NotImplementedError

    def _begin_pass(self, encoder):
        raise NotImplementedError

    def _set_pipeline(self, compute_pass, pipeline) -> None:
        raise NotImplementedError

    def _dispatch(self, compute_pass, bind_group, workgroups) -> None:
        """Bind group 0 and dispatch."""
        raise NotImplementedError

    def _end_pass(self, compute_pass) -> None:
        raise NotImplementedError

    def _replay(self, compute_pass, prepared: "Prepared") -> None:
        """Record a Prepared plan's dispatches (an adapter that makes them: native.py)."""
        raise NotImplementedError

    def _copy(self, encoder, c: "Copy") -> None:
        raise NotImplementedError

    def _finish_and_submit(self, encoder) -> None:
        raise NotImplementedError

    async def _map_read(self, staging, size: int, nbytes: int) -> bytes:
        """Map `staging` (its first `size` bytes), wait for the submissions that write it, and
        return its first nbytes; unmapped again before returning."""
        raise NotImplementedError

    def destroy(self) -> None:
        pass

    async def check(self) -> None:
        """Raise what the device reported since the last check. Natively errors raise where they
        happen; the browser's arrive through error scopes (browser.py)."""

    @property
    def steps(self):
        """The Step slots every model and kernel plan on this device shares (step.py)."""
        if self._steps is None:
            from .step import N_SLOTS, Steps

            with self.owned([]):   # the device's, whoever first asks (see `free`)
                self._steps = Steps(self, N_SLOTS)
        return self._steps

    # --- shared ---------------------------------------------------------------------------------
    def write(self, buffer, data, offset: int = 0) -> None:
        """Queue a write of `data` (bytes-like or ndarray) at `offset`, ordered after the
        submissions before it and before the next. A native implementation (Dawn in the page,
        wgpu) stages each write in memory it allocates, so a cycle that goes ahead writes
        nothing (gpu/ahead.py, gpu/ngram.py); `writes` counts them."""
        self.writes += 1
        self._write(buffer, data, offset)

    def submit(self, commands: list) -> None:
        """Encode Dispatch and Copy commands, in order, into one command buffer and submit it:
        consecutive dispatches share a compute pass (a copy ends it) and a pipeline is set only
        when it changes. A list among the commands is a plan (a list of commands built once and
        replayed every cycle), encoded in place."""
        encoder = self._begin_encoder()
        compute = last_pipeline = None
        for c in flatten(commands):
            if isinstance(c, Dispatch):
                if compute is None:
                    compute, last_pipeline = self._begin_pass(encoder), None
                if c.pipeline is not last_pipeline:
                    self._set_pipeline(compute, c.pipeline)
                    last_pipeline = c.pipeline
                self._dispatch(compute, c.bind_group, c.workgroups)
            elif isinstance(c, Copy):
                if compute is not None:
                    self._end_pass(compute)
                    compute = None
                self._copy(encoder, c)
            elif isinstance(c, Prepared):
                if compute is None:
                    compute = self._begin_pass(encoder)
                self._replay(compute, c)
                last_pipeline = c.plan[-1].pipeline
            else:
                raise TypeError(f"cannot encode {c!r}")
        if compute is not None:
            self._end_pass(compute)
        self._finish_and_submit(encoder)
        self.submissions += 1

    def stage(self, buffer, nbytes: int, offset: int = 0) -> Readback:
        """A readback of nbytes of `buffer` at `offset`: put its `copy` at the end of a
        submission, then `await redeem(...)` it. The staging buffer is an idle one big enough,
        or a new one."""
        size = max(16, -(-int(nbytes) // 16) * 16)
        fit = [b for b in self._idle_staging if self.size_of(b) >= size]
        if fit:
            staging = min(fit, key=self.size_of)
            self._idle_staging.remove(staging)
        else:
            staging = self._create_buffer(max(size, 4096), "readback", "readback")
        return Readback(staging, int(nbytes), size, Copy(buffer, offset, staging, 0, size))

    def expect(self, readback: Readback) -> None:
        """Say, right after the submission holding `readback.copy`, that it will be redeemed:
        an adapter that must ask for the map early does so here (native.py); elsewhere a no-op."""

    reads_now = False   # whether redeem_now can wait for a readback without an event loop

    def redeem_now(self, readback: Readback) -> bytes:
        """`redeem`, blocking: for an adapter that can wait synchronously (native.py)."""
        raise GPUError("this adapter reads back only asynchronously")

    async def redeem(self, readback: Readback) -> bytes:
        """The bytes of a staged readback once its submission has run (the one await)."""
        try:
            data = await self._map_read(readback.staging, readback.size, readback.nbytes)
        except (GPUTimeoutError, asyncio.CancelledError):
            self.abandon(readback)
            raise
        except BaseException:
            self.release(readback)
            raise
        self.release(readback)
        self.redeemed(readback)
        return data

    def redeemed(self, readback: Readback) -> None:
        """Count a readback redeemed (the request's stats, and the tests' check that a cycle
        reads back what it should: tests/test_gpu_tree.py)."""
        self.readbacks += 1
        self.read_bytes += readback.nbytes

    def abandon(self, readback: Readback) -> None:
        """A readback whose map may still be pending (the watchdog gave up on it, or its wait was
        cancelled): its staging buffer is destroyed, never reused, since WebGPU refuses a
        submission that copies into a buffer pending a map (a recovery's next cycle stages a
        fresh one)."""
        readback.staging.destroy()

    def release(self, readback: Readback) -> None:
        """Give back a readback's staging buffer unread (a dropped cycle's, or a redeemed one's).
        Reusing it is safe at once: a later copy into it runs after the submission that holds
        this one, in queue order."""
        self._idle_staging.append(readback.staging)
        while len(self._idle_staging) > STAGING_KEPT:
            self._idle_staging.pop(0).destroy()

    async def read(self, buffer, nbytes: int, offset: int = 0) -> bytes:
        """Copy nbytes of `buffer` to a staging buffer in a submission of its own, wait, and
        return them."""
        readback = self.stage(buffer, nbytes, offset)
        self.submit([readback.copy])
        return await self.redeem(readback)

    def buffer(self, nbytes: int, usage: str = "storage", label: str = "", data=None):
        """A buffer of at least nbytes (rounded up to 16), optionally filled with `data`."""
        size = max(16, -(-int(nbytes) // 16) * 16)
        buf = self._create_buffer(size, usage, label)
        self.allocated += size
        self.live_buffers += 1
        if self._owners:
            self._owners[-1].append(buf)
        if data is not None:
            self.write(buf, data)
        return buf

    @contextmanager
    def owned(self, into: list):
        """Buffers made through `buffer` inside the block are appended to `into` too: what one
        owner (an engine's backend) frees later with `free`, apart from the buffers of a model
        that other owners share."""
        self._owners.append(into)
        try:
            yield into
        finally:
            self._owners.pop()

    def free(self, buffers: list) -> None:
        """Destroy buffers made through `buffer` now, not whenever the garbage collector gets to
        their handles, and take them off `allocated`. Nothing may use them afterwards. (Both
        adapters' buffers, wgpu-py's and the browser's GPUBuffer, have destroy().)"""
        for buf in buffers:
            self.allocated -= self.size_of(buf)
            self.live_buffers -= 1
            buf.destroy()

    def upload(self, array: np.ndarray, label: str = ""):
        """A storage buffer holding `array`'s bytes (padded to a multiple of 16)."""
        raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        buf = self.buffer(raw.size, "storage", label)
        pad = (-raw.size) % 4
        self.write(buf, raw if not pad else np.concatenate([raw, np.zeros(pad, np.uint8)]))
        return buf

    def uniform(self, fields: np.ndarray, label: str = ""):
        """A uniform buffer holding `fields` (a little-endian u32/i32/f32 array, 16-byte padded)."""
        raw = np.ascontiguousarray(fields).view(np.uint8).reshape(-1)
        raw = np.concatenate([raw, np.zeros((-raw.size) % 16, np.uint8)])
        return self.buffer(raw.size, "uniform", label, data=raw)

    def pipeline(self, shader: str, entry: str):
        """The compute pipeline for `entry` in shaders/<shader>.wgsl (cached by "shader.entry")."""
        key = f"{shader}.{entry}"
        if key not in self._pipelines:
            self._pipelines[key] = self._create_pipeline(load_shader(shader), entry, key)
        return self._pipelines[key]

    def dispatch(self, shader: str, entry: str, bindings: list, workgroups) -> Dispatch:
        """A Dispatch of `entry` with `bindings` (buffers, or (buffer, offset, size) tuples)
        at bindings 0, 1, ... and `workgroups` (an int or a 1-3 tuple)."""
        pipeline = self.pipeline(shader, entry)
        entries = [b if isinstance(b, tuple) else (b, 0, self.size_of(b)) for b in bindings]
        bind_group = self._create_bind_group(pipeline, entries, f"{shader}.{entry}")
        wg = (workgroups, 1, 1) if isinstance(workgroups, int) else tuple(workgroups)
        wg = wg + (1,) * (3 - len(wg))
        if min(wg) < 1:
            raise GPUError(f"{shader}.{entry}: empty dispatch {wg}")
        return Dispatch(f"{shader}.{entry}", pipeline, bind_group, wg)

    def size_of(self, buffer) -> int:
        raise NotImplementedError

    async def read_array(self, buffer, dtype, shape, offset: int = 0) -> np.ndarray:
        dtype = np.dtype(dtype)
        n = int(np.prod(shape)) * dtype.itemsize
        return np.frombuffer(await self.read(buffer, n, offset), dtype).reshape(shape).copy()


def split_workgroups(n: int, limit: int = 65535) -> tuple[int, int, int]:
    """n workgroups as (x, y, 1) within the per-dimension limit; kernels flatten x + y * X."""
    if n <= limit:
        return (max(n, 1), 1, 1)
    return (limit, -(-n // limit), 1)
