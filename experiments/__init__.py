"""Every measurement the documentation and bench/results/ quote, by name: what it measures, the one
command that runs it, the machine it needs and the result files it writes (`EXPERIMENTS`), and
the files written before pyspec/apps/provenance.py could make them recountable (`LEGACY`, one
list, in one place; README's table and bench/results/README.md mark them).

    python -m experiments                                   # the list
    python -m experiments NAME [--allow-dirty] [--into DIR]  # run one (experiments/run.py)

Each measurement is a module of this package (experiments/NAME.py, run as `python -m
experiments.NAME`; `python -m experiments NAME` runs it the one way) that writes through the
writer. A result file belongs to exactly one experiment; a file with provenance was made by one of
its experiment's commands (tests/test_results.py ties both; `normal` reads a command recorded
before the scripts became modules). The GPU experiments (machine "gpu") run on the lent GPU
machine through the lead's scripts/h200.sh, which carries the tree there. What stays in scripts/
is no measurement (`SCRIPTS`): the golden recorders, each named in its golden file, their helpers
and the build helpers.

Not here: running (experiments/run.py), the results README (experiments/readme.py), the writer
(pyspec/apps/provenance.py).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from pyspec.apps import provenance

HERE = Path(__file__).resolve().parent

# The public workload's argument, as the commands give it (run from the repository root).
WORKLOAD = "workloads/public.jsonl"
# The shipped draft without its reduced-head sidecar (a copy made by the runner: `prepare`).
FULL_HEAD = "trained-full-head/draft-l4.gguf"


@dataclass(frozen=True)
class Experiment:
    """One measurement. `commands`: argv after `python` ({out}: the runner's output folder; the
    first is the experiment, the others runs it makes itself); `outputs`: file in {out} -> its
    name in bench/results/; `machine`: where it runs ("gpu": the lent GPU machine, by the lead's
    scripts/h200.sh); `prepare`: "full-head" to make FULL_HEAD first."""

    what: str
    commands: tuple[tuple[str, ...], ...]
    outputs: dict[str, str]
    machine: str = "2-core"
    prepare: str | None = None
    files: tuple[str, ...] = field(default=())   # legacy files it made, not re-run since

    def results(self) -> list[str]:
        return [*self.outputs.values(), *self.files]


def bench(backend: str, *args: str) -> tuple[str, ...]:
    return ("-m", "pyspec", "bench", "--backend", backend, "--workload", WORKLOAD, *args,
            "--out", "{out}")


def bench_native(*args: str) -> tuple[str, ...]:
    """`pyspec bench` on the GPU as scripts/h200.sh's dawn step runs it (its own sample)."""
    return ("-m", "pyspec", "bench", "--backend", "wgpu", *args, "--out", "{out}")


def module(name: str, *args: str) -> tuple[str, ...]:
    """An experiment of this package: experiments/NAME.py, run as `python -m experiments.NAME`."""
    return ("-m", f"experiments.{name}", *args)


