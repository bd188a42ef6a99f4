"""The time Python's garbage collector takes, so a GPU cycle's host time can say how much of it
was a collection. Under Pyodide the collector walks the wasm heap, where the long-lived objects
of a loaded model (the tokenizer's vocabulary and merges, the plans) are many: a collection that
reaches them takes milliseconds, inside whichever cycle triggered it.

`settle()`, after a load (the page's Session.load, `pyspec bench`), sets the loaded objects aside
from the collector's walks. `install()` adds one callback to `gc.callbacks` (two clock reads a collection); `snapshot()` is
(seconds, collections, collections of the oldest generation) since then. gpu/backend.py keeps
the difference per cycle beside its host time (`gc_s_cycles`) and per request.
"""

from __future__ import annotations

import gc
import time

_TOTAL = [0.0, 0, 0]      # seconds, collections, full (generation 2) collections
_STARTED = [0.0]


def _callback(phase: str, info: dict) -> None:
    if phase == "start":
        _STARTED[0] = time.perf_counter()
        return
    _TOTAL[0] += time.perf_counter() - _STARTED[0]
    _TOTAL[1] += 1
    _TOTAL[2] += info.get("generation") == 2


def install() -> None:
    if _callback not in gc.callbacks:
        gc.callbacks.append(_callback)


def snapshot() -> tuple[float, int, int]:
    return (_TOTAL[0], _TOTAL[1], _TOTAL[2])


def settle() -> None:
    """After a load: what is alive now (the models, the tokenizer, the plans) is set aside from
    the collector's walks (gc.freeze), so a collection mid-request walks only what the request
    made. What an earlier settle set aside goes back first (gc.unfreeze), so a model replaced
    since is collected."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
