"""The packed runtime as a web developer uses it, and the documented Content-Security-Policy.

- `webtools/package.py`'s tarball, installed with `npm install ./pyspec-X.tgz` into a scratch app
  that serves its own files from a plain static server (no COOP/COEP/CORP) and shows an image
  from another origin: the client decodes exactly, the weights come from the app by URL; and
  README.md's embedding example runs there as written but for the two things its comments name
  (the package's import path; the champion's file, here the tiny model under the same URL).
- The demo page served under exactly `package.CSP`: it loads, decodes exactly, and the browser
  reports no policy violation.
"""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import struct
import subprocess
import threading
import zlib

from pathlib import Path

import pytest

from webtools import package

from .pageutil import TIMEOUT_S, Context, native_generate, ready, run

pytestmark = pytest.mark.browser

MESSAGES = [{"role": "user", "content": "the cat sat on the mat. the cat"}]

_MAIN_JS = """import { SpecDecoder } from "./node_modules/pyspec/client.js";
window.app = { error: null, result: null, imageLoaded: null };
const img = document.getElementById("logo");
img.onload = () => { window.app.imageLoaded = img.naturalWidth > 0; };
img.onerror = () => { window.app.imageLoaded = false; };
img.src = new URLSearchParams(location.search).get("image");
try {
  const decoder = await SpecDecoder.create({ champion: { url: "/models/tiny.gguf" } });
  const completion = await decoder.chat.completions.create({
    messages: JSON.parse(document.getElementById("messages").textContent),
    max_tokens: 32, pyspec: { k: "fixed:3" } });
  window.app.result = { content: completion.choices[0].message.content,
                        isolated: self.crossOriginIsolated };
} catch (err) {
  window.app.error = `${err.code}: ${err.message}`;
}
"""


def readme_app_js(readme: str) -> str:
    """README.md's embedding example as the scratch app's module: its import from the package
    (as its comment says), and what it wrote to `out` and its result kept for the test."""
    snippet = re.search(r"```js\n(.*?)```", readme, re.S)[1]
    imports, _, body = snippet.partition("\n")
    assert imports.startswith('import { SpecDecoder } from "./client.js";')
    imports = imports.replace('from "./client.js";', 'from "./node_modules/pyspec/client.js";')
    return (imports + "\nwindow.readme = null;\nconst out = document.getElementById(\"out\");\n"
            "try {\n" + body.replace("\nconsole.log(", "\nwindow.readme = { text: "
                                      "out.textContent, stats: d.lastResult?.stats };\n"
                                      "console.log(") +
            "} catch (err) {\n  window.readme = { error: `${err.code}: ${err.message}` };\n}\n")


def _png() -> bytes:
    """A 1x1 grey PNG (the third-party image)."""
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\x80")) + chunk(b"IEND", b""))


def _serve(root, headers: dict | None = None) -> tuple:
    """A plain static server for `root`, adding `headers` to every answer."""
    def end_headers(self):
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        http.server.SimpleHTTPRequestHandler.end_headers(self)

    quiet = type("Quiet", (http.server.SimpleHTTPRequestHandler,),
                 {"log_message": lambda self, *args: None, "end_headers": end_headers})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://localhost:{server.server_address[1]}/"


@pytest.fixture(scope="module")
def tarball(tmp_path_factory):
    if shutil.which("npm") is None:
        pytest.fail("npm is not installed: build.py setup installs it")
    return package.build(tmp_path_factory.mktemp("pkg") / "package")


