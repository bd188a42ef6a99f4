// Thin matrix products y = W x over 1..ROWS_MAX rows, with weights in a block format
// (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: blocks.wgsl has their layouts), f32 or bf16.
//
// W is (n_out, n_in), row-major, quantized in units of 32 along n_in (blocks.wgsl), or
//   f32:  one u32 (f32 bits) per element, read a vec4 at a time; n_in a multiple of 4;
//   bf16: two elements per u32 (the low half first), read 4 at a time; n_in a multiple of 4.
//
// Work split: a thread owns MATMUL_OUTS = 4 consecutive outputs and one `lane` of them; the
// `lanes` threads of an output group take the blocks lane, lane + lanes, ... Rows go in tiles of
// 4: a tile's accumulator is a mat4x4 (column o = output j0 + o, component k = row r0 + k), named so
// that it stays in registers (an indexed array becomes memory on CPU adapters). Each x value a
// thread loads serves its 4 outputs, and each weight 4 rows: on CPU adapters (lavapipe,
// SwiftShader) every non-uniform storage load is a per-invocation scalar loop, so loads are
// the cost to cut. x rows past step.rows are not loaded (they read as 0 and are never stored).
// Tiles: workgroup layer z takes tiles z, z + Z, ... of the pass's (Z layers along z). On a GPU
// (ops.matmul) Z = ROWS_MAX / 4, one layer per tile the widest pass can have: layers past the
// pass's rows exit at once, and a pass over 16 rows runs its 4 tiles side by side instead of one
// after the other. On a CPU adapter Z = 1 and a thread loops over the tiles.
// lanes = 1 (CPU adapters): a thread stores its sums directly, no barrier. lanes > 1: the tile's
// partials are parked in `part`, one workgroup barrier, then the lanes' partials of each (output,
// row) are summed in lane order (store_shared). A workgroup parks one tile at a time, so `part`
// is 5 KiB: on the H200 a workgroup array sized for every tile (16 KiB) held fewer workgroups
// per multiprocessor; the head's 1-row Q4_1 product took 27.9 us then, 24.5 us now (19.7 us in
// a variant that served at most 4 rows and had no empty layers: bench/results/README.md,
// h200-kernels-tiles.json, h200-kernels-r4small.json). Batch invariance: `lanes` depends on
// (n_out, n_in, device) only (ops._lanes; lanes past the blocks hold zeros); each row's
// accumulator sees the same blocks in the same order through the same instructions whatever
// step.rows is, whichever tile slot it sits in and whichever layer takes its tile; rows never
// mix; the lanes' sums are taken in lane order.
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
// same loads: each thread sums the squares of the chunks it reads (its blocks, in order); with
// lanes > 1 the lanes' partial sums are then added in lane order, like the products. Row-local
// and in a fixed order, so batch-invariant. x is the residual stream itself.
// Q, K and V as one product (params.nq > 0): W is weights.Weight.upload_stack's rows of Q, then K,
// then V; outputs j < nq go to y (row r), the next nk to the K cache `k_out` and the rest to the
// V cache `v_out` (row step.pos + r of each); with EPILOGUE_ROPE the Q and K pairs are rotated.

//!include step.wgsl
//!include tree.wgsl
//!include blocks.wgsl

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

// One row tile's partials: (WG, MATMUL_OUTS) vec4 (component k = row r0 + k), then (WG,) vec4:
// each thread's sums of squares of its part of x (the folded norm); 5 KiB at WG = 64.
var<workgroup> part: array<vec4<f32>, WG * MATMUL_OUTS + WG>;

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

// acc += chunk i of each output's block . the x tile at vec4 column c.
fn mac(kind: u32, t: ptr<function, Tile>, b0: Block, b1: Block, b2: Block, b3: Block, i: u32,
       c: u32, r0: u32, rows: u32, rs: u32) {
    let xt = take_x(t, c, r0, rows, rs);
    let a = (*t).acc;
    (*t).acc = mat4x4<f32>(a[0] + chunk(kind, b0, i) * xt, a[1] + chunk(kind, b1, i) * xt,
                           a[2] + chunk(kind, b2, i) * xt, a[3] + chunk(kind, b3, i) * xt);
}

