// Per-row token choice from logits or probabilities: argmax (greedy / Gumbel replay),
// softmax with temperature, and exact inverse-CDF sampling; plus `rng_fill`, which exposes the
// hash to the tests. Host wrappers: pyspec/gpu/sampling.py (one per entry point).
//
// Every per-row kernel runs one workgroup of WG_ROW threads per row, dispatched for
// params.rows_cap rows; workgroups of rows >= step.rows exit at once, so one dispatch list serves
// every pass. Threads stride the vocabulary (i = tid, tid + WG_ROW, ...), then a fixed-shape tree
// in workgroup memory combines them: the result of a row never depends on how many rows the pass
// has. On a GPU one workgroup per row leaves the chip idle (argmax_rows took 90 us of the H200's
// time for a row of 49,152 logits, more than a draft model's layer), so there argmax_rows runs as
// two kernels: argmax_parts, a workgroup per ARGMAX_CHUNK ids of a row, and argmax_merge, a
// workgroup per row over its parts in part order. The token is exact either way (a maximum with
// ties to the lowest id does not depend on the order of comparisons); the confidence's sum is
// taken part by part (each part's sum at its own maximum, rescaled to the row's), in a fixed
// order per row. softmax_rows and sample_rows split the same way there (softmax_parts +
// softmax_write, sample_parts + sample_pick): the softmax's denominator is then summed part by
// part, so its bits differ from the one-workgroup kernel's (by rounding; no test or contract
// compares rejection sampling's bits across adapters), and the sample is exact either way (its
// sums are integers).
// Random keys: row r draws at position step.pos + params.pos_shift + r (pos_shift = 1 when the
// step is the forward's, whose row r sits at KV row pos + r and predicts the token after it); the
// argmax's replay noise of a tree's pass (Step FLAG_TREE) at its row's position instead, the
// root's plus the row's depth (tree.wgsl's row_position), as rules/tree.walk_replay keys it.

//!include step.wgsl
//!include tree.wgsl
//!include rng.wgsl
//!include categorical.wgsl

const F32_LOWEST: f32 = -0x1.fffffep+127f;  // -FLT_MAX

