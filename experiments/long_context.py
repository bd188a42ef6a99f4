"""Long contexts on the real champion: a prompt of about 8,000 tokens (the public workload's prompts
concatenated into one user message: measured on, never trained on) at max_ctx 8192, on numpy and
on native WebGPU, written to bench/results/long-context.json. A measurement, not a test: it
asserts nothing.

    .venv/bin/python -m experiments.long_context [--out bench/results/long-context.json]
        [--max-tokens N] [--positions 0,4096,8176] [--backends numpy,wgpu,wgpu-e2e]
        [--champion PATH]

numpy: the CPU engine (`generate --backend cpu`: fastcpu.FastModel, n-gram drafts, greedy) prefills
the prompt and generates to the end of the context (or --max-tokens): prompt and generated tokens,
the stop reason, prefill seconds, decode tokens/s, peak RSS, and the KV cache's bytes from its
shape, (layers, max_ctx, n_kv, head_dim) f32 for K and for V.

WebGPU: on a software adapter (lavapipe, two cores) an 8,000-token prefill of the champion takes
hours: attention costs a pass in proportion to rows x heads x layers x positions, and one 16-row
pass near position 8,000 takes about a minute. So here it times champion passes of 1 and 16 rows
at --positions (the cache filled up to there; contents do not change the time) and estimates the
prefill (500 passes of 16 rows, linear between the measured positions) and champion-only decode
tokens/s at the end of the context from them; it reports the device's buffer bytes (weights,
KV cache, activations, attention scratch) and the KV and scratch bytes from their shapes. An
end-to-end run to the context end on WebGPU is tests/test_long_context.py's, on a tiny model.

Each backend runs in a child process, so its peak RSS is its own; the machine's load average
is recorded at the start and end of each, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "workloads" / "public.jsonl"
OUT = ROOT / "bench" / "results" / "long-context.json"
CTX = 8192
PROMPT_TOKENS = 8000


def long_messages(tokenizer, target: int = PROMPT_TOKENS) -> list[dict]:
    """One user message of the workload's prompts, concatenated (repeated as needed) and cut
    to the most characters whose chat prompt has at most `target` tokens (binary search)."""
    rows = [json.loads(line) for line in WORKLOAD.read_text().splitlines() if line.strip()]
    parts = [m["content"] for row in rows for m in row["messages"] if m["role"] == "user"]
    text = "\n\n".join(parts)
    while len(tokenizer.encode_chat([{"role": "user", "content": text}])) < target:
        text = text + "\n\n" + "\n\n".join(parts)
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenizer.encode_chat([{"role": "user", "content": text[:mid]}])) <= target:
            lo = mid
        else:
            hi = mid - 1
    return [{"role": "user", "content": text[:lo]}]


def kv_bytes(cfg, ctx: int) -> int:
    """K and V of (layers, ctx, n_kv, head_dim) f32."""
    return 2 * cfg.n_layers * ctx * cfg.n_kv_heads * cfg.head_dim * 4


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux: KiB


def run_engine(kind: str, max_tokens: int, champion: str | None) -> dict:
    """End to end on the engine: "numpy" (the CPU engine) or "wgpu-e2e" (native WebGPU, for a
    real GPU: on lavapipe the prefill alone takes hours, hence run_wgpu's estimate)."""
    from pyspec.engine import Engine
    from pyspec.load import backend, load_champion
    from pyspec.options import Options

    load = os.getloadavg()[0]
    model, tokenizer = load_champion(champion, "wgpu" if kind == "wgpu-e2e" else "cpu", CTX)
    prompt = tokenizer.encode_chat(long_messages(tokenizer))
    engine = Engine(backend(model, "ngram", CTX), tokenizer)
    result = engine.generate(prompt, Options(max_tokens=max_tokens))
    s = result.stats
    decode_s = s["wall_s"] - s["prefill_s"]
    gpu = {"gpu_buffer_bytes": model.dev.allocated} if kind == "wgpu-e2e" else {}
    return {**gpu,
            "engine": f"{kind} ({s['adapter']}, {getattr(model, 'kernel', '?')} kernel), "
                      f"draft {s['drafter']}, greedy",
            "max_ctx": engine.kv.max_ctx, "prompt_tokens": len(prompt),
            "max_tokens": max_tokens, "generated_tokens": len(result.tokens),
            "stop_reason": result.finish_reason,
            "context_end_reached": len(prompt) + len(result.tokens) == CTX + 1,
            "prefill_s": s["prefill_s"],
            "prefill_tokens_per_s": s["prefill_tokens"] / s["prefill_s"],
            "decode_s": decode_s, "decode_tokens_per_s": len(result.tokens) / decode_s,
            "tokens_per_pass": s["tokens_per_pass"], "acceptance_rate": s["acceptance_rate"],
            "kv_cache_bytes": engine.kv.nbytes,
            "kv_cache_bytes_from_shape": kv_bytes(model.config, CTX),
            "weight_bytes": s["peak_bytes"]["weights"], "peak_rss_bytes": peak_rss(),
            "load_avg_start_end": [load, os.getloadavg()[0]]}


async def _pass_s(model, rows: int, pos: int) -> float:
    """Seconds of one champion pass over `rows` tokens at positions pos.. (encode, submit and a
    4-byte readback, what a cycle pays); the cache's rows below pos are whatever they hold."""
    from pyspec.gpu.step import SLOT_CHAMPION

    kv = model.kv
    kv.truncate(0)
    if pos:
        kv.append(pos)
        kv.commit(pos)
    tokens = [(17 * i + 5) % model.config.vocab_size for i in range(rows)]
    t0 = time.perf_counter()
    model.feed(tokens, SLOT_CHAMPION)
    model.steps.upload(SLOT_CHAMPION + 1)
    model.dev.submit(model.forward_dispatches(SLOT_CHAMPION))
    await model.dev.read(model.logits, 4)
    return time.perf_counter() - t0


def _interpolate(points: dict[int, float], pos: int) -> float:
    xs = sorted(points)
    if pos <= xs[0]:
        return points[xs[0]]
    for a, b in zip(xs, xs[1:]):
        if pos <= b:
            return points[a] + (points[b] - points[a]) * (pos - a) / (b - a)
    return points[xs[-1]]


def run_wgpu(positions: list[int]) -> dict:
    from pyspec import champion_path
    from pyspec.formats.gguf import GGUFFile
    from pyspec.gpu import load_model, open_device
    from pyspec.gpu.device import ROWS_MAX
    from pyspec.gpu.ops import attention_scratch_bytes
    from pyspec.gpu.step import SLOT_CHAMPION
    from pyspec.text.tokenizer import Tokenizer

    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    dev = open_device()
    model = load_model(dev, GGUFFile.open(champion_path()), CTX)
    model.forward_dispatches(SLOT_CHAMPION)
    load_s = time.perf_counter() - t0
    tokenizer = Tokenizer.from_metadata(model.metadata)
    prompt_tokens = len(tokenizer.encode_chat(long_messages(tokenizer)))

    async def passes():
        await _pass_s(model, 1, 0)          # compiles the pipelines
        one, block = {}, {}
        for pos in positions:
            one[pos] = await _pass_s(model, 1, min(pos, CTX - 1))
            block[pos] = await _pass_s(model, ROWS_MAX, min(pos, CTX - ROWS_MAX))
        return one, block

    one, block = asyncio.run(passes())
    body = prompt_tokens - 1                 # prefill commits all prompt rows but the last
    # One pass per ROWS_MAX prompt rows (the last, shorter one counted as a whole pass).
    prefill = sum(_interpolate(block, p) for p in range(0, body, ROWS_MAX))
    cfg = model.config
    return {"engine": "native WebGPU (wgpu-py)", "adapter": dev.name, "max_ctx": model.kv.max_ctx,
            "prompt_tokens": prompt_tokens, "load_s": load_s,
            "pass_s_1_row": {str(p): t for p, t in one.items()},
            "pass_s_16_rows": {str(p): t for p, t in block.items()},
            "prefill_s_estimated": prefill,
            "decode_tokens_per_s_at_context_end_estimated": 1 / one[max(positions)],
            "gpu_buffer_bytes": dev.allocated,
            "kv_cache_bytes_from_shape": kv_bytes(cfg, CTX),
            "attention_scratch_bytes": attention_scratch_bytes(cfg.n_heads, CTX),
            "weight_bytes": model.weight_bytes, "peak_rss_bytes": peak_rss(),
            "load_avg_start_end": [load, os.getloadavg()[0]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--max-tokens", type=int, default=CTX,
                    help="cap on generated tokens (default: none before the context end)")
    ap.add_argument("--positions", default="0,4096,8176",
                    help="WebGPU: positions of the timed passes")
    ap.add_argument("--backends", default="numpy,wgpu")
    ap.add_argument("--champion", help="the champion GGUF (default: the installed package's)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    positions = [int(p) for p in args.positions.split(",")]
    if args.child:
        out = (run_wgpu(positions) if args.child == "wgpu"
               else run_engine(args.child, args.max_tokens, args.champion))
        print(json.dumps(out))
        return
    results = {"what": "an ~8,000-token prompt at max_ctx 8192 on the champion (SmolLM2-135M "
                       "GGUF): numpy end to end; WebGPU by timed passes (see the script)",
               "workload": "public.jsonl prompts concatenated (measured, never trained on)",
               "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
               "load_avg_at_start": os.getloadavg()[0]}
    for name in args.backends.split(","):
        t0 = time.perf_counter()
        child = subprocess.run([sys.executable, "-m", "experiments.long_context", "--child", name,
                                "--max-tokens", str(args.max_tokens),
                                "--positions", args.positions,
                                *(["--champion", args.champion] if args.champion else [])],
                               capture_output=True, text=True, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                   [str(ROOT), os.environ.get("PYTHONPATH", "")])})
        if child.returncode:
            results[name] = {"error": child.stderr[-2000:]}
        else:
            results[name] = json.loads(child.stdout.strip().splitlines()[-1])
        results[name]["wall_s"] = time.perf_counter() - t0
        print(name, json.dumps(results[name], indent=1), flush=True)
        from pyspec.apps import provenance
        provenance.write(args.out, provenance.stamp(results, champion=args.champion))


if __name__ == "__main__":
    main()
