"""The generation loop: prefill, then cycles (cycle.py) until a stop rule says so; stream the text.

Each cycle the schedule picks k (0 = plain champion decoding), the backend runs the speculative
cycle written once in cycle.py (draft, one champion pass over k + 1 rows, accept, commit), and
the engine appends the emitted tokens, applies the stop rules (end of generation, max_tokens,
context, cancel) and streams text. Text is emitted only for committed tokens, through an
incremental detokenizer, so a stream can never show a token twice or a broken UTF-8 character.

The loop (`Engine.stream`) runs named steps over a request's state, a `Request` value: plan the
request (plan.py), prefill, then per cycle plan it (plan.py), run it (submit, and where the next
needs nothing from the host submit that one too), recover from a fault, emit its text; then
finish and report.
Randomness is keyed by the absolute position of the token being chosen (rng.py), so replay is
byte-identical to champion-only sampling for the same seed whatever the drafter and k. Not here:
planning a request and its cycles' k (plan.py), the cycle (cycle.py), its backends
(cpu/executor.py, gpu/backend.py; built in load.py), the rules (rules/), k policies (schedule.py),
the drafters, chunks (chunks.py), stats (stats.py).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import AsyncIterator

from . import cycle, plan, receipts
from .chunks import Chunk, Resume, Result, token_kind
from .cpu.model import ModelError
from .cycle import Executor
from .drafters.tree import TreeDrafter
from .errors import PyspecError
from .kv import rows_kept
from .options import Options
from .request import Request, forced, score_previews
from .stats import summary
from .text import toolcalls


class RecoveryLimitError(PyspecError, RuntimeError):
    """The GPU failed more often in one request than the engine recovers from (MAX_RECOVERIES);
    the text committed before the last fault stays shown."""

    code = "gpu_unrecoverable"


# Error codes of the faults `recover` handles (gpu/device.py's GPUError family), and how many of
# them one request recovers from: one more ends it with RecoveryLimitError. A device lost again
# and again (a driver that keeps resetting) is not worth more than two new devices.
RECOVERABLE = ("gpu_error", "device_lost", "gpu_timeout")
MAX_RECOVERIES = 2


class Engine:
    """A backend (its champion and drafter) and the tokenizer; serves one request at a time."""

    def __init__(self, backend: Executor, tokenizer, *, recover=None,
                 fallbacks: list[dict] | None = None, fallback_reason: str | None = None):
        """`backend` is a cpu.CPUBackend or gpu.backend.GPUBackend (load.backend builds one).
        `recover()` returns a backend (or an awaitable of one) to go on with after a GPU fault
        (a new device, or the numpy champion; champion-only); it is called again for a later
        fault, up to MAX_RECOVERIES per request; without it the fault propagates. `fallbacks`
        are codes of why a GPU was not used ([{"kind", "adapter"}], for the receipt) and
        `fallback_reason` says it in words (apps/session.make_engine)."""
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
        self.json_cache: dict = {}   # jsonmask.constrain's vocabulary index, masks per schema
        # The break-even guard's measured times, per (adapter, drafter), kept across requests
        # (costmodel.CostModel), so a request need not measure them again; the session hands
        # the engine that replaces this one (another drafter) the same dict.
        self.guard_timing: dict[tuple, dict] = {}
        # A drafter found broken (its logits NaN or +inf: bad_draft) drafts no later request.
        self.draft_broken = False

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
    def device_class(self) -> str:
        """The device class gate verdicts are keyed by (verdicts.device_class)."""
        return self.backend.device_class

    @property
    def kv(self):
        return self.backend.kv

    @property
    def drafter(self):
        """The backend's drafter, the one a request drafts with (None once found broken)."""
        return None if self.draft_broken else self.backend.drafter

    @property
    def draft_source(self):
        """What drafts for this engine as the stats and receipts name it: the drafter, or the
        combination (drafters/combo.py) whose members draft in turn."""
        return None if self.draft_broken else self.backend.combo or self.backend.drafter

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
        await self.backend.prefill(tokens, start, None, self.draft_source)
        self._held = (self.kv, self.kv.epoch, list(prefix))

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
        req = plan.request(self, prompt, opts or Options(), resume)
        self.faults = []
        await self._prefill(req, resume, should_stop)
        try:
            while self._goes_on(req, should_stop):
                k, cls = plan.cycle(self, req)
                try:
                    went_ahead = req.queued is not None
                    handle = self._submit(req, k)
                    out = await cycle.collect(self.backend, handle, req.drafter)
                except PyspecError as e:
                    if not await self._recover(req, e):
                        raise
                    continue
                chunk, stopped = self._emit(req, out, cls, went_ahead)
                if chunk is not None:
                    yield chunk
                if stopped:
                    break
                await asyncio.sleep(0)  # let a cancel or another task in between cycles
        finally:
            if req.queued is not None:   # the request ended before it: never read, never shown
                self.backend.drop(req.queued)
        tail = self._finish(req)
        if tail:
            yield req.chunk(tail)
        if report is not None:
            report.update(self._report(req))

    # --- the loop's steps -----------------------------------------------------------------
    async def _prefill(self, req: Request, resume: Resume | None, should_stop) -> None:
        """The prompt and the resumed ids into the cache (what the conversation cache holds is
        kept), and the resumed ids' text primed: the interrupted run showed it."""
        source = self._source(req)
        req.st.draft_calls_before = source.calls if source else 0
        req.t_start = time.perf_counter()
        req.tokens = req.prompt + req.done
        req.reused = self.reusable(req.tokens)
        self._held = None
        await self.backend.prefill(req.tokens, req.reused, should_stop, source)
        self._held = (self.kv, self.kv.epoch, req.tokens)   # it grows as the request commits
        req.st.scratch = self.backend.scratch_bytes(max(1, len(req.tokens) - 1 - req.reused), 1)
        req.t_prefill = time.perf_counter() - req.t_start
        if self.kv.committed < len(req.tokens) - 1:
            req.finish = "cancelled"                         # during prefill: nothing generated
        # The decoder is primed with the resumed ids (bytes of a character they left incomplete
        # stay pending) and offsets continue after their text, less the tail it held back for
        # the stop strings (a function of the text: stops.py).
        primed = "".join(req.detok.feed(t) for t in req.done)
        req.out_text, req.decoded = req.stops.feed(primed)[0], len(primed)
        if resume is not None and resume.fault:
            self.faults.append({**resume.fault, "at_token": len(req.done),
                                "recovery_s": resume.fault.get("restart_s", 0.0) + req.t_prefill,
                                "adapter": self.adapter_class})

    def _source(self, req: Request):
        """What drafts the request as its stats and receipt name it: the combination whose
        members draft in turn, else its drafter (None after a bad draft)."""
        return (None if self.draft_broken else self.backend.combo) or req.drafter

    @staticmethod
    def _goes_on(req: Request, should_stop) -> bool:
        """Whether another cycle runs: not cancelled, max_tokens and the context not reached."""
        if req.finish != "cancelled" and req.remaining > 0:
            if should_stop is not None and should_stop():
                req.finish = "cancelled"
            elif len(req.tokens) > req.ctx:
                req.finish = "context"
        return req.finish not in ("cancelled", "context") and req.remaining > 0

    def _submit(self, req: Request, k: int):
        """Submit the cycle (or take the one submitted ahead) and, where the next one needs
        nothing from the host, that one too before this one is read (gpu/backend.py); the
        schedule then observes every cycle, in order, one cycle late. With drafts made on the
        device (`in_cycle`) any cycle goes ahead unless the one in flight might reach the end
        of the budget or of the context."""
        b, tokens, n, drafter = self.backend, req.tokens, len(req.tokens), req.drafter
        chain = plan.chain_of(drafter)   # under --tree: where the guard says a chain pays more
        # trees drafted and walked on the device (n-gram's; a fed draft's of fixed widths) go
        # ahead as their chains do
        trees_ahead = isinstance(drafter, TreeDrafter) and b.drafts_ahead(req.rule, drafter)
        first = chain
        if req.queued is None and self._tree_pays(req, k):
            if not trees_ahead:
                # A tree drafted on the host after the committed tokens, so it is read before
                # the next cycle is submitted.
                return cycle.submit(b, tokens, k, req.rule, drafter)
            first = drafter
        if req.in_cycle:
            handle = req.queued or b.submit_ahead(tokens, k, req.rule, req.limit, first)
            end, req.queued = n + handle.k + 1, None
            # (a combination about to switch members reads this cycle first)
            if (end <= req.ctx and end < req.limit
                    and (req.combo is None or req.combo.choose(tokens) is drafter)):
                k_next = req.sched.next_k() if drafter else 0
                if not self._tree_pays(req, k_next, count=trees_ahead):
                    req.queued = b.submit_ahead(None, k_next, req.rule, req.limit, chain)
                elif trees_ahead:
                    req.queued = b.submit_ahead(None, k_next, req.rule, req.limit, drafter)
                else:
                    req.decided = k_next   # the tree needs this cycle's tokens on the host
            return handle
        handle = req.queued or cycle.submit(b, tokens, k, req.rule, chain)
        req.queued = None
        if (handle.k == 0 and req.remaining > 1 and n + 1 <= req.ctx
                and req.constraint is None and b.pipelines(req.rule)):
            # This cycle emits exactly one token: the next one's caps are known.
            k_next = min(req.sched.next_k() if drafter else 0, req.remaining - 2,
                         req.ctx - n - 1)
            if k_next == 0:
                req.queued = b.submit_after(handle, req.rule)
            else:
                req.decided = k_next   # drafts need this cycle's token on the host
        return handle

    @staticmethod
    def _tree_pays(req: Request, k: int, count: bool = True) -> bool:
        """Whether a cycle of k drafts drafts the request's tree (--tree) rather than its
        chain: where the guard's model says the tree pays more (schedule.tree_pays)."""
        d = req.drafter
        return (isinstance(d, TreeDrafter) and k > 0
                and req.sched.tree_pays(k, d.nodes(k), count=count))

    async def _recover(self, req: Request, e: PyspecError) -> bool:
        """After a cycle failed (nothing of it was emitted): whether the request goes on. A
        broken draft costs speed, never the request: it goes on champion-only. A GPU fault goes
        to the recovery backend, which re-prefills the committed tokens, so no text is ever
        shown twice; the receipt records either."""
        if req.queued is not None:   # submitted after the failed cycle: dropped too
            self.backend.drop(req.queued)
            req.queued = None
        fault = {"kind": e.code, "at_token": req.generated, "cycle": req.st.champion_passes}
        if e.code == "bad_draft" and req.drafter is not None:
            req.drafter = req.combo = req.decided = None
            self.draft_broken = True
            self.faults.append({**fault, "recovery_s": 0.0, "adapter": self.adapter_class})
            return True
        if self.recover is None or e.code not in RECOVERABLE:
            return False
        if sum(f["kind"] in RECOVERABLE for f in self.faults) >= MAX_RECOVERIES:
            raise RecoveryLimitError(
                f"the GPU failed {MAX_RECOVERIES + 1} times in this request ({e.code}: {e}); "
                f"pyspec recovers at most {MAX_RECOVERIES} times per request, so it stopped "
                f"after the {req.generated} tokens already shown. Send the request again, or "
                "use the CPU engine (backend cpu)") from e
        t_fault, failed = time.perf_counter(), self.adapter_class
        backend = self.recover()
        self.backend = await backend if inspect.isawaitable(backend) else backend
        self._held = None
        await self.backend.prefill(req.tokens)
        self._held = (self.kv, self.kv.epoch, req.tokens)
        req.combo = req.drafter = req.decided = None   # the recovery backend drafts nothing
        req.in_cycle, req.classify = False, None
        req.sched.pipelined, req.sched.in_cycle = self.backend.pipelines(req.rule), False
        self.faults.append({**fault, "recovery_s": time.perf_counter() - t_fault,
                            "adapter": failed})
        return True

    def _emit(self, req: Request, out: cycle.Outcome, cls, went_ahead: bool):
        """Observe a cycle's outcome and commit its tokens up to a stop; (the chunk of text it
        shows or None, whether the request stops here)."""
        verdict, k = out.verdict, out.k
        req.sched.observe(k, verdict.n_accepted, out.t_draft, out.t_verify,
                          went_ahead and not req.in_cycle, cls, out.nodes, out.chain)
        req.st.record(k, verdict.n_accepted, out.t_draft + out.t_catch_up, out.t_verify)
        req.st.scratch = max(req.st.scratch, self.backend.scratch_bytes(k + 1, k + 1))
        new = list(verdict.tokens)
        stop = next((i for i, t in enumerate(new) if t in req.eog), None)
        if stop is not None:
            new, req.finish = new[:stop], "stop"
        text, hit = "", False
        for i, t in enumerate(new):   # token by token: a stop string ends after its token
            piece = req.detok.feed(t)
            req.marks.append((token_kind(i, verdict.n_accepted, k), req.decoded))
            req.decoded += len(piece)
            shown, hit = req.stops.feed(piece)
            text += shown
            if hit:
                new, stop, req.finish = new[:i + 1], i, "stop"
                break
        if req.constraint is not None:
            at = req.generated
            for j in range(len(new)):
                if forced(req.constraint, req.tokens[len(req.prompt):] + new, at + j):
                    m = len(req.marks) - len(new) + j
                    req.marks[m] = ("forced", req.marks[m][1])
        req.tokens += new   # in place: the conversation cache holds this list
        req.unsent += new
        if req.previewer is not None:
            req.previews = score_previews(req.previews, req.tokens, req.sched)
            if k == 0 and stop is None:
                req.previews.append((len(req.tokens), req.previewer.preview(
                    req.tokens, min(req.policy.k_max, self.backend.k_max)),
                    req.classify(req.tokens) if req.classify is not None else None))
        if stop is not None and not hit:   # end of generation: flush what was held
            shown, hit = req.stops.feed(req.detok.flush())
            text += shown if hit else shown + req.stops.flush()
        if req.ttft is None:
            req.ttft = time.perf_counter() - req.t_start
        return (req.chunk(text) if text else None), stop is not None

    @staticmethod
    def _finish(req: Request) -> str:
        """The text held back, shown at a length or context end, never at a cancel (the
        uncancelled request might have stopped inside it). A cancelled request shows only whole
        characters: bytes of a character that the next cycle would have completed are not
        flushed as U+FFFD, so its text is always a prefix of what the uncancelled request would
        have shown."""
        if req.finish not in ("length", "context"):
            return ""
        tail, hit = req.stops.feed(req.detok.flush())
        if hit:
            req.finish = "stop"
            return tail
        return tail + req.stops.flush()

    def _report(self, req: Request) -> dict:
        """The Result fields: text, tokens, finish reason, stats and receipt."""
        wall = time.perf_counter() - req.t_start
        generated = req.tokens[len(req.prompt):]
        source = self._source(req)
        calls = content = None
        if req.opts.tools is not None:   # the answer's calls (a tools request)
            content, calls = toolcalls.result(req.out_text, toolcalls.detect(self.tokenizer),
                                              toolcalls.salt(req.prompt))
            if calls and req.finish == "stop":
                req.finish = "tool_calls"
        stats = summary(req.st, self.backend, source, req.scheds, len(generated), wall,
                        req.t_prefill, req.ttft, req.finish)
        stats["prompt_tokens"] = len(req.prompt)   # reused + prefill + 1 (the last one decoded)
        stats["prefill_tokens"] = max(0, len(req.prompt) - 1 - req.reused)
        stats["reused_tokens"] = req.reused
        stats["resumed_tokens"] = len(req.done)
        stats["forced_tokens"] = (req.constraint.forced_count(generated) if req.constraint
                                  else 0)
        return dict(text=req.out_text, tokens=generated, finish_reason=req.finish, stats=stats,
                    receipt=receipts.build(self, req.opts, req.mode, stats, source),
                    tool_calls=calls, content=content)

    def close(self) -> None:
        """Free now what this engine's backend allocated for itself (a GPU backend's buffers),
        not whenever the garbage collector gets to it; a GPU model lent to it stays with its
        owner (web.make_engine). The engine serves no request afterwards."""
        self._held = None
        self.backend.close()

    async def complete(self, prompt: list[int], opts: Options | None = None,
                       resume: Resume | None = None, should_stop=None) -> Result:
        """Run a request to completion: `stream` drained, its chunks unread (a run measured,
        not shown: the page's gate, apps/page_gate.py)."""
        report: dict = {}
        async for _ in self.stream(prompt, opts, report, should_stop=should_stop, resume=resume):
            pass
        return Result(**report)

    def generate(self, prompt: list[int], opts: Options | None = None,
                 resume: Resume | None = None) -> Result:
        """Run a request to completion (synchronous wrapper over `complete`)."""
        return asyncio.run(self.complete(prompt, opts, resume))
