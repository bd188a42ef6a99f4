"""Host wrappers of the forward's kernels (shaders/<op>.wgsl).

One wrapper per kernel: it owns the kernel's shape checks, its params uniform (made once, when a
plan is built) and its dispatch size, and returns a `device.Dispatch` for the caller to submit.
Dispatch sizes never depend on the rows of a pass (they are computed for ROWS_MAX): a pass reads
`rows` and `pos` from the Step uniform at binding 1, so a plan is built once and re-encoded every
cycle with only the step buffer changing. Every kernel is batch-invariant: row r of a pass is
bit-identical to a one-row pass at that position (tests/test_gpu_ops.py).

Buffer arguments are GPU buffers or (buffer, offset, size) tuples. Activations are f32 with room
for ROWS_MAX rows. Weights stay quantized on the GPU (`Weight`). Not here: uploading the
weights (weights.py), the order of the kernels (model.py), sampling (sampling.py), the cycle
(backend.py).
"""

from __future__ import annotations

import os
import weakref

import numpy as np

# the shaders get the same names (constants.py)
from .constants import ATTN_WG, ATTN_WG_CPU, BLOCK_KINDS, MATMUL_OUTS, NONE, WG
from .device import ROWS_MAX, Dispatch, ShapeError, binding_size, need, split_workgroups
from .weights import DENSE, Weight


# --- helpers ------------------------------------------------------------------------------------

def _fields(*values) -> np.ndarray:
    """A params uniform's fields: ints as u32, floats as f32 bits."""
    out = np.zeros(len(values), np.uint32)
    for i, v in enumerate(values):
        out[i] = np.float32(v).view(np.uint32) if isinstance(v, float) else int(v)
    return out


