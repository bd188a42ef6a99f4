// A tree cycle's accepted path moved into place in one layer's caches (gpu/tree.py, kv.py's
// KVCache.compact): for i < n, K and V row src[i] go to row dst + i, in order i = 0, 1, ...
// The sources increase and src[i] >= dst + i, so no move overwrites a row a later one reads.
// The moves are written by the host (a walk on the host) or by tree_walk.wgsl in the cycle
// before (a walk on the device); a cycle's first dispatches, so a cycle stays one submission.
// One thread per vec4 of a row; each moves its vec4 of every row in order.

//!include moves.wgsl

struct Params {
    row4: u32,   // a cache row's vec4s (n_kv * hd / 4)
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> moves: Moves;
@group(0) @binding(2) var<storage, read_write> kcache: array<vec4<f32>>;  // (max_ctx, row4)
@group(0) @binding(3) var<storage, read_write> vcache: array<vec4<f32>>;  // (max_ctx, row4)

@compute @workgroup_size(WG)
fn kv_compact(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= params.row4) {
        return;
    }
    for (var i = 0u; i < min(moves.n, ROWS_MAX); i++) {
        let src = moves.src[i] * params.row4 + e;
        let to = (moves.dst + i) * params.row4 + e;
        kcache[to] = kcache[src];
        vcache[to] = vcache[src];
    }
}
