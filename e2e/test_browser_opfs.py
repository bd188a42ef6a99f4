"""Weights in OPFS, keyed by sha256: downloaded once, checked on every load, fetched again when
the stored file is corrupt. The start-up caches beside them (web/snapshot.js): Python starts
from the snapshot the site ships; the bytecode is made after the first load's ready, used on the
next, made again when damaged. A damaged shipped snapshot gives way to one the page makes and
saves. snapshot: false uses neither."""

from __future__ import annotations

import json

import pytest

from .pageutil import ready, run

pytestmark = pytest.mark.browser

# The snapshot's state once its worker is done (web/worker.js makeSnapshot), waited for.
SNAPSHOT_DONE = """async () => {
  for (;;) {
    const s = await pyspecApp.decoder().startup();
    if (s.snapshot !== "making" && s.bytecode !== "making") return s;
    await new Promise((r) => setTimeout(r, 200));
  }
}"""

# A file of junk in the page's OPFS; EXISTS says whether a file is there.
JUNK = """async ([folder, name]) => {
  const root = await navigator.storage.getDirectory();
  const dir = await root.getDirectoryHandle(folder, { create: true });
  const w = await (await dir.getFileHandle(name, { create: true })).createWritable();
  await w.write(new Uint8Array(4096).fill(7));
  await w.close();
}"""
EXISTS = """async ([folder, name]) => {
  const root = await navigator.storage.getDirectory();
  try {
    await (await root.getDirectoryHandle(folder)).getFileHandle(name);
    return true;
  } catch { return false; }
}"""

CORRUPT = """async ([folder, name]) => {
  const root = await navigator.storage.getDirectory();
  const dir = await root.getDirectoryHandle(folder);
  const file = await dir.getFileHandle(name);
  const w = await file.createWritable({ keepExistingData: true });
  await w.write({ type: "write", position: 4096, data: new Uint8Array(64).fill(7) });
  await w.close();
}"""


def test_second_load_is_cached_and_corruption_is_refetched(context, site_root):
    manifest = json.loads((site_root / "manifest.json").read_text())
    wheels = [a for a in manifest["artifacts"] if a["kind"] in ("pyodide-wheel", "pyspec-wheel",
                                                                    "wheel")]
    BYTECODE = "bytecode-" + "-".join(a["sha256"][:16] for a in wheels) + ".zip"  # snapshot.js
    tiny = next(a for a in manifest["artifacts"] if a.get("model") == "tiny")
    weight_requests = lambda: [u for u in context.requests if u.endswith(tiny["url"])]  # noqa: E731

    page = context.page("index.html?model=tiny")
    first = ready(page)
    assert first["weights"]["downloaded"] == tiny["size"] and not first["weights"]["cached"]
    assert len(weight_requests()) == 1
    assert first["startup"]["snapshot"] == "shipped", first["startup"]
    assert first["startup"]["bytecode"] == "making"
    done = page.evaluate(SNAPSHOT_DONE)
    assert (done["snapshot"], done["bytecode"]) == ("shipped", "saved"), done

    page.reload()
    second = ready(page)
    assert second["weights"] == {"downloaded": 0, "cached": True, "corrupt": 0}
    assert len(weight_requests()) == 1, "the second load asked the server for the weights"
    assert (second["startup"]["snapshot"], second["startup"]["bytecode"]) == ("shipped", "cached")
    tokens = run(page, "the cat", {"max_tokens": 6})["tokens"]

    page.evaluate(CORRUPT, ["pyspec-weights", f"{tiny['sha256']}.gguf"])
    page.evaluate(CORRUPT, ["pyspec-runtime", BYTECODE])
    saved = ["pyspec-runtime", "pyodide-0.27.7.snapshot"]
    page.evaluate(JUNK, saved)   # a damaged saved snapshot: tried first, refused, removed
    page.reload()
    third = ready(page)
    assert third["startup"]["snapshot"] == "shipped"
    assert not page.evaluate(EXISTS, saved)
    assert third["weights"]["corrupt"] == 1
    assert third["weights"]["downloaded"] == tiny["size"]
    assert len(weight_requests()) == 2
    assert third["startup"]["bytecode"] == "making"
    assert "bytecode cache is damaged" in third["startup"]["snapshot_error"]
    assert run(page, "the cat", {"max_tokens": 6})["tokens"] == tokens
    assert page.evaluate(SNAPSHOT_DONE)["bytecode"] == "saved"

    page.goto(context.base + "index.html?model=tiny&snapshot=0")
    fourth = ready(page)
    assert fourth["startup"]["snapshot"] == fourth["startup"]["bytecode"] == "off"
    assert set(fourth["startup"]["phases_ms"]) == {"pyodide", "packages", "import", "weights",
                                                   "model"}
    assert run(page, "the cat", {"max_tokens": 6})["tokens"] == tokens


def test_a_damaged_shipped_snapshot_gives_way_to_one_the_page_saves(context, site_root):
    manifest = json.loads((site_root / "manifest.json").read_text())
    [shipped] = [a for a in manifest["artifacts"] if a["kind"] == "pyodide-snapshot"]
    body = bytearray((site_root / shipped["url"]).read_bytes())
    body[1 << 20] ^= 0xFF   # one byte of the memory: its sha256 no longer matches
    context.ctx.route(f"**/{shipped['url']}", lambda route: route.fulfill(
        status=200, body=bytes(body), headers={"Content-Type": "application/octet-stream",
                                               "Cross-Origin-Resource-Policy": "same-origin"}))

    page = context.page("index.html?model=tiny")
    first = ready(page)
    assert first["startup"]["snapshot"] == "making", first["startup"]
    assert "shipped snapshot" in first["startup"]["snapshot_error"]
    tokens = run(page, "the cat", {"max_tokens": 6})["tokens"]
    done = page.evaluate(SNAPSHOT_DONE)
    assert done["snapshot"] == done["bytecode"] == "saved", done

    page.reload()
    second = ready(page)
    assert (second["startup"]["snapshot"], second["startup"]["bytecode"]) == ("restored", "cached")
    assert run(page, "the cat", {"max_tokens": 6})["tokens"] == tokens
    # A damaged saved snapshot is refused and removed: the first test above.
