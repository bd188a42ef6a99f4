// A pass's rows as nodes of a tree (Step.flags FLAG_TREE; step.wgsl says the table), for the
// kernels that bind the Step as `step`: the product's RoPE epilogue, qk_norm and attention. A
// node sits at position tree_base + its depth while its K and V stay at cache row pos + r.

// Entry i of the tree's table: depth | parent entry << 16.
fn tree_entry(i: u32) -> u32 {
    let j = min(i, ROWS_MAX - 1u);
    return step.tree[j / 4u][j % 4u];
}

// Pass row r's entry in the tree's table.
fn tree_index(r: u32) -> u32 {
    return step.pos + r - step.tree_base;
}

// Pass row r's position: pos + r in a chain, tree_base + its depth in a tree.
fn row_position(r: u32) -> u32 {
    if ((step.flags & FLAG_TREE) != 0u) {
        return step.tree_base + (tree_entry(tree_index(r)) & 0xFFFFu);
    }
    return step.pos + r;
}
