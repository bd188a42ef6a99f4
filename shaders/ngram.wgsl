// The n-gram drafter on the device, for pipelined speculative cycles (pyspec/gpu/backend.py):
// the first dispatch of a cycle submitted while the one before is still in flight, so that the
// cycle needs nothing from the host.
//   advance       appends the emitted tokens of the cycle before (the accept kernel's words, or
//                 tree_walk.wgsl's) to the token history; proposes up to k_cap drafts by
//                 drafters/ngram.py's rule (the tokens after the latest earlier occurrence of the
//                 longest suffix, max_n down to min_n tokens, that occurred before; at most
//                 caps[n] of them for a match of n tokens); writes the pass's token list
//                 [t_{n-1}, d_1..d_k] and its Step (rows k + 1 at position n - 1), which a copy
//                 then puts in the champion's step slot. The drafts stop at the request's budget
//                 and at the context, so a cycle never emits past max_tokens nor writes a cache
//                 row past the last.
//   advance_tree  appends as `advance` does, then drafts drafters/tree.ngram_tree's tree: the
//                 continuations after every earlier occurrence of that longest suffix, latest
//                 first, merged into a trie of at most widths[d] children per node at depth
//                 d + 1, at most tree_nodes nodes (in the order they are added), as deep as the
//                 widths, k_cap and the budget allow and as many as the context allows; writes
//                 [t_{n-1}, the nodes as added] (every parent before its children) and a tree
//                 Step (FLAG_TREE, its table from the root at row n - 1).
// Host wrapper: pyspec/gpu/ngram.py. One workgroup: threads try the windows' ends in a stride;
// the latest end matching each suffix length is a workgroup atomic maximum, which does not
// depend on the order the threads run in. advance_tree then flags, a block of WG_ROW ends at a
// time from the latest down, the ends that match the chosen suffix, and thread 0 adds each
// flagged end's continuation to the trie in that order.

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
    tree_nodes: u32,   // advance_tree: the most nodes
    n_widths: u32,     // advance_tree: the depths the widths give
    pad0: u32,
    caps: array<vec4<u32>, 3>,   // [n]: the most drafts a match of n tokens proposes (n <= 8)
    widths: array<vec4<u32>, ROWS_MAX / 4u>,   // advance_tree: [d] the most children at depth d + 1
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

// Thread 0 appends the cycle before's emitted tokens to the history; every thread resets `best`.
// Returns nothing: the history's length is in hist_len after the caller's barrier.
fn append_emitted(t: u32) {
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
}

// How many of the last tokens the window ending at e matches (at most max_n, never more than the
// e + 1 tokens up to it).
fn match_length(e: u32, n: u32, max_n: u32) -> u32 {
    var m = 0u;
    while (m < max_n && m <= e && hist[e - m] == hist[n - 1u - m]) {
        m++;
    }
    return m;
}

// best[j] = the latest window end e <= n - 2 (it has a token after it) matching the last j tokens.
fn match_ends(t: u32, n: u32, max_n: u32) {
    for (var e = t; e + 1u < n; e += WG_ROW) {
        let m = match_length(e, n, max_n);
        for (var j = max(params.min_n, 1u); j <= m; j++) {
            atomicMax(&best[j], i32(e));
        }
    }
}

// The Step fields the host knows, the same for both entries.
fn put_step_fields(rows: u32, n: u32, n_draft: u32, flags: u32) {
    state.step.rows = rows;
    state.step.pos = min(n - 1u, params.ctx - 1u);
    state.step.seed_lo = params.seed_lo;
    state.step.seed_hi = params.seed_hi;
    state.step.temperature = params.temperature;
    state.step.n_draft = n_draft;
    state.step.mode = params.mode;
    state.step.flags = flags;
}

@compute @workgroup_size(WG_ROW)
fn advance(@builtin(local_invocation_index) t: u32) {
    append_emitted(t);
    storageBarrier();
    workgroupBarrier();
    let n = hist_len;
    let max_n = min(params.max_n, MAX_SUFFIX);
    match_ends(t, n, max_n);
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
    put_step_fields(k + 1u, n, k, FLAG_ONE_HOT);
}

// --- advance_tree -----------------------------------------------------------------------------
var<workgroup> flagged: array<u32, WG_ROW>;   // (WG_ROW,) 1: the block's end t matches
var<workgroup> suffix: u32;                   // the chosen suffix's length (0: none matched)

