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

from dataclasses import dataclass

import numpy as np

from .. import quant
from ..gguf import GGUFFile
from .constants import MATMUL_OUTS, WG  # the shaders get the same names (constants.py)
from .device import ROWS_MAX, Dispatch, ShapeError, binding_size, need, split_workgroups


# --- weights ------------------------------------------------------------------------------------

# GPU layout per GGUF type. Q8_0's 34-byte blocks are not u32-aligned, so they are repacked to 36
# bytes (f16 d, 2 zero bytes, 32 int8); F16 (tiny test models) is widened to f32.
_KINDS = {quant.Q4_1.type_id: "q4_1", quant.Q8_0.type_id: "q8_0",
          quant.F32.type_id: "f32", quant.F16.type_id: "f32"}


def repack_q8_0(raw: np.ndarray) -> np.ndarray:
    """Q8_0 bytes (n_blocks * 34,) -> (n_blocks, 36) uint8: d at bytes 0-1, qs at 4-35."""
    blocks = np.asarray(raw, np.uint8).reshape(-1, quant.Q8_0.block_bytes)
    out = np.zeros((blocks.shape[0], 36), np.uint8)
    out[:, 0:2] = blocks[:, 0:2]
    out[:, 4:] = blocks[:, 2:]
    return out


@dataclass(frozen=True)
class Weight:
    """A tensor on the GPU: `kind` 'q4_1' | 'q8_0' | 'f32', `shape` (n_out, n_in) or (n,)."""
    buffer: object
    kind: str
    shape: tuple[int, ...]
    name: str = ""

    @classmethod
    def upload(cls, dev, f: GGUFFile, name: str) -> "Weight":
        """Upload tensor `name` of a GGUF file. Holds at most one repacked copy of this tensor."""
        t = f.tensor(name)
        kind = _KINDS.get(t.type_id)
        if kind is None:
            raise ShapeError(f"tensor {name!r} is {t.format.name}; the GPU kernels take Q4_1, "
                             "Q8_0, F16 and F32 (requantize the model, e.g. with llama-quantize)")
        if len(t.shape) not in (1, 2):
            raise ShapeError(f"tensor {name!r} has shape {t.shape}; expected a matrix or vector")
        raw = f.raw(name)
        if t.type_id == quant.Q8_0.type_id:
            data = repack_q8_0(raw)
        elif t.type_id == quant.F16.type_id:
            data = raw.view(np.float16).astype(np.float32)
        else:
            data = raw  # Q4_1 blocks (20 bytes) and F32 are u32-aligned as they are
        limit = getattr(dev, "limits", {}).get("max-storage-buffer-binding-size")
        if limit is not None and data.nbytes > limit:
            raise ShapeError(f"tensor {name!r} needs {data.nbytes} bytes on the GPU; this device "
                             f"binds at most {limit} per buffer")
        return cls(dev.upload(data, label=name), kind, tuple(t.shape), name)

    @property
    def nbytes(self) -> int:
        """Bytes of the GPU copy."""
        n = int(np.prod(self.shape))
        return {"q4_1": n // 32 * 20, "q8_0": n // 32 * 36, "f32": n * 4}[self.kind]


# --- helpers ------------------------------------------------------------------------------------

def _fields(*values) -> np.ndarray:
    """A params uniform's fields: ints as u32, floats as f32 bits."""
    out = np.zeros(len(values), np.uint32)
    for i, v in enumerate(values):
        out[i] = np.float32(v).view(np.uint32) if isinstance(v, float) else int(v)
    return out


def _workgroups(threads: int) -> tuple[int, int, int]:
    return split_workgroups(-(-threads // WG))


def _lanes(units: int) -> int:
    """Threads sharing one output group's dot products on a GPU: the largest power of two
    <= min(16, units), where units are the blocks (vec4 chunks for f32) of a weight row. It
    depends on n_in only, never on the rows of a pass (batch invariance)."""
    lanes = 1
    while lanes * 2 <= min(16, units):
        lanes *= 2
    return lanes


# Adapters that run shaders on the CPU (Mesa's lavapipe, Chromium's SwiftShader), by adapter name.
# There a storage load that differs between invocations is a scalar loop over the SIMD lanes and
# a workgroup barrier is a coroutine switch, so matmul runs one thread per output group (lanes 1,
# no barrier). scripts/bench_matmul.py measures it.


def _cpu_adapter(dev) -> bool:
    """A software adapter (lavapipe, SwiftShader): each adapter says so (Device.is_cpu)."""
    return bool(dev.is_cpu)


# --- kernels ------------------------------------------------------------------------------------

def matmul(dev, weight: Weight, x, y, step, *, out_at_pos: bool = False,
           accumulate: bool = False) -> Dispatch:
    """y[base + r] (= or +=) weight @ x[r] for r < step.rows; entry matmul_<weight.kind>.

    weight (n_out, n_in); x (ROWS_MAX, n_in) f32; y (y_rows, n_out) f32: base = step.pos with
    out_at_pos (y a KV cache of y_rows = max_ctx rows; rows past it are skipped), else 0 (y needs
    ROWS_MAX rows). accumulate adds to y (the residual x += W h)."""
    if len(weight.shape) != 2:
        raise ShapeError(f"matmul needs a matrix; {weight.name!r} has shape {weight.shape}")
    n_out, n_in = weight.shape
    if weight.kind == "f32" and n_in % 4:
        raise ShapeError(f"matmul_f32 needs n_in % 4 == 0, got {n_in} ({weight.name!r})")
    need(dev, x, ROWS_MAX * n_in * 4, f"matmul x for {weight.name!r} (ROWS_MAX, {n_in})")
    y_rows = binding_size(dev, y) // (n_out * 4)
    if out_at_pos:
        if y_rows < 1:
            raise ShapeError(f"matmul y for {weight.name!r} holds no row of {n_out} f32")
    else:
        need(dev, y, ROWS_MAX * n_out * 4, f"matmul y for {weight.name!r} (ROWS_MAX, {n_out})")
        y_rows = ROWS_MAX
    # lanes depends on the device and n_in only, never on rows (batch invariance).
    lanes = 1 if _cpu_adapter(dev) else _lanes(n_in // 4 if weight.kind == "f32" else n_in // 32)
    params = dev.uniform(_fields(n_out, n_in, lanes, out_at_pos, accumulate, y_rows),
                         f"matmul {weight.name}")
    groups = split_workgroups(-(-n_out // (MATMUL_OUTS * WG // lanes)))
    return dev.dispatch("matmul", f"matmul_{weight.kind}",
                        [params, step, weight.buffer, x, y], groups)


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
    """y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight for r < step.rows.

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
    """The (max_ctx, head_dim/2, 2) f32 table of (cos, sin) that `rope` reads: angles in float64
    then cast to f32, exactly as model.Model.rope computes them."""
    hd = config.head_dim
    inv_freq = config.rope_base ** (-np.arange(hd // 2, dtype=np.float64) * 2 / hd)  # (hd/2,)
    ang = np.arange(max_ctx)[:, None].astype(np.float64) * inv_freq[None, :]      # (ctx, hd/2)
    table = np.stack([np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)], axis=-1)
    return dev.upload(table, label="rope table")


def rope(dev, x, table, step, *, n_heads: int, head_dim: int, max_ctx: int,
         at_pos: bool = False) -> Dispatch:
    """Rotate the pairs of rows r < step.rows of x in place by position step.pos + r.

    x (x_rows, n_heads * head_dim) f32: row r is row step.pos + r with at_pos (a KV cache of
    x_rows = max_ctx rows), else row r (x needs ROWS_MAX rows); table from rope_table(max_ctx)."""
    if head_dim % 2:
        raise ShapeError(f"rope needs an even head_dim, got {head_dim}")
    row = n_heads * head_dim
    need(dev, table, max_ctx * head_dim * 4, f"rope table (max_ctx={max_ctx}, {head_dim // 2}, 2)")
    x_rows = binding_size(dev, x) // (row * 4)
    if not at_pos:
        need(dev, x, ROWS_MAX * row * 4, f"rope x (ROWS_MAX, {row})")
        x_rows = ROWS_MAX
    elif x_rows < 1:
        raise ShapeError(f"rope x holds no row of {row} f32")
    params = dev.uniform(_fields(n_heads, head_dim, at_pos, x_rows, max_ctx), "rope")
    return dev.dispatch("rope", "rope", [params, step, table, x],
                        _workgroups(ROWS_MAX * n_heads * head_dim // 2))


def attention_scratch_bytes(n_heads: int, max_ctx: int) -> int:
    """Bytes of the scores scratch `attention` needs: (ROWS_MAX, n_heads, max_ctx) f32. One
    scratch serves every layer (dispatches run in order)."""
    return ROWS_MAX * n_heads * max_ctx * 4


def attention(dev, q, kcache, vcache, scores, out, step, *, n_heads: int, n_kv_heads: int,
              head_dim: int, max_ctx: int) -> Dispatch:
    """out[r] = causal GQA attention of q[r] over cache rows 0..step.pos + r, for r < step.rows.

    q, out (ROWS_MAX, n_heads * head_dim) f32; kcache, vcache (max_ctx, n_kv_heads * head_dim)
    f32 holding this pass's rows already; scores: attention_scratch_bytes(n_heads, max_ctx)."""
    if n_heads % n_kv_heads:
        raise ShapeError(f"attention: {n_kv_heads} KV heads do not divide {n_heads} heads")
    width, kv_width = n_heads * head_dim, n_kv_heads * head_dim
    need(dev, q, ROWS_MAX * width * 4, f"attention q (ROWS_MAX, {width})")
    need(dev, out, ROWS_MAX * width * 4, f"attention out (ROWS_MAX, {width})")
    need(dev, kcache, max_ctx * kv_width * 4, f"attention kcache ({max_ctx}, {kv_width})")
    need(dev, vcache, max_ctx * kv_width * 4, f"attention vcache ({max_ctx}, {kv_width})")
    need(dev, scores, attention_scratch_bytes(n_heads, max_ctx), "attention scores scratch")
    scale = float(np.float32(1.0 / np.sqrt(head_dim)))
    params = dev.uniform(_fields(n_heads, n_kv_heads, head_dim, max_ctx, scale), "attention")
    return dev.dispatch("attention", "attention", [params, step, q, kcache, vcache, scores, out],
                        split_workgroups(ROWS_MAX * n_heads))


def silu_gate(dev, g, u, step, *, d_ff: int) -> Dispatch:
    """g[r] = g[r] / (1 + exp(-g[r])) * u[r] in place, for r < step.rows. g, u (ROWS_MAX, d_ff)."""
    need(dev, g, ROWS_MAX * d_ff * 4, f"silu_gate g (ROWS_MAX, {d_ff})")
    need(dev, u, ROWS_MAX * d_ff * 4, f"silu_gate u (ROWS_MAX, {d_ff})")
    params = dev.uniform(_fields(d_ff), "silu_gate")
    return dev.dispatch("silu_gate", "silu_gate", [params, step, g, u],
                        _workgroups(ROWS_MAX * d_ff))