struct Params {
    vocab: u32,        // entries per row
    rows_cap: u32,     // rows the buffers hold; the dispatch size
    in_offset: u32,    // element index of row 0 of the input
    in_stride: u32,    // elements between input rows
    out_offset: u32,   // argmax/sample: index of row 0's token; softmax: element of row 0's probs
    out_stride: u32,   // softmax: elements between output rows; topk: ids between rows
    conf_offset: u32,  // index of row 0's confidence
    pos_shift: u32,    // see above
    stream: u32,       // sample_rows: the rng stream (rng.STREAM_DRAFT for a drafter)
    n: u32,            // rng_fill: number of keys
    width: u32,        // topk.wgsl: the ids chosen per row
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<uniform> step: Step;
// argmax_rows, softmax_rows: logits; sample_rows: probabilities.
@group(0) @binding(2) var<storage, read> src: array<f32>;           // (rows_cap, in_stride)
// argmax_rows, argmax_merge, sample_rows
@group(0) @binding(3) var<storage, read_write> tokens: array<u32>;  // (out_offset + rows_cap,)
// softmax_rows
@group(0) @binding(3) var<storage, read_write> probs: array<f32>;   // (rows_cap, out_stride)
// argmax_parts: per (row, part), as u32 bits: best score, its id, the part's largest logit, its
// sum exp((x - that) / t) (0 when no confidence is wanted)
@group(0) @binding(3) var<storage, read_write> parts_out: array<vec4<u32>>;  // (rows_cap, parts)
// argmax_merge: argmax_parts' output
@group(0) @binding(2) var<storage, read> parts_in: array<vec4<u32>>;         // (rows_cap, parts)
// sample_pick: sample_parts' output (each part's exact fixed-point sum, a 128-bit integer)
@group(0) @binding(4) var<storage, read> cat_parts_in: array<vec4<u32>>;     // (rows_cap, parts)
// softmax_write: softmax_parts' output (each part's maximum and sum at it, as f32 bits)
@group(0) @binding(5) var<storage, read> softmax_parts_in: array<vec4<u32>>; // (rows_cap, parts)
// argmax_rows, argmax_merge, softmax_rows: the top probability of softmax(logits / T) (T = 1
// when greedy)
@group(0) @binding(4) var<storage, read_write> conf: array<f32>;    // (conf_offset + rows_cap,)
// rng_fill
@group(0) @binding(2) var<storage, read> keys: array<vec4<u32>>;    // (n, 2): (seed_lo, seed_hi,
                                                                    //  position, stream), (index)
@group(0) @binding(3) var<storage, read_write> bits: array<vec4<u32>>;  // (n,): (hash, uniform,
                                                                        //  gumbel, 0) as u32 bits

var<workgroup> red_v: array<f32, WG_ROW>;   // (WG_ROW,) per-thread maxima / sums / best scores
var<workgroup> red_m: array<f32, WG_ROW>;   // (WG_ROW,) per-thread max logit (the argmaxes)
var<workgroup> red_i: array<u32, WG_ROW>;   // (WG_ROW,) per-thread best token id, NONE if none

fn tree_max(tid: u32) -> f32 {
    for (var s = WG_ROW / 2u; s > 0u; s >>= 1u) {
        if (tid < s) { red_v[tid] = max(red_v[tid], red_v[tid + s]); }
        workgroupBarrier();
    }
    return red_v[0];
}

fn tree_sum(tid: u32) -> f32 {
    for (var s = WG_ROW / 2u; s > 0u; s >>= 1u) {
        if (tid < s) { red_v[tid] = red_v[tid] + red_v[tid + s]; }
        workgroupBarrier();
    }
    return red_v[0];
}

// softmax's denominator sum_i exp((x_i - mx) / t) over ids [begin, end) of the row at `base`,
// every thread taking part.
fn row_exp_sum(tid: u32, base: u32, begin: u32, end: u32, mx: f32, t: f32) -> f32 {
    var s = 0.0;
    for (var i = begin + tid; i < end; i += WG_ROW) {
        s += exp((src[base + i] - mx) / t);
    }
    workgroupBarrier();  // red_v may still be read by the previous tree's last step
    red_v[tid] = s;
    workgroupBarrier();
    return tree_sum(tid);
}

// A candidate of argmax_rows: its score and id (NONE: none yet), and the largest logit seen.
struct Best {
    v: f32,
    i: u32,
    m: f32,
}

// b if it beats a: a higher score, or an equal one at a lower id; m, the larger of the two.
fn better(a: Best, b: Best) -> Best {
    var out = a;
    if (b.i != NONE && (a.i == NONE || b.v > a.v || (b.v == a.v && b.i < a.i))) {
        out.v = b.v;
        out.i = b.i;
    }
    out.m = max(a.m, b.m);
    return out;
}

// Id i's score at `position`: its logit x in greedy mode or at T = 0, x / T + gumbel(seed,
// position, i) in replay (verify.sample_replay_rows with the noise of rng.gumbel).
fn choice_score(x: f32, i: u32, position: u32) -> f32 {
    let t = step.temperature;
    if (step.mode == MODE_REPLAY && t > 0.0) {
        return x / t + gumbel(step.seed_lo, step.seed_hi, position, i);
    }
    return x;
}

// This thread's best over ids begin + tid, begin + tid + WG_ROW, ... < end of the row at `base`:
// score = logits in greedy mode or at T = 0, logits / T + gumbel(seed, position, id) in replay.
fn scan(tid: u32, base: u32, begin: u32, end: u32, position: u32) -> Best {
    var b = Best(F32_LOWEST, NONE, F32_LOWEST);
    for (var i = begin + tid; i < end; i += WG_ROW) {
        let x = src[base + i];
        let score = choice_score(x, i, position);
        if (b.i == NONE || score > b.v) {  // ids ascend: strict > keeps the lowest
            b.v = score;
            b.i = i;
        }
        b.m = max(b.m, x);
    }
    return b;
}

// The workgroup's best of the threads' `b` (a fixed-shape tree), in every thread.
fn tree_best(tid: u32, b: Best) -> Best {
    workgroupBarrier();  // red_* may still be read by an earlier tree's last step
    red_v[tid] = b.v;
    red_i[tid] = b.i;
    red_m[tid] = b.m;
    workgroupBarrier();
    for (var s = WG_ROW / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            let c = better(Best(red_v[tid], red_i[tid], red_m[tid]),
                           Best(red_v[tid + s], red_i[tid + s], red_m[tid + s]));
            red_v[tid] = c.v;
            red_i[tid] = c.i;
            red_m[tid] = c.m;
        }
        workgroupBarrier();
    }
    return Best(red_v[0], red_i[0], red_m[0]);
}

// The temperature of the confidence's softmax: T, or 1 in greedy mode or at T = 0.
fn conf_temperature() -> f32 {
    return select(1.0, step.temperature, step.mode != MODE_GREEDY && step.temperature > 0.0);
}

