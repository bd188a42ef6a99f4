// A draft model's cycle fed on the device, for pipelined speculative cycles with a GPU draft
// (pyspec/gpu/backend.py, pyspec/gpu/ahead.py): the first dispatch of a cycle submitted while the
// one before is still in flight, so that the cycle needs nothing from the host.
//   advance  appends the emitted tokens of the cycle before (the accept kernel's words) to the
//            last ROWS_MAX committed tokens it keeps and to their count n; caps the cycle's
//            drafts at the request's budget and at the context; writes the draft's feed (the
//            last m committed tokens: the host knows m, see pyspec/gpu/ahead.py), row 0 of the
//            champion's token list (t_{n-1}) and the Steps of the cycle's passes, in the step
//            buffer's layout, which one copy then puts in its slots:
//              slot 0      the champion's verify pass: rows k + 1 at position n - 1;
//              slot 1      the draft's first step: rows m at position n - m;
//              slot 1 + i  step i (0 < i < k_cap): d_i, one row at position n - 1 + i; a step
//                          past the cycle's k (the cap cut it) runs at the last position it
//                          may write (its rows are past those the cycle keeps).
//            A tree cycle (a draft model's fixed-width tree: pyspec/gpu/treedraft.py) has
//            tree_slots > 0: its slots other than slot 1 (the champion's tree pass and the
//            draft's depth passes) are the host's template Steps of its depth, packed with the
//            root at row 0, moved to the root's row n - 1 (their pos and tree_base words) and
//            given the request's seed, temperature and mode.
// One thread: a few dozen words.

//!include step.wgsl

struct Params {
    k_cap: u32,        // the draft steps encoded (the schedule's k; at most ROWS_MAX - 1)
    limit: u32,        // most tokens the request may hold: prompt + max_tokens
    ctx: u32,          // the caches' positions (the champion's and the draft's)
    seed_lo: u32,      // the Step's fields the host knows
    seed_hi: u32,
    temperature: f32,
    mode: u32,
    verify_flags: u32, // the verify pass's flags (FLAG_ONE_HOT unless q_draft rows are copied)
    feed_rows: u32,    // m: the draft's first step feeds t_{n-m} .. t_{n-1} (1..ROWS_MAX)
    tree_slots: u32,   // a tree cycle: slots 0 .. tree_slots - 1 from a template (0: a chain)
    tree_at: u32,      // ... the template's first word in tree_steps
    pad2: u32,
}

struct State {
    n: u32,            // committed tokens (the last one included)
    fresh: u32,        // 1: the host wrote the state this cycle; the words hold nothing new
    pad0: u32,
    pad1: u32,
    last: array<u32, ROWS_MAX>,   // t_{n-ROWS_MAX} .. t_{n-1} (those that exist, right-aligned)
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> words: array<u32>;          // (ACCEPT_WORDS,) last cycle's
@group(0) @binding(2) var<storage, read_write> state: State;
@group(0) @binding(3) var<storage, read_write> steps: array<u32>;    // (ROWS_MAX, 64) Step slots
@group(0) @binding(4) var<storage, read_write> feed: array<u32>;     // (ROWS_MAX,) the draft's
@group(0) @binding(5) var<storage, read_write> tokens: array<u32>;   // (ROWS_MAX,) the champion's
@group(0) @binding(6) var<storage, read> tree_steps: array<u32>;     // (ROWS_MAX, ROWS_MAX, 64) [D]

const SLOT_WORDS: u32 = 64u;   // 256-byte slots (pyspec/gpu/step.py SLOT_BYTES)
const ONE_THREAD: u32 = 1u;    // the work is a few dozen words
const TREE_BASE: u32 = 8u;     // the Step's tree_base word (step.wgsl)

fn put_step(slot: u32, rows: u32, pos: u32, n_draft: u32, flags: u32) {
    let b = slot * SLOT_WORDS;
    steps[b] = rows;
    steps[b + 1u] = pos;
    steps[b + 2u] = params.seed_lo;
    steps[b + 3u] = params.seed_hi;
    steps[b + 4u] = bitcast<u32>(params.temperature);
    steps[b + 5u] = n_draft;
    steps[b + 6u] = params.mode;
    steps[b + 7u] = flags;
}

@compute @workgroup_size(ONE_THREAD)
fn advance() {
    var n = state.n;
    if (state.fresh == 0u) {
        let emitted = min(words[ACCEPT_N_ACCEPTED] + 1u, ROWS_MAX);
        for (var i = 0u; i + emitted < ROWS_MAX; i++) {
            state.last[i] = state.last[i + emitted];
        }
        for (var i = 0u; i < emitted; i++) {
            state.last[ROWS_MAX - emitted + i] = words[ACCEPT_TOKENS + i];
        }
        n += emitted;
    }
    state.n = n;
    state.fresh = 0u;
    let k_cap = min(params.k_cap, ROWS_MAX - 1u);
    let m = clamp(params.feed_rows, 1u, min(n, ROWS_MAX));
    let k = drafts_that_fit(k_cap, n, params.limit, params.ctx);
    let top = params.ctx - 1u;
    for (var j = 0u; j < m; j++) {
        feed[j] = state.last[ROWS_MAX - m + j];
    }
    tokens[0] = state.last[ROWS_MAX - 1u];
    put_step(0u, k + 1u, min(n - 1u, top), k, params.verify_flags);
    put_step(1u, m, n - m, 0u, 0u);
    for (var i = 1u; i < k_cap; i++) {
        put_step(1u + i, 1u, min(n - 1u + i, top), 0u, 0u);
    }
    for (var s = 0u; s < min(params.tree_slots, ROWS_MAX); s++) {
        if (s == 1u) { continue; }   // the draft's first pass: a chain of m rows (above)
        let b = s * SLOT_WORDS;
        for (var w = 0u; w < SLOT_WORDS; w++) {
            steps[b + w] = tree_steps[params.tree_at + b + w];
        }
        steps[b + 1u] += n - 1u;
        steps[b + 2u] = params.seed_lo;
        steps[b + 3u] = params.seed_hi;
        steps[b + 4u] = bitcast<u32>(params.temperature);
        steps[b + 6u] = params.mode;
        steps[b + TREE_BASE] += n - 1u;
    }
}
