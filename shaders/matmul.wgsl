// Thin matrix products y = W x over 1..ROWS_MAX rows by whole blocks: every product on a CPU
// adapter, and dense weights (f32, bf16) on a GPU. Quantized weights on a GPU take
// matmul_coalesced.wgsl (ops.matmul picks, by adapter and kind; PYSPEC_MATMUL=blocks sends them
// here too, the kernel before it, for an A/B). Formats: Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K,
// Q6_K (blocks.wgsl has their layouts), f32 or bf16; Params, bindings, the x tiles and the
// epilogues are matmul_io.wgsl's.
//
// Work split: a thread owns MATMUL_OUTS = 4 consecutive outputs and one `lane` of them; the
// `lanes` threads of an output group take the blocks lane, lane + lanes, ... Each x value a
// thread loads serves its 4 outputs, and each weight 4 rows: on CPU adapters (lavapipe,
// SwiftShader) every non-uniform storage load is a per-invocation scalar loop, so loads are
// the cost to cut (an indexed array becomes memory there, so accumulators are named mat4x4s).
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

//!include matmul_io.wgsl
//!include blocks.wgsl

// One row tile's partials: (WG, MATMUL_OUTS) vec4 (component k = row r0 + k), then (WG,) vec4:
// each thread's sums of squares of its part of x (the folded norm); 5 KiB at WG = 64.
var<workgroup> part: array<vec4<f32>, WG * MATMUL_OUTS + WG>;

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
