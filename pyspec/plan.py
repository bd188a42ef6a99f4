"""Planning a request and each of its cycles, for the loop in engine.py: what drafts, by what rule,
and how many tokens.

`request` checks a request (options, prompt, resumed ids) and builds its state: the rule (verify
mode, sampling chain, the mask of a JSON schema or of its tools' calls), and its drafter: the
engine's, a member of its combination (drafters/combo.py), forced drafts around it under a
grammar, or its trees under --tree. `use` sets up a drafter's schedule and how its cycles go (ahead on the device, shadowed,
classified). `cycle` picks the next cycle's k within the budget and the context.

Not here: the loop and its steps that run the backend, emit text and recover (engine.py), the
request's state (request.py), the k policies and the guard (schedule.py), the drafters.
"""

from __future__ import annotations

import dataclasses

from . import schedule
from .chunks import Resume
from .cycle import Rule
from .drafters import NgramDrafter
from .drafters.forced import ForcedDrafter
from .drafters.tree import TreeDrafter, tree_drafter
from .errors import OptionsError, PromptTooLongError, about
from .options import Options
from .request import Request
from .rules import jsonmask, toolgrammar
from .text import toolcalls
from .text.stops import StopStrings


def request(engine, prompt: list[int], opts: Options, resume: Resume | None) -> Request:
    """The request checked (options, prompt, resumed ids), its rule, and its drafter: the
    engine's, a member of its combination, forced drafts around it under a schema, or its
    trees under --tree."""
    opts.check()
    mode = opts.resolved_verify()
    ctx = engine.kv.max_ctx
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise OptionsError("the prompt is empty; give at least one token")
    if len(prompt) >= ctx:
        most = engine.champion.config.context_length
        more = (f" (or raise the context length, up to the model's {most})" if ctx < most
                else f" ({most} positions is the model's whole context)")
        raise PromptTooLongError(
            f"the prompt has {len(prompt)} tokens but the context holds {ctx}; shorten it "
            f"so that at least one token can be generated{more}")
    vocab = engine.tokenizer.vocab_size
    done = _resumed(resume, prompt, ctx, vocab)
    policy = schedule.parse(opts.k)
    sampling = opts.sampling()
    sampling.check(vocab)
    rule = Rule(mode, opts.temperature, opts.seed, policy.conf_threshold,
                sampling.chain(vocab, len(prompt), opts.temperature))
    req = Request(prompt, opts, mode, rule, policy, ctx, done,
                  limit=len(prompt) + opts.max_tokens, eog=set(opts.stop_ids),
                  detok=engine.tokenizer.stream_decoder(), stops=StopStrings(opts.stop))
    if opts.stop_at_eos:
        req.eog |= set(engine.tokenizer.eog_ids)
    drafter = engine.drafter
    req.constraint = _constraint(engine, opts, len(prompt))
    if req.constraint is not None:
        # The mask is the first processor; forced tokens are drafted around the drafter's.
        req.rule = dataclasses.replace(rule, processors=(jsonmask.JsonMask(req.constraint),)
                                       + rule.processors)
        drafter = ForcedDrafter(_host_drafter(drafter), req.constraint)
    with about("tree"):     # its refusals are about the tree option (the CLI's --tree)
        drafter = tree_drafter(drafter, opts.tree, engine.backend, req.rule, req.constraint,
                               getattr(engine.draft_source, "kind", None))
    req.pipelined = req.constraint is None and engine.backend.pipelines(req.rule)
    # `--draft ngram+MODEL` (drafters/combo.py): the member to draft is chosen between cycles
    # with nothing in flight, and each member has its own guard (`scheds`). Not under a
    # schema, whose drafter wraps the active member for the whole request.
    req.combo = engine.draft_source if req.constraint is None and engine.backend.combo else None
    use(engine, req, req.combo.choose(prompt + done) if req.combo is not None else drafter)
    return req


def _constraint(engine, opts: Options, prompt_len: int):
    """The request's grammar: its JSON schema's, its tools' calls' (in the format the
    template writes: toolcalls.detect refuses one it cannot read), or None."""
    if opts.json_schema is not None:
        return jsonmask.constrain(engine.json_cache, engine.tokenizer, opts.json_schema,
                                  prompt_len)
    tools, choice = opts.check_tools()
    if not tools:
        return None
    fmt = toolcalls.detect(engine.tokenizer)
    return toolgrammar.constrain(engine.json_cache, engine.tokenizer, fmt, tools, choice,
                                 opts.parallel_tool_calls, prompt_len)


