// The accept kernel: the rules of pyspec/verify.py applied on the GPU at the end of a cycle, so a
// cycle reads back only `out` (ACCEPT_WORDS u32). One workgroup of WG_ROW threads; host wrapper
// pyspec/gpu/sampling.py:accept. On a GPU, in rejection mode, the last token's exact sample over
// the vocabulary is spread over many workgroups as sample.wgsl's is (one workgroup sweeping
// 49,152 ids leaves the chip idle): accept_parts (a workgroup per ARGMAX_CHUNK ids: the exact
// sums of the residual's and of p_target's weights there) then accept_pick (one workgroup:
// accept's outputs, its sample searched inside the one part where the sum crosses). Both judge
// the drafts as accept does, from the same inputs, so they agree on the row; the token is the
// same as accept's.
//
// Step: n_draft = K (clamped to ROWS_MAX - 1), mode, seed, and pos with
// params.pos_shift: draft i is the token at position c + i, c = step.pos + pos_shift (the
// committed length; pos_shift = 0 for a slot with pos = c, 1 when sharing the champion pass's
// slot, whose pos is the KV row c - 1 of its first input token).
// Confidence stop: drafts from the first i with conf[i] < params.conf_threshold on were never
// proposed, so the cycle is verified as one with K_eff = that i drafts (bonus row K_eff, keys at
// c + K_eff). conf is what argmax_rows / softmax_rows wrote for the draft steps; threshold 0
// never stops (conf is then not read).
//
// Rules (verify.py), for i < K_eff:
//   greedy / replay: test_i = draft_i == champion_i; emit champion[0 .. n_accepted] (the
//       champion's tokens from argmax_rows: its argmax, or its Gumbel replay sample).
//   rejection: test_i = q_i > 0 && u_accept_i q_i < p_i, exactly (no rounding), where
//       p_i = p_target[i, d_i], q_i = q_draft[i, d_i] (1 with FLAG_ONE_HOT, q not read) and
//       u_accept_i = uniform(seed, c + i, STREAM_ACCEPT, 0); a draft id >= vocab fails.
//       At the first failure n: sample max(p_target[n] - q_draft[n], 0) with
//       uniform(seed, c + n, STREAM_RESIDUAL, 0), or p_target[n] itself if that residual is all
//       zero; if all K_eff pass: sample p_target[K_eff] with uniform(seed, c + K_eff,
//       STREAM_BONUS, 0). Sampling is exact (categorical.wgsl).
// n_accepted = the number of leading passed tests.
//
// out (ACCEPT_WORDS u32 words from params.out_offset; the offsets are sampling.py's ACCEPT_*):
//   [ACCEPT_N_ACCEPTED] n_accepted   [ACCEPT_K_EFF] K_eff   [ACCEPT_N_EMITTED] n_accepted + 1
//   [ACCEPT_HOW] how the last token was chosen: HOW_CHAMPION (greedy / replay), HOW_RESIDUAL,
//       HOW_EMPTY_RESIDUAL (p_target sampled because the residual was empty), HOW_BONUS
//   [ACCEPT_TOKENS + j] j < ROWS_MAX: emitted tokens (drafts[0 .. n_accepted), then the last),
//       NONE after
//   [ACCEPT_TESTS + i] i < ROWS_MAX: test_i for i < K_eff (1 pass / 0 fail, evaluated also after
//       the first failure, for statistics), NONE for i >= K_eff
//   [ACCEPT_P + i] i < ROWS_MAX: f32 bits of p_target[i, d_i] (rejection, i < K_eff; else 0)
//   [ACCEPT_Q + i] i < ROWS_MAX: f32 bits of q_draft[i, d_i] (likewise; 1.0 with FLAG_ONE_HOT)

//!include step.wgsl
//!include rng.wgsl
//!include categorical.wgsl

