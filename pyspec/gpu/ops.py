"""Host wrappers of the forward's kernels (shaders/<op>.wgsl) and weight upload.

One wrapper per kernel: it owns the kernel's shape checks, its params uniform (made once, when a
plan is built) and its dispatch size, and returns a `device.Dispatch` for the caller to submit.
Dispatch sizes never depend on the rows of a pass (they are computed for ROWS_MAX): a pass reads
`rows` and `pos` from the Step uniform at binding 1, so a plan is built once and re-encoded every
cycle with only the step buffer changing. Every kernel is batch-invariant: row r of a pass is
bit-identical to a one-row pass at that position (tests/test_gpu_ops.py).

Buffer arguments are GPU buffers or (buffer, offset, size) tuples. Activations are f32 with room
for ROWS_MAX rows. Weights stay quantized on the GPU (`Weight`).
Not here: the order of the kernels (model.py), sampling (sampling.py), the cycle (backend.py).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from ..formats import quant
from ..formats.gguf import GGUFFile

# the shaders get the same names (constants.py)
from .constants import ATTN_WG, ATTN_WG_CPU, BLOCK_KINDS, MATMUL_OUTS, NONE, WG
from .device import ROWS_MAX, Dispatch, ShapeError, binding_size, need, split_workgroups

# --- weights ------------------------------------------------------------------------------------

# GPU layout per GGUF type (shaders/blocks.wgsl): the kind names the matmul_<kind> and
# embed_<kind> entry points. Blocks whose size is not a multiple of 4 bytes get 2 zero bytes at
# _PADS' offset so that they are u32-aligned: Q4_0 18 -> 20, Q8_0 34 -> 36 and Q5_0 22 -> 24
# after their f16 d, Q6_K 210 -> 212 at the end; the values stay in their block format. F16
# (tiny test models) is widened to f32, and so are BF16 vectors (norms); BF16 matrices stay BF16.
_KINDS = {quant.Q4_0.type_id: "q4_0", quant.Q4_1.type_id: "q4_1", quant.Q8_0.type_id: "q8_0",
          quant.Q5_0.type_id: "q5_0", quant.Q5_1.type_id: "q5_1", quant.Q4_K.type_id: "q4_k",
          quant.Q5_K.type_id: "q5_k", quant.Q6_K.type_id: "q6_k", quant.BF16.type_id: "bf16",
          quant.F32.type_id: "f32", quant.F16.type_id: "f32"}
_PADS = {quant.Q4_0.type_id: 2, quant.Q8_0.type_id: 2, quant.Q5_0.type_id: 2,
         quant.Q6_K.type_id: 210}
DENSE = ("f32", "bf16")   # kinds read 4 values at a time (n_in % 4 == 0), not in blocks
# A Q, K, V stack may hold V in another format than Q and K, as K-quant mixes do (formats/mixes.py:
# attn_v in Q6_K on some layers, Q8_0 where the width falls back): matmul.wgsl's quantized_v.
MIXED_V = {"q5_0": ("q8_0",), "q5_1": ("q8_0",), "q4_k": ("q6_k", "q8_0"),
           "q5_k": ("q6_k", "q8_0")}


def repack(raw: np.ndarray, fmt: quant.BlockFormat, at: int) -> np.ndarray:
    """Blocks of `fmt` (n_blocks * block_bytes,) -> (n_blocks, block_bytes + 2) uint8, with two
    zero bytes inserted at byte `at` of each block."""
    blocks = np.asarray(raw, np.uint8).reshape(-1, fmt.block_bytes)
    out = np.zeros((blocks.shape[0], fmt.block_bytes + 2), np.uint8)
    out[:, :at] = blocks[:, :at]
    out[:, at + 2:] = blocks[:, at:]
    return out


@dataclass(frozen=True)
class Weight:
    """A tensor on the GPU: `kind` one of _KINDS' ('q4_k', 'f32', ...), `shape` (n_out, n_in)
    or (n,). A Q, K, V stack whose last `v_rows` rows (V) are in another format `v_kind` has
    them from word `v_at` of the buffer (upload_stack)."""
    buffer: object
    kind: str
    shape: tuple[int, ...]
    name: str = ""
    v_kind: str = ""
    v_rows: int = 0
    v_at: int = 0

    @classmethod
    def upload(cls, dev, f: GGUFFile, name: str) -> "Weight":
        """Upload tensor `name` of a GGUF file. Holds at most one repacked copy of this tensor."""
        data, kind, shape = cls.host_bytes(f, name)
        _check_binding(dev, name, data.nbytes)
        return cls(dev.upload(data, label=name), kind, shape, name)

    @staticmethod
    def host_bytes(f: GGUFFile, name: str) -> tuple[np.ndarray, str, tuple]:
        """(the bytes the GPU gets, kind, shape) of tensor `name`."""
        t = f.tensor(name)
        kind = _KINDS[t.type_id]   # every format quant.py reads (gguf.py refuses the rest)
        if len(t.shape) not in (1, 2):
            raise ShapeError(f"tensor {name!r} has shape {t.shape}; expected a matrix or vector")
        raw = f.raw(name)
        if t.type_id in _PADS:
            data = repack(raw, t.format, _PADS[t.type_id])
        elif t.type_id == quant.F16.type_id or (kind == "bf16" and len(t.shape) == 1):
            data, kind = quant.dequantize(raw, t.type_id, t.shape), "f32"
        else:
            data = raw  # blocks of 20, 24, 144 or 176 bytes, F32 and BF16 are u32-aligned as is
        return data, kind, tuple(t.shape)

    @classmethod
    def upload_pair(cls, dev, f: GGUFFile, gate: str, up: str) -> "Weight":
        """Two matrices of one type and shape as one, their rows interleaved (gate row i, then
        up row i): the weight of matmul(silu_gate=True), whose output pairs are (g_i, u_i).
        Rows are whole blocks, so interleaving moves bytes and changes no value."""
        a, b = (cls.host_bytes(f, n) for n in (gate, up))
        if a[1:] != b[1:]:
            raise ShapeError(f"{gate!r} and {up!r} differ in type or shape; they cannot be paired")
        (da, kind, shape), db = a, b[0]
        rows = np.stack([da.reshape(shape[0], -1), db.reshape(shape[0], -1)], axis=1)
        data = rows.reshape(2 * shape[0], -1)                       # (2 n_out, row bytes)
        _check_binding(dev, f"{gate}+{up}", data.nbytes)
        return cls(dev.upload(data, label=f"{gate}+{up}"), kind, (2 * shape[0], shape[1]),
                   f"{gate}+{up}")

    @classmethod
    def upload_stack(cls, dev, f: GGUFFile, names: list[str]) -> "Weight":
        """Matrices of one width as one, rows of the first, then the second, ...: the weight of
        matmul(qkv=...), names = (Q, K, V). Rows are whole blocks, so stacking changes no value.
        All of one type, or V alone in another where MIXED_V allows it (a K-quant mix)."""
        parts = [cls.host_bytes(f, n) for n in names]
        kind, n_in = parts[0][1], parts[0][2][1]
        v_kind = parts[-1][1] if parts[-1][1] in MIXED_V.get(kind, ()) else ""
        if any(p[1] not in (kind, v_kind) or len(p[2]) != 2 or p[2][1] != n_in for p in parts) \
                or any(p[1] != kind for p in parts[:-1]):
            raise ShapeError(f"{names} differ in type or width; they cannot be stacked")
        data = np.concatenate([np.ascontiguousarray(p[0]).view(np.uint8).reshape(-1)
                               for p in parts])                            # the rows' bytes
        name = "+".join(names)
        _check_binding(dev, name, data.nbytes)
        n_out = sum(p[2][0] for p in parts)
        mixed = dict(v_kind=v_kind, v_rows=parts[-1][2][0],
                     v_at=(data.nbytes - parts[-1][0].nbytes) // 4) if v_kind else {}
        return cls(dev.upload(data, label=name), kind, (n_out, n_in), name, **mixed)

    @property
    def nbytes(self) -> int:
        """Bytes of the GPU copy."""
        if self.v_kind:
            return self.v_at * 4 + _kind_bytes(self.v_kind, self.v_rows * self.shape[1])
        return _kind_bytes(self.kind, int(np.prod(self.shape)))


def _kind_bytes(kind: str, n: int) -> int:
    """Bytes of n values of a kind on the GPU."""
    if kind in DENSE:
        return n * (4 if kind == "f32" else 2)
    fmt = quant.BY_NAME[kind.upper()]
    return n // fmt.block_elems * (fmt.block_bytes + (2 if fmt.type_id in _PADS else 0))


# --- helpers ------------------------------------------------------------------------------------

def _check_binding(dev, name: str, nbytes: int) -> None:
    limit = getattr(dev, "limits", {}).get("max-storage-buffer-binding-size")
    if limit is not None and nbytes > limit:
        raise ShapeError(f"tensor {name!r} needs {nbytes} bytes on the GPU; this device binds at "
                         f"most {limit} per buffer")


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
# than they saved (scripts/bench_kernels.py; bench/results/h200-kernels.json).
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
# no barrier). scripts/bench_matmul.py measures it.


def _cpu_adapter(dev) -> bool:
    """A software adapter (lavapipe, SwiftShader): each adapter says so (Device.is_cpu)."""
    return bool(dev.is_cpu)


# --- kernels ------------------------------------------------------------------------------------

EPILOGUE_NONE, EPILOGUE_ROPE, EPILOGUE_SILU_GATE = 0, 1, 2   # shaders/matmul.wgsl's


def _row_layers(dev) -> int:
    """matmul's workgroup layers along z (shaders/matmul.wgsl): on a GPU one per row tile a pass
    may have, so the tiles run side by side; on a CPU adapter one, whose threads loop over them."""
    return 1 if _cpu_adapter(dev) else ROWS_MAX // 4


def matmul(dev, weight: Weight, x, y, step, *, out_at_pos: bool = False,
           accumulate: bool = False, rope=None, head_dim: int = 0, max_ctx: int = 0,
           silu_gate: bool = False, qkv: tuple | None = None, norm: Weight | None = None,
           eps: float = 0.0) -> Dispatch:
    """y[base + r] (= or +=) weight @ x[r] for r < step.rows; entry matmul_<weight.kind>.

    weight (n_out, n_in); x (ROWS_MAX, n_in) f32; y (y_rows, n_out) f32: base = step.pos with
    out_at_pos (y a KV cache of y_rows = max_ctx rows; rows past it are skipped), else 0 (y needs
    ROWS_MAX rows). accumulate adds to y (the residual x += W h). With `rope` (rope_table(max_ctx))
    each head's output pairs of row r are rotated by position step.pos + r before they are stored
    (the Q and K products: model.Model.rope, fused). With `silu_gate` the weight is
    Weight.upload_pair(gate, up) and y (ROWS_MAX, n_out / 2) gets silu(W_gate x) * (W_up x).
    With `qkv` = (k_cache, v_cache, nq, nk) the weight is Weight.upload_stack(q, k, v): outputs
    j < nq go to y (ROWS_MAX, nq), the next nk to row step.pos + r of k_cache (max_ctx, nk) and
    the rest to v_cache (max_ctx, n_out - nq - nk); RoPE rotates Q and K only; V's rows may be
    in another format (Weight.v_kind: a K-quant mix's attn_v). With `norm` (an
    f32 vector of n_in) the product takes x un-normed and folds RMSNorm in: y = W rms_norm(x)."""
    if len(weight.shape) != 2:
        raise ShapeError(f"matmul needs a matrix; {weight.name!r} has shape {weight.shape}")
    n_out, n_in = weight.shape
    if weight.kind in DENSE and n_in % 4:
        raise ShapeError(f"matmul_{weight.kind} needs n_in % 4 == 0, got {n_in} ({weight.name!r})")
    need(dev, x, ROWS_MAX * n_in * 4, f"matmul x for {weight.name!r} (ROWS_MAX, {n_in})")
    if silu_gate and (out_at_pos or accumulate or rope is not None or n_out % 2):
        raise ShapeError(f"matmul with the SiLU gate takes an interleaved (gate, up) pair into "
                         f"fresh activations; got {weight.name!r} of {n_out} rows")
    if norm is not None and (norm.kind != "f32" or norm.shape != (n_in,) or n_in % 4):
        raise ShapeError(f"matmul's folded RMSNorm needs an f32 weight of {n_in}; "
                         f"{norm.name!r} is {norm.kind} {norm.shape}")
    k_out, v_out, nq, nk, kv_rows = None, None, 0, 0, 0
    if weight.v_kind and (qkv is None or qkv[2] + qkv[3] + weight.v_rows != n_out):
        raise ShapeError(f"{weight.name!r} holds V rows in {weight.v_kind}: it is a Q, K, V "
                         f"product of {weight.v_rows} V rows only")
    if qkv is not None:
        k_out, v_out, nq, nk = qkv
        nv = n_out - nq - nk
        if (out_at_pos or accumulate or silu_gate or min(nq, nk, nv) < 1
                or (rope is not None and (nq % head_dim or nk % head_dim)) or nq % 2 or nk % 2):
            raise ShapeError(f"matmul of Q, K and V takes their stacked rows into fresh outputs "
                             f"of whole heads; got {weight.name!r}: nq {nq}, nk {nk}, nv {nv}")
        kv_rows = binding_size(dev, k_out) // (nk * 4)
        if kv_rows < 1 or binding_size(dev, v_out) // (nv * 4) < kv_rows:
            raise ShapeError(f"matmul K and V caches for {weight.name!r} hold no common row")
    y_cols = n_out // 2 if silu_gate else nq or n_out
    y_rows = binding_size(dev, y) // (y_cols * 4)
    if out_at_pos:
        if y_rows < 1:
            raise ShapeError(f"matmul y for {weight.name!r} holds no row of {n_out} f32")
    else:
        need(dev, y, ROWS_MAX * y_cols * 4, f"matmul y for {weight.name!r} (ROWS_MAX, {y_cols})")
        y_rows = ROWS_MAX
    if rope is not None:
        if accumulate or head_dim % 2 or not head_dim or n_out % head_dim:
            raise ShapeError(f"matmul with RoPE needs a fresh output of whole heads of an even "
                             f"head_dim; got n_out {n_out}, head_dim {head_dim}")
        need(dev, rope, max_ctx * head_dim * 4,
             f"rope table (max_ctx={max_ctx}, {head_dim // 2}, 2)")
    # lanes depends on the device and n_in only, never on rows (batch invariance).
    lanes = (1 if _cpu_adapter(dev) else
             _lanes(n_in // 4 if weight.kind in DENSE else n_in // 32, n_out))
    epilogue = (EPILOGUE_ROPE if rope is not None else
                EPILOGUE_SILU_GATE if silu_gate else EPILOGUE_NONE)
    params = dev.uniform(_fields(n_out, n_in, lanes, out_at_pos, accumulate, y_rows, epilogue,
                                 head_dim, max_ctx, nq, nk, kv_rows, norm is not None,
                                 float(eps), BLOCK_KINDS.get(weight.v_kind, NONE),
                                 weight.v_at), f"matmul {weight.name}")
    x_groups, y_groups, _ = split_workgroups(-(-n_out // (MATMUL_OUTS * WG // lanes)))
    groups = (x_groups, y_groups, _row_layers(dev))
    spare = _spares(dev)
    return dev.dispatch("matmul", f"matmul_{weight.kind}",
                        [params, step, weight.buffer, x, y,
                         rope if rope is not None else spare[0],
                         k_out if k_out is not None else spare[1],
                         v_out if v_out is not None else spare[2],
                         norm.buffer if norm is not None else spare[3]], groups)


_SPARES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _spares(dev) -> tuple:
    """What a product binds where it has no RoPE table, K or V cache or norm weight: a binding
    must be bound (these are never read or written), and two writable bindings must not share
    a buffer."""
    if dev not in _SPARES:
        with dev.owned([]):   # the device's, not the owner of the plan being built (Device.free)
            _SPARES[dev] = tuple(dev.buffer(16, label=f"matmul.spare{i}") for i in range(4))
    return _SPARES[dev]


def embed(dev, weight: Weight, tokens, x, step) -> Dispatch:
    """x[r] = dequantized row tokens[r] of weight, for r < step.rows; entry embed_<weight.kind>.

    weight (vocab, d); tokens (ROWS_MAX,) u32; x (ROWS_MAX, d) f32. Bit-identical to
    quant.dequantize."""
    if len(weight.shape) != 2:
        raise ShapeError(f"embed needs a (vocab, d) table; {weight.name!r} has {weight.shape}")
    vocab, d = weight.shape
    need(dev, tokens, ROWS_MAX * 4, "embed tokens (ROWS_MAX,) u32")
    need(dev, x, ROWS_MAX * d * 4, f"embed x (ROWS_MAX, {d})")
    params = dev.uniform(_fields(d, vocab, 1.0), f"embed {weight.name}")
    return dev.dispatch("embed", f"embed_{weight.kind}", [params, step, weight.buffer, tokens, x],
                        _workgroups(ROWS_MAX * d))


def rmsnorm(dev, x, weight: Weight, y, step, *, eps: float) -> Dispatch:
    """y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight for r < step.rows: the norm as a pass of
    its own, for CPU adapters (GPUs fold it into the next product: matmul's `norm`).

    x, y (ROWS_MAX, d) f32 (distinct buffers); weight (d,) f32."""
    if weight.kind != "f32" or len(weight.shape) != 1:
        raise ShapeError(f"rmsnorm needs an f32 vector; {weight.name!r} is {weight.kind} "
                         f"{weight.shape}")
    (d,) = weight.shape
    need(dev, x, ROWS_MAX * d * 4, f"rmsnorm x (ROWS_MAX, {d})")
    need(dev, y, ROWS_MAX * d * 4, f"rmsnorm y (ROWS_MAX, {d})")
    params = dev.uniform(_fields(d, float(eps)), f"rmsnorm {weight.name}")
    return dev.dispatch("rmsnorm", "rmsnorm", [params, step, x, weight.buffer, y], ROWS_MAX)


def rope_table(dev, config, max_ctx: int):
    """The (max_ctx, head_dim/2, 2) f32 table of (cos, sin) that matmul's RoPE epilogue reads: angles in float64
    then cast to f32, exactly as model.Model.rope computes them."""
    hd = config.head_dim
    inv_freq = config.rope_base ** (-np.arange(hd // 2, dtype=np.float64) * 2 / hd)  # (hd/2,)
    ang = np.arange(max_ctx)[:, None].astype(np.float64) * inv_freq[None, :]      # (ctx, hd/2)
    table = np.stack([np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)], axis=-1)
    return dev.upload(table, label="rope table")


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
              head_dim: int, max_ctx: int) -> Dispatch:
    """out[r] = causal GQA attention of q[r] over cache rows 0..step.pos + r, for r < step.rows.

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
    scale = float(np.float32(1.0 / np.sqrt(head_dim)))
    params = dev.uniform(_fields(n_heads, n_kv_heads, head_dim, max_ctx, scale,
                                 attention_groups(head_dim, threads)), "attention")
    entry = "attention_cpu" if _cpu_adapter(dev) else "attention"
    return dev.dispatch("attention", entry, [params, step, q, kcache, vcache, scratch, out],
                        split_workgroups(ROWS_MAX * n_heads))
