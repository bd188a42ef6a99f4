"""Every performance figure typed by hand into README.md and docs/ (tok/s, speedups, ms, s, MiB)
is the figure its result file holds, at the rounding it is quoted at, so a page cannot keep a
figure whose file changed. FIGURES lists each quoted passage: its page, its text with each figure
in {braces}, its file in bench/results/ and how the file gives those figures. A figure that no
file holds is not quoted (the pages say so where they dropped one); the tables that
webtools/results.py writes are tests/test_docs.py's.

A passage that a page rewords fails here until FIGURES follows it: re-read its file then.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from webtools.gpu_tables import per_prompt

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MB, MIB = 1e6, 2 ** 20


@dataclass(frozen=True)
class Figure:
    page: str
    quote: str                                 # the page's text, each figure in {braces}
    file: str                                  # in bench/results/
    read: Callable[[dict], list[float]]        # the figures from the file, in the quote's order


# --- readers of the files' shapes ---------------------------------------------------------------
def h100(r: dict, model: str) -> dict:
    """h100-shapes.json's table row of one shape."""
    return next(e for e in r["table"] if e["model"] == model)


def kernel_share(r: dict, model: str, kernel: str) -> float:
    """A kernel's share of a one-row pass's GPU time (h100-shapes.json's native kernel profile)."""
    profile = r["native_raw"]["models"][model]["rows"]["kernel_profile"]["1"]
    return 100 * profile["by_kernel_s"][kernel] / profile["gpu_s_total"]


GUARDED, FIXED3 = "models/draft-l4.gguf", "models/draft-l4.gguf fixed:3"
TREE221 = "models/draft-l4.gguf tree 2,2,1 fixed:3"


TREE221_GUARD, TREE211 = "models/draft-l4.gguf tree 2,2,1", "models/draft-l4.gguf tree 2,1,1 fixed:3"
THIRD = ["h100-dawn-6179483.json", "h100-dawn-6cca397.json", "h100-dawn-6cca397-reversed.json"]
# the same sides at 609d0a7, four runs in one lease, each in another order
FOURTH = [f"h100-dawn-609d0a7{tag}.json" for tag in ("", "-reversed", "-order3", "-order4")]


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def overall(side: str, key: str, files: list[str] = FOURTH) -> list:
    """One field of a Dawn side's row over all prompts, file by file."""
    return [load(f)["dawn"][side]["overall"][key] for f in files]


def fourth_ratios(side: str, base: str, files: list[str] = FOURTH) -> list[float]:
    return [tok_s(load(f), side) / tok_s(load(f), base) for f in files]


def tok_s(r: dict, side: str) -> float:
    """A Dawn side's median tok/s over its prompts."""
    return r["dawn"][side]["overall"]["tokens_per_s"]["median"]


def dawn_speedup(r: dict, side: str) -> float:
    """h100-dawn.json: a side's median speedup prompt by prompt over Dawn's champion alone (the
    dawn table's, webtools/gpu_tables.py)."""
    base = per_prompt(r["dawn"]["champion-only"])
    tps = per_prompt(r["dawn"][side])
    return statistics.median(tps[s] / base[s] for s in tps if s in base)


def slow_cycles(r: dict, side: str, over_ms: float = 4.0) -> list[float]:
    """h100-dawn.json, one side's cycles over every prompt: [how many took more than over_ms of
    host time, of how many, their median] + [the median of all, how many over, of how many]."""
    ms = [h for s, v in r["dawn"][side].items() if isinstance(v, dict) and "host_ms_cycles" in v
          for h in v["host_ms_cycles"]]
    slow = [h for h in ms if h > over_ms]
    return [len(slow), len(ms), statistics.median(slow) if slow else 0.0,
            statistics.median(ms), len(slow), len(ms)]


def big_shape(r: dict, run: int, name: str) -> list[float]:
    """page-big-shapes.json, one table row: file MB, ready s, [heap MiB before weights / after
    load, or at the end], GPU MiB, prefill s, second token s (a decode pass: the verify time
    over the champion's passes)."""
    s = r["runs"][run]["shapes"][name]
    heap = s["info"].get("wasm_bytes")
    heaps = ([heap["before_weights"] / MIB, heap["after_load"] / MIB] if heap
             else [s["memory"]["wasm_bytes"] / MIB])
    stats = s["stats"]
    return [s["file_bytes"] / MB, s["ready_s"], *heaps, s["memory"]["gpu_bytes"] / MIB,
            stats["prefill_s"], stats["verify_s"] / stats["champion_passes"]]


