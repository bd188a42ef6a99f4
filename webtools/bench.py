"""`python3 build.py bench`: the benchmark in the browser (headless Chromium, WebGPU).

    python -m webtools.bench [--workload W] [--per-stratum N] [--max-tokens N] [--drafts ngram]
                             [--model smollm2] [--k heuristic] [--repeat 1] [--out bench-out]

One page session serves the whole run. For every prompt, champion-only ("none") and each drafter
run back to back through the page's own decoder (`pyspecApp.decoder().generate`, the worker
protocol), the order alternating per prompt as in pyspec/apps/bench.py, so drift in a shared, slow
software adapter hits both sides alike; `--warmup N` (default 1) first runs every side N times on
the first prompt, unreported, so that no side is timed cold; `--repeat N` runs each side N times
per prompt and keeps its median run. Per stratum it reports what `python -m pyspec bench` reports
(pyspec/apps/benchstats.py: the rows have the same shape; provenance.py's record), and on top:
  - page timings: navigation to ready, the worker's phases (Pyodide + pyspec, weights from
    OPFS or the network, model load = the `load` phase: parse, dequantize, upload, compile),
    and the first request's time to first token;
  - the champion's in-browser decode tokens/s (the champion-only runs);
  - the break-even guard's decisions (stats["schedule"]) summed per drafter and stratum;
  - the Pyodide overhead per decode cycle on the WebGPU backend: host_s (Python encode + submit)
    against wait_s (awaiting the GPU readback), from stats["backend_timing"].
Writes `<out>/bench-browser.json` (rewritten after every prompt, so a stopped run keeps what it
measured) and `<out>/bench-browser.png`; the adapter named in both is the one the page's `ready`
message reports.

Not here: the page and worker (web/), decoding (pyspec), the native benchmark (pyspec/apps/bench.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

from pyspec.apps import bench as native, benchstats, provenance, workload
from pyspec.errors import UsageError

from . import browser, serve, site

DEFAULT_WORKLOAD = workload.PUBLIC_WORKLOAD

# Installed before the page's own scripts: timestamps every progress/ready message of the worker,
# without changing the page (client.js's onmessage still gets every message).
RECORD_WORKER = """
(() => {
  const log = [];
  window.__pyspecBench = log;
  const Base = window.Worker;
  window.Worker = class extends Base {
    constructor(url, options) {
      super(url, options);
      this.addEventListener("message", (e) => {
        const m = e.data;
        if (m && (m.type === "progress" || m.type === "ready")) {
          log.push({ t_ms: performance.now(), type: m.type, phase: m.phase ?? null,
                     loaded: m.loaded ?? null, total: m.total ?? null, label: m.label ?? null });
        }
      });
    }
  };
})();
"""

# One request through the page's decoder; errors come back as values so the run can go on.
GENERATE = """
async ([messages, config]) => {
  const d = pyspecApp.decoder();
  const t0 = performance.now();
  let first = null;
  const chunks = [];   // [ms since the request, tokens committed] per streamed chunk
  try {
    for await (const c of d.generate(messages, config)) {
      if (first === null) first = performance.now() - t0;
      chunks.push([performance.now() - t0, c.tokens]);
      window.pyspecBenchChunk?.(performance.now() - t0, c.tokens);
    }
  } catch (e) {
    return { error: { code: e.code ?? "internal", message: String(e.message ?? e) } };
  }
  const r = d.lastResult;
  return { tokens: r.tokens, finish_reason: r.finish_reason, stats: r.stats,
           wall_ms: performance.now() - t0, first_chunk_ms: first, chunks };
}
"""


# --- page timings ---------------------------------------------------------------------------
def page_phases(log: list[dict]) -> dict:
    """Seconds since navigation at which each worker phase first and last reported, and the
    derived durations: runtime (Pyodide + pyspec), weights (download/cache/verify), model load."""
    phases: dict[str, dict] = {}
    for m in log:
        key = m["phase"] if m["type"] == "progress" else "ready"
        p = phases.setdefault(key, {"first_s": m["t_ms"] / 1000, "last_s": m["t_ms"] / 1000})
        p["last_s"] = m["t_ms"] / 1000
    out = {"phases": phases}
    if "load" in phases:   # the worker reports load 0/1 before Session.load and 1/1 after it
        out["model_load_s"] = phases["load"]["last_s"] - phases["load"]["first_s"]
    if "runtime" in phases:
        out["runtime_s"] = phases["runtime"]["last_s"]
    return out


# --- aggregation ----------------------------------------------------------------------------
def guard_decisions(rows: list[dict]) -> dict:
    """The break-even guard's decisions summed over requests: k histogram, cycles it turned
    speculation off, probes, and baseline-measuring cycles."""
    hist: dict[str, int] = {}
    counts = {"guard_off": 0, "probes": 0, "baseline": 0}
    for r in rows:
        sch = r["stats"]["schedule"]
        for k, n in sch.get("k_histogram", {}).items():
            hist[str(k)] = hist.get(str(k), 0) + n
        for key in counts:
            counts[key] += sch.get(key, 0)
    return {"k_histogram": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))), **counts,
            "requests_with_guard_off": sum(r["stats"]["schedule"].get("guard_off", 0) > 0
                                           for r in rows)}


def overhead(stats_list: list[dict]) -> dict:
    """Pyodide overhead per decode cycle from backend_timing (empty on the CPU fallback)."""
    out = benchstats.per_cycle([s["backend_timing"] for s in stats_list if s.get("backend_timing")])
    total = out["host_s_per_cycle"] + out["wait_s_per_cycle"]
    out["host_share"] = out["host_s_per_cycle"] / total if total else None
    return out


def build_result(args, ready: dict, page: dict, rows: dict, baselines: list[dict],
                 skipped: list[dict], chromium: str, t0: float, done: bool,
                 origin: dict) -> dict:
    strata = sorted({r["stratum"] for rs in rows.values() for r in rs})
    base_tps = [b["stats"]["tokens_per_s"] for b in baselines]
    gpu = ready.get("webgpu") or {}
    return {
        "bench": "browser",
        "backend": "browser",
        "adapter": ready.get("adapter"),
        "webgpu": gpu,
        "browser": chromium,
        "model": args.model,
        "complete": done,
        "provenance": origin,
        "webgpu_flags": browser.FLAGS,
        "workload": os.path.basename(args.workload),
        "per_stratum": args.per_stratum,
        "max_tokens_cap": args.max_tokens,
        "k_policy": args.k,
        "temperature": args.temperature,
        "verify": native.sampling(args, 1).resolved_verify(),
        "seed": args.seed,
        "repeat": max(1, args.repeat),
        "warmup": args.warmup,
        "page": page,
        "first_token_s": baselines[0]["first_token_s"] if baselines else None,
        "champion_tok_s": benchstats.spread(base_tps),
        "champion_s_per_token": statistics.median([1 / x for x in base_tps]) if base_tps else None,
        "drafters": benchstats.drafter_tables(rows, strata),
        "schedule": {d: {"overall": guard_decisions(rs),
                         "strata": {s: guard_decisions([r for r in rs if r["stratum"] == s])
                                    for s in strata if any(r["stratum"] == s for r in rs)}}
                     for d, rs in rows.items() if rs},
        "pyodide_overhead": {"none": overhead([b["stats"] for b in baselines]),
                             **{d: overhead([r["stats"] for r in rs]) for d, rs in rows.items()}},
        "prompts": benchstats.prompt_lines(rows),
        "requests": [b["line"] for b in baselines] + [r["line"] for rs in rows.values() for r in rs],
        "skipped": skipped,
        "wall_s": time.perf_counter() - t0,
    }


def write(result: dict, out: str, final: bool) -> str:
    path = provenance.write(os.path.join(out, "bench-browser.json"), result)
    strata = sorted({s for d in result["drafters"].values() for s in d["strata"]})
    if final and result["drafters"]:
        benchstats.plot(result, strata, os.path.join(out, "bench-browser.png"),
                        title=f"pyspec in the browser: {result['model']} on adapter "
                              f"{result['adapter']}, {result['browser']}\n"
                              f"{result['per_stratum'] or 'all'} prompt(s) per stratum, at most "
                              f"{result['max_tokens_cap'] or 'the workload’s'} tokens each")
    return path


def line(item: dict, side: str, out: dict) -> dict:
    """What one request leaves in the JSON besides the summaries."""
    s = out["stats"]
    bt = s.get("backend_timing") or {}
    return {"id": item["id"], "stratum": item["stratum"], "drafter": side,
            "generated": s["generated_tokens"], "champion_passes": s["champion_passes"],
            "tokens_per_s": s["tokens_per_s"], "ttft_s": s["ttft_s"], "prefill_s": s["prefill_s"],
            "wall_s": out["wall_ms"] / 1000, "first_chunk_s": out["first_chunk_ms"] / 1000
            if out["first_chunk_ms"] is not None else None,
            "schedule": s["schedule"], "backend_timing": bt,
            "chunks_s": [[round(t / 1000, 3), n] for t, n in out["chunks"]]}


# --- the run --------------------------------------------------------------------------------
def median_run(runs: list[dict]) -> dict:
    """The page run with the median tokens/s (the lower middle one of an even count)."""
    return sorted(runs, key=lambda r: r["stats"]["tokens_per_s"])[(len(runs) - 1) // 2]


def names_a_model(draft: str) -> bool:
    """Whether a --drafts entry is a draft model (a site model name, or "trained")."""
    return draft not in ("none", "ngram", "auto") and not draft.startswith("self:")


def draft_model(drafts: list[str]) -> str | None:
    """The site model a drafter list names as its draft model ("trained": the site's trained
    draft), or None; the page holds one draft model at a time."""
    named = [site.TRAINED_DRAFT if d == "trained" else d for d in drafts if names_a_model(d)]
    if len(set(named)) > 1:
        raise SystemExit(f"error: --drafts names {len(set(named))} draft models "
                         f"({', '.join(sorted(set(named)))}); the page holds one at a time")
    return named[0] if named else None


def run(args, base_url: str, champion: str | None) -> int:
    """The run in one page session; `champion`: the site's file of --model (its provenance)."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    native.check_sampling(args)
    items = workload.first_per_stratum(workload.read_workload(args.workload), args.per_stratum)
    if args.strata:
        wanted = set(args.strata.split(","))
        items = [it for it in items if it["stratum"] in wanted]
    drafts = [d for d in args.drafts.split(",") if d and d != "none"]
    rows: dict[str, list[dict]] = {d: [] for d in drafts}
    baselines: list[dict] = []
    skipped: list[dict] = []
    model_draft = draft_model(drafts)
    # "auto" (the page's choice: the trained draft on a hardware adapter, else n-gram) is left
    # to the worker unless another entry names the draft model.
    url = (f"{base_url}index.html?model={args.model}&draft="
           f"{model_draft or ('auto' if 'auto' in drafts else 'ngram')}")
    if args.max_ctx:
        url += f"&max_ctx={args.max_ctx}"
    url += f"&backend={args.backend}"
    with sync_playwright() as p:
        b = browser.launch(p)
        chromium = f"Chromium {b.version}"
        page = b.new_page()
        page.on("console", lambda m: m.type == "error" and print(f"[page] {m.text}",
                                                                 file=sys.stderr))
        page.add_init_script(RECORD_WORKER)
        if args.verbose:
            page.expose_function("pyspecBenchChunk", lambda ms, n: print(
                f"    +{n} token(s) at {ms / 1000:.1f} s", file=sys.stderr, flush=True))
        t0 = time.perf_counter()
        page.goto(url)
        try:
            ready = page.evaluate("() => pyspecApp.ready")
        except PlaywrightError as e:
            shown = page.locator("#error").text_content() if page.locator("#error").is_visible() else ""
            print(f"error: the page did not get ready: {shown or e.message.splitlines()[0]}",
                  file=sys.stderr)
            b.close()
            return 2
        page_s = time.perf_counter() - t0
        page_info = {"load_s": page_s, "init_s": ready.get("init_ms", 0) / 1000,
                     "weights": ready.get("weights"), **page_phases(
                         page.evaluate("() => window.__pyspecBench"))}
        print(f"[ready in {page_s:.1f} s: adapter {ready['adapter']}, WebGPU {ready.get('webgpu')}, "
              f"model load {page_info.get('model_load_s', float('nan')):.1f} s]",
              file=sys.stderr, flush=True)
        if ready.get("fallback"):
            print(f"note: the page fell back to the CPU: {ready['fallback']}", file=sys.stderr)

        origin = provenance.record(
            champion=champion, workload=args.workload, adapter=ready.get("adapter"),
            backend="browser", drafts={d: native.draft_file(d) for d in drafts if d != "auto"},
            allow_dirty=args.allow_dirty)

        def current(done: bool) -> dict:
            return build_result(args, ready, page_info, rows, baselines, skipped, chromium, t0,
                                done, origin)

        done = True
        try:
            measure(args, page, items, drafts, rows, baselines, skipped, t0,
                    lambda: write(current(False), args.out, final=False))
        except KeyboardInterrupt:   # Ctrl-C or SIGTERM: keep what was measured
            print("interrupted: writing what was measured", file=sys.stderr, flush=True)
            done = False
        # Results first: closing a browser in the middle of a request may take a while.
        result = current(done)
        path = write(result, args.out, final=True)
        report(result)
        print(f"wrote {path}", file=sys.stderr, flush=True)
        b.close()
    return 0 if result["drafters"] else 1


