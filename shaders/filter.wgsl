// The JSON-schema mask and the filters top_k, top_p, min_p on the device (pyspec/jsonmask.py
// JsonMask, pyspec/processors.py Filters), in place on the champion's logits rows, so that a
// request with them keeps the 68-word accept readback. Runs after penalize_rows (the penalties
// are elementwise and leave an excluded token excluded, so masking after them equals the host's
// mask-first order) and before the champion's choices (argmax_rows, softmax_rows).
//
// An excluded token's logit becomes F32_LOWEST (-FLT_MAX, a finite stand-in for the host's
// -inf that every adapter handles): its softmax weight exp((F32_LOWEST - max) / T) is 0, its
// Gumbel score never beats an allowed token's, and greedy argmax never picks it.
// Per row r, in this order (each step on the survivors of the one before):
//   mask   token i is excluded where bit i of mask row r is 0 (word i / 32, bit i % 32: the
//          little-order packed bits of jsonmask.Mask); params.mask_words = 0: no mask.
//   then, only at T = step.temperature > 0 (the host skips the filters at T = 0 too):
//   top_k  keeps the k largest logits, ties to the lower id: a radix selection over the f32
//          bit patterns (as an order-preserving u32, -0 taken as +0; 4 passes of 8-bit digits
//          with workgroup histograms) finds the k-th largest value, then the lowest-id tokens
//          equal to it are kept up to k. Comparisons only: the host's set exactly.
//   top_p  on the weights e_i = exp((x_i - max) / T) (f32, as softmax_rows computes them; the
//          excluded have e = 0): the shortest prefix of the tokens ordered by e descending, ties
//          to the lower id, whose mass reaches top_p of the total, with the masses summed
//          exactly (categorical.wgsl's fixed point, e 2^80 as integers) and compared exactly as
//          cum 2^24 >= total K, K = params.top_p = floor(top_p 2^24). Sort-free: a radix
//          selection over e's bit patterns (each digit's mass summed exactly) finds the last
//          kept value tau (the largest with mass(e >= tau) reaching the goal); every e > tau is
//          kept, and the tokens with e = tau in id order while the mass before them is short of
//          the goal. Needs vocab <= 2^20 (sampling.TOP_P_VOCAB_MAX).
//   min_p  keeps e_i >= params.min_p (f32): p_i >= min_p max(p), since max(e) = 1 exactly.
// Ties and rounding: top_k and the mask are comparisons, equal to the host's sets bit for bit.
// top_p and min_p decide on the f32 weights: their sets equal the host's (float64 softmax and
// cumsum) except where a boundary lies within float32 rounding of the decision; the numpy
// mirror of these rules (tests/test_gpu_sampling.py) gives the same sets from the same weights.
// The GPU's own champion-only run is its reference, as for the rest of its arithmetic.
//
// filter_rows here is one workgroup per row: the software adapters' kernel. On a GPU that
// leaves the chip idle (on the H200 it added 1.4 ms to a 1.5 ms cycle at 49,152 logits a row),
// so there the same steps run split over each row (filter_split.wgsl: ten dispatches of a
// workgroup per ARGMAX_CHUNK ids), with the same logits and weights bit for bit: each level's
// histogram becomes the row's, summed by atomics from every part (integers, so their order
// does not matter), and every decision is the same comparison of the same integers. The
// helpers below (a thread's steps on its own ids) are both kernels' one copy of the rules.
// Host wrappers: pyspec/gpu/sampling.py (filter_params, set_filters, filter_rows).

//!include step.wgsl
//!include categorical.wgsl

const F32_LOWEST: f32 = -0x1.fffffep+127f;  // -FLT_MAX: "excluded"

