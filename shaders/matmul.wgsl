// Thin matrix products y = W x over 1..ROWS_MAX rows, with Q4_1, Q8_0 or f32 weights (DESIGN §7).
//
// W is (n_out, n_in), row-major, in blocks of 32 along n_in (llama.cpp ggml-common.h layouts):
//   Q4_1: 5 u32 per block: f16 d | f16 m, then 16 bytes of nibbles; value i < 16 is the low
//         nibble of byte i, value i >= 16 the high nibble of byte i - 16; w = d * q + m.
//   Q8_0: repacked at upload (ops.Weight) from 34 to 36 bytes so that it is u32-aligned:
//         9 u32 per block: f16 d | 0, then 32 int8 (value i is byte i); w = d * q.
//   f32:  one u32 (f32 bits) per element, read a vec4 at a time; n_in a multiple of 4.
// Work split: a workgroup of 64 threads computes 64 / lanes outputs. The `lanes` threads of
// output j take the blocks lane, lane + lanes, ... of row j, dequantize each block once and FMA it
// into one accumulator per row (up to 16), so a pass reads the weights once for all of its rows.
// Then one workgroup barrier, and lane l sums the lanes' partials of rows l, l + lanes, ... in lane
// order. Batch invariance: `lanes` depends on n_in only; each row's accumulator sees the same
// blocks in the same order through the same instructions whatever step.rows is; rows never mix.

//!include step.wgsl

struct Params {
    n_out: u32,       // outputs (rows of W)
    n_in: u32,        // inputs (columns of W): a multiple of 32 (Q4_1, Q8_0) or of 4 (f32)
    lanes: u32,       // threads sharing one output's dot product: 1, 2, 4, 8 or 16
    out_at_pos: u32,  // 1: pass row r goes to row step.pos + r of y (a KV cache); 0: to row r
    accumulate: u32,  // 1: y += W x (the residual add); 0: y = W x
    y_rows: u32,      // rows y holds (ROWS_MAX, or max_ctx for a KV cache); later rows are skipped
}

const WG: u32 = 64u;
const ROWS_MAX: u32 = 16u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> w: array<u32>;       // (n_out, n_in/32, 5|9)|(n_out, n_in)
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>; // (ROWS_MAX, n_in/4)
@group(0) @binding(4) var<storage, read_write> y: array<f32>; // (y_rows, n_out)

var<workgroup> part: array<f32, 1024>;  // (WG, ROWS_MAX) per-thread partial sums
var<private> acc: array<f32, 16>;       // (ROWS_MAX,) this thread's partial sum of each row

// The output this thread works on (may be >= n_out in the last workgroup: it then only joins the
// barrier). Workgroups are flattened over (x, y) because the head has more than 65535 of them.
fn output_of(t: u32, wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return (wid.x + wid.y * nwg.x) * (WG / params.lanes) + t / params.lanes;
}

