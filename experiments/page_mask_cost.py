"""The JSON-schema mask's cost per masked row in the page (issue 12's goal: <= 5 ms in the page,
<= 1 ms natively), on the schemas of bench/json_prompts.jsonl.

    .venv/bin/python -m experiments.page_mask_cost [--reps 3]
        [--out bench/results/page-mask-cost.json]

The built site is served as the e2e tests serve it, and headless Chromium opens a page on its
origin that starts a module worker loading Pyodide, its packages and the pyspec wheel as
web/worker.js does (from the site's pyodide/ and manifest.json). In that worker, with the
champion's tokenizer (its GGUF metadata, read natively and handed over as JSON), the mask
processor (JsonMask.apply on one row) runs along each prompt's `document` (a valid answer,
tokenized), every mask cold, as bench_json.py's `mask_cost` does natively; `reps` passes, each
with fresh maskers (the vocabulary's tables built once, timed apart). Wasm runs the worker's one
thread, so the per-row time is wall time (performance.now through time.perf_counter); the
machine's load average is recorded before and after, since other work on a shared machine lands
in it; each row's fastest pass tells a slow mask from an interruption. The native `mask_cost`
(CPU time) runs in the same invocation for comparison. Timing
goals live here, never in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from pyspec import champion_path
from pyspec.formats.gguf import GGUFFile
from pyspec.text.tokenizer import Tokenizer
from webtools import browser, serve, site

ROOT = Path(__file__).resolve().parent.parent

PROMPTS = ROOT / "bench" / "json_prompts.jsonl"
PAGE = "page-mask-cost.html"   # answered by the browser context itself (never in the site)

# Runs in the worker's Pyodide: bench_json.mask_cost's loop, timed by wall clock per row.
PYTHON = """
import json, statistics, time
import numpy as np
from pyspec.rules import jsonmask
from pyspec.text.tokenizer import Tokenizer

md = json.load(open("/home/pyodide/tokenizer.json"))
items = json.load(open("/home/pyodide/items.json"))
t = time.perf_counter()
tok = Tokenizer.from_metadata(md)
tokenizer_s = time.perf_counter() - t
cache = {}
t = time.perf_counter()
jsonmask.tables(jsonmask.constrain(cache, tok, {"type": "null"}, 0).masker.vocab)
tables_s = time.perf_counter() - t
passes = []
for _ in range(REPS):
    per_row = {}
    for item in items:
        c = jsonmask.constrain(cache, tok, item["schema"], 0)
        ids = tok.encode(json.dumps(item["document"], separators=(",", ":"),
                                    ensure_ascii=False)) + [tok.eos_id]
        assert c.state_after(ids) is c.done, item["id"]
        c = jsonmask.Constraint(jsonmask.Masker(c.masker.grammar, c.masker.vocab, tok.eos_id), 0)
        logits = np.zeros((1, tok.vocab_size))
        rows = []
        for i in range(len(ids)):
            t = time.perf_counter()
            jsonmask.JsonMask(c).apply(logits, ids[:i], [])
            rows.append(1e3 * (time.perf_counter() - t))
        per_row[item["id"]] = rows
    passes.append(per_row)
