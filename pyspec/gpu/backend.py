"""The GPU executor of the speculative cycle (cycle.py, DESIGN §7): one submission and one small
readback per cycle.

The cycle's steps record commands instead of running them:
  draft          GPU drafters encode their steps: step i feeds its token(s), runs the draft
                 forward and samples the token for position n + i on the GPU (argmax, Gumbel
                 replay, or a q_draft sample); buffer copies carry it into the next step's input
                 and into row i + 1 of the champion's token list, with no CPU round trip. The
                 n-gram drafter, and a draft model with another vocabulary (drafters/bridge.py),
                 propose on the CPU; their tokens (and q rows) go up with the step data.
  champion_pass  the champion's forward over [t_{n-1}, d_1..d_k] at positions n-1..n+k-1;
  accept         the champion's choices (argmax_rows for greedy / replay, softmax_rows for
                 rejection) and the accept kernel, which applies verify.py's rule and the
                 confidence stop, and writes n_accepted and the tokens;
  submit         the recorded commands, in one queue submission; `read` awaits the readback.

Device processors, the default (a request whose processors are among the JSON-schema mask,
processors.Penalties and processors.Filters, in the chain's order): on the champion's logits
rows in place, before the champion's choices, so the readback stays the 68 accept words.
  penalize_rows  logit_bias and the repetition, presence and frequency penalties, from token
                 counts kept on the device (count_tokens adds each cycle's emitted tokens after
                 the accept kernel); the host sets the counts once per request.
  filter_rows    the mask, uploaded each cycle as bits (row i's after the drafts before it, so
                 the drafts must be the host's: forced tokens, n-gram), then at T > 0 top_k,
                 top_p and min_p (shaders/filter.wgsl: sort-free, its tie rules and rounding;
                 on a GPU split over each row, shaders/filter_split.wgsl, the same output).

Host accept, the fallback (any other processor, a mask with drafts sampled on the GPU, top_p
over more than 2^20 tokens, device_penalties / device_mask / device_filters turned off, and by
default the filters on a software adapter, where they measured slower): the accept step gathers
the champion's k+1 logits rows (and GPU drafts' tokens, confidences and, for rejection, q_draft
rows) into one buffer by copies in the same submission; `read` reads it back once and applies
the same numpy rule as cpu.py (cycle.Rule.verdict). Still one submission and one readback per
cycle, a larger one: (k + 1) * vocab floats (k * vocab more for rejection with a GPU draft). Its
cycles add `host_accept_s` to the request's backend timing; device masks add `mask_s` (host
time building and uploading the bits).

Step slots: 0 is the champion pass (its sampler and accept kernel share it: they key row r's
random numbers at pos + 1 + r), 1 + i is draft step i.

Readback: each cycle's submission ends with a copy of what `read` needs (the accept words, or
host accept's rows) into a staging buffer of its own (device.stage), so a later cycle may be
submitted before it is read.

Pipelined decoding (`pipelines`, `submit_after`): a champion-only cycle needs nothing from the
host but its input token, the one the cycle before emits. So cycle n + 1 is submitted before
cycle n is read, its token copied on the device from cycle n's accept words (the accept kernel
wrote them), and its step slot written after cycle n's submission (queue order keeps cycle n's
values for cycle n). A champion-only cycle keeps exactly one row whatever its verdict, so cycle
n's row is committed when n + 1 is submitted; a cycle never read (the request ended at cycle n:
EOS, a stop string, max_tokens, a cancel or a fault) is dropped with its pending row (`drop`).
The host encodes cycle n + 1 while the GPU runs cycle n.

Pipelined speculative cycles (`drafts_ahead`, `submit_ahead`): with the n-gram drafter, a cycle's
drafts are looked up on the device (gpu/ngram.py, shaders/ngram.wgsl) in a token history the
cycles before appended there from their accept words, so a speculative cycle needs nothing from
the host either and goes ahead like a champion-only one. Its first dispatch appends the tokens
the cycle before emitted, drafts up to the schedule's k (fewer at the budget and the context's
end), and writes the pass's token list and Step, which a copy puts in the champion's step slot:
positions and row counts follow the GPU's verdict, never the host's guess. The host learns a
cycle's position and length when it reads it, and commits its cache rows then; a cycle dropped
unread leaves no rows on the host's books (its device rows lie past the committed ones, never
read). A cycle goes ahead only when the one in flight cannot reach the end of the budget or the
context, so no cycle runs past either. A draft model on the GPU goes ahead the same way
(gpu/ahead.py, shaders/ahead.wgsl): the cycle's first dispatch takes the tokens the cycle before
emitted, feeds the draft's first step the last m committed tokens (m known to the host, see
gpu/ahead.py) and writes every Step of the cycle, the draft's steps' as well as the champion's.
Not here: the kernels (ops.py, sampling.py), the forward's dispatch list (model.py).
"""

from __future__ import annotations

import collections
import functools
import os
import time

import numpy as np

from ..cpu.model import Model
from ..cycle import Executor, Outcome, Rule, draft_rows_kept
from ..drafters import pairing
from ..drafters import (
    BridgedDrafter,
    Combo,
    DraftSpecError,
    Proposal,
    make_drafter,
    no_draft_model,
    parse_draft,
)
from ..drafters.eagle import is_eagle
from ..drafters.ngram import NgramDrafter
from ..formats.gguf import GGUFFile
from ..kv import rows_kept
from ..rules import rng, verify
from ..rules.jsonmask import JsonMask
from ..rules.processors import Filters, Penalties
from . import sampling
from .ahead import DeviceFeed
from .device import ROWS_MAX, Copy, count_commands
from .model import GPUModel
from .ngram import DeviceNgram
from .step import N_SLOTS, SLOT_CHAMPION

K_GPU_MAX = N_SLOTS - 1   # drafts one pass can verify
PREFILL_BLOCK = 8 * ROWS_MAX  # prompt rows between cancel checks (a readback each)
HOST_SAMPLES = 256   # cycles per request whose host time the timing keeps one by one (_count)