def heap_growth(r: dict) -> list[float]:
    """page-big-shapes.json: the heap's growth during each load that recorded both sizes."""
    return [s["info"]["wasm_bytes"]["after_load"] / MIB - s["info"]["wasm_bytes"]["before_weights"]
            / MIB for run in r["runs"] for s in run["shapes"].values()
            if s["info"].get("wasm_bytes")]


def real_shape(r: dict, name: str) -> list[float]:
    """real-shapes.json, one table row: tok/s, file MB, float32 MB, KV bytes a token, RSS MB."""
    s = r["rows"][name]
    return [s["tok_s"], s["file_bytes"] / MB, s["weight_bytes_loaded"] / MB,
            s["kv_bytes_per_token"], s["peak_rss_bytes"] / MB]


def startup(r: dict, key: str) -> list[float]:
    ready = r["summary"][key]["ready_s"]
    return [ready["median"], ready["min"], ready["max"]]


def startup_packages(r: dict, key: str) -> list[float]:
    """A startup file's ready seconds and `packages` phase (s), single samples."""
    s = r["summary"][key]
    return [s["ready_s"]["median"], s["phases_ms"]["packages"]["median"] / 1000]


def recoveries(r: dict, *kinds: str) -> list[float]:
    """faults.json: the fewest and most seconds to recover over these kinds, both modes."""
    got = [m["recovery_s"]["median"] for k in kinds for m in r["faults"][k].values()]
    return [min(got), max(got)]


def tree_rows(r: dict, draft: str) -> dict:
    return {row["shape"]: row["tokens_per_pass"] for row in r["chain_vs_tree"]["rows"]
            if row["draft"] == draft}


def same(values: list[float]) -> float:
    """The one value a passage quotes for several (NaN, which matches nothing, if they differ)."""
    return values[0] if len(set(values)) == 1 else float("nan")


def speedups(r: dict, *drafters: str) -> list[float]:
    return [r["drafters"][d]["overall"]["speedup"]["median"] for d in drafters]


def blocks(r: dict, model: str, mode: str) -> list[float]:
    m = r["models"][model]["modes"][mode]
    return [m["x_float32_1_row"], m["x_float32_5_rows"]]


SMOL, QWEN3, LLAMA = "SmolLM2-135M", "Qwen3-0.6B", "Llama-3.2-1B"
CHAMP, QWEN3_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf", "Qwen3-0.6B.gguf"
SHAPES = (SMOL, QWEN3, LLAMA)
B, E = "docs/benchmarks.md", "docs/cpu-engine.md"