json.dumps({"tokenizer_s": tokenizer_s, "vocab_and_tables_s": tables_s, "passes": passes})
"""

WORKER = """
import { loadPyodide } from "SITE/pyodide/pyodide.mjs";
self.onmessage = async ({ data }) => {
  try {
    const site = data.site, t0 = performance.now();
    const pyodide = await loadPyodide({ indexURL: site + "pyodide/" });
    const m = await (await fetch(site + "manifest.json")).json();
    await pyodide.loadPackage(m.pyodide_packages, { messageCallback: () => {} });
    const wheel = m.artifacts.find((a) => a.kind === "pyspec-wheel");
    const bytes = new Uint8Array(await (await fetch(new URL(wheel.url, site))).arrayBuffer());
    const path = "/home/pyodide/" + wheel.url.split("/").pop();
    pyodide.FS.writeFile(path, bytes);
    const micropip = pyodide.pyimport("micropip");
    await micropip.install.callKwargs("emfs:" + path, { deps: false });
    micropip.destroy();
    pyodide.FS.writeFile("/home/pyodide/tokenizer.json", data.tokenizer);
    pyodide.FS.writeFile("/home/pyodide/items.json", data.items);
    const start_s = (performance.now() - t0) / 1000;
    const out = JSON.parse(pyodide.runPython(data.code));
    postMessage({ ...out, start_s, pyodide: pyodide.version });
  } catch (err) {
    postMessage({ error: String(err?.stack ?? err) });
  }
};
"""

_RUN = """([site, worker, message]) => new Promise((resolve) => {
  const url = URL.createObjectURL(new Blob([worker], { type: "text/javascript" }));
  const w = new Worker(url, { type: "module" });
  w.onmessage = (e) => { w.terminate(); resolve(e.data); };
  w.onerror = (e) => { w.terminate(); resolve({ error: e.message }); };
  w.postMessage({ site, ...message });
})"""


def summary(values: list[float]) -> dict:
    values = sorted(values)
    return {"median": statistics.median(values), "mean": statistics.mean(values),
            "p90": values[int(0.9 * len(values))], "max": values[-1]}


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--champion", default=None)
    p.add_argument("--out", default="bench/results/page-mask-cost.json")
    args = p.parse_args()
    metadata = GGUFFile.open(args.champion or champion_path()).metadata
    tokenizer = {k: v for k, v in metadata.items() if k.startswith("tokenizer.")}
    items = [{k: it[k] for k in ("id", "schema", "document")}
             for it in map(json.loads, PROMPTS.read_text().splitlines())]
    from playwright.sync_api import sync_playwright
    root = site.build()
    server, base = serve.start(Path(root).parent)   # build() returns the manifest path
    load_before = uptime()
    try:
        with sync_playwright() as pw:
            b = browser.launch(pw)
            context = b.new_context()
            context.set_default_timeout(1000 * 1800)
            context.route(f"{base}{PAGE}", lambda route: route.fulfill(
                status=200, content_type="text/html", body="<!doctype html><title>mask cost</title>",
                headers={"Cross-Origin-Opener-Policy": "same-origin",
                         "Cross-Origin-Embedder-Policy": "require-corp"}))
            page = context.new_page()
            page.goto(base + PAGE)
            out = page.evaluate(_RUN, [base, WORKER.replace("SITE/", base), {
                "tokenizer": json.dumps(tokenizer), "items": json.dumps(items),
                "code": PYTHON.replace("REPS", str(args.reps))}])
            b.close()
    finally:
        server.shutdown()
    load_after = uptime()
    if "error" in out:
        print(out["error"], file=sys.stderr)
        return 1
    # The native reference on the same machine, right after (bench_json.py --masks-only).
    from scripts.bench_json import mask_cost
    native = mask_cost(Tokenizer.from_metadata(metadata), items)
    rows = [ms for per_row in out["passes"] for r in per_row.values() for ms in r]
    per_pass = [summary([ms for r in per_row.values() for ms in r])["median"]
                for per_row in out["passes"]]
    by_schema = {i: summary([ms for per_row in out["passes"] for ms in per_row[i]])["median"]
                 for i in out["passes"][0]}
    result = {
        "what": "JsonMask.apply per masked row, cold masks, along each schema's valid document "
                "(bench/json_prompts.jsonl), the champion's 49,152-token vocabulary",
        "page": {"ms_per_row": summary(rows), "rows_measured": sum(map(len, out["passes"][0].values())),
                 "passes": len(out["passes"]), "samples": len(rows),
                 "samples_over_5_ms": sum(ms > 5.0 for ms in rows),
                 "rows_over_5_ms_in_every_pass": sum(
                     min(ms) > 5.0 for i in out["passes"][0]
                     for ms in zip(*(per_row[i] for per_row in out["passes"]))),
                 "ms_per_row_fastest_pass": summary(
                     [min(ms) for i in out["passes"][0]
                      for ms in zip(*(per_row[i] for per_row in out["passes"]))]),
                 "median_ms_per_pass": per_pass, "median_ms_by_schema": by_schema,
                 "clock": "wall (performance.now) in the worker's one wasm thread",
                 "worker_start_s": out["start_s"], "tokenizer_s": out["tokenizer_s"],
                 "vocab_and_tables_s": out["vocab_and_tables_s"], "pyodide": out["pyodide"]},
        "native": {"cpu_ms_per_row": native["cpu_ms_per_row"], "rows": native["rows"],
                   "vocab_and_tables_cpu_s": native["vocab_and_tables_cpu_s"],
                   "clock": "CPU time (process_time)"},
        "goal_ms_per_row": {"page": 5.0, "native": 1.0},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "uptime_before": load_before, "uptime_after": load_after,
                    "browser": "headless Chromium (webtools.browser)"},
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    from pyspec.apps import provenance
    provenance.write(args.out, provenance.stamp(result))
    print(json.dumps({"page": result["page"]["ms_per_row"], "native": native["cpu_ms_per_row"],
                      "rows": result["page"]["rows_measured"], "load": load_after}, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
