"""The page's gate (docs/gate.md): "measure on this device" in the browser worker.

A sample of the public workload (shipped with the site; web/worker.js hands its text here, or
an embedder's own JSONL) runs through bench's side-by-side loop (bench.side_runs: after an
unreported warm-up of every side, champion-only and each drafter back to back, prompt by prompt,
who goes first alternating, greedy, the break-even guard on), each run awaited here instead of
run synchronously (the progress counts the warm-up's runs too). The rows are judged
by gate.py's own code (judge_rows: the same measurements, THRESHOLDS and RULE_VERSION as
`python -m pyspec gate`), and the verdicts are merged into the page's table (OPFS
verdicts.json's text, which the worker reads before and writes back after). A run cancelled
midway returns None: no verdict, and the table is not written.

Every engine here shares the session's champion (make_engine lends its GPU model, or its CPU
model after a fallback) and is closed after the run. Not here: the statistics and the rule
(gate.py, benchstats.py), OPFS and messages (web/worker.js), the session (session.py).
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

from .. import receipts, verdicts
from ..drafters import parse_draft
from ..errors import PromptTooLongError
from . import gate
from .bench import side_runs
from .benchstats import prompt_lines
from .page_engine import make_engine
from .wire import SessionError, check_fields
from .workload import check_messages, first_per_stratum, parse_workload

# The page's default sample (stated in the demo and docs/gate.md): one prompt of each of the
# public workload's 11 strata, at most 32 new tokens each: 11 prompts, the least the rule's
# `prompts` threshold (8) can judge with room for a prompt skipped as too long.
SAMPLE = {"per_stratum": 1, "max_tokens": 32}
MEASURE_FIELDS = {"drafts": list, "per_stratum": int, "max_tokens": int, "source": str}
PAGE_DRAFTS = ("ngram", "model", "ngram+model")   # and self:L


def read_options(options_json: str, has_model: bool) -> SimpleNamespace:
    """The measure request's options checked (SessionError bad_config naming the bad one):
    drafts (default: those the page's "auto" chooses among: ngram, and the loaded draft model),
    per_stratum and max_tokens (default SAMPLE; 0: all prompts, no cap), source (the sample's
    name in errors and in the result)."""
    opts = check_fields(options_json, "measure options", MEASURE_FIELDS)
    drafts = opts.get("drafts") or (["ngram", "model"] if has_model else ["ngram"])
    for d in drafts:
        if not isinstance(d, str) or not (d in PAGE_DRAFTS or d.startswith("self:")):
            raise SessionError("bad_config", f"measure: drafter {d!r} is not one the page can "
                               f"measure: use {', '.join(PAGE_DRAFTS)} or self:L (champion-only "
                               "is the side each is measured against)")
        if "model" in d and not has_model:
            raise SessionError("bad_config", f"measure: drafter {d!r} needs a draft model: "
                               "load one at init (create's draft option)")
    if len(set(drafts)) != len(drafts):
        raise SessionError("bad_config", f"measure: drafters {drafts} name one twice")
    sample = {}
    for name in SAMPLE:
        value = opts.get(name, SAMPLE[name])
        if value is None:
            value = SAMPLE[name]
        if value < 0:
            raise SessionError("bad_config", f"measure: {name} must be >= 0 (0: no limit), "
                               f"got {value}")
        sample[name] = value or None
    return SimpleNamespace(drafts=drafts, **sample, source=opts.get("source") or "the sample",
                           repeat=1, warmup=1, k="heuristic", temperature=0.0, seed=0,
                           verify=None)


def identity(session, drafter: str) -> str:
    """A page drafter's name in a verdict, as gate.identity names it natively: the draft
    model's sha256 (a bridged one's own), "ngram+" before it for the combination, else the
    kind ("ngram", "self:20")."""
    spec = parse_draft(drafter, session.config.n_layers)
    if "model" not in drafter:
        return f"self:{spec.layers}" if spec.kind == "self" else spec.kind
    return ("ngram+" if drafter.startswith("ngram+") else "") + session.draft_model.sha256()


async def measure(session, options_json: str, workload_text: str, table_json: str | None,
                  on_progress, should_stop) -> dict | None:
    """Run the sample side by side and judge it. Returns {"result": gate's JSON (with "text":
    the table as the CLI prints it), "verdicts": the new ones, "table": the page's table with
    them merged in}, or None when `should_stop()` said so midway (nothing is recorded).
    `on_progress(done, total, label)` after each run."""
    if session.engine is None:
        raise SessionError("not_ready", "no model is loaded: send init first")
    args = read_options(options_json, session.draft_model is not None)
    items = first_per_stratum(parse_workload(workload_text, args.source), args.per_stratum)
    prompts = check_messages(items, session.tokenizer, args.source)
    # A table that does not parse is replaced by the new verdicts (the result says so).
    try:
        table = verdicts.parse(json.loads(table_json), "verdicts.json") if table_json else []
        replaced = None
    except (ValueError, verdicts.VerdictStoreError) as e:
        table, replaced = [], str(e)
    engines = {}
    try:
        for d in ["none", *args.drafts]:
            engines[d] = await make_engine(session.file, session.tokenizer, d, session.max_ctx,
                                           session.engine, session.backend,
                                           session.open_device, given=session.draft_model)
        t0 = time.time()
        ran = await run_sides(args, items, prompts, engines, on_progress, should_stop)
    finally:
        for engine in engines.values():
            engine.close()
    if ran is None:
        return None
    rows, skipped = ran
    base = engines["none"]
    names = {d: identity(session, d) for d in args.drafts}
    drafters, found = gate.judge_rows(rows, names, base.champion.sha256(), base.device_class)
    result = {"schema": gate.SCHEMA, "backend": "page", "adapter": base.adapter,
              "device_class": base.device_class, "workload": args.source,
              "per_stratum": args.per_stratum, "max_tokens_cap": args.max_tokens,
              "k_policy": args.k, "repeat": 1, "thresholds": gate.THRESHOLDS,
              "rule_version": gate.RULE_VERSION, "memory_budget_bytes": None,
              "interval": gate.INTERVAL, "drafters": drafters, "prompts": prompt_lines(rows),
              "skipped": skipped, "wall_s": time.time() - t0, "replaced_table": replaced}
    result["text"] = gate.format_verdicts(result)
    return {"result": result, "verdicts": found,
            "table": {"schema": verdicts.SCHEMA, "verdicts": verdicts.merge(table, found)}}


def engine_class(facts: dict, kind: str) -> str:
    """The device class the page's engine will have (make_engine's choice), from what the
    worker knows before it loads: the numpy engine on the CPU and, unless backend "webgpu"
    asks for it, behind a software adapter; else the adapter's (verdicts.device_class)."""
    if kind == "cpu" or (kind == "software" and facts.get("backend") != "webgpu"):
        return "cpu-numpy"
    webgpu = facts.get("webgpu") or {}
    return verdicts.device_class(receipts.adapter_class(webgpu.get("vendor"), kind == "software"),
                                 webgpu.get("architecture"))


