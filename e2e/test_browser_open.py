"""Opening a model (issue 46): a File/Blob the user picks is hashed as it is copied into OPFS,
cached under its sha256 and listed by cachedModels(), and decodes as the same model by URL; the
model card is read from a URL's header by Range requests before any download, with the native
`info --json` numbers; a model the page cannot run is refused before its weights download. A
model on another origin (docs/embedding.md): it loads with the CORS headers the docs name, not
without, and under a CSP only once its origin is in connect-src."""

from __future__ import annotations

import json

import pytest

from pyspec.apps import info
from pyspec.formats import gguf, ggufwrite

from .pageutil import Context

pytestmark = pytest.mark.browser

PRELUDE = """
const { SpecDecoder } = await import("./client.js");
const messages = [{ role: "user", content: "the cat sat on the mat. the cat" }];
const textOf = async (d) => {
  let text = "";
  for await (const step of d.generate(messages, { max_tokens: 8 })) text += step.text;
  return text;
};
"""

BLOB_AND_URL = """async ([url, sha256]) => {%s
  const blob = new File([await (await fetch(url)).arrayBuffer()], "picked.gguf");
  const byBlob = await SpecDecoder.create({ champion: blob });
  const blobText = await textOf(byBlob);
  const blobCard = byBlob.info.card;
  byBlob.terminate();
  const cached = await SpecDecoder.cachedModels();
  const byUrl = await SpecDecoder.create({ champion: { url, sha256 } });
  const urlText = await textOf(byUrl);
  const weights = byUrl.info.weights;
  byUrl.terminate();
  const root = await navigator.storage.getDirectory();
  const names = [];
  for await (const name of (await root.getDirectoryHandle("pyspec-weights")).keys()) {
    names.push(name);
  }
  return { blobText, urlText, cached, weights, names, blobCard };
}""" % PRELUDE

CARD = """async (url) => {%s
  return SpecDecoder.card(url);
}""" % PRELUDE

REFUSED = """async (url) => {%s
  try {
    await SpecDecoder.create({ champion: { url } });
    return null;
  } catch (e) { return { code: e.code, message: e.message }; }
}""" % PRELUDE


@pytest.fixture(scope="module")
def ctx(browser, site_url):
    c = Context(browser, site_url)
    yield c
    c.ctx.close()
    assert not c.offsite, f"requests to other origins: {c.offsite}"


@pytest.fixture(scope="module")
def page(ctx):
    p = ctx.page("embed-example.html?model=none-such")
    p.wait_for_function("() => window.embed && (embed.decoder || embed.error)")
    return p


def tiny_artifact(site_root) -> dict:
    manifest = json.loads((site_root / "manifest.json").read_text())
    return next(a for a in manifest["artifacts"] if a.get("model") == "tiny")


def test_a_picked_blob_is_cached_by_its_sha256_and_decodes_as_by_url(page, site_root):
    tiny = tiny_artifact(site_root)
    out = page.evaluate(BLOB_AND_URL, [tiny["url"], tiny["sha256"]])
    assert {"sha256": tiny["sha256"], "bytes": tiny["size"]} in out["cached"]
    assert out["weights"]["cached"] and out["weights"]["downloaded"] == 0   # the Blob's copy
    assert not [n for n in out["names"] if n.endswith(".part")]             # nothing half-written
    assert out["blobText"] and out["blobText"] == out["urlText"]
    assert out["blobCard"]["runs"] and out["blobCard"]["file"] == "picked.gguf"


def test_the_card_reads_the_header_by_range_and_matches_the_native_one(page, ctx, site_root):
    tiny = tiny_artifact(site_root)
    native = info.card(str(site_root / tiny["url"]))
    before = len(ctx.ranges)
    out = page.evaluate(CARD, tiny["url"])
    assert out["error"] is None and out["header"]["range"] is True
    card = out["card"]
    for key in ("architecture", "parameters", "tensor_types", "template", "context", "layers",
                "vocab", "largest_tensor", "bytes", "runs"):
        assert card[key] == native[key], key
    assert card["backends"]["page-cpu"] == native["backends"]["page-cpu"] | {
        "needs": card["backends"]["page-cpu"]["needs"]}   # the page's cache: its maxCtx
    asked = [r for u, r in ctx.ranges[before:] if u.endswith(tiny["url"])]
    assert asked and all(r for r in asked)


def test_a_model_the_page_cannot_run_is_refused_before_its_download(page, ctx, site_root):
    md = dict(gguf.GGUFFile.open(str(site_root / tiny_artifact(site_root)["url"])).metadata)
    md["general.architecture"] = "mamba"
    path = site_root / "mamba.gguf"
    ggufwrite.write(path, md, {})
    with open(path, "ab") as f:
        f.write(bytes(8 << 20))     # weights that must not download
    out = page.evaluate(REFUSED, "mamba.gguf")
    assert out["code"] == "bad_model" and "mamba" in out["message"]
    asked = [r for u, r in ctx.ranges if u.endswith("/mamba.gguf")]
    assert asked and all(r and r.startswith("bytes=0-") for r in asked)
    assert all(int(r.split("-")[1]) < 4 << 20 for r in asked)


