"""Weights in OPFS, keyed by sha256: downloaded once, checked on every load, fetched again when
the stored file is corrupt. The Pyodide snapshot beside them: made after the first load's ready,
started from on the next load, made again when damaged, and neither when switched off."""

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
    wheels = [a for a in manifest["artifacts"] if a["kind"] in ("pyodide-wheel", "pyspec-wheel")]
    BYTECODE = "bytecode-" + "-".join(a["sha256"][:16] for a in wheels) + ".zip"  # snapshot.js
    tiny = next(a for a in manifest["artifacts"] if a.get("model") == "tiny")
    weight_requests = lambda: [u for u in context.requests if u.endswith(tiny["url"])]  # noqa: E731

    page = context.page("index.html?model=tiny")
    first = ready(page)
    assert first["weights"]["downloaded"] == tiny["size"] and not first["weights"]["cached"]
    assert len(weight_requests()) == 1
    assert first["startup"]["snapshot"] == first["startup"]["bytecode"] == "making"
    done = page.evaluate(SNAPSHOT_DONE)
    assert done["snapshot"] == done["bytecode"] == "saved", done

    page.reload()
    second = ready(page)
    assert second["weights"] == {"downloaded": 0, "cached": True, "corrupt": 0}
    assert len(weight_requests()) == 1, "the second load asked the server for the weights"
    assert second["startup"]["snapshot"] == "restored", second["startup"]
    assert second["startup"]["bytecode"] == "cached", second["startup"]
    tokens = run(page, "the cat", {"max_tokens": 6})["tokens"]

    page.evaluate(CORRUPT, ["pyspec-weights", f"{tiny['sha256']}.gguf"])
    page.evaluate(CORRUPT, ["pyspec-runtime", "pyodide-0.27.7.snapshot"])
    page.evaluate(CORRUPT, ["pyspec-runtime", BYTECODE])
    page.reload()
    third = ready(page)
    assert third["weights"]["corrupt"] == 1
    assert third["weights"]["downloaded"] == tiny["size"]
    assert len(weight_requests()) == 2
    assert third["startup"]["snapshot"] == third["startup"]["bytecode"] == "making"
    assert "damaged" in third["startup"]["snapshot_error"]
    assert run(page, "the cat", {"max_tokens": 6})["tokens"] == tokens
    done = page.evaluate(SNAPSHOT_DONE)
    assert done["snapshot"] == done["bytecode"] == "saved", done

    page.goto(context.base + "index.html?model=tiny&snapshot=0")
    fourth = ready(page)
    assert fourth["startup"]["snapshot"] == fourth["startup"]["bytecode"] == "off"
    assert set(fourth["startup"]["phases_ms"]) == {"pyodide", "packages", "import", "weights",
                                                   "model"}
    assert run(page, "the cat", {"max_tokens": 6})["tokens"] == tokens
