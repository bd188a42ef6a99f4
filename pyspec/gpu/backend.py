"""The GPU executor of the speculative cycle (cycle.py): one submission and one small
readback per cycle.

The cycle's steps record commands into a Recording (gpu/recording.py) instead of running them:
  draft          the cycle's draft source (gpu/sources.py) encodes the drafts and the pass's
                 input: a host proposal, a draft on the device (gpu/draft.py), n-gram looked up
                 on the device, a draft fed from the cycle before, or none;
  champion_pass  the champion's forward over [t_{n-1}, d_1..d_k] at positions n-1..n+k-1;
  accept         the request's processors on the device (gpu/processors.py), the champion's
                 choices (argmax_rows for greedy / replay, softmax_rows for rejection) and the
                 accept kernel, which applies verify.py's rule and the confidence stop and writes
                 n_accepted and the tokens; or, where a processor has no device step, the rows
                 gathered for the host accept (gpu/hostaccept.py); for a tree's pass, its rows'
                 choices walked on the device (greedy, replay) or its rows gathered for the
                 host's walk (rejection: gpu/tree.py);
  submit         the recorded commands, in one queue submission, ending with a copy of what
                 `read` needs into a staging buffer of its own (device.stage), so a later cycle
                 may be submitted before it is read; `read` awaits the readback.
Step slots: 0 is the champion pass (its sampler and accept kernel share it: they key row r's
random numbers at pos + 1 + r), 1 + i is draft step i.

Going ahead (pipelining): a cycle that needs nothing from the host is submitted before the one
in flight is read. A champion-only cycle needs only its input token, the one the cycle before
emits (`submit_after`: copied on the device from its accept words), and its Step (copied on the
device from a template and a table of positions: gpu/after.py); n-gram drafts looked up on
the device (chains, and trees walked on the device: gpu/tree.py) and a draft model fed on the
device (its chains, and its trees of fixed widths: gpu/ahead.py) need nothing either
(`submit_ahead`). The host encodes cycle n + 1 while the GPU runs cycle n. A cycle never read
(the request ended: EOS, a stop string, max_tokens, a cancel or a fault) is dropped with its
pending rows (`drop`). A cycle goes ahead only when the one in flight cannot reach the end of
the budget or the context.
How a backend runs its cycles is its `Paths` (gpu/paths.py), fixed when it is built.
Not here: the kernels (ops.py, sampling.py), the forward's dispatch list (model.py).
"""

from __future__ import annotations

import functools
import time

import numpy as np

from .. import cycle, gctime
from ..cycle import Executor, Outcome, Rule
from ..drafters.ngram import NgramDrafter
from ..drafters.tree import TreeDrafter
from ..rules import verify
from . import hostaccept, sampling, tree, treedraft
from .after import StepTemplate
from .ahead import DeviceFeed
from .device import ROWS_MAX, count_commands
from .draft import GPUDraft, draft_slot, step_plan
from .model import GPUModel
from .ngram import DeviceNgram
from .paths import Paths
from .processors import DeviceProcessors
from .recording import Recording
from .sources import (DeviceDraft, DeviceLookup, FedDraft, FedTree, FromBefore, HostProposal,
                      TreeLookup)
from .step import N_SLOTS, SLOT_CHAMPION