// Per row: tokens[out_offset + r] = argmax_i score_i (ties to the lowest id), with
// score = logits in greedy mode or at T = 0, and logits / T + gumbel(seed, position, i) in
// replay mode (verify.sample_replay_rows with the noise of rng.gumbel); conf[conf_offset + r]
// = max_i softmax(logits / T)_i, at T = 1 in greedy mode or at T = 0, unless conf_offset is
// NONE (then the softmax's pass over the row is skipped). One workgroup per row (software
// adapters); argmax_parts + argmax_merge compute the same on a GPU.
@compute @workgroup_size(WG_ROW)
fn argmax_rows(@builtin(workgroup_id) wid: vec3<u32>,
               @builtin(local_invocation_index) tid: u32) {
    let r = wid.x;
    if (r >= step.rows || r >= params.rows_cap) { return; }
    let whole = scan_row(tid, r, 0u, params.vocab);
    store_choice(tid, r, whole.best.i, whole.sum);
}

// A scan of ids [begin, end) of row r by the workgroup: the best, and when a confidence is wanted
// (a draft's rows, not the champion's) sum exp((x - best.m) / t) over them (else 0).
struct Scanned {
    best: Best,
    sum: f32,
}

fn scan_row(tid: u32, r: u32, begin: u32, end: u32) -> Scanned {
    let base = params.in_offset + r * params.in_stride;
    let best = tree_best(tid, scan(tid, base, begin, end, row_position(r) + params.pos_shift));
    var sum = 0.0;
    if (params.conf_offset != NONE) {
        sum = row_exp_sum(tid, base, begin, end, best.m, conf_temperature());
    }
    return Scanned(best, sum);
}

// Row r's token and, when one is wanted, its confidence 1 / sum (thread 0 stores).
fn store_choice(tid: u32, r: u32, token: u32, sum: f32) {
    if (tid != 0u) { return; }
    tokens[params.out_offset + r] = token;
    if (params.conf_offset != NONE) {
        conf[params.conf_offset + r] = 1.0 / sum;
    }
}

fn argmax_n_parts() -> u32 {
    return (params.vocab + ARGMAX_CHUNK - 1u) / ARGMAX_CHUNK;
}

// argmax_rows' first half on a GPU: workgroup (c, r) takes ids [c, c + 1) * ARGMAX_CHUNK of row r.
@compute @workgroup_size(WG_ROW)
fn argmax_parts(@builtin(workgroup_id) wid: vec3<u32>,
                @builtin(local_invocation_index) tid: u32) {
    let r = wid.y;
    if (r >= step.rows || r >= params.rows_cap) { return; }
    let begin = wid.x * ARGMAX_CHUNK;
    let part = scan_row(tid, r, begin, min(begin + ARGMAX_CHUNK, params.vocab));
    let b = part.best;
    if (tid == 0u) {
        let bits = vec4<u32>(bitcast<u32>(b.v), b.i, bitcast<u32>(b.m), bitcast<u32>(part.sum));
        parts_out[r * argmax_n_parts() + wid.x] = bits;
    }
}

// argmax_rows' second half on a GPU: row r's parts, combined in part order (each thread its
// parts tid, tid + WG_ROW, ..., then the tree); the confidence's sum rescales each part's sum
// from its own maximum to the row's: sum_c s_c exp((m_c - M) / t).
@compute @workgroup_size(WG_ROW)
fn argmax_merge(@builtin(workgroup_id) wid: vec3<u32>,
                @builtin(local_invocation_index) tid: u32) {
    let r = wid.x;
    if (r >= step.rows || r >= params.rows_cap) { return; }
    let n = argmax_n_parts();
    var b = Best(F32_LOWEST, NONE, F32_LOWEST);
    for (var c = tid; c < n; c += WG_ROW) {
        let p = parts_in[r * n + c];
        b = better(b, Best(bitcast<f32>(p.x), p.y, bitcast<f32>(p.z)));
    }
    let best = tree_best(tid, b);
    var sum = 0.0;
    if (params.conf_offset != NONE) {
        let t = conf_temperature();
        var s = 0.0;
        for (var c = tid; c < n; c += WG_ROW) {
            let p = parts_in[r * n + c];
            s += bitcast<f32>(p.w) * exp((bitcast<f32>(p.z) - best.m) / t);
        }
        workgroupBarrier();  // the tree above is done with red_v
        red_v[tid] = s;
        workgroupBarrier();
        sum = tree_sum(tid);
    }
    store_choice(tid, r, best.i, sum);
}