def _draft_slot(i: int) -> int:
    return 1 + i


class GPUDraft:
    """A drafter whose steps run on the GPU: the champion's first L layers (`self:L`, sharing the
    champion's cache) or an independent draft model with its own cache. The engine sees the
    drafter protocol (name, calls, reset, confirm); the backend encodes its steps."""

    def __init__(self, model: GPUModel, layers: int | None, name: str, shares_cache: bool):
        self.model = model
        self.layers = layers
        self.name = name
        self.kind = "self" if shares_cache else "model"
        self.shares_cache = shares_cache
        self.weight_bytes = 0 if shares_cache else model.weight_bytes
        self.kv_bytes = 0 if shares_cache else model.kv.nbytes
        self.calls = 0
        self.fed_before = 0     # pending rows of committed tokens fed this cycle
        self.drafts_fed = 0     # ... and of drafts (k - 1: the last draft is never fed)
        self.feed_tokens = model.dev.buffer(ROWS_MAX * 4, label=f"{name}.feed")   # (R,) u32
        self._held: tuple | None = None   # (cache epoch, tokens whose first rows it holds)
        # Cycles fed on the device (gpu/ahead.py): per cycle submitted and not yet confirmed,
        # the m of the cycle after it; None while cycles are fed from the host.
        self.ahead: collections.deque | None = None
        self.feed_rows = 0      # m of the next cycle fed on the device
        self.known = 0          # committed tokens after the cycles confirmed so far

    def reset(self, tokens: list[int]) -> None:
        """A new request for `tokens`: a draft with its own cache keeps the rows the last
        request left that still hold a prefix of them (a conversation's earlier turns, a
        repeated prompt; the forward is batch-invariant, so they are what a prefill would
        write) and prefills the rest."""
        self.fed_before = self.drafts_fed = 0
        self.ahead = None
        kv = self.model.kv
        if not self.shares_cache and len(tokens) <= kv.max_ctx:
            start = rows_kept(kv, *self._held, tokens) if self._held else 0
            self.model.prefill(tokens, _draft_slot(0), start)
            self._held = (kv.epoch, tokens)   # the engine's list: it grows as tokens commit

    def confirm(self, n_accepted: int) -> None:
        if self.ahead is not None:   # fed on the device: rows for all but the next cycle's m
            self.known += n_accepted + 1
            self.model.kv.rollback()
            self.model.kv.commit_to(self.known - self.ahead.popleft())
        elif not self.shares_cache:  # self:L's rows are the champion's, rewritten by its pass
            self.model.kv.commit(draft_rows_kept(self.fed_before, self.drafts_fed, n_accepted))
        self.fed_before = self.drafts_fed = 0

    def catch_up(self, tokens: list[int], slot: int) -> None:
        """Drop the pending rows; where the cache lacks more of the committed `tokens` than a pass
        holds (cycles without drafts do not feed it), prefill them, in a submission of their
        own."""
        kv = self.model.kv
        kv.rollback()
        if len(tokens) - kv.committed > ROWS_MAX:
            self.model.prefill(tokens, slot, kv.committed)

    def start_ahead(self, tokens: list[int], slot: int) -> None:
        """The first cycle fed on the device, for the committed `tokens`: m is what the cache
        lacks after catching up."""
        self.catch_up(tokens, slot)
        self.ahead, self.known = collections.deque(), len(tokens)
        self.feed_rows = len(tokens) - self.model.kv.committed

    def plan_ahead(self, k: int) -> tuple[int, bool]:
        """(m, whether the first step runs) for the next cycle fed on the device with k drafts;
        records the m of the cycle after it (gpu/ahead.py)."""
        m = self.feed_rows
        runs = k > 0 or m == ROWS_MAX   # a champion-only cycle skips the draft while m may grow
        self.feed_rows = 2 if k > 0 else 1 if runs else m + 1
        self.ahead.append(self.feed_rows)
        return m, runs


class ReadBackDraft:
    """A GPU draft that proposes to the host (the drafter protocol), for a request whose masks
    need the drafts on the host (a JSON schema): its k steps run in a submission of their own,
    their tokens (confidences; q_draft rows under rejection) are read back, and the cycle's
    verify pass is a second submission. The alternative is n-gram drafts (GPUBackend.
    schema_drafter chooses; bench/results/README.md has the measurement)."""

    def __init__(self, backend: "GPUBackend", draft: GPUDraft):
        self.backend, self.draft = backend, draft
        self.name, self.kind = draft.name, draft.kind
        self.weight_bytes, self.kv_bytes = draft.weight_bytes, draft.kv_bytes
        for attr in ("model", "layers"):   # what the receipt reads
            setattr(self, attr, getattr(draft, attr))

    @property
    def calls(self) -> int:
        return self.draft.calls

    def reset(self, tokens: list[int]) -> None:
        self.draft.reset(tokens)

    def propose(self, tokens: list[int], k: int, rule: Rule) -> Proposal:
        return self.backend._read_back_proposal(self.draft, tokens, k, rule)

    def confirm(self, n_accepted: int) -> None:
        self.draft.confirm(n_accepted)


class _OnDevice:
    """Drafts sampled on the GPU: their tokens are rows 1..k of the champion's token list."""

    def __init__(self, k: int):
        self.k = k


class _LookedUp:
    """Up to k n-gram drafts looked up on the GPU (gpu/ngram.py): rows 1.. of the champion's
    token list, with the pass's Step, written by the cycle's first dispatch."""

    def __init__(self, k: int):
        self.k = k