EXPERIMENTS: dict[str, Experiment] = {
    # --- the headline table (README, webtools/results.py) -------------------------------------
    "gpu-headline": Experiment(
        "speculative against champion-only on a GPU, native WebGPU, the public workload (the lead "
        "re-runs it: its file arrives beside h200.json, which stays legacy)",
        (bench("wgpu", "--drafts", "ngram,trained,ngram+trained,self:20",
               "--k", "heuristic", "--repeat", "2", "--max-tokens", "64", "--ctx", "2048"),),
        # the lead's re-run lands here (rename to match, and make this command the one it ran)
        {"bench-wgpu.json": "h100-headline.json", "bench-wgpu.png": "h100-headline.png"},
        machine="gpu", files=("h200.json", "h200.png")),
    "cpu-guard-reduced-head": Experiment(
        "the numpy engine under the break-even guard: n-gram, the trained draft with and without "
        "its reduced head, and both combined",
        (bench("cpu", "--drafts", f"ngram,trained,{FULL_HEAD},ngram+trained",
               "--max-tokens", "64", "--ctx", "2048", "--repeat", "2"),),
        {"bench-cpu.json": "cpu-guard-reduced-head.json",
         "bench-cpu.png": "cpu-guard-reduced-head.png"}, prepare="full-head"),
    "cpu-reduced-head-k2": Experiment(
        "the numpy engine at a fixed k of 2: the trained draft with and without its reduced head",
        (bench("cpu", "--drafts", f"trained,{FULL_HEAD}", "--k", "fixed:2",
               "--max-tokens", "64", "--ctx", "2048"),),
        {"bench-cpu.json": "cpu-reduced-head-k2.json", "bench-cpu.png": "cpu-reduced-head-k2.png"},
        prepare="full-head"),
    "page-cpu": Experiment(
        "the page in headless Chromium (SwiftShader: the page's numpy engine), n-gram and the "
        "trained draft",
        (("-m", "webtools.bench", "--backend", "auto", "--drafts", "ngram,trained",
          "--max-tokens", "48", "--per-stratum", "4", "--repeat", "2", "--out", "{out}"),),
        {"bench-browser.json": "browser-cpu-guard3.json",
         "bench-browser.png": "browser-cpu-guard3.png"}, machine="2-core, Chromium"),
    "wllama": Experiment(
        "the page against wllama (llama.cpp in WebAssembly) on the same prompts and champion",
        (module("bench_wllama", "--per-stratum", "1", "--max-tokens", "32", "--threads", "1,2",
                "--out", "{out}"),
         ("-m", "webtools.bench", "--backend", "cpu", "--per-stratum", "1", "--max-tokens", "32",
          "--drafts", "ngram", "--workload", WORKLOAD, "--out", "{out}")),
        {"wllama-vs-pyspec-cpu.json": "wllama-vs-pyspec-cpu.json",
         "wllama-pyspec-side-cpu.json": "wllama-pyspec-side-cpu.json"},
        machine="2-core, Chromium"),
    # --- drafts and their pairing -------------------------------------------------------------
    "page-gate": Experiment(
        "the page's own gate (\"measure on this device\") on SwiftShader",
        (module("page_gate", "--model", "smollm2", "--drafts", "ngram", "--per-stratum", "1",
                "--max-tokens", "32", "--out", "{out}/page-gate-swiftshader.json"),),
        {}, machine="2-core, Chromium", files=("page-gate-swiftshader.json",)),
    "gpu-combo": Experiment(
        "n-gram and a draft model combined, at match lengths 3 and 2",
        (bench("wgpu", "--drafts", "ngram,ngram+trained"),), {}, machine="gpu",
        files=("h200-combo.json", "h200-combo-qat.json", "h200-combo-qat-match2.json")),
    "gpu-draft-versions": Experiment(
        "the shipped draft against the one before it at k = 4",
        (bench("wgpu", "--drafts", "OLD,NEW", "--k", "fixed:4"),), {},
        machine="gpu", files=("h200-draft-l4t-k4.json",)),
    "lavapipe-draft-ahead": Experiment(
        "a draft model's cycles fed on the device against fed from the host",
        (bench("wgpu"),), {}, machine="lavapipe",
        files=("lavapipe-draft-ahead.json",)),
    "ngram-match": Experiment(
        "n-gram acceptance by matched length", (module("ngram_match", "--out", "{out}/x.json"),),
        {}, files=("ngram-match.json",)),
    "agreement-by-confidence": Experiment(
        "the draft's agreement with the champion by its confidence",
        (module("agreement_by_confidence", "--out", "{out}/x.json"),), {},
        files=("agreement-by-confidence.json",)),
    "tree-estimate": Experiment(
        "what a tree of drafts would give the trained draft, estimated",
        (module("tree_estimate", "--out", "{out}/x.json"),), {}, files=("tree-estimate.json",)),
    "tree-vs-chain": Experiment(
        "a tree of drafts against a chain, measured (the lead's GPU script)",
        (module("tree_vs_chain", "--engine", "gpu", "--configs", "gpu", "--strata",
                "repetitive", "--max-tokens", "10", "--drafts", "ngram,trained"),), {},
        machine="lavapipe; gpu", files=("tree-lavapipe.json",)),
    "draft-cost": Experiment(
        "a draft pass's cost by its shape (train/README.md)",
        (module("bench_draft_cost", "--out", "{out}/draft-cost.json"),), {}),
    "reduced-vocab": Experiment(
        "the draft's head cut to its most frequent ids: agreement and cost (train/README.md)",
        (module("reduced_vocab"),), {}),
    # --- output control and sampling ----------------------------------------------------------
    "json": Experiment(
        "schema-constrained decoding: forced tokens and n-gram against constrained champion-only",
        (module("bench_json", "--backend", "cpu", "--runs", "2", "--drafts", "none,ngram",
                "--out", "{out}/json-cpu.json"),), {},
        machine="2-core; gpu",
        files=("json-cpu.json", "json-h200.json", "json-readback-h200.json")),
    "tools-cpu": Experiment(
        "tool-call decoding (the champion under Qwen 2.5's template): forced tokens, and forced "
        "tokens with n-gram, against champion-only under the same call grammar",
        (module("bench_tools", "--runs", "3", "--out", "{out}/tools-cpu.json"),),
        {"tools-cpu.json": "tools-cpu.json"}),
    "sampling": Experiment(
        "what each sampling control costs a cycle, device against host",
        (module("bench_sampling", "--out", "{out}/sampling.json"),), {},
        machine="lavapipe; gpu", files=("sampling-h200-split.json", "sampling-h200-rows.json",
                                        "sampling-h200-1204.json", "sampling-lavapipe.json")),
    "mask": Experiment(
        "a schema mask per row on the device, split and one workgroup per row",
        (module("bench_mask", "--out", "{out}/mask.json"),), {}, machine="lavapipe; gpu",
        files=("mask-h200-split.json", "mask-lavapipe.json")),
    "page-mask-cost": Experiment(
        "a schema mask per row in Pyodide under Node, against native",
        (module("page_mask_cost", "--out", "{out}/page-mask-cost.json"),), {},
        machine="2-core, Node", files=("page-mask-cost.json",)),
    # --- engines, start-up, faults ------------------------------------------------------------
    "cpu-rows": Experiment(
        "the numpy engine's cost by rows of a verify pass",
        (module("bench_cpu_rows", "--blocks", "4096,256,128", "--out", "{out}/cpu-rows.json"),),
        {}, files=("cpu-rows.json",)),
    "cpu-blocks": Experiment(
        "block-format weights against float32 (its script left with the block format: "
        "scripts/bench_cpu_blocks.py at commit fc29f3a)", (), {}, files=("cpu-blocks.json",)),
    "gpu-kernels": Experiment(
        "the GPU kernels' times by shape", (module("bench_kernels"),), {}, machine="gpu",
        files=("h200-kernels.json",)),
    "page-big-shapes": Experiment(
        "the real families' shapes in the page on SwiftShader",
        (module("page_big_shapes", "DIR", "--out", "{out}/page-big-shapes.json"),), {},
        machine="2-core, Chromium", files=("page-big-shapes.json",)),
    "startup": Experiment(
        "the page's start-up, cold and warm, with and without jinja2",
        (module("bench_startup", "--out", "{out}/startup"),), {}, machine="2-core, Chromium",
        files=("startup.json", "startup.png", "startup-with-jinja2.json",
               "startup-with-jinja2.png", "startup-no-jinja2.json", "startup-no-jinja2.png",
               "startup-jinja2.json", "startup-jinja2.png")),
    "page-ttft": Experiment(
        "time to first token in the page", (module("page_ttft", "--out", "{out}/x.json"),), {},
        machine="2-core, Chromium", files=("page-ttft-cpu.json",)),
    "faults": Experiment(
        "what the page survives and how long recovery takes",
        (module("bench_faults", "--runs", "5", "--max-tokens", "16", "--screens",
                "--out", "{out}/faults.json"),), {}, machine="2-core, Chromium",
        files=("faults.json",)),
    "conversation": Experiment(
        "a conversation's next turn reusing the cache",
        (module("bench_conversation", "--out", "{out}/x.json"),), {},
        files=("conversation-cpu.json",)),
    "long-context": Experiment(
        "an 8,000-token prompt", (module("long_context", "--out", "{out}/x.json"),), {},
        machine="2-core; gpu", files=("long-context.json",)),
    # --- model families (the lead's GPU scripts among them: run by scripts/h200.sh) -----------
    "real-shapes": Experiment(
        "random Q4_K_M files of the real families' shapes on the native CPU engine",
        (module("real_shapes", "bench", "DIR"),), {}, machine="2-core; gpu",
        files=("real-shapes.json", "real-shapes.png")),
    "gpu-families": Experiment(
        "each family's real width on a GPU adapter, per layer",
        (module("bench_gpu_families", "--families", "gemma3,qwen2,qwen3,llama"),), {},
        machine="lavapipe", files=("lavapipe-families.json",)),
    "gpu-shapes": Experiment(
        "decode, prefill and verify cost by rows of the real shapes on native WebGPU and through "
        "Dawn, beside llama.cpp's CUDA build (scripts/h200.sh background, dawn_shapes, "
        "llama_bench; scripts/build_llama_cpp_cuda.sh)",
        # as run on the H100 (scripts/h200.sh background: the shapes written there), then
        # `gpu_shapes.py report` here joins llama-bench, Dawn and the null GPU (its --help)
        (module("gpu_shapes", "measure", "$W/shapes", "--names",
                "SmolLM2-135M,Qwen3-0.6B,Llama-3.2-1B,Gemma-3-1B,Qwen2.5-1.5B", "--out", "{out}"),),
        {"h100-shapes.json": "h100-shapes.json", "h100-shapes.png": "h100-shapes.png"},
        machine="gpu"),
    "gpu-shapes-blocks": Experiment(
        "gpu-shapes with the quantized products before matmul_coalesced.wgsl (lanes of whole "
        "blocks, commit 4590800), three shapes",
        (module("gpu_shapes", "measure", "$W/shapes", "--names",
                "SmolLM2-135M,Qwen3-0.6B,Llama-3.2-1B", "--out", "{out}"),),
        {"h100-shapes-blocks.json": "h100-shapes-blocks.json",
         "h100-shapes-blocks.png": "h100-shapes-blocks.png"}, machine="gpu"),
    "gpu-matmul-ab": Experiment(
        "the GPU's quantized products: lanes of whole blocks against coalesced slices, "
        "interleaved on one adapter (scripts/h200.sh matmul_ab)",
        (module("shader_ab", "--matmul", "--model", "$W/shapes/SmolLM2-135M.gguf", "--model",
                "$W/shapes/Llama-3.2-1B.gguf", "--reps", "15", "--rows", "1,8", "--out",
                "{out}"),),
        {"matmul-ab.json": "h100-matmul-ab.json", "matmul-ab.png": "h100-matmul-ab.png"},
        machine="gpu"),
    "gpu-trees": Experiment(
        "trees against chains on the GPU, n-gram and the trained draft, every stratum's first "
        "prompt, outputs asserted equal to champion-only's (scripts/h200.sh trees)",
        (module("tree_vs_chain", "--engine", "gpu", "--configs", "gpu", "--strata", "all",
                "--max-tokens", "64", "--out", "{out}"),),
        {"trees-native.json": "h100-trees.json", "trees-native.png": "h100-trees.png"},
        machine="gpu"),
    "dawn": Experiment(
        "the page's stack (Pyodide + Dawn) on the GPU beside native wgpu-py: the native bench "
        "below, then webtools.dawn per side (scripts/h200.sh dawn); dawn_report joins them",
        (bench_native("--champion", "$W/payload/champ.gguf", "--per-stratum", "1", "--max-tokens",
                      "64", "--drafts", "ngram,models/draft-l4.gguf"), module("dawn_report")),
        {"dawn.json": "h100-dawn.json", "dawn.png": "h100-dawn.png"}, machine="gpu"),
    "dawn-1f97119": Experiment(
        "dawn at commit 1f97119, before cycles gone ahead stopped writing from the host (their "
        "Params and Step now come from tables on the device), sides without trees",
        (bench_native("--champion", "$W/payload/champ.gguf", "--per-stratum", "1", "--max-tokens",
                      "64", "--drafts", "ngram,models/draft-l4.gguf"), module("dawn_report")),
        {"h100-dawn-1f97119.json": "h100-dawn-1f97119.json",
         "h100-dawn-1f97119.png": "h100-dawn-1f97119.png"}, machine="gpu"),
    "dawn-trees-guard": Experiment(
        "dawn with the tree sides (DAWN_SIDES: n-gram --tree auto; the trained draft's tree "
        "2,2,1 guarded and at fixed:3, 2,1,1 at fixed:3), before (6179483) and after (6cca397) "
        "the guard stopped timing a probe's refill; after: twice in one call, the sides in "
        "reverse order the second time (this machine's host time per cycle drifted between "
        "processes); at 609d0a7 (probes and tree/chain switches untimed, trees drafted where "
        "no chain pays) four times in one lease, each in another order",
        (bench_native("--champion", "$W/payload/champ.gguf", "--per-stratum", "1", "--max-tokens",
                      "64", "--drafts", "ngram,models/draft-l4.gguf"), module("dawn_report")),
        {f"h100-dawn-{tag}.{ext}": f"h100-dawn-{tag}.{ext}"
         for tag in ("6179483", "6cca397", "6cca397-reversed", "609d0a7", "609d0a7-reversed",
                     "609d0a7-order3", "609d0a7-order4") for ext in ("json", "png")},
        machine="gpu"),
    "shader-ab": Experiment(
        "chain passes with two shader folders, interleaved: did a shader change slow chains? "
        "(tree-lavapipe.json's A/B)",
        (module("shader_ab", "A_SHADERS", "B_SHADERS", "--out", "{out}/shader-ab.json"),), {},
        machine="lavapipe; gpu"),
}

