// Thin matrix products y = W x over 1..ROWS_MAX rows with quantized weights, on a GPU: the lanes of
// an output group read consecutive words of the same weight rows. ops.matmul sends the quantized
// kinds here where the adapter is not a CPU one (PYSPEC_MATMUL=blocks keeps them on matmul.wgsl,
// the kernel before, for an A/B); CPU adapters and dense weights stay on matmul.wgsl. Params,
// bindings, the x tiles, the folded norm and every epilogue (RoPE, the SiLU / GELU gates, bias,
// Q / K / V with V in another format, accumulate, out_at_pos, y_stride) are matmul_io.wgsl's.
//
// Why: matmul.wgsl's lanes take whole blocks (lane, lane + lanes, ...) of 4 rows each, so on a
// GPU neighbouring threads read words 20-212 bytes apart and each walks a 144-byte Q4_K
// super-block alone; there loads are uncoalesced. Here a row is cut into slices of 8 values
// (slices.wgsl), numbered so that slices s, s + 1, ... are consecutive words of the row (a Q4_K
// super-block's 32 words of qs are its 32 slices; its scales are one broadcast word for all), and
// lane l of `lanes` (32 or 64: ops._coalesced_lanes, from the weight's shape only) takes slices
// l, l + lanes, ...: in each step the lanes read one run of consecutive words of each of their
// 4 rows, and the x columns they load are neighbours too.
// Work split: an output group is `lanes` threads owning MATMUL_OUTS = 4 consecutive outputs
// (WG / lanes groups per workgroup); a thread sums its slices of the 4 rows, in slice order, for
// a tile of 4 pass rows (a mat4x4, as matmul.wgsl's). Workgroup layer z takes row tiles z,
// z + Z, ... (ops._row_layers: Z = ROWS_MAX / 4 on a GPU, so a tile per layer).
// Reduction: each lane parks its 4 x 4 sums and its sums of squares (the folded norm) in `part`;
// then a tree of halving strides, one barrier each: lane i < stride adds lane i + stride's sums
// to its own (stride = lanes / 2, lanes / 4, ..., 1). Lane 0 then holds the group's sums, and
// lanes e < 2 * (rows of the tile) each store one (output pair, row) through the epilogue.
// Batch invariance: `lanes` depends on (n_out, n_in, device) only; each (row, output)'s sum sees
// the same slices in the same order through the same instructions, whatever step.rows is and
// whichever tile slot or layer holds the row; rows never mix; the tree's order is fixed by lanes.
// No subgroup operations: the reduction is workgroup memory and barriers only (WebGPU core).
// Awaits measurement on a GPU against matmul.wgsl (experiments/shader_ab.py --matmul).

//!include matmul_io.wgsl
//!include blocks.wgsl
//!include slices.wgsl

// One row tile's partials: (WG, MATMUL_OUTS) vec4 (component k = row r0 + k), then (WG,) vec4:
// each thread's sums of squares of its part of x (the folded norm); 5 KiB at WG = 64.
var<workgroup> part: array<vec4<f32>, WG * MATMUL_OUTS + WG>;

// This thread's partial sums of W's rows j (its outputs, clamped) over rows r0..r0+3 of the
// pass: slices lane, lane + lanes, ... of each row (quantized weights of `kind`, rows from word
// `base`), each slice's lo then its hi.
fn tile_slices(kind: u32, base: u32, j: vec4<u32>, lane: u32, r0: u32, rows: u32) -> Tile {
    let rs = params.n_in / 4u;
    let gap = slice_gap(kind) / 4u;
    var t = Tile();
    for (var s = lane; s < params.n_in / 8u; s += params.lanes) {
        let c = r0 * rs + slice_col(kind, s) / 4u;
        let w0 = load_slice(kind, base, j.x, s, params.n_in);
        let w1 = load_slice(kind, base, j.y, s, params.n_in);
        let w2 = load_slice(kind, base, j.z, s, params.n_in);
        let w3 = load_slice(kind, base, j.w, s, params.n_in);
        let xl = take_x(&t, c, r0, rows, rs);
        let xh = take_x(&t, c + gap, r0, rows, rs);
        let a = t.acc;
        t.acc = mat4x4<f32>(a[0] + w0.lo * xl + w0.hi * xh, a[1] + w1.lo * xl + w1.hi * xh,
                            a[2] + w2.lo * xl + w2.hi * xh, a[3] + w3.lo * xl + w3.hi * xh);
    }
    return t;
}

