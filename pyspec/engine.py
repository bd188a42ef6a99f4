"""The generation loop: prefill, then cycles (cycle.py) until a stop rule says so; stream the text.

Each cycle the schedule picks k (0 = plain champion decoding), the backend runs the speculative
cycle written once in cycle.py (draft, one champion pass over k + 1 rows, accept, commit), and
the engine appends the emitted tokens, applies the stop rules (end of generation, max_tokens,
context, cancel) and streams text. Text is emitted only for committed tokens, through an
incremental detokenizer, so a stream can never show a token twice or a broken UTF-8 character.

Randomness is keyed by the absolute position of the token being chosen (rng.py), so replay mode is
byte-identical to champion-only sampling for the same seed whatever the drafter and k.
Not here: the cycle (cycle.py), the backends that run it (cpu.py, gpu/backend.py) and building
them (load.py), the rules (verify.py), k policies (schedule.py), the drafters.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

from . import cycle, receipts, schedule
from .cpu.model import ModelError
from .cycle import Executor, Rule
from .drafters import NgramDrafter
from .drafters.forced import ForcedDrafter
from .errors import OptionsError, PromptTooLongError, PyspecError
from .kv import rows_kept
from .options import Options
from .rules import jsonmask
from .text.stops import StopStrings


class RecoveryLimitError(PyspecError, RuntimeError):
    """The GPU failed more often in one request than the engine recovers from (MAX_RECOVERIES);
    the text committed before the last fault stays shown."""

    code = "gpu_unrecoverable"


# Error codes of the faults `recover` handles (gpu/device.py's GPUError family), and how many of
# them one request recovers from: one more ends it with RecoveryLimitError. A device lost again
# and again (a driver that keeps resetting) is not worth more than two new devices.
RECOVERABLE = ("gpu_error", "device_lost", "gpu_timeout")
MAX_RECOVERIES = 2


@dataclass
class Chunk:
    """Text newly shown, and the tokens committed since the last chunk. With stop strings, the
    ids may include tokens whose text is (partly) held back (stops.py): the held tail is a
    function of the text, so a Resume from the ids recomputes it and shows it when decided."""
    offset: int          # character offset of `text` in the whole output
    text: str
    n_tokens: int        # tokens committed since the last chunk: len(ids)
    ids: list[int] = field(default_factory=list)   # their ids, what a Resume goes on from
    cycle: int = 0       # cycles this request has run so far (fault drills strike by it)
    kinds: list[str] = field(default_factory=list)  # each id's TOKEN_KINDS entry
    starts: list[int] = field(default_factory=list) # each id's character offset in the output
                                                    # (where its text begins; never in receipts)


# What each emitted token was, for pages that show speculation at work: "champion" a plain decode
# step (k = 0), "accepted" a draft the champion accepted, "corrected" the champion's own token at
# the first rejected draft, "bonus" its token after a block accepted whole, "forced" the one token
# a JSON schema allowed (drafted for free). A forced token is also an accepted draft; forced wins.
TOKEN_KINDS = ("champion", "accepted", "corrected", "bonus", "forced")


def token_kind(i: int, n_accepted: int, k: int) -> str:
    """The kind of token i of a cycle's verdict (n_accepted drafts of k, then one champion token)."""
    if i < n_accepted:
        return "accepted"
    return "champion" if k == 0 else "bonus" if n_accepted == k else "corrected"


def _forced(constraint, generated: list[int], j: int) -> bool:
    """Did the schema allow exactly one token at generated[j]?"""
    constraint.state_after(generated)
    state = constraint.states[j]
    return (state is not None and state is not constraint.done
            and constraint.masker.mask(state).forced is not None)


def _score_previews(previews: list[tuple[int, list[int], int | None]], tokens: list[int],
                    sched: schedule.Schedule) -> list[tuple[int, list[int], int | None]]:
    """Score each preview (position, drafts, class) whose fate the committed tokens now decide (a
    disagreement, or all of its drafts reached) with the schedule; return the rest."""
    waiting = []
    for at, draft, cls in previews:
        seen = tokens[at:at + len(draft)]
        agree = 0
        while agree < len(seen) and seen[agree] == draft[agree]:
            agree += 1
        if agree < len(seen) or len(seen) == len(draft):
            sched.shadow(len(draft), agree, cls)
        else:
            waiting.append((at, draft, cls))
    return waiting