FIGURES = [
    # --- docs/benchmarks.md: results --------------------------------------------------------
    Figure(B, "the guard switched it off in all but one of {1,923} cycles", "h200.json",
           lambda r: [r["drafters"]["self:20"]["overall"]["champion_passes"]]),
    Figure(B, "the numpy engine ran {40.4} tok/s champion-only, and the drafters' median speedups "
           "under the guard were {1.00}-{1.01}x", "cpu-guard-reduced-head.json", lambda r: [
               r["champion_tok_s"], min(speedups(r, "trained", "ngram+trained", "ngram")),
               max(speedups(r, "trained", "ngram+trained", "ngram"))]),
    # --- start-up ------------------------------------------------------------------------------
    Figure(B, "| default | **{6.69} s** [{6.15}, {6.72}] | **{4.78} s** [{4.25}, {5.17}] |",
           "startup.json", lambda r: startup(r, "snapshot/first") + startup(r, "snapshot/warm")),
    Figure(B, "| `snapshot: false` | {9.72} s [{8.78}, {9.72}] | {7.56} s [{6.76}, {8.98}] |",
           "startup.json",
           lambda r: startup(r, "no_snapshot/first") + startup(r, "no_snapshot/warm")),
    *[Figure(B, row, name, lambda r, key=key: startup_packages(r, key)) for name, key, row in (
        ("startup-with-jinja2.json", "snapshot/first", "| first visit | {6.87} s ({1.32} s) |"),
        ("startup-no-jinja2.json", "snapshot/first",
         "| first visit | 6.87 s (1.32 s) | {8.39} s ({1.40} s) |"),
        ("startup-with-jinja2.json", "snapshot/warm",
         "| later visit (bytecode cached) | {6.17} s ({1.99} s) |"),
        ("startup-no-jinja2.json", "snapshot/warm",
         "| later visit (bytecode cached) | 6.17 s (1.99 s) | {6.20} s ({1.64} s) |"),
        ("startup-with-jinja2.json", "no_snapshot/first",
         "| `snapshot: false`, first | {12.07} s ({0.47} s) |"),
        ("startup-no-jinja2.json", "no_snapshot/first",
         "| `snapshot: false`, first | 12.07 s (0.47 s) | {11.25} s ({0.40} s) |"),
        ("startup-with-jinja2.json", "no_snapshot/warm",
         "| `snapshot: false`, later | {10.69} s ({0.47} s) |"),
        ("startup-no-jinja2.json", "no_snapshot/warm",
         "| `snapshot: false`, later | 10.69 s (0.47 s) | {10.85} s ({0.43} s) |"))],
    Figure(B, "{576} ms on a first visit, {302} ms on a later one (jinja2's bytecode cached), "
           "{511} and {488} ms with `snapshot: false` (no bytecode cache); its `model` phase was "
           "{760} / {380} ms", "startup-jinja2.json", lambda r: [
               *(r["summary"][k]["first_render_ms"]["median"] for k in (
                   "snapshot/first", "snapshot/warm", "no_snapshot/first", "no_snapshot/warm")),
               r["summary"]["snapshot/first"]["phases_ms"]["model"]["median"],
               r["summary"]["snapshot/warm"]["phases_ms"]["model"]["median"]]),
    Figure(B, "against tiny's {110} / {160} ms above", "startup-with-jinja2.json", lambda r: [
        round(r["summary"][k]["phases_ms"]["model"]["median"], -1)
        for k in ("snapshot/first", "snapshot/warm")]),
    # --- loading a model in the page ----------------------------------------------------------
    Figure(B, "| Qwen2.5-1.5B | {984} MB | webgpu only | {42.3} s | {86} MiB at the end "
           "(182.6 MiB) | {1,008} MiB | {441} s | {44} s |", "page-big-shapes.json",
           lambda r: big_shape(r, 0, "Qwen2.5-1.5B")),
    Figure(B, "| Gemma-3-1B | {806} MB | webgpu only | {46.5} s | {71.9} / {103.5} MiB "
           "(306.0 MiB) | {918} MiB | {245} s | {26} s |", "page-big-shapes.json",
           lambda r: big_shape(r, 1, "Gemma-3-1B")),
    Figure(B, "| Gemma-3-1B, binding 128 MiB | {806} MB | webgpu only | {53.1} s | {71.9} / "
           "{103.5} MiB | {918} MiB | {223} s | {26} s |", "page-big-shapes.json",
           lambda r: big_shape(r, 2, "Gemma-3-1B")),
    Figure(B, "| SmolLM2-1.7B | {1,055} MB | webgpu only | {34.4} s | {41.6} / {72.4} MiB "
           "(78.8 MiB) | {1,123} MiB | {520} s | {46} s |", "page-big-shapes.json",
           lambda r: big_shape(r, 1, "SmolLM2-1.7B")),
    Figure(B, "The heap grows by {31}-{32} MiB during a load", "page-big-shapes.json",
           lambda r: [min(heap_growth(r)), max(heap_growth(r))]),
    Figure(B, "the largest model that fits has {995}M parameters", "page-big-shapes.json",
           lambda r: [r["runs"][0]["shapes"]["Qwen2.5-1.5B"]["card"]["backends"]["page-cpu"]
                      ["largest_params"] / 1e6]),
    Figure(B, "equal the unsplit run's but for {288} bytes of padding", "page-big-shapes.json",
           lambda r: [r["runs"][2]["shapes"]["Gemma-3-1B"]["memory"]["gpu_bytes"]
                      - r["runs"][1]["shapes"]["Gemma-3-1B"]["memory"]["gpu_bytes"]]),
    # --- model shapes natively ----------------------------------------------------------------
    *[Figure(B, row, "real-shapes.json", lambda r, name=name: real_shape(r, name))
      for name, row in (
          ("SmolLM2-135M", "| SmolLM2-135M (the champion's shape) | {3.83} | {104} MB | {538} MB | "
                           "{46,080} | {698} MB |"),
          ("SmolLM2-360M", "| SmolLM2-360M | {1.88} | {269} MB | {1,447} MB | {81,920} | "
                           "{1,808} MB |"),
          ("Qwen2.5-0.5B", "| Qwen2.5-0.5B | {1.52} | {392} MB | {1,976} MB | {24,576} | "
                           "{2,178} MB |"),
          ("Qwen3-0.6B", "| Qwen3-0.6B | {1.04} | {391} MB | {2,384} MB | {229,376} | "
                         "{2,502} MB |"),
          ("Gemma-3-270M", "| Gemma-3-270M | {1.96} | {247} MB | {1,072} MB | {36,864} | "
                           "{1,373} MB |"))],
    Figure(B, "Llama-3.2-1B {0.42}, Qwen2.5-0.5B {0.12}, Qwen3-0.6B {0.12}, Gemma-3-270M {0.05}",
           "lavapipe-families.json", lambda r: [
               r["families"][f]["layer_cpu_s"] for f in ("llama", "qwen2", "qwen3", "gemma3")]),
    # --- token trees ----------------------------------------------------------------------------
    Figure(B, "n-gram gave {3.33} tokens per pass with chain k=10 against {2.50} with tree 2,2,1 "
           "(11 rows each), and {3.33} with both chain k=15 and tree auto (16 rows); the trained "
           "draft {2.50} with every chain and tree", "tree-lavapipe.json", lambda r: [
               tree_rows(r, "ngram")["chain k=10"], tree_rows(r, "ngram")["tree 2,2,1"],
               same([tree_rows(r, "ngram")["chain k=15"], tree_rows(r, "ngram")["tree auto"]]),
               same(list(tree_rows(r, "trained").values()))]),
    Figure(B, "({1,511} against {1,518} ms for one row, {5,901} against {5,887} ms for 8)",
           "tree-lavapipe.json", lambda r: [r["chain_speed_ab"]["median_ms_per_pass"][k] for k in (
               "branch rows=1", "main rows=1", "branch rows=8", "main rows=8")]),
    # --- the gate in the page, fault recovery ---------------------------------------------------
    Figure(B, "n-gram drafted in {3}% of cycles (the break-even guard kept it off), every output "
           "was identical to champion-only, the speedup's median x{0.949} with interval "
           "[{0.730}, {1.495}] over {11} prompts: the cores were shared with other jobs, so "
           "per-prompt ratios spread from x{0.23} to x{1.88}", "page-gate-swiftshader.json",
           lambda r: [
               100 * (n := r["report"]["drafters"]["ngram"])["drafted_cycles_share"],
               n["speedup"]["median"], n["speedup"]["low"], n["speedup"]["high"], n["prompts"],
               n["speedup"]["min"], n["speedup"]["max"]]),
    Figure(B, "(`opfs-truncate`, `opfs-flip`, `opfs-quota`) {0.01}-{0.04} s, `download-drop` "
           "{0.27} s (its first backoff); a GPU fault moved to the numpy engine {0.1}-{0.5} s "
           "(`readback-hang` adds its 5 s watchdog); a new WebGPU device {16}-{20} s; a new "
           "worker (a Pyodide start) {22}-{40} s", "faults.json", lambda r: [
               *recoveries(r, "opfs-truncate", "opfs-flip", "opfs-quota"),
               same([round(x, 2) for x in recoveries(r, "download-drop")]),
               *recoveries(r, "gpu-oom", "readback-throw", "readback-hang"),
               *recoveries(r, "device-lost"), *recoveries(r, "worker-terminate", "worker-oom")]),
    # --- the page on a real GPU ------------------------------------------------------------------
    Figure(B, "the trained draft, drafted on\n  the device in the worker (`draft_path: device` on "
           "every prompt), {1.46}x over Dawn's champion\n  alone as the guard chooses k ({1.65}x at "
           "`--k fixed:3`), n-gram {1.18}x", "h100-dawn.json", lambda r: [
               dawn_speedup(r, GUARDED), dawn_speedup(r, FIXED3), dawn_speedup(r, "ngram")]),
    Figure(B, "Dawn's champion alone ran at\n{582}, {393} and {449} tok/s against native's {665}, "
           "{680} and {683} in the same calls (its host time a cycle\n{1.12}, {1.69} and {1.51} ms",
           "h100-dawn-6179483.json", lambda r: [
               *[tok_s(load(f), "champion-only") for f in THIRD],
               *[load(f)["native"]["champion_tok_s"] for f in THIRD],
               *[load(f)["dawn"]["champion-only"]["overall"]["host_ms_per_cycle"] for f in THIRD]]),
    Figure(B, "in the first run its median tok/s was {0.85}x the guarded chain's, and n-gram's\n"
           "  `--tree auto` {1.09}x its chain's", "h100-dawn-6cca397.json", lambda r: [
               tok_s(r, TREE221_GUARD) / tok_s(r, GUARDED),
               tok_s(r, "ngram tree auto") / tok_s(r, "ngram")]),
    Figure(B, "in the reversed run {0.83}x and {1.30}x", "h100-dawn-6cca397-reversed.json",
           lambda r: [tok_s(r, TREE221_GUARD) / tok_s(r, GUARDED),
                      tok_s(r, "ngram tree auto") / tok_s(r, "ngram")]),
    Figure(B, "before the fix {0.99}x ({0.73}x)", "h100-dawn-6179483.json",
           lambda r: [tok_s(r, TREE211) / tok_s(r, FIXED3), tok_s(r, TREE221) / tok_s(r, FIXED3)]),
    Figure(B, "after it {0.97}x ({0.90}x)", "h100-dawn-6cca397.json",
           lambda r: [tok_s(r, TREE211) / tok_s(r, FIXED3), tok_s(r, TREE221) / tok_s(r, FIXED3)]),
    Figure(B, "reversed\n  {1.08}x ({0.98}x)", "h100-dawn-6cca397-reversed.json",
           lambda r: [tok_s(r, TREE211) / tok_s(r, FIXED3), tok_s(r, TREE221) / tok_s(r, FIXED3)]),
    Figure(B, "drafts: {2.11}, {2.00}, {2.00} and {2.00} tokens a pass against the guarded "
           "chain's {2.11}, {2.00}, {2.00} and {1.94}", FOURTH[0], lambda r: [
               *[t["median"] for t in overall(TREE221_GUARD, "tokens_per_pass")],
               *[t["median"] for t in overall(GUARDED, "tokens_per_pass")]]),
    Figure(B, "({26}, {25}, {24} and {25} tree cycles over the 11 prompts, against {204}, {196}, "
           "{196} and {192} decisions for the chain", FOURTH[0], lambda r: [
               *[t["trees"] for t in overall(TREE221_GUARD, "schedule")],
               *[t["tree_off"] for t in overall(TREE221_GUARD, "schedule")]]),
    Figure(B, "(`guard_off` {4}, {20}, {26} and {32} over the prompts; the chain's {16}, {16}, {16} "
           "and {23})", FOURTH[0], lambda r: [
               *[t["guard_off"] for t in overall(TREE221_GUARD, "schedule")],
               *[t["guard_off"] for t in overall(GUARDED, "schedule")]]),
    Figure(B, "Its median tok/s over the guarded chain's was {1.09}x, {1.06}x, {0.90}x and "
           "{0.65}x, and n-gram's `--tree auto` over its chain's {1.07}x, {1.09}x, {0.88}x and "
           "{1.01}x", FOURTH[0], lambda r: [*fourth_ratios(TREE221_GUARD, GUARDED),
                                             *fourth_ratios("ngram tree auto", "ngram")]),
    Figure(B, "the tree's against the chain's, {1.57} / {1.85}, {2.12} / {2.15}, {2.72} / {2.52} "
           "and {2.11} / {1.52} ms", FOURTH[0], lambda r: [
               ms for pair in zip(overall(TREE221_GUARD, "host_ms_per_cycle"),
                                  overall(GUARDED, "host_ms_per_cycle")) for ms in pair]),
    Figure(B, "champion alone ran at {393}, {465}, {390} and {391} tok/s against native's {672}, "
           "{613}, {682} and {679}", FOURTH[0], lambda r: [
               *[tok_s(load(f), "champion-only") for f in FOURTH],
               *[load(f)["native"]["champion_tok_s"] for f in FOURTH]]),
    Figure(B, "tree `2,1,1` at `fixed:3` ({2.58} tokens a pass against the chain's {2.37}) ran "
           "{1.09}x and {1.08}x its chain where their processes' host times a cycle matched "
           "({1.96} / {1.92} and {2.01} / {1.98} ms), and {0.67}x and {0.59}x where the tree's "
           "process took {3.05} and {3.06} ms a cycle (the chain's {1.79} and {1.66})", FOURTH[0],
           lambda r: [overall(TREE211, "tokens_per_pass")[0]["median"],
                      overall(FIXED3, "tokens_per_pass")[0]["median"],
                      *fourth_ratios(TREE211, FIXED3, FOURTH[1:3]),
                      *[ms for pair in zip(overall(TREE211, "host_ms_per_cycle", FOURTH[1:3]),
                                           overall(FIXED3, "host_ms_per_cycle", FOURTH[1:3]))
                        for ms in pair],
                      *fourth_ratios(TREE211, FIXED3, FOURTH[::3]),
                      *overall(TREE211, "host_ms_per_cycle", FOURTH[::3]),
                      *overall(FIXED3, "host_ms_per_cycle", FOURTH[::3])]),
    Figure(B, "there the guarded trained draft ran at {0.95}x", "h100-dawn-1f97119.json",
           lambda r: [dawn_speedup(r, GUARDED)]),
    Figure(B, "under `--k heuristic` {31} of its {259} cycles took\n  more than {4} ms of host "
           "time (their median {5.96} ms), where `fixed:3`'s took {1.62} ms (the\n  median; {1} of "
           "{201} above {4} ms)", "h100-dawn-1f97119.json", lambda r: [
               *slow_cycles(r, GUARDED)[:2], 4, slow_cycles(r, GUARDED)[2],
               *slow_cycles(r, FIXED3)[3:], 4]),
    Figure(B, "now {2} of the guarded draft's {230} cycles take more than\n  {4} ms (each prompt's "
           "`host_ms_cycles` in the file), and its cycles' median is {1.27} ms", "h100-dawn.json",
           lambda r: [*slow_cycles(r, GUARDED)[:2], 4, slow_cycles(r, GUARDED)[3]]),
    Figure(B, "({657} against {684} tok/s, the\n  native side pipelining too). Dawn's host time a "
           "cycle is {1.04} ms against the null GPU's {0.24} ms", "h100-dawn.json", lambda r: [
               r["dawn"]["champion-only"]["overall"]["tokens_per_s"]["median"],
               r["native"]["champion_tok_s"],
               r["dawn"]["champion-only"]["overall"]["host_ms_per_cycle"],
               r["dawn"]["null GPU: draft-l4 fixed:3"]["overall"]["host_ms_per_cycle"]]),
    Figure(B, "for the pass's {152} dispatches, about as much as\n  the GPU's own one-row pass, "
           "{1.22} ms", "h100-dawn.json", lambda r: [
               r["native"]["gpu"]["kernel_profile"]["1"]["dispatches"],
               1000 * r["native"]["gpu"]["gpu_pass_s"]["1"]]),
    Figure(B, "tree `2,2,1` verifies {2.72} tokens a pass against the chain's {2.37} at `fixed:3`\n"
           "  but runs at {1.49}x against the chain's {1.65}x", "h100-dawn.json", lambda r: [
               r["dawn"][TREE221]["overall"]["tokens_per_pass"]["median"],
               r["dawn"][FIXED3]["overall"]["tokens_per_pass"]["median"],
               dawn_speedup(r, TREE221), dawn_speedup(r, FIXED3)]),
    Figure(B, "n-gram's `--tree auto` under the guard, {1.12}x against its chain's {1.18}x",
           "h100-dawn.json", lambda r: [dawn_speedup(r, "ngram tree auto"),
                                        dawn_speedup(r, "ngram")]),
    Figure(B, "the quantized products took {66}-{73}% of a pass's GPU time", "h100-shapes-blocks.json",
           lambda r: sorted([kernel_share(r, LLAMA, "matmul.matmul_q4_k"),
                             kernel_share(r, SMOL, "matmul.matmul_q5_0")])),
    Figure(B, "decode through Dawn is now {0.38}-{0.69}x llama.cpp CUDA. The 1B shapes are still "
           "far from the memory's bandwidth ({3.35} TB/s)", "h100-shapes.json", lambda r: [
               *(f(e["decode_ratio_dawn_over_llama_cpp"] for e in r["table"]) for f in (min, max)),
               r["hbm_bytes_per_s"]["spec"] / 1e12]),
    Figure(B, "{8} rows cost {1.03}-{1.29} times one row, {16} rows {1.21}-{2.13} times",
           "h100-shapes.json", lambda r: [
               8, *(f(e["verify_cost_ratio"]["8"] for e in r["table"]) for f in (min, max)),
               16, *(f(e["verify_cost_ratio"]["16"] for e in r["table"]) for f in (min, max))]),
    Figure(B, "natively reaches {1,763}-{7,558} tok/s against llama.cpp's {26,587}-{47,997}",
           "h100-shapes.json", lambda r: [
               *(f(e["pyspec_prefill_tok_s"] for e in r["table"]) for f in (min, max)),
               *(f(e["llama_cpp_prefill_1024_tok_s"] for e in r["table"]) for f in (min, max))]),
    # --- docs/cpu-engine.md ----------------------------------------------------------------------
    Figure(E, "| champion (135M, Q4_1 / Q8_0), `blas` | {7.1}x ({2.9}x in an earlier run) | {2.3}x "
           "({2.5}x) |", "cpu-blocks.json", lambda r: [
               (b := blocks(r, CHAMP, "blas blocks"))[0],
               r["earlier_run"][CHAMP]["x_float32_1_row"], b[1],
               r["earlier_run"][CHAMP]["x_float32_5_rows"]]),
    Figure(E, "| champion, `einsum` (the page's kernel, natively) | {4.9}x | {1.6}x |",
           "cpu-blocks.json", lambda r: blocks(r, CHAMP, "einsum blocks")),
    Figure(E, "| champion, Pyodide under Node, `einsum` | {5.9}x | {2.9}x |", "cpu-blocks.json",
           lambda r: [r["models"][CHAMP]["pyodide"]["blocks"][k]
                      for k in ("x_float32_1_row", "x_float32_5_rows")]),
    Figure(E, "| Qwen3-0.6B shape (random Q4_K_M), `blas` | {3.3}x ({4.6}x) | {2.9}x ({1.8}x) |",
           "cpu-blocks.json", lambda r: [
               (b := blocks(r, QWEN3_FILE, "blas blocks"))[0],
               r["earlier_run"][QWEN3_FILE]["x_float32_1_row"], b[1],
               r["earlier_run"][QWEN3_FILE]["x_float32_5_rows"]]),
    Figure(E, "| Qwen3-0.6B shape, `einsum` | {5.4}x | {2.2}x |", "cpu-blocks.json",
           lambda r: blocks(r, QWEN3_FILE, "einsum blocks")),
    Figure(E, "(the champion at {2.9}x, in a run where the Qwen3 shape cost {4.6}x)",
           "cpu-blocks.json", lambda r: [r["earlier_run"][m]["x_float32_1_row"]
                                         for m in (CHAMP, QWEN3_FILE)]),
    Figure(E, "{0.83} bytes a parameter for the champion, {0.93} for the Qwen3 shape",
           "cpu-blocks.json", lambda r: [
               r["models"][m]["modes"]["blas blocks"]["weight_bytes"] / r["models"][m]["params"]
               for m in (CHAMP, QWEN3_FILE)]),
    Figure(E, "the champion's one-token pass: {46} ms on this machine", "cpu-rows.json",
           lambda r: [r["blocks"]["256"]["1"]["median_ms"]]),
    # --- the other pages -------------------------------------------------------------------------
    Figure("docs/embedding.md", "took about {6.7} s on a first visit and {4.8} s on later ones",
           "startup.json", lambda r: [r["summary"][k]["ready_s"]["median"]
                                      for k in ("snapshot/first", "snapshot/warm")]),
    Figure("docs/embedding.md", "the first render cost about {0.3}-{0.6} s on the 2-core machine",
           "startup-jinja2.json", lambda r: [
               f(v["first_render_ms"]["median"] for v in r["summary"].values()) / 1000
               for f in (min, max)]),
    Figure("docs/embedding.md", "the heap growing by about {32} MiB", "page-big-shapes.json",
           lambda r: [max(heap_growth(r))]),
    Figure("docs/models.md", "the draft model gained nothing there ({1.00}x under the guard",
           "cpu-guard-reduced-head.json", lambda r: speedups(r, "trained")),
    Figure("docs/models.md", "quantized on the CPU they cost {3.3}-{7.1}x the time a parameter",
           "cpu-blocks.json", lambda r: [
               f(x for m in (CHAMP, QWEN3_FILE) for mode in ("blas blocks", "einsum blocks")
                 for x in blocks(r, m, mode)[:1]) for f in (min, max)]),
    Figure("docs/sampling-and-json.md", "a median of {0.30} ms of CPU per masked row",
           "json-cpu.json", lambda r: [r["mask_cost"]["cpu_ms_per_row"]["median"]]),
    Figure("docs/sampling-and-json.md", "({1.41}x against n-gram's {1.84}x over {8} prompts",
           "json-readback-h200.json", lambda r: [
               r["overall"]["readback:trained/heuristic"]["speedup_median"],
               r["overall"]["ngram/heuristic"]["speedup_median"],
               same([r["overall"][k]["prompts"] for k in ("readback:trained/heuristic",
                                                          "ngram/heuristic")])]),
    Figure("docs/sampling-and-json.md", "(load {0.5} to {2.2}), 3 runs: {64}% of the generated "
           "tokens are forced; tokens per champion pass {0.99} champion-only, {2.69} with forced "
           "drafts, {5.81} with forced + n-gram drafts; median speedup {2.03}x and {2.05}x; all "
           "{8} "
           "outputs identical", "tools-cpu.json", lambda r: [
               r["provenance"]["load"]["start"][0], r["provenance"]["load"]["end"][0],
               100 * r["overall"]["forced"]["forced_share"],
               *(r["overall"][k]["tokens_per_pass"] for k in ("champion-only", "forced",
                                                              "forced+ngram")),
               r["overall"]["forced"]["median_speedup"],
               r["overall"]["forced+ngram"]["median_speedup"],
               same([r["overall"][k]["equal_to_champion_only"] for k in ("forced",
                                                                         "forced+ngram")])]),
]


