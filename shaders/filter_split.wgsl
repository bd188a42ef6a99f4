// filter.wgsl's filter_rows split over each row, for a GPU (pyspec/gpu/sampling.py filter_rows,
// split): the same mask, top_k, top_p and min_p, with the same logits and weights bit for bit.
// Ten dispatches, each a workgroup per part of a row (grid (parts, rows_cap); part c holds ids
// [c, c + 1) * ARGMAX_CHUNK, and its thread t the SUB ids from c ARGMAX_CHUNK + t SUB, so ids
// ascend with (part, thread) as they do with filter_rows' threads):
//   filter_mask     the mask; at T > 0 with a filter on, zeroes the row's scratch
//   filter_k0       top_k's level-0 histogram; the masked row's largest key (for the weights)
//   filter_k1..k3   top_k's levels 1..3; k3 also keeps each part's level-3 histogram
//   filter_k_apply  top_k's cut; the weights; top_p's level-0 mass histogram (or min_p alone)
//   filter_p1..p3   top_p's levels 1..3; p3 also keeps each part's level-3 counts
//   filter_p_apply  top_p's cut, then min_p
// Every dispatch returns at once (uniformly) where its step is off, so a plan serves every
// request: at T = 0 only the mask runs. Scratch of its own: ROW_WORDS u32 a row (the row's
// histograms, accumulated by atomics, hence zeroed first, and the cuts passed on), and RADIX
// u32 a part (k3's level-3 histograms, then p3's, once filter_k_apply has read k3's).
//
// Why the result is filter_rows' own, bit for bit:
// - A level's histogram is the row's: each part builds its own in workgroup memory, as
//   filter_rows does, then adds its nonzero bins into the row's with atomicAdd. The sums are of
//   integers (counts, and top_p's masses in 12-bit pieces that stay below 2^32 for vocab <=
//   2^20), so they equal filter_rows' whatever order the parts add in.
// - The digit a level chose is derived from the finished histogram by every workgroup of the
//   next dispatch alike (pick: the same rule as filter_rows' thread-0 loop, found by a scan),
//   and part 0 stores it for the dispatch after that. top_p's total is the sum of its level-0
//   histogram.
// - A tie's rank in id order is the ties in the parts before (each part's level-3 histogram,
//   kept per part, read at the chosen digit) plus those of the threads before it in its part.
// - The weights' maximum: top_k keeps the row's largest value, so the survivors' maximum is the
//   masked row's, taken as the largest order key (atomicMax, order-free). Its f32 is the same
//   value (or +0 for -0: x - max is then the same for every x but a zero, where both give
//   exp(0) = 1), and the weights are the same expression (write_weights).

//!include filter.wgsl

// Row r's scratch, words [r ROW_WORDS, (r + 1) ROW_WORDS) of `scratch`:
const K_HIST: u32 = 0u;                            // (4, RADIX) top_k: keys per digit, per level
const P_HIST: u32 = K_HIST + 4u * RADIX;           // (4, RADIX, LIMBS) top_p: mass per digit
const MAX_KEY: u32 = P_HIST + 4u * RADIX * LIMBS;  // the masked row's largest order key
const GOAL: u32 = MAX_KEY + 1u;                    // (4,) top_p's goal: total top_p (128-bit)
const CUTS: u32 = GOAL + 4u;                       // (2, 3, 5) per selection and level 0..2: the
                                                   // prefix chosen through it, and the keys or
                                                   // mass above its range (128-bit)
const ROW_WORDS: u32 = 8256u;                      // sampling.FILTER_ROW_WORDS
const_assert CUTS + 2u * 3u * 5u <= ROW_WORDS;
const SUB: u32 = ARGMAX_CHUNK / WG_ROW;            // ids per thread of a part
const_assert SUB * WG_ROW == ARGMAX_CHUNK && 2u * WG_ROW == RADIX;

// the rows' histograms and cuts, as above: (rows_cap, ROW_WORDS)
@group(0) @binding(5) var<storage, read_write> scratch: array<atomic<u32>>;
// each part's level-3 counts: for the ranks of the ties in the parts after it
@group(0) @binding(6) var<storage, read_write> ties: array<u32>;  // (rows_cap, parts, RADIX)

// (RADIX + 1,) a row's histogram of a level, summed over the digits >= d
var<workgroup> suffix: array<vec4<u32>, RADIX + 1u>;
var<workgroup> part_max: atomic<u32>;   // the part's largest order key

// A thread's place: row r, part c (of n_parts), the row's first element, its ids [lo, hi).
struct Part {
    r: u32,
    c: u32,
    n_parts: u32,
    base: u32,
    lo: u32,
    hi: u32,
}

