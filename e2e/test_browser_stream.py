"""Weights streamed to the GPU (issue 46): a model's tensors go from OPFS to WebGPU buffers one at
a time, its sha256 checked as it streams, so the wasm heap grows by about a tensor, not the file;
under lowered limits (init's gpuLimits) the vocabulary tables go in row parts; the tokens equal
the native engine's. A sha256 mismatch is named and leaves nothing in OPFS; two pages opening
the same file at once write it once (Web Locks) and both decode it."""

from __future__ import annotations

import json

import pytest

from pyspec.apps import info

from .pageutil import native_generate
from .test_browser_open import ctx, page  # noqa: F401 (fixtures: the embed example's page)

pytestmark = pytest.mark.browser

MESSAGES = [{"role": "user", "content": "the cat sat on the mat. the cat"}]
N = 16

PRELUDE = """
const { SpecDecoder } = await import("./client.js");
const tokensOf = async (d, messages, n) => {
  const it = d.generate(messages, { draft: "none", max_tokens: n });
  let step;
  while (!(step = await it.next()).done);
  return step.value.tokens;
};
const opfsNames = async () => {
  const root = await navigator.storage.getDirectory();
  const names = [];
  for await (const name of (await root.getDirectoryHandle("pyspec-weights", { create: true }))
    .keys()) names.push(name);
  return names;
};
"""

STREAMED = """async ([champion, gpuLimits, messages, n]) => {%s
  const d = await SpecDecoder.create({ champion, backend: "webgpu", gpuLimits, maxCtx: 128 });
  try {
    const tokens = await tokensOf(d, messages, n);
    return { tokens, info: d.info, memory: await d.memory() };
  } finally { d.terminate(); }
}""" % PRELUDE

MISMATCH = """async ([url, sha256]) => {%s
  try {
    await SpecDecoder.create({ champion: { url, sha256 } });
    return { error: null, names: await opfsNames() };
  } catch (e) { return { error: { code: e.code, message: e.message }, names: await opfsNames() }; }
}""" % PRELUDE

OPEN = """async ([url, sha256, messages, n]) => {%s
  const d = await SpecDecoder.create({ champion: { url, sha256 }, maxCtx: 128 });
  try {
    return { tokens: await tokensOf(d, messages, n), weights: d.info.weights };
  } finally { d.terminate(); }
}""" % PRELUDE

# A page that writes the model into OPFS as the worker does (under the file's lock, to a
# temporary name moved to the sha256 name once whole), slowly: half, then a pause until another
# page's request for the lock waits (navigator.locks.query; at most `ms`), then the rest.
# window.writing resolves to whether one waited.
SLOW_WRITER = """async ([url, sha256, ms]) => {
  const root = await navigator.storage.getDirectory();
  const dir = await root.getDirectoryHandle("pyspec-weights", { create: true });
  const bytes = new Uint8Array(await (await fetch(url)).arrayBuffer());
  let taken;
  const lockTaken = new Promise((resolve) => { taken = resolve; });
  const key = `pyspec-weights/${sha256}.gguf`;
  window.writing = navigator.locks.request(key, async () => {
    taken();
    const tmp = await dir.getFileHandle(`${sha256}.part`, { create: true });
    const w = await tmp.createWritable();
    await w.write(bytes.subarray(0, bytes.length >> 1));
    let waited = false;
    for (const t0 = performance.now(); !waited && performance.now() - t0 < ms;) {
      await new Promise((r) => setTimeout(r, 100));
      waited = (await navigator.locks.query()).pending.some((l) => l.name === key);
    }
    await w.write(bytes.subarray(bytes.length >> 1));
    await w.close();
    await tmp.move(`${sha256}.gguf`);
    return waited;
  });
  await lockTaken;
}"""

CLEAR = """async (prefix) => {
  const root = await navigator.storage.getDirectory();
  const dir = await root.getDirectoryHandle("pyspec-weights", { create: true });
  for await (const name of dir.keys()) {
    if (name.startsWith(prefix)) await dir.removeEntry(name);
  }
}"""


