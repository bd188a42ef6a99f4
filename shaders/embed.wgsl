// Token embedding: x[r, :] = row tokens[r] of the table, dequantized, for r < step.rows.
// The table uses the layouts of blocks.wgsl (Q8_0 repacked to 9 u32 per block, so a tied head and
// the embedding share one buffer), or f32, or bf16. The result is bit-identical to
// quant.dequantize: d * q (+ m) in f32, rounded after each operation (see embed_q4_1 for how the
// add is kept unfused), then times `scale` (Gemma 3's sqrt(d); 1.0 elsewhere, which changes no value).
// A table too large for one binding is split by rows (weights.upload_rows): a part holds ids
// first .. first + vocab - 1 and writes only the rows whose token it holds, one dispatch a part.
// One thread per element of (ROWS_MAX, d); no barriers. Token ids >= total are clamped (robustness
// only: the engine never feeds them).

//!include step.wgsl
//!include blocks.wgsl

struct Params {
    d: u32,      // width of a row (a multiple of 32 for the block formats, 256 for K-quants)
    vocab: u32,  // rows of the table (of this part)
    one: f32,    // 1.0, opaque to the compiler (see embed_q4_1)
    scale: f32,  // config.embed_scale as f32
    first: u32,  // the token id of the part's row 0 (0: the whole table)
    total: u32,  // ids of the whole table
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> w: array<u32>;         // (vocab, row words) the table
@group(0) @binding(3) var<storage, read> tokens: array<u32>;    // (ROWS_MAX,)
@group(0) @binding(4) var<storage, read_write> x: array<f32>;   // (ROWS_MAX, d)

struct Element {
    ok: bool,   // inside the pass
    at: u32,    // index into x
    e: u32,     // element index within the token's row
    token: u32, // the row of this table (part)
}

fn element(t: u32, wid: vec3<u32>, nwg: vec3<u32>) -> Element {
    let at = (wid.x + wid.y * nwg.x) * WG + t;
    let r = at / params.d;
    let id = min(tokens[min(r, ROWS_MAX - 1u)], params.total - 1u);
    let ok = r < min(step.rows, ROWS_MAX) && id >= params.first && id - params.first < params.vocab;
    return Element(ok, at, at % params.d, select(0u, id - params.first, ok));
}

@compute @workgroup_size(WG)
fn embed_q8_0(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let el = element(t, wid, nwg);
    if (!el.ok) {
        return;
    }
    let blk = (el.token * (params.d / 32u) + el.e / 32u) * 9u;
    let i = el.e % 32u;
    let d = unpack2x16float(w[blk]).x;
    let q = bitcast<i32>(w[blk + 1u + i / 4u] << (24u - 8u * (i % 4u))) >> 24u;
    x[el.at] = (d * f32(q)) * params.scale;
}

@compute @workgroup_size(WG)
fn embed_q4_1(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let el = element(t, wid, nwg);
    if (!el.ok) {
        return;
    }
    let blk = (el.token * (params.d / 32u) + el.e / 32u) * 5u;
    let i = el.e % 32u;
    let dm = unpack2x16float(w[blk]);
    let shift = 8u * (i % 4u) + select(0u, 4u, i >= 16u);
    let q = f32((w[blk + 1u + (i % 16u) / 4u] >> shift) & 15u);
    // Why `* params.one`: a compiler may contract d * q + m into one fma (one rounding), which
    // would differ from the reference's two roundings. The product of d * q feeds a multiply, not
    // an add, so it is rounded; fma(p, 1, m) then equals p + m rounded once, as in numpy.
    x[el.at] = ((dm.x * q) * params.one + dm.y) * params.scale;
}

@compute @workgroup_size(WG)
fn embed_f32(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let el = element(t, wid, nwg);
    if (!el.ok) {
        return;
    }
    x[el.at] = bitcast<f32>(w[el.token * params.d + el.e]) * params.scale;
}

// The formats of blocks.wgsl's `affine`: p + o with each operand `* params.one`: both are
// products (Q4_K's o is -(dmin m)), and either could otherwise be contracted into an fma with the
// add, one rounding where the reference has two (see embed_q4_1).
fn embed_unpacked(kind: u32, t: u32, wid: vec3<u32>, nwg: vec3<u32>) {
    let el = element(t, wid, nwg);
    if (!el.ok) {
        return;
    }
    let i = el.e % 32u;
    let a = affine(kind, load_block(kind, 0u, el.token, el.e / 32u, params.d / 32u), i / 4u);
    x[el.at] = (a.p[i % 4u] * params.one + a.o[i % 4u] * params.one) * params.scale;
}

@compute @workgroup_size(WG)
fn embed_q4_0(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    embed_unpacked(KIND_Q4_0, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn embed_q5_0(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    embed_unpacked(KIND_Q5_0, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn embed_q5_1(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    embed_unpacked(KIND_Q5_1, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn embed_q4_k(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    embed_unpacked(KIND_Q4_K, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn embed_q5_k(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    embed_unpacked(KIND_Q5_K, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn embed_q6_k(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    embed_unpacked(KIND_Q6_K, t, wid, nwg);
}

@compute @workgroup_size(WG)
fn embed_bf16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let el = element(t, wid, nwg);
    if (!el.ok) {
        return;
    }
    let at = el.token * params.d + el.e;   // element index: two per u32, the low half first
    x[el.at] = bitcast<f32>((w[at / 2u] >> (16u * (at % 2u))) << 16u) * params.scale;
}
