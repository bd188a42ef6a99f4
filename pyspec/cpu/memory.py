"""The CPU engine's memory budget: which models it loads, and the largest one that fits.

The fast CPU engine (fastcpu.py) keeps float32 weights, 4 bytes a parameter. A model whose
float32 weights exceed `float32_budget` is refused by name (ModelTooLargeError) before anything
is dequantized, with the largest parameter count that fits: natively the budget is
HOST_FRACTION of the machine's memory; in the page it is the wasm heap (32-bit: 4 GiB) less
PAGE_RUNTIME_BYTES for Pyodide, numpy and pyspec (the file is not there: the worker streams its
tensors from OPFS, web/stream.js).
The model card (apps/info.py) states the same rule, with the KV cache at the context it assumes.

Measured and not taken: keeping such a model's matrices in their block format and dequantizing
a block of rows at a time. It was built (the commit that added pyspec/cpu/blocks.py: logits
bit-identical to float32 on every block format) and a one-token pass cost 2.9 to 7.1 times
float32's time a parameter natively (the champion and the Qwen3-0.6B shape, both row kernels, a
loaded machine) and 5.9 times in Pyodide: over the 3 times we allowed
(bench/results/cpu-blocks.json (legacy), docs/cpu-engine.md "Big models").
Not here: the model card (apps/info.py), the engine (fastcpu.py).
"""

from __future__ import annotations

import os
import sys

from ..errors import ModelTooLargeError

# Pyodide, numpy and pyspec in the wasm heap before any weight (measured: 778 MB after loading
# the 135M champion, whose float32 weights and cache take about 600 MB; README "CPU engine").
PAGE_RUNTIME_BYTES = 300 << 20
WASM_HEAP_BYTES = 4 << 30
# Natively, float32 weights may take this share of the machine's memory: the rest is the KV
# cache's, the file's page cache and everything else the machine runs.
HOST_FRACTION = 0.5


def memory_host() -> int | None:
    """Bytes of memory on this machine, where the OS says (None in the page)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def in_page() -> bool:
    """Whether this is Pyodide in the page (its heap is the limit, not the machine's memory)."""
    return sys.platform == "emscripten"


def float32_budget(page: bool | None = None) -> int | None:
    """Bytes float32 weights may take: in the page (default: when running there) the wasm heap
    less the runtime; natively HOST_FRACTION of this machine's memory (None where the OS does
    not say: no limit)."""
    if in_page() if page is None else page:
        return WASM_HEAP_BYTES - PAGE_RUNTIME_BYTES
    host = memory_host()
    return None if host is None else int(HOST_FRACTION * host)


def budget_words(page: bool | None = None) -> str:
    """What the budget is, for messages."""
    if in_page() if page is None else page:
        return "the page's 4 GiB wasm heap less 300 MiB of runtime"
    return f"{HOST_FRACTION:.0%} of this machine's memory"


def check_fits(n_params: int, source: str) -> None:
    """ModelTooLargeError where the float32 weights of `n_params` parameters exceed the budget,
    naming the largest parameter count that fits."""
    budget = float32_budget()
    if budget is None or 4 * n_params <= budget:
        return
    raise ModelTooLargeError(
        f"{source} has {n_params / 1e6:,.0f}M parameters: the CPU engine keeps float32 weights, "
        f"{4 * n_params / 2**30:.2f} GiB, over its budget of {budget / 2**30:.2f} GiB "
        f"({budget_words()}); the largest model it loads here has {budget // 4 / 1e6:,.0f}M "
        "parameters. Run this one on a GPU (--backend wgpu, or the page with WebGPU: weights "
        "stay in their block format there), or pick a smaller model")