def artifact(site_root, model: str) -> dict:
    manifest = json.loads((site_root / "manifest.json").read_text())
    return next(a for a in manifest["artifacts"] if a.get("model") == model)


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
def test_streamed_weights_decode_the_native_tokens(page, site_root, split, need):
    """The tiny model streamed to WebGPU (SwiftShader), whole or with its embedding in row parts
    (a binding limit between its largest layer buffer and its embedding): the tokens equal the
    native CPU engine's, and the wasm heap grew by less than the file plus a margin."""
    path = site_root / "models" / "tiny.gguf"
    card = info.card(str(path))
    limits = {"maxStorageBufferBindingSize": card["gpu_buffer"]["bytes"]} if split else None
    out = page.evaluate(STREAMED, ["tiny", limits, MESSAGES, N])
    ready = out["info"]
    if ready["adapter"] == "cpu-numpy":
        need("browser", f"Chromium gave no WebGPU adapter: {ready.get('fallback')}")
    native = native_generate(str(path), MESSAGES, "none", max_tokens=N)
    assert out["tokens"] == native.tokens
    assert ready["weight_bytes"] > 0 and out["memory"]["gpu_bytes"] > 0
    heap = ready["wasm_bytes"]
    print(f"tiny ({card['bytes']} bytes, largest tensor {card['largest_tensor']['bytes']}) "
          f"split={split}: wasm heap {heap['before_weights']} -> {heap['after_load']}")
    # The heap grows in steps of pages, and the load builds the tokenizer and the plans too:
    # the bound is the margin (16 MiB) the module docstring of web/stream.js states.
    assert heap["after_load"] - heap["before_weights"] <= 16 << 20


def test_a_sha256_mismatch_is_named_and_leaves_nothing_in_opfs(page, site_root):
    a = artifact(site_root, "tiny")
    wrong = "0" * 64
    out = page.evaluate(MISMATCH, [a["url"], wrong])
    assert out["error"]["code"] == "corrupt_download", out
    assert a["sha256"] in out["error"]["message"] and wrong in out["error"]["message"]
    assert not [n for n in out["names"] if n.startswith(wrong)], out["names"]
    assert not [n for n in out["names"] if n.endswith(".part")], out["names"]


def test_two_pages_opening_one_file_write_it_once(ctx, page, site_root):
    """Two pages of one browser context open the same uncached model by URL at once: the file's
    lock lets one download it and the other wait and reuse it; both decode the native tokens;
    OPFS then holds the file once, whole, and no temporary file."""
    a = artifact(site_root, "tiny-deep")
    page.evaluate(CLEAR, a["sha256"])
    other = ctx.page("embed-example.html?model=none-such")
    try:
        other.wait_for_function("() => window.embed && (embed.decoder || embed.error)")
        args = [a["url"], a["sha256"], MESSAGES, 8]
        page.evaluate("(args) => { window.opening = (%s)(args); }" % OPEN, args)
        theirs = other.evaluate(OPEN, args)
        ours = page.evaluate("() => window.opening")
    finally:
        other.close()
    native = native_generate(str(site_root / "models" / "tiny-deep.gguf"), MESSAGES, "none",
                             max_tokens=8)
    assert ours["tokens"] == theirs["tokens"] == native.tokens
    downloads = sorted(w["downloaded"] for w in (ours["weights"], theirs["weights"]))
    assert downloads == [0, a["size"]], (ours["weights"], theirs["weights"])
    assert [w["cached"] for w in (ours["weights"], theirs["weights"])].count(True) == 1
    names = page.evaluate("async () => {%s return opfsNames(); }" % PRELUDE)
    assert names.count(f"{a['sha256']}.gguf") == 1
    assert not [n for n in names if n.endswith(".part")], names


def test_a_page_waits_for_the_file_another_page_is_writing(ctx, page, site_root):
    """While one page holds the file's lock with its download half-written, a second page that
    opens the same model waits for the lock, then reuses the whole file: it downloads nothing
    and decodes the native tokens; no temporary file remains."""
    a = artifact(site_root, "tiny-deep")
    page.evaluate(CLEAR, a["sha256"])
    page.evaluate(SLOW_WRITER, [a["url"], a["sha256"], 60000])
    other = ctx.page("embed-example.html?model=none-such")
    try:
        other.wait_for_function("() => window.embed && (embed.decoder || embed.error)")
        theirs = other.evaluate(OPEN, [a["url"], a["sha256"], MESSAGES, 8])
    finally:
        other.close()
    assert page.evaluate("() => window.writing")   # the other page waited for the lock
    assert theirs["weights"] == {"downloaded": 0, "cached": True, "corrupt": 0}
    native = native_generate(str(site_root / "models" / "tiny-deep.gguf"), MESSAGES, "none",
                             max_tokens=8)
    assert theirs["tokens"] == native.tokens
    names = page.evaluate("async () => {%s return opfsNames(); }" % PRELUDE)
    assert names.count(f"{a['sha256']}.gguf") == 1
    assert not [n for n in names if n.endswith(".part")], names
