// Per-head RMSNorm of Q and K, then RoPE, in place (Qwen3 and Gemma 3: the norms come before the
// rotation, so they cannot ride in the Q/K/V product's epilogue, whose threads each hold two
// outputs of a head, never all of them).
// Q head h of pass row r is q[r, h*hd .. (h+1)*hd]; K head h is row step.pos + r of the K cache
// (rows past kv_rows are skipped, as the product that wrote them skipped them). Each head becomes
// rope(x / sqrt(mean(x^2) + eps) * weight) with weight q_norm for Q heads and k_norm for K heads,
// rotated as matmul.wgsl's EPILOGUE_ROPE rotates: pairs (2i, 2i + 1) by the table's angle i of
// position step.pos + r (in a tree's pass step.pos + the row's depth: step.wgsl; its K row stays
// step.pos + r). (NEOX-mode models reach it through rows the loader permuted: _neox_rows.)
// One workgroup of WG threads per (row, head) over the n_heads + n_kv heads: thread t sums the
// squares of pairs t, t + WG, ... in order, one workgroup barrier, then every thread adds the WG
// partials in the same order and writes its pairs. The split depends on hd only: batch-invariant.

//!include step.wgsl
//!include tree.wgsl

struct Params {
    n_heads: u32,   // Q heads
    n_kv: u32,      // K heads
    head_dim: u32,  // hd (even)
    kv_rows: u32,   // rows of the K cache (max_ctx)
    rope_rows: u32, // positions the RoPE table holds
    eps: f32,       // <arch>.attention.layer_norm_rms_epsilon
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read_write> q: array<vec2<f32>>;      // (ROWS_MAX, nh*hd/2)
@group(0) @binding(3) var<storage, read_write> kcache: array<vec2<f32>>; // (kv_rows, n_kv*hd/2)
@group(0) @binding(4) var<storage, read> weight: array<vec2<f32>>;       // (2, hd/2) q, k norms
@group(0) @binding(5) var<storage, read> table: array<vec2<f32>>;        // (rope_rows, hd/2)

var<workgroup> part: array<f32, WG>;  // (WG,) partial sums of squares

// Pair i of this head after the norm: its rotation by the position's angle i.
fn rotated(v: vec2<f32>, norm: f32, g: vec2<f32>, cs: vec2<f32>) -> vec2<f32> {
    let a = v.x / norm * g.x;
    let b = v.y / norm * g.y;
    return vec2<f32>(a * cs.x - b * cs.y, a * cs.y + b * cs.x);
}

@compute @workgroup_size(WG)
fn qk_norm(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let heads = params.n_heads + params.n_kv;
    let group_id = wid.x + wid.y * nwg.x;
    let r = group_id / heads;  // uniform in the workgroup: the early returns keep the barrier legal
    let h = group_id % heads;
    let pos = step.pos + r;
    if (r >= min(step.rows, ROWS_MAX) || (h >= params.n_heads && pos >= params.kv_rows)) {
        return;
    }
    let half = params.head_dim / 2u;
    let is_k = h >= params.n_heads;
    let at = select(r * params.n_heads + h, pos * params.n_kv + h - params.n_heads, is_k) * half;
    var s = 0.0;
    for (var i = t; i < half; i += WG) {
        var v: vec2<f32>;
        if (is_k) {
            v = kcache[at + i];
        } else {
            v = q[at + i];
        }
        s += v.x * v.x;
        s += v.y * v.y;
    }
    part[t] = s;
    workgroupBarrier();
    var total = 0.0;
    for (var l = 0u; l < WG; l++) {
        total += part[l];
    }
    let norm = sqrt(total / f32(params.head_dim) + params.eps);
    let w_at = select(0u, half, is_k);
    let cs_at = min(row_position(r), params.rope_rows - 1u) * half;
    for (var i = t; i < half; i += WG) {
        if (is_k) {
            kcache[at + i] = rotated(kcache[at + i], norm, weight[w_at + i], table[cs_at + i]);
        } else {
            q[at + i] = rotated(q[at + i], norm, weight[w_at + i], table[cs_at + i]);
        }
    }
}
