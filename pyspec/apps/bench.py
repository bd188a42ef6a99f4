"""`python -m pyspec bench`: speculative vs champion-only, side by side in one run, per stratum.

For every prompt of the workload the champion-only baseline and each drafter run back to back on
the same engine, so machine drift hits both sides alike. Per stratum (and overall) it reports the
median and range of: accepted tokens per champion pass, acceptance by position, time to first
token, champion and draft calls, peak bytes (weights, KV, scratch) and the wall-clock speedup
of decoding (tokens/s after prefill, speculative over champion-only, prompt by prompt; the
prefill is the same pass on both sides and shows in time to first token). It also records whether each
output was identical to the baseline: greedy by default; with `--temperature T` both sides sample
with the same seeds, and under replay (the default above 0) the bytes must still agree, while
under `--verify rejection` only the distribution does, so identity is not counted (null). Writes
`<out>/bench-<backend>.json` and a PNG plot. Timing targets belong here, never in tests.

On a GPU (`--backend wgpu`) A/B rows come with it: champion-only read cycle by cycle next to
the pipelined run (`pipelining`); when n-gram is among the drafters, `ngram@host`: n-gram
drafts from the host, each cycle read before the next is encoded, next to the device lookup
whose cycles go ahead (gpu/backend.py); and for each draft model D, `D@host`: its cycles fed
from the host, each read before the next, next to those fed on the device (gpu/ahead.py).

Every result records where it came from and each output's token hash (provenance.py). Not here:
the workload's format (workload.py), the statistics, table and plot (benchstats.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time

from .. import champion_path, gctime
from ..drafters import parse_draft
from ..engine import Engine
from ..errors import PromptTooLongError, PyspecError, UsageError
from ..load import backend, load_champion
from ..options import Options
from .benchstats import (compare, drafter_tables, identity_over_repeats, per_cycle,
                         pipelining_table, plot, print_table, prompt_lines, spread)
from .provenance import check_tree, record, write
from .workload import check_messages, first_per_stratum, read_workload


def check_options(args) -> None:
    """bench's numeric options and --out, before a model loads or a prompt runs."""
    # 0: no cap, every prompt (as in build.py bench, the page's)
    zero = {"max_tokens": " (0: no cap)", "per_stratum": " (0: all)"}
    for name in zero:
        if getattr(args, name) == 0:
            setattr(args, name, None)
    for name in ("max_tokens", "per_stratum", "ctx", "repeat"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1{zero.get(name, '')}, "
                             f"got {value}")
    check_sampling(args)
    check_tree(getattr(args, "allow_dirty", None))   # refused before a model loads
    if not [d for d in args.drafts.split(",") if d]:
        raise UsageError("--drafts names no drafter: give a comma-separated list, e.g. ngram")
    if "" in args.drafts.split(","):
        raise UsageError(f"--drafts {args.drafts!r} has an empty entry: give drafters between "
                         "the commas, e.g. ngram,self:20")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UsageError(f"--out {args.out} is a file: bench writes a JSON and a plot into a "
                         "folder; name a folder")
    # Why: the results are written after the whole run; a folder that cannot be made or written
    # is found now, by making it and writing a file into it, then left as it was (a refused
    # run writes nothing).
    import tempfile
    made, head = [], os.path.abspath(args.out)   # the folders makedirs would make, deepest first
    while not os.path.lexists(head) and os.path.dirname(head) != head:
        made.append(head)
        head = os.path.dirname(head)
    try:
        os.makedirs(args.out, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=args.out, prefix=".bench-probe-")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise UsageError(f"--out {args.out}: bench cannot write there ({e.strerror or e}); "
                         "name a folder you can write") from None
    finally:
        for folder in made:
            try:
                os.rmdir(folder)
            except OSError:
                break


def add_sampling_options(p) -> None:
    """--temperature, --seed and --verify, for this bench and the page's (webtools/bench.py)."""
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sample at this temperature on every side (default 0: greedy)")
    p.add_argument("--seed", type=int, default=0, help="the seed of every prompt's run")
    p.add_argument("--verify", choices=["replay", "rejection"], default=None,
                   help="above temperature 0: replay (default; outputs checked for identity) or "
                        "rejection (the champion's distribution; identity not counted)")


