// Counter-based random numbers: the WGSL copy of pyspec/rules/rng.py.
// Every number is a pure function of (seed_lo, seed_hi, position, stream, index); only u32
// operations, so these bits equal rng.hash_u32 / rng.uniform exactly (tests/test_gpu_sampling.py
// checks many keys). Included by sample.wgsl and accept.wgsl with `//!include rng.wgsl`.
// The stream ids (STREAM_*) are rng.py's, in the block every shader gets (pyspec/gpu/constants.py).

const TWO_POW_M24: f32 = 5.9604644775390625e-8;   // 2^-24
const TWO_POW_M25: f32 = 2.98023223876953125e-8;  // 2^-25

// "lowbias32" (C. Wellons, hash-prospector); u32 multiplication wraps mod 2^32 as in rng.py.
fn mix32(x_in: u32) -> u32 {
    var x = x_in;
    x ^= x >> 16u;  x *= 0x7feb352du;
    x ^= x >> 15u;  x *= 0x846ca68bu;
    x ^= x >> 16u;
    return x;
}

fn hash_u32(seed_lo: u32, seed_hi: u32, position: u32, stream: u32, index: u32) -> u32 {
    var h = 0x9e3779b9u;
    h = mix32(h ^ seed_lo);
    h = mix32(h ^ seed_hi);
    h = mix32(h ^ position);
    h = mix32(h ^ stream);
    h = mix32(h ^ index);
    return h;
}

// u = (h >> 8) * 2^-24 in [0, 1 - 2^-24]: exact in f32, equal to rng.uniform. (Not named
// `uniform`: that word is the address space of var<uniform> and may not be redeclared.)
fn rng_uniform(seed_lo: u32, seed_hi: u32, position: u32, stream: u32, index: u32) -> f32 {
    return f32(hash_u32(seed_lo, seed_hi, position, stream, index) >> 8u) * TWO_POW_M24;
}

// Standard Gumbel noise for (position, token id): g = -log(-log(u + 2^-25)), as rng.gumbel.
// u' = u + 2^-25 = (2k + 1) 2^-25 needs 25 bits, one more than f32 holds, and for u' near 1 a
// plain f32 log(u') would lose most digits exactly where the argmax is decided (large g). So
// t = -log(u') is computed from exact f32 quantities: for u' < 1/2 from u' itself (m < 2^24 is
// exact), otherwise from d = 1 - u' (exact, in (0, 1/2]) with -log(1 - d) = 2 atanh(d / (2 - d)),
// a series in s^2 <= 1/9 that reaches f32 precision after 8 terms. |g - rng.gumbel| is about
// 1e-7 (the last log's own error); the test bounds it.
fn gumbel(seed_lo: u32, seed_hi: u32, position: u32, index: u32) -> f32 {
    let k = hash_u32(seed_lo, seed_hi, position, STREAM_GUMBEL, index) >> 8u;  // u = k 2^-24
    let m = 2u * k + 1u;                                                       // u' = m 2^-25
    var t: f32;
    if (m < 0x1000000u) {
        t = -log(f32(m) * TWO_POW_M25);
    } else {
        let d = f32(0x2000000u - m) * TWO_POW_M25;
        let s = d / (2.0 - d);
        let s2 = s * s;
        let series = 1.0 + s2 * (1.0 / 3.0 + s2 * (1.0 / 5.0 + s2 * (1.0 / 7.0 + s2 * (1.0 / 9.0
            + s2 * (1.0 / 11.0 + s2 * (1.0 / 13.0 + s2 * (1.0 / 15.0)))))));
        t = 2.0 * s * series;
    }
    return -log(t);
}
