// Dequantization for the CPU engine in the page: pyspec/formats/quant.py's Q4_1 and Q8_0 block formats
// to float32, written straight into a numpy array. worker.js registers this module in Pyodide as
// `pyspec_dequant`; quant.py calls it through `quant.use_kernels` (pyspec/apps/session.py sets it).
//
// Why in JavaScript: numpy in wasm makes four passes over every weight (nibbles, cast, scale,
// offset), 1.9 s for the champion's 135M weights; one JIT-compiled loop is ten times faster.
//
// Bit-identical to quant.py, which follows llama.cpp: `d * q` for Q8_0, `d * q + m` for Q4_1,
// each operation rounded to float32, never fused. A double holds d * q exactly (a float32 times
// an integer below 2^8), so Math.fround gives float32's product; for the sum, rounding a double
// sum to float32 equals float32's own sum (53 >= 2 * 24 + 2 bits: Figueroa, "When is double
// rounding innocuous?", 1995). e2e/test_browser_dequant.py checks every format against quant.py
// bit for bit, with subnormal, infinite and negative-zero scales.

// f16 bits -> its float32 value, for all 65,536 patterns (exact: every f16 is a float32).
const HALF = (() => {
  const t = new Float32Array(65536);
  for (let h = 0; h < 65536; h++) {
    const sign = h & 0x8000 ? -1 : 1, exp = (h >> 10) & 0x1f, frac = h & 0x3ff;
    if (exp === 0) t[h] = sign * frac * 2 ** -24;                 // zero and subnormals
    else if (exp === 31) t[h] = frac ? NaN : sign * Infinity;
    else t[h] = sign * (1024 + frac) * 2 ** (exp - 25);
  }
  return t;
})();

// Q4_1 blocks of 20 bytes (f16 d, f16 m, 16 bytes of nibbles) -> 32 floats each: element j is
// the low nibble of byte j, element j + 16 its high nibble. `raw` and `out` are PyProxies of a
// uint8 and a float32 numpy array (C order), out.size == 32 * raw.size / 20.
export function q4_1(raw, out) {
  const rv = raw.getBuffer("u8"), ov = out.getBuffer("f32");
  try {
    const src = rv.data, dst = ov.data, n = src.length / 20;
    for (let b = 0, s = 0, o = 0; b < n; b++, s += 20, o += 32) {
      const d = HALF[src[s] | (src[s + 1] << 8)], m = HALF[src[s + 2] | (src[s + 3] << 8)];
      for (let j = 0; j < 16; j++) {
        const q = src[s + 4 + j];
        dst[o + j] = Math.fround(d * (q & 15)) + m;        // the Float32Array store rounds the sum
        dst[o + j + 16] = Math.fround(d * (q >> 4)) + m;
      }
    }
  } finally { rv.release(); ov.release(); }
}

// Q8_0 blocks of 34 bytes (f16 d, 32 int8) -> 32 floats each: d * q.
export function q8_0(raw, out) {
  const rv = raw.getBuffer("u8"), ov = out.getBuffer("f32");
  try {
    const src = rv.data, dst = ov.data, n = src.length / 34;
    for (let b = 0, s = 0, o = 0; b < n; b++, s += 34, o += 32) {
      const d = HALF[src[s] | (src[s + 1] << 8)];
      for (let j = 0; j < 32; j++) dst[o + j] = d * ((src[s + 2 + j] << 24) >> 24);
    }
  } finally { rv.release(); ov.release(); }
}