def sampling(args, max_tokens: int) -> Options:
    """The options of one side's run: greedy by default, or --temperature with --seed (each
    prompt's seed is the same on every side, so replay can be checked for identity)."""
    return Options(max_tokens=max_tokens, temperature=getattr(args, "temperature", 0.0),
                   seed=getattr(args, "seed", 0), verify=getattr(args, "verify", None))


def check_sampling(args) -> None:
    """UsageError for a --temperature, --seed or --verify that Options refuses."""
    try:
        sampling(args, 1).check()
    except PyspecError as e:
        raise UsageError(f"{e} (--temperature, --seed, --verify)") from e


def exact_outputs(args) -> bool:
    """Whether each drafter's output must equal champion-only's token for token."""
    return sampling(args, 1).resolved_verify() != "rejection"


HOST_LOOKUP = "ngram@host"   # the bench's name for n-gram drafting with the device lookup off
HOST_FEED = "@host"          # after a draft model's name: its cycles fed from the host


def median_run(runs: list):
    """The run with the median tokens/s (the lower middle one of an even count)."""
    return sorted(runs, key=lambda r: r.stats["tokens_per_s"])[(len(runs) - 1) // 2]


def run_bench(args) -> int:
    check_options(args)
    items = first_per_stratum(read_workload(args.workload), args.per_stratum)
    drafts = [d for d in args.drafts.split(",") if d]
    champion, tok = load_champion(args.champion, args.backend, args.ctx)
    prompts = check_messages(items, tok, args.workload)
    engines = make_engines(args, champion, tok, drafts)   # appends the A/B sides to drafts
    gctime.settle()   # as the page after its load: the models out of the collector's walks
    # Where it came from, taken before the run: the tree as it was when the code loaded.
    origin = record(champion=args.champion or champion_path(), workload=args.workload,
                    drafts={d: draft_file(d) for d in drafts}, adapter=engines["none"].adapter,
                    backend=args.backend, allow_dirty=getattr(args, "allow_dirty", None))
    gpu = None
    # On a GPU, champion-only read cycle by cycle too: the A/B of pipelining.
    serial = None
    if args.backend == "wgpu":
        serial = Engine(backend(champion, "none", args.ctx, pipelined=False), tok)
        from ..gpu.measure import measure
        print("measuring pass costs by rows ...", file=sys.stderr, flush=True)
        gpu = measure(champion)
        readbacks_before = champion.dev.readbacks
    t0 = time.time()
    rows, skipped, pipelining = run_sides(args, items, prompts, engines, drafts, serial)
    strata = sorted({r["stratum"] for rs in rows.values() for r in rs})
    prefill = prefill_tok_s(engines["none"], champion.config.vocab_size)
    if gpu is not None:
        shortest = min(items, key=lambda it: len(json.dumps(it["messages"])))
        gpu["cycle_s"] = cycle_seconds(engines["none"], tok.encode_chat(shortest["messages"]))
        gpu |= per_cycle([r["stats"]["backend_timing"] for rs in rows.values() for r in rs])
        # every device readback in the run, prefill syncs and the measurements above included
        gpu["device_readbacks_total"] = champion.dev.readbacks - readbacks_before
    result = {
        "backend": args.backend,
        "adapter": engines["none"].adapter,
        "provenance": origin,
        "workload": os.path.basename(args.workload),
        **headline(rows, gpu, champion, prefill),
        "k_policy": args.k,
        "tree": getattr(args, "tree", None),
        "temperature": args.temperature,
        "verify": sampling(args, 1).resolved_verify(),
        "seed": args.seed,
        "repeat": max(1, args.repeat),
        "warmup": getattr(args, "warmup", 1),
        "per_stratum": args.per_stratum,
        "max_tokens_cap": args.max_tokens,
        "drafters": drafter_tables(rows, strata),
        **({"pipelining": pipelining_table(pipelining)} if pipelining else {}),
        "prompts": prompt_lines(rows),
        "skipped": skipped,
        "wall_s": time.time() - t0,
    }
    if gpu is not None:
        result |= {
            "hardware": champion.dev.name,
            "verify_cost_ratio": gpu["verify_cost_ratio"],
            "speedup": {d: {s: result["drafters"][d]["strata"][s]["speedup"]["median"]
                            for s in strata} | {"overall": result["drafters"][d]["overall"]
                                                ["speedup"]["median"]} for d in drafts},
            "gpu": gpu,
        }
    write_result(result, strata, args)
    return 0


def make_engines(args, champion, tok, drafts: list[str]) -> dict[str, Engine]:
    """Champion-only and each drafter's engine; on a GPU also the benchmark's A/B sides (n-gram
    from the host, a draft model fed from the host), whose names are appended to `drafts`."""
    # A draft model's cycles fed on the device (gpu/ahead.py; on by default on a GPU, off on a
    # software adapter): on here either way, against them fed from the host (below).
    ahead = {"draft_ahead": True} if args.backend == "wgpu" else {}
    engines = {d: Engine(backend(champion, d, args.ctx, **ahead), tok)
               for d in ["none", *drafts]}
    if args.backend == "wgpu" and "ngram" in drafts:
        # The A/B of pipelined speculative cycles: n-gram drafts from the host, each cycle read
        # before the next is submitted (gpu/backend.py), next to the device lookup's.
        engines[HOST_LOOKUP] = Engine(backend(champion, "ngram", args.ctx, device_ngram=False),
                                      tok)
        drafts.append(HOST_LOOKUP)
    if args.backend == "wgpu":
        # The A/B of a draft model's cycles fed on the device and fed from the host.
        for d in [d for d in drafts if d != HOST_LOOKUP and parse_draft(d).kind == "model"]:
            engines[d + HOST_FEED] = Engine(backend(champion, d, args.ctx, draft_ahead=False),
                                            tok)
            drafts.append(d + HOST_FEED)
    return engines


def write_result(result: dict, strata: list[str], args) -> None:
    """bench-BACKEND.json and .png in --out, and the table on stdout."""
    os.makedirs(args.out, exist_ok=True)
    path = write(os.path.join(args.out, f"bench-{args.backend}.json"), result)
    plot(result, strata, os.path.join(args.out, f"bench-{args.backend}.png"))
    print_table(result, strata)
    if "pipelining" in result:
        p = result["pipelining"]
        ratio = p["ratio"]
        print(f"\nchampion-only pipelined {p['champion_tok_s']['median']:.1f} tok/s vs read "
              f"cycle by cycle {p['champion_tok_s_serial']['median']:.1f}: "
              f"x{ratio['median']:.2f} [{ratio['min']:.2f}, {ratio['max']:.2f}], identical "
              f"{p['identical']}/{p['prompts']}")
    print(f"wrote {path}", file=sys.stderr)


def run_sides(args, items: list[dict], prompts: list[list[int]], engines: dict[str, Engine],
              drafts: list[str], serial: Engine | None = None) -> tuple[dict, list, list]:
    """side_runs, each run by Engine.generate (bench and gate natively)."""
    loop = side_runs(args, items, prompts, engines, drafts, serial)
    try:
        job = next(loop)
        while True:
            try:
                result = job[0].generate(job[1], job[2])
            except PromptTooLongError as e:
                job = loop.throw(e)
            else:
                job = loop.send(result)
    except StopIteration as done:
        return done.value


def side_runs(args, items: list[dict], prompts: list[list[int]], engines: dict[str, Engine],
              drafts: list[str], serial: Engine | None = None):
    """The side-by-side loop: each prompt on champion-only (`engines["none"]`), on `serial`
    where given, and on each drafter, back to back, who runs first alternating; with
    --repeat, each side's median run. A generator, so that the loop is written once for a
    caller that runs each request synchronously (run_sides) and one that awaits it (the page's
    gate, apps/page_gate.py): it yields (engine, prompt ids, Options) for every run and is sent
    its Result (or thrown its PromptTooLongError). Returns (drafter -> one `compare` row per
    prompt, the prompts skipped as too long, the pipelining A/B rows)."""
    exact = exact_outputs(args)
    rows: dict[str, list[dict]] = {d: [] for d in drafts}
    skipped: list[dict] = []
    pipelining: list[dict] = []
    # Warm-up, unreported: every side once on the first prompt (pipeline compiles, first
    # readbacks, caches), so that no prompt is timed cold.
    for _ in range(getattr(args, "warmup", 1) if prompts else 0):
        for d in ["none", "serial", *drafts] if serial is not None else ["none", *drafts]:
            options = sampling(args, 16)
            options.k = "fixed:0" if d in ("none", "serial") else args.k
            options.tree = None if d in ("none", "serial") else getattr(args, "tree", None)
            try:
                yield (serial if d == "serial" else engines[d]), prompts[0], options
            except PromptTooLongError:
                break
    t0 = time.time()
    for n, (it, ids) in enumerate(zip(items, prompts), 1):
        max_tokens = it.get("max_tokens", Options.max_tokens)
        if args.max_tokens:
            max_tokens = min(max_tokens, args.max_tokens)
        # Alternate who runs first, so that drift or a warm cache favours neither side. With
        # --repeat, each side's median run (by tokens/s) stands for it.
        names = ["none", "serial", *drafts] if serial is not None else ["none", *drafts]
        tries: dict[str, list] = {d: [] for d in names}
        try:
            for rep in range(max(1, args.repeat)):
                for d in names if (n + rep) % 2 else names[::-1]:
                    engine = serial if d == "serial" else engines[d]
                    options = sampling(args, max_tokens)
                    options.k = "fixed:0" if d in ("none", "serial") else args.k
                    options.tree = None if d in ("none", "serial") else getattr(args, "tree", None)
                    tries[d].append((yield engine, ids, options))
            runs = {d: median_run(rs) for d, rs in tries.items()}
        except PromptTooLongError as e:
            skipped.append({"id": it["id"], "reason": str(e)})
            print(f"[{n}/{len(items)}] {it['id']}: skipped ({e})", file=sys.stderr)
            continue
        base = runs["none"]
        line = [f"[{n}/{len(items)}] {it['id']:<16} base {base.stats['tokens_per_s']:.2f} tok/s"]
        if serial is not None:
            one = runs["serial"]
            pipelining.append({"id": it["id"], "stratum": it.get("stratum", "all"),
                               "identical": one.tokens == base.tokens,
                               "pipelined_tok_s": base.stats["tokens_per_s"],
                               "serial_tok_s": one.stats["tokens_per_s"]})
            line.append(f"serial {one.stats['tokens_per_s']:.2f} tok/s")
        for d in drafts:
            row = compare(it, runs[d].stats, runs[d].tokens, base.stats, base.tokens, exact)
            if exact:
                identity_over_repeats(row, [t.tokens for t in tries[d] + tries["none"]],
                                      base.tokens)
            rows[d].append(row)
            line.append(f"{d} x{row['speedup']:.2f} ({row['stats']['tokens_per_pass']:.2f} tok/pass)")
        print(" | ".join(line), f"[{time.time() - t0:.0f}s]", file=sys.stderr, flush=True)
    return rows, skipped, pipelining


def draft_file(drafter: str) -> str | None:
    """The draft model file a bench drafter names (its @host A/B twin: the same file), or None."""
    spec = parse_draft(drafter.removesuffix(HOST_FEED))
    return spec.path if spec.kind in ("model", "combo") else None


def prefill_tok_s(engine: Engine, vocab: int, n: int = 1000) -> float | None:
    """Prompt tokens per second of the champion's prefill on an n-token prompt (the engine's
    own prefill, timed as its stats time it), or None when n does not fit the context."""
    if n >= engine.backend.kv.max_ctx:
        return None
    ids = [(31 * i + 7) % vocab for i in range(n)]
    r = engine.generate(ids, Options(max_tokens=1, k="fixed:0", stop_at_eos=False))
    return (n - 1) / r.stats["prefill_s"]


def recorded_request(engine, prompt: list[int], options: Options) -> tuple:
    """(result, the flattened commands of each of the request's submissions, in order)."""
    from ..gpu.device import flatten
    dev, kept = engine.backend.dev, []
    submit = dev.submit

    def recording(commands):
        kept.append(list(flatten(commands)))
        submit(commands)
    dev.submit = recording
    try:
        result = engine.generate(prompt, options)
    finally:
        dev.submit = submit
    return result, kept


def last_cycle(engine, prompt: list[int], max_tokens: int = 4) -> list:
    """The commands of the last cycle of a champion-only request (its forward, the argmax,
    accept, the token copy and the readback copy), flattened: what the GPU timings replay."""
    options = Options(max_tokens=max_tokens, k="fixed:0", stop_at_eos=False)
    return recorded_request(engine, prompt, options)[1][-1]


def cycle_seconds(engine, prompt: list[int], n: int = 50) -> float:
    """GPU seconds per champion-only cycle: `last_cycle` submitted n times back to back, then one
    readback: wall / n, the host's encoding running while the GPU works. The denominator of
    wall over GPU time per cycle."""
    dev, commands = engine.backend.dev, last_cycle(engine, prompt)
    probe = engine.backend.champion.logits

    async def run():
        times = []
        for _ in range(3):
            await dev.read(probe, 4)
            t0 = time.perf_counter()
            for _ in range(n):
                dev.submit(commands)
            await dev.read(probe, 4)
            times.append((time.perf_counter() - t0) / n)
        return statistics.median(times)
    return asyncio.run(run())


def headline(rows: dict[str, list[dict]], gpu: dict | None, champion,
             prefill: float | None) -> dict:
    """The fields every bench JSON leads with: champion-only tokens/s (median over prompts, and
    on the `long` stratum), prefill tokens/s, time to first token; on a GPU also dispatches per
    pass, GPU ms per pass at 1 and 8 rows (timestamps around the whole pass, where the adapter
    has them), GPU ms per champion-only cycle (cycle_seconds), host seconds per cycle and
    wall over GPU time per champion-only cycle."""
    base = next(iter(rows.values()), [])
    long = [r["baseline_tokens_per_s"] for r in base if r["stratum"] == "long"]
    out = {"champion_tok_s": spread([r["baseline_tokens_per_s"] for r in base])["median"],
           "champion_tok_s_long": statistics.median(long) if long else None,
           "prefill_tok_s": prefill,
           "ttft_s": spread([r["baseline_ttft_s"] for r in base])["median"]}
    if gpu is None:
        return out
    from ..gpu.step import SLOT_CHAMPION

    # The whole pass as one compute pass (timestamps at its ends); the per-dispatch profile's
    # sum counts a pass's overhead per dispatch, so it is the fallback only.
    profile = gpu.get("kernel_profile", {})
    whole = gpu.get("gpu_pass_s", {})
    gpu_ms = {m: (whole[m] if m in whole else profile[m]["gpu_s_total"]) * 1e3
              for m in ("1", "8") if m in whole or m in profile}
    pass_s = [r["baseline_pass_s"] for r in base]
    # A champion-only cycle's wall time (pipelined, per prompt) over its GPU time (the same
    # cycle back to back, cycle_seconds); without that, over a one-row pass's.
    cycle = gpu.get("cycle_s") or (gpu_ms["1"] / 1e3 if "1" in gpu_ms else None)
    out |= {"dispatches_per_pass": len(champion.forward_dispatches(SLOT_CHAMPION)),
            "gpu_ms_per_pass": gpu_ms,
            "wall_ms_per_pass": {m: gpu["pass_s"][m] * 1e3 for m in ("1", "8")
                                 if m in gpu["pass_s"]},
            "host_s_per_cycle": gpu["host_s_per_cycle"],
            "host_s_cycle": gpu["host_s_cycle"],
            "host_s_cycle_alone": gpu["host_s_cycle_alone"],
            "readbacks_per_cycle": gpu["readbacks_per_cycle"],
            "readback_bytes_per_cycle": gpu["readback_bytes_per_cycle"],
            "gpu_ms_per_cycle": gpu["cycle_s"] * 1e3 if "cycle_s" in gpu else None,
            "wall_over_gpu": (statistics.median(pass_s) / cycle if pass_s and cycle else None)}
    return out


