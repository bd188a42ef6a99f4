"""pyspec on WebGPU: the device interface and its two adapters, the kernels' host wrappers, the
GPU forward and the GPU-resident speculative cycle (docs/architecture.md).

    dev = open_device()                      # wgpu-py natively; browser.py brings its own
    champion = load_model(dev, GGUFFile.open(path), max_ctx=4096)
    engine = Engine(load.backend(champion, "ngram"), tokenizer)   # the engine the CPU uses

Only native.py and browser.py know where the device comes from.
"""

from __future__ import annotations

from .device import ROWS_MAX, Device, DeviceLostError, GPUError, NoAdapterError  # noqa: F401


def open_device(timestamps: bool = False) -> Device:
    """The native device (wgpu-py). Raises NoAdapterError with what to install when absent."""
    from .native import NativeDevice

    return NativeDevice(timestamps=timestamps)


def load_model(dev: Device, f, max_ctx: int | None = None, label: str = "champion",
               lender=None):
    """A GPUModel on `dev` from a GGUFFile; every model on a device shares its Step slots.
    `lender`: the champion's GPUModel, whose buffers serve the tensors a draft borrows."""
    from .model import GPUModel

    return GPUModel(dev, f, dev.steps, max_ctx, label, lender)
