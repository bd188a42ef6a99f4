"""Browser end-to-end fixtures: one site built for this session, one static server and one
headless Chromium for the whole session (each test gets a fresh browser context, so fresh OPFS storage).

Every context blocks every request to an origin other than the local server, records it, and the
test fails if there was any: the runtime must never reach a CDN. The browser tests skip, with the
reason, only when Chromium is not installed, and fail then when PYSPEC_REQUIRE names `browser`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from .pageutil import Context

from webtools import browser as web_browser
from webtools import serve, site


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