class _Cycle:
    """A submitted cycle: what `read` needs to time and decode it."""

    def __init__(self, k: int, gpu_draft: bool, share: float, t0: float, t_draft: float,
                 t_submit: float, readback):
        self.k, self.gpu_draft, self.share = k, gpu_draft, share
        self.t0, self.t_draft, self.t_submit = t0, t_draft, t_submit
        self.readback = readback   # device.Readback: its copy ended the cycle's submission
        self.host = None   # (drafts, tokens, rule) when the rule runs on the host
        self.committed = False     # its row was committed when the next cycle was submitted
        self.looked_up = False     # drafts and position from the device: rows appended on read
        self.fed = False           # a draft model's cycle fed on the device (gpu/ahead.py)
        self.ahead = False         # submitted while the cycle before was in flight (its host
                                   # time overlapped that cycle's GPU work)


def _device_processors(rule: Rule, on_device: bool) -> tuple | None:
    """(mask, penalties, filters), each None where absent, when every processor of the request
    has a device step; else None. The chain's order is JsonMask, Penalties, Filters
    (processors.py); the mask needs the drafts on the host (a row's mask depends on them)."""
    found = {JsonMask: None, Penalties: None, Filters: None}
    for p in rule.processors:
        if type(p) not in found or found[type(p)] is not None:
            return None
        found[type(p)] = p
    if found[JsonMask] is not None and on_device:
        return None
    return found[JsonMask], found[Penalties], found[Filters]


def _owning(step):
    """A cycle step whose plans, built the first time they are needed, are the backend's own."""
    @functools.wraps(step)
    def run(self, *args, **kw):
        with self.dev.owned(self._owned):
            return step(self, *args, **kw)
    return run


