"""The page's gate, headless: the demo page's "measure on this device" (decoder.measure, docs/
gate.md) in Chromium on this machine's WebGPU adapter (SwiftShader here), its table printed and
its result written with where it came from (bench/results/page-gate-swiftshader.json).

    python3 build.py site
    .venv/bin/python -m experiments.page_gate [--model smollm2] [--drafts ngram]
        [--per-stratum 1] [--max-tokens 32] [--out page-gate.json]

Not here: measuring and judging (pyspec/apps/page_gate.py, gate.py), the page (web/).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pyspec.apps import provenance
from pyspec.apps.workload import PUBLIC_WORKLOAD
from webtools import browser, serve

ROOT = Path(__file__).resolve().parent.parent

MEASURE = """async ([drafts, perStratum, maxTokens]) => pyspecApp.decoder().measure({
  drafts, perStratum, maxTokens, onProgress: (p) => window.note(`${p.done}/${p.total} ${p.label}`) })"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--drafts", default="ngram", help="comma-separated page drafters")
    ap.add_argument("--per-stratum", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, default=Path("page-gate.json"))
    args = ap.parse_args()
    server, base = serve.start(ROOT / "dist" / "site")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = browser.launch(p)
        ctx = b.new_context()
        ctx.set_default_timeout(3 * 3600 * 1000)
        page = ctx.new_page()
        page.expose_function("note", lambda s: print(s, flush=True))
        t0 = time.time()
        page.goto(f"{base}index.html?model={args.model}&draft=ngram")
        page.wait_for_function("() => window.pyspecApp")
        info = page.evaluate("async () => await pyspecApp.ready")
        print(f"ready in {time.time() - t0:.1f} s: engine {info['adapter']}, WebGPU "
              f"{json.dumps(info['webgpu'])}", flush=True)
        m = page.evaluate(MEASURE, [args.drafts.split(","), args.per_stratum, args.max_tokens])
        b.close()
    server.shutdown()
    print(m["text"])
    keep = ("adapter", "fallback", "fallback_kind", "webgpu", "draft")
    provenance.write(str(args.out), provenance.stamp(
        {"ready": {k: info[k] for k in keep}, **m}, workload=PUBLIC_WORKLOAD,
        adapter=info.get("adapter"), backend="browser"))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
