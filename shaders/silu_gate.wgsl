// SiLU gate, in place into g: g[r, i] = g / (1 + exp(-g)) * u[r, i] for r < step.rows, i < d_ff
// (the reference's g / (1 + np.exp(-g)) * u). One thread per element; no barriers.

//!include step.wgsl

struct Params {
    n: u32,  // d_ff: elements per row
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read_write> g: array<f32>;  // (ROWS_MAX, d_ff) gate; out
@group(0) @binding(3) var<storage, read> u: array<f32>;        // (ROWS_MAX, d_ff) up projection

@compute @workgroup_size(WG)
fn silu_gate(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let at = (wid.x + wid.y * nwg.x) * WG + t;
    if (at / params.n >= min(step.rows, ROWS_MAX)) {
        return;
    }
    let v = g[at];
    g[at] = v / (1.0 + exp(-v)) * u[at];
}
