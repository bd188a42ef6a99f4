"""Headless Chromium with WebGPU, and the demo page run from the terminal.

    python -m webtools.browser [--headless --prompt TEXT ...]      (build.py demo runs it)

Chromium is Debian's (/usr/bin/chromium), driven by Playwright for Python: Playwright's own
browser download is not used. WebGPU runs on SwiftShader (Vulkan on the CPU): correct, and slow.
`--headless` opens the page, waits until the worker is ready, runs one request through the page's
own `pyspecApp.run`, streams the text to stdout and prints the stats, or with `--json` the same
object as `python -m pyspec generate --json` (text, tokens, finish_reason, stats, receipt).
`--fault KIND@CYCLE` (FAULTS) runs that request as a fault drill (the page with drills=1): the
fault strikes once CYCLE cycles have run, and the receipt's `faults` names it with its cycle and
`recovery_s`; the JSON adds `notices` (what the page showed). Loading faults (LOAD_FAULTS) strike
while the page loads the weights (the @CYCLE is ignored); two-pages opens a second page of the
site at the same time, both loading the weights. `--model PATH` (and `--draft PATH`) name a local
GGUF: the server adds it at local/NAME and the page opens it by that URL, as it opens any model
by URL (its card first); a manifest name is a model of the site.

Not here: the page (web/), building (site.py), serving (serve.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from . import serve, site

CHROMIUM = os.environ.get("PYSPEC_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--enable-unsafe-webgpu", "--enable-features=Vulkan", "--use-vulkan=swiftshader",
         "--use-webgpu-adapter=swiftshader", "--disable-vulkan-surface", "--no-sandbox",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run"]


# Fault drills the demo can run: client.js runs worker-terminate, pyspec/apps/session.py the request's
# (GPU_FAULTS need the WebGPU engine, worker-oom does not), worker.js the loading ones.
GPU_FAULTS = ("device-lost", "device-lost-repeat", "gpu-oom", "readback-throw", "readback-hang")
LOAD_FAULTS = ("opfs-truncate", "opfs-flip", "opfs-quota", "opfs-unavailable", "download-drop",
               "opfs-stall")
FAULTS = (*GPU_FAULTS, "worker-terminate", "worker-oom", *LOAD_FAULTS, "two-pages")


def fault_spec(text: str) -> str:
    """--fault KIND@CYCLE, checked (KIND alone for a loading fault or two-pages)."""
    kind, _, cycle = text.partition("@")
    if kind in (*LOAD_FAULTS, "two-pages") and not cycle:
        return f"{kind}@0"
    if kind not in FAULTS or not cycle.isdigit():
        raise argparse.ArgumentTypeError(f"--fault must be KIND@CYCLE with KIND one of "
                                         f"{', '.join(FAULTS)} and CYCLE a number, got {text!r}")
    return text


class BrowserMissing(RuntimeError):
    """No Chromium to run."""


def chromium_path() -> str:
    path = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    if not path:
        raise BrowserMissing(f"Chromium is not installed ({CHROMIUM}): run `python3 build.py "
                             "setup` as root (it apt-installs chromium), or set PYSPEC_CHROMIUM")
    return path


def launch(playwright):
    """Debian's Chromium, headless, with WebGPU on SwiftShader."""
    return playwright.chromium.launch(executable_path=chromium_path(), args=FLAGS, headless=True)


def page_draft(draft: str) -> tuple[str, str]:
    """(the page's `draft` URL parameter, the request's config draft) for a --draft: the CLI's
    names work here too (auto: the site's trained draft on a hardware WebGPU adapter, else
    n-gram, the page's choice as the CLI's; trained: the site's trained draft; ngram+D: n-gram
    where the text repeats, draft model D elsewhere)."""
    if draft == "auto":
        return "auto", "auto"
    combo = draft.startswith("ngram+")
    name = draft[len("ngram+"):] if combo else draft
    name = site.TRAINED_DRAFT if name == "trained" else name
    if name in ("ngram", "none") or name.startswith("self:"):
        return name, name
    return name, "ngram+model" if combo else "model"


LOCAL = "local/"   # where the server puts a --model PATH (or --draft PATH): local/NAME


