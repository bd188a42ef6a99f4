"""What the sampling controls cost on WebGPU (issue 12, step 3): the host accept (the champion's
k+1 logits rows read back, the rule in numpy) and the device processors (penalize.wgsl and
filter.wgsl, the 68-word readback kept), against the plain cycle.

    .venv/bin/python -m experiments.bench_sampling --out bench/results/sampling-lavapipe.json \\
        [--champion tiny|PATH] [--tokens 16] [--runs 3]

Per configuration, side by side in one run on one device: seconds per cycle (wall of the decode
over champion passes), host seconds per cycle (encode + submit, and for the host accept the rule
after the readback) and the wait for the readback; medians with [min, max] over runs.
Configurations, each champion-only (k = 0) and with the n-gram draft at fixed:4:
  plain            no processors: the accept kernel on the device, 68 words read back
  host-noop        logit_bias {0: 0} through the host accept: that path's own cost
  device-noop      the same on the device (penalize + count kernels)
  plain-T0.8       replay at temperature 0.8, no processors
  host-penalties   repetition 1.1, frequency 0.3 at T 0.8 through the host accept
  device-penalties the same on the device
  host-typical     repetition 1.1, top_p 0.9 at T 0.8 through the host accept
  device-typical   the same on the device (penalize + filter kernels)
The prompt is the first of the public workload. Timing goals live here, never in tests.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

from pyspec import testmodels
from pyspec.apps import provenance
from pyspec.engine import Engine, Options
from pyspec.gpu.processors import KINDS
from pyspec.load import backend, load_champion

WORKLOAD = Path(__file__).resolve().parent.parent / "workloads" / "public.jsonl"

T08 = {"temperature": 0.8, "seed": 1}
PENALTIES = {**T08, "repetition_penalty": 1.1, "frequency_penalty": 0.3}
CONFIGS = {   # name: (controls, processors on the device)
    "plain": ({}, True),
    "host-noop": ({"logit_bias": {0: 0.0}}, False),
    "device-noop": ({"logit_bias": {0: 0.0}}, True),
    "plain-T0.8": (T08, True),
    "host-penalties": (PENALTIES, False),
    "device-penalties": (PENALTIES, True),
    "host-typical": ({**T08, "repetition_penalty": 1.1, "top_p": 0.9}, False),
    "device-typical": ({**T08, "repetition_penalty": 1.1, "top_p": 0.9}, True),
}


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--champion", default=None, help="tiny (a testmodels champion) or a GGUF")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workload", default=str(WORKLOAD))
    ap.add_argument("--drafts", default="none,ngram", help="none (k = 0) and/or ngram (fixed:4)")
    args = ap.parse_args(argv)
    path = args.champion
    if path == "tiny":
        path = str(Path(tempfile.mkdtemp()) / "tiny.gguf")
        testmodels.write_model(path, seed=1)
    champion, tok = load_champion(path, "wgpu", None if args.champion == "tiny" else 1024)
    text = json.loads(Path(args.workload).read_text().splitlines()[0])["messages"][0]["content"]
    ids = tok.encode_chat([{"role": "user", "content": text}])
    result = {"machine": {"platform": platform.platform(), "python": platform.python_version()},
              "adapter": champion.dev.name, "champion": args.champion or "smollm2",
              "vocab": champion.config.vocab_size, "tokens": args.tokens, "runs": args.runs,
              "prompt_tokens": len(ids), "configs": {}}
    for draft in args.drafts.split(","):
        k = "fixed:0" if draft == "none" else "fixed:4"
        for name, (controls, on_device) in CONFIGS.items():
            # the processors on the device (gpu.backend.Paths), or the host accept
            engine = Engine(backend(champion, draft, champion.kv.max_ctx,
                                    device_processors=KINDS if on_device else ()), tok)
            opts = Options(max_tokens=args.tokens, k=k, stop_at_eos=False, **controls)
            engine.generate(ids, Options(max_tokens=2, k=k, **controls))       # warm-up
            per_cycle, host, wait, accept, passes = [], [], [], [], []
            for _ in range(args.runs):
                r = engine.generate(ids, opts)
                t, n = r.stats["backend_timing"], r.stats["champion_passes"]
                decode = r.stats["wall_s"] - r.stats["prefill_s"]
                per_cycle.append(decode / n)
                host.append(t["host_s"] / t["cycles"])
                wait.append(t["wait_s"] / t["cycles"])
                accept.append(t.get("host_accept_s", 0.0) / t["cycles"])
                passes.append(n)
            key = f"{draft}/{name}"
            result["configs"][key] = {"s_per_cycle": summary(per_cycle),
                                      "host_s_per_cycle": summary(host),
                                      "wait_s_per_cycle": summary(wait),
                                      "host_accept_s_per_cycle": summary(accept),
                                      "champion_passes": passes}
            print(key, json.dumps(result["configs"][key]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    provenance.write(args.out, provenance.stamp(result, champion=args.champion,
                                                workload=args.workload))
    plot(result, Path(args.out).with_suffix(".png"))
    return 0


def plot(result: dict, path: Path) -> None:
    """Seconds per cycle, median with [min, max] bars, per configuration and draft."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["configs"])
    med = [result["configs"][n]["s_per_cycle"]["median"] * 1000 for n in names]
    lo = [m - result["configs"][n]["s_per_cycle"]["min"] * 1000 for m, n in zip(med, names)]
    hi = [result["configs"][n]["s_per_cycle"]["max"] * 1000 - m for m, n in zip(med, names)]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(names) + 1.2))
    ax.barh(range(len(names)), med, xerr=[lo, hi], color="#6a8caf")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("ms per cycle (median, [min, max])")
    ax.set_title(f"sampling controls on {result['adapter'][:40]}, {result['champion']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