struct Params {
    vocab: u32,
    p_offset: u32,         // element index of p_target row 0
    p_stride: u32,         // elements between p_target rows
    q_offset: u32,         // element index of q_draft row 0
    q_stride: u32,         // elements between q_draft rows
    champion_offset: u32,  // index of the champion's row-0 token in `champion`
    draft_offset: u32,     // index of draft 0 in `drafts`
    conf_offset: u32,      // index of draft 0's confidence in `conf`
    conf_threshold: f32,
    pos_shift: u32,
    out_offset: u32,       // index of word 0 of the result in `out`
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> champion: array<u32>;  // (K+1,) argmax_rows tokens
@group(0) @binding(3) var<storage, read> p_target: array<f32>;  // (K+1, p_stride) softmax_rows
@group(0) @binding(4) var<storage, read> q_draft: array<f32>;   // (K, q_stride) softmax_rows
@group(0) @binding(5) var<storage, read> drafts: array<u32>;    // (K,) the drafted tokens
@group(0) @binding(6) var<storage, read> conf: array<f32>;      // (K,) the drafts' confidences
@group(0) @binding(7) var<storage, read_write> out: array<u32>; // (ACCEPT_WORDS,) see above
// accept_parts: per part, the exact sums of the residual's weights and of p_target's
@group(0) @binding(7) var<storage, read_write> parts_out: array<vec4<u32>>;  // (parts, 2)
// accept_pick: accept_parts' output
@group(0) @binding(8) var<storage, read> parts_in: array<vec4<u32>>;         // (parts, 2)

var<workgroup> tests: array<u32, ROWS_MAX>;  // (ROWS_MAX,) test_i, 1 pass / 0 fail
var<workgroup> residual_nonempty: atomic<u32>;

// The row sampled at the end, read by cat_weight: p_target row `row`, minus q_draft row `row`
// (or the one-hot row at `one_hot_token`) when `residual` is set.
var<private> row: u32;
var<private> residual: bool;
var<private> one_hot: bool;
var<private> one_hot_token: u32;

fn q_fixed(j: u32) -> vec4<u32> {
    if (one_hot) {
        return select(vec4<u32>(0u), fixed_from_f32(1.0), j == one_hot_token);
    }
    return fixed_from_f32(q_draft[params.q_offset + row * params.q_stride + j]);
}

fn cat_weight(j: u32) -> vec4<u32> {
    let p = fixed_from_f32(p_target[params.p_offset + row * params.p_stride + j]);
    if (!residual) { return p; }
    let q = q_fixed(j);
    return select(vec4<u32>(0u), u128_sub(p, q), u128_less(q, p));  // max(p - q, 0)
}

// f32 v >= 0 as (mantissa, exponent): v = m 2^e exactly; m = 0 for 0 (and for inf / NaN).
fn split_f32(v: f32) -> vec2<i32> {
    let bits = bitcast<u32>(v) & 0x7fffffffu;
    let e_bits = bits >> 23u;
    if (e_bits == 0xffu) { return vec2<i32>(0, 0); }
    if (e_bits == 0u) { return vec2<i32>(i32(bits), -149); }
    return vec2<i32>(i32((bits & 0x7fffffu) | 0x800000u), i32(e_bits) - 150);
}

fn bit_length(x: u32) -> i32 {
    return 32 - i32(countLeadingZeros(x));
}

// (lo, hi) << s, for a result below 2^64.
fn shl64(v: vec2<u32>, s: u32) -> vec2<u32> {
    if (s == 0u) { return v; }
    if (s >= 32u) { return vec2<u32>(0u, v.x << (s - 32u)); }
    return vec2<u32>(v.x << s, (v.y << s) | (v.x >> (32u - s)));
}

fn less64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.y < b.y || (a.y == b.y && a.x < b.x);
}

// Is (k 2^-24) q < p, exactly as in float64 (where the product of two 24-bit values is exact)?
// k < 2^24; p, q >= 0. Compares k m_q 2^(e_q - 24) with m_p 2^e_p as integers.
fn u_times_q_less_p(k: u32, q: f32, p: f32) -> bool {
    let sq = split_f32(q);
    let sp = split_f32(p);
    if (sp.x == 0) { return false; }
    if (k == 0u || sq.x == 0) { return true; }
    let a = mul_wide(k, u32(sq.x));  // < 2^48
    let na = select(bit_length(a.x), 32 + bit_length(a.y), a.y != 0u);
    let nb = bit_length(u32(sp.x));
    let top_a = na + sq.y - 24;  // bit length of the value, in units of 2^0
    let top_b = nb + sp.y;
    if (top_a != top_b) { return top_a < top_b; }
    let b = vec2<u32>(u32(sp.x), 0u);
    if (na >= nb) { return less64(a, shl64(b, u32(na - nb))); }
    return less64(shl64(a, u32(nb - na)), b);
}

