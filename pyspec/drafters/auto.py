"""The draft "auto", once: the drafter measured fastest on each kind of engine. The command line
(load.default_draft), the page's session (apps/session.py) and its worker (web/worker.js asks the
session before any draft downloads) all ask this rule.

On a GPU that is not a software adapter, the draft model: on the H200 the trained draft ran
fastest under the guard, ahead of n-gram and of ngram+trained, in one run (bench/results/h200.json,
legacy). On the numpy engine and on software adapters (lavapipe, SwiftShader), prompt n-gram: on
the numpy engine the trained draft's gain is within the run-to-run spread
(bench/results/cpu-guard-reduced-head.json), in the page's the guard keeps every drafter off
(bench/results/browser-cpu-guard3.json), and on software adapters four draft steps cost more than
the rows they save. The figures are in the README's table, made from those files; none is
copied here, where it could drift.

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
