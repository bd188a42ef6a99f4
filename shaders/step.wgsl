// The per-pass state every kernel may read: binding 1 of group 0, a 112-byte slice of the step
// buffer (one 256-byte slot per pass of a cycle). Static shapes go in each kernel's own params.
// Packed by pyspec/gpu/step.py (pack_step); keep the two in the same order.
struct Step {
    rows: u32,         // tokens in this pass (1..ROWS_MAX); threads for rows >= this exit early
    pos: u32,          // absolute position of row 0 (its KV row; rows are pos .. pos+rows-1)
    seed_lo: u32,      // request seed, low 32 bits
    seed_hi: u32,      // request seed, high 32 bits
    temperature: f32,  // 0 = greedy
    n_draft: u32,      // drafted tokens K in this cycle (accept kernel)
    mode: u32,         // MODE_GREEDY, MODE_REPLAY or MODE_REJECTION (step.py MODES)
    flags: u32,        // FLAG_ONE_HOT: the drafts are deterministic (q_draft one-hot);
                       // FLAG_TREE: the rows are nodes of a tree (tree.wgsl reads the fields below)
    tree_base: u32,    // with FLAG_TREE: the cache row of the tree's root (its position too)
    pad0: u32,
    pad1: u32,
    pad2: u32,
    // With FLAG_TREE, the tree's table from its root: entry i (tree[i / 4][i % 4]) is the cache
    // row tree_base + i, a pending row of this pass or of one before it (a draft grows its tree
    // a depth a pass): its depth | its parent's entry << 16 (the root: depth 0, TREE_NO_PARENT).
    // Without the flag row r is at position pos + r and these fields are not read.
    tree: array<vec4<u32>, ROWS_MAX / 4u>,
}

// The drafts a cycle at n committed tokens may verify, at most k: the k + 1 tokens it emits fit
// the request's budget (`limit` tokens: prompt + max_tokens), and its rows n - 1 .. n - 1 + k fit
// the context (`ctx` positions). For the cycles that decide on the device (ngram.wgsl, ahead.wgsl),
// which write chains only: a Step they write has no FLAG_TREE.
fn drafts_that_fit(k: u32, n: u32, limit: u32, ctx: u32) -> u32 {
    let budget = select(0u, limit - n - 1u, limit > n);
    return min(k, min(budget, select(0u, ctx - n, ctx > n)));
}