// One block of 32 weights (a0..a7, in k order) against row r's 32 inputs at vec4 index xb, summed
// in a fixed order: the same expression for every row of every pass.
fn block_dot(a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>, a4: vec4<f32>,
             a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32>, xb: u32) -> f32 {
    var s = dot(a0, x[xb]);
    s += dot(a1, x[xb + 1u]);
    s += dot(a2, x[xb + 2u]);
    s += dot(a3, x[xb + 3u]);
    s += dot(a4, x[xb + 4u]);
    s += dot(a5, x[xb + 5u]);
    s += dot(a6, x[xb + 6u]);
    s += dot(a7, x[xb + 7u]);
    return s;
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

// Sum the lanes' partials in lane order and store row r of output j for r < rows.
fn reduce_store(t: u32, j: u32, rows: u32) {
    for (var r = 0u; r < rows; r++) {
        part[t * ROWS_MAX + r] = acc[r];
    }
    workgroupBarrier();
    if (j >= params.n_out) {
        return;
    }
    let lanes = params.lanes;
    let first = t - t % lanes;  // lane 0 of output j
    let base = select(0u, step.pos, params.out_at_pos != 0u);
    for (var r = t % lanes; r < rows; r += lanes) {
        if (base + r >= params.y_rows) {
            break;
        }
        var s = part[first * ROWS_MAX + r];
        for (var l = 1u; l < lanes; l++) {
            s += part[(first + l) * ROWS_MAX + r];
        }
        let at = (base + r) * params.n_out + j;
        if (params.accumulate != 0u) {
            y[at] = y[at] + s;
        } else {
            y[at] = s;
        }
    }
}

@compute @workgroup_size(64)
fn matmul_q4_1(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let rows = min(step.rows, ROWS_MAX);
    let j = output_of(t, wid, nwg);
    let nb = params.n_in / 32u;
    let row_stride = params.n_in / 4u;
    if (j < params.n_out) {
        for (var b = t % params.lanes; b < nb; b += params.lanes) {
            let at = (j * nb + b) * 5u;
            let dm = unpack2x16float(w[at]);  // (d, m)
            let q0 = w[at + 1u];
            let q1 = w[at + 2u];
            let q2 = w[at + 3u];
            let q3 = w[at + 4u];
            let a0 = dm.x * nibbles(q0, 0u) + dm.y;
            let a1 = dm.x * nibbles(q1, 0u) + dm.y;
            let a2 = dm.x * nibbles(q2, 0u) + dm.y;
            let a3 = dm.x * nibbles(q3, 0u) + dm.y;
            let a4 = dm.x * nibbles(q0, 4u) + dm.y;
            let a5 = dm.x * nibbles(q1, 4u) + dm.y;
            let a6 = dm.x * nibbles(q2, 4u) + dm.y;
            let a7 = dm.x * nibbles(q3, 4u) + dm.y;
            for (var r = 0u; r < rows; r++) {
                acc[r] += block_dot(a0, a1, a2, a3, a4, a5, a6, a7, r * row_stride + b * 8u);
            }
        }
    }
    reduce_store(t, j, rows);
}

@compute @workgroup_size(64)
fn matmul_q8_0(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let rows = min(step.rows, ROWS_MAX);
    let j = output_of(t, wid, nwg);
    let nb = params.n_in / 32u;
    let row_stride = params.n_in / 4u;
    if (j < params.n_out) {
        for (var b = t % params.lanes; b < nb; b += params.lanes) {
            let at = (j * nb + b) * 9u;
            let d = unpack2x16float(w[at]).x;
            let a0 = d * int8s(w[at + 1u]);
            let a1 = d * int8s(w[at + 2u]);
            let a2 = d * int8s(w[at + 3u]);
            let a3 = d * int8s(w[at + 4u]);
            let a4 = d * int8s(w[at + 5u]);
            let a5 = d * int8s(w[at + 6u]);
            let a6 = d * int8s(w[at + 7u]);
            let a7 = d * int8s(w[at + 8u]);
            for (var r = 0u; r < rows; r++) {
                acc[r] += block_dot(a0, a1, a2, a3, a4, a5, a6, a7, r * row_stride + b * 8u);
            }
        }
    }
    reduce_store(t, j, rows);
}

@compute @workgroup_size(64)
fn matmul_f32(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let rows = min(step.rows, ROWS_MAX);
    let j = output_of(t, wid, nwg);
    let n4 = params.n_in / 4u;
    if (j < params.n_out) {
        for (var c = t % params.lanes; c < n4; c += params.lanes) {
            let at = j * params.n_in + c * 4u;
            let a = bitcast<vec4<f32>>(vec4<u32>(w[at], w[at + 1u], w[at + 2u], w[at + 3u]));
            for (var r = 0u; r < rows; r++) {
                acc[r] += dot(a, x[r * n4 + c]);
            }
        }
    }
    reduce_store(t, j, rows);
}
