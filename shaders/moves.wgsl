// A tree cycle's accepted path as the cache moves that commit it: written by tree_walk.wgsl (a
// walk on the device) or by the host (pyspec/gpu/tree.py's Compaction, its MOVES_WORDS), read by
// kv_compact.wgsl at the front of the next submission and by the host's bookkeeping.
struct Moves {
    n: u32,      // rows to move: the path's length (<= ROWS_MAX - 1)
    dst: u32,    // the first destination row: the tree's root's row + 1
    nodes: u32,  // the tree's nodes
    depth: u32,  // the tree's depth
    src: array<u32, ROWS_MAX>,   // (ROWS_MAX,) the path's rows, root's child first (increasing)
}