fn softmax_temperature() -> f32 {
    return select(1.0, step.temperature, step.temperature > 0.0);
}

// Per row: probs[out_offset + r out_stride + i] = softmax(logits / T)_i (max-subtracted, as
// verify.softmax; T <= 0 is taken as 1), conf[conf_offset + r] = its largest entry, 1 / sum.
// One workgroup per row (software adapters); softmax_parts + softmax_write on a GPU.
@compute @workgroup_size(WG_ROW)
fn softmax_rows(@builtin(workgroup_id) wid: vec3<u32>,
                @builtin(local_invocation_index) tid: u32) {
    let r = wid.x;
    if (r >= step.rows || r >= params.rows_cap) { return; }
    let base = params.in_offset + r * params.in_stride;
    let t = softmax_temperature();
    var mx = F32_LOWEST;
    for (var i = tid; i < params.vocab; i += WG_ROW) {
        mx = max(mx, src[base + i]);
    }
    red_v[tid] = mx;
    workgroupBarrier();
    let row_max = tree_max(tid);
    let sum = row_exp_sum(tid, base, 0u, params.vocab, row_max, t);
    let out = params.out_offset + r * params.out_stride;
    for (var i = tid; i < params.vocab; i += WG_ROW) {
        probs[out + i] = exp((src[base + i] - row_max) / t) / sum;
    }
    if (tid == 0u) {
        conf[params.conf_offset + r] = 1.0 / sum;
    }
}

// softmax_rows' first half on a GPU: workgroup (c, r) takes ids [c, c + 1) * ARGMAX_CHUNK of row
// r: their largest logit m_c and sum exp((x - m_c) / T) (a part whose logits are all -inf has
// m_c = F32_LOWEST and sum 0).
@compute @workgroup_size(WG_ROW)
fn softmax_parts(@builtin(workgroup_id) wid: vec3<u32>,
                 @builtin(local_invocation_index) tid: u32) {
    let r = wid.y;
    if (r >= step.rows || r >= params.rows_cap) { return; }
    let base = params.in_offset + r * params.in_stride;
    let begin = wid.x * ARGMAX_CHUNK;
    let end = min(begin + ARGMAX_CHUNK, params.vocab);
    var mx = F32_LOWEST;
    for (var i = begin + tid; i < end; i += WG_ROW) {
        mx = max(mx, src[base + i]);
    }
    red_v[tid] = mx;
    workgroupBarrier();
    let part_max = tree_max(tid);
    let sum = row_exp_sum(tid, base, begin, end, part_max, softmax_temperature());
    if (tid == 0u) {
        parts_out[r * argmax_n_parts() + wid.x] = vec4<u32>(bitcast<u32>(part_max),
                                                            bitcast<u32>(sum), 0u, 0u);
    }
}

// softmax_rows' second half on a GPU: workgroup (c, r) writes the probabilities of part c of row
// r. Each thread first takes the row's maximum M and denominator sum_c s_c exp((m_c - M) / T)
// from the parts, in part order, so every workgroup of the row divides by the same bits.
@compute @workgroup_size(WG_ROW)
fn softmax_write(@builtin(workgroup_id) wid: vec3<u32>,
                 @builtin(local_invocation_index) tid: u32) {
    let r = wid.y;
    if (r >= step.rows || r >= params.rows_cap) { return; }
    let t = softmax_temperature();
    let n = argmax_n_parts();
    var row_max = F32_LOWEST;
    for (var c = 0u; c < n; c++) {
        row_max = max(row_max, bitcast<f32>(softmax_parts_in[r * n + c].x));
    }
    var sum = 0.0;
    for (var c = 0u; c < n; c++) {
        let p = softmax_parts_in[r * n + c];
        sum += bitcast<f32>(p.y) * exp((bitcast<f32>(p.x) - row_max) / t);
    }
    let base = params.in_offset + r * params.in_stride;
    let out = params.out_offset + r * params.out_stride;
    let begin = wid.x * ARGMAX_CHUNK;
    let end = min(begin + ARGMAX_CHUNK, params.vocab);
    for (var i = begin + tid; i < end; i += WG_ROW) {
        probs[out + i] = exp((src[base + i] - row_max) / t) / sum;
    }
    if (wid.x == 0u && tid == 0u) {
        conf[params.conf_offset + r] = 1.0 / sum;
    }
}

var<private> sample_base: u32;  // element index of the row sample_rows is sampling

fn cat_weight(i: u32) -> vec4<u32> {
    return fixed_from_f32(src[sample_base + i]);
}

