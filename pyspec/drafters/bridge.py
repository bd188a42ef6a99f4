"""A draft model with another vocabulary, bridged to the champion's ids (compat.Bridge).

The draft reads the committed sequence in its own vocabulary (`DraftView`) and proposes champion
ids (`bridged_choice`):
- idmap pairs whose tokenizers cut text alike: the champion's ids, translated one by one;
- otherwise (tli, or an id map with other merges): the champion's committed bytes re-encoded by
  the draft's own tokenizer. Only a tail window is re-encoded each cycle: the last TAIL_TOKENS draft
  tokens of the current text run plus the new bytes; what lies before is frozen. A BPE merge or a
  pre-tokenizer rule that would reach back further than the window is the one way this differs
  from re-encoding the whole text, and it changes only what the draft sees (speed), never the
  output. A champion control token (<|im_start|>) ends a text run and is encoded by its name
  (the draft's control token of that name, or the name as text). Bytes that are not valid UTF-8
  (a character the champion split across tokens and has not finished) become the draft's
  single-byte tokens until the character is complete.
- The draft's cache holds the rows of `kv_ids`, a prefix of what it last saw. Each cycle the new
  view is compared with it: rows past the common prefix are truncated (the re-encoded tail may
  cut differently once more bytes arrive) and the rest is fed in one pass.

Proposals: the draft's logits become champion-indexed logits that are -inf outside the
intersection, and the request's `Rule.choose` picks from those, so every mode keeps its meaning in
champion ids: greedy is the argmax over the intersection; replay adds the Gumbel noise of the
champion's position and ids; rejection's q is the draft's softmax restricted to the intersection
and renormalised, and the draft samples from that same q. When the draft's own most likely token
lies outside the intersection the block ends (a function of the draft's distribution only, never
of a sampled token, so rejection stays exact).

Not here: classifying a pair (compat.py), the rules (verify.py, cycle.Rule).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cpu.model import Model, prefill
from ..cycle import Proposal, Rule, draft_rows_kept
from ..rules.verify import VerifyInputError
from .pairing import Bridge

TAIL_TOKENS = 8   # draft tokens of the current text run that are re-encoded with new bytes


def encode_bytes(bridge: Bridge, data: bytes) -> list[int]:
    """Draft ids of a byte string: its valid UTF-8 runs by the draft's tokenizer, other bytes as
    the draft's single-byte tokens (dropped where the draft has none: its view only)."""
    tok, vocab = bridge.draft, bridge.draft_vocab
    out: list[int] = []
    while data:
        try:
            out += tok.encode(data.decode("utf-8"), add_bos=False)
            break
        except UnicodeDecodeError as e:
            if e.start:
                out += tok.encode(data[:e.start].decode("utf-8"), add_bos=False)
            out += [i for i in (vocab.id_of(data[j:j + 1]) for j in range(e.start, e.end))
                    if i is not None]
            data = data[e.end:]
    return out


class DraftView:
    """The committed champion tokens as draft ids, kept incrementally across a request."""

    def __init__(self, bridge: Bridge):
        self.bridge = bridge
        self._control: dict[int, list[int]] = {}
        self.reset()

    def reset(self) -> None:
        self.seen = 0                 # champion tokens read
        self.frozen: list[int] = []   # draft ids that no later byte changes
        self.tail = b""               # bytes of the current text run not yet frozen
        self.tail_ids: list[int] = []  # their draft ids

    def ids(self, tokens: list[int]) -> list[int]:
        """Draft ids of the committed `tokens` (which extend those of the last call)."""
        if len(tokens) < self.seen:
            self.reset()
        new, self.seen = tokens[self.seen:], len(tokens)
        b = self.bridge
        if b.same_segmentation:
            self.frozen += b.to_draft[np.asarray(new, np.int64)].tolist()
            return self.frozen
        cv, grew = b.champion_vocab, False
        for t in new:
            if cv.is_text[t]:
                self.tail += cv.text_bytes[t]
                grew = True
            else:  # a control (or unknown) token: it writes no text, its name identifies it
                self._close_run()
                self.frozen += self._control_ids(t)
        if grew:
            self._encode_tail()
        return self.frozen + self.tail_ids

    def _close_run(self) -> None:
        if self.tail:
            self._encode_tail()
        self.frozen += self.tail_ids
        self.tail, self.tail_ids = b"", []

    def _encode_tail(self) -> None:
        ids = encode_bytes(self.bridge, self.tail)
        cut = len(ids) - TAIL_TOKENS
        if cut > 0:
            head = b"".join(self.bridge.draft_vocab.text_bytes[i] for i in ids[:cut])
            if self.tail.startswith(head):  # always, for a byte-level vocabulary
                self.frozen += ids[:cut]
                self.tail, ids = self.tail[len(head):], ids[cut:]
        self.tail_ids = ids

    def _control_ids(self, t: int) -> list[int]:
        if t not in self._control:
            name = self.bridge.champion.tokens[t]
            self._control[t] = self.bridge.draft.encode(name, special=True, add_bos=False)
        return self._control[t]


