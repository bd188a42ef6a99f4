"""wllama 3.8.1 (llama.cpp compiled to WebAssembly) beside pyspec's page, in the same headless
Chromium, on the same champion GGUF: a benchmark peer, never a runtime dependency.

    .venv/bin/python -m experiments.bench_wllama [--per-stratum 1] [--max-tokens 32]
        [--threads 1,2] [--pyspec-json FILE] [--out bench/results]

The npm tarball is fetched at bench time with `npm pack` into .cache/downloads/ and checked
against its registry integrity (pinned below); its esm/ build is served from the same local
origin as the GGUF (webtools.serve: cross-origin isolated, so wllama may start threads). For each
thread count one Wllama instance loads the GGUF (n_gpu_layers 0: the CPU, as pyspec's CPU engine;
no WebGPU), then, after one unrecorded warm-up completion of the first prompt, for one prompt per
stratum (the workload pyspec's benchmarks use) runs a greedy chat completion of --max-tokens and
records llama.cpp's own timings (prompt and decode tokens/s). The pyspec side is the page
benchmark (`python -m webtools.bench --backend cpu`, its own warm-up included): run here first
with the same prompts and cap, kept as `<out>/wllama-pyspec-side-cpu.json`, unless --pyspec-json
names a run made beside this one. The result gives the ratio of medians, pyspec champion-only (and
best drafter) over wllama decode, per thread count. Writes `<out>/wllama-vs-pyspec-cpu.json`
through provenance.write.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from pyspec import champion_path
from pyspec.apps import benchstats, provenance, workload
from webtools import browser, serve

ROOT = Path(__file__).resolve().parent.parent

WLLAMA = "@wllama/wllama@3.8.1"
# `npm view @wllama/wllama@3.8.1 dist.integrity`
WLLAMA_INTEGRITY = ("sha512-Pl7BEJhPU8OHnV/yhn3DFZYhLLOdSHh+4TND79WCftHnlUAdQPAsyc/CfIOY+4mVxvf5V"
                    "W3Xw3Uf7BBfotS1gw==")
CACHE = ROOT / ".cache" / "downloads"
WORKLOAD = ROOT / "workloads" / "public.jsonl"

PAGE = """<!doctype html><meta charset="utf-8"><title>wllama peer</title>
<script type="module">
import { Wllama } from "./wllama/esm/index.js";
window.runPeer = async (threads, prompts, maxTokens) => {
  const t0 = performance.now();
  const wllama = new Wllama({ default: "./wllama/esm/wasm/wllama.wasm" },
                            { suppressNativeLog: true });
  const blob = await (await fetch("./champion.gguf")).blob();
  await wllama.loadModel([blob], { n_threads: threads, n_gpu_layers: 0, n_ctx: 2048 });
  const load_s = (performance.now() - t0) / 1000;
  // warm-up, unrecorded: the first completion pays for the wasm's first run
  await wllama.createChatCompletion({ messages: prompts[0].messages,
                                      max_tokens: Math.min(16, maxTokens), temperature: 0 });
  const runs = [];
  for (const p of prompts) {
    const t = performance.now();
    const r = await wllama.createChatCompletion({ messages: p.messages, max_tokens: maxTokens,
                                                  temperature: 0 });
    runs.push({ id: p.id, stratum: p.stratum, wall_s: (performance.now() - t) / 1000,
                timings: r.timings ?? null, usage: r.usage ?? null });
  }
  const info = { threads_used: wllama.getNumThreads?.() ?? null,
                 multithread: wllama.isMultithread?.() ?? null };
  await wllama.exit();
  return { load_s, runs, ...info, isolated: self.crossOriginIsolated };
};
window.peerReady = true;
</script>"""


def wllama_esm() -> Path:
    """The tarball's esm/ directory, unpacked into the download cache (integrity checked)."""
    tgz = CACHE / "wllama-wllama-3.8.1.tgz"
    if not tgz.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "pack", WLLAMA, "--pack-destination", str(CACHE)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    algo, _, want = WLLAMA_INTEGRITY.partition("-")
    if base64.b64encode(hashlib.new(algo, tgz.read_bytes()).digest()).decode() != want:
        tgz.unlink()
        sys.exit(f"{tgz.name} does not match its npm integrity; removed, run again")
    out = CACHE / "wllama-3.8.1"
    if not (out / "esm" / "index.js").exists():
        with tarfile.open(tgz) as tar:
            tar.extractall(out, filter="data")
        (out / "package").rename(out / "tmp")
        shutil.move(str(out / "tmp" / "esm"), str(out / "esm"))
        shutil.rmtree(out / "tmp")
    return out / "esm"


