"""Screenshot the demo page after one request with the real champion, its tokens styled by kind
(accepted drafts, the champion's corrections, bonus tokens), for README.md and docs/screenshots/.

    .venv/bin/python -m webtools.screenshot [--out docs/screenshots/demo.png]
    .venv/bin/python -m webtools.screenshot --fault worker-terminate@3 \
        --out docs/screenshots/fault-worker-terminate.png

It builds the site, serves it, runs the prompt below through the page's own `pyspecApp.run` with
the n-gram drafter (a rewrite copies the prompt, so drafts are accepted often) and saves the
viewport. On SwiftShader the page uses its CPU engine; this takes a minute or two on two cores.
With --fault the page is opened with its fault drills on and the request runs as that drill
(KIND@CYCLE, the kinds of `python3 build.py demo --help`; a loading fault such as opfs-flip
strikes in a reload before the request): the picture shows the champion's text with the notice
the page gave. --backend webgpu for the GPU faults (device-lost needs the WebGPU engine).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from webtools import browser, serve, site

PROMPT = ("Rewrite this paragraph in a formal tone: the octopus has three hearts and blue blood. "
          "the octopus can change colour in a blink and squeeze through any gap bigger than "
          "its beak.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs/screenshots/demo-token-kinds.png"))
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--fault", default=None, help="a fault drill, KIND@CYCLE")
    ap.add_argument("--backend", default="auto", choices=["auto", "webgpu", "cpu"])
    args = ap.parse_args()
    config: dict = {"max_tokens": args.max_tokens, "k": "fixed:4"}
    load_drill = None
    if args.fault:
        kind = args.fault.split("@")[0]
        if kind.startswith("opfs-") or kind == "download-drop":
            load_drill = kind
        else:
            config["drill"] = args.fault
    query = f"model=smollm2&draft=ngram&backend={args.backend}" + ("&drills=1" if args.fault else "")
    root = site.build().parent
    server, base = serve.start(root)
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = browser.launch(p)
        page = b.new_page(viewport={"width": 1200, "height": 760})
        page.set_default_timeout(900_000)
        page.goto(base + "index.html?" + query)
        page.evaluate("() => pyspecApp.ready")
        if load_drill:
            page.evaluate("(d) => pyspecApp.decoder().reload({ loadDrill: d })", load_drill)
        page.fill("#prompt", PROMPT)
        result = page.evaluate("([p, c]) => pyspecApp.run(p, c)", [PROMPT, config])
        page.fill("#prompt", "")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(args.out))
        b.close()
    server.shutdown()
    s = result["stats"]
    print(f"{args.out}: {s['generated_tokens']} tokens, {s['accepted']} accepted of "
          f"{s['drafted']} drafted, {s['champion_passes']} champion passes; faults: "
          f"{[f['kind'] for f in result['receipt']['faults']]}")


if __name__ == "__main__":
    main()
