"""Logits processors: the sampling controls (logit_bias, penalties, top_k, top_p, min_p) as pure
functions of a logits row and the tokens before it, so that speculation stays exact under them.

The interface is `Processor.apply(logits, prefix, drafts)`: `logits` (r, vocab) are the champion's
raw rows for r consecutive positions, `prefix` the committed token ids (prompt + output so far),
`drafts` the block's draft ids; row i is the position after prefix + drafts[:i] (r <= len(drafts)
+ 1). It returns new float64 rows (r, vocab), -inf meaning "excluded", and never writes its input.

Why this keeps speculation exact: a processor's row i is a function of (raw row i, prefix +
drafts[:i]) only. In a verified block every row the rule looks at (up to the first rejection) has
a context made of committed tokens and accepted drafts, i.e. exactly the context champion-only
decoding has at that position, and its raw row is bit-identical (batch-invariant kernels). So
the processed row equals the one champion-only decoding computes there, and verify.py's
rules, which are exact for any target row, keep the processed distribution as the target: greedy
is argmax of the processed row, replay Gumbel-max over processed / T, rejection samples
softmax(processed / T) with excluded tokens at p = 0. Rows after a rejection are never used.

Temperature. The filters (top_k, top_p, min_p) are defined on softmax(logits / T) but return the
UNSCALED logits with the excluded tokens at -inf; the rule divides by T as it always has
(verify.softmax(row, T), sample_replay(row, T, gumbel)). Dividing once, in the rule, keeps a
request without processors bit-identical to before, and -inf / T is -inf. At T = 0 (greedy) the
filters are skipped: each keeps the argmax (lowest id among ties), so they cannot change it.

Fixed order: [the JSON-schema mask, first, so that every later step acts on the
allowed tokens only], logit_bias, repetition_penalty (prompt and output tokens, HF semantics),
presence_penalty and frequency_penalty (output tokens only, OpenAI semantics), then temperature,
top_k, top_p, min_p. Ties and boundaries, deterministic:
  top_k  keeps the k largest logits, ties broken by the lower id (a stable sort of -logits);
  top_p  orders tokens by probability descending, ties by lower id, and keeps the shortest prefix
         of that order whose cumulative mass (float64 cumsum in that order) is >= top_p; if
         rounding never reaches top_p, every token with p > 0 is kept;
  min_p  keeps tokens with p >= min_p * max(p).
Not here: choosing tokens (verify.py, cycle.Rule), the option checks' wording for the surfaces.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import PyspecError, about

N_CANDIDATES = 1024   # top_p sorts this many leading tokens first; the full vocab only if needed


class SamplingError(PyspecError, ValueError):
    """A sampling control out of range (the surfaces show its message)."""

    code = "bad_config"


class Processor:
    """A pure map of logits rows given their context; see the module docstring."""

    def apply(self, logits: np.ndarray, prefix: list[int], drafts: list[int]) -> np.ndarray:
        raise NotImplementedError


def contexts(prefix: list[int], drafts: list[int], rows: int):
    """The context of each row: prefix + drafts[:i] for i < rows (as one array and lengths)."""
    if rows > len(drafts) + 1:
        raise SamplingError(f"{rows} logits rows but only {len(drafts)} drafts: row i needs "
                            "the drafts before it, so rows <= len(drafts) + 1")
    # intp: bincount and fancy indexing take it on wasm32 (Pyodide), where it is int32
    seq = np.asarray(list(prefix) + list(drafts[:max(rows - 1, 0)]), dtype=np.intp)
    return seq, [len(prefix) + i for i in range(rows)]


class Chain(Processor):
    """Processors applied in order. The JSON-schema mask, when a request has one, comes FIRST
    (before logit_bias), so that top_k, top_p and min_p choose among the allowed tokens."""

    def __init__(self, processors=()):
        self.processors = tuple(processors)

    def apply(self, logits, prefix, drafts):
        out = np.array(logits, dtype=np.float64)  # (r, vocab), a copy: the input stays as it is
        for p in self.processors:
            out = p.apply(out, prefix, drafts)
        return out


def apply_all(processors, logits, prefix, drafts) -> np.ndarray:
    """Rows (r, vocab) through a tuple of processors in order (a copy even for none)."""
    return Chain(processors).apply(logits, prefix, drafts)


# ---------------------------------------------------------------------------------------------
# The elementwise steps: bias and penalties
# ---------------------------------------------------------------------------------------------
class Penalties(Processor):
    """logit_bias, then repetition_penalty over every token in the context (prompt and output),
    then presence and frequency penalties over the output tokens (those past `prompt_len`)."""

    def __init__(self, vocab: int, prompt_len: int, logit_bias: dict | None = None,
                 repetition_penalty: float = 1.0, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0):
        self.vocab, self.prompt_len = vocab, prompt_len
        self.bias = None
        if logit_bias:
            self.bias = np.zeros(vocab)   # (vocab,)
            for t, b in logit_bias.items():
                self.bias[int(t)] = float(b)
        self.repetition = float(repetition_penalty)
        self.presence = float(presence_penalty)
        self.frequency = float(frequency_penalty)

    def apply(self, logits, prefix, drafts):
        out = np.array(logits, dtype=np.float64)  # (r, vocab)
        seq, ends = contexts(prefix, drafts, out.shape[0])
        for i, end in enumerate(ends):
            row = out[i]
            if self.bias is not None:
                row += self.bias
            if self.repetition != 1.0:
                # HF: a token seen anywhere in the context, once however often: a positive
                # logit is divided by the penalty, a negative one multiplied.
                seen = np.unique(seq[:end])
                v = row[seen]
                row[seen] = np.where(v > 0, v / self.repetition, v * self.repetition)
            if self.presence or self.frequency:
                # OpenAI: logit -= count * frequency + (count > 0) * presence, output only.
                counts = np.bincount(seq[self.prompt_len:end], minlength=self.vocab)  # (vocab,)
                hit = np.flatnonzero(counts)
                row[hit] -= counts[hit] * self.frequency + self.presence
        return out


# ---------------------------------------------------------------------------------------------
# The filters: top_k, top_p, min_p on softmax(logits / T), returning unscaled logits
# ---------------------------------------------------------------------------------------------
def _probs(row: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(row / T) (vocab,) float64; -inf gives 0 (the same arithmetic as verify.softmax)."""
    with np.errstate(over="ignore"):
        z = (row - row.max()) / temperature
    e = np.exp(z)
    return e / e.sum()


