// The per-pass state every kernel may read: binding 1 of group 0, a 32-byte slice of the step
// buffer (one 256-byte slot per pass of a cycle). Static shapes go in each kernel's own params.
// Packed by pyspec/gpu/step.py (pack_step); keep the two in the same order.
struct Step {
    rows: u32,         // tokens in this pass (1..ROWS_MAX); threads for rows >= this exit early
    pos: u32,          // absolute position of row 0 (its KV row; rows are pos .. pos+rows-1)
    seed_lo: u32,      // request seed, low 32 bits
    seed_hi: u32,      // request seed, high 32 bits
    temperature: f32,  // 0 = greedy
    n_draft: u32,      // drafted tokens K in this cycle (accept kernel)
    mode: u32,         // MODE_GREEDY, MODE_REPLAY or MODE_REJECTION (step.py MODES)
    flags: u32,        // FLAG_ONE_HOT: the drafts are deterministic (q_draft one-hot)
}