@dataclass
class Resume:
    """Where an interrupted run of the same request got to (DESIGN §8): `ids`, the token ids its
    chunks carried (all it committed, in order), and `fault`, what interrupted it, for the
    receipt: {"kind": a code, "cycle": int, "restart_s": seconds from the fault until this
    request began}. The request goes on from prompt + ids; the ids count toward max_tokens."""
    ids: list[int]
    fault: dict | None = None


@dataclass
class Result:
    text: str
    tokens: list[int]
    finish_reason: str   # "stop" (end of generation token), "length" (max_tokens), "context",
                         # "cancelled" (should_stop said so between cycles)
    stats: dict
    receipt: dict


@dataclass
class _Stats:
    champion_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_by_position: list = field(default_factory=lambda: [0] * schedule.K_MAX)
    accepted_by_position: list = field(default_factory=lambda: [0] * schedule.K_MAX)
    t_draft: float = 0.0
    t_verify: float = 0.0
    scratch: int = 0      # peak activation bytes of a pass
    draft_calls_before: int = 0   # the drafter's lifetime call count when this request began

    def record(self, k: int, n_accepted: int, t_draft: float, t_verify: float) -> None:
        self.champion_passes += 1
        self.t_draft += t_draft
        self.t_verify += t_verify
        self.drafted += k
        self.accepted += n_accepted
        grow = k - len(self.drafted_by_position)
        if grow > 0:
            self.drafted_by_position += [0] * grow
            self.accepted_by_position += [0] * grow
        for i in range(k):
            self.drafted_by_position[i] += 1
            self.accepted_by_position[i] += i < n_accepted


def _host_drafter(backend):
    """The drafter a schema request wraps. Its masks are host data, so drafts come from the
    host: a CPU drafter as it is; on a GPU backend, what its schema_drafter says (a GPU draft
    never sends its tokens to the host inside a cycle: n-gram lookup, or the draft read back in
    a submission of its own)."""
    if hasattr(backend, "schema_drafter"):
        return backend.schema_drafter()
    d = backend.drafter
    return d if d is None or hasattr(d, "propose") else NgramDrafter()


