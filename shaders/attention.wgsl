// Grouped-query causal attention over the KV cache (model.Model.attention).
// Pass row r (position p = step.pos + r) attends to cache rows lo..p inclusive; its own K/V row is
// already in the cache. In a tree's pass (FLAG_TREE, step.wgsl, tree.wgsl) row r is at position
// p = tree_base + its depth and attends to positions lo..p in the same order with the same
// splits, position s read from cache row s below the root and from its ancestor's row on its
// path from there (kv_row): the committed context and its own ancestors only, the mask given by
// parent entries, not a matrix. lo = 0, or with a sliding window of w positions (Gemma 3's local layers)
// lo = max(0, p + 1 - w): the positions s with p - s < w (llama.cpp's standard SWA mask). Every
// split below counts positions from lo, so a layer without a window (lo = 0) computes exactly what
// it did before windows existed. Query head h reads KV head h / (n_heads / n_kv).
// One workgroup of `threads` threads per (row, head), split over positions (split-K inside the
// workgroup; ops.attention says why not across workgroups). Two barriers, three phases:
//   1. thread t scores positions s = lo + t, lo + t + threads, ...: q . k_s * scale, into the
//      scratch, and keeps their max;                        storage and workgroup barrier;
//   2. the threads form `groups` position groups of hd/4 threads; group g owns the positions
//      s = lo + g, lo + g + groups, ... (those thread t = g (mod groups) scored, so their max
//      m_g is the max of those threads' maxima) and thread j of the group owns output dims
//      4j..4j+3. Each thread sums e_s = exp(score_s - m_g) and e_s * v_s[4j..4j+3] over the
//      group's positions in position order: the group's partial (m_g, l_g, o_g);
//                                                         workgroup barrier;
//   3. thread j merges the groups' partials in group order 0, 1, ...: with M the max of the m_g,
//      out = sum_g exp(m_g - M) o_g / sum_g exp(m_g - M) l_g.
// No thread loops over every position: phase 1 takes p / threads positions a thread, phase 2
// p / groups. Every split depends on p and the shapes only, never on step.rows: batch-invariant.
// The loops over positions, dims and groups take several steps at a time, every load of a step
// first and then the sums in the same order as one step at a time (the same results): on the
// H200 a step's loads in flight together took 2,048 positions from 56 to 34 µs, phase 1 scoring
// two positions a step (python -m experiments.bench_kernels --cases attn;
// bench/results/h200-kernels.json).
// The scores go to a global scratch (ROWS_MAX, n_heads, max_ctx) (ops.attention_scratch_bytes),
// because 8192 positions would not fit in the 16 KiB of workgroup memory WebGPU guarantees; the
// threads' maxima and the groups' partials sit in workgroup memory (7 KiB), whose loads cost a
// fraction of a global one's: phases 2 and 3 each read 16 of them in a row. With the maxima and
// partials in the scratch too, a 1-row pass over 128 positions took 8.65 us on the H200, 6.90 us
// now, and 2.2-2.4 us more at 1,024 and 2,048 (bench/results/h200-kernels-attention.json).

//!include step.wgsl
//!include tree.wgsl

struct Params {
    n_heads: u32,   // query heads
    n_kv: u32,      // KV heads (divides n_heads)
    head_dim: u32,  // hd, a multiple of 4 (vec4 loads)
    max_ctx: u32,   // rows of the caches and of the scores in the scratch
    scale: f32,     // the score scale (config.attn_scale), rounded to f32 as the reference does
    groups: u32,    // position groups of phase 2: a power of two, groups * hd / 4 <= threads
    window: u32,    // sliding window in positions; 0: none (every position 0..p)
}