// This thread's partial sums of W's rows j (its outputs, clamped) over rows r0..r0+3 of the
// pass (quantized weights of `kind`, rows from word `base`).
fn tile_quant(kind: u32, base: u32, j: vec4<u32>, lane: u32, r0: u32, rows: u32) -> Tile {
    let nb = params.n_in / 32u;
    let rs = params.n_in / 4u;
    var t = Tile();
    for (var b = lane; b < nb; b += params.lanes) {
        let b0 = load_block(kind, base, j.x, b, nb);
        let b1 = load_block(kind, base, j.y, b, nb);
        let b2 = load_block(kind, base, j.z, b, nb);
        let b3 = load_block(kind, base, j.w, b, nb);
        let c = r0 * rs + b * 8u;
        mac(kind, &t, b0, b1, b2, b3, 0u, c, r0, rows, rs);
        mac(kind, &t, b0, b1, b2, b3, 1u, c + 1u, r0, rows, rs);
        mac(kind, &t, b0, b1, b2, b3, 2u, c + 2u, r0, rows, rs);
        mac(kind, &t, b0, b1, b2, b3, 3u, c + 3u, r0, rows, rs);
        mac(kind, &t, b0, b1, b2, b3, 4u, c + 4u, r0, rows, rs);
        mac(kind, &t, b0, b1, b2, b3, 5u, c + 5u, r0, rows, rs);
        mac(kind, &t, b0, b1, b2, b3, 6u, c + 6u, r0, rows, rs);
        mac(kind, &t, b0, b1, b2, b3, 7u, c + 7u, r0, rows, rs);
    }
    return t;
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

// A finished row tile, lanes = 1: each thread stores its sums, scaled by the folded norm.
fn store_own(j0: u32, r0: u32, rows: u32, tile: Tile) {
    var acc = tile.acc;
    let sq = tile.sq;
    if (params.norm != 0u) {
        let inv = vec4<f32>(inv_rms(sq[0].x + sq[0].y + sq[0].z + sq[0].w),
                            inv_rms(sq[1].x + sq[1].y + sq[1].z + sq[1].w),
                            inv_rms(sq[2].x + sq[2].y + sq[2].z + sq[2].w),
                            inv_rms(sq[3].x + sq[3].y + sq[3].z + sq[3].w));
        acc = mat4x4<f32>(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
    }
    store_tile(j0, r0, rows, acc[0], acc[1]);
    store_tile(j0 + 2u, r0, rows, acc[2], acc[3]);
}

// A finished row tile (rows r0.. of the pass), lanes > 1: the partials go to
// part[t * MATMUL_OUTS + o] (a vec4 per output: component k = row r0 + k) and the sums of squares
// to part[WG * MATMUL_OUTS + t], one barrier; lane l then takes the output pairs (o, o + 1) x
// rows k numbered l, l + lanes, ... of its group and sums each over the lanes in lane order.
fn store_shared(t: u32, j0: u32, r0: u32, all_rows: u32, tile: Tile) {
    let rows = min(all_rows - r0, 4u);
    let sq = tile.sq;
    let at = t * MATMUL_OUTS;
    workgroupBarrier();  // a tile before this one (a CPU adapter's loop) is done with `part`
    part[at] = tile.acc[0];
    part[at + 1u] = tile.acc[1];
    part[at + 2u] = tile.acc[2];
    part[at + 3u] = tile.acc[3];
    part[WG * MATMUL_OUTS + t] = vec4<f32>(sq[0].x + sq[0].y + sq[0].z + sq[0].w,
                                           sq[1].x + sq[1].y + sq[1].z + sq[1].w,
                                           sq[2].x + sq[2].y + sq[2].z + sq[2].w,
                                           sq[3].x + sq[3].y + sq[3].z + sq[3].w);
    workgroupBarrier();
    let lanes = params.lanes;
    let first = t - t % lanes;  // lane 0 of this group
    for (var e = t % lanes; e < MATMUL_OUTS / 2u * rows; e += lanes) {
        let o = e / rows * 2u;
        let k = e % rows;
        var s0 = part[first * MATMUL_OUTS + o][k];
        var s1 = part[first * MATMUL_OUTS + o + 1u][k];
        for (var l = 1u; l < lanes; l++) {
            s0 += part[(first + l) * MATMUL_OUTS + o][k];
            s1 += part[(first + l) * MATMUL_OUTS + o + 1u][k];
        }
        var scale = 1.0;
        if (params.norm != 0u) {
            var ss = part[WG * MATMUL_OUTS + first][k];
            for (var l = 1u; l < lanes; l++) {
                ss += part[WG * MATMUL_OUTS + first + l][k];
            }
            scale = inv_rms(ss);
        }
        store_pair(j0 + o, r0 + k, s0 * scale, s1 * scale);
    }
}

// A finished row tile, stored by whichever way `lanes` says.
fn finish(t: u32, j0: u32, r0: u32, rows: u32, tile: Tile) {
    if (params.lanes == 1u) {
        store_own(j0, r0, rows, tile);
    } else {
        store_shared(t, j0, r0, rows, tile);
    }
}

// W's rows of outputs j0..j0+3, clamped into W: outputs past n_out compute on its last row.
fn out_rows(j0: u32) -> vec4<u32> {
    return vec4<u32>(clamped(j0, 0u), clamped(j0, 1u), clamped(j0, 2u), clamped(j0, 3u));
}

// The product with quantized weights of `kind`: each workgroup layer takes its row tiles.
fn quantized(kind: u32, t: u32, wid: vec3<u32>, nwg: vec3<u32>) {
    let rows = min(step.rows, ROWS_MAX);
    let j0 = first_output(t, wid, nwg);
    for (var r0 = wid.z * 4u; r0 < rows; r0 += 4u * nwg.z) {
        finish(t, j0, r0, rows, tile_quant(kind, 0u, out_rows(j0), t % params.lanes, r0, rows));
    }
}

// `quantized` for the formats of a K-quant mix's Q, K, V product (Q4_K_M, Q5_K_M and their
// Q5_0 / Q5_1 fallbacks), whose V rows may be Q6_K or Q8_0 (formats/mixes.py: attn_v gets more
// bits on some layers). An output group never straddles the K/V boundary (nq + nk is whole heads,
// a multiple of 4), so a thread's 4 rows are all of one format; the branch only picks the tile,
// and every thread reaches `finish` (its barrier) on the same tiles.
fn quantized_v(kind: u32, t: u32, wid: vec3<u32>, nwg: vec3<u32>) {
    let rows = min(step.rows, ROWS_MAX);
    let j0 = first_output(t, wid, nwg);
    let v0 = params.nq + params.nk;
    let in_v = params.v_kind != NONE && j0 >= v0;
    let j = out_rows(j0) - select(vec4<u32>(), vec4<u32>(v0), in_v);
    let lane = t % params.lanes;
    for (var r0 = wid.z * 4u; r0 < rows; r0 += 4u * nwg.z) {
        var tile: Tile;
        if (!in_v) {
            tile = tile_quant(kind, 0u, j, lane, r0, rows);
        } else if (params.v_kind == KIND_Q6_K) {
            tile = tile_quant(KIND_Q6_K, params.v_at, j, lane, r0, rows);
        } else {
            tile = tile_quant(KIND_Q8_0, params.v_at, j, lane, r0, rows);
        }
        finish(t, j0, r0, rows, tile);
    }
}

@compute @workgroup_size(WG)
fn matmul_q4_1(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    quantized(KIND_Q4_1, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn matmul_q8_0(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    quantized(KIND_Q8_0, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn matmul_q4_0(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    quantized(KIND_Q4_0, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn matmul_q5_0(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    quantized_v(KIND_Q5_0, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn matmul_q5_1(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    quantized_v(KIND_Q5_1, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn matmul_q4_k(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    quantized_v(KIND_Q4_K, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn matmul_q5_k(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    quantized_v(KIND_Q5_K, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn matmul_q6_k(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    quantized(KIND_Q6_K, t, wid, nwg);
}

const F32: u32 = 0u;    // dense kinds
const BF16: u32 = 1u;

// Weights 4c..4c+3 of output j, f32 or bf16.
fn dense4(kind: u32, j: u32, c: u32) -> vec4<f32> {
    if (kind == BF16) {
        let at = j * (params.n_in / 2u) + c * 2u;
        let a = w[at];
        let b = w[at + 1u];
        return bitcast<vec4<f32>>(vec4<u32>(a << 16u, a & 0xFFFF0000u, b << 16u,
                                            b & 0xFFFF0000u));
    }
    let at = j * params.n_in + c * 4u;
    return bitcast<vec4<f32>>(vec4<u32>(w[at], w[at + 1u], w[at + 2u], w[at + 3u]));
}

// The product with dense weights of `kind` (F32, BF16): lanes take vec4 columns.
fn dense(kind: u32, t: u32, wid: vec3<u32>, nwg: vec3<u32>) {
    let rows = min(step.rows, ROWS_MAX);
    let j0 = first_output(t, wid, nwg);
    let rs = params.n_in / 4u;
    let j = out_rows(j0);
    for (var r0 = wid.z * 4u; r0 < rows; r0 += 4u * nwg.z) {
        var tile = Tile();
        for (var c = t % params.lanes; c < rs; c += params.lanes) {
            let xt = take_x(&tile, r0 * rs + c, r0, rows, rs);
            let a = tile.acc;
            tile.acc = mat4x4<f32>(a[0] + dense4(kind, j.x, c) * xt,
                                   a[1] + dense4(kind, j.y, c) * xt,
                                   a[2] + dense4(kind, j.z, c) * xt,
                                   a[3] + dense4(kind, j.w, c) * xt);
        }
        finish(t, j0, r0, rows, tile);
    }
}

@compute @workgroup_size(WG)
fn matmul_f32(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    dense(F32, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn matmul_bf16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    dense(BF16, t, wid, nwg);
}
