"""Opening a model (issue 46): a File/Blob the user picks is hashed as it is copied into OPFS,
cached under its sha256 and listed by cachedModels(), and decodes as the same model by URL; the
model card is read from a URL's header by Range requests before any download, with the native
`info --json` numbers; a model the page cannot run is refused before its weights download."""

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