def local_file(spec: str) -> Path | None:
    """The local file a --model or --draft names, or None for a manifest name or a URL. A path
    is what names a file here, ends in .gguf or holds a slash (as the CLI's --draft reads one);
    one that names no file is a UsageError in the CLI's words."""
    from pyspec.errors import UsageError, path_problem

    if spec.startswith(("http://", "https://")):
        return None
    if not (os.path.isfile(spec) or spec.lower().endswith(".gguf") or "/" in spec
            or os.sep in spec):
        return None
    try:
        with open(spec, "rb"):
            pass
    except OSError as e:
        raise UsageError(path_problem(spec, e)) from None
    return Path(spec).resolve()


def serve_local(args) -> dict[str, Path]:
    """The local files of --model and --draft, each at LOCAL + its name (URL path -> file);
    args.model and args.draft then name them by those URL paths, as the page takes them."""
    files: dict[str, Path] = {}

    def route(path: Path) -> str:
        name, n = path.name, 1
        while LOCAL + name in files and files[LOCAL + name] != path:
            n += 1
            name = f"{n}-{path.name}"
        files[LOCAL + name] = path
        return LOCAL + name

    model = local_file(args.model)
    if model is not None:
        args.model = route(model)
    prefix = "ngram+" if args.draft.startswith("ngram+") else ""
    draft = local_file(args.draft[len(prefix):])
    if draft is not None:
        args.draft = prefix + route(draft)
    return files


def check_layers(root: Path, args, files: dict[str, Path] | None = None) -> None:
    """A --draft self:L against the layers of the model it names (the site's, or a local file
    in `files`), before a page opens (DraftSpecError); a model the manifest lacks is left to the
    page, which names the ones it has."""
    name = page_draft(args.draft)[0]
    if not name.startswith("self:"):
        return
    from pyspec.cpu.model import Config
    from pyspec.drafters import parse_draft
    from pyspec.formats.gguf import GGUFFile

    path = (files or {}).get(args.model)
    if path is None:
        artifacts = json.loads((root / "manifest.json").read_text())["artifacts"]
        model = next((a for a in artifacts if a.get("kind") == "model"
                      and a.get("model") == args.model), None)
        path = root / model["url"] if model is not None else None
    if path is not None:
        parse_draft(name, Config.from_metadata(GGUFFile.open(path).metadata).n_layers)


def page_url(base: str, args) -> str:
    """The page with every choice of `args` in its query (app.js reads them), so the URL the
    serve mode prints opens the page set as asked."""
    from urllib.parse import urlencode
    query = {"model": args.model, "draft": page_draft(args.draft)[0], "backend": args.backend,
             "k": args.k, "temperature": args.temperature, "seed": args.seed,
             "max_tokens": args.max_tokens}
    if args.verify:
        query["verify"] = args.verify
    if args.max_ctx:
        query["max_ctx"] = args.max_ctx
    fault = getattr(args, "fault", None)
    if fault:
        query["drills"] = 1
        if fault.partition("@")[0] in LOAD_FAULTS:
            query["load_drill"] = fault.partition("@")[0]
    return f"{base}index.html?{urlencode(query)}"


