// What the thin matrix products (matmul.wgsl for CPU adapters and dense weights,
// matmul_coalesced.wgsl for quantized weights on a GPU) share: their Params and bindings, the
// x tiles as a thread loads them (with RMSNorm folded in), and the stores through the epilogues.
// The includer declares no binding of its own; it sums each (output, row) in an order that
// depends on the weight's shape and the device only (batch invariance) and stores it here.
//
// W is (n_out, n_in), row-major, quantized in units of 32 along n_in (blocks.wgsl), or
//   f32:  one u32 (f32 bits) per element, read a vec4 at a time; n_in a multiple of 4;
//   bf16: two elements per u32 (the low half first), read 4 at a time; n_in a multiple of 4.
// A thread group owns MATMUL_OUTS = 4 consecutive outputs (the `lanes` threads from
// first_output's); rows go in tiles of 4: a tile's sums are a mat4x4 (column o = output j0 + o,
// component k = row r0 + k), named so that it stays in registers. x rows past step.rows are not
// loaded (they read as 0 and are never stored).
// Epilogues: outputs are stored in adjacent pairs (2i, 2i + 1), which one thread always holds.
//   EPILOGUE_ROPE (the Q and K products): each pair is rotated by the angle of position
//     step.pos + r (llama.cpp NORM mode, model.Model.rope) before it is stored; in a tree's pass
//     (FLAG_TREE) step.pos + the row's depth, while its K and V still go to cache row step.pos + r.
//   EPILOGUE_SILU_GATE (gate and up as one product): W is weights.Weight.upload_pair's
//     interleave of the gate and up rows, so the pair is (g_i, u_i) and
//     y[r, i] = silu(g_i) * u_i; y has n_out / 2 columns.
//   EPILOGUE_GELU_GATE: the same with Gemma's GELU (tanh form, as llama.cpp's ggml_gelu):
//     y[r, i] = gelu_tanh(g_i) * u_i.
//   With params.bias (Qwen2's Q, K and V biases) bias[j] is added to output j before any of these.
// Either is the f32 arithmetic a separate pass over the stored values would do, without the pass.
// RMSNorm folded in (params.norm = 1): y = W (x * g) / sqrt(mean(x^2) + eps) per row, where g is
// the norm's weight, multiplied into each x chunk as it is loaded. The sum of x^2 comes from the
// same loads: each thread sums the squares of the chunks it reads (take_x), in order; the
// includer adds the threads' sums in a fixed order, like the products. Row-local and in a fixed
// order, so batch-invariant. x is the residual stream itself.
// Q, K and V as one product (params.nq > 0): W is weights.Weight.upload_stack's rows of Q, then K,
// then V; outputs j < nq go to y (row r), the next nk to the K cache `k_out` and the rest to the
// V cache `v_out` (row step.pos + r of each); with EPILOGUE_ROPE the Q and K pairs are rotated.
// V's rows may be in another format (params.v_kind, from word params.v_at of W): an output group
// never straddles the K/V boundary (nq + nk is whole heads, a multiple of 4).

//!include step.wgsl
//!include tree.wgsl

struct Params {
    n_out: u32,       // outputs (rows of W)
    n_in: u32,        // inputs (columns of W): a multiple of 32 (256: K-quants) or of 4 (f32, bf16)
    lanes: u32,       // threads sharing one output group's dot products: 1, 2, 4, ... 64 (WG)
    out_at_pos: u32,  // 1: pass row r goes to row step.pos + r of y (a KV cache); 0: to row r
    accumulate: u32,  // 1: y += W x (the residual add); 0: y = W x
    y_rows: u32,      // rows y holds (ROWS_MAX, or max_ctx for a KV cache); later rows are skipped
    epilogue: u32,    // EPILOGUE_NONE, EPILOGUE_ROPE or EPILOGUE_SILU_GATE (see above)
    head_dim: u32,    // rope: outputs per head (even)
    rope_rows: u32,   // rope: positions the table holds
    nq: u32,          // Q, K, V as one product: outputs to y (0: every output goes to y)
    nk: u32,          // ... outputs to k_out; the other n_out - nq - nk to v_out
    kv_rows: u32,     // ... rows k_out and v_out hold (max_ctx)
    norm: u32,        // 1: RMSNorm folded in (see above)
    eps: f32,         // norm: the epsilon
    v_kind: u32,      // Q, K, V as one product whose V rows are in another format: its KIND_*
    v_at: u32,        // ... and the word of W where they start (quantized_v); else NONE, 0
    bias: u32,        // 1: bias[j] added to output j (see above)
    y_stride: u32,    // f32 from one row of y to the next: its columns, or more for a part of
                      // a head split by rows (weights.upload_rows) into its columns of the logits
}

