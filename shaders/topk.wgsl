// Per-row top-w choice, for a draft model's tree grown on the device (pyspec/gpu/treedraft.py):
// row r's `width` best ids by sample.wgsl's score (the logit in greedy mode, logit / T + the
// replay noise of the row's position in replay: choice_score), best first, ties to the lowest
// id: drafters/tree.py's children (greedy: np.argsort(-logits, kind="stable")[:w]; replay: the
// Gumbel-top-k of draw_siblings, whose first is the chain's draft). Pick j is the best id
// strictly below pick j - 1 in that order (score, then id), so the picks are distinct and their
// order does not depend on how threads split the row. Host wrapper: sampling.topk_rows.
//   topk_rows   one workgroup per row, `width` scans of the row (software adapters)
//   topk_parts  on a GPU, a workgroup per ARGMAX_CHUNK ids of a row: each part's own top-w
//   topk_merge  then a workgroup per row: the top-w of its parts' candidates (the row's top-w
//               is among them: an id beaten by w ids of its own part is beaten by w of the row)
// tokens[out_offset + r out_stride + j] = pick j (NONE where the row has fewer than w ids).

//!include sample.wgsl

// The best of this thread's ids begin + tid, begin + tid + WG_ROW, ... < end of the row at `base`
// strictly below `bound` (any, for the first pick).
fn scan_below(tid: u32, base: u32, begin: u32, end: u32, position: u32, bound: Best,
              first: bool) -> Best {
    var b = Best(F32_LOWEST, NONE, F32_LOWEST);
    for (var i = begin + tid; i < end; i += WG_ROW) {
        let score = choice_score(src[base + i], i, position);
        if (below(score, i, bound, first) && (b.i == NONE || score > b.v)) {
            b.v = score;
            b.i = i;
        }
    }
    return b;
}

// Whether (score, i) comes after `bound` in the order: a lower score, or an equal one at a
// higher id. Every id does for the first pick; none after a pick that found nothing (bound.i
// NONE: the range had fewer ids than the width).
fn below(score: f32, i: u32, bound: Best, first: bool) -> bool {
    if (first) { return true; }
    if (bound.i == NONE) { return false; }
    return score < bound.v || (score == bound.v && i > bound.i);
}

fn topk_position(r: u32) -> u32 {
    return row_position(r) + params.pos_shift;
}

@compute @workgroup_size(WG_ROW)
fn topk_rows(@builtin(workgroup_id) wid: vec3<u32>,
             @builtin(local_invocation_index) tid: u32) {
    let r = wid.x;
    if (r >= step.rows || r >= params.rows_cap) { return; }
    let base = params.in_offset + r * params.in_stride;
    var bound = Best(F32_LOWEST, NONE, F32_LOWEST);
    for (var j = 0u; j < params.width; j++) {
        bound = tree_best(tid, scan_below(tid, base, 0u, params.vocab, topk_position(r), bound,
                                           j == 0u));
        if (tid == 0u) {
            tokens[params.out_offset + r * params.out_stride + j] = bound.i;
        }
    }
}

// topk_rows' first half on a GPU: workgroup (c, r) takes ids [c, c + 1) * ARGMAX_CHUNK of row r
// and writes its top-w as (score bits, id, 0, 0) per pick.
@compute @workgroup_size(WG_ROW)
fn topk_parts(@builtin(workgroup_id) wid: vec3<u32>,
              @builtin(local_invocation_index) tid: u32) {
    let r = wid.y;
    if (r >= step.rows || r >= params.rows_cap) { return; }
    let base = params.in_offset + r * params.in_stride;
    let begin = wid.x * ARGMAX_CHUNK;
    let end = min(begin + ARGMAX_CHUNK, params.vocab);
    let at = (r * argmax_n_parts() + wid.x) * params.width;
    var bound = Best(F32_LOWEST, NONE, F32_LOWEST);
    for (var j = 0u; j < params.width; j++) {
        bound = tree_best(tid, scan_below(tid, base, begin, end, topk_position(r), bound,
                                           j == 0u));
        if (tid == 0u) {
            parts_out[at + j] = vec4<u32>(bitcast<u32>(bound.v), bound.i, 0u, 0u);
        }
    }
}

// topk_rows' second half on a GPU: row r's top-w among its parts' candidates, by the same order.
@compute @workgroup_size(WG_ROW)
fn topk_merge(@builtin(workgroup_id) wid: vec3<u32>,
              @builtin(local_invocation_index) tid: u32) {
    let r = wid.x;
    if (r >= step.rows || r >= params.rows_cap) { return; }
    let n = argmax_n_parts() * params.width;
    var bound = Best(F32_LOWEST, NONE, F32_LOWEST);
    for (var j = 0u; j < params.width; j++) {
        var b = Best(F32_LOWEST, NONE, F32_LOWEST);
        for (var c = tid; c < n; c += WG_ROW) {
            let p = parts_in[r * n + c];
            let score = bitcast<f32>(p.x);
            if (p.y != NONE && below(score, p.y, bound, j == 0u)) {
                b = better(b, Best(score, p.y, F32_LOWEST));
            }
        }
        bound = tree_best(tid, b);
        if (tid == 0u) {
            tokens[params.out_offset + r * params.out_stride + j] = bound.i;
        }
    }
}