def run_wllama(items: list[dict], threads: list[int], max_tokens: int, root: Path) -> dict:
    from playwright.sync_api import sync_playwright
    (root / "wllama").mkdir(parents=True, exist_ok=True)
    esm = root / "wllama" / "esm"
    if not esm.exists():
        shutil.copytree(wllama_esm(), esm)
    gguf = root / "champion.gguf"
    if not gguf.exists():
        os.link(champion_path(), gguf) if os.stat(champion_path()).st_dev == os.stat(
            root).st_dev else shutil.copy(champion_path(), gguf)
    (root / "peer.html").write_text(PAGE)
    server, base = serve.start(root)
    prompts = [{"id": it["id"], "stratum": it["stratum"], "messages": it["messages"]}
               for it in items]
    out = {}
    try:
        with sync_playwright() as p:
            b = browser.launch(p)
            for n in threads:
                page = b.new_page()
                page.goto(base + "peer.html")
                page.wait_for_function("window.peerReady === true")
                t = time.time()
                res = page.evaluate("([n, ps, m]) => runPeer(n, ps, m)",
                                    [n, prompts, max_tokens])
                res["wall_s"] = time.time() - t
                decode = [r["timings"]["predicted_per_second"] for r in res["runs"]
                          if r["timings"]]
                prompt = [r["timings"]["prompt_per_second"] for r in res["runs"] if r["timings"]]
                res["decode_tokens_per_s"] = benchstats.spread(decode) if decode else None
                res["prompt_tokens_per_s"] = benchstats.spread(prompt) if prompt else None
                out[str(n)] = res
                print(f"wllama n_threads={n}: decode {res['decode_tokens_per_s']}, "
                      f"load {res['load_s']:.1f} s", file=sys.stderr, flush=True)
                page.close()
            b.close()
    finally:
        server.shutdown()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default=str(WORKLOAD))
    p.add_argument("--per-stratum", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--strata", default=None, help="comma-separated strata to keep (default all)")
    p.add_argument("--pyspec-json", default=None,
                   help="a `webtools.bench --backend cpu` JSON made beside this run")
    p.add_argument("--out", default="bench/results")
    provenance.add_option(p)
    args = p.parse_args()
    provenance.check_tree(args.allow_dirty)
    items = workload.first_per_stratum(workload.read_workload(args.workload), args.per_stratum)
    if args.strata:
        items = [it for it in items if it["stratum"] in args.strata.split(",")]
    t0 = time.time()
    origin = provenance.record(champion=champion_path(), drafts={}, workload=args.workload,
                               adapter="cpu (wasm)", backend="browser",
                               allow_dirty=args.allow_dirty)
    if args.pyspec_json is None:
        args.pyspec_json = os.path.join(args.out, "wllama-pyspec-side-cpu.json")
        cmd = [sys.executable, "-m", "webtools.bench", "--backend", "cpu", "--per-stratum",
               str(args.per_stratum), "--max-tokens", str(args.max_tokens), "--drafts", "ngram",
               "--workload", args.workload, "--out", args.out]
        if args.strata:
            cmd += ["--strata", args.strata]
        if args.allow_dirty:
            cmd += ["--allow-dirty"]
        subprocess.run(cmd, check=True, cwd=ROOT)
        os.replace(os.path.join(args.out, "bench-browser.json"), args.pyspec_json)
    pyspec = json.loads(Path(args.pyspec_json).read_text())
    peer = run_wllama(items, [int(t) for t in args.threads.split(",")], args.max_tokens,
                      ROOT / ".cache" / "wllama-site")
    # pyspec's requests on the prompts wllama ran: champion-only and each drafter's median
    ids = {it["id"] for it in items}
    by_drafter: dict[str, list[float]] = {}
    for r in pyspec["requests"]:
        if r["id"] in ids:
            by_drafter.setdefault(r["drafter"], []).append(r["tokens_per_s"])
    champion = benchstats.spread(by_drafter.pop("none", [])) if "none" in by_drafter else {}
    best = max((statistics.median(v), d) for d, v in by_drafter.items())
    result = {"wllama": WLLAMA, "pyspec_json": os.path.basename(args.pyspec_json),
              "max_tokens": args.max_tokens, "prompts": [it["id"] for it in items],
              "wllama_runs": peer,
              "pyspec": {"champion_only_tokens_per_s": champion,
                         "best_drafter": best[1], "best_drafter_tokens_per_s": best[0]},
              "ratio_pyspec_over_wllama": {}, "wall_s": time.time() - t0,
              "provenance": origin}
    for n, res in peer.items():
        theirs = (res["decode_tokens_per_s"] or {}).get("median")
        if theirs and champion.get("median"):
            result["ratio_pyspec_over_wllama"][f"{n}_threads"] = {
                "champion_only": champion["median"] / theirs, "best_drafter": best[0] / theirs}
    path = provenance.write(os.path.join(args.out, "wllama-vs-pyspec-cpu.json"), result)
    print(json.dumps(result["ratio_pyspec_over_wllama"], indent=1))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
