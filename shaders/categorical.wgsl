// Exact inverse-CDF sampling by one workgroup, shared by sample.wgsl (sample_rows) and
// accept.wgsl (residual / bonus). Included with `//!include categorical.wgsl`; the including
// shader defines `fn cat_weight(i: u32) -> vec4<u32>` (entry i of the row being sampled, as a
// fixed-point number from fixed_from_f32) and runs with @workgroup_size(WG_ROW).
//
// Why integers: verify.sample_categorical_rows takes "the first index whose cumulative sum exceeds
// u * total" with float64 sums of float32 probabilities, which are exact for all practical rows.
// An f32 cumulative sum on the GPU would round by ~1e-7 and pick a neighbouring token every few
// thousand draws. Here every f32 value p >= 2^-57 becomes the integer p * 2^80 exactly (smaller
// ones are truncated), sums are exact 128-bit integer sums (so their order, and the number of
// threads, do not matter), and `cum > u * total` is tested exactly as cum * 2^24 > k * total with
// u = k 2^-24. The result equals the float64 reference whenever its own sums are exact, and a
// zero-probability token is never returned (its cumulative sum equals its predecessor's).
// Limits: entries must lie in [0, 1] (negative, -0, inf and NaN count as 0) and rows hold fewer
// than 2^24 entries, so sums stay below 2^104 and cum * 2^24 below 2^128.

// --- 128-bit unsigned integers as vec4<u32>, x = least significant word ----------------------
fn u128_add(a: vec4<u32>, b: vec4<u32>) -> vec4<u32> {
    let s0 = a.x + b.x;
    let c0 = u32(s0 < a.x);
    let t1 = a.y + b.y;
    let s1 = t1 + c0;
    let c1 = u32(t1 < a.y) + u32(s1 < t1);
    let t2 = a.z + b.z;
    let s2 = t2 + c1;
    let c2 = u32(t2 < a.z) + u32(s2 < t2);
    return vec4<u32>(s0, s1, s2, a.w + b.w + c2);
}

// a - b for a >= b (callers check).
fn u128_sub(a: vec4<u32>, b: vec4<u32>) -> vec4<u32> {
    let b0 = u32(a.x < b.x);
    let t1 = a.y - b.y;
    let b1 = u32(a.y < b.y) + u32(t1 < b0);
    let t2 = a.z - b.z;
    let b2 = u32(a.z < b.z) + u32(t2 < b1);
    return vec4<u32>(a.x - b.x, t1 - b0, t2 - b1, a.w - b.w - b2);
}

fn u128_less(a: vec4<u32>, b: vec4<u32>) -> bool {
    if (a.w != b.w) { return a.w < b.w; }
    if (a.z != b.z) { return a.z < b.z; }
    if (a.y != b.y) { return a.y < b.y; }
    return a.x < b.x;
}

fn u128_is_zero(a: vec4<u32>) -> bool {
    return (a.x | a.y | a.z | a.w) == 0u;
}

// The full 64-bit product of two u32, as (lo, hi).
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);  // < 3 * 2^16: no overflow
    return vec2<u32>((p00 & 0xffffu) | (mid << 16u),
                     a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}

// a * k for a * k < 2^128.
fn u128_mul_u32(a: vec4<u32>, k: u32) -> vec4<u32> {
    let m0 = mul_wide(a.x, k);
    let m1 = mul_wide(a.y, k);
    let m2 = mul_wide(a.z, k);
    var r = vec4<u32>(m0.x, m0.y, 0u, 0u);
    r = u128_add(r, vec4<u32>(0u, m1.x, m1.y, 0u));
    r = u128_add(r, vec4<u32>(0u, 0u, m2.x, m2.y));
    return u128_add(r, vec4<u32>(0u, 0u, 0u, a.w * k));
}

fn u128_shl24(a: vec4<u32>) -> vec4<u32> {
    return vec4<u32>(a.x << 24u, (a.y << 24u) | (a.x >> 8u), (a.z << 24u) | (a.y >> 8u),
                     (a.w << 24u) | (a.z >> 8u));
}

