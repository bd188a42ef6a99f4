"""Fault recovery times in the page (issue 11): every fault kind x {greedy, replay}, median of runs.

    .venv/bin/python -m experiments.bench_faults --runs 5 --out bench/results/faults.json \\
        --screenshots fault-screens

One headless Chromium page (the demo page, tiny model, WebGPU on SwiftShader, drills=1) runs each
fault through the page's drills switch, as e2e/test_browser_faults.py does, and records:
  - recovery_s: what the receipt says (from the fault until decoding went on: a new device or
    the numpy engine for GPU faults; the worker restart plus the resumed prefill for worker
    faults; the re-download, the wait or the switch to memory for loading faults);
  - wall_s: the request's wall time (loading faults: the reload plus the request), next to the
    undisturbed request's, measured in the same run;
  - for device-lost-repeat, the time until the retry-limit error instead.
With --screenshots, one PNG per kind of the page right after the fault (its notice or error), of
the tiny model; docs/faults.md's pictures are the champion's, from webtools/screenshot.py.
Timings are the bench's business, never a test's. SwiftShader on a shared CPU is slow: a new
WebGPU device costs its pipelines' compilation, a new worker a Pyodide start.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

from webtools import browser as web_browser
from webtools import serve, site
from pyspec.apps import provenance

PROMPT = "the cat sat on the mat. the cat"
MODES = {"greedy": {"temperature": 0}, "replay": {"temperature": 0.8, "seed": 5}}
REQUEST = ("device-lost", "device-lost-repeat", "gpu-oom", "readback-throw", "readback-hang",
           "worker-terminate", "worker-oom")
LOAD = ("opfs-truncate", "opfs-flip", "opfs-quota", "opfs-unavailable", "download-drop")
CYCLE = 3

_RUN = """async ([prompt, config, loadDrill]) => {
  const t0 = performance.now();
  if (loadDrill) await pyspecApp.decoder().reload({ loadDrill });
  let result = null, error = null;
  try {
    result = await pyspecApp.run(prompt, config);
  } catch (e) {
    error = { code: e.code, message: e.message };
  }
  return { result, error, wall_s: (performance.now() - t0) / 1000 };
}"""


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": len(values)} if values else None


def run_cell(page, kind: str, mode: str, n_tokens: int) -> dict:
    config = {"draft": "ngram", "k": "fixed:3", "max_tokens": n_tokens, **MODES[mode]}
    load = kind if kind in LOAD else None
    if kind in REQUEST:
        config["drill"] = f"{kind}@{CYCLE}"
    out = page.evaluate(_RUN, [PROMPT, config, load])
    if out["error"]:
        return {"wall_s": out["wall_s"], "recovery_s": None, "error": out["error"]["code"]}
    faults = out["result"]["receipt"]["faults"]
    return {"wall_s": out["wall_s"], "error": None,
            # a loading fault is the receipt's first; a request's fault its last
            "recovery_s": (faults[0] if load else faults[-1])["recovery_s"] if faults else None,
            "kinds": [f["kind"] for f in faults], "adapter": out["result"]["stats"]["adapter"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--kinds", default=",".join(REQUEST + LOAD))
    ap.add_argument("--out", type=Path, default=Path("bench/results/faults.json"))
    ap.add_argument("--screenshots", type=Path, default=None)
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    root = site.build(Path(tempfile.mkdtemp()), champion=False).parent
    server, base = serve.start(root)
    table: dict = {}
    try:
        with sync_playwright() as p:
            browser = web_browser.launch(p)
            page = browser.new_context().new_page()
            page.set_default_timeout(600_000)
            page.goto(f"{base}index.html?model=tiny&backend=webgpu&drills=1")
            info = page.evaluate("() => pyspecApp.ready")
            undisturbed = {m: [page.evaluate(_RUN, [PROMPT, {"draft": "ngram", "k": "fixed:3",
                                                            "max_tokens": args.max_tokens,
                                                            **MODES[m]}, None])["wall_s"]
                               for _ in range(args.runs)] for m in MODES}
            for kind in args.kinds.split(","):
                table[kind] = {}
                for mode in MODES:
                    cells = []
                    for i in range(args.runs):
                        cells.append(run_cell(page, kind, mode, args.max_tokens))
                        if args.screenshots and i == 0 and mode == "greedy":
                            args.screenshots.mkdir(parents=True, exist_ok=True)
                            page.screenshot(path=str(args.screenshots / f"fault-{kind}.png"))
                        print(kind, mode, cells[-1], flush=True)
                    rec = [c["recovery_s"] for c in cells if c["recovery_s"] is not None]
                    table[kind][mode] = {
                        "recovery_s": summary(rec), "wall_s": summary([c["wall_s"] for c in cells]),
                        "errors": sorted({c["error"] for c in cells if c["error"]}),
                        "fault_kinds": sorted({k for c in cells for k in c.get("kinds", [])}),
                        "finished_on": sorted({c["adapter"] for c in cells if c.get("adapter")})}
                write(args, info, undisturbed, table)   # after each kind: a partial table
            browser.close()
    finally:
        server.shutdown()
    print(f"wrote {args.out}")
    return 0


def write(args, info: dict, undisturbed: dict, table: dict) -> None:
    result = {"what": "fault recovery in the page: tiny model, WebGPU on SwiftShader, "
                      f"fault at cycle {CYCLE}, {args.max_tokens} tokens, ngram k=3",
              "adapter": info["adapter"], "machine": platform.machine(),
              "cpus": os.cpu_count(), "load_average": os.getloadavg(),
              "undisturbed_wall_s": {m: summary(v) for m, v in undisturbed.items()},
              "faults": table}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    provenance.write(str(args.out), provenance.stamp(result, champion=""))


if __name__ == "__main__":
    sys.exit(main())
