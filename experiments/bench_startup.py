"""The page's start-up, measured: navigation to ready, and the worker's phases, with and without
the Pyodide snapshot, on first visits (a fresh browser profile: empty OPFS and HTTP cache) and
warm ones (the same profile again: weights and snapshot in OPFS).

    python -m experiments.bench_startup [--model smollm2] [--backend cpu] [--runs 3]
                                    [--without-jinja2] [--render] [--out bench/results/startup]

Each run is one fresh profile visited `1 + --warm` times; with snapshot on and off alternating
run by run, so drift hits both alike. Ready is timed from page.goto to the ready message, as a
user would see it; `startup.phases_ms` is the worker's own account (web/worker.js): pyodide,
packages (numpy's and pyspec's wheels unpacked), import (numpy, pyspec), weights (their sha256
as they stream from OPFS), model (parse, tokenizer, tensors streamed and uploaded or
dequantized); each visit records the wasm heap's size before the weights and after the load.
`--without-jinja2` serves a site whose manifest leaves out jinja2's and MarkupSafe's wheels
(kind "wheel"), to measure what they add; `--render` sends one request after ready and
records `startup.jinja2` (the first render of a model's own chat template: `--model tiny-llama3`).
Writes <out>.json (medians and ranges) and <out>.png.

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

from webtools import browser, serve, site
from pyspec.apps import provenance

ROOT = Path(__file__).resolve().parents[1]

WAIT_SNAPSHOT = """async () => {
  for (;;) {
    const s = await pyspecApp.decoder().startup();
    if (s.snapshot !== "making" && s.bytecode !== "making") return s;
    await new Promise((r) => setTimeout(r, 100));
  }
}"""
PHASES = ("pyodide", "packages", "import", "weights", "model")


RENDER = """async () => {
  await pyspecApp.run("the cat sat on the mat", { max_tokens: 1 });
  return (await pyspecApp.decoder().startup()).jinja2;
}"""


def visit(ctx, url: str, render: bool = False) -> dict:
    page = ctx.new_page()
    t0 = time.perf_counter()
    page.goto(url)
    info = page.evaluate("() => pyspecApp.ready")
    ready_s = time.perf_counter() - t0
    # A visitor stays: the snapshot (and bytecode) for the next visit are made after ready, by
    # a worker that closing the page would end. Wait for it, timed from ready.
    done = page.evaluate(WAIT_SNAPSHOT)
    made_s = time.perf_counter() - t0 - ready_s
    jinja2 = page.evaluate(RENDER) if render else None
    page.close()
    return {"ready_s": round(ready_s, 3), "snapshot": info["startup"]["snapshot"],
            "after_ready": {"snapshot": done["snapshot"], "seconds": round(made_s, 3),
                            "error": done.get("snapshot_error")},
            "bytecode": info["startup"].get("bytecode"),
            "phases_ms": info["startup"]["phases_ms"], "adapter": info["adapter"],
            "cached": info["weights"]["cached"], "jinja2": jinja2,
            # the wasm heap before the weights and after the load (they stream a tensor at a time)
            "wasm_bytes": info.get("wasm_bytes")}


def summary(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "n": len(values)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--backend", default="auto", help="the page's backend=: auto | cpu | webgpu")
    ap.add_argument("--runs", type=int, default=3, help="fresh profiles per setting")
    ap.add_argument("--warm", type=int, default=2, help="warm visits after each first one")
    ap.add_argument("--without-jinja2", action="store_true",
                    help="a site without jinja2's and MarkupSafe's wheels")
    ap.add_argument("--render", action="store_true",
                    help="one request after ready: the first chat template render's cost")
    ap.add_argument("--out", default="bench/results/startup")
    args = ap.parse_args(argv)

    from playwright.sync_api import sync_playwright
    root = Path(site.build(site.SITE.with_name("site-no-jinja2") if args.without_jinja2
                           else site.SITE)).parent
    if args.without_jinja2:
        manifest = json.loads((root / "manifest.json").read_text())
        manifest["artifacts"] = [a for a in manifest["artifacts"] if a["kind"] != "wheel"]
        (root / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
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
                visits = [visit(ctx, url, args.render) for _ in range(1 + args.warm)]
                ctx.close()
                runs.append({"snapshot_option": snapshot, "visits": visits})
                print(f"snapshot={int(snapshot)}: " + ", ".join(
                    f"{v['ready_s']:.2f} s ({v['snapshot']}, bytecode {v['bytecode']}, wasm "
                    f"{v['wasm_bytes']['before_weights'] >> 20} -> "
                    f"{v['wasm_bytes']['after_load'] >> 20} MiB)"
                    for v in visits), flush=True)
            b.close()
    finally:
        server.shutdown()

    result = {"model": args.model, "backend": args.backend, "jinja2": not args.without_jinja2,
              "machine": platform.machine(),
              "cpus": os.cpu_count(), "runs": runs, "summary": {}}
    for snapshot in (True, False):
        for kind, pick in (("first", lambda vs: vs[:1]), ("warm", lambda vs: vs[1:])):
            vs = [v for r in runs if r["snapshot_option"] == snapshot for v in pick(r["visits"])]
            if not vs:
                continue
            result["summary"][f"{'snapshot' if snapshot else 'no_snapshot'}/{kind}"] = {
                "ready_s": summary([v["ready_s"] for v in vs]),
                "phases_ms": {p: summary([v["phases_ms"][p] for v in vs]) for p in PHASES},
                **({"first_render_ms": summary([v["jinja2"]["first_render_ms"] for v in vs])}
                   if args.render else {})}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    provenance.write(str(out.with_suffix(".json")), provenance.stamp(result))
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