def use(engine, req: Request, drafter) -> None:
    """Draft the next cycles with `drafter`: its schedule and how its cycles go."""
    req.drafter, req.previews = drafter, []
    # Drafts looked up on the device (n-gram on a GPU): every cycle goes ahead, speculative
    # or not, so the schedule measures them all alike (no separate champion-only rate). Under
    # --tree its chains keep that path; only its tree cycles are read alone (engine._submit).
    req.in_cycle = (req.pipelined and drafter is not None
                    and engine.backend.drafts_ahead(req.rule, chain_of(drafter)))
    # A drafter that is free to ask (n-gram) is scored in shadow while speculation is off:
    # `previews` holds (position, what it would have drafted there) until the champion's
    # tokens decide how many of them a speculative cycle would have kept.
    shadowed = req.policy.guarded and hasattr(drafter, "preview")
    req.previewer = drafter if shadowed else None
    # A drafter that classifies its next proposal (n-gram: the match's length) has the
    # guard decide by that class's acceptance (schedule.py), where the host drafts.
    req.classify = None if req.in_cycle else getattr(drafter, "classify", None)
    name = drafter.name if drafter else "none"
    label = getattr(drafter, "kind", None) or name
    if label not in req.scheds:
        timing = engine.guard_timing.setdefault(
            (engine.adapter, name, "in_cycle" if req.in_cycle else req.pipelined), {})
        req.scheds[label] = schedule.Schedule(
            schedule.parse(req.opts.k) if req.scheds else req.policy,
            req.pipelined and not req.in_cycle, timing, shadowed, in_cycle=req.in_cycle,
            tree_nodes=drafter.nodes if isinstance(drafter, TreeDrafter) else None)
    req.sched = req.scheds[label]


def chain_of(drafter):
    """The drafter of a request's chains: under --tree the one its trees wrap."""
    return drafter.inner if isinstance(drafter, TreeDrafter) else drafter


def cycle(engine, req: Request) -> tuple[int, int | None]:
    """(k, the class of the proposal where the guard used one) for the next cycle. Never
    draft past the budget: k + 1 emitted tokens must fit in what remains, so a block never
    needs cutting at max_tokens; and never past the context."""
    n, tokens, cls = len(req.tokens), req.tokens, None
    if req.combo is not None and req.queued is None and req.decided is None:
        chosen = req.combo.choose(tokens)
        if chosen is not req.drafter:   # nothing in flight: switch members here
            use(engine, req, chosen)
    if req.queued is not None:
        k = 0
    elif req.decided is not None:
        k, req.decided = req.decided, None
    else:
        if req.classify is not None and req.drafter:
            cls = req.classify(tokens)
        k = min(req.sched.next_k(cls) if req.drafter else 0, req.remaining - 1, req.ctx - n)
    if req.constraint is not None and type(req.sched.policy) is not schedule.Policy:
        # Forced tokens cost no drafting and are always accepted: the break-even guard's k
        # (0 where verify rows cost, as on the CPU) must not leave them out. A fixed:K
        # policy runs what it asks (fixed:0 is constrained champion-only).
        ahead = req.constraint.forced_ahead(tokens[len(req.prompt):], engine.backend.k_max)
        k = max(k, min(ahead, req.remaining - 1, req.ctx - n))
    return k, cls


def _resumed(resume: Resume | None, prompt: list[int], ctx: int, vocab: int) -> list[int]:
    """A Resume's ids, checked: token ids of this vocabulary that fit the context after the
    prompt (the loop may commit up to ctx + 1 tokens: the cache lags by one row)."""
    if resume is None:
        return []
    ids = resume.ids
    if not isinstance(ids, (list, tuple)) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids):
        raise OptionsError(f"resume ids must be a list of token ids in [0, {vocab}); send "
                           "back the ids the interrupted run's chunks carried")
    if len(prompt) + len(ids) > ctx + 1:
        raise PromptTooLongError(f"the prompt ({len(prompt)} tokens) and the resumed ids "
                                 f"({len(ids)}) do not fit the context of {ctx}")
    return [int(t) for t in ids]


def _host_drafter(d):
    """The drafter a schema request wraps (its masks are host data, so drafts come from the
    host): a host drafter as it is; for a draft on the GPU, n-gram lookup (reading its tokens
    back in a submission of their own measured slower: bench/results/README.md)."""
    return d if d is None or hasattr(d, "propose") else NgramDrafter()
