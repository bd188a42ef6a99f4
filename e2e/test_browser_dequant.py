"""web/dequant.js, the page's dequantizer, against pyspec/formats/quant.py's numpy bit for bit, in Chromium.

The blocks are the tiny model's own tensors plus random blocks whose scales include the awkward
float16 values (subnormals, negative zero, the largest finite, sums that round). Infinite and
NaN scales are left out: inf * 0 gives a NaN whose sign bit the hardware chooses. The kernels
take PyProxies in the page; here a stand-in gives them the same getBuffer/release interface.
That the page really uses them is shown by every page test whose output equals the native
engines' (test_browser_tiny, test_browser_champion) and by `dequant_kernels` in the ready message.
"""

from __future__ import annotations

import base64

import numpy as np
import pytest

from pyspec.formats import quant
from pyspec.formats.gguf import GGUFFile

pytestmark = pytest.mark.browser

RUN = """async ([kernel, raw64, n]) => {
  const m = await import("./dequant.js");
  const raw = Uint8Array.from(atob(raw64), (c) => c.charCodeAt(0));
  const out = new Float32Array(n);
  const proxy = (data) => ({ getBuffer: () => ({ data, release() {} }) });
  m[kernel](proxy(raw), proxy(out));
  let s = "";
  const bytes = new Uint8Array(out.buffer);
  for (let i = 0; i < bytes.length; i += 8192) {
    s += String.fromCharCode(...bytes.subarray(i, i + 8192));
  }
  return btoa(s);
}"""

AWKWARD = np.array([0x0001, 0x03FF, 0x0400, 0x8000, 0x8001, 0x7BFF, 0xFBFF, 0x3C00, 0x3555,
                    0x1234, 0xB3FF, 0x0200], np.uint16)   # subnormals, -0, +-65504, 1, ...


def random_blocks(fmt: quant.BlockFormat, n: int, rng) -> np.ndarray:
    blocks = rng.integers(0, 256, (n, fmt.block_bytes), dtype=np.uint8)
    finite = rng.integers(0, 0x7BFF, (n, 2), dtype=np.uint16) | (
        rng.integers(0, 2, (n, 2), dtype=np.uint16) << 15)          # any finite f16, either sign
    finite[: len(AWKWARD), 0] = AWKWARD
    finite[len(AWKWARD): 2 * len(AWKWARD), 1] = AWKWARD
    scales = 2 if fmt is quant.Q4_1 else 1   # Q4_1: d and m; Q8_0: d, then int8 values
    blocks[:, :2 * scales] = finite[:, :scales].copy().view(np.uint8)
    return blocks.reshape(-1)


@pytest.fixture(scope="module")
def page(browser, site_url):
    from .pageutil import Context
    c = Context(browser, site_url)
    p = c.page("manifest.json")   # any page of the site's origin: dequant.js is imported there
    yield p
    c.ctx.close()
    assert not c.offsite, f"requests to other origins: {c.offsite}"


def js_dequantize(page, kernel: str, raw: np.ndarray, n: int) -> np.ndarray:
    out = page.evaluate(RUN, [kernel, base64.b64encode(raw.tobytes()).decode(), n])
    return np.frombuffer(base64.b64decode(out), np.float32)


@pytest.mark.parametrize("fmt, kernel", [(quant.Q4_1, "q4_1"), (quant.Q8_0, "q8_0")])
def test_random_blocks_match_numpy_bit_for_bit(page, fmt, kernel):
    raw = random_blocks(fmt, 4096, np.random.default_rng(fmt.type_id))
    want = quant.dequantize(raw, fmt.type_id, (4096 * 32,))
    got = js_dequantize(page, kernel, raw, want.size)
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_the_tiny_models_tensors_match_numpy_bit_for_bit(page, site_root):
    f = GGUFFile.open(site_root / "models" / "tiny.gguf")
    kernels = {quant.Q4_1.type_id: "q4_1", quant.Q8_0.type_id: "q8_0"}
    checked = set()
    for t in f.tensors.values():
        if t.type_id in kernels:
            want = f.dequantize(t.name).reshape(-1)
            got = js_dequantize(page, kernels[t.type_id], f.raw(t.name), want.size)
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), t.name)
            checked.add(t.type_id)
    assert checked == set(kernels), "the tiny model should carry both formats"