// K_eff: the drafts before the first whose confidence is under the threshold.
fn effective_k() -> u32 {
    let k = min(step.n_draft, ROWS_MAX - 1u);
    if (params.conf_threshold > 0.0) {
        for (var i = 0u; i < k; i++) {
            if (conf[params.conf_offset + i] < params.conf_threshold) { return i; }
        }
    }
    return k;
}

// What the drafts' tests decided (judge), the same in every workgroup that asks.
struct Verdict {
    k_eff: u32,
    n: u32,          // the leading passed tests: n_accepted
    test: u32,       // this thread's test (tid < ROWS_MAX), its p and q (rejection; else 0)
    p: f32,
    q: f32,
}

// One thread per draft position takes its test; then every thread counts the leading passes.
// Call from uniform control flow (one barrier).
fn judge(tid: u32) -> Verdict {
    let k_eff = effective_k();
    let c = step.pos + params.pos_shift;
    var v = Verdict(k_eff, 0u, 0u, 0.0, 0.0);
    if (tid < ROWS_MAX) {
        if (tid < k_eff) {
            let d = drafts[params.draft_offset + tid];
            if (step.mode != MODE_REJECTION) {
                v.test = u32(d == champion[params.champion_offset + tid]);
            } else if (d < params.vocab) {
                v.p = p_target[params.p_offset + tid * params.p_stride + d];
                v.q = 1.0;
                if (!one_hot) { v.q = q_draft[params.q_offset + tid * params.q_stride + d]; }
                let u = hash_u32(step.seed_lo, step.seed_hi, c + tid, STREAM_ACCEPT, 0u) >> 8u;
                v.test = u32(v.q > 0.0 && u_times_q_less_p(u, v.q, v.p));
            }
        }
        tests[tid] = v.test;
    }
    workgroupBarrier();
    while (v.n < k_eff && tests[v.n] == 1u) { v.n++; }
    return v;
}

// Rejection: the row cat_weight reads for the last token (the first failure's residual, or the
// bonus row's p_target).
fn choose_row(v: Verdict) {
    row = v.n;
    residual = v.n < v.k_eff;
    one_hot_token = drafts[params.draft_offset + min(v.n, ROWS_MAX - 2u)];
}

// The last token's uniform draw k (u = k 2^-24): at position c + n, on the stream of its kind.
fn last_key(n: u32, stream: u32) -> u32 {
    return hash_u32(step.seed_lo, step.seed_hi, step.pos + params.pos_shift + n, stream, 0u) >> 8u;
}

// accept's outputs (thread tid < ROWS_MAX writes its words; thread 0 the counts).
fn write_out(tid: u32, v: Verdict, last: u32, how: u32) {
    if (tid < ROWS_MAX) {
        out[params.out_offset + ACCEPT_TESTS + tid] = select(NONE, v.test, tid < v.k_eff);
        out[params.out_offset + ACCEPT_P + tid] = bitcast<u32>(v.p);
        out[params.out_offset + ACCEPT_Q + tid] = bitcast<u32>(v.q);
        var token = NONE;
        if (tid < v.n) { token = drafts[params.draft_offset + tid]; }
        if (tid == v.n) { token = last; }
        out[params.out_offset + ACCEPT_TOKENS + tid] = token;
    }
    if (tid == 0u) {
        out[params.out_offset + ACCEPT_N_ACCEPTED] = v.n;
        out[params.out_offset + ACCEPT_K_EFF] = v.k_eff;
        out[params.out_offset + ACCEPT_N_EMITTED] = v.n + 1u;
        out[params.out_offset + ACCEPT_HOW] = how;
    }
}

@compute @workgroup_size(WG_ROW)
fn accept(@builtin(local_invocation_index) tid: u32) {
    one_hot = (step.flags & FLAG_ONE_HOT) != 0u;
    if (tid == 0u) { atomicStore(&residual_nonempty, 0u); }
    let v = judge(tid);
    var last: u32;
    var how = HOW_CHAMPION;
    if (step.mode != MODE_REJECTION) {
        last = champion[params.champion_offset + v.n];
    } else {  // uniform: step is a uniform buffer; every thread reaches both barriers below
        choose_row(v);
        // verify.py: the residual is all zero only when p_target[n] == q_draft[n]; sample p then.
        if (residual) {
            var found = false;
            for (var j = tid; j < params.vocab && !found; j += WG_ROW) {
                found = !u128_is_zero(cat_weight(j));
            }
            if (found) { atomicOr(&residual_nonempty, 1u); }
        }
        workgroupBarrier();
        var stream = STREAM_BONUS;
        how = HOW_BONUS;
        if (residual) {
            stream = STREAM_RESIDUAL;
            how = HOW_RESIDUAL;
            if (atomicLoad(&residual_nonempty) == 0u) {
                residual = false;
                how = HOW_EMPTY_RESIDUAL;
            }
        }
        last = cat_sample(tid, params.vocab, last_key(v.n, stream));
    }
    write_out(tid, v, last, how);
}

