"""The native adapter: WebGPU through wgpu-py (Vulkan: lavapipe on CI, NVIDIA on the GPU box).

Only where the device, buffers and readback come from lives here; device.py holds the rest.
wgpu-py raises WebGPU validation errors as Python exceptions at the call that caused them; every
object creation turns those into a GPUError that names the object, so a shader or binding bug
raises where it happens, not as a lost device three submissions later.

A lost device is a DeviceLostError (code device_lost), wherever it shows: wgpu-py implements no
`device.lost` promise and reports a call on a lost device as a GPUValidationError ("Parent device
is lost"), so every call that touches the device (write, submit, readback, object creation) is
classified here: after `destroy()`, or when wgpu says the device is lost, the error is a lost
device, whatever wgpu named it; anything else stays a GPUError (gpu_error).
"""

from __future__ import annotations

import asyncio
import itertools
import time

from .device import (
    Device,
    DeviceLostError,
    Dispatch,
    GPUError,
    GPUTimeoutError,
    NoAdapterError,
    Prepared,
    flatten,
)

try:  # wgpu-py is optional: the CPU engine and the browser build do not need it
    import wgpu
    from wgpu.backends.wgpu_native._ffi import ffi as _ffi
    from wgpu.backends.wgpu_native._ffi import lib as _raw
    _NULL = _ffi.NULL
    # A map for reading without wgpu-py's extra empty submission first ("READ_NOSYNC", its own
    # mode name): that submission is for data written by queue.write_buffer, and it blocks while
    # the GPU is busy (a map asked for behind a cycle in flight waited for the whole cycle).
    # Staging buffers here are written only by copies in submissions already made.
    _READ = "READ_NOSYNC"
    from wgpu.backends.wgpu_native._api import libf as _checked_raw
    from wgpu.backends.wgpu_native._api import new_struct as _new_struct

    # The readback maps of `expect` (see there): key -> WGPUMapAsyncStatus, filled by this one
    # callback (userdata1 carries the key) whichever thread's poll settles the map.
    _SETTLED: dict[int, int] = {}
    _MAP_KEYS = itertools.count(1)   # one sequence for every device: keys never collide

    @_ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)")
    def _on_mapped(status, _message, key, _userdata2):
        _SETTLED[int(_ffi.cast("uintptr_t", key))] = int(status)
except ImportError:  # pragma: no cover - exercised where wgpu is not installed
    wgpu = _raw = _NULL = _READ = None

# How long `_settle` goes on polling while polls return with the map still unsettled. It does not
# bound one poll: wgpuDevicePoll(wait) returns when the submission has run, and a hung GPU blocks
# it as long as the driver lets it (as wgpu-py's own wait did).
_MAP_WAIT_S = 120.0


def available() -> bool:
    """True when wgpu-py is importable and finds an adapter."""
    try:
        return _adapter() is not None
    except NoAdapterError:
        return False


_ADAPTER = None


def _runtime_dir() -> None:
    """Give the Vulkan drivers an XDG_RUNTIME_DIR where the session has none (root, a container,
    ssh): without one, Mesa's window-system code prints "error: XDG_RUNTIME_DIR is invalid or
    not set" twice on stderr, on runs that then succeed, where a user reads "error:" as ours.
    A private folder of our own; nothing is written there by a compute device."""
    import atexit
    import os
    import shutil
    import tempfile

    if not os.path.isdir(os.environ.get("XDG_RUNTIME_DIR") or "/nonexistent"):
        os.environ["XDG_RUNTIME_DIR"] = path = tempfile.mkdtemp(prefix="pyspec-xdg-")  # 0700
        atexit.register(shutil.rmtree, path, ignore_errors=True)


def _adapter():
    global _ADAPTER
    if wgpu is None:
        raise NoAdapterError("wgpu-py is not installed: pip install wgpu==0.32.0 (and Debian's "
                             "mesa-vulkan-drivers for a CPU adapter)")
    if _ADAPTER is None:
        _runtime_dir()
        try:
            _ADAPTER = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        except Exception as e:  # wgpu raises a bare RuntimeError when there is no Vulkan ICD
            raise NoAdapterError(f"no WebGPU adapter: {e}; install mesa-vulkan-drivers") from e
        if _ADAPTER is None:
            raise NoAdapterError("no WebGPU adapter; install mesa-vulkan-drivers")
    return _ADAPTER


