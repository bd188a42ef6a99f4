"""Big model shapes in the page: random Q4_K_M models of the real shapes
(experiments/real_shapes.py) opened by URL in headless Chromium on this machine's WebGPU adapter (SwiftShader here), streamed
to the GPU, and a few tokens decoded: the card's verdict, time to ready, the wasm heap before and
after the weights, the GPU bytes, and seconds per token. A benchmark, not a test (issue 46).

    python3 build.py site
    .venv/bin/python -m experiments.page_big_shapes DIR [--shapes A,B] [--tokens 3]
        [--binding-mib 128] [--out bench/results/page-big-shapes.json]

DIR holds NAME.gguf for each shape (written there first when missing). Each is linked into the
served site's models/ for the run and unlinked after. Not here: the streaming (web/stream.js,
web/weights.js), the card's rule (pyspec/apps/info.py).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

from pyspec.apps import provenance
from webtools import browser, serve

ROOT = Path(__file__).resolve().parent.parent

SITE = ROOT / "dist" / "site"

RUN = """async ([url, tokens, gpuLimits]) => {
  const { SpecDecoder } = await import("./client.js");
  const out = { card: null, error: null };
  const t0 = performance.now();
  const card = await SpecDecoder.card({ url });
  out.card = { error: card.error, backends: card.card?.backends ?? null, runs: card.card?.runs,
               gpu_buffer: card.card?.gpu_buffer ?? null, header: card.header };
  if (card.error) return out;
  let d;
  try {
    d = await SpecDecoder.create({ champion: { url }, backend: "webgpu", maxCtx: 256, gpuLimits });
  } catch (e) { out.error = { code: e.code, message: e.message }; return out; }
  out.ready_s = (performance.now() - t0) / 1e3;
  out.info = { adapter: d.info.adapter, webgpu: d.info.webgpu, weights: d.info.weights,
               wasm_bytes: d.info.wasm_bytes };
  out.startup = await d.startup();
  try {
    const t1 = performance.now();
    const it = d.generate([{ role: "user", content: "Hi" }], { draft: "none", max_tokens: tokens });
    let step;
    while (!(step = await it.next()).done);
    out.decode_s = (performance.now() - t1) / 1e3;
    out.tokens = step.value.tokens.length;
    out.stats = step.value.stats;
    out.memory = await d.memory();
  } catch (e) { out.error = { code: e.code, message: e.message }; }
  d.terminate();
  return out;
}"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--shapes", default="Qwen2.5-1.5B,SmolLM2-1.7B,Gemma-3-1B")
    ap.add_argument("--tokens", type=int, default=3)
    ap.add_argument("--binding-mib", type=int, default=None,
                    help="lower maxStorageBufferBindingSize to this (SpecDecoder.create "
                         "gpuLimits), as many GPUs' defaults are, so a big vocabulary table "
                         "goes in parts")
    ap.add_argument("--out", type=Path, default=Path("bench/results/page-big-shapes.json"))
    args = ap.parse_args()
    names = [n for n in args.shapes.split(",") if n]
    missing = [n for n in names if not (args.dir / f"{n}.gguf").exists()]
    if missing:
        subprocess.run([sys.executable, "-m", "experiments.real_shapes", "write", str(args.dir),
                        "--only", *missing], check=True, cwd=ROOT)
    limits = ({"maxStorageBufferBindingSize": args.binding_mib << 20} if args.binding_mib
              else None)
    server, base = serve.start(SITE)
    rows = {}
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = browser.launch(p)
        for name in names:
            link = SITE / "models" / f"big-{name}.gguf"
            link.unlink(missing_ok=True)
            link.symlink_to((args.dir / f"{name}.gguf").resolve())
            ctx = b.new_context()
            ctx.set_default_timeout(3 * 3600 * 1000)
            page = ctx.new_page()
            page.goto(f"{base}embed-example.html?model=none-such")
            t0 = time.time()
            try:
                rows[name] = page.evaluate(RUN, [f"{base}models/{link.name}", args.tokens, limits])
            except Exception as e:     # the page itself failing is a result too
                rows[name] = {"error": {"code": "page", "message": str(e)[:500]}}
            rows[name]["wall_s"] = round(time.time() - t0, 1)
            rows[name]["file_bytes"] = (args.dir / f"{name}.gguf").stat().st_size
            print(name, json.dumps({k: v for k, v in rows[name].items() if k != "stats"})[:1500],
                  flush=True)
            ctx.close()
            link.unlink()
        b.close()
    server.shutdown()
    # the models it measured, by name and sha256 (never the champion's: it loads none)
    out = provenance.stamp({"schema": "pyspec.page-big-shapes/1", "about": __doc__.split("\n")[0],
                            "machine": f"{platform.node()} ({platform.machine()})",
                            "tokens": args.tokens, "gpu_limits": limits, "shapes": rows},
                           models={n: args.dir / f"{n}.gguf" for n in names})
    provenance.write(str(args.out), out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
