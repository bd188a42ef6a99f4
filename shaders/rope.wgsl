// RoPE in place (model.Model.rope, llama.cpp NORM mode): rotate adjacent pairs (x[2i], x[2i+1]) of
// every head of pass row r by the angle of position step.pos + r, read from a cos/sin table that
// ops.rope_table builds on the CPU exactly as the reference does (float64 angles, cast to f32).
// The rows live at row base + r of the buffer, base = step.pos when at_pos (the K rows written
// straight into a KV cache) else 0. One thread per pair; no barriers.

//!include step.wgsl

struct Params {
    n_heads: u32,   // heads per row
    head_dim: u32,  // even
    at_pos: u32,    // 1: row r is row step.pos + r of x; 0: row r
    x_rows: u32,    // rows x holds (ROWS_MAX, or max_ctx for a KV cache)
    max_ctx: u32,   // rows of the table
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> table: array<vec2<f32>>;  // (max_ctx, hd/2) cos, sin
@group(0) @binding(3) var<storage, read_write> x: array<f32>;      // (x_rows, n_heads * head_dim)

@compute @workgroup_size(WG)
fn rope(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let half = params.head_dim / 2u;
    let per_row = params.n_heads * half;
    let idx = (wid.x + wid.y * nwg.x) * WG + t;
    let r = idx / per_row;
    let pos = step.pos + r;
    let row = select(0u, step.pos, params.at_pos != 0u) + r;
    if (r >= min(step.rows, ROWS_MAX) || row >= params.x_rows || pos >= params.max_ctx) {
        return;
    }
    let h = (idx % per_row) / half;
    let i = idx % half;
    let cs = table[pos * half + i];
    let at = row * params.n_heads * params.head_dim + h * params.head_dim + 2u * i;
    let x0 = x[at];
    let x1 = x[at + 1u];
    x[at] = x0 * cs.x - x1 * cs.y;
    x[at + 1u] = x0 * cs.y + x1 * cs.x;
}