class NativeDevice(Device):
    def __init__(self, timestamps: bool = False):
        super().__init__()
        self._prepared_plans: dict[int, Prepared] = {}   # id(plan) -> its Prepared (_prepared)
        adapter = _adapter()
        info = adapter.info
        self.name = f"{info.get('device', '?')} ({info.get('backend_type', '?')}, wgpu-py)"
        self.features = frozenset(adapter.features)
        self.is_cpu = info.get("adapter_type") == "CPU"
        self.vendor = info.get("vendor_id")
        self.architecture = info.get("architecture") or None
        limits = adapter.limits
        wanted = {}
        for key in ("max-storage-buffer-binding-size", "max-buffer-size",
                    "max-compute-workgroup-storage-size", "max-storage-buffers-per-shader-stage"):
            wanted[key] = limits[key]
        features = ["timestamp-query"] if timestamps and "timestamp-query" in self.features else []
        self.timestamps = bool(features)
        self.device = adapter.request_device_sync(required_features=features,
                                                  required_limits=wanted)
        self.limits = dict(self.device.limits)
        # id(staging buffer) -> (key in _SETTLED, the submission index to wait for): `expect`
        self._maps: dict[int, tuple[int, int]] = {}
        self._submitted = 0   # the index of the last submission (wgpuQueueSubmitForIndex)

    # --- adapter primitives -------------------------------------------------------------------
    def _checked(self, what: str, make):
        try:
            return make()
        except GPUError:
            raise
        except Exception as e:  # wgpu.GPUValidationError and friends
            raise self._classify(what, e) from e

    def _classify(self, what: str, e: Exception) -> GPUError:
        """A wgpu exception as the GPUError it means: DeviceLostError once the device is lost
        (wgpu-native words it "Parent device is lost", a validation error), else GPUError."""
        text = str(e)
        if self.lost is None and ("device is lost" in text.lower()
                                  or "devicelost" in text.replace(" ", "").lower()):
            self.lost = "the driver reported the device lost"
        if self.lost is not None:
            return DeviceLostError(f"the WebGPU device was lost ({self.lost}) during {what}; "
                                   "the committed tokens are safe, the cycle in flight is dropped")
        return GPUError(f"{what}: {text}")

    def _create_buffer(self, nbytes, usage, label):
        U = wgpu.BufferUsage
        flags = {"storage": U.STORAGE | U.COPY_SRC | U.COPY_DST,
                 "uniform": U.UNIFORM | U.COPY_DST,
                 "readback": U.MAP_READ | U.COPY_DST}[usage]
        return self._checked(f"buffer {label} ({nbytes} bytes)",
                             lambda: self.device.create_buffer(size=nbytes, usage=flags,
                                                               label=label))

    def size_of(self, buffer) -> int:
        return buffer.size

    def _create_pipeline(self, wgsl, entry, label):
        def make():
            module = self.device.create_shader_module(code=wgsl, label=label)
            return self.device.create_compute_pipeline(
                layout="auto", compute={"module": module, "entry_point": entry}, label=label)
        return self._checked(f"pipeline {label}", make)

    def _create_bind_group(self, pipeline, entries, label):
        layout = pipeline.get_bind_group_layout(0)
        desc = [{"binding": i, "resource": {"buffer": b, "offset": o, "size": s}}
                for i, (b, o, s) in enumerate(entries)]
        return self._checked(f"bind group {label}",
                             lambda: self.device.create_bind_group(layout=layout, entries=desc,
                                                                   label=label))

    def _write(self, buffer, data, offset=0):
        self._checked("a buffer write", lambda: self.device.queue.write_buffer(
            buffer, offset, memoryview(data).cast("B") if not hasattr(data, "view") else data))

    def submit(self, commands: list) -> None:
        prepared = [self._prepared(c) if isinstance(c, list) else c for c in commands]
        self._checked("a submission", lambda: Device.submit(self, prepared))

    def _prepared(self, plan: list):
        """A plan as Prepared, made on its first submission and kept (with the plan itself, so
        its id names it while kept); a plan holding copies stays a list. The dispatch loop then
        makes only the C calls: about 1 us a dispatch instead of 3 (a champion pass has 152)."""
        entry = self._prepared_plans.get(id(plan))
        if entry is None or entry.plan is not plan:
            if not all(isinstance(c, Dispatch) for c in plan):
                return plan
            if len(self._prepared_plans) >= 256:   # plans a model forgot: let them go
                self._prepared_plans.clear()
            # A pipeline is set where it changes (always at the plan's first dispatch).
            changes = [i == 0 or c.pipeline is not plan[i - 1].pipeline
                       for i, c in enumerate(plan)]
            entry = Prepared(plan, tuple((c.pipeline._internal if change else None,
                                          c.bind_group._internal, *c.workgroups)
                                         for c, change in zip(plan, changes)))
            self._prepared_plans[id(plan)] = entry
        return entry

    def _replay(self, compute_pass, prepared: Prepared) -> None:
        handle, set_pipeline = compute_pass._internal, _raw.wgpuComputePassEncoderSetPipeline
        set_group = _raw.wgpuComputePassEncoderSetBindGroup
        dispatch = _raw.wgpuComputePassEncoderDispatchWorkgroups
        for pipeline, group, x, y, z in prepared.raw:
            if pipeline is not None:
                set_pipeline(handle, pipeline)
            set_group(handle, 0, group, 0, _NULL)
            dispatch(handle, x, y, z)

    def _begin_encoder(self):
        return self.device.create_command_encoder()

    def _begin_pass(self, encoder):
        return encoder.begin_compute_pass()

    # A pass's commands go straight to wgpu-native's C functions, not through wgpu-py's
    # wrappers (each wraps a call in error capture, and set_bind_group builds an offsets array):
    # recording a champion cycle's dispatches took about 2.8x longer through them (measured on
    # lavapipe by scripts/profile_cycle.py, removed: at commit 0e92f77). Recording reports no
    # error: wgpu-native keeps a pass's errors for its end, and `end()` and `finish()` still go
    # through wgpu-py, which raises them. The plans (Dispatch) keep each pipeline and bind group
    # alive.
    def _set_pipeline(self, compute_pass, pipeline):
        _raw.wgpuComputePassEncoderSetPipeline(compute_pass._internal, pipeline._internal)

    def _dispatch(self, compute_pass, bind_group, workgroups):
        handle = compute_pass._internal
        _raw.wgpuComputePassEncoderSetBindGroup(handle, 0, bind_group._internal, 0, _NULL)
        x, y, z = workgroups
        _raw.wgpuComputePassEncoderDispatchWorkgroups(handle, x, y, z)

    def _end_pass(self, compute_pass):
        compute_pass.end()

    def _copy(self, encoder, c):
        encoder.copy_buffer_to_buffer(c.src, c.src_offset, c.dst, c.dst_offset, c.nbytes)

    def _finish_and_submit(self, encoder):
        commands = encoder.finish()   # held until submitted: its release frees the handle
        buffers = _ffi.new("WGPUCommandBuffer[1]", [commands._internal])
        self._submitted = _checked_raw.wgpuQueueSubmitForIndex(
            self.device.queue._internal, 1, buffers)

    # Readbacks. wgpu-py settles a map on its poll thread, which waits in wgpuDevicePoll for
    # every submission made so far; while it waits it holds the device's fence, and a
    # queue.submit from this thread blocks until the GPU is idle. In a pipelined decode
    # (cycle n+1 submitted before cycle n is read) that made each submission wait for the
    # cycle before it, so the host never ran ahead of the GPU. Here a map is asked for at once
    # (`expect`, right after its submission) with no poll thread involved, and `_map_read_now`
    # polls on this thread for that submission's index only, after the next cycle is submitted.
    def expect(self, readback) -> None:
        key = id(readback.staging)
        if self.lost is not None or key in self._maps:
            return
        token = next(_MAP_KEYS)
        info = _new_struct("WGPUBufferMapCallbackInfo",
                           mode=_raw.WGPUCallbackMode_AllowProcessEvents, callback=_on_mapped,
                           userdata1=_ffi.cast("void *", token))
        self._checked("a readback", lambda: _checked_raw.wgpuBufferMapAsync(
            readback.staging._internal, _raw.WGPUMapMode_Read, 0, readback.size, info))
        self._maps[key] = (token, self._submitted)

    def _settle(self, token: int, index: int) -> None:
        """Wait until the map of `expect` settles: polls for its submission only, on this thread.
        Raises GPUError (a lost device: DeviceLostError) when it did not map."""
        wanted = _ffi.new("WGPUSubmissionIndex *", index)
        deadline = time.perf_counter() + _MAP_WAIT_S
        device = self.device._internal
        while token not in _SETTLED:
            if self.lost is not None:
                raise self._classify("a readback", RuntimeError("device lost"))
            self._checked("a readback", lambda: _checked_raw.wgpuDevicePoll(device, True, wanted))
            if token not in _SETTLED and time.perf_counter() > deadline:
                raise GPUTimeoutError(f"a readback did not map in {_MAP_WAIT_S:.0f} s; the GPU "
                                      "seems hung")
        status = _SETTLED.pop(token)
        if status != _raw.WGPUMapAsyncStatus_Success:
            raise self._classify("a readback", RuntimeError(f"the map failed (status {status})"))

    def release(self, readback) -> None:
        # A readback dropped unread with its map asked for: unmapped before the buffer is reused.
        entry = self._maps.pop(id(readback.staging), None)
        if entry is not None:
            try:
                self._settle(*entry)
                _raw.wgpuBufferUnmap(readback.staging._internal)
            except Exception:  # noqa: BLE001 - a lost device: the buffer goes with it
                pass
        super().release(readback)

    def abandon(self, readback) -> None:
        self._maps.pop(id(readback.staging), None)
        super().abandon(readback)

    reads_now = True

    def redeem_now(self, readback) -> bytes:
        try:
            data = self._map_read_now(readback.staging, readback.size, readback.nbytes)
        except GPUTimeoutError:
            self.abandon(readback)
            raise
        except BaseException:
            self.release(readback)
            raise
        self.release(readback)
        self.redeemed(readback)
        return data

    async def _map_read(self, staging, size, nbytes):
        await asyncio.sleep(0)
        return self._map_read_now(staging, size, nbytes)

    def _map_read_now(self, staging, size, nbytes):
        entry = self._maps.pop(id(staging), None)
        if self.lost is not None:
            raise self._classify("a readback", RuntimeError("device lost"))
        if entry is not None:
            self._settle(*entry)
            try:
                mapped = _raw.wgpuBufferGetConstMappedRange(staging._internal, 0, size)
                return bytes(_ffi.buffer(mapped, nbytes))
            finally:
                _raw.wgpuBufferUnmap(staging._internal)
        try:
            staging.map_sync(_READ, 0, size)
            try:
                return bytes(staging.read_mapped(0, nbytes))
            finally:
                staging.unmap()
        except GPUError:
            raise
        except Exception as e:  # wgpu's errors on the map (a lost device, a failed submission)
            raise self._classify("a readback", e) from e

    def profile(self, commands) -> list[tuple[str, float]]:
        """Run `commands` with a timestamp query around each dispatch (one compute pass each) and
        return [(kernel, seconds)] in order. Needs NativeDevice(timestamps=True) and an adapter
        with 'timestamp-query'; copies are run but not timed."""
        if not self.timestamps:
            raise GPUError("this device was opened without timestamp queries (or the adapter "
                           "has none); open it with timestamps=True")
        dispatches = [c for c in flatten(commands) if isinstance(c, Dispatch)]
        chunk = 1024  # dispatches per query set (2 queries each)
        out: list[tuple[str, float]] = []
        for start in range(0, len(dispatches), chunk):
            part = dispatches[start:start + chunk]
            qs = self.device.create_query_set(type="timestamp", count=2 * len(part))
            U = wgpu.BufferUsage
            resolve = self.device.create_buffer(size=16 * len(part),
                                                usage=U.QUERY_RESOLVE | U.COPY_SRC)
            encoder = self.device.create_command_encoder()
            for i, c in enumerate(part):
                p = encoder.begin_compute_pass(timestamp_writes={
                    "query_set": qs, "beginning_of_pass_write_index": 2 * i,
                    "end_of_pass_write_index": 2 * i + 1})
                p.set_pipeline(c.pipeline)
                p.set_bind_group(0, c.bind_group)
                p.dispatch_workgroups(*c.workgroups)
                p.end()
            encoder.resolve_query_set(qs, 0, 2 * len(part), resolve, 0)
            self.device.queue.submit([encoder.finish()])
            ticks = self.device.queue.read_buffer(resolve)
            import numpy as np
            t = np.frombuffer(ticks, np.uint64).reshape(-1, 2).astype(np.float64)
            out += [(c.kernel, (b - a) * 1e-9) for c, (a, b) in zip(part, t)]
        return out

    def time_pass(self, commands, reps: int = 20) -> float:
        """Median GPU seconds of `commands`' dispatches as one compute pass (the barriers between
        them included), from timestamps at the pass's two ends; copies are left out. What a
        cycle's forward costs the GPU, where `profile`'s pass per dispatch adds each pass's own
        overhead."""
        if not self.timestamps:
            raise GPUError("this device was opened without timestamp queries (or the adapter "
                           "has none); open it with timestamps=True")
        import numpy as np
        dispatches = [c for c in flatten(commands) if isinstance(c, Dispatch)]
        qs = self.device.create_query_set(type="timestamp", count=2)
        U = wgpu.BufferUsage
        resolve = self.device.create_buffer(size=16, usage=U.QUERY_RESOLVE | U.COPY_SRC)
        times = []
        for _ in range(reps + 1):   # one warm-up
            encoder = self.device.create_command_encoder()
            p = encoder.begin_compute_pass(timestamp_writes={
                "query_set": qs, "beginning_of_pass_write_index": 0,
                "end_of_pass_write_index": 1})
            for c in dispatches:
                p.set_pipeline(c.pipeline)
                p.set_bind_group(0, c.bind_group)
                p.dispatch_workgroups(*c.workgroups)
            p.end()
            encoder.resolve_query_set(qs, 0, 2, resolve, 0)
            self.device.queue.submit([encoder.finish()])
            a, b = np.frombuffer(self.device.queue.read_buffer(resolve), np.uint64)
            times.append((float(b) - float(a)) * 1e-9)
        return sorted(times[1:])[reps // 2]

    def destroy(self):
        self.lost = "destroyed"
        self.device.destroy()