def test_the_tarball_installs_into_a_scratch_app_and_decodes(browser, tarball, tmp_path,
                                                            site_root):
    app = tmp_path / "app"
    (app / "models").mkdir(parents=True)
    (app / "package.json").write_text('{"name": "scratch-app", "private": true}\n')
    done = subprocess.run(["npm", "install", "--offline", "--no-audit", "--no-fund",
                           str(tarball)], cwd=app, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    installed = app / "node_modules" / "pyspec"
    assert (installed / "client.d.ts").exists() and (installed / "pyodide" / "pyodide.asm.wasm").exists()
    assert not list(installed.rglob("*.gguf")), "the package must not carry weights"
    shutil.copyfile(site_root / "models" / "tiny.gguf", app / "models" / "tiny.gguf")
    (app / "main.js").write_text(_MAIN_JS)
    (app / "index.html").write_text(
        "<!doctype html><meta charset=utf-8><title>scratch</title><link rel=icon href='data:,'>"
        "<img id=logo alt=logo><script id=messages type=application/json>"
        f"{__import__('json').dumps(MESSAGES)}</script>"
        "<script type=module src=main.js></script>")
    other = tmp_path / "other"
    other.mkdir()
    (other / "logo.png").write_bytes(_png())
    # README.md's example, its champion's file name the tiny model's (a 98 MB model decodes at
    # a few tokens a second on SwiftShader)
    from pyspec import champion_path
    readme = (package.ROOT / "README.md").read_text()
    shutil.copyfile(site_root / "models" / "tiny.gguf",
                    app / "models" / Path(champion_path()).name)
    (app / "readme.js").write_text(readme_app_js(readme))
    (app / "readme.html").write_text("<!doctype html><meta charset=utf-8><title>readme</title>"
                                     "<link rel=icon href='data:,'><pre id=out></pre>"
                                     "<script type=module src=readme.js></script>")
    app_server, app_url = _serve(app)
    img_server, img_url = _serve(other)
    c = Context(browser, app_url)
    try:
        page = c.page(f"index.html?image={img_url}logo.png")
        page.wait_for_function("() => window.app && (app.result || app.error)",
                               timeout=1000 * TIMEOUT_S)
        out = page.evaluate("() => window.app")
        page = c.page("readme.html")
        page.wait_for_function("() => window.readme", timeout=1000 * TIMEOUT_S)
        from_readme = page.evaluate("() => window.readme")
    finally:
        c.ctx.close()
        app_server.shutdown()
        img_server.shutdown()
    assert not c.offsite, f"requests to other origins: {c.offsite}"
    assert out["error"] is None, out["error"]
    assert out["imageLoaded"] is True, "the third-party image did not load beside the runtime"
    assert out["result"]["isolated"] is False
    native = native_generate(str(app / "models" / "tiny.gguf"), MESSAGES, "ngram",
                             max_tokens=32, k="fixed:3")
    assert out["result"]["content"] == native.text
    assert "error" not in from_readme, from_readme["error"]
    native = native_generate(str(app / "models" / "tiny.gguf"), [{"role": "user",
                                                                   "content": "Hi!"}],
                             "ngram", max_tokens=64)
    assert from_readme["text"] == native.text and from_readme["stats"]["drafter"] == "ngram"


def test_the_demo_page_runs_under_the_documented_csp(browser, site_root):
    server, url = _serve(site_root, {"Content-Security-Policy": package.CSP})
    c = Context(browser, url)
    try:
        page = c.ctx.new_page()
        violations: list[str] = []
        page.on("console", lambda m: violations.append(m.text)
                if "Content Security Policy" in m.text else None)
        response = page.goto(url + "index.html?model=tiny")
        assert response.headers["content-security-policy"] == package.CSP
        page.evaluate("() => { window.cspViolations = []; document.addEventListener("
                      "'securitypolicyviolation', (e) => cspViolations.push(e.violatedDirective)); }")
        ready(page)
        result = run(page, MESSAGES[0]["content"], {"max_tokens": 24, "k": "fixed:3"})
        violations += page.evaluate("() => window.cspViolations")
    finally:
        c.ctx.close()
        server.shutdown()
    assert not c.offsite, f"requests to other origins: {c.offsite}"
    assert not violations, violations
    tiny = str(site_root / "models" / "tiny.gguf")
    assert result["text"] == native_generate(tiny, MESSAGES, "none", max_tokens=24).text