// Every entry point here takes all seven bindings (one bind group shape for the plan), so each
// names those it does not otherwise use.
fn part_of(wid: vec3<u32>, tid: u32) -> Part {
    _ = arrayLength(&logits);
    _ = arrayLength(&mask);
    _ = arrayLength(&weights);
    _ = arrayLength(&scratch);
    _ = arrayLength(&ties);
    let n = params.vocab;
    let lo = min(wid.x * ARGMAX_CHUNK + tid * SUB, n);
    return Part(wid.y, wid.x, (n + ARGMAX_CHUNK - 1u) / ARGMAX_CHUNK, wid.y * n, lo,
                min(lo + SUB, n));
}

// Row r is past the step's rows. Entry points ask it of wid.y before part_of: a Part is built
// from tid, so for WGSL's uniformity analysis all of it is per thread, and a return on p.r would
// put every barrier after it in non-uniform control flow (Chromium's compiler rejects that).
fn skipped(r: u32) -> bool {
    return r >= step.rows || r >= params.rows_cap;
}

fn top_k_on() -> bool {
    return step.temperature > 0.0 && params.top_k > 0u && params.top_k < params.vocab;
}

fn top_p_on() -> bool {
    return step.temperature > 0.0 && params.top_p < 0x1000000u;
}

fn min_p_on() -> bool {
    return step.temperature > 0.0 && params.min_p > 0.0;
}

// --- the row's selections ---------------------------------------------------------------------
// The digits chosen through a level, the keys (top_k, in .x) or mass (top_p) above their range,
// and the goal the selection reaches for (k, or top_p's total top_p).
struct Cut {
    prefix: u32,
    above: vec4<u32>,
    goal: vec4<u32>,
}

var<workgroup> picked: Cut;

fn cut_word(r: u32, f: u32, level: u32) -> u32 {
    return r * ROW_WORDS + CUTS + (f * 3u + level) * 5u;
}

fn load4(at: u32) -> vec4<u32> {
    return vec4<u32>(atomicLoad(&scratch[at]), atomicLoad(&scratch[at + 1u]),
                     atomicLoad(&scratch[at + 2u]), atomicLoad(&scratch[at + 3u]));
}

fn store4(at: u32, v: vec4<u32>) {
    for (var j = 0u; j < 4u; j++) { atomicStore(&scratch[at + j], v[j]); }
}

// Row r's histogram of selection f at `level` into suffix: suffix[d] = the sum over digits
// >= d (top_p's from its 12-bit pieces), suffix[RADIX] = 0; a scan in 8 doubling steps.
fn load_suffix(tid: u32, r: u32, f: u32, level: u32) {
    for (var d = tid; d < RADIX; d += WG_ROW) {
        var v = vec4<u32>(0u);
        if (f == TOP_K) {
            v.x = atomicLoad(&scratch[r * ROW_WORDS + K_HIST + level * RADIX + d]);
        } else {
            let at = r * ROW_WORDS + P_HIST + (level * RADIX + d) * LIMBS;
            for (var j = 0u; j < LIMBS; j++) {
                v = u128_add(v, placed(atomicLoad(&scratch[at + j]), LIMB_BITS * j));
            }
        }
        suffix[d] = v;
    }
    if (tid == 0u) { suffix[RADIX] = vec4<u32>(0u); }
    workgroupBarrier();
    for (var s = 1u; s < RADIX; s <<= 1u) {
        let a = u128_add(suffix[tid], suffix[min(tid + s, RADIX)]);
        let b = u128_add(suffix[tid + WG_ROW], suffix[min(tid + WG_ROW + s, RADIX)]);
        workgroupBarrier();
        suffix[tid] = a;
        suffix[tid + WG_ROW] = b;
        workgroupBarrier();
    }
}

fn reaches(f: u32, sum: vec4<u32>, goal: vec4<u32>) -> bool {
    if (f == TOP_K) { return sum.x >= goal.x; }
    return !u128_less(u128_shl24(sum), goal);
}

// The cut through `level` from the one before it and the level's histogram in suffix: the
// highest digit d whose sum over digits >= d, with what lies above, reaches the goal (d = 0 when
// none does), and the sum over the digits above d. filter_rows' thread-0 loop decides the same;
// here each thread tests its two digits: the sums grow as d falls, so one digit is that one.
fn pick(tid: u32, f: u32, level: u32, before: Cut) -> Cut {
    for (var d = tid; d < RADIX; d += WG_ROW) {
        let hit = reaches(f, u128_add(before.above, suffix[d]), before.goal);
        let next = d + 1u < RADIX && reaches(f, u128_add(before.above, suffix[d + 1u]),
                                             before.goal);
        if ((hit && !next) || (d == 0u && !hit)) {
            picked = Cut(before.prefix | (d << (24u - 8u * level)),
                         u128_add(before.above, suffix[d + 1u]), before.goal);
        }
    }
    workgroupBarrier();
    let cut = picked;
    workgroupBarrier();   // picked and suffix are rewritten by the next pick
    return cut;
}

