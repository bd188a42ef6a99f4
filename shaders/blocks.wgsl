// Quantized weights as blocks of 32 values, for the products (matmul.wgsl) and the embedding
// (embed.wgsl): the includer declares the weights as `w: array<u32>`, (n_out, n_in) row-major.
//
// GPU layouts (weights.Weight.host_bytes; the formats are llama.cpp's ggml-common.h, documented in
// pyspec/formats/quant.py and kquant.py). Each row is n_in / 32 units of 32 values, unit b:
//   Q4_1: 5 u32 per unit: f16 d | f16 m, then 16 bytes of nibbles; value i < 16 is the low
//         nibble of byte i, value i >= 16 the high nibble of byte i - 16; w = d * q + m.
//   Q8_0: repacked at upload from 34 to 36 bytes so that it is u32-aligned:
//         9 u32 per unit: f16 d | 0, then 32 int8 (value i is byte i); w = d * q.
//   Q4_0: repacked from 18 to 20 bytes: 5 u32: f16 d | 0, then Q4_1's nibbles; w = d * (q - 8).
//   Q5_0: repacked from 22 to 24 bytes: 6 u32: f16 d | 0, qh, 4 u32 of nibbles as Q4_1's;
//         bit i of qh is the fifth bit of value i; w = d * (q - 16).
//   Q5_1: 6 u32 as stored: f16 d | f16 m, qh, nibbles; w = d * q + m.
//   K-quants: unit b is sub-block b % 8 of super-block b / 8 (256 values):
//   Q4_K: 36 u32 per super-block as stored: f16 d | f16 dmin, 3 u32 of 6-bit scales and mins,
//         32 u32 of nibbles; w = (d sc) q - (dmin m).
//   Q5_K: 44 u32 as stored: Q4_K's head, 8 u32 qh, 32 u32 of nibbles.
//   Q6_K: repacked from 210 to 212 bytes: 53 u32: 32 ql, 16 qh, 4 u32 of int8 scales,
//         f16 d | 0; two scales per unit (values 0-15, 16-31); w = (d sc) (q - 32).
// load_block reads a unit of any of them into one Block; the new formats unpack their values to
// one byte each there (q0, q1: byte c of word k is value 4k + c) and keep (scale, offset) in s.

// The kinds are KIND_Q4_1, KIND_Q8_0, ... (constants.BLOCK_KINDS).

// One unit of 32 weights: Q4_1 s = (d, m), q0 = the 4 nibble words; Q8_0 s = (d, 0),
// q0, q1 = the 8 int8 words; the others s as above and q0, q1 their values, one per byte.
struct Block {
    s: vec2<f32>,
    q0: vec4<u32>,
    q1: vec4<u32>,
}

// Byte k of the words from w[at] on.
fn byte_at(at: u32, k: u32) -> u32 {
    return (w[at + k / 4u] >> (8u * (k % 4u))) & 255u;
}

// Bits 0..3 of v, one per byte (bit c to byte c).
fn spread4(v: u32) -> u32 {
    return (v & 1u) | ((v & 2u) << 7u) | ((v & 4u) << 14u) | ((v & 8u) << 21u);
}

// Q4_0 / Q5_0 / Q5_1: nibbles at w[at..at + 4) and, with `fifth`, qh at w[at - 1]: the 32
// values, one per byte.
fn small_values(at: u32, fifth: bool) -> Block {
    let qh = select(0u, w[at - 1u], fifth);
    var q: array<u32, 8>;
    for (var k = 0u; k < 8u; k++) {
        let low = (w[at + k % 4u] >> (k / 4u * 4u)) & 0x0F0F0F0Fu;
        q[k] = low | (spread4(qh >> (4u * k)) << 4u);
    }
    return Block(vec2<f32>(), vec4<u32>(q[0], q[1], q[2], q[3]), vec4<u32>(q[4], q[5], q[6], q[7]));
}

// Q4_K / Q5_K: (d sc, dmin m) of sub-block s from the head at w[at] (get_scale_min_k4).
fn k_scales(at: u32, s: u32) -> vec2<f32> {
    let dm = unpack2x16float(w[at]);
    let sc_at = at + 1u;
    var sc: u32;
    var m: u32;
    if (s < 4u) {
        sc = byte_at(sc_at, s) & 63u;
        m = byte_at(sc_at, s + 4u) & 63u;
    } else {
        sc = (byte_at(sc_at, s + 4u) & 15u) | ((byte_at(sc_at, s - 4u) >> 6u) << 4u);
        m = (byte_at(sc_at, s + 4u) >> 4u) | ((byte_at(sc_at, s) >> 6u) << 4u);
    }
    return vec2<f32>(dm.x * f32(sc), dm.y * f32(m));
}

