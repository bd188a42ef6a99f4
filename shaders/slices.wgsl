// Quantized weights as slices of 8 values, for matmul_coalesced.wgsl: slice s of a row is two
// vec4 of it, `lo` at x columns slice_col(s)..+3 and `hi` slice_gap columns further. Slices are
// numbered so that slices s, s + 1, ... read consecutive words of the row: the lanes of a GPU
// product that take slices lane, lane + lanes, ... read consecutive u32 of one weight row in each
// step (coalesced), and the per-block scales are the same word for neighbouring lanes (one
// broadcast). The includer declares the weights as `w: array<u32>` (blocks.wgsl's GPU layouts,
// llama.cpp's ggml-common.h formats) and includes blocks.wgsl (nibbles, int8s).
//   32-value units (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): 4 slices per unit; slice i of a unit is its
//     nibble word i (Q8_0: int8 words i and 4 + i): values 4i..4i+3 (lo) and 16+4i.. (hi).
//   Q4_K, Q5_K: 32 slices per super-block; slice t is qs word t: its low nibbles are values
//     64g + 4(t % 8) + c of sub-block 2g (g = t / 8), its high nibbles the values 32 further, of
//     sub-block 2g + 1 (ggml's dequantize_row_q4_K); Q5_K's fifth bits are bits 2g and 2g + 1
//     of qh word t % 8's bytes.
//   Q6_K: 32 slices per super-block; slice t = 16h + i (half h of 128 values) is ql word
//     16h + i: its low nibbles are values 128h + 32(i / 8) + 4(i % 8) + c, its high nibbles the
//     values 64 further; their two high bits are in qh word 8h + i % 8 (shifts 2(i / 8) and
//     2(i / 8) + 4); scales 8h + 2(i / 8) + (i % 8) / 4 and 4 further (dequantize_row_q6_K).
// The value of each weight is the f32 arithmetic of blocks.wgsl's chunk for the same format.

