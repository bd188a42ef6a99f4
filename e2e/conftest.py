"""Browser end-to-end fixtures: one site built for this session, one static server and one
headless Chromium for the whole session (each test gets a fresh browser context, so fresh OPFS storage).

Every context blocks every request to an origin other than the local server, records it, and the
test fails if there was any: the runtime must never reach a CDN. The browser tests skip, with the
reason, only when Chromium is not installed, and fail then when PYSPEC_REQUIRE names `browser`.
"""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import pytest

from webtools import browser as web_browser
from webtools import serve, site

from .pageutil import Context


@pytest.fixture(scope="session")
def site_root(tmp_path_factory) -> Path:
    """The site, built for this session alone: a build running beside it (the demo, another
    test session) rewrites dist/site/ and would mix two versions of the wheel and manifest."""
    return site.build(tmp_path_factory.mktemp("site")).parent


@pytest.fixture(scope="session")
def site_url(site_root):
    server, base = serve.start(site_root)
    yield base
    server.shutdown()


@pytest.fixture(scope="session")
def plain_site_url(site_root):
    """The same site from a plain static server (`python -m http.server`): no COOP, COEP or CORP
    headers and the standard library's MIME types, as on GitHub Pages or a bare CDN."""
    quiet = type("Quiet", (http.server.SimpleHTTPRequestHandler,),
                 {"log_message": lambda self, *args: None})
    handler = functools.partial(quiet, directory=str(site_root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://localhost:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="session")
def browser(need):
    try:
        web_browser.chromium_path()
    except web_browser.BrowserMissing as e:
        need("browser", str(e))
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = web_browser.launch(p)
        yield b
        b.close()


@pytest.fixture
def context(browser, site_url):
    c = Context(browser, site_url)
    yield c
    c.ctx.close()
    assert not c.offsite, f"requests to other origins: {c.offsite}"
