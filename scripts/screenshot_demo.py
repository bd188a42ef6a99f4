"""Screenshot the demo page after one request with the real champion, its tokens styled by kind
(accepted drafts, the champion's corrections, bonus tokens), for README.md and docs/screenshots/.

    .venv/bin/python scripts/screenshot_demo.py [--out docs/screenshots/demo.png]

It builds the site, serves it, runs the prompt below through the page's own `pyspecApp.run` with
the n-gram drafter (a rewrite copies the prompt, so drafts are accepted often) and saves the
viewport. On SwiftShader the page uses its CPU engine; this takes a minute or two on two cores.
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
    args = ap.parse_args()
    root = site.build().parent
    server, base = serve.start(root)
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = browser.launch(p)
        page = b.new_page(viewport={"width": 1200, "height": 760})
        page.set_default_timeout(900_000)
        page.goto(base + "index.html?model=smollm2&draft=ngram")
        page.evaluate("() => pyspecApp.ready")
        page.fill("#prompt", PROMPT)
        result = page.evaluate("([p, n]) => pyspecApp.run(p, {max_tokens: n, k: 'fixed:4'})",
                               [PROMPT, args.max_tokens])
        page.fill("#prompt", "")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(args.out))
        b.close()
    server.shutdown()
    s = result["stats"]
    print(f"{args.out}: {s['generated_tokens']} tokens, {s['accepted']} accepted of "
          f"{s['drafted']} drafted, {s['champion_passes']} champion passes")


if __name__ == "__main__":
    main()