def request_config(args, side: str, max_tokens: int) -> dict:
    """The page request of one side: a draft model is the one the page loaded ("model")."""
    return {"draft": "model" if names_a_model(side) else side,
            "k": "fixed:0" if side == "none" else args.k, "temperature": args.temperature,
            "seed": args.seed, "verify": args.verify, "max_tokens": max_tokens}


def warm_up(args, page, items: list[dict], drafts: list[str]) -> None:
    """Every side args.warmup times on the first prompt (16 tokens), unreported: the first
    request of a side pays for its engine's build and its caches, which no prompt should."""
    for _ in range(args.warmup if items else 0):
        for d in ["none", *drafts]:
            out = page.evaluate(GENERATE, [items[0]["messages"], request_config(args, d, 16)])
            print(f"[warm-up] {d}: {out.get('error') or 'done'}", file=sys.stderr, flush=True)


def measure(args, page, items: list[dict], drafts: list[str], rows: dict, baselines: list,
            skipped: list, t0: float, checkpoint) -> None:
    """Champion-only and each drafter on every prompt, appending to rows / baselines / skipped;
    `checkpoint()` rewrites the JSON after every prompt."""
    exact = native.exact_outputs(args)
    warm_up(args, page, items, drafts)
    for n, it in enumerate(items, 1):
        if args.budget_s and time.perf_counter() - t0 > args.budget_s:
            skipped += [{"id": later["id"], "reason": f"over the {args.budget_s} s budget"}
                        for later in items[n - 1:]]
            print(f"budget of {args.budget_s} s spent: {len(items) - n + 1} prompts not run",
                  file=sys.stderr, flush=True)
            break
        max_tokens = min(it.get("max_tokens", 128), args.max_tokens or 1 << 30)
        # Alternate who runs first, so that drift or a warm cache favours neither side. With
        # --repeat, each side's median run (by tokens/s) stands for it, as in pyspec/apps/bench.py.
        names = ["none", *drafts]
        tries: dict[str, list] = {d: [] for d in names}
        out: dict = {}
        try:
            for rep in range(max(1, args.repeat)):
                for d in names if (n + rep) % 2 else names[::-1]:
                    out = page.evaluate(GENERATE, [it["messages"],
                                                   request_config(args, d, max_tokens)])
                    if "error" in out:
                        break
                    tries[d].append(out)
                if "error" in out:
                    break
        except KeyboardInterrupt:
            # A slow adapter's single request can take minutes: keep the runs that finished.
            skipped.append({"id": it["id"], "reason": "interrupted",
                            "finished": [line(it, d, r) for d, rs in tries.items() for r in rs]})
            raise
        if "error" in out:
            skipped.append({"id": it["id"], "reason": f"{out['error']['code']}: "
                                                      f"{out['error']['message']}"})
            print(f"[{n}/{len(items)}] {it['id']}: skipped ({skipped[-1]['reason']})",
                  file=sys.stderr, flush=True)
            continue
        runs = {d: median_run(rs) for d, rs in tries.items()}
        base = runs["none"]
        baselines.append({"stats": base["stats"], "line": line(it, "none", base),
                          "first_token_s": base["first_chunk_ms"] / 1000
                          if base["first_chunk_ms"] is not None else None})
        msg = [f"[{n}/{len(items)}] {it['id']:<15} none {base['stats']['tokens_per_s']:.2f} tok/s"
               f" ttft {base['stats']['ttft_s']:.1f}s"]
        for d in drafts:
            row = benchstats.compare(it, runs[d]["stats"], runs[d]["tokens"], base["stats"],
                                     base["tokens"], exact)
            if exact:
                benchstats.identity_over_repeats(
                    row, [r["tokens"] for r in tries[d] + tries["none"]], base["tokens"])
            row["line"] = line(it, d, runs[d])
            rows[d].append(row)
            msg.append(f"{d} x{row['speedup']:.2f} ({row['stats']['tokens_per_pass']:.2f} "
                       f"tok/pass, guard off {row['stats']['schedule'].get('guard_off', 0)})")
        print(" | ".join(msg), f"[{time.perf_counter() - t0:.0f}s]", file=sys.stderr, flush=True)
        checkpoint()


