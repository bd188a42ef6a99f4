"""GPU time per dispatch of matmul variants, as a forward pays it: N dispatches of one product in
one compute pass (the barriers between them included), timed by timestamps at the pass's ends.

Each variant is a directory holding its own matmul.wgsl and/or attention.wgsl (the other shaders
come from shaders/), and optionally `lanes` (ops._lanes' rule) and `layers` (the products'
workgroup layers along z: 1 for a kernel from before each row tile had its own); `shaders`
itself is the variant "current". Each product takes the kernel ops.matmul_kernel picks: on a GPU
the quantized ones matmul_coalesced.wgsl, unless PYSPEC_MATMUL=blocks (matmul.wgsl's lanes). Products are the champion's shapes with random weights (no
model needed), with the options the forward uses: the output projection and down accumulate,
gate-up folds the norm and the SiLU gate, QKV-like folds the norm. Each variant's outputs are
checked against the current kernel's (close) and for batch invariance (row r of a 16-row pass
equals row 0 of a 1-3-row pass over x moved up by r, bit for bit) before it is timed.

    .venv/bin/python -m experiments.bench_kernels [--n 200] [--runs 5] [--rows 1,8]
        [VARIANT_DIR ...]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import numpy as np

from pyspec.apps import provenance
from pyspec.gpu import device as device_mod
from pyspec.gpu import native, ops
from pyspec.gpu.weights import Weight
from pyspec.gpu.device import ROWS_MAX
from pyspec.gpu.step import Steps

HERE = Path(__file__).resolve().parent.parent


def q4_1(rng, n_out: int, n_in: int) -> np.ndarray:
    """Random Q4_1 blocks (20 bytes: f16 d, f16 m, 16 bytes of nibbles)."""
    nb = n_in // 32
    raw = rng.integers(0, 256, (n_out, nb, 20), dtype=np.uint8)
    dm = np.stack([rng.uniform(0.002, 0.02, (n_out, nb)), rng.uniform(-0.15, -0.01, (n_out, nb))],
                  -1).astype(np.float16)
    raw[:, :, :4] = dm.view(np.uint8).reshape(n_out, nb, 4)
    return raw.reshape(-1)


def q8_0(rng, n_out: int, n_in: int) -> np.ndarray:
    """Random Q8_0 blocks, repacked as the GPU takes them (36 bytes: f16 d, 0, 32 int8)."""
    nb = n_in // 32
    raw = rng.integers(0, 256, (n_out, nb, 36), dtype=np.uint8)
    raw[:, :, :4] = 0
    d = rng.uniform(0.001, 0.01, (n_out, nb)).astype(np.float16)
    raw[:, :, :2] = d.view(np.uint8).reshape(n_out, nb, 2)
    return raw.reshape(-1)


CASES = {  # name: (kind, n_out, n_in, options)
    "o 576x576 +=": ("q4_1", 576, 576, {"accumulate": True}),
    "qkv 960x576 norm": ("q4_1", 960, 576, {"norm": True}),
    "gateup 3072x576 norm silu": ("q4_1", 3072, 576, {"norm": True, "gate": "silu"}),
    "down 576x1536 +=": ("q4_1", 576, 1536, {"accumulate": True}),
    "head 49152x576 q8_0": ("q8_0", 49152, 576, {}),
    "head 49152x576 q4_1": ("q4_1", 49152, 576, {}),   # a draft's head as a Q4_1 copy
}


ATTENTION = {  # name: (positions attended by row 0): the champion's heads, a 2064-row cache
    "attn n=128": 128,
    "attn n=1024": 1024,
    "attn n=2048": 2048,
}
N_HEADS, N_KV, HEAD_DIM, MAX_CTX = 9, 3, 64, 2064


class AttentionCase:
    """ops.attention with the champion's heads; row 0 at position n - 1 (n positions)."""

    def __init__(self, dev, name: str, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.dev, self.name, self.n = dev, name, ATTENTION[name]
        width, kv = N_HEADS * HEAD_DIM, N_KV * HEAD_DIM
        self.q = dev.upload(rng.standard_normal((ROWS_MAX, width)).astype(np.float32))
        self.k = dev.upload(rng.standard_normal((MAX_CTX, kv)).astype(np.float32))
        self.v = dev.upload(rng.standard_normal((MAX_CTX, kv)).astype(np.float32))
        self.scratch = dev.buffer(ops.attention_scratch_bytes(N_HEADS, MAX_CTX))
        self.out = dev.buffer(ROWS_MAX * width * 4)
        self.cols = width
        self.steps = Steps(dev, 2)

    def dispatch(self, rows: int):
        self.steps.set(0, rows=rows, pos=self.n - 1)
        self.steps.upload(1)
        return ops.attention(self.dev, self.q, self.k, self.v, self.scratch, self.out,
                             self.steps.binding(0), n_heads=N_HEADS, n_kv_heads=N_KV,
                             head_dim=HEAD_DIM, max_ctx=MAX_CTX)

    def run(self, rows: int, shift: int = 0) -> np.ndarray:
        self.dev.submit([self.dispatch(rows)])
        out = asyncio.run(self.dev.read_array(self.out, np.float32, (ROWS_MAX, self.cols)))
        return out[:rows]

    gpu_s = None   # set below (Case's)


class Case:
    def __init__(self, dev, name: str, seed: int = 0):
        kind, n_out, n_in, opts = CASES[name]
        rng = np.random.default_rng(seed)
        raw = (q4_1 if kind == "q4_1" else q8_0)(rng, n_out, n_in)
        self.dev, self.name, self.opts = dev, name, dict(opts)
        self.weight = Weight(dev.upload(raw), kind, (n_out, n_in), name)
        self.x0 = rng.standard_normal((ROWS_MAX, n_in)).astype(np.float32)
        self.x = dev.upload(self.x0)
        cols = n_out // 2 if opts.get("gate") else n_out
        self.cols = cols
        self.y0 = rng.standard_normal((ROWS_MAX, cols)).astype(np.float32)
        self.y = dev.upload(self.y0)
        g = rng.uniform(0.5, 1.5, n_in).astype(np.float32)
        self.norm = Weight(dev.upload(g), "f32", (n_in,), "g") if opts.get("norm") else None
        self.steps = Steps(dev, 2)

    def dispatch(self, rows: int):
        self.steps.set(0, rows=rows, pos=0)
        self.steps.upload(1)
        o = self.opts
        return ops.matmul(self.dev, self.weight, self.x, self.y, self.steps.binding(0),
                          accumulate=o.get("accumulate", False),
                          gate=o.get("gate"), norm=self.norm,
                          eps=1e-5 if self.norm else 0.0)

    def run(self, rows: int, shift: int = 0) -> np.ndarray:
        """The first `rows` rows of y after a pass over x's rows rolled up by `shift`."""
        self.dev.write(self.x, np.roll(self.x0, -shift, axis=0))
        self.dev.write(self.y, np.roll(self.y0, -shift, axis=0))
        self.dev.submit([self.dispatch(rows)])
        out = asyncio.run(self.dev.read_array(self.y, np.float32, (ROWS_MAX, self.cols)))
        return out[:rows]

    def gpu_s(self, rows: int, n: int, runs: int) -> float:
        """Median GPU seconds per dispatch over `runs` passes of n dispatches."""
        return self.dev.time_pass([self.dispatch(rows)] * n, reps=runs) / n


AttentionCase.gpu_s = Case.gpu_s


def use(directory: Path):
    """Make the next pipelines come from `directory`'s matmul.wgsl and shaders/ (the rest)."""
    import shutil
    import tempfile
    tmp = Path(tempfile.mkdtemp(prefix="pyspec-variant-"))
    for f in (HERE / "shaders").glob("*.wgsl"):
        shutil.copy(f, tmp / f.name)
    for f in directory.glob("*.wgsl"):   # the variant's own shaders replace the tree's
        shutil.copy(f, tmp / f.name)
    device_mod.shader_dir = lambda: tmp
    rule = (directory / "lanes").read_text().strip() if (directory / "lanes").is_file() else ""
    if rule.startswith("up"):   # "upN": the power of two covering the units, at most N
        cap = int(rule[2:])
        ops._lanes = lambda units, n_out: min(cap, 1 << max(0, (units - 1).bit_length()))
    elif rule:                  # "N": N lanes (at most the units' power of two)
        cap = int(rule)
        ops._lanes = lambda units, n_out: min(cap, 1 << max(0, (units - 1).bit_length()))
    else:                       # ops' own rule
        ops._lanes = _LANES
    # "layers": the workgroup layers along z of the products (a kernel from before they took
    # one row tile per layer needs 1); default: ops' own rule
    if (directory / "layers").is_file():
        z = int((directory / "layers").read_text())
        ops._row_layers = lambda dev: z
    else:
        ops._row_layers = _LAYERS


_LANES = ops._lanes
_LAYERS = ops._row_layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*", type=Path)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--cases", default=",".join(CASES),
                        help="name prefixes: o, qkv, gateup, down, head, attn")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--split", action="store_true",
                        help="take the GPU work split on a CPU adapter (to check variants)")
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    names = [c for c in list(CASES) + list(ATTENTION)
             if any(c.startswith(p) for p in args.cases.split(","))]
    variants = [HERE / "shaders"] + list(args.variants)
    dev = native.NativeDevice(timestamps=True)
    if args.split:
        dev.is_cpu = False
    print(f"adapter: {dev.name}; GPU us per dispatch, {args.n} per pass, median of {args.runs}")
    result = {"adapter": dev.name, "n": args.n, "runs": args.runs, "us": {}}
    reference = {}
    for v in variants:
        use(v)
        dev._pipelines.clear()
        label = "current" if v == HERE / "shaders" else v.name
        result["us"][label] = {}
        for name in names:
            case = (AttentionCase if name in ATTENTION else Case)(dev, name)
            one, five = case.run(1), case.run(5)
            ok = "ok"
            if name in reference and np.array_equal(five, reference[name]):
                ok = "= current"
            elif name in reference:
                err = float(np.max(np.abs(five - reference[name])) /
                            (np.max(np.abs(reference[name])) + 1e-30))
                if err > 1e-4:
                    ok = f"DIFFERS ({err:.1e})"
            else:
                reference[name] = five
            moved = []
            if name in CASES:
                full = case.run(ROWS_MAX)
                moved = [r for r in (0, 3, 4, 5, 8, 13) if not np.array_equal(
                    case.run(1 + r % 3, shift=r)[0], full[r])]
            if not np.array_equal(one[0], five[0]) or moved:
                ok += f" NOT BATCH-INVARIANT (rows {moved})"
            us = {r: case.gpu_s(r, args.n, args.runs) * 1e6 for r in rows}
            result["us"][label][name] = us
            cells = "".join(f"  rows={r}: {t:7.2f}" for r, t in us.items())
            print(f"{label:<12}{name:<28}{cells}  {ok}", flush=True)
    if args.json:
        provenance.write(str(args.json), provenance.stamp(result))


if __name__ == "__main__":
    sys.exit(main())
