"""The page's start-up, measured: navigation to ready, and the worker's phases, with and without
the Pyodide snapshot, on first visits (a fresh browser profile: empty OPFS and HTTP cache) and
warm ones (the same profile again: weights and snapshot in OPFS).

    python scripts/bench_startup.py [--model smollm2] [--backend cpu] [--runs 3]
                                    [--out bench/results/startup]

Each run is one fresh profile visited `1 + --warm` times; with snapshot on and off alternating
run by run, so drift hits both alike. Ready is timed from page.goto to the ready message, as a
user would see it; `startup.phases_ms` is the worker's own account (web/worker.js): pyodide,
packages (numpy's and pyspec's wheels unpacked), import (numpy, pyspec), weights (OPFS read + sha256), model (parse, tokenizer,
dequantize). Writes <out>.json (medians and ranges) and <out>.png.

Not here: the page itself (web/), the browser benchmark of decoding (webtools/bench.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from webtools import browser, serve, site  # noqa: E402
from pyspec.apps import provenance  # noqa: E402

WAIT_SNAPSHOT = """async () => {
  for (;;) {
    const s = await pyspecApp.decoder().startup();
    if (s.snapshot !== "making" && s.bytecode !== "making") return s;
    await new Promise((r) => setTimeout(r, 100));
  }
}"""
PHASES = ("pyodide", "packages", "import", "weights", "model")


def visit(ctx, url: str) -> dict:
    page = ctx.new_page()
    t0 = time.perf_counter()
    page.goto(url)
    info = page.evaluate("() => pyspecApp.ready")
    ready_s = time.perf_counter() - t0
    # A visitor stays: the snapshot (and bytecode) for the next visit are made after ready, by
    # a worker that closing the page would end. Wait for it, timed from ready.
    done = page.evaluate(WAIT_SNAPSHOT)
    made_s = time.perf_counter() - t0 - ready_s
    page.close()
    return {"ready_s": round(ready_s, 3), "snapshot": info["startup"]["snapshot"],
            "after_ready": {"snapshot": done["snapshot"], "seconds": round(made_s, 3),
                            "error": done.get("snapshot_error")},
            "bytecode": info["startup"].get("bytecode"),
            "phases_ms": info["startup"]["phases_ms"], "adapter": info["adapter"],
            "cached": info["weights"]["cached"]}


def summary(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "n": len(values)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--backend", default="auto", help="the page's backend=: auto | cpu | webgpu")
    ap.add_argument("--runs", type=int, default=3, help="fresh profiles per setting")
    ap.add_argument("--warm", type=int, default=2, help="warm visits after each first one")
    ap.add_argument("--out", default="bench/results/startup")
    args = ap.parse_args(argv)

    from playwright.sync_api import sync_playwright
    root = Path(site.build()).parent
    server, base = serve.start(root)
    runs = []
    try:
        with sync_playwright() as pw:
            b = browser.launch(pw)
            order = [s for j in range(args.runs)
                     for s in ((True, False) if j % 2 == 0 else (False, True))]
            for snapshot in order:
                url = (f"{base}index.html?model={args.model}&backend={args.backend}"
                       f"&snapshot={int(snapshot)}")
                ctx = b.new_context()      # a fresh profile: no OPFS, no HTTP cache
                visits = [visit(ctx, url) for _ in range(1 + args.warm)]
                ctx.close()
                runs.append({"snapshot_option": snapshot, "visits": visits})
                print(f"snapshot={int(snapshot)}: " + ", ".join(
                    f"{v['ready_s']:.2f} s ({v['snapshot']}, bytecode {v['bytecode']})"
                    for v in visits), flush=True)
            b.close()
    finally:
        server.shutdown()

    result = {"model": args.model, "backend": args.backend, "machine": platform.machine(),
              "cpus": os.cpu_count(), "runs": runs, "summary": {}}
    for snapshot in (True, False):
        for kind, pick in (("first", lambda vs: vs[:1]), ("warm", lambda vs: vs[1:])):
            vs = [v for r in runs if r["snapshot_option"] == snapshot for v in pick(r["visits"])]
            if not vs:
                continue
            result["summary"][f"{'snapshot' if snapshot else 'no_snapshot'}/{kind}"] = {
                "ready_s": summary([v["ready_s"] for v in vs]),
                "phases_ms": {p: summary([v["phases_ms"][p] for v in vs]) for p in PHASES}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    provenance.stamp(result)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, out.with_suffix(".png"))
    for name, s in result["summary"].items():
        print(f"{name:22s} ready {s['ready_s']['median']:.2f} s "
              f"[{s['ready_s']['min']:.2f}, {s['ready_s']['max']:.2f}]  " + "  ".join(
                  f"{p} {s['phases_ms'][p]['median'] / 1000:.2f}" for p in PHASES))
    return 0


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(result["summary"])
    fig, ax = plt.subplots(figsize=(9.5, 3.5))
    left = [0.0] * len(names)
    for p in PHASES:
        widths = [result["summary"][n]["phases_ms"][p]["median"] / 1000 for n in names]
        ax.barh(names, widths, left=left, label=p)
        left = [a + w for a, w in zip(left, widths)]
    ax.scatter([result["summary"][n]["ready_s"]["median"] for n in names], names, color="k",
               marker="|", s=300, label="ready (navigation to ready)", zorder=3)
    ax.set_xlabel("seconds (medians)")
    ax.set_title(f"page start-up, {result['model']}, backend={result['backend']}, "
                 f"{result['cpus']} cores")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