def _workgroups(threads: int) -> tuple[int, int, int]:
    return split_workgroups(-(-threads // WG))


# Threads a GPU product aims for, (n_out / MATMUL_OUTS) x lanes: on the H200 more threads per
# output shortened each thread's serial work up to about this many, beyond which they cost more
# than they saved (experiments/bench_kernels.py; bench/results/h200-kernels.json (legacy)).
MATMUL_THREADS = 12288


def _lanes(units: int, n_out: int) -> int:
    """Threads sharing one output group's dot products on a GPU: a power of two, at most 64
    (WG), no more than the power of two that covers the units (the blocks, or vec4 chunks for
    f32, of a weight row: the lanes past them idle), and no more than MATMUL_THREADS allows, but
    at least 4 (the head: fewer lanes were slower there). It depends on the weight's shape only,
    never on the rows of a pass (batch invariance)."""
    cover = 1 << max(0, (units - 1).bit_length())
    share = max(1, MATMUL_THREADS // max(1, -(-n_out // MATMUL_OUTS)))
    lanes = min(WG, cover, max(4, 1 << (share.bit_length() - 1)))
    return max(1, lanes)


# Adapters that run shaders on the CPU (Mesa's lavapipe, Chromium's SwiftShader), by adapter name.
# There a storage load that differs between invocations is a scalar loop over the SIMD lanes and
# a workgroup barrier is a coroutine switch, so matmul runs one thread per output group (lanes 1,
# no barrier). Measured by scripts/bench_matmul.py (removed: at commit 0e92f77).


def _cpu_adapter(dev) -> bool:
    """A software adapter (lavapipe, SwiftShader): each adapter says so (Device.is_cpu)."""
    return bool(dev.is_cpu)


# The kinds whose products take shaders/matmul_coalesced.wgsl on a GPU: its lanes read
# consecutive words of one weight row (slices.wgsl numbers each format's 8-value slices so).
# The dense kinds (f32, bf16) and every product on a CPU adapter take matmul.wgsl.
COALESCED_KINDS = ("q4_0", "q4_1", "q8_0", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k")
# The A/B switch: PYSPEC_MATMUL=blocks sends a GPU's quantized products to matmul.wgsl's lanes
# of whole blocks (the kernel before matmul_coalesced.wgsl); "coalesced" (the default) to
# matmul_coalesced.wgsl. The variable is read once, into GPU_MATMUL, which matmul reads as a plan
# is built (experiments/shader_ab.py --matmul sets it per side; the tests' use_layout too).
MATMUL_LAYOUTS = ("coalesced", "blocks")
GPU_MATMUL = os.environ.get("PYSPEC_MATMUL", "coalesced")
# Threads a coalesced product aims for at least, (n_out / MATMUL_OUTS) x lanes: a product with
# fewer at 32 lanes takes 64 where its rows have slices for them (_coalesced_lanes). About 16
# warps on each of an H100's 132 multiprocessors, for the loads in flight a bandwidth-bound
# product needs; a first guess that awaits measurement (experiments/shader_ab.py).
COALESCED_THREADS = 65536


def _coalesced_lanes(n_out: int, n_in: int) -> int:
    """Threads of an output group of matmul_coalesced.wgsl: 32 (a warp of consecutive words of a
    row), or 64 (WG) where 32 give fewer than COALESCED_THREADS threads and a row has at least
    two slices of 8 values per lane (n_in >= 1024). From the weight's shape only, never from the
    rows of a pass (batch invariance)."""
    groups = -(-n_out // MATMUL_OUTS)
    return WG if groups * 32 < COALESCED_THREADS and n_in // 8 >= 2 * WG else 32


def matmul_kernel(dev, weight: Weight) -> tuple[str, int]:
    """(shader, lanes) of a product of `weight` on `dev`: matmul.wgsl with lanes 1 on a CPU
    adapter; on a GPU matmul_coalesced.wgsl for COALESCED_KINDS (unless GPU_MATMUL is "blocks"),
    matmul.wgsl's lanes of whole blocks or vec4 columns (_lanes) for the rest. It depends on the
    device and the weight's kind and shape, never on the rows of a pass (batch invariance)."""
    if GPU_MATMUL not in MATMUL_LAYOUTS:
        raise ValueError(f"PYSPEC_MATMUL={GPU_MATMUL!r}: expected one of {MATMUL_LAYOUTS}")
    n_out, n_in = weight.shape
    if _cpu_adapter(dev):
        return "matmul", 1
    if weight.kind in COALESCED_KINDS and GPU_MATMUL == "coalesced":
        return "matmul_coalesced", _coalesced_lanes(n_out, n_in)
    return "matmul", _lanes(n_in // 4 if weight.kind in DENSE else n_in // 32, n_out)


# --- kernels ------------------------------------------------------------------------------------

EPILOGUE_NONE, EPILOGUE_ROPE = 0, 1                  # shaders/matmul_io.wgsl's codes
GATES = {"silu": 2, "gelu_tanh": 3}   # EPILOGUE_SILU_GATE, EPILOGUE_GELU_GATE by config.act


def _row_layers(dev) -> int:
    """matmul's workgroup layers along z (shaders/matmul.wgsl): on a GPU one per row tile a pass
    may have, so the tiles run side by side; on a CPU adapter one, whose threads loop over them."""
    return 1 if _cpu_adapter(dev) else ROWS_MAX // 4


def matmul(dev, weight: Weight, x, y, step, *, out_at_pos: bool = False,
           accumulate: bool = False, rope=None, head_dim: int = 0, max_ctx: int = 0,
           gate: str | None = None, qkv: tuple | None = None, norm: Weight | None = None,
           eps: float = 0.0, bias: Weight | None = None, y_stride: int = 0) -> Dispatch:
    """y[base + r] (= or +=) weight @ x[r] for r < step.rows; entry <shader>_<weight.kind> of
    the shader matmul_kernel picks (matmul.wgsl or matmul_coalesced.wgsl, which serve every
    option below alike: matmul_io.wgsl).

    weight (n_out, n_in); x (ROWS_MAX, n_in) f32; y (y_rows, n_out) f32: base = step.pos with
    out_at_pos (y a KV cache of y_rows = max_ctx rows; rows past it are skipped), else 0 (y needs
    ROWS_MAX rows). accumulate adds to y (the residual x += W h). With `rope` (rope_table(max_ctx))
    each head's output pairs of row r are rotated by position step.pos + r before they are stored
    (the Q and K products: model.Model.rope, fused). With `gate` ("silu" or "gelu_tanh", GATES)
    the weight is Weight.upload_pair(gate, up) and y (ROWS_MAX, n_out / 2) gets
    act(W_gate x) * (W_up x). With `bias` (an f32 vector of n_out) y = W x + bias before RoPE.
    With `qkv` = (k_cache, v_cache, nq, nk) the weight is Weight.upload_stack(q, k, v): outputs
    j < nq go to y (ROWS_MAX, nq), the next nk to row step.pos + r of k_cache (max_ctx, nk) and
    the rest to v_cache (max_ctx, n_out - nq - nk); RoPE rotates Q and K only; V's rows may be
    in another format (Weight.v_kind: a K-quant mix's attn_v). With `norm` (an
    f32 vector of n_in) the product takes x un-normed and folds RMSNorm in: y = W rms_norm(x).
    `y_stride` > n_out: y's rows are that many f32 apart (a part of a head split by rows,
    upload_rows, into its columns of the logits: y bound from the part's first column)."""
    if len(weight.shape) != 2:
        raise ShapeError(f"matmul needs a matrix; {weight.name!r} has shape {weight.shape}")
    n_out, n_in = weight.shape
    if weight.kind in DENSE and n_in % 4:
        raise ShapeError(f"matmul_{weight.kind} needs n_in % 4 == 0, got {n_in} ({weight.name!r})")
    need(dev, x, ROWS_MAX * n_in * 4, f"matmul x for {weight.name!r} (ROWS_MAX, {n_in})")
    if gate is not None and (out_at_pos or accumulate or rope is not None or n_out % 2
                             or gate not in GATES):
        raise ShapeError(f"matmul with a gate ({'/'.join(GATES)}) takes an interleaved (gate, up) "
                         f"pair into fresh activations; got {gate!r}, {weight.name!r} of {n_out} "
                         "rows")
    if bias is not None and (bias.kind != "f32" or bias.shape != (n_out,)):
        raise ShapeError(f"matmul's bias needs an f32 vector of {n_out}; {bias.name!r} is "
                         f"{bias.kind} {bias.shape}")
    if norm is not None and (norm.kind != "f32" or norm.shape != (n_in,) or n_in % 4):
        raise ShapeError(f"matmul's folded RMSNorm needs an f32 weight of {n_in}; "
                         f"{norm.name!r} is {norm.kind} {norm.shape}")
    k_out, v_out, nq, nk, kv_rows = _qkv_outputs(dev, weight, qkv, not (
        out_at_pos or accumulate or gate), head_dim if rope is not None else 0)
    y_cols = n_out // 2 if gate else nq or n_out
    y_rows = binding_size(dev, y) // (y_cols * 4)
    if y_stride and (out_at_pos or y_stride < y_cols or y_cols != n_out):
        raise ShapeError(f"matmul y rows {y_stride} apart cannot hold {y_cols} outputs of "
                         f"{weight.name!r} (a row stride serves plain products into activations)")
    y_stride = y_stride or y_cols
    if out_at_pos:
        if y_rows < 1:
            raise ShapeError(f"matmul y for {weight.name!r} holds no row of {n_out} f32")
    else:
        need(dev, y, ((ROWS_MAX - 1) * y_stride + y_cols) * 4,
             f"matmul y for {weight.name!r} (ROWS_MAX, {y_cols}, rows {y_stride} apart)")
        y_rows = ROWS_MAX
    if rope is not None:
        if accumulate or head_dim % 2 or not head_dim or n_out % head_dim:
            raise ShapeError(f"matmul with RoPE needs a fresh output of whole heads of an even "
                             f"head_dim; got n_out {n_out}, head_dim {head_dim}")
        need(dev, rope, max_ctx * head_dim * 4,
             f"rope table (max_ctx={max_ctx}, {head_dim // 2}, 2)")
    shader, lanes = matmul_kernel(dev, weight)   # never from the rows (batch invariance)
    epilogue = (EPILOGUE_ROPE if rope is not None else
                GATES[gate] if gate else EPILOGUE_NONE)
    params = dev.uniform(_fields(n_out, n_in, lanes, out_at_pos, accumulate, y_rows, epilogue,
                                 head_dim, max_ctx, nq, nk, kv_rows, norm is not None,
                                 float(eps), BLOCK_KINDS.get(weight.v_kind, NONE),
                                 weight.v_at, bias is not None, y_stride),
                         f"matmul {weight.name}")
    x_groups, y_groups, _ = split_workgroups(-(-n_out // (MATMUL_OUTS * WG // lanes)))
    groups = (x_groups, y_groups, _row_layers(dev))
    spare = _spares(dev)
    return dev.dispatch(shader, f"{shader}_{weight.kind}",
                        [params, step, weight.buffer, x, y,
                         rope if rope is not None else spare[0],
                         k_out if k_out is not None else spare[1],
                         v_out if v_out is not None else spare[2],
                         norm.buffer if norm is not None else spare[3],
                         bias.buffer if bias is not None else spare[4]], groups)


def _qkv_outputs(dev, weight: Weight, qkv, fresh: bool, head_dim: int):
    """(k_out, v_out, nq, nk, kv_rows) of matmul's `qkv`, checked (fresh outputs of whole heads,
    caches with a common row); (None, None, 0, 0, 0) for a product that holds no V rows."""
    n_out = weight.shape[0]
    if weight.v_kind and (qkv is None or qkv[2] + qkv[3] + weight.v_rows != n_out):
        raise ShapeError(f"{weight.name!r} holds V rows in {weight.v_kind}: it is a Q, K, V "
                         f"product of {weight.v_rows} V rows only")
    if qkv is None:
        return None, None, 0, 0, 0
    k_out, v_out, nq, nk = qkv
    nv = n_out - nq - nk
    if (not fresh or min(nq, nk, nv) < 1 or nq % 2 or nk % 2
            or (head_dim and (nq % head_dim or nk % head_dim))):
        raise ShapeError(f"matmul of Q, K and V takes their stacked rows into fresh outputs "
                         f"of whole heads; got {weight.name!r}: nq {nq}, nk {nk}, nv {nv}")
    kv_rows = binding_size(dev, k_out) // (nk * 4)
    if kv_rows < 1 or binding_size(dev, v_out) // (nv * 4) < kv_rows:
        raise ShapeError(f"matmul K and V caches for {weight.name!r} hold no common row")
    return k_out, v_out, nq, nk, kv_rows


_SPARES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _spares(dev) -> tuple:
    """What a product binds where it has no RoPE table, K or V cache, norm weight or bias: a binding
    must be bound (these are never read or written), and two writable bindings must not share
    a buffer."""
    if dev not in _SPARES:
        with dev.owned([]):   # the device's, not the owner of the plan being built (Device.free)
            _SPARES[dev] = tuple(dev.buffer(16, label=f"matmul.spare{i}") for i in range(5))
    return _SPARES[dev]


def embed(dev, weight: Weight, tokens, x, step, *, scale: float = 1.0, first: int = 0,
          total: int = 0) -> Dispatch:
    """x[r] = dequantized row tokens[r] of weight, times f32(scale) (config.embed_scale), for
    r < step.rows; entry embed_<weight.kind>. A part of a table split by rows (upload_rows) holds
    ids first.. of `total`, and writes only the rows whose token it holds.

    weight (vocab, d); tokens (ROWS_MAX,) u32; x (ROWS_MAX, d) f32. Bit-identical to
    quant.dequantize times the f32 scale."""
    if len(weight.shape) != 2:
        raise ShapeError(f"embed needs a (vocab, d) table; {weight.name!r} has {weight.shape}")
    vocab, d = weight.shape
    need(dev, tokens, ROWS_MAX * 4, "embed tokens (ROWS_MAX,) u32")
    need(dev, x, ROWS_MAX * d * 4, f"embed x (ROWS_MAX, {d})")
    total = total or vocab
    if not 0 <= first < first + vocab <= total:
        raise ShapeError(f"embed: rows {first}..{first + vocab} of {weight.name!r} are not "
                         f"inside a table of {total}")
    params = dev.uniform(_fields(d, vocab, 1.0, float(np.float32(scale)), first, total),
                         f"embed {weight.name}")
    return dev.dispatch("embed", f"embed_{weight.kind}", [params, step, weight.buffer, tokens, x],
                        _workgroups(ROWS_MAX * d))


def rmsnorm(dev, x, weight: Weight, y, step, *, eps: float, accumulate: bool = False) -> Dispatch:
    """y[r] (= or +=) x[r] / sqrt(mean(x[r]^2) + eps) * weight for r < step.rows: the norm as a
    pass of its own, for CPU adapters (GPUs fold it into the next product: matmul's `norm`), and
    with `accumulate` Gemma 3's post-norms (the residual add of a normed output, on every device).

    x, y (ROWS_MAX, d) f32 (distinct buffers); weight (d,) f32."""
    if weight.kind != "f32" or len(weight.shape) != 1:
        raise ShapeError(f"rmsnorm needs an f32 vector; {weight.name!r} is {weight.kind} "
                         f"{weight.shape}")
    (d,) = weight.shape
    need(dev, x, ROWS_MAX * d * 4, f"rmsnorm x (ROWS_MAX, {d})")
    need(dev, y, ROWS_MAX * d * 4, f"rmsnorm y (ROWS_MAX, {d})")
    params = dev.uniform(_fields(d, float(eps), accumulate), f"rmsnorm {weight.name}")
    return dev.dispatch("rmsnorm", "rmsnorm", [params, step, x, weight.buffer, y], ROWS_MAX)


def rope_table(dev, inv_freq: np.ndarray, max_ctx: int, label: str = "rope table"):
    """The (max_ctx, hd/2, 2) f32 table of (cos, sin) that matmul's RoPE epilogue and qk_norm
    read, for the float64 frequencies inv_freq (hd/2,) (cpu.model.rope_inv_freq): angles in
    float64, then cast to f32, exactly as the reference's rope computes them."""
    ang = np.arange(max_ctx)[:, None].astype(np.float64) * inv_freq[None, :]      # (ctx, hd/2)
    table = np.stack([np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)], axis=-1)
    return dev.upload(table, label=label)


def attention_scratch_bytes(n_heads: int, max_ctx: int) -> int:
    """Bytes of the scratch `attention` needs: (ROWS_MAX, n_heads, max_ctx) f32, each (row,
    head)'s scores (its partials stay in workgroup memory). One scratch serves every layer
    (dispatches run in order)."""
    return ROWS_MAX * n_heads * max_ctx * 4


def attention_groups(head_dim: int, threads: int) -> int:
    """Position groups of attention's phase 2 (shaders/attention.wgsl): each group is head_dim / 4
    threads, one per 4 output dims, and owns every groups-th position. A power of two (so it
    divides `threads` and a group's positions are the ones phase 1's threads t = g (mod groups)
    scored), as many as `threads` hold. It depends on the shapes only (batch invariance)."""
    groups = 1
    while 2 * groups * (head_dim // 4) <= threads:
        groups *= 2
    return groups


def attention(dev, q, kcache, vcache, scratch, out, step, *, n_heads: int, n_kv_heads: int,
              head_dim: int, max_ctx: int, scale: float | None = None,
              window: int = 0, tree: bool = False) -> Dispatch:
    """out[r] = causal GQA attention of q[r] over cache rows lo..p (p = step.pos + r), for
    r < step.rows: lo = 0, or max(0, p + 1 - window) with a sliding window (Gemma 3's local
    layers). Scores are q.k * f32(scale), default 1/sqrt(head_dim). `tree`: the entry that also
    runs a tree's pass (its rows' positions and ancestors from the Step: shaders/tree.wgsl).

    q, out (ROWS_MAX, n_heads * head_dim) f32; kcache, vcache (max_ctx, n_kv_heads * head_dim)
    f32 holding this pass's rows already; scratch: attention_scratch_bytes(n_heads, max_ctx).

    One workgroup per (row, head) splits the positions among its threads (scores, then position
    groups each with a partial max, sum of exp and weighted V sum, merged in group order):
    ATTN_WG threads on a GPU, ATTN_WG_CPU on a software adapter (measured on lavapipe: 64 threads
    cost a third of 256 at 40 positions and less at 1000). The split stays inside a workgroup: a
    split across workgroups needs its merge after a barrier that WGSL only has between dispatches
    (its barriers are per workgroup and it has no device-scope fence, so a last-workgroup merge
    could read stale partials), and a merge dispatch per layer would take a one-token pass from
    152 to 182 dispatches."""
    if n_heads % n_kv_heads:
        raise ShapeError(f"attention: {n_kv_heads} KV heads do not divide {n_heads} heads")
    threads = ATTN_WG_CPU if _cpu_adapter(dev) else ATTN_WG
    if head_dim % 4 or not 4 <= head_dim <= 4 * threads:
        raise ShapeError(f"attention reads heads as vec4 with one thread per 4 dims: head_dim "
                         f"must be a multiple of 4 up to {4 * threads}, got {head_dim}")
    width, kv_width = n_heads * head_dim, n_kv_heads * head_dim
    need(dev, q, ROWS_MAX * width * 4, f"attention q (ROWS_MAX, {width})")
    need(dev, out, ROWS_MAX * width * 4, f"attention out (ROWS_MAX, {width})")
    need(dev, kcache, max_ctx * kv_width * 4, f"attention kcache ({max_ctx}, {kv_width})")
    need(dev, vcache, max_ctx * kv_width * 4, f"attention vcache ({max_ctx}, {kv_width})")
    need(dev, scratch, attention_scratch_bytes(n_heads, max_ctx), "attention scratch")
    if window < 0:
        raise ShapeError(f"attention's sliding window is a number of positions, got {window}")
    scale = float(np.float32(1.0 / np.sqrt(head_dim) if scale is None else scale))
    params = dev.uniform(_fields(n_heads, n_kv_heads, head_dim, max_ctx, scale,
                                 attention_groups(head_dim, threads), window), "attention")
    entry = "attention" + ("_tree" if tree else "") + ("_cpu" if _cpu_adapter(dev) else "")
    return dev.dispatch("attention", entry, [params, step, q, kcache, vcache, scratch, out],
                        split_workgroups(ROWS_MAX * n_heads))


def qk_norm(dev, q, kcache, weight: Weight, rope, step, *, n_heads: int, n_kv_heads: int,
            head_dim: int, max_ctx: int, eps: float) -> Dispatch:
    """Per-head RMSNorm, then RoPE, of Q (q[r]) and K (cache row step.pos + r) in place, for
    r < step.rows (Qwen3, Gemma 3: the norms come before the rotation, so the Q/K/V product
    stores them unrotated and this pass follows it).

    q (ROWS_MAX, n_heads * hd) f32; kcache (max_ctx, n_kv_heads * hd) f32; weight (2 hd,) f32:
    the Q norm's weight, then the K norm's; rope: rope_table(max_ctx)."""
    if head_dim % 2 or weight.kind != "f32" or weight.shape != (2 * head_dim,):
        raise ShapeError(f"qk_norm needs an even head_dim and the Q and K norm weights as one f32 "
                         f"vector of 2 x {head_dim}; got {weight.name!r} {weight.kind} "
                         f"{weight.shape}")
    need(dev, q, ROWS_MAX * n_heads * head_dim * 4, f"qk_norm q (ROWS_MAX, {n_heads * head_dim})")
    need(dev, kcache, max_ctx * n_kv_heads * head_dim * 4,
         f"qk_norm kcache ({max_ctx}, {n_kv_heads * head_dim})")
    need(dev, rope, max_ctx * head_dim * 4, f"rope table ({max_ctx}, {head_dim // 2}, 2)")
    params = dev.uniform(_fields(n_heads, n_kv_heads, head_dim, max_ctx, max_ctx, float(eps)),
                         "qk_norm")
    return dev.dispatch("qk_norm", "qk_norm", [params, step, q, kcache, weight.buffer, rope],
                        split_workgroups(ROWS_MAX * (n_heads + n_kv_heads)))