class GPUBackend(Executor):
    """The champion on a GPU device and its drafter; see the module docstring."""

    k_max = K_GPU_MAX
    device_penalties = True   # False: penalties take the host accept too (the benchmark's A/B)
    pipelined = True          # False: every cycle is read before the next is submitted (A/B)
    read_back_drafts = False  # under a schema, a GPU draft read back (two submissions) instead
                              # of n-gram drafts: off by measurement (bench/results/README.md)
    device_mask = True        # False: a JSON-schema mask takes the host accept (the A/B)
    device_ngram = True       # False: n-gram cycles draft on the host, read one at a time (A/B)
    # A draft model's cycles fed on the device, going ahead (gpu/ahead.py): True, False (fed
    # from the host, one at a time), or None: on a GPU, not on a software adapter, where the
    # GPU's threads share the host's cores and the device-fed cycles measured slower
    # (bench/results/lavapipe-draft-ahead.json)
    device_draft_ahead: bool | None = None
    # top_k / top_p / min_p on the device: True, False (the host accept), or None: on a GPU, not
    # on a software adapter, where the device's row searches measured slower than reading the
    # rows back (bench/results/mask-lavapipe.json)
    device_filters: bool | None = None
    # the per-row sampling kernels split over each row (argmax_parts + argmax_merge, softmax_parts
    # + softmax_write, sample_parts + sample_pick): True, False (one workgroup per row), or None:
    # on a GPU, not on a software adapter (sampling.py, shaders/sample.wgsl)
    split_rows: bool | None = None

    def __init__(self, champion: GPUModel, draft="ngram", max_ctx: int | None = None):
        """`draft` is a --draft spec (drafters.parse_draft) or a CPU drafter object."""
        # What this backend makes, here and in the plans its cycle steps build later (_owning),
        # is its own, and `close` frees it; a model's plans stay the model's
        # (GPUModel.forward_dispatches), so a champion lent to the next engine keeps its own.
        self._owned: list = []
        with champion.dev.owned(self._owned):
            self._build(champion, draft, max_ctx)

    def _build(self, champion: GPUModel, draft, max_ctx: int | None) -> None:
        champion.limit_context(max_ctx)
        self.champion = champion
        self.dev = dev = champion.dev
        self.adapter = dev.name
        self.adapter_class = dev.adapter_class
        self.drafter = self._take(self._make_drafter(draft) if isinstance(draft, str) else draft)
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
        # Host accept's gather: tokens (R,) u32 | conf (R,) f32 | logits (k+1, vocab) f32 |
        # q_draft (k, vocab) f32, packed after the logits rows of this cycle's k.
        self.host_rows = dev.buffer(4 * (2 * ROWS_MAX + (2 * ROWS_MAX - 1) * vocab),
                                    label="host_accept.rows")
        self._host = None               # (drafts, tokens, rule) of a host-accept cycle
        self._pen = None                # device penalties: (params, counts, bias, plans, rule)
        self._filt = None               # device mask and filters: (params, mask, plan, rule)
        self._tail: dict[tuple, list] = {}
        self._draft_plans: dict[tuple, list] = {}
        self._commands: list = []       # the cycle being recorded: commands and plans
        self._t0 = self._t_draft = 0.0
        self._t_read = 0.0              # when the last cycle's readback ended
        self._pass = (0, 0)             # (commands before it, first position): the champion pass
        self._pending = (0, False)      # (drafts, drafted on the GPU) of the recorded cycle
        self._lookup = None             # gpu/ngram.DeviceNgram, made at the first looked-up cycle
        self._feed = None               # gpu/ahead.DeviceFeed, made at the first fed draft cycle
        self._slots = 1                 # step slots the recorded cycle reads from the host
        self.timing: dict = {}
        self._warm()

    def close(self) -> None:
        """Free now what this backend made for itself: its per-cycle buffers, its plans'
        uniforms, a GPU draft's feed buffer, a draft model's weights, cache and plans, and the
        plans a self:L draft had the champion build over that feed buffer. The champion's own
        buffers and plans stay: another engine may be lent the model (web.make_engine). The
        backend runs no cycle afterwards."""
        owned, self._owned = self._owned, []
        if self.dev.lost is not None:   # a lost device's buffers went with it
            return
        d = self.drafter
        if isinstance(d, GPUDraft):
            d.model.forget_plans(d.feed_tokens if d.shares_cache else None)
        self.dev.free(owned)

    def _warm(self) -> None:
        """Build the plans a first cycle needs (compiling their pipelines) now, so that no
        cycle's timing, which the break-even guard reads, carries a one-time cost."""
        self.champion.forward_dispatches(SLOT_CHAMPION)
        for mode in ("greedy", "rejection"):
            self._verify_dispatches(mode, 0.0)
            if isinstance(self.drafter, GPUDraft):
                self._draft_step(self.drafter, _draft_slot(0), mode)

    def _make_drafter(self, spec: str, named: str | None = None):
        """The drafter for a draft spec; `named`: the spec as the user gave it (errors name it)."""
        champ = self.champion
        d = parse_draft(spec, champ.config.n_layers)
        if d.kind in ("none", "ngram"):
            return make_drafter(spec, champ)
        if d.kind == "combo":
            return Combo(make_drafter("ngram", champ),
                         self._make_drafter(str(d.model), named=spec))
        if d.kind == "self":
            return GPUDraft(champ, d.layers, spec, shares_cache=True)
        if d.path is None or not os.path.exists(d.path):
            raise no_draft_model(named or spec, d.path)
        f = GGUFFile.open(d.path)
        report = pairing.check_pair(champ.metadata, f.metadata)
        report.raise_if_bad()
        pairing.bind_borrowed(f, champ.file)   # its embedding may be the champion's
        if is_eagle(f.metadata):
            raise DraftSpecError(f"draft {spec!r} is an EAGLE-style head: it reads the "
                                 "champion's states, which only the numpy engine keeps so far "
                                 "(backend cpu); on a GPU use ngram or a draft model")
        if report.bridge is not None:
            # Another vocabulary: the GPU draft steps sample champion ids directly, so a bridged
            # draft runs on the host (numpy), like n-gram: its tokens and q rows go up per cycle.
            return BridgedDrafter(Model(f), report.bridge, champ.kv.max_ctx)
        model = GPUModel(self.dev, f, champ.steps, champ.kv.max_ctx, label="draft", lender=champ)
        return GPUDraft(model, None, f"model:{d.path}", shares_cache=False)

    @property
    def kv(self):
        """The champion's cache bookkeeping (engines sharing one GPU model share it too)."""
        return self.champion.kv

    async def prefill(self, prompt: list[int], start: int = 0, should_stop=None) -> None:
        """Commit the rows of prompt[start:-1] after the `start` rows kept (cpu.CPUBackend's
        contract). With should_stop, it waits for each PREFILL_BLOCK rows and asks between
        blocks; when told to stop, the rows committed so far stay valid."""
        # Per request: host time encoding and submitting cycles vs time awaiting their readback.
        self.timing = {"cycles": 0, "host_s": 0.0, "wait_s": 0.0, "readbacks": 0, "ahead": 0,
                       "host_s_cycles": [], "host_s_alone": []}
        self.kv.truncate(start)
        end = len(prompt) - 1
        submitted = self.dev.submissions
        block = PREFILL_BLOCK if should_stop is not None else max(end, 1)
        for i in range(start, max(end, start + 1), block):
            if i > start:
                await self.dev.read(self.out, 16)  # the block before has run: a cancel is due now
                if should_stop():
                    return
            self.champion.prefill(prompt, SLOT_CHAMPION, i, min(i + block, end))
        self._reset_drafters(prompt)
        # Wait for the prefill here, so that it is timed as prefill and not as the first cycle
        # (nothing to wait for when every row was kept: a conversation's next turn).
        if self.dev.submissions != submitted:
            await self.dev.read(self.out, 16)

    # --- the cycle's steps (cycle.py) ---------------------------------------------------------
    @_owning
    def draft(self, tokens: list[int], k: int, rule: Rule):
        self._t0 = time.perf_counter()
        self._commands, self._slots = [], 1
        if isinstance(self.drafter, GPUDraft) and k > 0:
            return _OnDevice(self._encode_draft(self.drafter, tokens, k, rule))
        # A CPU drafter (n-gram, or any drafter object a caller brings).
        proposal = (self.drafter.propose(tokens, k, rule) if k > 0 and self.drafter
                    else Proposal())
        del proposal.tokens[k:], proposal.q_draft[k:]
        self._t_draft = time.perf_counter() - self._t0
        return proposal

    def champion_pass(self, last: int, drafts) -> None:
        champ = self.champion
        self.kv.rollback()  # a self:L draft left rows here; the champion pass rewrites them
        if isinstance(drafts, _OnDevice):  # draft tokens arrive by copy; row 0 from the CPU
            pos = self.kv.append(drafts.k + 1)
            self.dev.write(champ.tokens, np.array([last], np.uint32))
        else:
            pos = champ.feed([last] + drafts.tokens, SLOT_CHAMPION)
        self._pass = (count_commands(self._commands), pos)
        self._commands.append(champ.forward_dispatches(SLOT_CHAMPION))  # a plan, built once

    @_owning
    def accept(self, drafts, tokens: list[int], rule: Rule) -> None:
        on_device = isinstance(drafts, _OnDevice)
        k = drafts.k if isinstance(drafts, (_OnDevice, _LookedUp)) else len(drafts.tokens)
        self._host = None
        on_gpu = self._device_plan(rule, on_device)
        if on_gpu is None:
            self.champion.steps.set(SLOT_CHAMPION, rows=k + 1, pos=self._pass[1], seed=rule.seed,
                                    temperature=rule.temperature, n_draft=k, mode=rule.mode,
                                    one_hot=True)
            self._commands.append(self._gather(k, on_device, rule.mode == "rejection"))
            self._host = (drafts, list(tokens), rule)
            self._pending = (k, on_device)
            return
        one_hot = True
        if rule.mode == "rejection":
            if on_device:
                one_hot = False  # the draft steps copied their q_draft rows on the GPU
            elif not isinstance(drafts, _LookedUp) and any(q is not None for q in drafts.q_draft):
                one_hot = False  # a sampling CPU drafter: its q_draft rows go up now
                self.dev.write(self.q_draft, drafts.q_matrix(self.vocab).astype(np.float32))
        # (A looked-up cycle's Step is the lookup's: a copy overwrites the slot on the device.)
        self.champion.steps.set(SLOT_CHAMPION, rows=k + 1, pos=self._pass[1] or 0, seed=rule.seed,
                                temperature=rule.temperature, n_draft=k, mode=rule.mode,
                                one_hot=one_hot)
        # The confidence stop of GPU drafts is applied by the accept kernel (drafts past the
        # first low-confidence one count as never proposed), keeping the cycle on the GPU.
        threshold = rule.conf_threshold if on_device else 0.0
        mask, pen, filters = on_gpu
        if pen is not None:
            penalize, count = self._penalties(rule, pen, tokens)
            self._commands.append(penalize)
        if mask is not None or filters is not None:
            self._commands.append(self._filters(rule, mask, filters, tokens, drafts, k))
        self._commands.append(self._verify_dispatches(rule.mode, threshold))
        if pen is not None:
            self._commands.append(count)
        self._pending = (k, on_device)

    def submit(self) -> _Cycle:
        commands, (k, on_device) = self._commands, self._pending
        if self._host is not None:
            _, tokens, rule = self._host
            with_q = on_device and rule.mode == "rejection" and k > 0
            nbytes = 4 * (2 * ROWS_MAX + (2 * k + 1 if with_q else k + 1) * self.vocab)
            readback = self.dev.stage(self.host_rows, nbytes)
        else:
            readback = self.dev.stage(self.out, 4 * sampling.ACCEPT_WORDS)
        commands.append(readback.copy)
        if self._slots:   # only the slots this cycle reads (one queue write: in the page, a call)
            self.champion.steps.upload(self._slots)
        self.dev.submit(commands)
        self.dev.expect(readback)
        # One submission gives one time. For GPU drafts split it by command count (encoding and
        # dispatch overhead dominate a small model's pass): the guard needs the draft's cost per
        # token apart from the champion's to predict an unmeasured k.
        share = self._pass[0] / count_commands(commands) if on_device else 0.0
        self._commands = []
        c = _Cycle(k, on_device, share, self._t0, 0.0 if on_device else self._t_draft,
                   time.perf_counter(), readback)
        c.host, self._host = self._host, None
        return c

    async def read(self, c: _Cycle) -> Outcome:
        if c.host is not None:
            return await self._read_host(c)
        t_wait = time.perf_counter()
        raw = await self.dev.redeem(c.readback)
        words = np.frombuffer(raw, np.uint32, sampling.ACCEPT_WORDS)
        t_end = time.perf_counter()
        self._count(c, t_end - t_wait)
        t0 = self._cycle_start(c, t_end)
        t_draft = (t_end - t0) * c.share if c.gpu_draft else c.t_draft
        result = sampling.decode_accept(words)
        verdict = verify.Verdict(result["n_accepted"], result["tokens"])
        if c.looked_up:   # its rows, where the device put them: right after the committed ones
            self.kv.append(result["k_eff"] + 1)
        return Outcome(verdict, result["k_eff"], t_draft, t_end - t0 - t_draft, c.committed)

    def _cycle_start(self, c: _Cycle, t_end: float) -> float:
        """When a cycle's own time began, for the guard: its encoding, or, for a cycle submitted
        while the one before was in flight, that one's readback (the time between readbacks is
        what a pipelined cycle costs)."""
        t0, self._t_read = max(c.t0, self._t_read), t_end
        return t0

    def _count(self, c: _Cycle, wait_s: float, host_after_s: float = 0.0) -> None:
        """Per-request timing: host time encoding and submitting (and, for host accept, the rule)
        vs time blocked on the readback (with pipelining the GPU runs the cycle before while the
        host encodes, so the two need not add up to the wall time). The first HOST_SAMPLES
        cycles' host times are kept one by one, for medians, and apart those of the cycles
        encoded while no other was in flight (`host_s_alone`): on a software adapter the GPU is
        threads on the same cores, and while it runs the cycle before they take the host's."""
        self.timing["cycles"] += 1
        self.timing["readbacks"] += 1
        self.timing["wait_s"] += wait_s
        host_s = c.t_submit - c.t0 + host_after_s
        self.timing["host_s"] += host_s
        if len(self.timing["host_s_cycles"]) < HOST_SAMPLES:
            self.timing["host_s_cycles"].append(host_s)
            if not c.ahead:
                self.timing["host_s_alone"].append(host_s)

    # --- pipelined decoding (see the module docstring) ------------------------------------------
    def pipelines(self, rule: Rule) -> bool:
        """Whether champion-only cycles under `rule` may be submitted ahead (`submit_after`):
        every processor runs on the device, and none needs the host each cycle (a schema's mask
        does: it follows the tokens)."""
        plan = self._device_plan(rule, False)
        return self.pipelined and plan is not None and plan[0] is None

    def submit_after(self, prev: _Cycle, rule: Rule) -> _Cycle:
        """The champion-only cycle after `prev` (submitted, not yet read), fed by the token
        prev emits, copied on the device. Commits prev's row now (see the module docstring)."""
        if prev.k or prev.host is not None or prev.committed or self.kv.pending != 1:
            raise ValueError("only a champion-only cycle on the device can be followed before "
                             "it is read")
        self.kv.commit(1)
        prev.committed = True
        self.timing["ahead"] += 1
        self._t0, self._t_draft, self._commands, self._slots = time.perf_counter(), 0.0, [], 1
        pos = self.kv.append(1)
        self._commands.append(Copy(self.out, 4 * sampling.ACCEPT_TOKENS,
                                   self.champion.tokens, 0, 4))
        self._pass = (count_commands(self._commands), pos)
        self._commands.append(self.champion.forward_dispatches(SLOT_CHAMPION))
        self.accept(Proposal(), [], rule)   # the context matters only at a request's first cycle
        c = self.submit()
        c.ahead = True
        return c

    def drop(self, c: _Cycle) -> None:
        """A submitted cycle that will never be read: its staging buffer back, its row gone."""
        self.dev.release(c.readback)
        if not c.committed and not c.looked_up:
            self.kv.rollback()
        if c.fed:   # its draft-feed record, the last one made (cycles are dropped newest first)
            self.drafter.ahead.pop()

    # --- pipelined speculative cycles (see the module docstring) --------------------------------
    def drafts_ahead(self, rule: Rule) -> bool:
        """Whether cycles under `rule` draft on the device and go ahead (`submit_ahead`): the
        drafter is n-gram lookup or a draft model on the GPU, and the cycles pipeline."""
        fed = (not self.dev.is_cpu if self.device_draft_ahead is None
               else self.device_draft_ahead)
        d = self.drafter
        # (A draft with a shorter context than the champion's is fed from the host, which stops
        # its drafts at its own end; the device feed caps both at the champion's.)
        return ((self.device_ngram and isinstance(d, NgramDrafter)
                 or fed and isinstance(d, GPUDraft) and not d.shares_cache
                 and d.model.kv.max_ctx >= self.kv.max_ctx)
                and self.pipelines(rule))

    @_owning
    def submit_ahead(self, tokens: list[int] | None, k: int, rule: Rule, limit: int) -> _Cycle:
        """A cycle of up to k drafts looked up on the device. `tokens`: the committed ones, when
        no cycle is in flight (the device's history starts from them); None: after the cycle in
        flight, from the history it extends. `limit`: the most tokens the request may hold
        (prompt + max_tokens); the drafts stop there and at the context's end."""
        if isinstance(self.drafter, GPUDraft):
            return self._submit_draft_ahead(tokens, k, rule, limit)
        if self._lookup is None:
            self._lookup = DeviceNgram(self.dev, self.kv.max_ctx, self.out, self.champion.tokens)
        lookup = self._lookup
        # No step slot from the host: the lookup writes the champion's (the copy below).
        self._t0, self._t_draft, self._commands, self._slots = time.perf_counter(), 0.0, [], 0
        if tokens is not None:
            self.kv.rollback()
            lookup.start(tokens)
        else:
            self.timing["ahead"] += 1
        k = min(k, self.k_max)
        if k:
            self.drafter.calls += 1
        lookup.set(k, limit, rule.seed, rule.temperature, rule.mode)
        self._commands += [lookup.plan, lookup.step_copy(self.champion.steps, SLOT_CHAMPION)]
        self._pass = (count_commands(self._commands), None)
        self._commands.append(self.champion.forward_dispatches(SLOT_CHAMPION))
        self.accept(_LookedUp(k), tokens or [], rule)
        c = self.submit()
        c.looked_up, c.ahead = True, tokens is None
        return c

    def _submit_draft_ahead(self, tokens: list[int] | None, k: int, rule: Rule,
                            limit: int) -> _Cycle:
        """submit_ahead with a draft model on the GPU (gpu/ahead.py): the cycle's first
        dispatch writes its Steps and the draft's feed from the verdict of the one before."""
        draft = self.drafter
        if self._feed is None:
            self._feed = DeviceFeed(self.dev, self.kv.max_ctx, self.out, draft.feed_tokens,
                                    self.champion.tokens)
        feed = self._feed
        self._t0, self._t_draft, self._commands, self._slots = time.perf_counter(), 0.0, [], 0
        if tokens is not None:
            self.kv.rollback()
            draft.start_ahead(tokens, _draft_slot(0))
            feed.start(tokens)
        else:
            self.timing["ahead"] += 1
        k = min(k, self.k_max)
        m, runs = draft.plan_ahead(k)
        steps = max(k, int(runs))
        feed.set(k, m, limit, rule.seed, rule.temperature, rule.mode,
                 one_hot=rule.mode != "rejection" or k == 0)
        self._commands += [feed.plan, feed.steps_copy(self.champion.steps, 1 + steps)]
        draft.calls += k
        for i in range(steps):
            self._commands.append(self._draft_step(draft, _draft_slot(i), rule.mode))
            self._draft_copies(draft, i, k, m - 1 if i == 0 else 0, rule.mode)
        self._pass = (count_commands(self._commands), None)
        self._commands.append(self.champion.forward_dispatches(SLOT_CHAMPION))
        self.accept(_OnDevice(k), tokens or [], rule)
        c = self.submit()
        c.looked_up, c.ahead, c.fed = True, tokens is None, True
        return c

    # --- device processors --------------------------------------------------------------------
    def _device_plan(self, rule: Rule, on_device: bool) -> tuple | None:
        """(mask, penalties, filters) for a cycle whose processors all run on the device (no
        processors: all None), or None for the host accept."""
        if not rule.processors:
            return None, None, None
        found = _device_processors(rule, on_device)
        if found is None:
            return None
        mask, pen, filters = found
        device_filters = (not self.dev.is_cpu if self.device_filters is None
                          else self.device_filters)
        if ((pen is not None and not self.device_penalties)
                or (mask is not None and not self.device_mask)
                or (filters is not None and not device_filters)):
            return None
        if filters is not None and filters.top_p < 1.0 and self.vocab > sampling.TOP_P_VOCAB_MAX:
            return None
        return found

    def _filters(self, rule: Rule, mask, filters, tokens: list[int], drafts, k: int):
        """The filter plan (shaders/filter.wgsl); at a request's first cycle (a new Rule)
        its parameters, and every cycle the k + 1 rows' masks (row i after the drafts before
        it), uploaded as bits: ceil(vocab / 32) words a row."""
        dev, vocab = self.dev, self.vocab
        if self._filt is None:
            params = sampling.filter_params(dev, vocab)
            words = dev.buffer(4 * ROWS_MAX * sampling.mask_words(vocab), label="filter.mask")
            weights = dev.buffer(4 * ROWS_MAX * vocab, label="filter.weights")  # (R, vocab) f32
            plan = sampling.filter_rows(dev, params, self.champion.logits, words, weights,
                                        self.champion.steps.binding(SLOT_CHAMPION), vocab=vocab,
                                        split=self.split_rows)
            self._filt = [params, words, plan, None]
        params, words, plan, current = self._filt
        if current is not rule:
            f = filters or Filters(rule.temperature)
            sampling.set_filters(dev, params, vocab, mask is not None, f.top_k, f.top_p, f.min_p)
            self._filt[3] = rule
        if mask is not None:
            t0 = time.perf_counter()
            dev.write(words, mask.words(tokens, drafts.tokens, k + 1, vocab))   # (k+1, words)
            self.timing["mask_s"] = self.timing.get("mask_s", 0.0) + time.perf_counter() - t0
        return plan

    def _penalties(self, rule: Rule, pen: Penalties, tokens: list[int]) -> tuple:
        """The penalize and count dispatches; at a request's first cycle (a new Rule), its
        counts (from the committed tokens: prompt and resumed ids), bias and parameters."""
        dev, vocab = self.dev, self.vocab
        if self._pen is None:
            params = sampling.penalty_params(dev, vocab)
            counts = dev.buffer(8 * vocab, label="penalize.counts")     # (2, vocab) u32
            bias = dev.buffer(4 * vocab, label="penalize.bias")         # (vocab,) f32
            step = self.champion.steps.binding(SLOT_CHAMPION)
            plans = (sampling.penalize_rows(dev, params, self.champion.logits, counts, bias,
                                            self.champion.tokens, step, vocab=vocab),
                     sampling.count_tokens(dev, params, self.out, counts, step, vocab=vocab))
            self._pen = [params, counts, bias, plans, None]
        params, counts, bias, plans, current = self._pen
        if current is not rule:   # a new request: its counts and parameters
            seq = np.asarray(tokens, dtype=np.int64)
            table = np.stack([np.bincount(seq, minlength=vocab),
                              np.bincount(seq[pen.prompt_len:], minlength=vocab)])  # (2, vocab)
            dev.write(counts, table.astype(np.uint32))
            if pen.bias is not None:
                dev.write(bias, pen.bias.astype(np.float32))
            sampling.set_penalties(dev, params, vocab, pen.repetition, pen.presence,
                                   pen.frequency, pen.bias is not None)
            self._pen[4] = rule
        return plans

    # --- host accept --------------------------------------------------------------------------
    def _gather(self, k: int, on_device: bool, rejection: bool) -> list:
        """Copies of what the host rule needs into host_rows (see __init__ for the layout)."""
        r, v4, dst = ROWS_MAX, 4 * self.vocab, self.host_rows
        out = [Copy(self.champion.logits, 0, dst, 8 * r, (k + 1) * v4)]
        if on_device and k:
            out += [Copy(self.champion.tokens, 0, dst, 0, 4 * (k + 1)),
                    Copy(self.draft_conf, 0, dst, 4 * r, 4 * k)]
            if rejection:
                out.append(Copy(self.q_draft, 0, dst, 8 * r + (k + 1) * v4, k * v4))
        return out

    async def _read_host(self, c: _Cycle) -> Outcome:
        """One readback of the gathered rows, then the numpy rule (cycle.Rule.verdict)."""
        drafts, tokens, rule = c.host
        k, r, vocab = c.k, ROWS_MAX, self.vocab
        with_q = c.gpu_draft and rule.mode == "rejection" and k > 0
        nbytes = c.readback.nbytes
        t_wait = time.perf_counter()
        raw = await self.dev.redeem(c.readback)
        t_read = time.perf_counter()
        words = np.frombuffer(raw, np.uint32, 2 * r)
        floats = np.frombuffer(raw, np.float32, (nbytes - 8 * r) // 4, 8 * r)
        logits = floats[:(k + 1) * vocab].reshape(k + 1, vocab).astype(np.float64)
        if c.gpu_draft:
            draft_tokens = [int(t) for t in words[1:k + 1]]
            conf = words[r:r + k].view(np.float32)
            # The confidence stop (the accept kernel's on the device path): drafts past the
            # first low-confidence one count as never proposed.
            low = np.flatnonzero(conf < rule.conf_threshold)
            k_eff = int(low[0]) if low.size else k
            q = (floats[(k + 1) * vocab:].reshape(k, vocab)[:k_eff].astype(np.float64)
                 if with_q else None)
            # The draft kernel sampled by inverse CDF against the row's own f32 total, so its
            # q is the row over that total: renormalised in float64 here.
            q = q / q.sum(axis=1, keepdims=True) if q is not None else None
        else:
            draft_tokens, k_eff = drafts.tokens, k
            q = drafts.q_matrix(vocab) if rule.mode == "rejection" else None
        draft_tokens = draft_tokens[:k_eff]
        verdict = rule.verdict(logits[:k_eff + 1], draft_tokens, q, tokens)
        t_end = time.perf_counter()
        self._count(c, t_read - t_wait, t_end - t_read)
        self.timing["host_accept_s"] = self.timing.get("host_accept_s", 0.0) + t_end - t_read
        t0 = self._cycle_start(c, t_end)
        t_draft = (t_end - t0) * c.share if c.gpu_draft else c.t_draft
        return Outcome(verdict, k_eff, t_draft, t_end - t0 - t_draft)

    # --- encoding -----------------------------------------------------------------------------
    def _verify_dispatches(self, mode: str, threshold: float) -> list:
        """The champion's choices and the accept kernel, all on the champion's step slot."""
        key = (mode == "rejection", threshold)
        if key not in self._tail:
            dev, champ, vocab = self.dev, self.champion, self.vocab
            step = champ.steps.binding(SLOT_CHAMPION)
            if mode == "rejection":
                first = sampling.softmax_rows(dev, champ.logits, self.p_target, self.conf, step,
                                              vocab=vocab, split=self.split_rows)
            else:
                first = sampling.argmax_rows(dev, champ.logits, self.choice, self.conf, step,
                                             vocab=vocab, want_conf=False,
                                             split=self.split_rows)
            self._tail[key] = [*first, *sampling.accept(
                dev, self.choice, self.p_target, self.q_draft, (champ.tokens, 1), self.draft_conf,
                self.out, step, vocab=vocab, conf_threshold=threshold, pos_shift=1,
                split=mode == "rejection" and sampling.row_split(dev, self.split_rows))]
        return self._tail[key]

    def schema_drafter(self):
        """The drafter a schema request wraps (its masks are host data, so drafts must reach the
        host before the verify pass): a host drafter as it is; a GPU draft read back in a
        submission of its own where `read_back_drafts` is on and the device can wait for a
        readback synchronously (natively; not in the page), else n-gram lookup."""
        d = self.drafter
        if d is None or not isinstance(d, GPUDraft):
            return d
        if self.read_back_drafts and self.dev.reads_now:
            return ReadBackDraft(self, d)
        return NgramDrafter()

    @_owning
    def _read_back_proposal(self, draft: GPUDraft, tokens: list[int], k: int,
                            rule: Rule) -> Proposal:
        """ReadBackDraft.propose: the draft's k steps, as in a cycle, in a submission that ends
        with copies of the drafted tokens, their confidences and (rejection) their q rows; then
        the one synchronous wait. The confidence stop is applied here, as the accept kernel
        would."""
        saved, self._commands = self._commands, []
        try:
            k = self._encode_draft(draft, tokens, min(k, self.k_max), rule)
            if k == 0:
                return Proposal()
            reads = [self.dev.stage(self.champion.tokens, 4 * (k + 1)),
                     self.dev.stage(self.draft_conf, 4 * k)]
            if rule.mode == "rejection":
                reads.append(self.dev.stage(self.q_draft, 4 * k * self.vocab))
            self._commands += [r.copy for r in reads]
            self.champion.steps.upload()
            self.dev.submit(self._commands)
            for r in reads:   # all three maps asked for at once: one wait for the GPU
                self.dev.expect(r)
            raw = [self.dev.redeem_now(r) for r in reads]
        finally:
            self._commands = saved
        drafted = np.frombuffer(raw[0], np.uint32, k + 1)[1:].tolist()
        conf = np.frombuffer(raw[1], np.float32, k)
        n = next((i for i in range(k) if rule.stops(float(conf[i]))), k)
        if rule.mode != "rejection":
            return Proposal(drafted[:n], [None] * n)
        q = np.frombuffer(raw[2], np.float32, k * self.vocab).reshape(k, self.vocab)
        return Proposal(drafted[:n], [row.astype(np.float64) for row in q[:n]])

    def _encode_draft(self, draft: GPUDraft, tokens: list[int], k: int, rule: Rule) -> int:
        """Record the k draft steps; returns k (0 when the draft cannot run)."""
        model, dev, steps, commands = draft.model, self.dev, self.champion.steps, self._commands
        mode = rule.mode
        if draft.shares_cache:
            feed = tokens[-1:]  # the champion's cache holds every committed token but the last
        else:
            if len(tokens) + k - 1 > model.kv.max_ctx:
                model.kv.rollback()
                return 0  # the draft is full: the champion goes on alone
            draft.catch_up(tokens, _draft_slot(0))
            feed = tokens[model.kv.committed:]
        draft.calls += k
        draft.fed_before, draft.drafts_fed = len(feed), k - 1
        self._slots = max(self._slots, _draft_slot(k - 1) + 1)
        dev.write(draft.feed_tokens, np.asarray(feed, np.uint32))
        for i in range(k):
            rows = len(feed) if i == 0 else 1
            pos = model.kv.append(rows)
            slot = _draft_slot(i)
            steps.set(slot, rows=rows, pos=pos, seed=rule.seed, temperature=rule.temperature,
                      mode=mode)
            commands.append(self._draft_step(draft, slot, mode))
            self._draft_copies(draft, i, k, rows - 1, mode)
        return k

    def _draft_copies(self, draft: GPUDraft, i: int, k: int, last: int, mode: str) -> None:
        """After draft step i of k: the token for position n + i, in row `last` of the step's
        samples, to the champion's token list and (unless it is the last draft) to the draft's
        feed; its confidence and, under rejection, its q row."""
        commands = self._commands
        commands.append(Copy(self.d_sample, 4 * last, self.champion.tokens, 4 * (1 + i), 4))
        commands.append(Copy(self.d_conf, 4 * last, self.draft_conf, 4 * i, 4))
        if mode == "rejection":
            v4 = 4 * self.vocab
            commands.append(Copy(self.d_probs, v4 * last, self.q_draft, v4 * i, v4))
        if i + 1 < k:
            commands.append(Copy(self.d_sample, 4 * last, draft.feed_tokens, 0, 4))

    def _draft_step(self, draft: GPUDraft, slot: int, mode: str) -> list:
        """One draft forward on `slot` and its sampler (cached per slot and mode)."""
        key = (id(draft), slot, mode == "rejection")
        if key not in self._draft_plans:
            dev, model, vocab = self.dev, draft.model, self.vocab
            step = self.champion.steps.binding(slot)
            plan = list(model.forward_dispatches(slot, draft.layers, draft.feed_tokens))
            if mode == "rejection":
                plan += sampling.softmax_rows(dev, model.logits, self.d_probs, self.d_conf, step,
                                              vocab=vocab, split=self.split_rows)
                plan += sampling.sample_rows(dev, self.d_probs, self.d_sample, step, vocab=vocab,
                                             stream=rng.STREAM_DRAFT, split=self.split_rows)
            else:
                plan += sampling.argmax_rows(dev, model.logits, self.d_sample, self.d_conf,
                                             step, vocab=vocab, split=self.split_rows)
            self._draft_plans[key] = plan
        return self._draft_plans[key]
