// The elementwise logits processors on the device (pyspec/processors.py Penalties), so that a
// request with only these keeps the 68-word accept readback:
//   penalize_rows  logit_bias, then repetition_penalty over the tokens seen in the prompt and the
//                  output, then presence and frequency penalties over the output's counts, in
//                  place on the champion's logits rows. Row r's context is the committed tokens
//                  (`counts`) plus the drafts before it: the pass's token list holds
//                  [t_{n-1}, d_1..d_K], so row r adds tokens[1..r] (t_{n-1} is counted already).
//   count_tokens   adds a cycle's emitted tokens (the accept kernel's output) to `counts`, so the
//                  counts stay on the device from cycle to cycle; the host sets them once per
//                  request from the prompt and any resumed ids.
// Host wrappers: pyspec/gpu/sampling.py (penalize_rows, count_tokens). Arithmetic in f32 (the
// host's processors.py in f64): the GPU's processed rows are its own champion-only reference.

//!include step.wgsl

struct Params {
    vocab: u32,        // entries per row
    rows_cap: u32,     // rows the logits buffer holds; the dispatch size
    repetition: f32,   // repetition_penalty (1 = off)
    presence: f32,     // presence_penalty
    frequency: f32,    // frequency_penalty
    has_bias: u32,     // 1: add bias[i]
    out_offset: u32,   // count_tokens: element index of the accept words
    pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<uniform> step: Step;
// penalize_rows
@group(0) @binding(2) var<storage, read_write> logits: array<f32>;  // (rows_cap, vocab)
// count_tokens
@group(0) @binding(2) var<storage, read> words: array<u32>;         // (out_offset + ACCEPT_WORDS,)
// both: seen[i] = occurrences in prompt + output, then output[i] = occurrences in the output
@group(0) @binding(3) var<storage, read_write> counts: array<u32>;  // (2, vocab)
// penalize_rows
@group(0) @binding(4) var<storage, read> bias: array<f32>;          // (vocab,)
@group(0) @binding(5) var<storage, read> context: array<u32>;       // (ROWS_MAX,) the pass's tokens

// Workgroup (c, r) takes ids [c, c + 1) * ARGMAX_CHUNK of row r (one workgroup per row left a
// GPU idle, as it did sample.wgsl's kernels); threads stride the chunk. Every element is its own
// computation, so a row's result depends neither on the split nor on how many rows the pass has.
@compute @workgroup_size(WG_ROW)
fn penalize_rows(@builtin(workgroup_id) wid: vec3<u32>,
                 @builtin(local_invocation_index) tid: u32) {
    let r = wid.y;
    if (r >= step.rows || r >= params.rows_cap) { return; }
    let base = r * params.vocab;
    let end = min((wid.x + 1u) * ARGMAX_CHUNK, params.vocab);
    for (var i = wid.x * ARGMAX_CHUNK + tid; i < end; i += WG_ROW) {
        var extra = 0u;                   // drafts d_1..d_r equal to token i
        for (var j = 1u; j <= r; j++) {
            extra += select(0u, 1u, context[j] == i);
        }
        let seen = counts[i] + extra;
        let output = counts[params.vocab + i] + extra;
        var x = logits[base + i];
        if (params.has_bias == 1u) { x += bias[i]; }
        if (params.repetition != 1.0 && seen > 0u) {
            x = select(x * params.repetition, x / params.repetition, x > 0.0);
        }
        if (output > 0u) { x -= f32(output) * params.frequency + params.presence; }
        logits[base + i] = x;
    }
}

// Thread 0 of one workgroup: add the emitted tokens (accept's words) to seen and output. One
// thread, so two equal tokens in one cycle count twice without atomics.
@compute @workgroup_size(WG_ROW)
fn count_tokens(@builtin(local_invocation_index) tid: u32) {
    _ = step.rows;  // binding 1 is part of every kernel's layout
    if (tid != 0u) { return; }
    let n = words[params.out_offset + ACCEPT_N_EMITTED];
    for (var j = 0u; j < n && j < ROWS_MAX; j++) {
        let t = words[params.out_offset + ACCEPT_TOKENS + j];
        if (t < params.vocab) {
            counts[t] += 1u;
            counts[params.vocab + t] += 1u;
        }
    }
}