// The cut through `level` of selection f, the same in every workgroup of the row; part 0 stores
// it (levels 0..2) for the next dispatch, and top_p's goal, from its level-0 total.
fn cut_through(tid: u32, p: Part, f: u32, level: u32) -> Cut {
    load_suffix(tid, p.r, f, level);
    var before = Cut(0u, vec4<u32>(0u), vec4<u32>(params.top_k, 0u, 0u, 0u));
    if (level > 0u) {
        let at = cut_word(p.r, f, level - 1u);
        before.prefix = atomicLoad(&scratch[at]);
        before.above = load4(at + 1u);
        if (f == TOP_P) { before.goal = load4(p.r * ROW_WORDS + GOAL); }
    } else if (f == TOP_P) {   // the total: every weight is in range at level 0
        before.goal = u128_mul_u32(suffix[0], params.top_p);
    }
    let cut = pick(tid, f, level, before);
    if (p.c == 0u && tid == 0u && level < 3u) {
        let at = cut_word(p.r, f, level);
        atomicStore(&scratch[at], cut.prefix);
        store4(at + 1u, cut.above);
        if (f == TOP_P && level == 0u) { store4(p.r * ROW_WORDS + GOAL, cut.goal); }
    }
    return cut;
}

// Selection f's radix level `level` on this part: the cut through the level before, then the
// part's histogram, added into the row's; at level 3 also kept as the part's own (its counts).
fn level_pass(tid: u32, p: Part, f: u32, level: u32) {
    var prefix = 0u;
    if (level > 0u) { prefix = cut_through(tid, p, f, level - 1u).prefix; }
    for (var b = tid; b < RADIX; b += WG_ROW) { atomicStore(&hist_n[b], 0u); }
    if (f == TOP_P) {
        for (var b = tid; b < RADIX * LIMBS; b += WG_ROW) { atomicStore(&hist_m[b], 0u); }
    }
    workgroupBarrier();
    if (f == TOP_K || level == 3u) { count_keys(f, p.base, p.lo, p.hi, prefix, level); }
    if (f == TOP_P) { weigh_keys(p.base, p.lo, p.hi, prefix, level); }
    workgroupBarrier();
    let row = p.r * ROW_WORDS;
    if (f == TOP_K) {
        for (var b = tid; b < RADIX; b += WG_ROW) {
            let v = atomicLoad(&hist_n[b]);
            if (v != 0u) { atomicAdd(&scratch[row + K_HIST + level * RADIX + b], v); }
        }
    } else {
        for (var b = tid; b < RADIX * LIMBS; b += WG_ROW) {
            let v = atomicLoad(&hist_m[b]);
            if (v != 0u) { atomicAdd(&scratch[row + P_HIST + level * RADIX * LIMBS + b], v); }
        }
    }
    if (level == 3u) {
        for (var b = tid; b < RADIX; b += WG_ROW) {
            ties[(p.r * p.n_parts + p.c) * RADIX + b] = atomicLoad(&hist_n[b]);
        }
    }
}

// The rank of this thread's first tie (key `key` of selection f) in the row's id order: the
// ties of the parts before (their level-3 counts at the key's last digit), then of the threads
// before it in this part.
fn tie_rank(tid: u32, p: Part, f: u32, key: u32) -> u32 {
    var s = 0u;
    for (var c = tid; c < p.c; c += WG_ROW) {
        s += ties[(p.r * p.n_parts + c) * RADIX + (key & 0xffu)];
    }
    workgroupBarrier();
    red_u[tid] = s;
    workgroupBarrier();
    for (var h = WG_ROW / 2u; h > 0u; h >>= 1u) {
        if (tid < h) { red_u[tid] += red_u[tid + h]; }
        workgroupBarrier();
    }
    let parts_before = red_u[0];
    return parts_before + before_me(tid, equal_keys(f, p.base, p.lo, p.hi, key));
}

// --- the dispatches, in order -------------------------------------------------------------------
@compute @workgroup_size(WG_ROW)
fn filter_mask(@builtin(workgroup_id) wid: vec3<u32>,
               @builtin(local_invocation_index) tid: u32) {
    if (skipped(wid.y)) { return; }
    let p = part_of(wid, tid);
    mask_ids(p.r, p.base, p.lo, p.hi);
    if (top_k_on() || top_p_on() || min_p_on()) {
        let row = p.r * ROW_WORDS;
        for (var w = p.c * WG_ROW + tid; w < ROW_WORDS; w += p.n_parts * WG_ROW) {
            atomicStore(&scratch[row + w], 0u);
        }
    }
}

