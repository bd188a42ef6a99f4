"""Helpers shared by the e2e tests: a browser context that blocks other origins, the page's
`pyspecApp` driven with timeouts, and the native engine (run in a thread: Playwright's sync API
keeps an asyncio loop on the main one)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

from pyspec.cpu.model import Model
from pyspec.engine import Engine
from pyspec.load import backend
from pyspec.options import Options
from pyspec.text.tokenizer import Tokenizer

TIMEOUT_S = 240                # Pyodide + numpy + pyspec start in 15-30 s on two busy cores
LOCAL_HOSTS = {"localhost", "127.0.0.1"}


class Context:
    """A browser context whose off-site requests are blocked and recorded; `requests` lists
    every URL asked of the local server, `ranges` each with its Range header (or None)."""

    def __init__(self, browser, base: str):
        self.base = base
        self.offsite: list[str] = []
        self.requests: list[str] = []
        self.ranges: list[tuple[str, str | None]] = []
        self.ctx = browser.new_context()
        self.ctx.set_default_timeout(1000 * TIMEOUT_S)
        self.ctx.route("**/*", self._route)

    def _route(self, route) -> None:
        url = route.request.url
        if urlparse(url).hostname in LOCAL_HOSTS:
            self.requests.append(url)
            self.ranges.append((url, route.request.headers.get("range")))
            route.continue_()
        else:
            self.offsite.append(url)
            route.abort()

    def page(self, path: str):
        page = self.ctx.new_page()
        page.goto(self.base + path)
        return page


_WITH_TIMEOUT = """async ([what, arg, seconds]) => {
  const timeout = new Promise((_, reject) =>
    setTimeout(() => reject(new Error(`timed out after ${seconds} s`)), seconds * 1000));
  const work = what === "ready" ? pyspecApp.ready : pyspecApp.run(arg.prompt, arg.config);
  return Promise.race([work, timeout]);
}"""


def ready(page, seconds: int = TIMEOUT_S) -> dict:
    """Wait until the page's decoder is ready; returns the worker's `ready` message."""
    return page.evaluate(_WITH_TIMEOUT, ["ready", None, seconds])


def run(page, prompt: str, config: dict, seconds: int = TIMEOUT_S) -> dict:
    """One request through the page, in a fresh conversation: {text, tokens, stats, receipt, ...}."""
    return page.evaluate(_WITH_TIMEOUT, ["run", {"prompt": prompt, "config": config}, seconds])


def native_generate(model_path: str, messages: list[dict], draft: str = "none", load=Model.load,
                    **options):
    """The native CPU reference: the same Engine as `python -m pyspec generate`, over
    `load(model_path)` (the plain numpy Model unless told)."""
    def go():
        model = load(model_path)
        tokenizer = Tokenizer.from_metadata(model.metadata)
        engine = Engine(backend(model, draft), tokenizer)
        return engine.generate(tokenizer.encode_chat(messages), Options(**options))

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(go).result()
