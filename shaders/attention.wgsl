// Grouped-query causal attention over the KV cache (model.Model.attention).
// Pass row r (position p = step.pos + r) attends to cache rows 0..p inclusive; its own K/V row is
// already in the cache. Query head h reads KV head h / (n_heads / n_kv).
// One workgroup of WG threads per (row, head), three phases over positions s = 0..p:
//   1. thread t scores positions t, t + WG, ...: q . k_s * scale, into the scores scratch, and
//      keeps their max;           workgroup barrier: every thread takes the max of the WG maxima;
//   2. thread t turns its scores into e_s = exp(score - max) and sums them;
//                                  storage + workgroup barrier: every thread sums the WG sums in
//                                  order (and now sees every e_s);
//   3. thread t owns output dims t, t + WG, ...: sum_s e_s * v_s[dim] in position order, / sum.
// Scores go to a global scratch (ROWS_MAX, n_heads, max_ctx) because 8192 positions would not fit
// in the 16 KiB of workgroup memory WebGPU guarantees. Every split depends on p and the shapes
// only, never on step.rows: batch-invariant.

//!include step.wgsl

struct Params {
    n_heads: u32,   // query heads
    n_kv: u32,      // KV heads (divides n_heads)
    head_dim: u32,  // hd
    max_ctx: u32,   // rows of the caches and of the scores scratch
    scale: f32,     // 1 / sqrt(head_dim), rounded to f32 as the reference does
}

const LOWEST: f32 = -3.4028234663852886e38;  // -FLT_MAX exactly: Tint rejects -3.4028235e38 (it rounds past f32)

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> q: array<f32>;             // (ROWS_MAX, n_heads * hd)
@group(0) @binding(3) var<storage, read> kcache: array<f32>;        // (max_ctx, n_kv * hd)
@group(0) @binding(4) var<storage, read> vcache: array<f32>;        // (max_ctx, n_kv * hd)
@group(0) @binding(5) var<storage, read_write> scores: array<f32>;  // (ROWS_MAX, n_heads, max_ctx)
@group(0) @binding(6) var<storage, read_write> out: array<f32>;     // (ROWS_MAX, n_heads * hd)

var<workgroup> maxima: array<f32, WG>;  // (WG,)
var<workgroup> sums: array<f32, WG>;    // (WG,)

@compute @workgroup_size(WG)
fn attention(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let group_id = wid.x + wid.y * nwg.x;  // uniform in the workgroup: the early return is legal
    let r = group_id / params.n_heads;
    let h = group_id % params.n_heads;
    if (r >= min(step.rows, ROWS_MAX)) {
        return;
    }
    let hd = params.head_dim;
    let n = min(step.pos + r + 1u, params.max_ctx);  // positions 0..p
    let stride = params.n_kv * hd;                     // one cache row
    let kv_off = (h / (params.n_heads / params.n_kv)) * hd;
    let q_off = (r * params.n_heads + h) * hd;
    let s_off = (r * params.n_heads + h) * params.max_ctx;

    var m = LOWEST;
    for (var s = t; s < n; s += WG) {
        let k_off = s * stride + kv_off;
        var d = 0.0;
        for (var i = 0u; i < hd; i++) {
            d += q[q_off + i] * kcache[k_off + i];
        }
        let score = d * params.scale;
        scores[s_off + s] = score;
        m = max(m, score);
    }
    maxima[t] = m;
    workgroupBarrier();
    var top = maxima[0];
    for (var l = 1u; l < WG; l++) {
        top = max(top, maxima[l]);
    }

    var sum = 0.0;
    for (var s = t; s < n; s += WG) {
        let e = exp(scores[s_off + s] - top);
        scores[s_off + s] = e;
        sum += e;
    }
    sums[t] = sum;
    storageBarrier();
    workgroupBarrier();
    var total = 0.0;
    for (var l = 0u; l < WG; l++) {
        total += sums[l];
    }

    for (var i = t; i < hd; i += WG) {
        var o = 0.0;
        for (var s = 0u; s < n; s++) {
            o += scores[s_off + s] * vcache[s * stride + kv_off + i];
        }
        out[q_off + i] = o / total;
    }
}