def bridged_choice(bridge: Bridge, logits: np.ndarray, context: list[int], rule: Rule
                   ) -> tuple[int, np.ndarray | None, float] | None:
    """The draft's pick for the champion position after `context` (champion ids: the committed
    tokens and the drafts so far) from its logits (draft vocab,), in champion ids: rule.choose
    over champion-indexed logits that are -inf outside the intersection. None (the block ends
    there) when the draft's own most likely token is outside the intersection, or when the
    request's processors leave no shared token open."""
    if bridge.to_champion[int(np.argmax(logits))] < 0:
        return None
    champion_ids, draft_ids = bridge.pairs                              # (shared,) each
    champion_logits = np.full(len(bridge.to_draft), -np.inf)          # (champion vocab,)
    champion_logits[champion_ids] = logits[draft_ids]
    try:
        return rule.choose(champion_logits, len(context), context)
    except VerifyInputError:
        # The request's processors (a JSON-schema mask) allow no shared token here.
        return None


@dataclass
class BridgedModel:
    """A loaded draft model and the bridge from its vocabulary to the champion's (what
    load.load_draft_checked returns for an "idmap" or "tli" pair)."""

    model: Model
    bridge: Bridge


class BridgedDrafter:
    """An independent draft model with another vocabulary (see the module docstring). The
    drafter protocol of drafters/__init__.py; `bridge_stats` adds the class, the intersection's
    size and how many blocks ended on a token outside it."""

    kind = "model"

    def __init__(self, model: Model, bridge: Bridge, max_ctx: int | None = None):
        self.model = model
        self.bridge = bridge
        self.name = f"model:{model.source} ({bridge.kind})"
        self.kv = model.new_cache(max_ctx)
        self.view = DraftView(bridge)
        self.kv_ids: list[int] = []    # draft ids whose rows the cache has committed
        self.pending: list[int] = []   # ids of the rows the last proposal left pending
        self.fed_before = self.drafts_fed = 0
        self.calls = 0
        self.outside_stops = 0         # blocks ended by a token outside the intersection
        self._stable = 0               # leading ids of every view so far (frozen): in kv_ids

    @property
    def weight_bytes(self) -> int:
        return self.model.weight_bytes

    @property
    def kv_bytes(self) -> int:
        return self.kv.nbytes

    @property
    def bridge_stats(self) -> dict:
        return {**self.bridge.summary(), "outside_stops": self.outside_stops}

    def reset(self, tokens: list[int]) -> None:
        """A new request: prefill the draft ids of `tokens` but the last, keeping the rows of
        the ids it shares with what the cache holds (a conversation's earlier turns)."""
        self.view.reset()
        ids = self.view.ids(tokens)
        self.kv.rollback()
        self.pending, self._stable = [], len(self.view.frozen)
        m = _common_prefix(self.kv_ids, ids[:-1]) if len(ids) <= self.kv.max_ctx else 0
        self.kv.truncate(m)  # a prompt too long for the draft leaves it empty: no proposals
        del self.kv_ids[m:]
        if len(ids) <= self.kv.max_ctx:
            prefill(self.model, self.kv, ids, exact=False, start=m)
            self.kv_ids = ids[:-1]

    def propose(self, tokens: list[int], k: int, rule: Rule) -> Proposal:
        self.kv.rollback()
        self.pending, self.fed_before, self.drafts_fed = [], 0, 0
        ids = self.view.ids(tokens)
        if not ids:
            return Proposal()
        # Keep the rows of the common prefix (at least one id is fed: its logits draft).
        m = min(_common_prefix(self.kv_ids, ids, min(len(self.kv_ids), self._stable)),
                len(ids) - 1)
        self._stable = len(self.view.frozen)
        if m < self.kv.committed:
            self.kv.truncate(m)
            del self.kv_ids[m:]
        feed = ids[m:]
        out = Proposal()
        if m + len(feed) + k - 1 > self.kv.max_ctx:
            return out  # the draft's context is full: the champion goes on alone
        logits = self.model.forward(feed, self.kv, last_only=True, exact=False)[0]  # (vocab,)
        fed = list(feed)
        for i in range(k):
            pick = bridged_choice(self.bridge, logits, tokens + out.tokens, rule)
            if pick is None:
                self.outside_stops += 1
                break
            token, q_row, confidence = pick
            if rule.stops(confidence):
                break
            out.tokens.append(token)
            out.q_draft.append(q_row)
            if i + 1 < k:  # the last draft token is never fed: its logits would not be used
                fed.append(int(self.bridge.to_draft[token]))
                logits = self.model.forward(fed[-1:], self.kv, exact=False)[0]
        self.pending = fed
        self.fed_before, self.drafts_fed = len(feed), len(fed) - len(feed)
        self.calls += 1 + self.drafts_fed
        return out

    def confirm(self, n_accepted: int) -> None:
        kept = draft_rows_kept(self.fed_before, self.drafts_fed, n_accepted)
        self.kv.commit(kept)
        self.kv_ids += self.pending[:kept]
        self.pending, self.fed_before, self.drafts_fed = [], 0, 0


def _common_prefix(a: list[int], b: list[int], start: int = 0) -> int:
    """Length of the common prefix of a and b, known to be at least `start`."""
    n = start
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n