def run_headless(base: str, args) -> int:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    config = {"draft": page_draft(args.draft)[1], "k": args.k, "verify": args.verify,
              "temperature": args.temperature, "seed": args.seed, "max_tokens": args.max_tokens}
    kind = args.fault.partition("@")[0] if args.fault else None
    if kind and kind not in (*LOAD_FAULTS, "two-pages"):
        config["drill"] = args.fault
    t0 = time.perf_counter()
    with sync_playwright() as p:
        browser = launch(p)
        context = browser.new_context()   # one origin's storage for every page
        page = context.new_page()
        page.on("console", lambda m: m.type == "error" and print(f"[page] {m.text}", file=sys.stderr))
        streamed = []

        def on_text(text: str) -> None:
            streamed.append(text)
            if not args.json:
                sys.stdout.write(text)
                sys.stdout.flush()

        page.expose_function("pyspecOnText", on_text)
        page.goto(page_url(base, args))
        other = None
        if kind == "two-pages":   # a second page of the site, loading the weights at once
            other = context.new_page()
            other.goto(page_url(base, args))
        try:
            if other is not None:
                other.evaluate("() => pyspecApp.ready")
            info = page.evaluate("() => pyspecApp.ready")
            t_ready = time.perf_counter() - t0
            if not args.json:
                print(f"[ready in {t_ready:.1f} s: adapter {info['adapter']}, WebGPU "
                      f"{info['webgpu']}]", file=sys.stderr)
                if info.get("draft_auto"):
                    print(f"[draft auto: {info['draft_auto']}]", file=sys.stderr)
            result = page.evaluate("([prompt, config]) => pyspecApp.run(prompt, config, "
                                   "window.pyspecOnText)", [args.prompt, config])
        except PlaywrightError as e:
            shown = page.locator("#error").text_content() if page.locator("#error").is_visible() else ""
            print(f"error: {shown or e.message.splitlines()[0]}", file=sys.stderr)
            browser.close()
            return 2
        notices = page.evaluate("() => pyspecApp.decoder().notices") if args.fault else []
        if other is not None:
            notices += other.evaluate("() => pyspecApp.decoder().notices")
        browser.close()
    if args.json:
        out = {k: result[k] for k in ("text", "tokens", "finish_reason", "stats", "receipt")}
        if args.fault:
            out["notices"] = notices
        print(json.dumps(out))
        return 0
    if args.fault and not (result.get("receipt") or {}).get("faults"):
        print(f"note: the request ended before {args.fault} could strike", file=sys.stderr)
    for n in notices:
        print(f"[notice] {n['code']}: {n['message']}", file=sys.stderr)
    for f in (result.get("receipt") or {}).get("faults", []):
        print(f"[fault] {f['kind']} at cycle {f.get('cycle')}, token {f.get('at_token')}: "
              f"recovered in {f.get('recovery_s', 0):.2f} s", file=sys.stderr)
    sys.stdout.write("\n")
    from pyspec.apps.generate import print_stats
    if result["stats"]:
        print_stats(result["stats"])
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 build.py demo",
                                 description="serve the demo page, or run it headless")
    ap.add_argument("--headless", action="store_true", help="run one request in headless Chromium")
    ap.add_argument("--prompt", default="Tell me about octopuses.")
    ap.add_argument("--model", default="smollm2",
                    help="a model of the site's manifest (smollm2, tiny, ...) or the path of a "
                         "local GGUF (served at local/NAME)")
    ap.add_argument("--draft", default="auto",
                    help="auto (the trained draft on a hardware WebGPU adapter, else ngram) | "
                         "ngram | none | self:L | trained | a manifest model or the path of a "
                         "local GGUF | ngram+ one of the last two")
    ap.add_argument("--k", default="heuristic")
    ap.add_argument("--verify", choices=["greedy", "replay", "rejection"], default=None)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-ctx", type=int, default=None)
    ap.add_argument("--backend", choices=["auto", "webgpu", "cpu"], default="auto",
                    help="a hint to apps/page_engine.make_engine (auto: WebGPU on a hardware "
                         "adapter, the numpy engine on a software one such as SwiftShader)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--fault", type=fault_spec, default=None, metavar="KIND@CYCLE",
                    help=f"run the request as a fault drill: KIND one of {', '.join(FAULTS)}; "
                         "it strikes once CYCLE cycles have run (device-lost needs the WebGPU "
                         "engine: with --backend auto it is switched to webgpu)")
    ap.add_argument("--port", type=int, default=8000, help="port to serve on (not headless)")
    ap.add_argument("--no-champion", action="store_true", help="build the site with tiny models only")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from pyspec.apps.request import cli_error
    from pyspec.errors import PyspecError
    from pyspec.options import Options

    try:   # the request's options and local files, checked before a site is built
        Options(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
                verify=args.verify, k=args.k).check()
        files = serve_local(args)
    except PyspecError as e:
        print(f"error: {cli_error(e)}", file=sys.stderr)
        return 2
    if args.fault and args.fault.partition("@")[0] in GPU_FAULTS and args.backend == "auto":
        # auto picks the CPU engine on a software adapter (SwiftShader), which has no device
        print(f"note: --fault {args.fault} runs on the WebGPU engine (--backend webgpu)",
              file=sys.stderr)
        args.backend = "webgpu"
    try:
        manifest = site.build(champion=not args.no_champion)
    except site.SiteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    root = Path(manifest).parent
    try:
        check_layers(root, args, files)
    except PyspecError as e:
        print(f"error: {cli_error(e)}", file=sys.stderr)
        return 2
    if args.headless:
        try:
            chromium_path()
        except BrowserMissing as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        server, base = serve.start(root, files=files)
        try:
            return run_headless(base, args)
        finally:
            server.shutdown()
    try:
        server, base = serve.start(root, port=args.port, files=files)
    except OSError as e:
        print(f"note: port {args.port} is busy ({e.strerror}); serving on a free port instead",
              file=sys.stderr)
        server, base = serve.start(root, files=files)
    print(f"serving {root} at {base}  (Ctrl-C to stop)", flush=True)
    print(f"open {page_url(base, args)}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
