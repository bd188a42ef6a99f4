"""The page's start-up and first token on the CPU engine: phases, time to first token for the
demo's default prompt, decode tokens/s and the wasm heap, with the champion cached in OPFS.

    .venv/bin/python -m experiments.page_ttft [--prompt "Tell me about octopuses."] [--runs 2]
        [--out bench/results/page-ttft-cpu.json]

One browser context (one OPFS), visited `--runs` + 1 times: the first visit downloads the
weights into OPFS and is not counted; every later visit is a fresh page (a new worker, Pyodide
started again) that reads the weights from OPFS. Per visit: navigation to ready, the worker's
phases (webtools.bench's timestamps of its progress messages), then one greedy request of 32
tokens with the page's default drafter: time to first token as the page's stats give it (from
the request to the first chunk), its prefill and reused tokens, decode tokens/s, and the
worker's wasm heap after the request (`decoder.memory()`; wasm memory never shrinks, so it is
the peak). Timing claims live here, never in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from webtools import browser, serve, site
from webtools.bench import RECORD_WORKER, page_phases
from pyspec.apps import provenance

ROOT = Path(__file__).resolve().parent.parent


def visit(context, base: str, prompt: str) -> dict:
    page = context.new_page()
    t0 = time.perf_counter()
    page.goto(f"{base}index.html?model=smollm2&backend=cpu")
    info = page.evaluate("() => pyspecApp.ready")
    ready_s = time.perf_counter() - t0
    log = page.evaluate("() => window.__pyspecBench")
    result = page.evaluate("([p]) => pyspecApp.run(p, {max_tokens: 32})", [prompt])
    memory = page.evaluate("() => pyspecApp.decoder().memory()")
    page.close()
    s = result["stats"]
    return {"ready_s": ready_s, "phases": page_phases(log), "adapter": info["adapter"],
            "cpu_kernel": info.get("cpu_kernel"), "weights": info.get("weights"),
            "ttft_s": s["ttft_s"], "prefill_s": s.get("prefill_s"),
            "prompt_tokens": s.get("prompt_tokens"), "prefill_tokens": s.get("prefill_tokens"),
            "reused_tokens": s.get("reused_tokens"), "tokens_per_s": s["tokens_per_s"],
            "wasm_bytes": memory.get("wasm_bytes")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", default="Tell me about octopuses.")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--out", default="bench/results/page-ttft-cpu.json")
    args = p.parse_args()
    from playwright.sync_api import sync_playwright
    root = site.build()
    server, base = serve.start(Path(root).parent)   # build() returns the manifest path
    visits = []
    try:
        with sync_playwright() as pw:
            b = browser.launch(pw)
            context = b.new_context()
            context.add_init_script(RECORD_WORKER)
            for n in range(args.runs + 1):
                v = visit(context, base, args.prompt)
                v["weights_from_opfs"] = n > 0
                visits.append(v)
                print(json.dumps({k: v[k] for k in ("ready_s", "ttft_s", "prefill_tokens",
                                                    "reused_tokens", "tokens_per_s",
                                                    "wasm_bytes")}), file=sys.stderr, flush=True)
            b.close()
    finally:
        server.shutdown()
    cached = [v for v in visits if v["weights_from_opfs"]]
    result = {"prompt": args.prompt, "machine": {"cpus": os.cpu_count(),
                                                 "load_avg_at_end": os.getloadavg()},
              "ttft_s_median_cached": statistics.median(v["ttft_s"] for v in cached),
              "ready_s_median_cached": statistics.median(v["ready_s"] for v in cached),
              "wasm_bytes_max": max(v["wasm_bytes"] or 0 for v in visits), "visits": visits}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    provenance.write(args.out, provenance.stamp(result))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
