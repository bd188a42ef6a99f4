"""The GPU-resident speculative cycle (DESIGN §7): one submission and one small readback per cycle.

A cycle that starts with n committed tokens and k drafts encodes, in order:
  1. the draft steps (GPU drafters): step i feeds its token(s), runs the draft forward, and
     samples the token for position n + i on the GPU (argmax, Gumbel replay, or a q_draft
     sample); small buffer copies carry it into the next step's input and into row i + 1 of
     the champion's token list. No CPU round trip between steps.
     (The n-gram drafter proposes on the CPU; its tokens are written with the step data.)
  2. the champion pass over [t_{n-1}, d_1..d_k] at positions n-1..n+k-1 (k + 1 rows);
  3. the champion's choices: argmax_rows (greedy / replay) or softmax_rows (rejection);
  4. the accept kernel, which applies verify.py's rule and writes n_accepted and the tokens.
Then one readback of the accept words. The engine loop, the schedule and the text stay in
engine.py: this class has the same calls as engine.CPUBackend.

Step slots: 0 is the champion pass (its sampler and accept kernel share it: they key row r's
random numbers at pos + 1 + r), 1 + i is draft step i.
Not here: the kernels (ops.py, sampling.py), the forward's dispatch list (model.py).
"""

from __future__ import annotations

import time

import numpy as np

from .. import compat, rng, schedule, verify
from ..drafters import DraftSpecError, Proposal, make_drafter
from ..engine import BackendBytes, chooser
from ..gguf import GGUFFile
from . import sampling
from .device import ROWS_MAX, Copy
from .model import GPUModel

SLOT_CHAMPION = 0
K_GPU_MAX = ROWS_MAX - 1   # drafts one pass can verify
N_SLOTS = 1 + K_GPU_MAX


def _draft_slot(i: int) -> int:
    return 1 + i


class GPUDraft:
    """A drafter whose steps run on the GPU: the champion's first L layers (`self:L`, sharing the
    champion's cache) or an independent draft model with its own cache. The engine sees the
    drafter protocol (name, calls, reset, accept); the backend encodes its steps."""

    def __init__(self, model: GPUModel, layers: int | None, name: str, shares_cache: bool):
        self.model = model
        self.layers = layers
        self.name = name
        self.kind = "self" if shares_cache else "model"
        self.shares_cache = shares_cache
        self.weight_bytes = 0 if shares_cache else model.weight_bytes
        self.kv_bytes = 0 if shares_cache else model.kv.nbytes
        self.calls = 0
        dev = model.dev
        self.feed_tokens = dev.buffer(ROWS_MAX * 4, label=f"{name}.feed")   # (R,) u32

    def reset(self, tokens: list[int]) -> None:
        if not self.shares_cache and len(tokens) <= self.model.kv.max_ctx:
            self.model.prefill(tokens, _draft_slot(0))

    def accept(self, tokens: list[int]) -> None:
        pass  # the backend commits the draft's rows right after the readback