struct Params {
    vocab: u32,       // entries per row
    rows_cap: u32,    // rows the buffers hold; the dispatch size
    mask_words: u32,  // u32 words per mask row, 0 = no mask
    top_k: u32,       // 0 = off (and k >= vocab keeps every token)
    top_p: u32,       // floor(top_p 2^24), in [1, 2^24]; 2^24 = off
    min_p: f32,       // 0 = off
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read_write> logits: array<f32>;   // (rows_cap, vocab)
@group(0) @binding(3) var<storage, read> mask: array<u32>;           // (rows_cap, mask_words)
@group(0) @binding(4) var<storage, read_write> weights: array<f32>;  // (rows_cap, vocab) e_i

const RADIX: u32 = 256u;    // radix selection: 4 passes of 8-bit digits, most significant first
const LIMBS: u32 = 7u;      // a weight's fixed point (< 2^81) in 12-bit pieces: each digit's
const LIMB_BITS: u32 = 12u; // sum of a piece stays below 2^32 for vocab <= 2^20
const TOP_K: u32 = 0u;      // which selection a helper serves: top_k ranks the logits,
const TOP_P: u32 = 1u;      // top_p the weights

var<workgroup> hist_n: array<atomic<u32>, RADIX>;           // (RADIX,) keys per digit
var<workgroup> hist_m: array<atomic<u32>, RADIX * LIMBS>;   // (RADIX, LIMBS) mass per digit
var<workgroup> chosen: vec2<u32>;                           // the digit chosen, and a count
var<workgroup> chosen_mass: vec4<u32>;                      // ... and a mass
var<workgroup> red_u: array<u32, WG_ROW>;   // (WG_ROW,) per-thread counts
var<workgroup> red_f: array<f32, WG_ROW>;   // (WG_ROW,) per-thread maxima
var<private> w_base: u32;                   // element index of the row's weights

// categorical.wgsl's hook: entry i of the row's weights as fixed point.
fn cat_weight(i: u32) -> vec4<u32> {
    return fixed_from_f32(weights[w_base + i]);
}

// The order of f32 values as u32 (larger value, larger key); -0 is +0, as the host compares.
fn order_key(x: f32) -> u32 {
    var b = bitcast<u32>(x);
    if (b == 0x80000000u) { b = 0u; }
    return select(b | 0x80000000u, ~b, (b >> 31u) != 0u);
}

// The key a selection ranks element `at` by: top_k the logit's order key, top_p the weight's
// bits (non-negative floats order as their bits).
fn key_of(f: u32, at: u32) -> u32 {
    if (f == TOP_K) { return order_key(logits[at]); }
    return bitcast<u32>(weights[at]);
}

// The digit of a key at radix level l (l = 0: the top 8 bits), and whether a key shares the
// digits of `prefix` that the levels before l chose.
fn digit(key: u32, level: u32) -> u32 {
    return (key >> (24u - 8u * level)) & 0xffu;
}

fn in_range(key: u32, prefix: u32, level: u32) -> bool {
    if (level == 0u) { return true; }
    let shift = 32u - 8u * level;
    return (key >> shift) == (prefix >> shift);
}

// Bits [LIMB_BITS j, LIMB_BITS (j + 1)) of a 128-bit value, and v 2^o as a 128-bit value (o <= 72).
fn limb(f: vec4<u32>, j: u32) -> u32 {
    let o = LIMB_BITS * j;
    let w = o >> 5u;
    let s = o & 31u;
    var v = f[w] >> s;
    if (s + LIMB_BITS > 32u) { v |= f[w + 1u] << (32u - s); }
    return v & ((1u << LIMB_BITS) - 1u);
}

fn placed(v: u32, o: u32) -> vec4<u32> {
    let w = o >> 5u;
    let s = o & 31u;
    let lo = v << s;
    let hi = select(0u, v >> (32u - s), s != 0u);
    return vec4<u32>(select(0u, lo, w == 0u),
                     select(0u, lo, w == 1u) | select(0u, hi, w == 0u),
                     select(0u, lo, w == 2u) | select(0u, hi, w == 1u),
                     select(0u, lo, w == 3u) | select(0u, hi, w == 2u));
}

// Exact sum of 128-bit values over the workgroup, in cat_sums.
fn sum_u128(tid: u32, v: vec4<u32>) -> vec4<u32> {
    workgroupBarrier();
    cat_sums[tid] = v;
    workgroupBarrier();
    for (var s = WG_ROW / 2u; s > 0u; s >>= 1u) {
        if (tid < s) { cat_sums[tid] = u128_add(cat_sums[tid], cat_sums[tid + s]); }
        workgroupBarrier();
    }
    return cat_sums[0];
}

// How many tokens of the lower chunks count `v` (each thread's own count): an exclusive prefix.
fn before_me(tid: u32, v: u32) -> u32 {
    workgroupBarrier();
    red_u[tid] = v;
    workgroupBarrier();
    var s = 0u;
    for (var t = 0u; t < tid; t++) { s += red_u[t]; }
    return s;
}

// --- the steps on one thread's ids [lo, hi) of the row at element `base`, shared with the
// split kernels (filter_split.wgsl) ---
fn mask_ids(r: u32, base: u32, lo: u32, hi: u32) {
    if (params.mask_words == 0u) { return; }
    let m = r * params.mask_words;
    for (var i = lo; i < hi; i++) {
        if (((mask[m + (i >> 5u)] >> (i & 31u)) & 1u) == 0u) { logits[base + i] = F32_LOWEST; }
    }
}

// hist_n[d] += the keys of selection f with digit d at `level` in the range of `prefix`.
fn count_keys(f: u32, base: u32, lo: u32, hi: u32, prefix: u32, level: u32) {
    for (var i = lo; i < hi; i++) {
        let key = key_of(f, base + i);
        if (in_range(key, prefix, level)) { atomicAdd(&hist_n[digit(key, level)], 1u); }
    }
}

// hist_m[d] += the weights (fixed point, 12-bit pieces) of the keys with digit d at `level` in
// the range of `prefix` (top_p's exact mass per digit).
fn weigh_keys(base: u32, lo: u32, hi: u32, prefix: u32, level: u32) {
    for (var i = lo; i < hi; i++) {
        let key = key_of(TOP_P, base + i);
        if (in_range(key, prefix, level)) {
            let f = fixed_from_f32(weights[base + i]);
            let at = digit(key, level) * LIMBS;
            for (var j = 0u; j < LIMBS; j++) {
                let piece = limb(f, j);
                if (piece != 0u) { atomicAdd(&hist_m[at + j], piece); }
            }
        }
    }
}

fn equal_keys(f: u32, base: u32, lo: u32, hi: u32, key: u32) -> u32 {
    var n = 0u;
    for (var i = lo; i < hi; i++) { n += u32(key_of(f, base + i) == key); }
    return n;
}

// top_k's cut: keys above kth stay, and keys equal to it while fewer than `need` of them come
// before (rank_lo of them before lo).
fn cut_top_k(base: u32, lo: u32, hi: u32, kth: u32, need: u32, rank_lo: u32) {
    var rank = rank_lo;
    for (var i = lo; i < hi; i++) {
        let key = order_key(logits[base + i]);
        var keep = key > kth;
        if (key == kth) {
            keep = rank < need;
            rank++;
        }
        if (!keep) { logits[base + i] = F32_LOWEST; }
    }
}

// e_i = exp((x_i - max) / T), 0 where excluded.
fn write_weights(base: u32, lo: u32, hi: u32, row_max: f32, t: f32) {
    for (var i = lo; i < hi; i++) {
        let x = logits[base + i];
        weights[base + i] = select(0.0, exp((x - row_max) / t), x > F32_LOWEST);
    }
}

// top_p's cut: weights above tau stay, and those equal to it while the mass before them (all
// above tau, then the ties before: rank_lo of them before lo) is short of the goal.
fn cut_top_p(base: u32, lo: u32, hi: u32, tau: u32, mass_above: vec4<u32>, goal: vec4<u32>,
             rank_lo: u32) {
    let tie_weight = fixed_from_f32(bitcast<f32>(tau));
    var rank = rank_lo;
    for (var i = lo; i < hi; i++) {
        let b = bitcast<u32>(weights[base + i]);
        var keep = b > tau;
        if (b == tau) {
            let cum = u128_add(mass_above, u128_mul_u32(tie_weight, rank));
            keep = u128_less(u128_shl24(cum), goal);
            rank++;
        }
        if (!keep) {
            logits[base + i] = F32_LOWEST;
            weights[base + i] = 0.0;
        }
    }
}

fn cut_min_p(base: u32, lo: u32, hi: u32) {
    for (var i = lo; i < hi; i++) {
        if (weights[base + i] < params.min_p) { logits[base + i] = F32_LOWEST; }
    }
}

// Thread tid owns the contiguous chunk [lo, hi) of the row throughout, so no thread reads an
// element another wrote: the steps share only workgroup reductions.
@compute @workgroup_size(WG_ROW)
fn filter_rows(@builtin(workgroup_id) wid: vec3<u32>,
               @builtin(local_invocation_index) tid: u32) {
    let r = wid.x;
    if (r >= step.rows || r >= params.rows_cap) { return; }
    let n = params.vocab;
    let base = r * n;
    w_base = base;
    let chunk = (n + WG_ROW - 1u) / WG_ROW;
    let lo = min(tid * chunk, n);
    let hi = min(lo + chunk, n);

    mask_ids(r, base, lo, hi);
    let t = step.temperature;
    if (t <= 0.0) { return; }  // uniform: step is a uniform buffer

    // --- top_k: the k-th largest key, by radix selection (the largest v with #(key >= v) >= k),
    // and how many keys lie above it ---
    let k = params.top_k;
    if (k > 0u && k < n) {
        var kth = 0u;
        var above = 0u;   // keys above the range of the digits chosen so far
        for (var level = 0u; level < 4u; level++) {
            for (var b = tid; b < RADIX; b += WG_ROW) { atomicStore(&hist_n[b], 0u); }
            workgroupBarrier();
            count_keys(TOP_K, base, lo, hi, kth, level);
            workgroupBarrier();
            if (tid == 0u) {   // the highest digit whose count reaches k, with those above it
                var a = above;
                var d = RADIX - 1u;
                loop {
                    let c = atomicLoad(&hist_n[d]);
                    if (a + c >= k || d == 0u) { break; }
                    a += c;
                    d--;
                }
                chosen = vec2<u32>(d, a);
            }
            workgroupBarrier();
            kth |= chosen.x << (24u - 8u * level);
            above = chosen.y;
            workgroupBarrier();   // chosen and the histogram are rewritten by the next level
        }
        // ties kept, lowest ids first: need = k - above >= 1
        cut_top_k(base, lo, hi, kth, k - above,
                  before_me(tid, equal_keys(TOP_K, base, lo, hi, kth)));
    }

    if (params.top_p >= 0x1000000u && params.min_p <= 0.0) { return; }
    // --- the weights e_i = exp((x_i - max) / T), 0 where excluded ---
    var mx = F32_LOWEST;
    for (var i = lo; i < hi; i++) { mx = max(mx, logits[base + i]); }
    workgroupBarrier();
    red_f[tid] = mx;
    workgroupBarrier();
    for (var s = WG_ROW / 2u; s > 0u; s >>= 1u) {
        if (tid < s) { red_f[tid] = max(red_f[tid], red_f[tid + s]); }
        workgroupBarrier();
    }
    write_weights(base, lo, hi, red_f[0], t);

    // --- top_p ---
    if (params.top_p < 0x1000000u) {
        var own = vec4<u32>(0u);
        for (var i = lo; i < hi; i++) { own = u128_add(own, cat_weight(i)); }
        let total = sum_u128(tid, own);
        let goal = u128_mul_u32(total, params.top_p);   // reached when cum 2^24 >= goal
        // tau: the largest bit pattern v with mass(e >= v) 2^24 >= goal (v = 0 always has it:
        // the mass is the total and top_p <= 1), by radix selection over the weights' bits,
        // with each digit's mass summed exactly in 12-bit pieces by workgroup atomics;
        // mass_above = mass(e > tau).
        var tau = 0u;
        var mass_above = vec4<u32>(0u);
        for (var level = 0u; level < 4u; level++) {
            for (var b = tid; b < RADIX * LIMBS; b += WG_ROW) { atomicStore(&hist_m[b], 0u); }
            workgroupBarrier();
            weigh_keys(base, lo, hi, tau, level);
            workgroupBarrier();
            if (tid == 0u) {   // the highest digit whose mass, with all above it, reaches the goal
                var a = mass_above;
                var d = RADIX - 1u;
                loop {
                    var m = vec4<u32>(0u);
                    for (var j = 0u; j < LIMBS; j++) {
                        m = u128_add(m, placed(atomicLoad(&hist_m[d * LIMBS + j]), LIMB_BITS * j));
                    }
                    if (!u128_less(u128_shl24(u128_add(a, m)), goal) || d == 0u) { break; }
                    a = u128_add(a, m);
                    d--;
                }
                chosen = vec2<u32>(d, 0u);
                chosen_mass = a;
            }
            workgroupBarrier();
            tau |= chosen.x << (24u - 8u * level);
            mass_above = chosen_mass;
            workgroupBarrier();
        }
        cut_top_p(base, lo, hi, tau, mass_above, goal,
                  before_me(tid, equal_keys(TOP_P, base, lo, hi, tau)));
    }

    if (params.min_p > 0.0) { cut_min_p(base, lo, hi); }
}
