"""The draft "auto", once: the drafter measured fastest on each kind of engine. The command line
(load.default_draft), the page's session (apps/session.py) and its worker (web/worker.js asks the
session before any draft downloads) all ask this rule.

On a GPU that is not a software adapter, the draft model: on the H200 the trained draft ran 1.43x
champion-only under the guard against n-gram's 1.19x and ngram+trained's 1.30x, in one run
(bench/results/h200.json, 2026-12-04; 1.41x against 1.15x in h200-1203-night.json). On the numpy
engine and on software adapters (lavapipe, SwiftShader), prompt n-gram: on the numpy engine the
trained draft with its reduced head ran 1.03x guarded against n-gram's 1.01x, within the
run-to-run spread (bench/results/cpu-guard-reduced-head.json); on the page's numpy engine 1.00x
guarded (`long` 0.968x) against n-gram's 1.00x with every stratum at 0.988x or more
(bench/results/browser-cpu-guard3.json); on software adapters four draft steps cost more than
the rows they save (bench/results/README.md).

Not here: loading the draft model (load.py), the drafters themselves.
"""

from __future__ import annotations

ENGINES = ("gpu", "software", "cpu")


def auto_draft(has_model: bool, engine: str, name: str) -> tuple[bool, str]:
    """(True, why) where "auto" drafts with the draft model, (False, why) where with prompt
    n-gram. `has_model`: a draft model exists for this champion; `engine`: "gpu" (a hardware GPU
    adapter), "software" (a software adapter) or "cpu" (the numpy engine); `name`: the adapter
    or engine, for the reason."""
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r} is not one of {ENGINES}")
    if not has_model:
        return False, "there is no draft model for this champion: prompt n-gram"
    if engine == "gpu":
        return True, f"a hardware GPU adapter ({name}): the draft model"
    where = (f"a software WebGPU adapter ({name})" if engine == "software"
             else f"the engine runs on {name}")
    return False, f"{where}, where the draft model does not pay: prompt n-gram"