// --- f32 -> fixed point ----------------------------------------------------------------------
// floor(v * 2^80) for v in [0, 2^16); 0 for negative values (and -0), inf and NaN.
fn fixed_from_f32(v: f32) -> vec4<u32> {
    let bits = bitcast<u32>(v);
    let e_bits = (bits >> 23u) & 0xffu;
    if ((bits >> 31u) != 0u || e_bits == 0xffu) {
        return vec4<u32>(0u);
    }
    var m = bits & 0x7fffffu;  // v = m 2^e
    var e = -149;
    if (e_bits != 0u) {
        m |= 0x800000u;
        e = i32(e_bits) - 150;
    }
    let s = e + 80;  // v 2^80 = m 2^s
    if (s < 0) {
        if (s <= -24) { return vec4<u32>(0u); }
        return vec4<u32>(m >> u32(-s), 0u, 0u, 0u);
    }
    let w = u32(s) >> 5u;
    let b = u32(s) & 31u;
    let lo = m << b;
    let hi = select(0u, m >> (32u - b), b != 0u);
    return vec4<u32>(select(0u, lo, w == 0u),
                     select(0u, lo, w == 1u) | select(0u, hi, w == 0u),
                     select(0u, lo, w == 2u) | select(0u, hi, w == 1u),
                     select(0u, lo, w == 3u) | select(0u, hi, w == 2u));
}

// --- the sampler -----------------------------------------------------------------------------
var<workgroup> cat_sums: array<vec4<u32>, WG_ROW>;  // (WG_ROW,) exact sum of each thread's chunk
var<workgroup> cat_result: u32;

// Thread t's exact sum of chunk t of [begin, end) (contiguous chunks of the returned length) into
// cat_sums[t]. Call from uniform control flow (one barrier).
fn cat_chunk_sums(tid: u32, begin: u32, end: u32) -> u32 {
    let chunk = (end - begin + WG_ROW - 1u) / WG_ROW;
    let lo = min(begin + tid * chunk, end);
    let hi = min(lo + chunk, end);
    var s = vec4<u32>(0u);
    for (var i = lo; i < hi; i++) {
        s = u128_add(s, cat_weight(i));
    }
    cat_sums[tid] = s;
    workgroupBarrier();
    return chunk;
}

var<workgroup> cat_total: vec4<u32>;

// The exact sum of the weights of [begin, end), in every thread. Call from uniform control flow
// (three barriers; the last lets a next call overwrite cat_sums).
fn cat_range_total(tid: u32, begin: u32, end: u32) -> vec4<u32> {
    cat_chunk_sums(tid, begin, end);
    if (tid == 0u) {
        var total = vec4<u32>(0u);
        for (var c = 0u; c < WG_ROW; c++) {
            total = u128_add(total, cat_sums[c]);
        }
        cat_total = total;
    }
    workgroupBarrier();
    let total = cat_total;
    workgroupBarrier();
    return total;
}

// One thread, after cat_chunk_sums over [begin, end): the first i there whose cumulative weight,
// counted on from cum0, exceeds the threshold (cum 2^24 > threshold); the last id when none
// does. It finds the chunk where the sum crosses, then scans only that chunk.
fn cat_find(begin: u32, end: u32, chunk: u32, cum0: vec4<u32>, threshold: vec4<u32>) -> u32 {
    var cum = cum0;
    var c = 0u;
    loop {
        let next = u128_add(cum, cat_sums[c]);
        if (u128_less(threshold, u128_shl24(next)) || c + 1u >= WG_ROW) { break; }
        cum = next;
        c++;
    }
    let lo = begin + c * chunk;
    let hi = min(lo + chunk, end);
    var result = hi - 1u;
    for (var i = lo; i < hi; i++) {
        cum = u128_add(cum, cat_weight(i));
        if (u128_less(threshold, u128_shl24(cum))) {
            result = i;
            break;
        }
    }
    return result;
}

// The first i in [0, n) whose cumulative weight exceeds u * total, u = k 2^-24 (k < 2^24): the
// rule of verify.sample_categorical_rows, evaluated exactly, by one workgroup. A row whose weights
// are all 0 gives token 0 (softmax rows never are; the reference raises). Call from uniform
// control flow (two barriers). sample.wgsl's sample_parts + sample_pick give the same token with
// a row spread over many workgroups.
fn cat_sample(tid: u32, n: u32, k: u32) -> u32 {
    let chunk = cat_chunk_sums(tid, 0u, n);
    if (tid == 0u) {
        var total = vec4<u32>(0u);
        for (var c = 0u; c < WG_ROW; c++) {
            total = u128_add(total, cat_sums[c]);
        }
        var result = 0u;
        if (!u128_is_zero(total)) {
            // cum(n - 1) 2^24 = total 2^24 > total k, so the search ends inside the row.
            result = cat_find(0u, n, chunk, vec4<u32>(0u), u128_mul_u32(total, k));
        }
        cat_result = result;
    }
    workgroupBarrier();
    return cat_result;
}