const LOWEST: f32 = -3.4028234663852886e38;  // -FLT_MAX exactly: Tint rejects -3.4028235e38 (it rounds past f32)

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;         // (ROWS_MAX, n_heads * hd / 4)
@group(0) @binding(3) var<storage, read> kcache: array<vec4<f32>>;    // (max_ctx, n_kv * hd / 4)
@group(0) @binding(4) var<storage, read> vcache: array<vec4<f32>>;    // (max_ctx, n_kv * hd / 4)
@group(0) @binding(5) var<storage, read_write> scratch: array<f32>;   // (R, n_heads, max_ctx)
@group(0) @binding(6) var<storage, read_write> out: array<vec4<f32>>; // (ROWS_MAX, n_heads * hd / 4)

var<workgroup> wg_max: array<f32, ATTN_WG>;        // (threads,) phase 1's per-thread maxima
var<workgroup> wg_m: array<f32, ATTN_WG>;          // (groups,) m_g
var<workgroup> wg_l: array<f32, ATTN_WG>;          // (groups,) l_g
var<workgroup> wg_o: array<vec4<f32>, ATTN_WG>;    // (groups, hd / 4) o_g
var<workgroup> wg_path: array<u32, ROWS_MAX>;      // (depth + 1,) a tree row's path's cache rows

// Four entry points, one algorithm: `attention` (ATTN_WG threads, GPUs) and `attention_cpu`
// (ATTN_WG_CPU threads, software adapters, where idle threads and barriers cost more than the
// parallelism pays; ops.attention picks), and their `_tree` twins for the passes of a tree
// (model.py builds a tree's plan apart). Each calls attend with `tree` a constant, so a chain's
// pipeline is the code it was before trees existed (kv_row folds to s, the path's walk and its
// barrier go) and a tree's runs the same arithmetic over other rows: a node's logits are
// bit-identical to its path's as a chain. A `_tree` entry runs a chain's Step as a chain.
@compute @workgroup_size(ATTN_WG)
fn attention(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    attend(t, ATTN_WG, wid.x + wid.y * nwg.x, false);
}

@compute @workgroup_size(ATTN_WG_CPU)
fn attention_cpu(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                 @builtin(num_workgroups) nwg: vec3<u32>) {
    attend(t, ATTN_WG_CPU, wid.x + wid.y * nwg.x, false);
}

@compute @workgroup_size(ATTN_WG)
fn attention_tree(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>) {
    attend(t, ATTN_WG, wid.x + wid.y * nwg.x, (step.flags & FLAG_TREE) != 0u);
}

@compute @workgroup_size(ATTN_WG_CPU)
fn attention_tree_cpu(@builtin(local_invocation_index) t: u32,
                      @builtin(workgroup_id) wid: vec3<u32>,
                      @builtin(num_workgroups) nwg: vec3<u32>) {
    attend(t, ATTN_WG_CPU, wid.x + wid.y * nwg.x, (step.flags & FLAG_TREE) != 0u);
}

// The cache row of position s for this workgroup's row: s itself in a chain and below a tree's
// root; in a tree, the row of the entry at depth s - tree_base on the row's own path (wg_path).
fn kv_row(s: u32, tree: bool) -> u32 {
    if (tree && s >= step.tree_base) {
        return wg_path[min(s - step.tree_base, ROWS_MAX - 1u)];
    }
    return s;
}

// wg_path for pass row r of a tree: the cache row of its ancestor at each depth, itself last;
// returns r's depth. Thread 0 walks the parents; the barrier is the caller's.
fn walk_path(t: u32, r: u32) -> u32 {
    let i = tree_index(r);
    let depth = tree_entry(i) & 0xFFFFu;
    if (t == 0u) {
        var a = i;
        for (var d = 0u; d <= depth && d < ROWS_MAX; d++) {   // at most ROWS_MAX steps
            let entry = tree_entry(a);
            wg_path[min(entry & 0xFFFFu, ROWS_MAX - 1u)] = step.tree_base + a;
            a = entry >> 16u;
        }
    }
    return depth;
}