// Q4_K / Q5_K / Q6_K unit b of row j (rows from word `base`): its values, one per byte, and s.
fn k_block(kind: u32, base: u32, j: u32, b: u32, nb: u32) -> Block {
    let s = b % 8u;
    var q: array<u32, 8>;
    var sv: vec2<f32>;
    if (kind == KIND_Q6_K) {
        let at = base + (j * (nb / 8u) + b / 8u) * 53u;
        let h = s / 4u;
        let g = s % 4u;
        let ql = at + 16u * h + 8u * (g % 2u);
        let qh = at + 32u + 8u * h;
        for (var k = 0u; k < 8u; k++) {
            q[k] = ((w[ql + k] >> (4u * (g / 2u))) & 0x0F0F0F0Fu)
                 | (((w[qh + k] >> (2u * g)) & 0x03030303u) << 4u);
        }
        let d = unpack2x16float(w[at + 52u]).x;
        let sc = 8u * h + 2u * g;   // int8 scales at byte 192 (word 48)
        sv = vec2<f32>(d * f32(bitcast<i32>(byte_at(at + 48u, sc) << 24u) >> 24u),
                       d * f32(bitcast<i32>(byte_at(at + 48u, sc + 1u) << 24u) >> 24u));
    } else {
        let words = select(36u, 44u, kind == KIND_Q5_K);
        let at = base + (j * (nb / 8u) + b / 8u) * words;
        let qs = at + select(4u, 12u, kind == KIND_Q5_K) + 8u * (s / 2u);
        for (var k = 0u; k < 8u; k++) {
            q[k] = (w[qs + k] >> (4u * (s % 2u))) & 0x0F0F0F0Fu;
            if (kind == KIND_Q5_K) {
                q[k] |= ((w[at + 4u + k] >> s) & 0x01010101u) << 4u;
            }
        }
        sv = k_scales(at, s);
    }
    return Block(sv, vec4<u32>(q[0], q[1], q[2], q[3]), vec4<u32>(q[4], q[5], q[6], q[7]));
}

// Unit b of row j of rows starting at word `base` (0 but for the V rows of a mixed Q, K, V
// product: matmul.wgsl), nb units per row.
fn load_block(kind: u32, base: u32, j: u32, b: u32, nb: u32) -> Block {
    if (kind == KIND_Q4_1) {
        let at = base + (j * nb + b) * 5u;
        return Block(unpack2x16float(w[at]), vec4<u32>(w[at + 1u], w[at + 2u], w[at + 3u],
                     w[at + 4u]), vec4<u32>());
    }
    if (kind == KIND_Q8_0) {
        let at = base + (j * nb + b) * 9u;
        return Block(unpack2x16float(w[at]),
                     vec4<u32>(w[at + 1u], w[at + 2u], w[at + 3u], w[at + 4u]),
                     vec4<u32>(w[at + 5u], w[at + 6u], w[at + 7u], w[at + 8u]));
    }
    if (kind == KIND_Q4_0) {
        let at = base + (j * nb + b) * 5u;
        var blk = small_values(at + 1u, false);
        blk.s = unpack2x16float(w[at]);
        return blk;
    }
    if (kind == KIND_Q5_0 || kind == KIND_Q5_1) {
        let at = base + (j * nb + b) * 6u;
        var blk = small_values(at + 2u, true);
        blk.s = unpack2x16float(w[at]);
        return blk;
    }
    return k_block(kind, base, j, b, nb);
}

// Bytes 0..3 of q, low nibbles (shift 0) or high nibbles (shift 4), as f32.
fn nibbles(q: u32, shift: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(q) >> (vec4<u32>(0u, 8u, 16u, 24u) + shift)) & vec4<u32>(15u));
}

// Bytes 0..3 of q as signed int8, as f32.
fn int8s(q: u32) -> vec4<f32> {
    let s = bitcast<vec4<i32>>(vec4<u32>(q) << vec4<u32>(24u, 16u, 8u, 0u));
    return vec4<f32>(s >> vec4<u32>(24u));
}

// Weights 4i..4i+3 of a unit of the formats with unpacked values, as p + o: p the scaled values
// and o the offset, so that embed.wgsl can round p before it adds o, as the reference does.
// Where there is no offset o is -0.0, which leaves every p as it is (+0.0 would turn -0.0 to +0.0).
struct Affine {
    p: vec4<f32>,
    o: vec4<f32>,
}

fn affine(kind: u32, blk: Block, i: u32) -> Affine {
    let v = vec4<f32>((vec4<u32>(select(blk.q0[i % 4u], blk.q1[i % 4u], i >= 4u))
                       >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(255u));
    let none = vec4<f32>(-0.0);
    if (kind == KIND_Q4_0) {
        return Affine(blk.s.x * (v - 8.0), none);
    }
    if (kind == KIND_Q5_0) {
        return Affine(blk.s.x * (v - 16.0), none);
    }
    if (kind == KIND_Q5_1) {
        return Affine(blk.s.x * v, vec4<f32>(blk.s.y));
    }
    if (kind == KIND_Q6_K) {
        return Affine(select(blk.s.x, blk.s.y, i >= 4u) * (v - 32.0), none);
    }
    return Affine(blk.s.x * v, vec4<f32>(-blk.s.y));   // Q4_K, Q5_K: (d sc) q - (dmin m)
}

// Weights 4i..4i+3 of a unit (i a constant 0..7 once inlined).
fn chunk(kind: u32, blk: Block, i: u32) -> vec4<f32> {
    if (kind == KIND_Q4_1) {
        return blk.s.x * nibbles(blk.q0[i % 4u], i / 4u * 4u) + blk.s.y;
    }
    if (kind == KIND_Q8_0) {
        return blk.s.x * int8s(select(blk.q0[i % 4u], blk.q1[i % 4u], i >= 4u));
    }
    let a = affine(kind, blk, i);
    return a.p + a.o;
}
