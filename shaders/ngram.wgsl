// The n-gram drafter on the device, for pipelined speculative cycles (pyspec/gpu/backend.py):
// the first dispatch of a cycle submitted while the one before is still in flight, so that the
// cycle needs nothing from the host.
//   advance  appends the emitted tokens of the cycle before (the accept kernel's words) to the
//            token history; proposes up to k_cap drafts by drafters/ngram.py's rule (the tokens
//            after the latest earlier occurrence of the longest suffix, max_n down to min_n
//            tokens, that occurred before; at most caps[n] of them for a match of n tokens);
//            writes the pass's token list [t_{n-1}, d_1..d_k] and
//            its Step (rows k + 1 at position n - 1), which a copy then puts in the champion's
//            step slot. The drafts stop at the request's budget and at the context, so a cycle
//            never emits past max_tokens nor writes a cache row past the last.
// Host wrapper: pyspec/gpu/ngram.py. One workgroup: threads try the windows' ends in a stride;
// the latest end matching each suffix length is a workgroup atomic maximum, which does not
// depend on the order the threads run in.

//!include step.wgsl

struct Params {
    k_cap: u32,        // most drafts this cycle (the schedule's k; at most ROWS_MAX - 1)
    limit: u32,        // most tokens the request may hold: prompt + max_tokens
    ctx: u32,          // the cache's positions
    max_n: u32,        // longest suffix tried (at most MAX_SUFFIX)
    min_n: u32,        // shortest suffix tried (at least 1)
    seed_lo: u32,      // the Step's fields the host knows
    seed_hi: u32,
    temperature: f32,
    mode: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
    caps: array<vec4<u32>, 3>,   // [n]: the most drafts a match of n tokens proposes (n <= 8)
}

struct State {
    n: u32,            // tokens in the history (the committed ones, the last one included)
    fresh: u32,        // 1: the host wrote the history this cycle; the words hold nothing new
    pad: array<u32, 6>,
    step: Step,        // the pass's Step (byte 32), copied into the champion's slot
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> words: array<u32>;         // (ACCEPT_WORDS,) last cycle's
@group(0) @binding(2) var<storage, read_write> state: State;
@group(0) @binding(3) var<storage, read_write> hist: array<u32>;    // (ctx + 2 * ROWS_MAX,)
@group(0) @binding(4) var<storage, read_write> tokens: array<u32>;  // (ROWS_MAX,) the pass's

const MAX_SUFFIX: u32 = 8u;

var<workgroup> best: array<atomic<i32>, 9>;   // [j]: latest window end matching the last j tokens
var<workgroup> hist_len: u32;

@compute @workgroup_size(WG_ROW)
fn advance(@builtin(local_invocation_index) t: u32) {
    if (t == 0u) {
        var n = state.n;
        if (state.fresh == 0u) {
            let emitted = min(words[ACCEPT_N_ACCEPTED] + 1u, ROWS_MAX);
            for (var i = 0u; i < emitted; i++) {
                hist[n + i] = words[ACCEPT_TOKENS + i];
            }
            n += emitted;
        }
        state.n = n;
        state.fresh = 0u;
        hist_len = n;
    }
    if (t <= MAX_SUFFIX) {
        atomicStore(&best[t], -1);
    }
    storageBarrier();
    workgroupBarrier();
    let n = hist_len;
    let max_n = min(params.max_n, MAX_SUFFIX);
    // A window ending at e <= n - 2 has a token after it; m = how many of the last tokens it
    // matches, never more than the e + 1 tokens up to it.
    for (var e = t; e + 1u < n; e += WG_ROW) {
        var m = 0u;
        while (m < max_n && m <= e && hist[e - m] == hist[n - 1u - m]) {
            m++;
        }
        for (var j = max(params.min_n, 1u); j <= m; j++) {
            atomicMax(&best[j], i32(e));
        }
    }
    workgroupBarrier();
    if (t != 0u) {
        return;
    }
    var k = 0u;
    var start = 0u;
    for (var j = i32(max_n); j >= i32(max(params.min_n, 1u)); j--) {
        let e = atomicLoad(&best[j]);
        if (e >= 0) {
            start = u32(e) + 1u;
            k = min(n - start, params.caps[j / 4][j % 4]);
            break;
        }
    }
    k = drafts_that_fit(min(k, min(params.k_cap, ROWS_MAX - 1u)), n, params.limit, params.ctx);
    tokens[0] = hist[n - 1u];
    for (var i = 0u; i < k; i++) {
        tokens[1u + i] = hist[start + i];
    }
    state.step.rows = k + 1u;
    state.step.pos = min(n - 1u, params.ctx - 1u);
    state.step.seed_lo = params.seed_lo;
    state.step.seed_hi = params.seed_hi;
    state.step.temperature = params.temperature;
    state.step.n_draft = k;
    state.step.mode = params.mode;
    state.step.flags = FLAG_ONE_HOT;
}
