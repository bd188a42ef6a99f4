"""pyspec/gctime.py: the collector's time is counted per GPU cycle, and a settle sets the loaded
objects aside from its walks (and gives back what an earlier settle set aside)."""

from __future__ import annotations

import gc
import weakref

from conftest import requires_gpu
from pyspec import gctime
from pyspec.engine import Engine
from pyspec.load import backend as backend_for
from pyspec.options import Options


def test_a_collection_is_counted():
    gctime.install()
    before = gctime.snapshot()
    gc.collect()
    after = gctime.snapshot()
    assert after[1] == before[1] + 1 and after[2] == before[2] + 1 and after[0] > before[0]


class Node:
    pass


def test_settle_freezes_what_is_alive_and_gives_back_the_last_settle():
    """A replaced model held in a reference cycle (a backend and its engine point at each other)
    is collected by the next settle: what the last one set aside goes back to the collector."""
    try:
        node = Node()
        node.me = node                               # a cycle: only the collector frees it
        gctime.settle()
        assert gc.get_freeze_count() > 0
        gone = weakref.ref(node)
        del node
        gc.collect()
        assert gone() is not None                    # frozen: the collector does not walk it
        gctime.settle()
        assert gone() is None                        # given back, then collected
    finally:
        gc.unfreeze()


@requires_gpu
def test_a_gpu_cycle_reports_the_collectors_time(tiny, monkeypatch):
    """A collection made while cycles run shows in that request's timing: per cycle beside the
    host time, and in the totals."""
    engine = Engine(backend_for(tiny.on("gpu"), "ngram"), tiny.tokenizer)
    dev = engine.backend.dev
    submit, made = dev.submit, []

    def submit_and_collect(commands):
        if len(made) == 3:
            gc.collect()
        made.append(1)
        return submit(commands)

    monkeypatch.setattr(dev, "submit", submit_and_collect)
    result = engine.generate(tiny.prompt, Options(max_tokens=12))
    t = result.stats["backend_timing"]
    assert len(t["gc_s_cycles"]) == len(t["host_s_cycles"]) == t["cycles"] > 3
    assert t["gc_full"] >= 1 and t["gc_s"] >= sum(t["gc_s_cycles"]) > 0