const EPILOGUE_ROPE: u32 = 1u;       // ops.matmul's epilogue codes
const EPILOGUE_SILU_GATE: u32 = 2u;
const EPILOGUE_GELU_GATE: u32 = 3u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> w: array<u32>;       // (n_out, row words) blocks.wgsl
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>; // (ROWS_MAX, n_in/4)
@group(0) @binding(4) var<storage, read_write> y: array<f32>; // (y_rows, n_out)
@group(0) @binding(5) var<storage, read> table: array<vec2<f32>>;  // (rope_rows, head_dim/2) cos, sin
@group(0) @binding(6) var<storage, read_write> k_out: array<f32>;   // (kv_rows, nk) the K cache
@group(0) @binding(7) var<storage, read_write> v_out: array<f32>;   // (kv_rows, n_out-nq-nk) V
@group(0) @binding(8) var<storage, read> g_norm: array<vec4<f32>>;  // (n_in/4,) the norm weight
@group(0) @binding(9) var<storage, read> bias: array<f32>;          // (n_out,) params.bias

// The first of this thread's outputs (may be >= n_out in the last workgroup). Workgroups are
// flattened over (x, y) because the head has more than 65535 of them.
fn first_output(t: u32, wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return ((wid.x + wid.y * nwg.x) * (WG / params.lanes) + t / params.lanes) * MATMUL_OUTS;
}

// Output j0 + o clamped into W: outputs past n_out compute on the last row and are not stored.
fn clamped(j0: u32, o: u32) -> u32 {
    return min(j0 + o, params.n_out - 1u);
}

// The tile's x at vec4 index c of rows r0..r0+3 (row stride rs), column k = row r0 + k; rows
// >= step.rows are left 0 (not loaded). r0 + 3 < ROWS_MAX, so every index is inside x.
fn x_tile(c: u32, r0: u32, rows: u32, rs: u32) -> mat4x4<f32> {
    var t = mat4x4<f32>();
    t[0] = x[c];
    if (r0 + 1u < rows) {
        t[1] = x[c + rs];
    }
    if (r0 + 2u < rows) {
        t[2] = x[c + 2u * rs];
    }
    if (r0 + 3u < rows) {
        t[3] = x[c + 3u * rs];
    }
    return t;
}

// A thread's sums over a row tile: acc (column o = output j0 + o, component k = row r0 + k) and,
// with the folded norm, sq (column k = row r0 + k: its squares, componentwise).
struct Tile {
    acc: mat4x4<f32>,
    sq: mat4x4<f32>,
}

// The x tile at vec4 column c as the product takes it: its squares into t.sq and x * g with the
// folded norm (a uniform branch), x as it is without.
fn take_x(t: ptr<function, Tile>, c: u32, r0: u32, rows: u32, rs: u32) -> mat4x4<f32> {
    let xt = x_tile(c, r0, rows, rs);
    if (params.norm == 0u) {
        return xt;
    }
    (*t).sq = mat4x4<f32>((*t).sq[0] + xt[0] * xt[0], (*t).sq[1] + xt[1] * xt[1],
                          (*t).sq[2] + xt[2] * xt[2], (*t).sq[3] + xt[3] * xt[3]);
    let g = g_norm[c % rs];
    return mat4x4<f32>(xt[0] * g, xt[1] * g, xt[2] * g, xt[3] * g);
}