// Thread t of `threads` in workgroup group_id = (row, head); `tree`: the rows are a tree's.
fn attend(t: u32, threads: u32, group_id: u32, tree: bool) {
    let r = group_id / params.n_heads;  // uniform in the workgroup: the early return is legal
    let h = group_id % params.n_heads;
    if (r >= min(step.rows, ROWS_MAX)) {
        return;
    }
    let hd4 = params.head_dim / 4u;
    var p = step.pos + r;   // its position
    if (tree) {
        p = step.tree_base + walk_path(t, r);
        workgroupBarrier();
    }
    let n = min(p + 1u, params.max_ctx);  // positions lo..p: s < n
    let lo = select(0u, n - params.window, params.window != 0u && n > params.window);
    let stride = params.n_kv * hd4;                    // one cache row, in vec4
    let kv_off = (h / (params.n_heads / params.n_kv)) * hd4;
    let q_off = (r * params.n_heads + h) * hd4;
    let scores = (r * params.n_heads + h) * params.max_ctx;  // this (row, head)'s scores

    // 1. scores
    var m = LOWEST;
    {
        var s = lo + t;
        for (; s + threads < n; s += 2u * threads) {   // two positions a step: loads together
            let k_a = kv_row(s, tree) * stride + kv_off;
            let k_b = kv_row(s + threads, tree) * stride + kv_off;
            var da = 0.0;
            var db = 0.0;
            var i = 0u;
            for (; i + 3u < hd4; i += 4u) {
                let a0 = kcache[k_a + i];
                let a1 = kcache[k_a + i + 1u];
                let a2 = kcache[k_a + i + 2u];
                let a3 = kcache[k_a + i + 3u];
                let b0 = kcache[k_b + i];
                let b1 = kcache[k_b + i + 1u];
                let b2 = kcache[k_b + i + 2u];
                let b3 = kcache[k_b + i + 3u];
                da += dot(q[q_off + i], a0);
                da += dot(q[q_off + i + 1u], a1);
                da += dot(q[q_off + i + 2u], a2);
                da += dot(q[q_off + i + 3u], a3);
                db += dot(q[q_off + i], b0);
                db += dot(q[q_off + i + 1u], b1);
                db += dot(q[q_off + i + 2u], b2);
                db += dot(q[q_off + i + 3u], b3);
            }
            for (; i < hd4; i++) {
                da += dot(q[q_off + i], kcache[k_a + i]);
                db += dot(q[q_off + i], kcache[k_b + i]);
            }
            let sa = da * params.scale;
            let sb = db * params.scale;
            scratch[scores + s] = sa;
            scratch[scores + s + threads] = sb;
            m = max(m, sa);
            m = max(m, sb);
        }
        for (; s < n; s += threads) {   // the last position, if odd
            let k_off = kv_row(s, tree) * stride + kv_off;
            var d = 0.0;
            var i = 0u;
            for (; i + 3u < hd4; i += 4u) {   // four loads in flight, summed in order
                let k0 = kcache[k_off + i];
                let k1 = kcache[k_off + i + 1u];
                let k2 = kcache[k_off + i + 2u];
                let k3 = kcache[k_off + i + 3u];
                d += dot(q[q_off + i], k0);
                d += dot(q[q_off + i + 1u], k1);
                d += dot(q[q_off + i + 2u], k2);
                d += dot(q[q_off + i + 3u], k3);
            }
            for (; i < hd4; i++) {
                d += dot(q[q_off + i], kcache[k_off + i]);
            }
            let score = d * params.scale;
            scratch[scores + s] = score;
            m = max(m, score);
        }
    }
    wg_max[t] = m;
    storageBarrier();
    workgroupBarrier();

    // 2. each group's partial over its positions
    let groups = params.groups;
    let g = t / hd4;
    let j = t % hd4;
    if (g < groups) {
        var m_g = LOWEST;
        for (var l = g; l < threads; l += groups) {  // the threads that scored this group's positions
            m_g = max(m_g, wg_max[l]);
        }
        var o = vec4<f32>(0.0);
        var sum = 0.0;
        // Eight positions a step, their loads first, then summed in position order (the same
        // sums as one at a time): the loads of a step are in flight together. Written out: the
        // same step over two 8-entry arrays ran 2x slower on the H200 (the arrays went to memory).
        var s = lo + g;
        let v_at = kv_off + j;
        for (; s + 7u * groups < n; s += 8u * groups) {
            let x0 = scratch[scores + s];
            let x1 = scratch[scores + s + 1u * groups];
            let x2 = scratch[scores + s + 2u * groups];
            let x3 = scratch[scores + s + 3u * groups];
            let x4 = scratch[scores + s + 4u * groups];
            let x5 = scratch[scores + s + 5u * groups];
            let x6 = scratch[scores + s + 6u * groups];
            let x7 = scratch[scores + s + 7u * groups];
            let v0 = vcache[kv_row(s, tree) * stride + v_at];
            let v1 = vcache[kv_row(s + 1u * groups, tree) * stride + v_at];
            let v2 = vcache[kv_row(s + 2u * groups, tree) * stride + v_at];
            let v3 = vcache[kv_row(s + 3u * groups, tree) * stride + v_at];
            let v4 = vcache[kv_row(s + 4u * groups, tree) * stride + v_at];
            let v5 = vcache[kv_row(s + 5u * groups, tree) * stride + v_at];
            let v6 = vcache[kv_row(s + 6u * groups, tree) * stride + v_at];
            let v7 = vcache[kv_row(s + 7u * groups, tree) * stride + v_at];
            let e0 = exp(x0 - m_g);
            o += e0 * v0;
            sum += e0;
            let e1 = exp(x1 - m_g);
            o += e1 * v1;
            sum += e1;
            let e2 = exp(x2 - m_g);
            o += e2 * v2;
            sum += e2;
            let e3 = exp(x3 - m_g);
            o += e3 * v3;
            sum += e3;
            let e4 = exp(x4 - m_g);
            o += e4 * v4;
            sum += e4;
            let e5 = exp(x5 - m_g);
            o += e5 * v5;
            sum += e5;
            let e6 = exp(x6 - m_g);
            o += e6 * v6;
            sum += e6;
            let e7 = exp(x7 - m_g);
            o += e7 * v7;
            sum += e7;
        }
        for (; s < n; s += groups) {
            let e = exp(scratch[scores + s] - m_g);
            o += e * vcache[kv_row(s, tree) * stride + v_at];
            sum += e;
        }
        wg_o[g * hd4 + j] = o;
        if (j == 0u) {
            wg_m[g] = m_g;
            wg_l[g] = sum;
        }
    }
    workgroupBarrier();

    // 3. merge the groups in order
    if (t < hd4) {
        var top = LOWEST;
        for (var l = 0u; l < groups; l++) {
            top = max(top, wg_m[l]);
        }
        var o = vec4<f32>(0.0);
        var total = 0.0;
        var l = 0u;
        for (; l + 1u < groups; l += 2u) {   // two groups' loads in flight, merged in order
            let pa = wg_o[l * hd4 + t];
            let pb = wg_o[(l + 1u) * hd4 + t];
            let la = wg_l[l];
            let lb = wg_l[l + 1u];
            let wa = exp(wg_m[l] - top);  // 0 for a group without positions
            let wb = exp(wg_m[l + 1u] - top);
            o += wa * pa;
            total += wa * la;
            o += wb * pb;
            total += wb * lb;
        }
        for (; l < groups; l++) {
            let w = exp(wg_m[l] - top);  // 0 for a group without positions (m = LOWEST)
            o += w * wg_o[l * hd4 + t];
            total += w * wg_l[l];
        }
        out[q_off + t] = o / total;
    }
}