def keep_top_k(row: np.ndarray, k: int) -> np.ndarray:
    """Bool (vocab,): the k largest logits, ties to the lower id."""
    vocab = row.shape[0]
    if k >= vocab:
        return np.ones(vocab, dtype=bool)
    # O(vocab), the same set as a stable sort of -row: all above the k-th largest value, then the
    # lowest ids among those equal to it.
    kth = np.partition(row, vocab - k)[vocab - k]
    keep = row > kth
    keep[np.flatnonzero(row == kth)[:k - int(keep.sum())]] = True
    return keep


def keep_top_p(p: np.ndarray, top_p: float) -> np.ndarray:
    """Bool (vocab,): the shortest prefix of the tokens by probability descending (ties to the
    lower id) whose cumulative mass is >= top_p. Exact with a shortcut: the leading
    N_CANDIDATES values (and every token tied with the last of them) are sorted first; their
    cumulative sums are the first terms of the full order's, so when they reach top_p the answer
    is the full sort's; otherwise the whole vocabulary is sorted."""
    vocab = p.shape[0]
    keep = np.zeros(vocab, dtype=bool)
    cand = np.arange(vocab)
    if vocab > N_CANDIDATES:
        floor = np.partition(p, vocab - N_CANDIDATES)[vocab - N_CANDIDATES]
        cand = np.flatnonzero(p >= floor)
    order = cand[np.argsort(-p[cand], kind="stable")]   # cand is ascending: ties to lower id
    mass = np.cumsum(p[order])
    reached = np.flatnonzero(mass >= top_p)
    if reached.size == 0 and order.size < vocab:
        order = np.argsort(-p, kind="stable")
        mass = np.cumsum(p[order])
        reached = np.flatnonzero(mass >= top_p)
    if reached.size == 0:   # rounding left the total below top_p: keep all with p > 0
        keep[p > 0] = True
    else:
        keep[order[:reached[0] + 1]] = True
    return keep


