// A tree cycle's walk on the device, under greedy and replay (pyspec/gpu/tree.py): from the root,
// follow the child whose token is its row's choice (argmax_rows: the argmax, or the replay sample
// keyed by the row's depth), the lowest row where siblings repeat a token, and emit the choice
// of the row where no child has it: rules/tree.walk_chosen, exactly. It writes
//   words  the accept kernel's layout (accept.wgsl): n_accepted (the path's length), k_eff (the
//          tree's depth), n_emitted, how (HOW_CHAMPION), the emitted tokens (NONE after them),
//          so what reads a chain's verdict on the device (ngram.wgsl's history) reads a tree's,
//          and the tests of the tree's first branch (the chain it is: rules/tree.first_branch);
//   moves  kv_compact.wgsl's Moves: the path's cache rows, which the next submission's first
//          dispatches move after the root, and the tree's nodes and depth.
// The pass's Step (binding 1) holds the tree (FLAG_TREE, its table from the root: step.wgsl).
// One thread: at most ROWS_MAX rows.

//!include step.wgsl
//!include tree.wgsl
//!include moves.wgsl

@group(0) @binding(0) var<storage, read_write> moves: Moves;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> choice: array<u32>;       // (ROWS_MAX,) per row
@group(0) @binding(3) var<storage, read> tokens: array<u32>;       // (ROWS_MAX,) the pass's
@group(0) @binding(4) var<storage, read_write> words: array<u32>;  // (ACCEPT_WORDS,)

const ONE_THREAD: u32 = 1u;   // a walk of at most ROWS_MAX rows

@compute @workgroup_size(ONE_THREAD)
fn tree_walk() {
    let rows = min(step.rows, ROWS_MAX);
    var depth = 0u;
    for (var r = 1u; r < rows; r++) {
        depth = max(depth, tree_entry(tree_index(r)) & 0xFFFFu);
    }
    var node = 0u;
    var n = 0u;
    loop {
        let want = choice[node];
        words[ACCEPT_TOKENS + n] = want;
        var next = NONE;
        for (var r = node + 1u; r < rows; r++) {
            if ((tree_entry(tree_index(r)) >> 16u) == tree_index(node) && tokens[r] == want) {
                next = r;
                break;
            }
        }
        if (next == NONE) { break; }
        moves.src[n] = step.pos + next;
        n++;
        node = next;
    }
    for (var i = n + 1u; i < ROWS_MAX; i++) {
        words[ACCEPT_TOKENS + i] = NONE;
    }
    // The first branch (each node's first child, from the root's) as the chain it is: its
    // drafts' tests, 1 pass / 0 fail, NONE after (rules/tree.first_branch).
    var at = 0u;
    var tested = 0u;
    loop {
        var first = NONE;
        for (var r = at + 1u; r < rows; r++) {
            if ((tree_entry(tree_index(r)) >> 16u) == tree_index(at)) {
                first = r;
                break;
            }
        }
        if (first == NONE) { break; }
        let kept = tokens[first] == choice[at];
        words[ACCEPT_TESTS + tested] = select(0u, 1u, kept);
        tested++;
        if (!kept) { break; }
        at = first;
    }
    for (var i = tested; i < ROWS_MAX; i++) {
        words[ACCEPT_TESTS + i] = NONE;
    }
    words[ACCEPT_N_ACCEPTED] = n;
    words[ACCEPT_K_EFF] = depth;
    words[ACCEPT_N_EMITTED] = n + 1u;
    words[ACCEPT_HOW] = HOW_CHAMPION;
    moves.n = n;
    moves.dst = step.pos + 1u;
    moves.nodes = rows - 1u;
    moves.depth = depth;
}