# Result files from before provenance.py's writer: no commit, no sha256 or no token hashes to
# recount them by. file -> (machine and date, the command as recorded by hand, a script of
# scripts/ written as the module it became). A file re-run through the writer leaves this list.
LEGACY: dict[str, tuple[str, str]] = {
    "h200.json": (
        "H200, 2026-12-04",
        "python3 -m pyspec bench --backend wgpu --champion champ.gguf --workload public.jsonl "
        "--drafts ngram,trained,ngram+trained,self:20 --k heuristic --repeat 2 --max-tokens 64 "
        "--ctx 2048"),
    "page-gate-swiftshader.json": (
        "2-core (shared, loaded), Chromium on SwiftShader, 2026-12-05",
        "python -m experiments.page_gate --model smollm2 --drafts ngram --per-stratum 1 "
        "--max-tokens 32"),
    "h200-combo.json": (
        "H200, 2026-12-03",
        "python -m pyspec bench --drafts ngram,ngram+DRAFT (match length 3)"),
    "h200-combo-qat.json": (
        "H200, 2026-12-03",
        "python -m pyspec bench --drafts ngram,ngram+DRAFT (match length 3)"),
    "h200-combo-qat-match2.json": (
        "H200, 2026-12-03",
        "python -m pyspec bench --drafts ngram,ngram+DRAFT (match length 2)"),
    "h200-draft-l4t-k4.json": (
        "H200, 2026-12-03",
        "python -m pyspec bench --drafts OLD,NEW --k fixed:4"),
    "lavapipe-draft-ahead.json": (
        "lavapipe, 2026-12-02",
        "python -m pyspec bench --backend wgpu (the draft fed on the device and from the host)"),
    "json-h200.json": (
        "H200",
        "python -m experiments.bench_json --backend wgpu --runs 2 --drafts "
        "none@fixed:4,ngram@fixed:4,ngram@heuristic"),
    "json-cpu.json": (
        "2-core",
        "python -m experiments.bench_json --backend cpu --runs 2 --drafts none,ngram"),
    "json-readback-h200.json": (
        "H200",
        "python -m experiments.bench_json --backend wgpu --runs 2 --drafts "
        "none,ngram,readback:trained,readback:trained@fixed:4,readback:self:20"),
    "sampling-h200-split.json": (
        "H200, 2026-12-04",
        "python -m experiments.bench_sampling (filters split over each row)"),
    "sampling-h200-rows.json": (
        "H200, 2026-12-04",
        "python -m experiments.bench_sampling (one workgroup per row)"),
    "mask-h200-split.json": (
        "H200, 2026-12-04",
        "python -m experiments.bench_mask (split over each row)"),
    "sampling-h200-1204.json": (
        "H200, 2026-12-04",
        "python -m experiments.bench_sampling --champion champ.gguf"),
    "sampling-lavapipe.json": (
        "lavapipe",
        "python -m experiments.bench_sampling (device against host accept)"),
    "mask-lavapipe.json": (
        "lavapipe",
        "python -m experiments.bench_mask (device against host accept)"),
    "page-mask-cost.json": (
        "2-core, Pyodide under Node",
        "python -m experiments.page_mask_cost"),
    "cpu-rows.json": (
        "2-core",
        "python -m experiments.bench_cpu_rows --blocks 4096,256,128"),
    "page-big-shapes.json": (
        "2-core, Chromium on SwiftShader, 2026-12-05, loaded",
        "python -m experiments.page_big_shapes DIR --shapes Qwen2.5-1.5B --tokens 2, then --shapes "
        "Gemma-3-1B,SmolLM2-1.7B, then --shapes Gemma-3-1B --binding-mib 128 (three runs in one"
        " file; two from a dirty tree; stamped with the champion's sha256, not the models "
        "measured)"),
    "cpu-blocks.json": (
        "2-core, 2026-12-05, loaded (load average 11-15)",
        "scripts/bench_cpu_blocks.py --rounds 7 --model CHAMPION Qwen3-0.6B.gguf (at commit "
        "fc29f3a; its recorded commit rewritten by hand)"),
    "h200-kernels.json": (
        "H200",
        "python -m experiments.bench_kernels"),
    "ngram-match.json": (
        "2-core",
        "python -m experiments.ngram_match"),
    "agreement-by-confidence.json": (
        "2-core",
        "python -m experiments.agreement_by_confidence"),
    "tree-estimate.json": (
        "2-core",
        "python -m experiments.tree_estimate"),
    "tree-lavapipe.json": (
        "lavapipe, 2026-12-05, loaded",
        "python -m experiments.tree_vs_chain --engine gpu --configs gpu --strata repetitive "
        "--max-tokens 10 --drafts ngram,trained (chain passes A/B against main's shaders: the "
        "command inside)"),
    "startup.json": (
        "2-core, Chromium",
        "python -m experiments.bench_startup --runs 3 --warm 2"),
    "startup-with-jinja2.json": (
        "2-core, Chromium",
        "python -m experiments.bench_startup --model tiny --runs 1 --warm 1 (its commit not in "
        "main's history)"),
    "startup-no-jinja2.json": (
        "2-core, Chromium",
        "python -m experiments.bench_startup --model tiny --runs 1 --warm 1 --without-jinja2 (its "
        "commit not in main's history)"),
    "startup-jinja2.json": (
        "2-core, Chromium",
        "python -m experiments.bench_startup --model tiny-llama3 --runs 1 --warm 1 --render (its "
        "commit not in main's history, from a dirty tree)"),
    "page-ttft-cpu.json": (
        "2-core, Chromium",
        "python -m experiments.page_ttft"),
    "faults.json": (
        "2-core, SwiftShader",
        "python -m experiments.bench_faults --runs 5 --max-tokens 16 --screens"),
    "conversation-cpu.json": (
        "2-core",
        "python -m experiments.bench_conversation"),
    "long-context.json": (
        "2-core and H200",
        "python -m experiments.long_context"),
    "real-shapes.json": (
        "2-core, 2026-12-05, loaded (load average about 20)",
        "python -m experiments.real_shapes write DIR, then python -m experiments.real_shapes bench "
        "DIR"),
    "lavapipe-families.json": (
        "lavapipe, 2026-12-05, loaded",
        "python -m experiments.bench_gpu_families --families gemma3,qwen2,qwen3,llama (its commit "
        "not in main's history)"),
}


