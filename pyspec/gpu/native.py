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

from .device import Device, DeviceLostError, Dispatch, GPUError, NoAdapterError, flatten

try:  # wgpu-py is optional: the CPU engine and the browser build do not need it
    import wgpu
except ImportError:  # pragma: no cover - exercised where wgpu is not installed
    wgpu = None


def available() -> bool:
    """True when wgpu-py is importable and finds an adapter."""
    try:
        return _adapter() is not None
    except NoAdapterError:
        return False


_ADAPTER = None


def _adapter():
    global _ADAPTER
    if wgpu is None:
        raise NoAdapterError("wgpu-py is not installed: pip install wgpu==0.32.0 (and Debian's "
                             "mesa-vulkan-drivers for a CPU adapter)")
    if _ADAPTER is None:
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
        adapter = _adapter()
        info = adapter.info
        self.name = f"{info.get('device', '?')} ({info.get('backend_type', '?')}, wgpu-py)"
        self.features = frozenset(adapter.features)
        self.is_cpu = info.get("adapter_type") == "CPU"
        self.vendor = info.get("vendor_id")
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

    def write(self, buffer, data, offset=0):
        self._checked("a buffer write", lambda: self.device.queue.write_buffer(
            buffer, offset, memoryview(data).cast("B") if not hasattr(data, "view") else data))

    def submit(self, commands: list) -> None:
        self._checked("a submission", lambda: Device.submit(self, commands))

    def _begin_encoder(self):
        return self.device.create_command_encoder()

    def _begin_pass(self, encoder):
        return encoder.begin_compute_pass()

    def _set_pipeline(self, compute_pass, pipeline):
        compute_pass.set_pipeline(pipeline)

    def _dispatch(self, compute_pass, bind_group, workgroups):
        compute_pass.set_bind_group(0, bind_group)
        compute_pass.dispatch_workgroups(*workgroups)

    def _end_pass(self, compute_pass):
        compute_pass.end()

    def _copy(self, encoder, c):
        encoder.copy_buffer_to_buffer(c.src, c.src_offset, c.dst, c.dst_offset, c.nbytes)

    def _finish_and_submit(self, encoder):
        self.device.queue.submit([encoder.finish()])

    async def _map_read(self, staging, size, nbytes):
        if self.lost is not None:
            raise self._classify("a readback", RuntimeError("device lost"))
        try:
            await asyncio.sleep(0)
            staging.map_sync(wgpu.MapMode.READ, 0, size)
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

    def destroy(self):
        self.lost = "destroyed"
        self.device.destroy()