// Per row: tokens[out_offset + r] = the first i whose cumulative probability exceeds u * total,
// u = uniform(seed, position, params.stream, 0): verify.sample_categorical_rows, exactly
// (categorical.wgsl). Rows need not be normalised; entries must lie in [0, 1].
@compute @workgroup_size(WG_ROW)
fn sample_rows(@builtin(workgroup_id) wid: vec3<u32>,
               @builtin(local_invocation_index) tid: u32) {
    let r = wid.x;
    if (r >= step.rows || r >= params.rows_cap) { return; }
    sample_base = params.in_offset + r * params.in_stride;
    let token = cat_sample(tid, params.vocab, sample_key(r));
    if (tid == 0u) {
        tokens[params.out_offset + r] = token;
    }
}

// Row r's uniform draw k (u = k 2^-24) at its position.
fn sample_key(r: u32) -> u32 {
    let position = step.pos + params.pos_shift + r;
    return hash_u32(step.seed_lo, step.seed_hi, position, params.stream, 0u) >> 8u;
}

// sample_rows' first half on a GPU: workgroup (c, r) sums the weights of ids
// [c, c + 1) * ARGMAX_CHUNK of row r, exactly (128-bit integers: categorical.wgsl).
@compute @workgroup_size(WG_ROW)
fn sample_parts(@builtin(workgroup_id) wid: vec3<u32>,
                @builtin(local_invocation_index) tid: u32) {
    let r = wid.y;
    if (r >= step.rows || r >= params.rows_cap) { return; }
    sample_base = params.in_offset + r * params.in_stride;
    let begin = wid.x * ARGMAX_CHUNK;
    let sum = cat_range_total(tid, begin, min(begin + ARGMAX_CHUNK, params.vocab));
    if (tid == 0u) {
        parts_out[r * argmax_n_parts() + wid.x] = sum;
    }
}

var<workgroup> pick_part: u32;             // the part where the row's sum crosses u * total
var<workgroup> pick_empty: u32;            // 1 when the row's weights are all 0 (token 0)
var<workgroup> pick_cum: vec4<u32>;        // the row's weight before that part
var<workgroup> pick_threshold: vec4<u32>;  // u * total, as cat_find takes it

// sample_rows' second half on a GPU, a workgroup per row: the part where the cumulative weight
// crosses u * total (from the parts' sums, in part order), then cat_find inside that part only.
@compute @workgroup_size(WG_ROW)
fn sample_pick(@builtin(workgroup_id) wid: vec3<u32>,
               @builtin(local_invocation_index) tid: u32) {
    let r = wid.x;
    if (r >= step.rows || r >= params.rows_cap) { return; }
    sample_base = params.in_offset + r * params.in_stride;
    let n = argmax_n_parts();
    if (tid == 0u) {
        var total = vec4<u32>(0u);
        for (var c = 0u; c < n; c++) {
            total = u128_add(total, cat_parts_in[r * n + c]);
        }
        let threshold = u128_mul_u32(total, sample_key(r));
        var cum = vec4<u32>(0u);
        var c = 0u;
        loop {
            let next = u128_add(cum, cat_parts_in[r * n + c]);
            if (u128_less(threshold, u128_shl24(next)) || c + 1u >= n) { break; }
            cum = next;
            c++;
        }
        pick_part = c;
        pick_empty = u32(u128_is_zero(total));
        pick_cum = cum;
        pick_threshold = threshold;
    }
    workgroupBarrier();
    let begin = pick_part * ARGMAX_CHUNK;
    let end = min(begin + ARGMAX_CHUNK, params.vocab);
    let chunk = cat_chunk_sums(tid, begin, end);
    if (tid == 0u) {
        var token = 0u;
        if (pick_empty == 0u) {
            token = cat_find(begin, end, chunk, pick_cum, pick_threshold);
        }
        tokens[params.out_offset + r] = token;
    }
}

// Tests only: the hash, uniform and Gumbel value of n keys, as raw bits.
@compute @workgroup_size(RNG_FILL_WG)
fn rng_fill(@builtin(global_invocation_id) gid: vec3<u32>) {
    _ = step.rows;  // binding 1 is part of every kernel's layout
    let i = gid.x;
    if (i >= params.n) { return; }
    let a = keys[2u * i];
    let index = keys[2u * i + 1u].x;
    let h = hash_u32(a.x, a.y, a.z, a.w, index);
    let u = rng_uniform(a.x, a.y, a.z, a.w, index);
    let g = gumbel(a.x, a.y, a.z, index);
    bits[i] = vec4<u32>(h, bitcast<u32>(u), bitcast<u32>(g), 0u);
}