// The folded norm's scale of a row from its sum of squares.
fn inv_rms(ss: f32) -> f32 {
    return 1.0 / sqrt(ss / f32(params.n_in) + params.eps);
}

// Row r of column j of y (y_cols columns, rows y_stride apart) gets s, if y holds that row.
fn store(j: u32, r: u32, s: f32, y_cols: u32) {
    let row = select(0u, step.pos, params.out_at_pos != 0u) + r;
    if (j >= y_cols || row >= params.y_rows) {
        return;
    }
    let at = row * params.y_stride + j;
    if (params.accumulate != 0u) {
        y[at] = y[at] + s;
    } else {
        y[at] = s;
    }
}

// Q, K, V as one product: K or V columns j, j + 1 of cache row step.pos + r.
fn store_kv(j: u32, r: u32, a: f32, b: f32) {
    let row = step.pos + r;
    if (row >= params.kv_rows || j >= params.n_out) {
        return;
    }
    let k_end = params.nq + params.nk;
    if (j < k_end) {
        let at = row * params.nk + j - params.nq;
        k_out[at] = a;
        k_out[at + 1u] = b;
    } else {
        let nv = params.n_out - k_end;
        let at = row * nv + j - k_end;
        v_out[at] = a;
        v_out[at + 1u] = b;
    }
}

// tanh(z) from one exp of a non-positive argument: finite for every z (a backend's tanh may
// overflow inside for large |z|).
fn tanh_finite(z: f32) -> f32 {
    let e = exp(-2.0 * abs(z));
    return sign(z) * ((1.0 - e) / (1.0 + e));
}

// GELU, tanh form: 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))).
fn gelu_tanh(g: f32) -> f32 {
    return 0.5 * g * (1.0 + tanh_finite(0.7978845608028654 * (g + 0.044715 * g * g * g)));
}

// Row r of outputs j and j + 1 (j even), through the epilogue.
fn store_pair(j: u32, r: u32, s0: f32, s1: f32) {
    var a = s0;
    var b = s1;
    if (params.bias != 0u) {
        a += bias[min(j, params.n_out - 1u)];
        b += bias[min(j + 1u, params.n_out - 1u)];
    }
    if (params.epilogue == EPILOGUE_SILU_GATE) {
        store(j / 2u, r, a / (1.0 + exp(-a)) * b, params.n_out / 2u);
        return;
    }
    if (params.epilogue == EPILOGUE_GELU_GATE) {
        store(j / 2u, r, gelu_tanh(a) * b, params.n_out / 2u);
        return;
    }
    let qkv = params.nq != 0u;
    if (params.epilogue == EPILOGUE_ROPE && (!qkv || j < params.nq + params.nk)) {
        let half = params.head_dim / 2u;
        let cs = table[min(row_position(r), params.rope_rows - 1u) * half + (j % params.head_dim) / 2u];
        let a0 = a;
        a = a0 * cs.x - b * cs.y;
        b = a0 * cs.y + b * cs.x;
    }
    if (qkv && j >= params.nq) {
        store_kv(j, r, a, b);
        return;
    }
    let cols = select(params.n_out, params.nq, qkv);
    store(j, r, a, cols);
    store(j + 1u, r, b, cols);
}

// Rows r0..r0+3 (those < rows) of outputs j, j + 1 from column sums u, v.
fn store_tile(j: u32, r0: u32, rows: u32, u: vec4<f32>, v: vec4<f32>) {
    store_pair(j, r0, u.x, v.x);
    if (r0 + 1u < rows) {
        store_pair(j, r0 + 1u, u.y, v.y);
    }
    if (r0 + 2u < rows) {
        store_pair(j, r0 + 2u, u.z, v.z);
    }
    if (r0 + 3u < rows) {
        store_pair(j, r0 + 3u, u.w, v.w);
    }
}

// W's rows of outputs j0..j0+3, clamped into W: outputs past n_out compute on its last row.
fn out_rows(j0: u32) -> vec4<u32> {
    return vec4<u32>(clamped(j0, 0u), clamped(j0, 1u), clamped(j0, 2u), clamped(j0, 3u));
}