# Figures the pages state that are no measurement (a threshold, a default, a count), by page: the
# scan below lets them be.
NOT_MEASURED = {
    "docs/cpu-engine.md": ["the 3x we allowed it"],                         # the block format's bar
    "docs/benchmarks.md": [   # a simulation's (tests/test_guard_sim.py, the switch test)
        "In `tests/test_guard_sim.py`'s model of those cycles (1 ms a refill, drafts accepted 2 in "
        "3, a tree's levels 3 in 4) the guarded tree runs at least 0.98x its chain on ten seeds; "
        "without the charge one seed swapped 103 times in 400 cycles at 0.88x; without the first "
        "branch's teaching another (a chain's first draft rejected early, so that no chain paid "
        "by its estimate) ran depth-1 trees for the rest of the request at 0.88x"],
    "docs/embedding.md": ["(default 60,000 ms)"],                           # stallTimeoutMs
    "docs/faults.md": ["(20x the slowest readback"],                        # the watchdog's rule
    "docs/models.md": ["1 + 30 x 5 + 1 = 152 dispatches",                   # a count
                       "the median speedup is at least 1.05x"],             # gate's threshold
}
# A speed figure: a number before x, tok/s, ms or µs.
SPEED = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:x\b|tok/s|ms\b|µs\b)")
PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]