// A finished row tile (rows r0.. of the pass): the lanes' sums, added by the tree (see above),
// then stored through the epilogue, scaled by the folded norm.
fn reduce_store(t: u32, j0: u32, r0: u32, all_rows: u32, tile: Tile) {
    let rows = min(all_rows - r0, 4u);
    let sq = tile.sq;
    let at = t * MATMUL_OUTS;
    let sq_at = WG * MATMUL_OUTS;
    workgroupBarrier();  // a tile before this one is done with `part`
    part[at] = tile.acc[0];
    part[at + 1u] = tile.acc[1];
    part[at + 2u] = tile.acc[2];
    part[at + 3u] = tile.acc[3];
    part[sq_at + t] = vec4<f32>(sq[0].x + sq[0].y + sq[0].z + sq[0].w,
                                sq[1].x + sq[1].y + sq[1].z + sq[1].w,
                                sq[2].x + sq[2].y + sq[2].z + sq[2].w,
                                sq[3].x + sq[3].y + sq[3].z + sq[3].w);
    let lane = t % params.lanes;
    for (var stride = params.lanes / 2u; stride > 0u; stride /= 2u) {
        workgroupBarrier();
        if (lane < stride) {
            let other = at + stride * MATMUL_OUTS;
            part[at] += part[other];
            part[at + 1u] += part[other + 1u];
            part[at + 2u] += part[other + 2u];
            part[at + 3u] += part[other + 3u];
            part[sq_at + t] += part[sq_at + t + stride];
        }
    }
    workgroupBarrier();
    if (lane < MATMUL_OUTS / 2u * rows) {
        let first = t - lane;   // lane 0 of this group: the group's sums
        let o = lane / rows * 2u;
        let k = lane % rows;
        var scale = 1.0;
        if (params.norm != 0u) {
            scale = inv_rms(part[sq_at + first][k]);
        }
        let s = part[first * MATMUL_OUTS + o];
        let u = part[first * MATMUL_OUTS + o + 1u];
        store_pair(j0 + o, r0 + k, s[k] * scale, u[k] * scale);
    }
}

// The product with weights of `kind`, whose V rows (a Q, K, V product of a K-quant mix: Q4_K_M,
// Q5_K_M and their Q5_0 / Q5_1 fallbacks) may be Q6_K or Q8_0 (params.v_kind): an output group's
// 4 rows are all of one format, so the branch only picks the tile, and every thread reaches
// reduce_store's barriers on the same tiles.
fn coalesced(kind: u32, t: u32, wid: vec3<u32>, nwg: vec3<u32>) {
    let rows = min(step.rows, ROWS_MAX);
    let j0 = first_output(t, wid, nwg);
    let v0 = params.nq + params.nk;
    let in_v = params.v_kind != NONE && j0 >= v0;
    let j = out_rows(j0) - select(vec4<u32>(), vec4<u32>(v0), in_v);
    let lane = t % params.lanes;
    for (var r0 = wid.z * 4u; r0 < rows; r0 += 4u * nwg.z) {
        var tile: Tile;
        if (!in_v) {
            tile = tile_slices(kind, 0u, j, lane, r0, rows);
        } else if (params.v_kind == KIND_Q6_K) {
            tile = tile_slices(KIND_Q6_K, params.v_at, j, lane, r0, rows);
        } else {
            tile = tile_slices(KIND_Q8_0, params.v_at, j, lane, r0, rows);
        }
        reduce_store(t, j0, r0, rows, tile);
    }
}

@compute @workgroup_size(WG)
fn matmul_coalesced_q4_1(@builtin(local_invocation_index) t: u32,
                         @builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>) {
    coalesced(KIND_Q4_1, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn matmul_coalesced_q8_0(@builtin(local_invocation_index) t: u32,
                         @builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>) {
    coalesced(KIND_Q8_0, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn matmul_coalesced_q4_0(@builtin(local_invocation_index) t: u32,
                         @builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>) {
    coalesced(KIND_Q4_0, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn matmul_coalesced_q5_0(@builtin(local_invocation_index) t: u32,
                         @builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>) {
    coalesced(KIND_Q5_0, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn matmul_coalesced_q5_1(@builtin(local_invocation_index) t: u32,
                         @builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>) {
    coalesced(KIND_Q5_1, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn matmul_coalesced_q4_k(@builtin(local_invocation_index) t: u32,
                         @builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>) {
    coalesced(KIND_Q4_K, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn matmul_coalesced_q5_k(@builtin(local_invocation_index) t: u32,
                         @builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>) {
    coalesced(KIND_Q5_K, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn matmul_coalesced_q6_k(@builtin(local_invocation_index) t: u32,
                         @builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>) {
    coalesced(KIND_Q6_K, t, wid, nwg);
}