def report(result: dict) -> None:
    strata = sorted({s for d in result["drafters"].values() for s in d["strata"]})
    benchstats.print_table(result, strata)
    page = result["page"]
    tps = result["champion_tok_s"]
    print(f"\nadapter {result['adapter']} ({result['browser']}), model {result['model']}")
    print(f"page load (navigation to ready) {page['load_s']:.1f} s; model load "
          f"{page.get('model_load_s', float('nan')):.1f} s; first token "
          f"{result['first_token_s'] or float('nan'):.1f} s")
    if tps["n"]:
        print(f"champion-only decode: {tps['median']:.3f} tok/s median "
              f"[{tps['min']:.3f}, {tps['max']:.3f}]")
    for d, sch in result["schedule"].items():
        o = sch["overall"]
        print(f"guard ({d}): k histogram {o['k_histogram']}, guard_off {o['guard_off']} cycles "
              f"in {o['requests_with_guard_off']} requests, probes {o['probes']}, "
              f"baseline {o['baseline']}")
    for side, o in result["pyodide_overhead"].items():
        if o["cycles"]:
            h, a = o["host_s_cycle"], o["host_s_cycle_alone"]
            alone = (f"; {1000 * a['median']:.1f} [{1000 * a['min']:.1f}, {1000 * a['max']:.1f}] "
                     f"over the {a['n']} cycles encoded with none in flight" if a["n"] else "")
            print(f"per cycle ({side}): host (Python encode+submit) {1000 * o['host_s_per_cycle']:.1f}"
                  f" ms mean, median {1000 * h['median']:.1f} [{1000 * h['min']:.1f}, "
                  f"{1000 * h['max']:.1f}]{alone}, waiting on the GPU "
                  f"{1000 * o['wait_s_per_cycle']:.1f} ms, {o['readbacks_per_cycle']:.2f} readbacks "
                  f"({o['cycles']} cycles)")