fn accept_n_parts() -> u32 {
    return (params.vocab + ARGMAX_CHUNK - 1u) / ARGMAX_CHUNK;
}

// Rejection on a GPU, first half: workgroup c sums the weights of ids [c, c + 1) * ARGMAX_CHUNK
// of the last token's row, exactly: the residual's (0 for a bonus row) and p_target's.
@compute @workgroup_size(WG_ROW)
fn accept_parts(@builtin(workgroup_id) wid: vec3<u32>,
                @builtin(local_invocation_index) tid: u32) {
    one_hot = (step.flags & FLAG_ONE_HOT) != 0u;
    let v = judge(tid);
    choose_row(v);
    let begin = wid.x * ARGMAX_CHUNK;
    let end = min(begin + ARGMAX_CHUNK, params.vocab);
    // Both sums every time (no barrier under the verdict); accept_pick reads the residual's only
    // for a residual row.
    let residual_sum = cat_range_total(tid, begin, end);
    residual = false;
    let p_sum = cat_range_total(tid, begin, end);
    if (tid == 0u) {
        parts_out[2u * wid.x] = residual_sum;
        parts_out[2u * wid.x + 1u] = p_sum;
    }
}

var<workgroup> pick_part: u32;             // the part where the row's sum crosses u * total
var<workgroup> pick_cum: vec4<u32>;        // the row's weight before that part
var<workgroup> pick_threshold: vec4<u32>;  // u * total, as cat_find takes it
var<workgroup> pick_how: u32;

// Rejection on a GPU, second half (one workgroup): the verdict again, the residual's emptiness
// and the sample from the parts' sums (part order), the search inside the crossing part only,
// and accept's outputs.
@compute @workgroup_size(WG_ROW)
fn accept_pick(@builtin(local_invocation_index) tid: u32) {
    one_hot = (step.flags & FLAG_ONE_HOT) != 0u;
    let v = judge(tid);
    choose_row(v);
    let n_parts = accept_n_parts();
    if (tid == 0u) {
        var stream = STREAM_BONUS;
        var how = HOW_BONUS;
        var which = 1u;   // the parts' word: 0 the residual's sums, 1 p_target's
        if (residual) {
            var total = vec4<u32>(0u);
            for (var c = 0u; c < n_parts; c++) { total = u128_add(total, parts_in[2u * c]); }
            stream = STREAM_RESIDUAL;
            how = HOW_RESIDUAL;
            which = 0u;
            if (u128_is_zero(total)) {   // verify.py: an all-zero residual samples p_target
                how = HOW_EMPTY_RESIDUAL;
                which = 1u;
            }
        }
        var total = vec4<u32>(0u);
        for (var c = 0u; c < n_parts; c++) { total = u128_add(total, parts_in[2u * c + which]); }
        let threshold = u128_mul_u32(total, last_key(v.n, stream));
        var cum = vec4<u32>(0u);
        var c = 0u;
        loop {
            let next = u128_add(cum, parts_in[2u * c + which]);
            if (u128_less(threshold, u128_shl24(next)) || c + 1u >= n_parts) { break; }
            cum = next;
            c++;
        }
        pick_part = c;
        pick_cum = cum;
        pick_threshold = threshold;
        pick_how = how;
    }
    workgroupBarrier();
    residual = pick_how == HOW_RESIDUAL;
    let begin = pick_part * ARGMAX_CHUNK;
    let end = min(begin + ARGMAX_CHUNK, params.vocab);
    let chunk = cat_chunk_sums(tid, begin, end);
    if (tid == 0u) {
        cat_result = cat_find(begin, end, chunk, pick_cum, pick_threshold);
    }
    workgroupBarrier();
    write_out(tid, v, cat_result, pick_how);
}
