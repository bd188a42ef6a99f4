// A tree cycle's accepted path moved into place in one layer's caches (gpu/tree.py, kv.py's
// KVCache.compact): for i < n, K and V row src[i] go to row dst + i, in order i = 0, 1, ...
// The sources increase and src[i] >= dst + i, so no move overwrites a row a later one reads.
// One thread per vec4 of a row; each moves its vec4 of every row in order.

struct Params {
    n: u32,      // rows to move (<= ROWS_MAX)
    dst: u32,    // the first destination row
    row4: u32,   // a cache row's vec4s (n_kv * hd / 4)
    pad: u32,
    src: array<vec4<u32>, ROWS_MAX / 4u>,   // (ROWS_MAX,) the source rows, increasing
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> kcache: array<vec4<f32>>;  // (max_ctx, row4)
@group(0) @binding(2) var<storage, read_write> vcache: array<vec4<f32>>;  // (max_ctx, row4)

@compute @workgroup_size(WG)
fn kv_compact(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= params.row4) {
        return;
    }
    for (var i = 0u; i < min(params.n, ROWS_MAX); i++) {
        let src = params.src[i / 4u][i % 4u] * params.row4 + e;
        let to = (params.dst + i) * params.row4 + e;
        kcache[to] = kcache[src];
        vcache[to] = vcache[src];
    }
}