class Engine:
    """A backend (its champion and drafter) and the tokenizer; serves one request at a time."""

    def __init__(self, backend: Executor, tokenizer, *, recover=None,
                 fallbacks: list[dict] | None = None, fallback_reason: str | None = None):
        """`backend` is a cpu.CPUBackend or gpu.backend.GPUBackend (load.backend builds one).
        `recover()` returns a backend (or an awaitable of one) to go on with after a GPU fault
        (a new device, or the numpy champion; champion-only); it is called again for a later
        fault, up to MAX_RECOVERIES per request; without it the fault propagates. `fallbacks` are codes of why
        a GPU was not used ([{"kind", "adapter"}], for the receipt) and `fallback_reason` says
        it in words (web.make_engine)."""
        champion = backend.champion
        if champion.config.vocab_size != tokenizer.vocab_size:
            raise ModelError(f"the model's head has {champion.config.vocab_size} rows but its "
                             f"tokenizer {tokenizer.vocab_size} tokens; pyspec needs them equal")
        self.backend = backend
        self.tokenizer = tokenizer
        self.recover = recover
        self.fallbacks = list(fallbacks or [])
        self.fallback_reason = fallback_reason
        self.faults: list[dict] = []   # GPU faults of the last request (the receipt's faults)
        # The conversation cache: (kv, its epoch, token list) after the last request; the first
        # kv.committed tokens of the list are what the committed cache rows hold.
        self._held: tuple | None = None
        self._json: dict = {}    # jsonmask.constrain's vocabulary index and masks per schema
        # The break-even guard's measured times, per (adapter, drafter), kept across requests
        # (schedule.CostModel): a request need not measure champion-only and the draft again.
        # Whoever replaces engines within one session (web.py, per drafter choice) hands the
        # next one the same dict.
        self.guard_timing: dict[tuple, dict] = {}

    @property
    def champion(self):
        return self.backend.champion

    @property
    def adapter(self) -> str:
        return self.backend.adapter

    @property
    def adapter_class(self) -> str:
        """The adapter's class for the receipt (receipts.ADAPTER_CLASSES), not its description."""
        return self.backend.adapter_class

    @property
    def kv(self):
        return self.backend.kv

    @property
    def drafter(self):
        return self.backend.drafter

    @property
    def draft_source(self):
        """What drafts for this engine as the stats and receipts name it: the drafter, or the
        combination (drafters/combo.py) whose member is the drafter now."""
        return self.backend.combo or self.backend.drafter

    # --- the conversation cache ---------------------------------------------------------------
    def reusable(self, prompt: list[int]) -> int:
        """How many leading prompt tokens' cache rows the last request left in place: the common
        prefix of `prompt[:-1]` and the tokens the committed rows hold (0 when another request,
        on this engine or on one sharing its cache, has started since). The rows are reused as
        they are: every kernel is batch-invariant and a prefill row equals a decode row, so they
        are bit-identical to the rows a fresh prefill would write (tested)."""
        if self._held is None:
            return 0
        kv, epoch, tokens = self._held
        return rows_kept(kv, epoch, tokens, prompt) if kv is self.kv else 0

    def forget(self) -> None:
        """Drop the conversation cache: the next request prefills its whole prompt."""
        self._held = None

    async def warm(self, prefix: list[int]) -> None:
        """Prefill `prefix` into the conversation cache ahead of a request: a prompt start every
        request is expected to share (the chat template's system turn, web.Session). A request
        whose prompt starts with it then prefills only the rest; the rows are those its own
        prefill would write (batch invariance), and `reusable` checks the tokens as ever."""
        tokens = list(prefix) + [0]     # prefill commits the rows of all but the last token
        start = self.reusable(tokens)
        self._held = None
        await self.backend.prefill(tokens, start)
        self._held = (self.kv, self.kv.epoch, list(prefix))

    # --- the loop ---------------------------------------------------------------------------
    def _resumed(self, resume: Resume | None, prompt: list[int], ctx: int) -> list[int]:
        """A Resume's ids, checked: token ids of this vocabulary that fit the context after the
        prompt (the loop may commit up to ctx + 1 tokens: the cache lags by one row)."""
        if resume is None:
            return []
        ids, vocab = resume.ids, self.tokenizer.vocab_size
        if not isinstance(ids, (list, tuple)) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids):
            raise OptionsError(f"resume ids must be a list of token ids in [0, {vocab}); send "
                               "back the ids the interrupted run's chunks carried")
        if len(prompt) + len(ids) > ctx + 1:
            raise PromptTooLongError(f"the prompt ({len(prompt)} tokens) and the resumed ids "
                                     f"({len(ids)}) do not fit the context of {ctx}")
        return [int(t) for t in ids]

    async def stream(self, prompt: list[int], opts: Options | None = None,
                     report: dict | None = None, should_stop=None,
                     resume: Resume | None = None) -> AsyncIterator[Chunk]:
        """Generate from prompt token ids, yielding a Chunk per cycle that commits text.
        When `report` is given it is filled with the Result fields at the end. `should_stop()`
        is asked before every cycle and between prefill blocks; when it says so the request ends
        as "cancelled", with its committed text, stats and receipt (a cancel takes effect within
        one cycle or one prefill block). A prompt that continues the previous request's tokens
        (a conversation's next turn) prefills only what is new: see `reusable`.
        With `resume` the ids an interrupted run committed are prefilled after the prompt and
        decoding goes on from there: chunk offsets continue after their text, and the result
        (text, tokens) is the whole answer. Greedy and replay give exactly the undisturbed text,
        since every random number is keyed by position; rejection gives a valid continuation
        (its drafts, hence its uniforms' uses, differ) and the receipt records the resume."""
        opts = opts or Options()
        opts.check()
        mode = opts.resolved_verify()
        ctx = self.kv.max_ctx
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise OptionsError("the prompt is empty; give at least one token")
        if len(prompt) >= ctx:
            most = self.champion.config.context_length
            more = (f" (or raise the context length, up to the model's {most})" if ctx < most
                    else f" ({most} positions is the model's whole context)")
            raise PromptTooLongError(
                f"the prompt has {len(prompt)} tokens but the context holds {ctx}; shorten it "
                f"so that at least one token can be generated{more}")
        done = self._resumed(resume, prompt, ctx)
        policy = schedule.parse(opts.k)
        sampling = opts.sampling()
        sampling.check(self.tokenizer.vocab_size)
        rule = Rule(mode, opts.temperature, opts.seed, policy.conf_threshold,
                    sampling.chain(self.tokenizer.vocab_size, len(prompt), opts.temperature))
        self._unwrap()
        constraint = None
        if opts.json_schema is not None:
            # The mask is the first processor; forced tokens are drafted around the drafter's.
            constraint = jsonmask.constrain(self._json, self.tokenizer, opts.json_schema,
                                            len(prompt))
            rule = dataclasses.replace(rule, processors=(jsonmask.JsonMask(constraint),)
                                       + rule.processors)
            self.backend.drafter = ForcedDrafter(_host_drafter(self.backend), constraint,
                                                 given_back=self.backend.drafter)
        pipelined = constraint is None and self.backend.pipelines(rule)
        # `--draft ngram+MODEL` (drafters/combo.py): the member to draft is chosen between cycles
        # with nothing in flight, and each member has its own guard (`scheds`). Not under a
        # schema, whose drafter wraps the active member for the whole request.
        combo = self.backend.combo if constraint is None else None
        # by drafter kind ("ngram", "model"): the stats and the receipt name members by kind,
        # never by a name that may hold a file's path
        scheds: dict[str, schedule.Schedule] = {}

        def setup(drafter):
            """(in_cycle, shadowed, classify, sched) for a drafter in this request."""
            # Drafts looked up on the device (n-gram on a GPU): every cycle goes ahead,
            # speculative or not, so the schedule measures them all alike (no separate
            # champion-only rate).
            in_cycle = pipelined and drafter is not None and self.backend.drafts_ahead(rule)
            # A drafter that is free to ask (n-gram) is scored in shadow while speculation is
            # off: `previews` holds (position, what it would have drafted there) until the
            # champion's tokens decide how many of them a speculative cycle would have kept.
            shadowed = policy.guarded and hasattr(drafter, "preview")
            # A drafter that classifies its next proposal (n-gram: the match's length) has the
            # guard decide by that class's acceptance (schedule.py), where the host drafts.
            classify = None if in_cycle else getattr(drafter, "classify", None)
            name = drafter.name if drafter else "none"
            label = getattr(drafter, "kind", None) or name
            if label not in scheds:
                timing = self.guard_timing.setdefault(
                    (self.adapter, name, "in_cycle" if in_cycle else pipelined), {})
                scheds[label] = schedule.Schedule(
                    schedule.parse(opts.k) if scheds else policy, pipelined and not in_cycle,
                    timing, shadowed, in_cycle=in_cycle)
            return in_cycle, shadowed, classify, scheds[label]

        if combo is not None:
            self.backend.drafter = combo.choose(prompt + done)
        drafter = self.backend.drafter
        in_cycle, shadowed, classify, sched = setup(drafter)
        previews: list[tuple[int, list[int], int | None]] = []
        self.faults = []
        eog = set(self.tokenizer.eog_ids if opts.stop_at_eos else ()) | set(opts.stop_ids)
        detok = self.tokenizer.stream_decoder()
        stops = StopStrings(opts.stop)
        st = _Stats(draft_calls_before=self.draft_source.calls if self.draft_source else 0)
        t_start = time.perf_counter()

        tokens, out_text, ttft, finish = list(prompt) + done, "", None, "length"
        reused = self.reusable(tokens)
        self._held = None
        await self.backend.prefill(tokens, reused, should_stop)
        self._held = (self.kv, self.kv.epoch, tokens)   # tokens grows as the request commits
        st.scratch = self.backend.scratch_bytes(max(1, len(tokens) - 1 - reused), 1)
        t_prefill = time.perf_counter() - t_start
        if self.kv.committed < len(tokens) - 1:
            finish = "cancelled"                         # during prefill: nothing generated
        # The resumed ids' text was shown by the interrupted run: the decoder is primed with it
        # (bytes of a character they left incomplete stay pending) and offsets continue after it,
        # less the tail it held back for the stop strings (a function of the text: stops.py).
        primed = "".join(detok.feed(t) for t in done)
        out_text, unsent = stops.feed(primed)[0], []
        decoded, marks = len(primed), []   # characters decoded so far; (kind, start) of unsent
        if resume is not None and resume.fault:
            self.faults.append({**resume.fault, "at_token": len(done),
                                "recovery_s": resume.fault.get("restart_s", 0.0) + t_prefill,
                                "adapter": self.adapter_class})

        # Pipelined decoding (champion-only cycles on a GPU, gpu/backend.py): `queued` is the
        # next cycle, submitted before this one is read, fed on the device by this one's token.
        # It is read next iteration, or dropped unread when the request ends here. The schedule
        # then decides a cycle's k before it has observed the cycle in flight (it observes every
        # cycle, in order, one cycle late): `decided` keeps a k > 0 so decided for the next one.
        # With drafts looked up on the device (`in_cycle`), any cycle goes ahead, fed on the
        # device by the verdict of the one before: the next is submitted unless the cycle in
        # flight might reach the end of the budget (`limit` tokens) or of the context.
        queued, decided = None, None
        limit = len(prompt) + opts.max_tokens
        try:
            while finish != "cancelled" and len(tokens) - len(prompt) < opts.max_tokens:
                n = len(tokens)
                if should_stop is not None and should_stop():
                    finish = "cancelled"
                    break
                if n > ctx:
                    finish = "context"
                    break
                remaining = opts.max_tokens - (n - len(prompt))
                if combo is not None and queued is None and decided is None:
                    chosen = combo.choose(tokens)
                    if chosen is not drafter:   # nothing in flight: switch members here
                        self.backend.drafter = drafter = chosen
                        in_cycle, shadowed, classify, sched = setup(drafter)
                        previews = []
                # Never draft past the budget: k + 1 emitted tokens must fit in `remaining`, so a
                # block never needs cutting at max_tokens; and never past the context.
                cls = None   # the class of this cycle's proposal, where the guard used one
                if queued is not None:
                    k = 0
                elif decided is not None:
                    k, decided = decided, None
                else:
                    if classify is not None and self.drafter:
                        cls = classify(tokens)
                    k = min(sched.next_k(cls) if self.drafter else 0, remaining - 1, ctx - n)
                if constraint is not None and type(sched.policy) is not schedule.Policy:
                    # Forced tokens cost no drafting and are always accepted: the break-even guard's
                    # k (0 where verify rows cost, as on the CPU) must not leave them out. A fixed:K
                    # policy runs what it asks (fixed:0 is constrained champion-only).
                    ahead = constraint.forced_ahead(tokens[len(prompt):], self.backend.k_max)
                    k = max(k, min(ahead, remaining - 1, ctx - n))
                try:
                    went_ahead = queued is not None
                    if in_cycle:
                        handle = queued or self.backend.submit_ahead(tokens, k, rule, limit)
                        end, queued = n + handle.k + 1, None
                        # (a combination about to switch members reads this cycle first)
                        if (end <= ctx and end < limit
                                and (combo is None or combo.choose(tokens) is drafter)):
                            queued = self.backend.submit_ahead(
                                None, sched.next_k() if self.drafter else 0, rule, limit)
                    else:
                        handle, queued = queued or cycle.submit(self.backend, tokens, k, rule), None
                    if (not in_cycle and handle.k == 0 and remaining > 1 and n + 1 <= ctx
                            and constraint is None and self.backend.pipelines(rule)):
                        # This cycle emits exactly one token: the next one's caps are known.
                        k_next = min(sched.next_k() if self.drafter else 0, remaining - 2,
                                     ctx - n - 1)
                        if k_next == 0:
                            queued = self.backend.submit_after(handle, rule)
                        else:
                            decided = k_next   # drafts need this cycle's token on the host
                    out = await cycle.collect(self.backend, handle)
                except PyspecError as e:
                    if queued is not None:   # submitted after the failed cycle: dropped too
                        self.backend.drop(queued)
                        queued = None
                    if e.code == "bad_draft" and self.backend.drafter is not None:
                        # A broken draft costs speed, never the request: nothing of this cycle
                        # was emitted (its drafts failed before any pass), and the engine goes
                        # on champion-only; the receipt records the fault, the page notes it.
                        self.backend.drafter, combo, decided = None, None, None
                        self.faults.append({"kind": "bad_draft", "at_token": n - len(prompt),
                                            "cycle": st.champion_passes, "recovery_s": 0.0,
                                            "adapter": self.adapter_class})
                        continue
                    if self.recover is None or e.code not in RECOVERABLE:
                        raise
                    if sum(f["kind"] in RECOVERABLE for f in self.faults) >= MAX_RECOVERIES:
                        raise RecoveryLimitError(
                            f"the GPU failed {MAX_RECOVERIES + 1} times in this request ({e.code}: "
                            f"{e}); pyspec recovers at most {MAX_RECOVERIES} times per request, "
                            f"so it stopped after the {n - len(prompt)} tokens already shown. "
                            "Send the request again, or use the CPU engine (backend cpu)") from e
                    # The cycle in flight is dropped (nothing of it was emitted); the committed
                    # tokens are re-prefilled on the recovery backend and the request goes on from
                    # there, so no text is ever shown twice.
                    t_fault, failed = time.perf_counter(), self.adapter_class
                    backend = self.recover()
                    self.backend = await backend if inspect.isawaitable(backend) else backend
                    self._held = None
                    await self.backend.prefill(tokens)
                    self._held = (self.kv, self.kv.epoch, tokens)
                    combo = None   # the recovery backend drafts nothing
                    in_cycle = in_cycle and self.backend.drafts_ahead(rule)
                    classify = None if in_cycle else getattr(drafter, "classify", None)
                    sched.pipelined = self.backend.pipelines(rule) and not in_cycle
                    sched.in_cycle = in_cycle
                    decided = None
                    self.faults.append({"kind": e.code, "at_token": n - len(prompt),
                                        "cycle": st.champion_passes,
                                        "recovery_s": time.perf_counter() - t_fault,
                                        "adapter": failed})
                    continue
                verdict, k_real = out.verdict, out.k
                sched.observe(k_real, verdict.n_accepted, out.t_draft, out.t_verify,
                              went_ahead and not in_cycle, cls)
                st.record(k_real, verdict.n_accepted, out.t_draft + out.t_catch_up, out.t_verify)
                st.scratch = max(st.scratch, self.backend.scratch_bytes(k_real + 1, k_real + 1))

                new = list(verdict.tokens)
                stop = next((i for i, t in enumerate(new) if t in eog), None)
                if stop is not None:
                    new, finish = new[:stop], "stop"
                text, hit = "", False
                for i, t in enumerate(new):   # token by token: a stop string ends after its token
                    piece = detok.feed(t)
                    marks.append((token_kind(i, verdict.n_accepted, k_real), decoded))
                    decoded += len(piece)
                    shown, hit = stops.feed(piece)
                    text += shown
                    if hit:
                        new, stop, finish = new[:i + 1], i, "stop"
                        break
                if constraint is not None:
                    for j in range(len(new)):
                        if _forced(constraint, tokens[len(prompt):] + new, n - len(prompt) + j):
                            at = len(marks) - len(new) + j
                            marks[at] = ("forced", marks[at][1])
                tokens += new
                unsent += new
                if shadowed:
                    previews = _score_previews(previews, tokens, sched)
                    if k_real == 0 and stop is None:
                        previews.append((len(tokens), drafter.preview(
                            tokens, min(policy.k_max, self.backend.k_max)),
                            classify(tokens) if classify is not None else None))
                if stop is not None and not hit:   # end of generation: flush what was held
                    shown, hit = stops.feed(detok.flush())
                    text += shown if hit else shown + stops.flush()
                if ttft is None:
                    ttft = time.perf_counter() - t_start
                if text:
                    # A chunk carries the ids of every token committed since the last one (a cycle
                    # whose bytes end mid-character, or whose text is all held back for a stop
                    # string, yields no chunk), so the chunks' ids are always exactly the tokens
                    # behind the text shown plus the held-back tail, which is a function of their
                    # text (stops.held_suffix): what a Resume needs.
                    yield Chunk(len(out_text), text, len(unsent), unsent, st.champion_passes,
                                [m[0] for m in marks], [m[1] for m in marks])
                    out_text, unsent, marks = out_text + text, [], []
                if stop is not None:
                    break
                await asyncio.sleep(0)  # let a cancel or another task in between cycles
        finally:
            if queued is not None:   # the request ended before it: never read, never shown
                self.backend.drop(queued)
        # A cancelled request shows only whole characters: bytes of a character that the next
        # cycle would have completed are not flushed as U+FFFD, so its text is always a prefix
        # of what the uncancelled request would have shown.
        # Held-back text is shown at a length or context end, never at a cancel (the uncancelled
        # request might have stopped inside it).
        tail = ""
        if finish in ("length", "context"):
            tail, hit = stops.feed(detok.flush())
            if hit:
                finish = "stop"
            else:
                tail += stops.flush()
        if tail:
            yield Chunk(len(out_text), tail, len(unsent), unsent, st.champion_passes,
                        [m[0] for m in marks], [m[1] for m in marks])
            out_text += tail

        if report is not None:
            wall = time.perf_counter() - t_start
            generated = tokens[len(prompt):]
            stats = self._stats(st, scheds, len(generated), wall, t_prefill, ttft, finish)
            stats["prompt_tokens"] = len(prompt)   # reused + prefill + 1 (the last one is decoded)
            stats["prefill_tokens"] = max(0, len(prompt) - 1 - reused)
            stats["reused_tokens"] = reused
            stats["resumed_tokens"] = len(done)
            stats["forced_tokens"] = constraint.forced_count(generated) if constraint else 0
            report.update(text=out_text, tokens=generated, finish_reason=finish, stats=stats,
                          receipt=receipts.build(self, opts, mode, stats))
        self._unwrap()

    def close(self) -> None:
        """Free now what this engine's backend allocated for itself (a GPU backend's buffers),
        not whenever the garbage collector gets to it; a GPU model lent to it stays with its
        owner (web.make_engine). The engine serves no request afterwards."""
        self._held = None
        self.backend.close()

    def _unwrap(self) -> None:
        """Give the backend back the drafter a schema request wrapped (drafters/forced.py)."""
        if isinstance(self.backend.drafter, ForcedDrafter):
            self.backend.drafter = self.backend.drafter.given_back

    def generate(self, prompt: list[int], opts: Options | None = None,
                 resume: Resume | None = None) -> Result:
        """Run a request to completion (synchronous wrapper over `stream`)."""
        report: dict = {}

        async def drain():
            async for _ in self.stream(prompt, opts, report, resume=resume):
                pass

        asyncio.run(drain())
        return Result(**report)

    def _stats(self, st: _Stats, scheds, n_generated, wall, t_prefill, ttft, finish) -> dict:
        decode = max(wall - t_prefill, 1e-9)
        drafter = self.draft_source
        return {
            "adapter": self.adapter,
            "drafter": drafter.name if drafter else "none",
            # a draft with another vocabulary (drafters/bridge.py): class, intersection size
            "bridge": getattr(drafter, "bridge_stats", None),
            "generated_tokens": n_generated,
            "finish_reason": finish,
            "champion_passes": st.champion_passes,
            "draft_calls": drafter.calls - st.draft_calls_before if drafter else 0,
            "drafted": st.drafted,
            "accepted": st.accepted,
            "acceptance_rate": st.accepted / st.drafted if st.drafted else 0.0,
            "tokens_per_pass": n_generated / st.champion_passes if st.champion_passes else 0.0,
            "drafted_by_position": st.drafted_by_position,
            "accepted_by_position": st.accepted_by_position,
            "schedule": schedule.merged_stats(scheds),
            "tokens_per_s": n_generated / decode,
            "ttft_s": ttft,
            "prefill_s": t_prefill,
            "draft_s": st.t_draft,
            "verify_s": st.t_verify,
            "wall_s": wall,
            # GPU backends: per-cycle host time (encode + submit) vs time awaiting the readback
            "backend_timing": dict(self.backend.timing),
            "peak_bytes": {
                "weights": self.backend.weight_bytes,
                "kv": self.backend.kv_bytes,
                "kv_used": self.kv.peak_bytes,
                "scratch": st.scratch,
                # On a GPU: every byte of the device's buffers (weights, caches, the fixed
                # scratch of ROWS_MAX x vocab rows), as allocated; None on the numpy engines
                "device": getattr(getattr(self.champion, "dev", None), "allocated", None),
            },
        }