// Thread 0's trie (advance_tree): node i's token, parent (NONE: the root) and depth.
var<private> trie_token: array<u32, ROWS_MAX>;
var<private> trie_parent: array<u32, ROWS_MAX>;
var<private> trie_depth: array<u32, ROWS_MAX>;
var<private> trie_nodes: u32;

// The trie's child of `parent` (NONE: the root) holding `token`, or NONE.
fn trie_child(parent: u32, token: u32) -> u32 {
    for (var i = 0u; i < trie_nodes; i++) {
        if (trie_parent[i] == parent && trie_token[i] == token) { return i; }
    }
    return NONE;
}

fn trie_children(parent: u32) -> u32 {
    var c = 0u;
    for (var i = 0u; i < trie_nodes; i++) {
        c += u32(trie_parent[i] == parent);
    }
    return c;
}

// Add hist[start .. start + depth) (as far as the history goes) under the root, as
// drafters/tree.ngram_tree does: follow a child holding the token, else add one where its
// parent has fewer than widths[d] children and the trie fewer than `most` nodes, else stop.
fn trie_add(start: u32, n: u32, depth: u32, most: u32) {
    var node = NONE;
    for (var d = 0u; d < depth && start + d < n; d++) {
        let token = hist[start + d];
        var child = trie_child(node, token);
        if (child == NONE) {
            if (trie_children(node) >= params.widths[d / 4u][d % 4u] || trie_nodes >= most) {
                return;
            }
            child = trie_nodes;
            trie_token[child] = token;
            trie_parent[child] = node;
            trie_depth[child] = d + 1u;
            trie_nodes++;
        }
        node = child;
    }
}

@compute @workgroup_size(WG_ROW)
fn advance_tree(@builtin(local_invocation_index) t: u32) {
    append_emitted(t);
    storageBarrier();
    workgroupBarrier();
    let n = hist_len;
    let max_n = min(params.max_n, MAX_SUFFIX);
    match_ends(t, n, max_n);
    workgroupBarrier();
    if (t == 0u) {
        suffix = 0u;
        for (var j = i32(max_n); j >= i32(max(params.min_n, 1u)); j--) {
            if (atomicLoad(&best[j]) >= 0) {
                suffix = u32(j);
                break;
            }
        }
        trie_nodes = 0u;
    }
    workgroupBarrier();
    // The drafts that fit: depth <= k_cap and the budget, nodes <= the context's rows left.
    let depth = drafts_that_fit(min(min(params.k_cap, params.n_widths), ROWS_MAX - 1u), n,
                                params.limit, params.ctx);
    let room = select(0u, params.ctx - n, params.ctx > n);
    let most = min(min(params.tree_nodes, ROWS_MAX - 1u), room);
    // Blocks of ends from the latest (n - 2) down; a uniform count (the history's capacity).
    let blocks = (params.ctx + 2u * ROWS_MAX + WG_ROW - 1u) / WG_ROW;
    for (var b = 0u; b < blocks; b++) {
        let e = i32(n) - 2 - i32(b * WG_ROW + t);
        flagged[t] = u32(suffix > 0u && e >= 0 && match_length(u32(e), n, suffix) >= suffix);
        workgroupBarrier();
        if (t == 0u && depth > 0u) {
            for (var i = 0u; i < WG_ROW; i++) {
                if (flagged[i] != 0u) {
                    trie_add(n - 1u - b * WG_ROW - i, n, depth, most);
                }
            }
        }
        workgroupBarrier();
    }
    if (t != 0u) {
        return;
    }
    tokens[0] = hist[n - 1u];
    state.step.tree[0][0] = TREE_NO_PARENT << 16u;   // the root: depth 0
    for (var i = 0u; i < trie_nodes; i++) {
        tokens[1u + i] = trie_token[i];
        let up = select(trie_parent[i] + 1u, 0u, trie_parent[i] == NONE);
        state.step.tree[(i + 1u) / 4u][(i + 1u) % 4u] = trie_depth[i] | (up << 16u);
    }
    state.step.tree_base = min(n - 1u, params.ctx - 1u);
    put_step_fields(trie_nodes + 1u, n, trie_nodes,
                    FLAG_ONE_HOT | select(0u, FLAG_TREE, trie_nodes > 0u));
}