def squash(text: str) -> str:
    """Text with every run of whitespace one space (a passage may break across lines)."""
    return re.sub(r"\s+", " ", text).strip()


def agrees(quoted: str, value: float) -> bool:
    """A quoted figure is the value at the places it shows: within half its last digit."""
    places = len(quoted.split(".")[1]) if "." in quoted else 0
    return abs(float(quoted.replace(",", "")) - value) <= 0.5 * 10 ** -places + 1e-9


def check(figure: Figure, root: Path = ROOT, results: Path = RESULTS) -> None:
    page = squash((root / figure.page).read_text())
    shown = squash(figure.quote.replace("{", "").replace("}", ""))
    assert shown in page, \
        f"{figure.page} no longer says {shown!r}: make FIGURES follow it (and re-read its file)"
    quoted = re.findall(r"\{([^}]*)\}", figure.quote)
    values = figure.read(json.loads((results / figure.file).read_text()))
    assert len(values) == len(quoted), f"{figure.file} gives {len(values)} figures for {quoted}"
    for q, v in zip(quoted, values):
        assert agrees(q, v), (f"{figure.page} quotes {q} in {shown!r}, where "
                              f"bench/results/{figure.file} has {v:.6g}")


@pytest.mark.parametrize("figure", FIGURES, ids=[f"{f.page.split('/')[-1]}:{f.file}:{i}"
                                                 for i, f in enumerate(FIGURES)])
