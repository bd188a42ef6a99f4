// Residual add in place: y[r, i] += x[r, i] for r < step.rows, i < n. One thread per element.

//!include step.wgsl

struct Params {
    n: u32,  // elements per row
}

const WG: u32 = 64u;
const ROWS_MAX: u32 = 16u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;  // (ROWS_MAX, n)
@group(0) @binding(3) var<storage, read> x: array<f32>;        // (ROWS_MAX, n)

@compute @workgroup_size(64)
fn add(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
       @builtin(num_workgroups) nwg: vec3<u32>) {
    let at = (wid.x + wid.y * nwg.x) * WG + t;
    if (at / params.n >= min(step.rows, ROWS_MAX)) {
        return;
    }
    y[at] = y[at] + x[at];
}
