"""The speculative cycle, written once over an executor (docs/architecture.md).

A cycle that starts with n committed tokens t_0..t_{n-1} (the champion's cache holds the rows of
the first n - 1: the last emitted token is fed at the start of the next cycle):
  1. draft: up to k tokens d_1..d_k for positions n..n+k-1 (fewer when the drafter has no
     proposal or its confidence drops below the rule's threshold);
  2. champion pass: ONE forward over [t_{n-1}, d_1..d_k] at positions n-1..n+k-1; row i gives
     the logits for position n + i;
  3. accept: verify.py's rule for the mode keeps a prefix of the drafts and adds one champion
     token, the correction at the first rejection or the bonus from row k;
  4. read the verdict and commit: the champion keeps the rows of t_{n-1} and the accepted drafts
     (n_accepted + 1), a draft with its own cache keeps the rows it can prove (`draft_rows_kept`).

A tree cycle (--tree) drafts a TreeProposal instead of a chain, verifies it in one pass and walks
it (`tree_verdict`: rules/tree.py's walks); its commit keeps the accepted path's rows.

`submit` runs steps 1-3 and returns the executor's handle; `collect` reads the verdict and
commits. The numpy executor (cpu.py) evaluates each step as it is called and its handle holds the
verdict already; the GPU executor (gpu/backend.py) records dispatches and submits once, so a
caller may encode the next cycle before it awaits the last one's readback.

Not here: the loop, stop rules and text (engine.py), the rules themselves (verify.py), the
schedule (schedule.py), and how an executor runs a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .rules import processors as proc
from .rules import rng, verify
from .rules import tree as tree_rules

VERIFY_MODES = ("greedy", "replay", "rejection")


@dataclass
class Proposal:
    """A drafter's proposal (step 1 on the host): the drafted tokens and the distributions they
    were drawn from."""

    tokens: list[int] = field(default_factory=list)       # (k,)
    q_draft: list[np.ndarray | None] = field(default_factory=list)  # k rows (vocab,); None = one-hot

    def q_matrix(self, vocab: int) -> np.ndarray:
        """(k, vocab) float64: the draft distributions, one-hot rows for deterministic proposals."""
        q = np.zeros((len(self.tokens), vocab))
        for i, (t, row) in enumerate(zip(self.tokens, self.q_draft)):
            if row is None:
                q[i, t] = 1.0
            else:
                q[i] = row
        return q


@dataclass
class TreeProposal:
    """A drafted tree and, per node, the law it was drawn from given its parent's path and its
    earlier siblings (None: deterministic, a one-hot row)."""

    tree: tree_rules.Tree
    q_sibling: list[np.ndarray | None] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return list(self.tree.tokens)

    def q_matrix(self, vocab: int) -> np.ndarray:
        """(N, vocab) float64, one-hot rows for deterministic nodes."""
        q = np.zeros((len(self.tree), vocab))
        for i, (t, row) in enumerate(zip(self.tree.tokens, self.q_sibling)):
            q[i] = np.eye(1, vocab, t)[0] if row is None else row
        return q


class BadDraftError(verify.VerifyInputError):
    """A drafter's logits no rule can use (NaN or +inf: corrupt draft weights). The engine goes
    on champion-only (a bad draft costs speed, never the request) and records the fault."""

    code = "bad_draft"


@dataclass(frozen=True)
class Rule:
    """How tokens are chosen this request: the verify mode, its sampling parameters, the
    confidence threshold below which drafting stops (0: never), and the logits processors
    (processors.py, in their fixed order) that turn the champion's raw rows into the target's.
    With processors the target at a position is the processed row for its context (prefix +
    the drafts before it), so `verdict` needs the committed tokens."""

    mode: str
    temperature: float = 0.0
    seed: int = 0
    conf_threshold: float = 0.0
    processors: tuple = field(default=(), compare=False)

    def stops(self, confidence: float) -> bool:
        """THE confidence stop: the block ends before the first draft whose confidence is below
        the threshold. CPU drafters stop their loop here; on the GPU the accept kernel applies
        the same comparison to the confidences the draft steps wrote (shaders/accept.wgsl)."""
        return confidence < self.conf_threshold

    def choose(self, logits: np.ndarray, position: int,
               context: list[int] | None = None) -> tuple[int, np.ndarray | None, float]:
        """A drafter's token from its logits (vocab,) at `position`: (token, q_draft row or None
        for one-hot, confidence). The confidence is the draft's top probability, a function of
        its distribution only, never of the sampled token: a stop that looked at the sampled
        token would draft some tokens more often than others and break rejection sampling.
        Given its `context` (the tokens before `position`), a drafter's row goes through the
        request's processors too, so it drafts from the processed distribution (better
        acceptance; any q is exact, since verification sees the q it sampled from)."""
        if np.isnan(logits).any() or np.isposinf(logits).any():
            # Only a broken draft gets here (a champion's rows are checked where they are judged).
            raise BadDraftError(
                "the draft model's logits are NaN or +inf (its weights may be corrupt): check "
                "or download the draft again, or run without it (draft ngram or none)")
        if self.processors and context is not None:
            logits = proc.apply_all(self.processors, logits[None, :], context, [])[0]
        if self.mode == "greedy":
            token = int(np.argmax(logits))
            return token, None, float(verify.softmax(logits, 1.0)[token])
        probs = verify.softmax(logits, self.temperature)                  # (vocab,)
        confidence = float(probs.max())
        if self.mode == "replay":
            # Coupled with the champion: the same Gumbel noise it will use at this position.
            gumbel = rng.gumbel(self.seed, position, logits.shape[0])
            return verify.sample_replay(logits, self.temperature, gumbel), None, confidence
        u = rng.uniform(self.seed, position, rng.STREAM_DRAFT)
        return verify.sample_categorical(probs, u), probs, confidence

    def target(self, logits: np.ndarray, prefix: list[int], drafts: list[int]) -> np.ndarray:
        """The rows the rule judges: the raw logits (k+1, vocab) through the processors, row i
        with its own context prefix + drafts[:i] (the raw rows themselves when there are none)."""
        if not self.processors:
            return logits
        return proc.apply_all(self.processors, logits, prefix, drafts)

    def verdict(self, logits: np.ndarray, drafts: list[int], q_draft: np.ndarray | None,
                prefix: list[int]) -> verify.Verdict:
        """The rule over the raw logits (k+1, vocab) for positions n..n+k after the committed
        tokens `prefix` (n = len(prefix)), processed row by row (`target`), with the random
        numbers keyed by those positions (rng.py); q_draft (k, vocab) is for rejection only."""
        n = len(prefix)
        logits = self.target(logits, prefix, drafts)
        drafts = np.asarray(drafts, dtype=np.int64)
        k, vocab = len(drafts), logits.shape[1]
        if self.mode == "greedy":
            return verify.verify_greedy(logits, drafts)
        if self.mode == "replay":
            gumbel = np.stack([rng.gumbel(self.seed, n + i, vocab) for i in range(k + 1)])
            return verify.verify_replay(logits, drafts, self.temperature, gumbel)
        u_accept, u_residual = ([rng.uniform(self.seed, n + i, s) for i in range(k)]
                                for s in (rng.STREAM_ACCEPT, rng.STREAM_RESIDUAL))
        return verify.verify_rejection(verify.softmax(logits, self.temperature), q_draft, drafts,
                                       u_accept, u_residual,
                                       rng.uniform(self.seed, n + k, rng.STREAM_BONUS))


def tree_verdict(rule: Rule, logits: np.ndarray, proposal: TreeProposal,
                 n: int) -> tuple[verify.Verdict, tuple[int, ...]]:
    """The rule's walk over the champion's rows (1 + N, vocab) of a tree after n committed
    tokens, with its random numbers keyed by position (rules/tree.py says how): the verdict and
    the accepted path (node indices). Processors are refused with trees (engine.py), so the
    rows are the raw logits."""
    tree = proposal.tree
    depth = int(tree.depths().max()) if len(tree) else 0
    vocab = logits.shape[1]
    if rule.mode == "greedy":
        walked = tree_rules.walk_greedy(logits, tree)
    elif rule.mode == "replay":
        noise = rng.gumbel(rule.seed, n + np.arange(depth + 1), vocab)    # (D + 1, vocab)
        walked = tree_rules.walk_replay(logits, tree, rule.temperature, noise)
    else:
        ranks = np.zeros(len(tree), dtype=np.int64)
        for parent in set(tree.parents):
            kids = tree.children(parent)
            ranks[kids] = np.arange(len(kids))
        positions = n + np.arange(depth + 1)
        walked = tree_rules.walk_rejection(
            verify.softmax(logits, rule.temperature), tree, proposal.q_matrix(vocab),
            rng.uniforms(rule.seed, n + tree.depths() - 1, rng.STREAM_ACCEPT, ranks),
            rng.uniforms(rule.seed, positions, rng.STREAM_RESIDUAL, 0),
            rng.uniforms(rule.seed, positions, rng.STREAM_BONUS, 0))
    return verify.Verdict(walked.n_accepted, walked.tokens), walked.path


def draft_rows_kept(fed_before: int, drafts_fed: int, n_accepted: int) -> int:
    """The pending rows a draft's own cache keeps after a cycle: the rows of every token it was
    fed before drafting (all committed tokens), plus those of the drafts it was fed that were
    accepted. Never the last draft's (it is not fed: its logits would not be used), nor a row
    for the correction or bonus token, which the draft has not seen yet; it is fed next cycle.
    Shared by the CPU model draft (drafters/model_draft.py) and the GPU draft (gpu/draft.py);
    `self:L` has no cache of its own (the champion's verify pass rewrites its rows)."""
    return fed_before + min(n_accepted, drafts_fed)


@dataclass
class Outcome:
    """What a collected cycle did."""

    verdict: verify.Verdict
    k: int               # drafts verified: after the drafter's shortfall and the confidence stop
    t_draft: float       # seconds of drafting (the guard's t_draft)
    t_verify: float      # seconds of the rest of the cycle (the guard's t_verify(k))
    committed: bool = False   # its rows were committed before it was read (pipelining)
    t_catch_up: float = 0.0   # seconds a draft model spent on tokens of cycles it sat out:
                              # drafting time in the stats, not the guard's per-token t_draft
    rows: list[int] | None = None   # a tree cycle's rows to keep: the root's and the accepted
                                    # path's slots (cpu/executor.py compacts them into place)
    nodes: int = 0       # a tree cycle's nodes (k is its depth); 0 for a chain
    moved: bool = False  # a tree cycle's rows are moved by moves its walk wrote on the device
                         # (gpu/tree.py): its commit only books them
    chain: tuple[int, int] | None = None   # a tree cycle's first branch: its drafts tested
                                           # and accepted (rules/tree.first_branch)


class Executor:
    """What the cycle needs from a backend. Besides the steps below, an executor has
    `adapter` (a name), `adapter_class` (the receipt's: receipts.ADAPTER_CLASSES), `champion`,
    `kv` (the champion's cache bookkeeping), `drafter` (the drafter it was built with, or None),
    `combo` (for `--draft ngram+MODEL`, the drafters.combo.Combo whose members the engine
    chooses between; its draft model is then the `drafter`), `k_max` (drafts one pass can
    verify), `timing` (per-request counters for the stats), and `prefill(prompt, start,
    should_stop, drafter)` (awaited; it resets the request's `drafter`). The drafter of a
    cycle is passed in (`submit`): a request may draft with another one (a schema's forced
    drafts around it, one member of a combination). Byte accounting is shared here."""

    k_max = 64
    combo = None

    def _take(self, drafter):
        """The drafter a loader made, as the backend holds it: a combination's draft model
        active, the combination kept in `combo`."""
        if getattr(drafter, "kind", None) == "combo":
            self.combo = drafter
            return drafter.model
        return drafter

    # --- the cycle's steps (see the module docstring) ---------------------------------------
    def record(self, drafter, k: int):
        """Start a cycle drafted by `drafter` (None: champion-only) with up to k drafts; returns
        the recording the steps below are given and `submit` ends."""
        raise NotImplementedError

    def draft(self, rec, tokens: list[int], k: int, rule: Rule):
        """Step 1; returns the drafts in the executor's own form (host tokens, or None for
        drafts that stay on the device); how many were proposed is the recording's `k`."""
        raise NotImplementedError

    def champion_pass(self, rec, last: int | None, drafts) -> None:
        """Step 2: drop the rows left pending (a self:L draft's), then one pass over
        [last] + drafts at the cache's next positions."""
        raise NotImplementedError

    def accept(self, rec, drafts, tokens: list[int], rule: Rule) -> None:
        """Step 3: the rule for `rule.mode` over the pass's rows, for positions n..n+k after
        the n committed `tokens` (the processors' context)."""
        raise NotImplementedError

    def submit(self, rec):
        """End the cycle's encoding; returns a handle for `read` (with its `k`)."""
        raise NotImplementedError

    def pipelines(self, rule: Rule) -> bool:
        """Whether this executor can submit a champion-only cycle before the one in flight is
        read (`submit_after(handle, rule)`, and `drop(handle)` for one never read)."""
        return False

    def drafts_ahead(self, rule: Rule, drafter) -> bool:
        """Whether `drafter` drafts on this executor's device, so that a speculative cycle too
        can be submitted before the one in flight is read (`submit_ahead(tokens, k, rule,
        limit, drafter)`)."""
        return False

    async def read(self, handle) -> Outcome:
        """Await the verdict of a submitted cycle."""
        raise NotImplementedError

    def commit(self, outcome: Outcome, drafter) -> None:
        """Step 4: keep the champion's rows for t_{n-1} and the accepted drafts, and the
        draft's confirmed rows."""
        if not outcome.committed:
            self.kv.commit(outcome.verdict.n_accepted + 1)
        if drafter is not None:
            drafter.confirm(outcome.verdict.n_accepted)

    def close(self) -> None:
        """Free what the executor allocated for itself now (GPU buffers: gpu/backend.py); a
        numpy executor's arrays go with their last reference, so by default nothing."""

    # --- byte accounting --------------------------------------------------------------------
    def scratch_bytes(self, rows: int, logit_rows: int) -> int:
        return self.champion.scratch_bytes(rows, logit_rows)

    @property
    def weight_bytes(self) -> int:
        return self.champion.weight_bytes + (self.drafter.weight_bytes if self.drafter else 0)

    @property
    def kv_bytes(self) -> int:
        return self.kv.nbytes + (self.drafter.kv_bytes if self.drafter else 0)


def submit(ex: Executor, tokens: list[int] | None, k: int, rule: Rule, drafter, rec=None):
    """Encode one cycle for the committed `tokens` with up to k drafts by `drafter`; returns its
    handle. `rec`: a recording the executor started itself, for a cycle that goes ahead of the
    one in flight (tokens None: it goes on from what the device holds; gpu/backend.py)."""
    k = min(k, ex.k_max)
    rec = ex.record(drafter, k) if rec is None else rec
    drafts = ex.draft(rec, tokens, k, rule)                   # d_1..d_k for positions n..n+k-1
    ex.champion_pass(rec, tokens[-1] if tokens else None, drafts)   # rows [t_{n-1}, d_1..d_k]
    ex.accept(rec, drafts, tokens, rule)                      # row i decides position n + i
    return ex.submit(rec)


async def collect(ex: Executor, handle, drafter) -> Outcome:
    """Read a submitted cycle's verdict and commit what it kept."""
    outcome = await ex.read(handle)
    ex.commit(outcome, drafter)
    return outcome
