"""Weights in OPFS, keyed by sha256: downloaded once, checked on every load, fetched again when
the stored file is corrupt."""

from __future__ import annotations

import json

import pytest

from .pageutil import ready, run

pytestmark = pytest.mark.browser

CORRUPT = """async (name) => {
  const root = await navigator.storage.getDirectory();
  const dir = await root.getDirectoryHandle("pyspec-weights");
  const file = await dir.getFileHandle(name);
  const w = await file.createWritable({ keepExistingData: true });
  await w.write({ type: "write", position: 4096, data: new Uint8Array(64).fill(7) });
  await w.close();
}"""


def test_second_load_is_cached_and_corruption_is_refetched(context, site_root):
    manifest = json.loads((site_root / "manifest.json").read_text())
    tiny = next(a for a in manifest["artifacts"] if a.get("model") == "tiny")
    weight_requests = lambda: [u for u in context.requests if u.endswith(tiny["url"])]  # noqa: E731

    page = context.page("index.html?model=tiny")
    first = ready(page)
    assert first["weights"]["downloaded"] == tiny["size"] and not first["weights"]["cached"]
    assert len(weight_requests()) == 1

    page.reload()
    second = ready(page)
    assert second["weights"] == {"downloaded": 0, "cached": True, "corrupt": 0}
    assert len(weight_requests()) == 1, "the second load asked the server for the weights"
    tokens = run(page, "the cat", {"max_tokens": 6})["tokens"]

    page.evaluate(CORRUPT, f"{tiny['sha256']}.gguf")
    page.reload()
    third = ready(page)
    assert third["weights"]["corrupt"] == 1
    assert third["weights"]["downloaded"] == tiny["size"]
    assert len(weight_requests()) == 2
    assert run(page, "the cat", {"max_tokens": 6})["tokens"] == tokens