@compute @workgroup_size(WG_ROW)
fn filter_k0(@builtin(workgroup_id) wid: vec3<u32>,
             @builtin(local_invocation_index) tid: u32) {
    if (skipped(wid.y)) { return; }
    let p = part_of(wid, tid);
    if (top_k_on()) { level_pass(tid, p, TOP_K, 0u); }
    if (top_p_on() || min_p_on()) {
        if (tid == 0u) { atomicStore(&part_max, 0u); }
        workgroupBarrier();
        var m = 0u;   // below every key of a finite value
        for (var i = p.lo; i < p.hi; i++) { m = max(m, order_key(logits[p.base + i])); }
        atomicMax(&part_max, m);
        workgroupBarrier();
        if (tid == 0u) { atomicMax(&scratch[p.r * ROW_WORDS + MAX_KEY], atomicLoad(&part_max)); }
    }
}

fn top_k_level(wid: vec3<u32>, tid: u32, level: u32) {
    if (skipped(wid.y) || !top_k_on()) { return; }
    let p = part_of(wid, tid);
    level_pass(tid, p, TOP_K, level);
}

@compute @workgroup_size(WG_ROW)
fn filter_k1(@builtin(workgroup_id) wid: vec3<u32>,
             @builtin(local_invocation_index) tid: u32) {
    top_k_level(wid, tid, 1u);
}

@compute @workgroup_size(WG_ROW)
fn filter_k2(@builtin(workgroup_id) wid: vec3<u32>,
             @builtin(local_invocation_index) tid: u32) {
    top_k_level(wid, tid, 2u);
}

@compute @workgroup_size(WG_ROW)
fn filter_k3(@builtin(workgroup_id) wid: vec3<u32>,
             @builtin(local_invocation_index) tid: u32) {
    top_k_level(wid, tid, 3u);
}

// The f32 of an order key (order_key's inverse; -0 comes back as +0).
fn from_key(key: u32) -> f32 {
    return bitcast<f32>(select(~key, key & 0x7fffffffu, (key >> 31u) != 0u));
}

@compute @workgroup_size(WG_ROW)
fn filter_k_apply(@builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(local_invocation_index) tid: u32) {
    if (skipped(wid.y)) { return; }
    let p = part_of(wid, tid);
    if (top_k_on()) {
        let cut = cut_through(tid, p, TOP_K, 3u);   // kth = cut.prefix; need = k - above >= 1
        cut_top_k(p.base, p.lo, p.hi, cut.prefix, params.top_k - cut.above.x,
                  tie_rank(tid, p, TOP_K, cut.prefix));
    }
    if (!top_p_on() && !min_p_on()) { return; }
    let row_max = from_key(atomicLoad(&scratch[p.r * ROW_WORDS + MAX_KEY]));
    write_weights(p.base, p.lo, p.hi, row_max, step.temperature);
    if (top_p_on()) {
        level_pass(tid, p, TOP_P, 0u);
    } else {
        cut_min_p(p.base, p.lo, p.hi);
    }
}

fn top_p_level(wid: vec3<u32>, tid: u32, level: u32) {
    if (skipped(wid.y) || !top_p_on()) { return; }
    let p = part_of(wid, tid);
    level_pass(tid, p, TOP_P, level);
}

@compute @workgroup_size(WG_ROW)
fn filter_p1(@builtin(workgroup_id) wid: vec3<u32>,
             @builtin(local_invocation_index) tid: u32) {
    top_p_level(wid, tid, 1u);
}

@compute @workgroup_size(WG_ROW)
fn filter_p2(@builtin(workgroup_id) wid: vec3<u32>,
             @builtin(local_invocation_index) tid: u32) {
    top_p_level(wid, tid, 2u);
}

@compute @workgroup_size(WG_ROW)
fn filter_p3(@builtin(workgroup_id) wid: vec3<u32>,
             @builtin(local_invocation_index) tid: u32) {
    top_p_level(wid, tid, 3u);
}

@compute @workgroup_size(WG_ROW)
fn filter_p_apply(@builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(local_invocation_index) tid: u32) {
    if (skipped(wid.y) || !top_p_on()) { return; }
    let p = part_of(wid, tid);
    let cut = cut_through(tid, p, TOP_P, 3u);   // tau = cut.prefix
    cut_top_p(p.base, p.lo, p.hi, cut.prefix, cut.above, cut.goal,
              tie_rank(tid, p, TOP_P, cut.prefix));
    if (min_p_on()) { cut_min_p(p.base, p.lo, p.hi); }
}
