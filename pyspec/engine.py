"""The generation loop: prefill, then cycles of draft -> verify -> commit -> stream.

One cycle (n committed tokens; the champion's cache holds rows for the first n - 1):
  1. the schedule picks k (0 = plain champion decoding);
  2. the drafter proposes up to k tokens d_1..d_k for positions n..n+k-1;
  3. the champion runs ONE pass over [t_{n-1}, d_1..d_k] at positions n-1..n+k-1, giving the
     logits for positions n..n+k (row i predicts position n + i);
  4. verify.py's rule accepts a prefix of the drafts and adds one champion token (the correction
     at the first rejection, or the bonus from row k when all were accepted);
  5. the champion cache commits the rows of the fed tokens that were kept: t_{n-1} and the
     accepted drafts. The emitted last token is fed at the start of the next cycle, which is why
     the cache always lags the sequence by one row.
Text is emitted only for committed tokens, through an incremental detokenizer, so a stream can
never show a token twice or a broken UTF-8 character.

Randomness is keyed by the absolute position of the token being chosen (rng.py), so replay mode is
byte-identical to champion-only sampling for the same seed whatever the drafter and k.
Not here: the rules (verify.py), k policies (schedule.py), the drafters, GPU code.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

import numpy as np

from . import receipts, rng, schedule, verify
from .drafters import Proposal, make_drafter
from .gpu.device import DeviceLostError, GPUError
from .kv import ContextOverflowError
from .model import Model, ModelError, prefill

VERIFY_MODES = ("greedy", "replay", "rejection")


class OptionsError(ValueError):
    """An invalid generation option."""


class PromptTooLongError(ContextOverflowError):
    """The prompt leaves no room in the context to generate."""


@dataclass
class Options:
    max_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    verify: str | None = None     # None: greedy at T = 0, replay above
    k: str = "heuristic"
    stop_at_eos: bool = True
    stop_ids: tuple = ()          # more token ids that end generation, besides the model's EOG

    def resolved_verify(self) -> str:
        """T = 0 is always greedy: every rule reduces to argmax there."""
        if self.temperature == 0:
            return "greedy"
        return self.verify or "replay"

    def check(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise OptionsError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not (self.temperature >= 0 and np.isfinite(self.temperature)):
            raise OptionsError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.verify not in (None, *VERIFY_MODES):
            raise OptionsError(f"unknown verify mode {self.verify!r}: use one of {VERIFY_MODES}")
        if self.verify == "greedy" and self.temperature > 0:
            raise OptionsError("verify=greedy needs temperature 0; use replay or rejection")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 1 << 64:
            raise OptionsError(f"seed must be an integer in [0, 2^64), got {self.seed!r}")
        schedule.parse(self.k)


@dataclass
class Chunk:
    offset: int          # character offset of `text` in the whole output
    text: str
    n_tokens: int        # tokens committed by this cycle


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


def _fault_kind(e: Exception) -> str:
    return "device_lost" if isinstance(e, DeviceLostError) else "gpu_error"


def chooser(mode: str, opts: Options):
    """The drafter's rule for turning its logits (vocab,) at a position into a token.

    Returns (token, q_draft row or None, confidence). The confidence is the draft's top
    probability, a function of its distribution only, never of the sampled token: if the
    decision to stop drafting looked at the sampled token, rejection sampling would no longer
    be exact (a position would be drafted more often for some tokens than for others)."""
    temperature, seed = opts.temperature, opts.seed

    def choose(logits: np.ndarray, position: int):
        if mode == "greedy":
            token = int(np.argmax(logits))
            return token, None, float(verify.softmax(logits, 1.0)[token])
        probs = verify.softmax(logits, temperature)                       # (vocab,)
        confidence = float(probs.max())
        if mode == "replay":
            # Coupled with the champion: the same Gumbel noise it will use at this position.
            token = verify.sample_replay(logits, temperature,
                                         rng.gumbel(seed, position, logits.shape[0]))
            return token, None, confidence
        token = verify.sample_categorical(probs, rng.uniform(seed, position, rng.STREAM_DRAFT))
        return token, probs, confidence

    return choose


def verify_block(mode: str, opts: Options, logits: np.ndarray, proposal: Proposal,
                 n: int) -> verify.Verdict:
    """Apply the rule to logits (k+1, vocab) for positions n..n+k; proposal holds k drafts."""
    drafts = np.asarray(proposal.tokens, dtype=np.int64)
    k, vocab = len(drafts), logits.shape[1]
    if mode == "greedy":
        return verify.verify_greedy(logits, drafts)
    if mode == "replay":
        gumbel = np.stack([rng.gumbel(opts.seed, n + i, vocab) for i in range(k + 1)])
        return verify.verify_replay(logits, drafts, opts.temperature, gumbel)
    uniform = [[rng.uniform(opts.seed, n + i, s) for i in range(k)]
               for s in (rng.STREAM_ACCEPT, rng.STREAM_RESIDUAL)]
    return verify.verify_rejection(verify.softmax(logits, opts.temperature),
                                   proposal.q_matrix(vocab), drafts, uniform[0], uniform[1],
                                   rng.uniform(opts.seed, n + k, rng.STREAM_BONUS))


class BackendBytes:
    """Byte accounting of a backend with a champion, its cache and a drafter (both backends)."""

    def scratch_bytes(self, rows: int, logit_rows: int) -> int:
        return self.champion.scratch_bytes(rows, logit_rows)

    @property
    def weight_bytes(self) -> int:
        return self.champion.weight_bytes + (self.drafter.weight_bytes if self.drafter else 0)

    @property
    def kv_bytes(self) -> int:
        return self.kv.nbytes + (self.drafter.kv_bytes if self.drafter else 0)


class CPUBackend(BackendBytes):
    """The champion and its drafter on the CPU (numpy): the reference every GPU path is judged by.

    A backend owns the champion's cache and the drafter and runs one cycle at a time; the engine
    owns the loop, the schedule, the stop rules and the text. The GPU backend (gpu/backend.py)
    has the same calls: prefill and cycle (both awaited), scratch_bytes and the byte counts."""

    adapter = "cpu-numpy"

    def __init__(self, champion: Model, draft="ngram", max_ctx: int | None = None,
                 load_draft=None):
        self.champion = champion
        self.kv = champion.new_cache(max_ctx)
        self.drafter = (make_drafter(draft, champion, self.kv, load_draft)
                        if isinstance(draft, str) else draft)

    async def prefill(self, prompt: list[int]) -> None:
        prefill(self.champion, self.kv, prompt)
        if self.drafter:
            self.drafter.reset(prompt)

    async def cycle(self, tokens: list[int], k: int, mode: str, opts: Options, sched):
        """Draft up to k tokens, verify them in one champion pass, commit the kept rows.
        Returns (verdict, drafts actually proposed, draft seconds, verify seconds)."""
        n = len(tokens)
        t0 = time.perf_counter()
        proposal = (self.drafter.propose(tokens, k, chooser(mode, opts), sched.stop) if k > 0
                    else Proposal())
        del proposal.tokens[k:], proposal.q_draft[k:]  # a drafter may return fewer, never more
        t1 = time.perf_counter()
        self.kv.rollback()  # a self:L draft leaves rows here; the verify pass rewrites them
        logits = self.champion.forward([tokens[-1]] + proposal.tokens, self.kv)  # (k+1, vocab)
        verdict = verify_block(mode, opts, logits, proposal, n)
        self.kv.commit(verdict.n_accepted + 1)  # t_{n-1} and the accepted drafts
        return verdict, len(proposal.tokens), t1 - t0, time.perf_counter() - t1


def make_backend(champion, draft="ngram", max_ctx: int | None = None, load_draft=None):
    """A CPU backend for a model.Model; a GPU model (pyspec.gpu) brings its own backend."""
    if isinstance(champion, Model):
        return CPUBackend(champion, draft, max_ctx, load_draft)
    return champion.backend(draft, max_ctx, load_draft)


class Engine:
    """A champion, its tokenizer and one drafter on one backend; serves one request at a time."""

    def __init__(self, champion, tokenizer, draft="ngram", max_ctx: int | None = None,
                 load_draft=None, adapter: str | None = None):
        """`champion` is a model.Model (CPU) or a gpu.GPUModel; `draft` is a --draft spec
        (ngram | none | self:L | GGUF path) or a drafter object."""
        if champion.config.vocab_size != tokenizer.vocab_size:
            raise ModelError(f"the model's head has {champion.config.vocab_size} rows but its "
                             f"tokenizer {tokenizer.vocab_size} tokens; pyspec needs them equal")
        self.champion = champion
        self.tokenizer = tokenizer
        self.backend = make_backend(champion, draft, max_ctx, load_draft)
        self.adapter = adapter or self.backend.adapter
        # `recover()` -> a backend to finish a request on after a GPU fault (e.g. the numpy
        # champion, champion-only); None lets the fault propagate. Faults land in the receipt.
        self.recover = None
        self.faults: list[dict] = []

    @property
    def kv(self):
        return self.backend.kv

    @property
    def drafter(self):
        return self.backend.drafter

    # --- the loop ---------------------------------------------------------------------------
    async def stream(self, prompt: list[int], opts: Options | None = None,
                     report: dict | None = None, should_stop=None) -> AsyncIterator[Chunk]:
        """Generate from prompt token ids, yielding a Chunk per cycle that commits text.
        When `report` is given it is filled with the Result fields at the end. `should_stop()`
        is asked before every cycle; when it says so the request ends as "cancelled", with its
        committed text, stats and receipt (a cancel takes effect within one cycle)."""
        opts = opts or Options()
        opts.check()
        mode = opts.resolved_verify()
        ctx = self.kv.max_ctx
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise OptionsError("the prompt is empty; give at least one token")
        if len(prompt) >= ctx:
            raise PromptTooLongError(
                f"the prompt has {len(prompt)} tokens but the context holds {ctx}; shorten it "
                f"(or raise the context length) so that at least one token can be generated")
        sched = schedule.Schedule(schedule.parse(opts.k))
        self.faults = []
        eog = set(self.tokenizer.eog_ids if opts.stop_at_eos else ()) | set(opts.stop_ids)
        detok = self.tokenizer.stream_decoder()
        st = _Stats(draft_calls_before=self.drafter.calls if self.drafter else 0)
        t_start = time.perf_counter()

        await self.backend.prefill(prompt)
        st.scratch = self.backend.scratch_bytes(len(prompt) - 1, 1)
        t_prefill = time.perf_counter() - t_start
        tokens, out_text, ttft, finish = list(prompt), "", None, "length"

        while len(tokens) - len(prompt) < opts.max_tokens:
            n = len(tokens)
            if should_stop is not None and should_stop():
                finish = "cancelled"
                break
            if n > ctx:
                finish = "context"
                break
            remaining = opts.max_tokens - (n - len(prompt))
            # Never draft past the budget: k + 1 emitted tokens must fit in `remaining`, so a
            # block never needs cutting at max_tokens; and never past the context.
            k = min(sched.next_k() if self.drafter else 0, remaining - 1, ctx - n)
            try:
                verdict, k_real, t_draft, t_verify = await self.backend.cycle(tokens, k, mode,
                                                                              opts, sched)
            except GPUError as e:
                if self.recover is None:
                    raise
                # The cycle in flight is dropped (nothing of it was emitted); the committed
                # tokens are re-prefilled on the recovery backend and the request goes on from
                # there, so no text is ever shown twice.
                self.faults.append({"kind": _fault_kind(e), "at_token": n - len(prompt),
                                    "adapter": self.adapter})
                self.backend = self.recover()
                self.adapter = self.backend.adapter
                self.recover = None
                await self.backend.prefill(tokens)
                continue
            sched.observe(k_real, verdict.n_accepted, t_draft, t_verify)
            st.record(k_real, verdict.n_accepted, t_draft, t_verify)
            st.scratch = max(st.scratch, self.backend.scratch_bytes(k_real + 1, k_real + 1))

            new = list(verdict.tokens)
            stop = next((i for i, t in enumerate(new) if t in eog), None)
            if stop is not None:
                new, finish = new[:stop], "stop"
            tokens += new
            if self.drafter:
                self.drafter.accept(tokens)
            text = "".join(detok.feed(t) for t in new)
            if stop is not None:
                text += detok.flush()
            if ttft is None:
                ttft = time.perf_counter() - t_start
            if text:
                yield Chunk(len(out_text), text, len(new))
                out_text += text
            if stop is not None:
                break
            await asyncio.sleep(0)  # let a cancel or another task in between cycles
        # A cancelled request shows only whole characters: bytes of a character that the next
        # cycle would have completed are not flushed as U+FFFD, so its text is always a prefix
        # of what the uncancelled request would have shown.
        tail = detok.flush() if finish != "cancelled" else ""
        if tail:
            yield Chunk(len(out_text), tail, 0)
            out_text += tail

        if report is not None:
            wall = time.perf_counter() - t_start
            generated = tokens[len(prompt):]
            stats = self._stats(st, sched, len(generated), wall, t_prefill, ttft, finish)
            report.update(text=out_text, tokens=generated, finish_reason=finish, stats=stats,
                          receipt=receipts.build(self, opts, mode, stats))

    def generate(self, prompt: list[int], opts: Options | None = None) -> Result:
        """Run a request to completion (synchronous wrapper over `stream`)."""
        report: dict = {}

        async def drain():
            async for _ in self.stream(prompt, opts, report):
                pass

        asyncio.run(drain())
        return Result(**report)

    def _stats(self, st: _Stats, sched, n_generated, wall, t_prefill, ttft, finish) -> dict:
        decode = max(wall - t_prefill, 1e-9)
        drafter = self.drafter
        return {
            "adapter": self.adapter,
            "drafter": drafter.name if drafter else "none",
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
            "schedule": sched.stats(),
            "tokens_per_s": n_generated / decode,
            "ttft_s": ttft,
            "prefill_s": t_prefill,
            "draft_s": st.t_draft,
            "verify_s": st.t_verify,
            "wall_s": wall,
            # GPU backends: per-cycle host time (encode + submit) vs time awaiting the readback
            "backend_timing": dict(getattr(self.backend, "timing", {})),
            "peak_bytes": {
                "weights": self.backend.weight_bytes,
                "kv": self.backend.kv_bytes,
                "kv_used": self.kv.peak_bytes,
                "scratch": st.scratch,
            },
        }
