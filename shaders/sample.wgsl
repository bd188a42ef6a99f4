// Per-row token choice from logits or probabilities: argmax (greedy / Gumbel replay),
// softmax with temperature, and exact inverse-CDF sampling; plus `rng_fill`, which exposes the
// hash to the tests. Host wrappers: pyspec/gpu/sampling.py (one per entry point).
//
// Every per-row kernel runs one workgroup of WG_ROW threads per row, dispatched for
// params.rows_cap rows; workgroups of rows >= step.rows exit at once, so one dispatch list serves
// every pass. Threads stride the vocabulary (i = tid, tid + WG_ROW, ...), then a fixed-shape tree
// in workgroup memory combines them: the result of a row never depends on how many rows the pass
// has.
// Random keys: row r draws at position step.pos + params.pos_shift + r (pos_shift = 1 when the
// step is the forward's, whose row r sits at KV row pos + r and predicts the token after it).

//!include step.wgsl
//!include rng.wgsl
//!include categorical.wgsl

const F32_LOWEST: f32 = -0x1.fffffep+127f;  // -FLT_MAX

struct Params {
    vocab: u32,        // entries per row
    rows_cap: u32,     // rows the buffers hold; the dispatch size
    in_offset: u32,    // element index of row 0 of the input
    in_stride: u32,    // elements between input rows
    out_offset: u32,   // argmax/sample: index of row 0's token; softmax: element of row 0's probs
    out_stride: u32,   // softmax: elements between output rows
    conf_offset: u32,  // index of row 0's confidence
    pos_shift: u32,    // see above
    stream: u32,       // sample_rows: the rng stream (rng.STREAM_DRAFT for a drafter)
    n: u32,            // rng_fill: number of keys
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<uniform> step: Step;
// argmax_rows, softmax_rows: logits; sample_rows: probabilities.
@group(0) @binding(2) var<storage, read> src: array<f32>;           // (rows_cap, in_stride)
// argmax_rows, sample_rows
@group(0) @binding(3) var<storage, read_write> tokens: array<u32>;  // (out_offset + rows_cap,)
// softmax_rows
@group(0) @binding(3) var<storage, read_write> probs: array<f32>;   // (rows_cap, out_stride)
// argmax_rows, softmax_rows: the top probability of softmax(logits / T) (T = 1 when greedy)
@group(0) @binding(4) var<storage, read_write> conf: array<f32>;    // (conf_offset + rows_cap,)
// rng_fill
@group(0) @binding(2) var<storage, read> keys: array<vec4<u32>>;    // (n, 2): (seed_lo, seed_hi,
                                                                    //  position, stream), (index)
@group(0) @binding(3) var<storage, read_write> bits: array<vec4<u32>>;  // (n,): (hash, uniform,
                                                                        //  gumbel, 0) as u32 bits

var<workgroup> red_v: array<f32, WG_ROW>;   // (WG_ROW,) per-thread maxima / sums / best scores
var<workgroup> red_m: array<f32, WG_ROW>;   // (WG_ROW,) per-thread max logit (argmax_rows)
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

// softmax's denominator sum_i exp((x_i - mx) / t) over row `base`, every thread taking part.
fn row_exp_sum(tid: u32, base: u32, mx: f32, t: f32) -> f32 {
    var s = 0.0;
    for (var i = tid; i < params.vocab; i += WG_ROW) {
        s += exp((src[base + i] - mx) / t);
    }
    workgroupBarrier();  // red_v may still be read by the previous tree's last step
    red_v[tid] = s;
    workgroupBarrier();
    return tree_sum(tid);
}

// Per row: tokens[out_offset + r] = argmax_i score_i (ties to the lowest id), with
// score = logits in greedy mode or at T = 0, and logits / T + gumbel(seed, position, i) in
// replay mode (verify.sample_replay_rows with the noise of rng.gumbel); conf[conf_offset + r]
// = max_i softmax(logits / T)_i, at T = 1 in greedy mode or at T = 0, unless conf_offset is
// NONE (then the softmax's pass over the row is skipped).
@compute @workgroup_size(WG_ROW)
fn argmax_rows(@builtin(workgroup_id) wid: vec3<u32>,
               @builtin(local_invocation_index) tid: u32) {
    let r = wid.x;
    if (r >= step.rows || r >= params.rows_cap) { return; }
    let base = params.in_offset + r * params.in_stride;
    let t = step.temperature;
    let replay = step.mode == MODE_REPLAY && t > 0.0;
    let position = step.pos + params.pos_shift + r;
    var best = F32_LOWEST;
    var best_i = NONE;
    var mx = F32_LOWEST;
    for (var i = tid; i < params.vocab; i += WG_ROW) {
        let x = src[base + i];
        var score = x;
        if (replay) { score = x / t + gumbel(step.seed_lo, step.seed_hi, position, i); }
        if (best_i == NONE || score > best) {  // ids ascend: strict > keeps the lowest
            best = score;
            best_i = i;
        }
        mx = max(mx, x);
    }
    red_v[tid] = best;
    red_i[tid] = best_i;
    red_m[tid] = mx;
    workgroupBarrier();
    for (var s = WG_ROW / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            let a_i = red_i[tid];
            let b_i = red_i[tid + s];
            let b = red_v[tid + s];
            if (b_i != NONE && (a_i == NONE || b > red_v[tid] || (b == red_v[tid] && b_i < a_i))) {
                red_v[tid] = b;
                red_i[tid] = b_i;
            }
            red_m[tid] = max(red_m[tid], red_m[tid + s]);
        }
        workgroupBarrier();
    }
    let token = red_i[0];
    if (params.conf_offset == NONE) {  // no confidence wanted (the champion's rows): done
        if (tid == 0u) {
            tokens[params.out_offset + r] = token;
        }
        return;
    }
    let row_max = red_m[0];
    let sum = row_exp_sum(tid, base, row_max, select(1.0, t, step.mode != MODE_GREEDY && t > 0.0));
    if (tid == 0u) {
        tokens[params.out_offset + r] = token;
        conf[params.conf_offset + r] = 1.0 / sum;
    }
}

// Per row: probs[out_offset + r out_stride + i] = softmax(logits / T)_i (max-subtracted, as
// verify.softmax; T <= 0 is taken as 1), conf[conf_offset + r] = its largest entry, 1 / sum.
@compute @workgroup_size(WG_ROW)
fn softmax_rows(@builtin(workgroup_id) wid: vec3<u32>,
                @builtin(local_invocation_index) tid: u32) {
    let r = wid.x;
    if (r >= step.rows || r >= params.rows_cap) { return; }
    let base = params.in_offset + r * params.in_stride;
    let t = select(1.0, step.temperature, step.temperature > 0.0);
    var mx = F32_LOWEST;
    for (var i = tid; i < params.vocab; i += WG_ROW) {
        mx = max(mx, src[base + i]);
    }
    red_v[tid] = mx;
    workgroupBarrier();
    let row_max = tree_max(tid);
    let sum = row_exp_sum(tid, base, row_max, t);
    let out = params.out_offset + r * params.out_stride;
    for (var i = tid; i < params.vocab; i += WG_ROW) {
        probs[out + i] = exp((src[base + i] - row_max) / t) / sum;
    }
    if (tid == 0u) {
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
    let position = step.pos + params.pos_shift + r;
    let k = hash_u32(step.seed_lo, step.seed_hi, position, params.stream, 0u) >> 8u;
    let token = cat_sample(tid, params.vocab, k);
    if (tid == 0u) {
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