def interrupted(signum, frame):
    raise KeyboardInterrupt


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 build.py bench",
                                 description="speculative vs champion-only in headless Chromium "
                                             "(WebGPU), per stratum, in one page session")
    ap.add_argument("--workload", default=os.path.normpath(DEFAULT_WORKLOAD),
                    help="a JSONL workload (workloads/ format)")
    ap.add_argument("--per-stratum", type=int, default=1,
                    help="prompts per stratum (default 1: the software adapter is slow; 0 = all)")
    ap.add_argument("--strata", default=None, help="comma-separated strata to keep (default all)")
    ap.add_argument("--max-tokens", type=int, default=16, help="cap each prompt's max_tokens")
    ap.add_argument("--drafts", default="ngram",
                    help="comma-separated drafters: ngram, self:L, auto (the page's choice: "
                         "the trained draft on a hardware WebGPU adapter, else ngram), and at "
                         "most one draft model (a site model name, or trained: the site's "
                         "trained draft)")
    ap.add_argument("--model", default="smollm2", help="a model name of the site's manifest")
    ap.add_argument("--k", default="heuristic", help="fixed:K | heuristic | confidence:P")
    native.add_sampling_options(ap)
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per side and prompt, the order alternating; each side's median "
                         "run (by tokens/s) stands for it")
    ap.add_argument("--warmup", type=int, default=1,
                    help="unreported runs of the first prompt on every side first (default 1)")
    ap.add_argument("--max-ctx", type=int, default=None)
    ap.add_argument("--backend", default="auto", choices=["auto", "webgpu", "cpu"],
                    help="the page's engine: auto picks the numpy engine on a software WebGPU "
                         "adapter such as SwiftShader; webgpu forces the GPU kernels there")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no new prompt after this many seconds (page load included)")
    ap.add_argument("--verbose", action="store_true", help="print every streamed chunk's time")
    ap.add_argument("--out", default="bench-out")
    provenance.add_option(ap)
    return ap


def model_file(manifest: Path, model: str) -> str | None:
    """The site's file of a model name (manifest.json's entry of kind "model"), or None."""
    for entry in json.loads(manifest.read_text())["artifacts"]:
        if entry["kind"] == "model" and entry.get("model") == model:
            return str(manifest.parent / entry["url"])
    return None


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        provenance.check_tree(args.allow_dirty)   # refused before the site builds
        browser.chromium_path()
        manifest = site.build()
    except (browser.BrowserMissing, site.SiteError, UsageError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, interrupted)   # `timeout` and CI stop with SIGTERM
    server, base = serve.start(Path(manifest).parent)
    try:
        return run(args, base, model_file(Path(manifest), args.model))
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        server.shutdown()


if __name__ == "__main__":
    sys.exit(main())