def draft_download(facts: dict, kind: str, model: bool, reason: str) -> tuple[bool, str]:
    """Whether "auto" fetches the site's draft model: by a recorded verdict for this champion,
    that draft and the engine's class (verdicts.choose, which Session.load applies again to
    what was loaded), else by today's rule (`model`, `reason`). facts: Session.auto_draft's,
    with "verdicts" (OPFS verdicts.json's text), "champion_sha256" and "draft_sha256"."""
    text, champion, draft = (facts.get(k) for k in ("verdicts", "champion_sha256",
                                                      "draft_sha256"))
    if not (text and champion and draft):
        return model, reason
    try:
        table = verdicts.parse(json.loads(text), "verdicts.json")
    except ValueError:      # (VerdictStoreError too) Session.load names it
        return model, reason
    choice = verdicts.choose(table, champion, engine_class(facts, kind),
                             verdicts.weightless(table) | {draft: "model"},
                             "model" if model else "ngram")
    if choice is None:
        return model, reason
    v = choice.verdict
    return choice.drafter == "model", (f"a verdict measured on this device ({v['verdict']}, "
                                       f"{v['date']}) chose {choice.drafter}")


async def run_sides(args, items, prompts, engines, on_progress, should_stop):
    """bench.side_runs with each run awaited (Engine.complete) and `should_stop()` asked before
    and during each: (rows, skipped), or None when it stopped."""
    names = {id(e): d for d, e in engines.items()}
    # side_runs' unreported warm-up first (every side once on the first prompt), then each
    # prompt's runs
    warm = args.warmup * len(engines) if items else 0
    per_prompt = len(engines) * args.repeat
    total, done = warm + len(items) * per_prompt, 0
    loop = side_runs(args, items, prompts, engines, args.drafts)
    try:
        job = next(loop)
        while True:
            if should_stop():
                return None
            what = "warm-up" if done < warm else items[(done - warm) // per_prompt]["id"]
            on_progress(done, total, f"{what} {names[id(job[0])]}")
            try:
                result = await job[0].complete(job[1], job[2], should_stop=should_stop)
            except PromptTooLongError as e:
                # a too-long first prompt ends the warm-up; any prompt's other runs go with it
                done = warm if done < warm else \
                    warm + ((done - warm) // per_prompt + 1) * per_prompt
                job = loop.throw(e)
                continue
            if should_stop():
                return None
            done += 1
            job = loop.send(result)
    except StopIteration as finished:
        on_progress(total, total, "")
        rows, skipped, _ = finished.value
        return rows, skipped
    finally:
        loop.close()
