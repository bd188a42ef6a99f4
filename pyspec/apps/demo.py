"""The terminal demo (`pyspec demo`, `build.py demo --cli`): champion-only against speculative
decoding on one prompt, side by side, timed so that the speedup it prints can be trusted.

One run a side proves nothing: the first run pays for caches and allocation, and the order of
the two sides favours one of them. So each side runs once unreported (the warm-up), then
`--runs` times (default 3), the sides alternating who goes first; each side's tokens/s is shown
as its median and [min, max], the speedup as the ratio of the medians with the range of the
runs' ratios, and always beside the speculative side's tokens per champion pass and its
acceptance, which say where the speedup comes from (or why there is none). The first timed run
of each side streams its text to stdout; the outputs of every run must be the champion's.

Not here: the bench over a workload (bench.py), printing one request's stats (generate.py).
"""

from __future__ import annotations

import statistics
import sys

from ..engine import Engine
from ..errors import UsageError, about
from ..load import backend, load_champion
from ..options import Options
from .generate import print_stats, stream_to_stdout, verdict_note

DEMO_MESSAGES = [{"role": "user", "content":
                  "Correct the grammar of this text and return only the corrected text:\n"
                  "the weather were nice yesterday, so me and my sister goes to the park. we "
                  "sees many dog playing near the lake and a old man feeding the ducks."}]
SIDES = ("champion only", "speculative")


def check_flags(args) -> Options:
    """The demo's own flags and the request's Options, checked before the model loads."""
    if args.runs < 1:
        raise UsageError(f"--runs must be at least 1, got {args.runs}")
    if args.warmup < 0:
        raise UsageError(f"--warmup must be 0 or more, got {args.warmup}")
    opts = Options(max_tokens=args.max_tokens)
    with about("max_tokens"):
        opts.check()
    return opts


def spread(values: list[float]) -> str:
    """`median [min, max]` of values."""
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def median_stats(runs: list[dict]) -> dict:
    """The stats of the run with the median tokens/s (the lower middle one of an even count)."""
    return sorted(runs, key=lambda s: s["tokens_per_s"])[(len(runs) - 1) // 2]


def timed_runs(engines: list[Engine], ids: list[int], opts: Options, runs: int,
               warmup: int) -> tuple[list[list[dict]], list[list[list[int]]]]:
    """Each side's stats and tokens for `runs` runs, after `warmup` unreported runs a side; the
    sides alternate who goes first. The first timed run of each side streams its text."""
    for _ in range(warmup):
        for engine in engines:
            engine.generate(ids, opts)
    stats: list[list[dict]] = [[], []]
    tokens: list[list[list[int]]] = [[], []]
    for rep in range(runs):
        order = (0, 1) if rep % 2 == 0 else (1, 0)
        for side in order:
            if not stats[side]:   # each side's first timed run: shown
                print(f"=== {SIDES[side]}{engine_note(engines[side])} ===", file=sys.stderr)
                report = stream_to_stdout(engines[side], ids, opts)
                print_stats(report["stats"])
                stats[side].append(report["stats"])
                tokens[side].append(report["tokens"])
            else:
                r = engines[side].generate(ids, opts)
                stats[side].append(r.stats)
                tokens[side].append(r.tokens)
        if runs > 1:
            print(f"[run {rep + 1}/{runs}: champion only {stats[0][-1]['tokens_per_s']:.2f} "
                  f"tok/s, speculative {stats[1][-1]['tokens_per_s']:.2f} tok/s]",
                  file=sys.stderr)
    return stats, tokens


def engine_note(engine: Engine) -> str:
    name = engine.draft_source.name if engine.draft_source else None
    return f", draft {name}" if name else ""


def summary(stats: list[list[dict]], same: bool) -> list[str]:
    """The closing lines: each side's tokens/s, the speedup with its tokens per pass and
    acceptance (the speculative side's median run), and whether the outputs agree."""
    base = [s["tokens_per_s"] for s in stats[0]]
    spec = [s["tokens_per_s"] for s in stats[1]]
    runs = len(base)
    ratios = [b / a for a, b in zip(base, spec)]
    med = median_stats(stats[1])
    out = [f"tokens/s, median [min, max] of {runs} run{'s' * (runs > 1)} a side after a "
           "warm-up:",
           f"  champion only  {spread(base)}",
           f"  speculative    {spread(spec)}"]
    speedup = statistics.median(spec) / statistics.median(base)
    out.append(f"speedup {speedup:.2f}x (runs: {min(ratios):.2f}x to {max(ratios):.2f}x) at "
               f"{med['tokens_per_pass']:.2f} tokens per champion pass, acceptance "
               f"{med['acceptance_rate']:.2f} ({med['accepted']}/{med['drafted']} drafts)")
    if med["drafted"] == 0:
        out.append("  (nothing was drafted: the break-even guard found that speculation does "
                   "not pay here, so both sides decoded alike)")
    out.append(f"identical output: {same}")
    return out


def cmd_demo(args) -> int:
    opts = check_flags(args)
    champion, tok = load_champion(args.champion)
    ids = tok.encode_chat(DEMO_MESSAGES)
    # Both engines first: a --draft it cannot run is refused before the champion-only half.
    engines = [Engine(backend(champion, "none"), tok), Engine(backend(champion, args.draft), tok)]
    print(f"prompt: {DEMO_MESSAGES[0]['content']}\n", file=sys.stderr)
    verdict_note(engines[1])
    if args.warmup:
        print(f"(warming up: {args.warmup} unreported run{'s' * (args.warmup > 1)} a side)",
              file=sys.stderr)
    stats, tokens = timed_runs(engines, ids, opts, args.runs, args.warmup)
    same = all(t == tokens[0][0] for side in tokens for t in side)
    print("", *summary(stats, same), sep="\n", file=sys.stderr)
    return 0 if same else 1