class GPUBackend(BackendBytes):
    """The champion on a GPU device and its drafter; see the module docstring."""

    def __init__(self, champion: GPUModel, draft="ngram", max_ctx: int | None = None,
                 load_draft=None):
        champion.limit_context(max_ctx)
        self.champion = champion
        self.dev = dev = champion.dev
        self.adapter = dev.name
        self.drafter = self._make_drafter(draft) if isinstance(draft, str) else draft
        vocab = champion.config.vocab_size
        self.vocab = vocab
        # Per-cycle buffers (R = ROWS_MAX):
        self.choice = dev.buffer(ROWS_MAX * 4, label="champion.choice")       # (R,) u32
        self.conf = dev.buffer(ROWS_MAX * 4, label="champion.conf")           # (R,) f32
        self.p_target = dev.buffer(ROWS_MAX * vocab * 4, label="p_target")    # (R, vocab) f32
        self.q_draft = dev.buffer(ROWS_MAX * vocab * 4, label="q_draft")      # (R, vocab) f32
        self.d_sample = dev.buffer(ROWS_MAX * 4, label="draft.sample")        # (R,) u32
        self.d_conf = dev.buffer(ROWS_MAX * 4, label="draft.conf_rows")       # (R,) f32
        self.d_probs = dev.buffer(ROWS_MAX * vocab * 4, label="draft.probs")  # (R, vocab) f32
        self.draft_conf = dev.buffer(ROWS_MAX * 4, label="draft.conf")        # (K,) f32
        self.out = dev.buffer(sampling.ACCEPT_WORDS * 4, label="accept.out")  # (68,) u32
        self._tail: dict[tuple, list] = {}
        self._draft_plans: dict[tuple, list] = {}
        self.timing: dict = {}
        self._warm()

    def _warm(self) -> None:
        """Build the plans a first cycle needs (compiling their pipelines) now, so that no
        cycle's timing, which the break-even guard reads, carries a one-time cost."""
        self.champion.forward_dispatches(SLOT_CHAMPION)
        for mode in ("greedy", "rejection"):
            self._verify_dispatches(mode, 0.0)
            if isinstance(self.drafter, GPUDraft):
                self._draft_step(self.drafter, _draft_slot(0), mode)

    # --- construction -------------------------------------------------------------------------
    def _make_drafter(self, spec: str):
        champ = self.champion
        if spec in ("none", "ngram"):
            return make_drafter(spec, champ)
        if spec.startswith("self:"):
            layers = make_drafter(spec, champ).layers  # validates L against the champion
            return GPUDraft(champ, layers, spec, shares_cache=True)
        try:
            f = GGUFFile.open(spec)
        except FileNotFoundError:
            raise DraftSpecError(f"unknown --draft {spec!r}: use ngram, none, self:L or the path "
                                 f"of a GGUF draft model") from None
        compat.check_pair(champ.metadata, f.metadata).raise_if_bad()
        model = GPUModel(self.dev, f, champ.steps, champ.kv.max_ctx, label="draft")
        return GPUDraft(model, None, f"model:{spec}", shares_cache=False)

    @property
    def kv(self):
        """The champion's cache bookkeeping (engines sharing one GPU model share it too)."""
        return self.champion.kv

    # --- the engine's calls -------------------------------------------------------------------
    async def prefill(self, prompt: list[int]) -> None:
        # Per request: host time encoding and submitting cycles vs time awaiting their readback.
        self.timing = {"cycles": 0, "host_s": 0.0, "wait_s": 0.0, "readbacks": 0}
        self.champion.prefill(prompt, SLOT_CHAMPION)
        if self.drafter:
            self.drafter.reset(prompt)
        # Wait for the prefill here, so that it is timed as prefill and not as the first cycle.
        await self.dev.read(self.out, 16)

    async def cycle(self, tokens: list[int], k: int, mode: str, opts, sched):
        """One cycle: returns (verdict, drafts verified, draft seconds, cycle seconds)."""
        champ, dev, steps = self.champion, self.dev, self.champion.steps
        n = len(tokens)
        k = min(k, K_GPU_MAX)
        t0 = time.perf_counter()
        commands: list = []
        one_hot, threshold, t_draft = True, 0.0, 0.0
        draft = self.drafter if isinstance(self.drafter, GPUDraft) else None
        if draft is not None and k > 0:
            k = self._encode_draft(draft, tokens, k, mode, opts, commands)
            one_hot = mode != "rejection"
            # The confidence policy's stop is applied by the accept kernel (drafts past the first
            # low-confidence one count as never proposed), keeping the cycle on the GPU.
            threshold = getattr(sched.policy, "threshold", 0.0)
            drafts = None
        else:  # a CPU drafter (n-gram, or any drafter object a caller brings)
            proposal = (self.drafter.propose(tokens, k, chooser(mode, opts), sched.stop)
                        if k > 0 and self.drafter else Proposal())
            del proposal.tokens[k:], proposal.q_draft[k:]
            drafts, k = proposal.tokens, len(proposal.tokens)
            if mode == "rejection" and any(q is not None for q in proposal.q_draft):
                one_hot = False  # a sampling CPU drafter: its q_draft rows go up with the step
                dev.write(self.q_draft, proposal.q_matrix(self.vocab).astype(np.float32))
            t_draft = time.perf_counter() - t0
        self.kv.rollback()  # a self:L draft left rows here; the champion pass rewrites them
        if drafts is None:  # draft tokens arrive by copy; only row 0 comes from the CPU
            pos = self.kv.append(k + 1)
            dev.write(champ.tokens, np.array([tokens[-1]], np.uint32))
        else:
            pos = champ.feed([tokens[-1]] + drafts, SLOT_CHAMPION)
        steps.set(SLOT_CHAMPION, rows=k + 1, pos=pos, seed=opts.seed,
                  temperature=opts.temperature, n_draft=k, mode=mode, one_hot=one_hot)
        n_draft_commands = len(commands)
        commands += champ.forward_dispatches(SLOT_CHAMPION)
        commands += self._verify_dispatches(mode, threshold)
        steps.upload()
        dev.submit(commands)
        t_wait = time.perf_counter()
        words = await dev.read_array(self.out, np.uint32, (sampling.ACCEPT_WORDS,))
        self.timing["cycles"] += 1
        self.timing["readbacks"] += 1
        self.timing["wait_s"] += time.perf_counter() - t_wait
        self.timing["host_s"] += t_wait - t0
        if draft is not None:
            # One submission gives one time. Split it by command count (encoding and dispatch
            # overhead dominate a small model's pass): the guard needs the draft's cost per
            # token apart from the champion's to predict an unmeasured k.
            t_draft = (time.perf_counter() - t0) * n_draft_commands / len(commands)
        result = sampling.decode_accept(words)
        n_acc, k_eff = result["n_accepted"], result["k_eff"]
        self.kv.commit(n_acc + 1)  # t_{n-1} and the accepted drafts
        if draft is not None and k > 0 and not draft.shares_cache:
            # Keep the draft's rows for the fed tokens the committed sequence confirms: all it
            # was fed before drafting, plus the accepted drafts it was fed (never the last).
            fed = draft.model.kv.pending - k + 1
            draft.model.kv.commit(min(fed + min(n_acc, k - 1), draft.model.kv.pending))
        return (verify.Verdict(n_acc, result["tokens"]), k_eff, t_draft,
                time.perf_counter() - t0 - t_draft)

    # --- encoding -----------------------------------------------------------------------------
    def _verify_dispatches(self, mode: str, threshold: float) -> list:
        """The champion's choices and the accept kernel, all on the champion's step slot."""
        key = (mode == "rejection", threshold)
        if key not in self._tail:
            dev, champ, vocab = self.dev, self.champion, self.vocab
            step = champ.steps.binding(SLOT_CHAMPION)
            if mode == "rejection":
                first = sampling.softmax_rows(dev, champ.logits, self.p_target, self.conf, step,
                                              vocab=vocab)
            else:
                first = sampling.argmax_rows(dev, champ.logits, self.choice, self.conf, step,
                                             vocab=vocab)
            self._tail[key] = [first, sampling.accept(
                dev, self.choice, self.p_target, self.q_draft, (champ.tokens, 1), self.draft_conf,
                self.out, step, vocab=vocab, conf_threshold=threshold, pos_shift=1)]
        return self._tail[key]

    def _encode_draft(self, draft: GPUDraft, tokens: list[int], k: int, mode: str, opts,
                      commands: list) -> int:
        """Append the k draft steps to `commands`; returns k (0 when the draft cannot run)."""
        model, dev, steps = draft.model, self.dev, self.champion.steps
        if draft.shares_cache:
            feed = tokens[-1:]  # the champion's cache holds every committed token but the last
        else:
            model.kv.rollback()
            feed = tokens[model.kv.committed:]
            if (len(feed) > ROWS_MAX
                    or model.kv.committed + len(feed) + k - 1 > model.kv.max_ctx):
                return 0  # the draft has fallen behind or is full: the champion goes on alone
        draft.calls += k
        dev.write(draft.feed_tokens, np.asarray(feed, np.uint32))
        for i in range(k):
            rows = len(feed) if i == 0 else 1
            pos = model.kv.append(rows)
            slot = _draft_slot(i)
            steps.set(slot, rows=rows, pos=pos, seed=opts.seed, temperature=opts.temperature,
                      mode=mode)
            commands += self._draft_step(draft, slot, mode)
            # The token for position n + i is in row rows - 1 of the step's samples.
            last = rows - 1
            commands.append(Copy(self.d_sample, 4 * last, self.champion.tokens, 4 * (1 + i), 4))
            commands.append(Copy(self.d_conf, 4 * last, self.draft_conf, 4 * i, 4))
            if mode == "rejection":
                v4 = 4 * self.vocab
                commands.append(Copy(self.d_probs, v4 * last, self.q_draft, v4 * i, v4))
            if i + 1 < k:
                commands.append(Copy(self.d_sample, 4 * last, draft.feed_tokens, 0, 4))
        return k

    def _draft_step(self, draft: GPUDraft, slot: int, mode: str) -> list:
        """One draft forward on `slot` and its sampler (cached per slot and mode)."""
        key = (id(draft), slot, mode == "rejection")
        if key not in self._draft_plans:
            dev, model, vocab = self.dev, draft.model, self.vocab
            step = self.champion.steps.binding(slot)
            plan = list(model.forward_dispatches(slot, draft.layers, draft.feed_tokens))
            if mode == "rejection":
                plan += [sampling.softmax_rows(dev, model.logits, self.d_probs, self.d_conf, step,
                                               vocab=vocab),
                         sampling.sample_rows(dev, self.d_probs, self.d_sample, step, vocab=vocab,
                                              stream=rng.STREAM_DRAFT)]
            else:
                plan.append(sampling.argmax_rows(dev, model.logits, self.d_sample, self.d_conf,
                                                 step, vocab=vocab))
            self._draft_plans[key] = plan
        return self._draft_plans[key]