K_GPU_MAX = N_SLOTS - 1   # drafts one pass can verify
PREFILL_BLOCK = 8 * ROWS_MAX  # prompt rows between cancel checks (a readback each)
HOST_SAMPLES = 256   # cycles per request whose host time the timing keeps one by one (_count)


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
    takes_trees = True   # it verifies a TreeProposal in one pass (gpu/tree.py)

    def __init__(self, champion: GPUModel, drafter=None, max_ctx: int | None = None, *,
                 owned: list | None = None, **paths):
        """`drafter`: what load.make_drafter built (a GPUDraft, a host drafter, a Combo, or
        None), and `owned` what it made on the device; `paths`: Paths fields given (the rest
        from the adapter)."""
        # What this backend makes, here and in the plans its cycle steps build later (_owning),
        # is its own, and `close` frees it; a model's plans stay the model's
        # (GPUModel.forward_dispatches), so a champion lent to the next engine keeps its own.
        self._owned: list = list(owned or [])
        with champion.dev.owned(self._owned):
            self._build(champion, drafter, max_ctx, Paths.for_device(champion.dev, **paths))

    def _build(self, champion: GPUModel, drafter, max_ctx: int | None, paths: Paths) -> None:
        champion.limit_context(max_ctx)
        self.champion = champion
        self.dev = dev = champion.dev
        self.adapter = dev.name
        self.adapter_class = dev.adapter_class
        self.device_class = dev.device_class
        self.paths = paths
        self.drafter = self._take(drafter)
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
        self.host_rows = dev.buffer(hostaccept.rows_bytes(vocab), label="host_accept.rows")
        self.tree_picks = dev.buffer(ROWS_MAX * ROWS_MAX * 4, label="tree.picks")   # (R, R) u32
        self.processors = DeviceProcessors(self)
        self._tail: dict[tuple, list] = {}
        self.draft_plans: dict[tuple, list] = {}   # gpu/draft.step_plan's
        self._t_read = 0.0              # when the last cycle's readback ended
        self._submitted_before = 0      # the device's submissions when the decode began
        self._read_before = (0, 0)      # ... and its readbacks and their bytes
        self._gc_last = (0.0, 0, 0)     # ... and the collector's totals (gctime.snapshot)
        self._lookup = None             # gpu/ngram.DeviceNgram, made at the first looked-up cycle
        self._feed = None               # gpu/ahead.DeviceFeed, made at the first fed draft cycle
        self._template = None           # gpu/after.StepTemplate, at the first champion-only cycle
        self.timing: dict = {}
        self._compaction = None         # gpu/tree.Compaction, made at the first tree cycle
        self._warm()

    tree_kinds = ("ngram", "model")   # the drafters whose trees it takes (tree_refusal)

    def tree_refusal(self, shape, rule: Rule, kind: str | None) -> str | None:
        """Why a request's trees cannot run here, or None: a draft model's tree that does not
        grow on the device (gpu/treedraft.grows) grows a depth a pass with each pass's logits
        read back at once, which needs an adapter that reads back synchronously (not the
        page's)."""
        grows = (self.paths.device_trees and shape != "auto"
                 and rule.mode in treedraft.DEVICE_MODES)
        if kind != "model" or self.dev.reads_now or grows:
            return None
        return (f"tree {'auto' if shape == 'auto' else ','.join(map(str, shape))} with a "
                f"draft model under {rule.mode} grows a depth a pass, reading each back at once, "
                f"which the {self.adapter} adapter cannot do (a page's WebGPU reads back only "
                "asynchronously): give fixed widths (e.g. 2,2,1) under greedy or replay, whose "
                "trees grow on the device, or draft with ngram")

    @property
    def split_rows(self) -> bool:
        return self.paths.split_rows

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
                step_plan(self, self.drafter, draft_slot(0), mode)

    def lookup(self) -> DeviceNgram:
        """The device's n-gram history, made at the first looked-up cycle."""
        if self._lookup is None:
            self._lookup = DeviceNgram(self.dev, self.kv.max_ctx, self.out, self.champion.tokens)
        return self._lookup

    def feed(self) -> DeviceFeed:
        """The device feed of a draft model's cycles, made at the first such cycle."""
        if self._feed is None:
            self._feed = DeviceFeed(self.dev, self.kv.max_ctx, self.out,
                                    self.drafter.feed_tokens, self.champion.tokens)
        return self._feed

    @property
    def kv(self):
        """The champion's cache bookkeeping (engines sharing one GPU model share it too)."""
        return self.champion.kv

    async def prefill(self, prompt: list[int], start: int = 0, should_stop=None,
                      drafter=None) -> None:
        """Commit the rows of prompt[start:-1] after the `start` rows kept (cpu.CPUBackend's
        contract), and reset `drafter` for the request. With should_stop, it waits for each
        PREFILL_BLOCK rows and asks between blocks; when told to stop, the rows committed so far
        stay valid."""
        # Per request: host time encoding and submitting cycles vs time awaiting their readback.
        # Where each cycle's drafts were made (stats' draft_path): sampled or looked up on the
        # device inside the cycle's submission, or proposed on the host and written up.
        self.timing = {"cycles": 0, "host_s": 0.0, "wait_s": 0.0, "readbacks": 0,
                       "readback_bytes": 0, "ahead": 0,
                       "submissions": 0, "drafted_on_device": 0, "drafted_on_host": 0,
                       "host_s_cycles": [], "host_s_alone": [], "gc_s": 0.0,
                       "gc_collections": 0, "gc_full": 0, "gc_s_cycles": []}
        gctime.install()
        self._gc_last = gctime.snapshot()
        if self._compaction is not None and self._compaction.pending:   # the last tree's moves
            self.dev.submit(self._compaction.take())
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
        if drafter is not None:
            drafter.reset(prompt)
        if isinstance(drafter, TreeDrafter):   # its plans before its first cycle, which is timed
            with self.dev.owned(self._owned):
                tree.warm(self, drafter)
        # Wait for the prefill here, so that it is timed as prefill and not as the first cycle
        # (nothing to wait for when every row was kept: a conversation's next turn).
        if self.dev.submissions != submitted:
            await self.dev.read(self.out, 16)
        self._submitted_before = self.dev.submissions   # the decode's submissions count after
        self._read_before = (self.dev.readbacks, self.dev.read_bytes)

    # --- the cycle's steps (cycle.py) ---------------------------------------------------------
    def record(self, drafter, k: int) -> Recording:
        if isinstance(drafter, TreeDrafter):
            return Recording(tree.TreeSource(drafter), time.perf_counter())
        source = (DeviceDraft(drafter) if isinstance(drafter, GPUDraft) and k > 0
                  else HostProposal(drafter))
        return Recording(source, time.perf_counter())

    @_owning
    def draft(self, rec: Recording, tokens: list[int] | None, k: int, rule: Rule):
        return rec.source.encode(self, rec, tokens, k, rule, rec.limit)

    def champion_pass(self, rec: Recording, last: int | None, drafts) -> None:
        rec.pass_at = count_commands(rec.commands)
        rec.commands.append(self.champion.forward_dispatches(   # a plan, built once
            SLOT_CHAMPION, tree=rec.tree is not None))

    @_owning
    def accept(self, rec: Recording, drafts, tokens: list[int] | None, rule: Rule) -> None:
        k, on_device, tokens = rec.k, rec.on_device, tokens or []
        if rec.tree is not None:   # walked on the device, or its rows on the host (gpu/tree.py)
            tree.accept(self, rec, tokens, rule)
            return
        found = self.processors.plan(rule, on_device)
        if found is None:
            self.champion.steps.set(SLOT_CHAMPION, rows=k + 1, pos=rec.pos, seed=rule.seed,
                                    temperature=rule.temperature, n_draft=k, mode=rule.mode,
                                    one_hot=True)
            rec.commands.append(hostaccept.gather(self, k, on_device, rule.mode == "rejection"))
            rec.host = (drafts, list(tokens), rule)
            return
        one_hot = True
        if rule.mode == "rejection":
            if on_device:
                one_hot = False  # the draft steps copied their q_draft rows on the GPU
            elif drafts is not None and any(q is not None for q in drafts.q_draft):
                one_hot = False  # a sampling host drafter: its q_draft rows go up now
                self.dev.write(self.q_draft, drafts.q_matrix(self.vocab).astype(np.float32))
        # (A looked-up cycle's Step is the lookup's: a copy overwrites the slot on the device.)
        self.champion.steps.set(SLOT_CHAMPION, rows=k + 1, pos=rec.pos or 0, seed=rule.seed,
                                temperature=rule.temperature, n_draft=k, mode=rule.mode,
                                one_hot=one_hot)
        if k == 0 and rec.slots:   # champion-only: the Step copied on the device (gpu/after.py)
            copies = self.step_template().copies(rec.pos)
            rec.commands[:0], rec.pass_at, rec.slots = copies, rec.pass_at + len(copies), 0
        # The confidence stop of GPU drafts is applied by the accept kernel (drafts past the
        # first low-confidence one count as never proposed), keeping the cycle on the GPU.
        threshold = rule.conf_threshold if on_device else 0.0
        before, after = self.processors.encode(found, rule, tokens, drafts, k)
        rec.commands += [*before, self._verify_dispatches(rule.mode, threshold), *after]

    def submit(self, rec: Recording) -> Recording:
        if self._compaction is not None:   # a tree cycle's accepted rows, moved first
            rec.commands[:0] = self._compaction.take()
        if rec.tree is not None:
            readback = self.dev.stage(*tree.staged(self, rec))
        elif rec.host is not None:
            with_q = rec.on_device and rec.host[2].mode == "rejection" and rec.k > 0
            readback = self.dev.stage(self.host_rows,
                                      hostaccept.readback_bytes(self.vocab, rec.k, with_q))
        else:
            readback = self.dev.stage(self.out, 4 * sampling.ACCEPT_WORDS)
        rec.commands.append(readback.copy)
        if rec.slots:   # only the slots this cycle reads (one queue write: in the page, a call)
            self.champion.steps.upload(rec.slots)
        self.dev.submit(rec.commands)
        self.dev.expect(readback)
        if rec.tree is not None and rec.tree.chosen:   # its walk wrote the moves: next, them
            self.compaction().walked()
        # One submission gives one time. For GPU drafts split it by command count (encoding and
        # dispatch overhead dominate a small model's pass): the guard needs the draft's cost per
        # token apart from the champion's to predict an unmeasured k.
        rec.share = rec.pass_at / count_commands(rec.commands) if rec.on_device else 0.0
        rec.commands, rec.readback, rec.t_submit = [], readback, time.perf_counter()
        if rec.ahead:
            self.timing["ahead"] += 1
        return rec

    async def read(self, rec: Recording) -> Outcome:
        t_wait = time.perf_counter()
        raw = await self.dev.redeem(rec.readback)
        t_read = time.perf_counter()
        walked = None
        if rec.tree is not None:
            walked = tree.verdict(self, rec, raw)
            verdict, k_eff, t_end = walked.verdict, walked.depth, time.perf_counter()
            if rec.looked_up:   # its rows, where the device put them: after the committed ones
                self.kv.append(1 + walked.nodes)
        elif rec.host is not None:
            verdict, k_eff = hostaccept.verdict(rec, raw, self.vocab)
            t_end = time.perf_counter()
            self.timing["host_accept_s"] = (self.timing.get("host_accept_s", 0.0)
                                            + t_end - t_read)
        else:
            result = sampling.decode_accept(np.frombuffer(raw, np.uint32, sampling.ACCEPT_WORDS))
            verdict = verify.Verdict(result["n_accepted"], result["tokens"])
            k_eff, t_end = result["k_eff"], t_read
            if rec.looked_up:   # its rows, where the device put them: after the committed ones
                self.kv.append(k_eff + 1)
        self._count(rec, t_read - t_wait, t_end - t_read)
        t0 = self._cycle_start(rec, t_end)
        t_draft = (t_end - t0) * rec.share if rec.on_device else rec.t_draft
        if walked is None:
            return Outcome(verdict, k_eff, t_draft, t_end - t0 - t_draft, rec.committed)
        return Outcome(verdict, k_eff, t_draft, t_end - t0 - t_draft, rows=walked.rows,
                       nodes=walked.nodes, moved=walked.moved, chain=walked.chain)

    def commit(self, outcome: Outcome, drafter) -> None:
        """A tree cycle keeps the root's and the accepted path's rows, moved into place at the
        start of the next submission (gpu/tree.Compaction: moves its walk on the device wrote,
        or the host's); a chain's, cycle.Executor's."""
        if outcome.rows is None:
            return super().commit(outcome, drafter)
        if outcome.moved:
            self.compaction().kept(outcome.rows)
        else:
            self.compaction().move(outcome.rows)
        if drafter is not None:
            drafter.confirm(outcome.verdict.n_accepted)

    def step_template(self) -> StepTemplate:
        """The champion's Step of champion-only cycles, made at the first such cycle."""
        if self._template is None:
            self._template = StepTemplate(self.dev, self.champion.steps, SLOT_CHAMPION,
                                          self.champion.capacity)
        return self._template

    def compaction(self) -> tree.Compaction:
        """The champion's tree compaction, made at the first tree cycle."""
        if self._compaction is None:
            self._compaction = tree.Compaction(self.champion)
        return self._compaction

    def _cycle_start(self, rec: Recording, t_end: float) -> float:
        """When a cycle's own time began, for the guard: its encoding, or, for a cycle submitted
        while the one before was in flight, that one's readback (the time between readbacks is
        what a pipelined cycle costs)."""
        t0, self._t_read = max(rec.t0, self._t_read), t_end
        return t0

    def _count(self, rec: Recording, wait_s: float, host_after_s: float = 0.0) -> None:
        """Per-request timing: host time encoding and submitting (and, for host accept, the rule)
        vs time blocked on the readback (with pipelining the GPU runs the cycle before while the
        host encodes, so the two need not add up to the wall time). The first HOST_SAMPLES
        cycles' host times are kept one by one, for medians, and apart those of the cycles
        encoded while no other was in flight (`host_s_alone`): on a software adapter the GPU is
        threads on the same cores, and while it runs the cycle before they take the host's."""
        self.timing["cycles"] += 1
        # The device's own counts since the decode began: a cycle that reads more than once (a
        # tree grown a depth a pass on the host) shows it.
        self.timing["readbacks"] = self.dev.readbacks - self._read_before[0]
        self.timing["readback_bytes"] = self.dev.read_bytes - self._read_before[1]
        self.timing["submissions"] = self.dev.submissions - self._submitted_before
        if rec.k:
            where = "device" if rec.on_device or rec.looked_up else "host"
            self.timing[f"drafted_on_{where}"] += 1
        self.timing["wait_s"] += wait_s
        host_s = rec.t_submit - rec.t0 + host_after_s
        self.timing["host_s"] += host_s
        # the collector's time since the cycle before was counted (its host time may hold it)
        gc_now = gctime.snapshot()
        gc_s = gc_now[0] - self._gc_last[0]
        for key, i in (("gc_s", 0), ("gc_collections", 1), ("gc_full", 2)):
            self.timing[key] += gc_now[i] - self._gc_last[i]
        self._gc_last = gc_now
        if len(self.timing["host_s_cycles"]) < HOST_SAMPLES:
            self.timing["host_s_cycles"].append(host_s)
            self.timing["gc_s_cycles"].append(gc_s)
            if not rec.ahead:
                self.timing["host_s_alone"].append(host_s)

    def choices(self) -> list:
        """The champion's choice per row of its pass into `choice` (argmax_rows: the argmax, or
        the replay sample), on the champion's step slot (a plan, built once)."""
        if "choices" not in self._tail:
            champ = self.champion
            self._tail["choices"] = sampling.argmax_rows(
                self.dev, champ.logits, self.choice, self.conf,
                champ.steps.binding(SLOT_CHAMPION), vocab=self.vocab, want_conf=False,
                split=self.split_rows)
        return self._tail["choices"]

    def _verify_dispatches(self, mode: str, threshold: float) -> list:
        """The champion's choices and the accept kernel, all on the champion's step slot."""
        key = (mode == "rejection", threshold)
        if key not in self._tail:
            dev, champ, vocab, split = self.dev, self.champion, self.vocab, self.split_rows
            step = champ.steps.binding(SLOT_CHAMPION)
            if mode == "rejection":
                first = sampling.softmax_rows(dev, champ.logits, self.p_target, self.conf, step,
                                              vocab=vocab, split=split)
            else:
                first = self.choices()
            self._tail[key] = [*first, *sampling.accept(
                dev, self.choice, self.p_target, self.q_draft, (champ.tokens, 1), self.draft_conf,
                self.out, step, vocab=vocab, conf_threshold=threshold, pos_shift=1,
                split=mode == "rejection" and sampling.row_split(dev, split))]
        return self._tail[key]

    # --- going ahead (see the module docstring) -------------------------------------------------
    def pipelines(self, rule: Rule) -> bool:
        """Whether champion-only cycles under `rule` may be submitted ahead (`submit_after`):
        every processor runs on the device, and none needs the host each cycle (a schema's mask
        does: it follows the tokens)."""
        plan = self.processors.plan(rule, False)
        return self.paths.pipelined and plan is not None and plan[0] is None

    def submit_after(self, prev: Recording, rule: Rule) -> Recording:
        """The champion-only cycle after `prev` (submitted, not yet read), fed by the token
        prev emits, copied on the device. Commits prev's row now (gpu/sources.FromBefore)."""
        if prev.k or prev.host is not None or prev.committed or self.kv.pending != 1:
            raise ValueError("only a champion-only cycle on the device can be followed before "
                             "it is read")
        self.kv.commit(1)
        prev.committed = True
        rec = Recording(FromBefore(), time.perf_counter())
        return cycle.submit(self, None, 0, rule, None, rec)

    def drop(self, rec: Recording) -> None:
        """A submitted cycle that will never be read: its staging buffer back, its row gone
        (and a tree's moves, which no later cycle needs)."""
        self.dev.release(rec.readback)
        if rec.tree is not None and rec.tree.chosen:   # the last submitted: its moves are next
            self._compaction.pending = []
        if not rec.committed and not rec.looked_up:
            self.kv.rollback()
        if rec.fed is not None:   # its draft-feed record, the last one made (newest first)
            rec.fed.dropped()

    def drafts_ahead(self, rule: Rule, drafter) -> bool:
        """Whether cycles of `drafter` under `rule` draft on the device and go ahead
        (`submit_ahead`): n-gram lookup or a draft model on the GPU, their trees under greedy
        or replay (walked on the device; a draft's of fixed widths), and the cycles pipeline."""
        d, paths = drafter, self.paths
        if isinstance(d, TreeDrafter):   # n-gram's, or a fed draft's of fixed widths
            return rule.mode in tree.CHOSEN_MODES and (
                paths.device_ngram and isinstance(d.inner, NgramDrafter) and self.pipelines(rule)
                or treedraft.grows(self, d, rule) and self.drafts_ahead(rule, d.inner))
        # (A draft with a shorter context than the champion's is fed from the host, which stops
        # its drafts at its own end; the device feed caps both at the champion's.)
        return ((paths.device_ngram and isinstance(d, NgramDrafter)
                 or paths.draft_ahead and isinstance(d, GPUDraft) and not d.shares_cache
                 and d.model.kv.max_ctx >= self.kv.max_ctx)
                and self.pipelines(rule))

    def submit_ahead(self, tokens: list[int] | None, k: int, rule: Rule, limit: int,
                     drafter) -> Recording:
        """A cycle of up to k drafts made on the device (gpu/sources.DeviceLookup, TreeLookup,
        FedDraft, FedTree).
        `tokens`: the committed ones, when no cycle is in flight (the device's state starts from
        them); None: after the cycle in flight. `limit`: the most tokens the request may hold
        (prompt + max_tokens); the drafts stop there and at the context's end."""
        source = (FedDraft(drafter) if isinstance(drafter, GPUDraft)
                  else DeviceLookup(drafter) if not isinstance(drafter, TreeDrafter)
                  else FedTree(drafter) if isinstance(drafter.inner, GPUDraft)
                  else TreeLookup(drafter))
        rec = Recording(source, time.perf_counter(), limit=limit)
        return cycle.submit(self, tokens, k, rule, drafter, rec)