# The files of scripts/, each with what it is for: no measurement (those are this package's
# modules), only the golden recorders, their helpers and the build helpers.
SCRIPTS: dict[str, str] = {
    "h200.sh": "the GPU machine's runner: carries the tree there and runs the GPU experiments",
    "build_llama_cpp_cuda.sh": "llama.cpp's CUDA build for gpu-shapes (scripts/h200.sh)",
    "build_llama_cpp.sh": "llama.cpp built for the golden recorders",
    "llama_tokenize.cpp": "llama.cpp's tokenizer for record_golden_families.py",
    "peer.py": "the golden recorders' shared plumbing",
    "record_golden_families.py": "tests/golden/family_ids.json",
    "record_golden_forward.py": "tests/golden/family_logits.json",
    "record_golden_llama.py": "tests/golden/llama_greedy.json",
    "record_golden_tokens.py": "tests/golden/tokenizer_ids.json",
    "record_golden_dequant.py": "tests/golden/family_dequant_logits.json",
    "record_golden_token_types.py": "tests/golden/token_types.json",
    "llama_logits.cpp": "llama.cpp's logits of a dequantized model for record_golden_dequant.py",
    "rng_known_answers.c": "the RNG's known answers in C (tests/test_rng.py)",
}

# This package's modules that are not experiments: the runner, its entry and the results page.
PLUMBING = ("__init__", "__main__", "run", "readme")


def experiment_of(name: str) -> str | None:
    """The experiment whose results include bench/results/NAME (a plot goes with its JSON)."""
    for key, e in EXPERIMENTS.items():
        if name in e.results():
            return key
    return None


def normal(command) -> list[str]:
    """A recorded command (as run) in the registry's terms: no interpreter, its --out folder
    written {out}, the workload's path relative to the tree it ran in, the GPU machine's work
    folder written $W, and a script `scripts/NAME.py` that became this package's module NAME
    written `-m experiments.NAME` (the same code, moved: a file recorded before the move still
    ties to its experiment). The tests compare commands so; bench/results/README.md shows them
    so."""
    args = shlex.split(command) if isinstance(command, str) else list(command)
    if args and re.fullmatch(r"python3?", args[0]):
        args = args[1:]
    moved = re.fullmatch(r"scripts/(\w+)\.py", args[0]) if args else None
    if moved and (HERE / f"{moved[1]}.py").is_file():
        args = ["-m", f"experiments.{moved[1]}", *args[1:]]
    return provenance.portable(args)