class Filters(Processor):
    """top_k, then top_p, then min_p (each on the survivors of the one before), at temperature T.
    Returns the rows with the excluded tokens at -inf, otherwise unscaled (the rule divides)."""

    def __init__(self, temperature: float, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.0):
        self.temperature, self.top_k, self.top_p, self.min_p = temperature, top_k, top_p, min_p

    def apply(self, logits, prefix, drafts):
        out = np.array(logits, dtype=np.float64)  # (r, vocab)
        if self.temperature <= 0:
            return out   # greedy: every filter keeps the argmax
        for row in out:
            if self.top_k:
                row[~keep_top_k(row, self.top_k)] = -np.inf
            if self.top_p < 1.0:
                row[~keep_top_p(_probs(row, self.temperature), self.top_p)] = -np.inf
            if self.min_p > 0.0:
                p = _probs(row, self.temperature)
                row[p < self.min_p * p.max()] = -np.inf
        return out


# ---------------------------------------------------------------------------------------------
# The request's controls
# ---------------------------------------------------------------------------------------------
@dataclass
class Sampling:
    """The sampling controls of a request, with the OpenAI-style names; defaults are "off"."""

    logit_bias: dict = field(default_factory=dict)   # token id -> added logit, in [-100, 100]
    repetition_penalty: float = 1.0                   # > 0; 1 = off
    presence_penalty: float = 0.0                     # [-2, 2]
    frequency_penalty: float = 0.0                    # [-2, 2]
    top_k: int = 0                                    # 0 = off
    top_p: float = 1.0                                # (0, 1]; 1 = off
    min_p: float = 0.0                                # [0, 1]; 0 = off

    def check(self, vocab: int | None = None) -> None:
        """Raise SamplingError (code bad_config) naming the control and its valid range."""
        def number(name, lo, hi, lo_open=False):
            v = getattr(self, name)
            ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)
                  and (v > lo if lo_open else v >= lo) and v <= hi)
            if not ok:
                side = "(" if lo_open else "["
                with about(name):
                    raise SamplingError(f"{name} must be a number in {side}{lo}, {hi}], "
                                        f"got {v!r}")

        number("repetition_penalty", 0, 1e6, lo_open=True)
        number("presence_penalty", -2, 2)
        number("frequency_penalty", -2, 2)
        number("top_p", 0, 1, lo_open=True)
        number("min_p", 0, 1)
        with about("top_k"):
            if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
                raise SamplingError(f"top_k must be an integer >= 0 (0 = off), got "
                                    f"{self.top_k!r}")
        with about("logit_bias"):
            self._check_logit_bias(vocab)

    def _check_logit_bias(self, vocab: int | None) -> None:
        if not isinstance(self.logit_bias, dict):
            raise SamplingError("logit_bias must be a map of token id -> bias in [-100, 100]")
        for t, b in self.logit_bias.items():
            try:
                tid = int(t)
            except (TypeError, ValueError):
                tid = None
            if tid is None or isinstance(t, bool) or str(tid) != str(t).strip() or tid < 0 or (
                    vocab is not None and tid >= vocab):
                top = f"[0, {vocab})" if vocab is not None else "the vocabulary"
                raise SamplingError(f"logit_bias key {t!r} is not a token id in {top}")
            if (not isinstance(b, (int, float)) or isinstance(b, bool) or not np.isfinite(b)
                    or not -100 <= b <= 100):
                raise SamplingError(f"logit_bias[{t!r}] must be a number in [-100, 100], "
                                    f"got {b!r}")

    @property
    def active(self) -> bool:
        return self != Sampling()

    def chain(self, vocab: int, prompt_len: int, temperature: float) -> tuple:
        """The processors in the fixed order (the module docstring); () when every control is
        off, so a plain request runs the rule on raw rows as before."""
        out = []
        if self.logit_bias or self.repetition_penalty != 1.0 or self.presence_penalty or \
                self.frequency_penalty:
            out.append(Penalties(vocab, prompt_len, self.logit_bias, self.repetition_penalty,
                                 self.presence_penalty, self.frequency_penalty))
        if temperature > 0 and (self.top_k or self.top_p < 1.0 or self.min_p > 0.0):
            out.append(Filters(temperature, self.top_k, self.top_p, self.min_p))
        return tuple(out)
