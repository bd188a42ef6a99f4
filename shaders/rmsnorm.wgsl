// RMSNorm: y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for r < step.rows (model.rms_norm);
// with `accumulate`, y[r] += that instead (Gemma 3's post-norms: the residual add of a normed
// attention or FFN output).
// One workgroup of WG threads per row: thread t sums the squares of elements t, t + WG, ... in
// order, one workgroup barrier, then every thread adds the WG partials in the same order (so no
// second barrier is needed) and writes its elements. The split depends on d only: batch-invariant.

//!include step.wgsl

struct Params {
    d: u32,    // width of a row
    eps: f32,  // <arch>.attention.layer_norm_rms_epsilon
    accumulate: u32,  // 1: y += the normed row; 0: y = it
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> x: array<f32>;         // (ROWS_MAX, d)
@group(0) @binding(3) var<storage, read> weight: array<f32>;    // (d,)
@group(0) @binding(4) var<storage, read_write> y: array<f32>;   // (ROWS_MAX, d)

var<workgroup> part: array<f32, WG>;  // (WG,) partial sums of squares

@compute @workgroup_size(WG)
fn rmsnorm(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.x;  // one workgroup per row: uniform, so the early return keeps the barrier legal
    if (r >= min(step.rows, ROWS_MAX)) {
        return;
    }
    let row = r * params.d;
    var s = 0.0;
    for (var i = t; i < params.d; i += WG) {
        let v = x[row + i];
        s += v * v;
    }
    part[t] = s;
    workgroupBarrier();
    var total = 0.0;
    for (var l = 0u; l < WG; l++) {
        total += part[l];
    }
    let norm = sqrt(total / f32(params.d) + params.eps);
    for (var i = t; i < params.d; i += WG) {
        let v = x[row + i] / norm * weight[i];
        if (params.accumulate != 0u) {
            y[row + i] = y[row + i] + v;
        } else {
            y[row + i] = v;
        }
    }
}