def test_a_server_without_range_gives_the_card_from_the_downloads_start(page, ctx, site_root):
    """The server answers 200 with the whole file: the card is read from its start, and says so."""
    tiny = tiny_artifact(site_root)
    body = (site_root / tiny["url"]).read_bytes()
    ctx.ctx.route("**/norange.gguf", lambda route: route.fulfill(status=200, body=body))
    out = page.evaluate(CARD, "norange.gguf")
    assert out["error"] is None and out["header"]["range"] is False
    assert out["card"]["parameters"] == info.card(str(site_root / tiny["url"]))["parameters"]
    assert out["card"]["bytes"] == len(body)


CROSS_ORIGIN = """async (url) => {%s
  try {
    const d = await SpecDecoder.create({ champion: { url } });
    const text = await textOf(d);
    d.terminate();
    return { text };
  } catch (e) { return { code: e.code, message: e.message }; }
}""" % PRELUDE


def _model_host(root, headers: dict):
    """A server of `root` on another origin (127.0.0.1, the page's is localhost) that answers
    Range requests and sends `headers`, and answers a CORS preflight by `headers` too."""
    import functools
    import http.server
    import threading

    from webtools import serve

    class Host(serve.SiteHandler):
        def end_headers(self):
            for k, v in headers.items():
                self.send_header(k, v)
            http.server.SimpleHTTPRequestHandler.end_headers(self)   # not the site's COOP/CORP

        def do_OPTIONS(self):
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = serve.Server(("127.0.0.1", 0), functools.partial(Host, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


@pytest.mark.parametrize("headers, fails", [
    ({}, "cannot fetch it"),
    ({"Access-Control-Allow-Origin": "*"}, "a Range answer without the file's size"),
    ({"Access-Control-Allow-Origin": "*", "Access-Control-Expose-Headers": "Content-Range"},
     None),
    ({"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Headers": "Range",
      "Access-Control-Expose-Headers": "Content-Range, Content-Length"}, None),
], ids=["no-cors", "content-range-hidden", "minimal", "with-preflight-answer"])
def test_a_model_on_another_origin_needs_the_cors_headers_the_docs_name(page, site_root,
                                                                        headers, fails):
    """docs/embedding.md's model on another origin: the host sends Access-Control-Allow-Origin
    and exposes Content-Range (the card's Range answers need it); without them the load fails
    with download_failed saying why, with them the model decodes as the same file does here."""
    from .pageutil import native_generate

    tiny = tiny_artifact(site_root)
    server, base = _model_host(site_root, headers)
    try:
        out = page.evaluate(CROSS_ORIGIN, base + tiny["url"])
    finally:
        server.shutdown()
    if fails:
        assert out.get("code") == "download_failed" and fails in out["message"], out
    else:
        native = native_generate(str(site_root / tiny["url"]),
                                 [{"role": "user", "content": "the cat sat on the mat. the cat"}],
                                 "ngram", max_tokens=8)
        assert out.get("text") == native.text, out


@pytest.mark.parametrize("allow", [False, True], ids=["connect-src-self", "connect-src-host"])
def test_a_model_on_another_origin_needs_its_origin_in_connect_src(browser, site_root, allow):
    """Under the runtime's CSP (webtools/package.py CSP), sent with every file of the site as a
    static host does, a model on another origin loads only once that origin is in
    connect-src."""
    import functools
    import http.server
    import threading

    from webtools import package

    from .pageutil import native_generate

    tiny = tiny_artifact(site_root)
    host, base = _model_host(site_root, {"Access-Control-Allow-Origin": "*",
                                         "Access-Control-Expose-Headers": "Content-Range"})
    csp = package.CSP.replace("connect-src 'self'",
                              f"connect-src 'self' {base.rstrip('/')}" if allow else
                              "connect-src 'self'")

    class Site(http.server.SimpleHTTPRequestHandler):
        def end_headers(self):
            self.send_header("Content-Security-Policy", csp)
            super().end_headers()

        def log_message(self, *args):
            pass

    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                           functools.partial(Site, directory=str(site_root)))
    threading.Thread(target=site.serve_forever, daemon=True).start()
    (site_root / "blank.html").write_text("<!doctype html><title>blank</title>")
    c = Context(browser, f"http://localhost:{site.server_address[1]}/")
    try:
        out = c.page("blank.html").evaluate(CROSS_ORIGIN, base + tiny["url"])
    finally:
        c.ctx.close()
        site.shutdown()
        host.shutdown()
    if allow:
        native = native_generate(str(site_root / tiny["url"]),
                                 [{"role": "user", "content": "the cat sat on the mat. the cat"}],
                                 "ngram", max_tokens=8)
        assert out.get("text") == native.text, out
    else:
        assert out.get("code") == "download_failed" and "cannot fetch it" in out["message"], out