// 8 weights of one row: lo at x columns slice_col.. and hi at slice_col + slice_gap.. .
struct Slice {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// The x column (from the row's start) of slice s's lo.
fn slice_col(kind: u32, s: u32) -> u32 {
    let t = s % 32u;
    if (kind == KIND_Q4_K || kind == KIND_Q5_K) {
        return s / 32u * 256u + t / 8u * 64u + t % 8u * 4u;
    }
    if (kind == KIND_Q6_K) {
        let i = t % 16u;
        return s / 32u * 256u + t / 16u * 128u + i / 8u * 32u + i % 8u * 4u;
    }
    return s / 4u * 32u + s % 4u * 4u;
}

// Columns from a slice's lo to its hi.
fn slice_gap(kind: u32) -> u32 {
    if (kind == KIND_Q4_K || kind == KIND_Q5_K) {
        return 32u;
    }
    if (kind == KIND_Q6_K) {
        return 64u;
    }
    return 16u;
}

// u32 per unit of 32 values (32-value formats) or per super-block of 256 (K-quants).
fn unit_words(kind: u32) -> u32 {
    switch kind {
        case KIND_Q4_1, KIND_Q4_0: { return 5u; }
        case KIND_Q5_0, KIND_Q5_1: { return 6u; }
        case KIND_Q8_0: { return 9u; }
        case KIND_Q4_K: { return 36u; }
        case KIND_Q5_K: { return 44u; }
        default: { return 53u; }   // Q6_K
    }
}

// Bit `shift` of each byte of v, times 16 (a fifth bit), as f32.
fn fifths(v: u32, shift: u32) -> vec4<f32> {
    let bits = (vec4<u32>(v) >> (vec4<u32>(0u, 8u, 16u, 24u) + shift)) & vec4<u32>(1u);
    return vec4<f32>(bits) * 16.0;
}

// Bits first..first+3 of qh, one per value, times 16 (Q5_0 / Q5_1's fifth bits).
fn fifths_qh(qh: u32, first: u32) -> vec4<f32> {
    let bits = (vec4<u32>(qh) >> (vec4<u32>(0u, 1u, 2u, 3u) + first)) & vec4<u32>(1u);
    return vec4<f32>(bits) * 16.0;
}

// 32-value units: slice i (0..3) of the unit at word `at`.
fn small_slice(kind: u32, at: u32, i: u32) -> Slice {
    let dm = unpack2x16float(w[at]);
    if (kind == KIND_Q8_0) {
        return Slice(dm.x * int8s(w[at + 1u + i]), dm.x * int8s(w[at + 5u + i]));
    }
    if (kind == KIND_Q4_1 || kind == KIND_Q4_0) {
        let q = w[at + 1u + i];
        if (kind == KIND_Q4_0) {
            return Slice(dm.x * (nibbles(q, 0u) - 8.0), dm.x * (nibbles(q, 4u) - 8.0));
        }
        return Slice(dm.x * nibbles(q, 0u) + dm.y, dm.x * nibbles(q, 4u) + dm.y);
    }
    let qh = w[at + 1u];   // Q5_0, Q5_1
    let q = w[at + 2u + i];
    let lo = nibbles(q, 0u) + fifths_qh(qh, 4u * i);
    let hi = nibbles(q, 4u) + fifths_qh(qh, 16u + 4u * i);
    if (kind == KIND_Q5_0) {
        return Slice(dm.x * (lo - 16.0), dm.x * (hi - 16.0));
    }
    return Slice(dm.x * lo + dm.y, dm.x * hi + dm.y);
}

// Byte k (0..3) of v.
fn byte_of(v: u32, k: u32) -> u32 {
    return (v >> (8u * k)) & 255u;
}

// Q4_K / Q5_K: (scale, min) of sub-block j (0..7) from the 12 bytes of 6-bit scales and mins
// in words q0 (bytes 0..3), q1 (4..7) and q2 (8..11) (ggml's get_scale_min_k4).
fn scale_min(q0: u32, q1: u32, q2: u32, j: u32) -> vec2<f32> {
    let k = j % 4u;
    if (j < 4u) {
        return vec2<f32>(f32(byte_of(q0, k) & 63u), f32(byte_of(q1, k) & 63u));
    }
    return vec2<f32>(f32((byte_of(q2, k) & 15u) | ((byte_of(q0, k) >> 6u) << 4u)),
                     f32((byte_of(q2, k) >> 4u) | ((byte_of(q1, k) >> 6u) << 4u)));
}

// Q4_K / Q5_K: (d sc, dmin m) of sub-blocks 2g and 2g + 1 of the super-block at word `at`, each
// word of its head read once.
fn k_scale_pair(at: u32, g: u32) -> vec4<f32> {
    let dm = unpack2x16float(w[at]);
    let q0 = w[at + 1u];
    let q1 = w[at + 2u];
    let q2 = w[at + 3u];
    let a = scale_min(q0, q1, q2, 2u * g);
    let b = scale_min(q0, q1, q2, 2u * g + 1u);
    return vec4<f32>(dm.x * a.x, dm.y * a.y, dm.x * b.x, dm.y * b.y);
}

// Q4_K / Q5_K: slice t (0..31) of the super-block at word `at`.
fn k4_slice(kind: u32, at: u32, t: u32) -> Slice {
    let g = t / 8u;
    let sm = k_scale_pair(at, g);
    let q = w[at + select(4u, 12u, kind == KIND_Q5_K) + t];
    var lo = nibbles(q, 0u);
    var hi = nibbles(q, 4u);
    if (kind == KIND_Q5_K) {
        let qh = w[at + 4u + t % 8u];
        lo += fifths(qh, 2u * g);
        hi += fifths(qh, 2u * g + 1u);
    }
    return Slice(sm.x * lo - sm.y, sm.z * hi - sm.w);
}

// Q6_K: slice t = 16h + i of the super-block at word `at` (53 words: 32 ql, 16 qh, 4 of int8
// scales, f16 d | 0).
fn q6_slice(at: u32, t: u32) -> Slice {
    let h = t / 16u;
    let i = t % 16u;
    let ql = w[at + 16u * h + i];
    let qh = w[at + 32u + 8u * h + i % 8u];
    let at_byte = vec4<u32>(0u, 8u, 16u, 24u);
    let sh = at_byte + 2u * (i / 8u);   // the two high bits of the low nibbles' values
    let lo = ((vec4<u32>(ql) >> at_byte) & vec4<u32>(15u))
           | (((vec4<u32>(qh) >> sh) & vec4<u32>(3u)) << vec4<u32>(4u));
    let hi = ((vec4<u32>(ql) >> (at_byte + 4u)) & vec4<u32>(15u))
           | (((vec4<u32>(qh) >> (sh + 4u)) & vec4<u32>(3u)) << vec4<u32>(4u));
    let sc = 8u * h + 2u * (i / 8u) + (i % 8u) / 4u;   // int8 scales at word 48
    let d = unpack2x16float(w[at + 52u]).x;
    let s_lo = d * f32(bitcast<i32>(byte_of(w[at + 48u + sc / 4u], sc % 4u) << 24u) >> 24u);
    let s_hi = d * f32(bitcast<i32>(byte_of(w[at + 49u + sc / 4u], sc % 4u) << 24u) >> 24u);
    return Slice(s_lo * (vec4<f32>(lo) - 32.0), s_hi * (vec4<f32>(hi) - 32.0));
}

// Slice s of row j of rows starting at word `base` (0 but for the V rows of a mixed Q, K, V
// product: matmul_io.wgsl), rows of n_in values.
fn load_slice(kind: u32, base: u32, j: u32, s: u32, n_in: u32) -> Slice {
    let words = unit_words(kind);
    if (kind == KIND_Q4_K || kind == KIND_Q5_K || kind == KIND_Q6_K) {
        let at = base + (j * (n_in / 256u) + s / 32u) * words;
        if (kind == KIND_Q6_K) {
            return q6_slice(at, s % 32u);
        }
        return k4_slice(kind, at, s % 32u);
    }
    return small_slice(kind, base + (j * (n_in / 32u) + s / 4u) * words, s % 4u);
}