def test_a_quoted_figure_is_its_files(figure):
    check(figure)


def test_every_figure_file_is_a_result_file():
    assert {f.file for f in FIGURES} <= {p.name for p in RESULTS.glob("*.json")}


def test_a_changed_figure_is_caught(tmp_path):
    """The check fails on a page whose figure drifted from its file: the first figure of
    FIGURES, quoted one unit higher in its last digit on a copy of its page."""
    figure = FIGURES[0]
    first = re.search(r"\{([^}]*)\}", figure.quote).group(1)
    places = len(first.split(".")[1]) if "." in first else 0
    drift = f"{float(first.replace(',', '')) + 10 ** -places:.{places}f}"
    page = tmp_path / figure.page
    page.parent.mkdir(parents=True, exist_ok=True)
    before = squash(figure.quote.replace("{", "").replace("}", ""))
    after = squash(figure.quote.replace("{" + first + "}", drift, 1).replace("{", "")
                   .replace("}", ""))
    page.write_text(squash((ROOT / figure.page).read_text()).replace(before, after))
    drifted = Figure(figure.page, figure.quote.replace("{" + first + "}", "{" + drift + "}", 1),
                     figure.file, figure.read)
    with pytest.raises(AssertionError, match=f"quotes {re.escape(drift)}"):
        check(drifted, root=tmp_path)


def typed_by_hand(page: str) -> str:
    """A page's text without what is made or run: webtools/results.py's blocks, code blocks."""
    text = (ROOT / page).read_text()
    text = re.sub(r"<!-- ([\w ]+)(?::[^>]*)?-->\n.*?<!-- /\1 -->", "", text, flags=re.S)
    return squash(re.sub(r"```.*?```", "", text, flags=re.S))


@pytest.mark.parametrize("page", PAGES)
def test_every_speed_figure_typed_in_a_page_is_checked(page):
    """A number before x, tok/s, ms or µs outside the generated blocks is in a passage of
    FIGURES (or named in NOT_MEASURED): a new figure needs its file."""
    text = typed_by_hand(page)
    passages = [squash(f.quote.replace("{", "").replace("}", "")) for f in FIGURES
                if f.page == page] + NOT_MEASURED.get(page, [])
    spans = [(i, i + len(p)) for p in passages for i in [text.find(p)] if i >= 0]
    for m in SPEED.finditer(text):
        assert any(a <= m.start() < b for a, b in spans), \
            f"{page}: {text[max(0, m.start() - 60):m.end()]!r}: a figure with no file in FIGURES"
