"""Champion/draft pairing: which class a pair is, and the bridge between their ids.

A pair is classified from the two GGUFs' metadata alone, with nothing declared:
- "identical": the same tokenizer (tokens, merges, types, special ids: one fingerprint). The draft
  proposes champion ids as they are.
- "idmap": every token of one vocabulary is a token of the other (a text token by its bytes, a
  control token by its name) under other ids. An exact 1:1 id map bridges them. When the merges
  agree too, both cut any text alike, so the draft's context is the champion's ids translated.
- "tli" (token-level intersection): the vocabularies differ. The draft may propose only tokens
  that both hold (`Vocab.matched_with`), so its q is its softmax restricted to that intersection
  and renormalised, written in champion ids; it samples from that same q, and verification uses
  it. The draft reads the champion's committed text re-encoded by its own tokenizer
  (drafters/bridge.py).

Why a bridged pair stays exact. The champion alone decides what is emitted: its tokenizer and chat
template render the prompt, and verify.py accepts a draft against the champion's p with the q the
draft sampled from (rejection), or keeps only tokens equal to the champion's own choice (greedy,
replay). What the draft saw, and which tokens it could name, changes how often it is right, never
the output's distribution. So a different chat template does NOT change the prompt here (the
draft's template is never used; the draft only sees the champion's prompt in its own tokens), and
a different vocabulary costs acceptance, not exactness. Both are reported, not refused.

What is refused, because no exact bridge can be built (IncompatiblePairError, code
incompatible_draft, which says why and what to do):
- a tokenizer pyspec cannot read: without the draft's byte strings its ids name no champion token;
- a draft whose output head and tokenizer differ in size: its logits do not name its tokens;
- vocabularies that share no token: every proposal would be empty.
A draft whose pre-tokenizer pyspec lacks is read with the champion family's split (`smollm`): the
split only shapes the draft's view of the context (speed), never the bridge (its byte strings).

Across model families (text/tokenizer.py reads byte-level BPE with the smollm, gpt-2, llama-bpe
and qwen2 splits, and the SentencePiece-style model of Llama 2 / Gemma): the same tokenizer is
"identical" (shared ids), and a draft of the same architecture at another size is then a valid
draft, said in the notes; a draft of another family goes through the id map or the token-level
intersection of their byte strings (a SentencePiece piece "▁the" is the bytes " the"), or is
refused with the reason above.

A draft that borrows tensors from its champion (gguf.py: the token embedding, so that the draft
file holds only its layers) is bound to champions that hold those very bytes:
`bind_borrowed` checks each one's type and sha256 and lends them, else IncompatiblePairError.

Not here: drafting through a bridge (drafters/bridge.py), loading models (load.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cpu.model import Config, ModelError
from ..errors import PyspecError
from ..text.tokenizer import SUPPORTED_PRE, Tokenizer, TokenizerError
from ..text.vocab import Vocab

CLASSES = ("identical", "idmap", "tli")


class IncompatiblePairError(PyspecError, ValueError):
    """The draft cannot serve this champion."""

    code = "incompatible_draft"


@dataclass
class Bridge:
    """The exact map between a draft's token ids and the champion's, for an "idmap" or "tli" pair.

    `to_draft[c]` is the draft id of champion id c and `to_champion[d]` the champion id of draft
    id d, -1 outside the intersection; on the intersection each is the other's inverse."""

    kind: str                    # "idmap" | "tli"
    champion: Tokenizer
    draft: Tokenizer
    champion_vocab: Vocab
    draft_vocab: Vocab
    to_draft: np.ndarray         # (champion vocab,) int64
    to_champion: np.ndarray      # (draft vocab,) int64
    same_segmentation: bool      # the two tokenizers cut every text alike (up to the id map)

    def __post_init__(self):
        ids = np.flatnonzero(self.to_draft >= 0)
        self.pairs = (ids, self.to_draft[ids])  # (shared,) champion ids, (shared,) their draft ids

    @property
    def size(self) -> int:
        """Tokens in the intersection."""
        return int((self.to_draft >= 0).sum())

    @property
    def share(self) -> float:
        """The intersection's share of the champion's vocabulary."""
        return self.size / len(self.to_draft)

    def summary(self) -> dict:
        """For stats and receipts: numbers and the class, no text."""
        return {"kind": self.kind, "shared_tokens": self.size,
                "champion_vocab": len(self.to_draft), "share": round(self.share, 6)}


@dataclass
class PairReport:
    ok: bool
    reasons: list[str] = field(default_factory=list)   # why not (empty when ok)
    notes: list[str] = field(default_factory=list)     # facts about the pair
    kind: str | None = None                            # one of CLASSES when ok
    bridge: Bridge | None = None                       # for "idmap" and "tli"
    vocab: int | None = None                           # the champion's, for "identical"

    def raise_if_bad(self) -> None:
        if not self.ok:
            raise IncompatiblePairError(
                "the draft cannot be used with this champion: " + "; ".join(self.reasons)
                + ". Pick a draft whose vocabulary (byte-level BPE or SentencePiece-style) "
                "shares tokens with the champion's, or use the drafter ngram or self:L.")

    def describe(self) -> str:
        """One line: the class and what it implies."""
        if not self.ok:
            return "NOT compatible: " + "; ".join(self.reasons)
        if self.kind == "identical":
            return "compatible: identical tokenizers (the draft proposes the champion's own ids)"
        b = self.bridge
        view = ("its context is the champion's ids translated" if b.same_segmentation
                else "its context is the champion's text re-encoded in its vocabulary")
        if self.kind == "idmap":
            return (f"compatible: id map (the same {b.size} tokens under other ids; an exact 1:1 "
                    f"map, {view})")
        return (f"compatible: token-level intersection of {b.size} tokens ({100 * b.share:.1f}% "
                f"of the champion's {len(b.to_draft)}; the draft proposes only these, its q "
                f"renormalised over them, {view}; exact, acceptance may be lower)")

    def to_json(self) -> dict:
        """`shared_tokens` and `share` (of the champion's vocabulary the draft can propose) for
        every class, None for a refused pair."""
        out = {"ok": self.ok, "class": self.kind, "reasons": self.reasons, "notes": self.notes,
               "shared_tokens": None, "share": None}
        if self.bridge is not None:
            out.update(shared_tokens=self.bridge.size, share=self.bridge.share)
        elif self.kind == "identical":
            out.update(shared_tokens=self.vocab, share=1.0)
        return out


def _read_tokenizer(md: dict, who: str, notes: list[str]) -> Tokenizer:
    """The tokenizer of a GGUF; a draft's unknown pre-tokenizer falls back to the `smollm` split
    (it only shapes the draft's view of the context)."""
    pre = md.get("tokenizer.ggml.pre")
    if who == "draft" and pre not in SUPPORTED_PRE and md.get("tokenizer.ggml.model") == "gpt2":
        notes.append(f"the draft's pre-tokenizer {pre!r} is read as 'smollm' (its view of the "
                     "context may differ from its training: speed only)")
        tok = Tokenizer.from_metadata({**md, "tokenizer.ggml.pre": SUPPORTED_PRE[0]})
        tok.pre = pre  # its fingerprint stays its own: not "identical" to a smollm tokenizer
        return tok
    return Tokenizer.from_metadata(md)


def bind_borrowed(draft, champion) -> list[str]:
    """Let `draft` (a GGUFFile) read the tensors it borrows from `champion`'s file (a GGUFFile),
    once each is checked to be the same type and the same bytes as when the draft was written.
    Returns the borrowed names (none for a draft that holds all its tensors)."""
    for b in draft.borrowed.values():
        if not champion.has(b.name) or b.name in champion.borrowed:
            raise IncompatiblePairError(
                f"{draft.source} borrows {b.name} from its champion, and {champion.source} "
                "has no such tensor: use the champion the draft was trained beside")
        t = champion.tensor(b.name)
        if t.type_id != b.type_id or champion.tensor_sha256(b.name) != b.sha256:
            raise IncompatiblePairError(
                f"{draft.source} borrows {b.name} from the champion it was trained beside "
                f"(sha256 of those bytes {b.sha256[:12]}...), and {champion.source}'s "
                f"{b.name} is other bytes: use that champion, or a draft that holds its own "
                "embedding, or ngram")
    if draft.borrowed:
        draft.lend(champion)
    return list(draft.borrowed)


def check_pair(champion_md: dict, draft_md: dict) -> PairReport:
    """Classify a pair from two GGUF metadata dicts (see the module docstring)."""
    notes: list[str] = []
    try:
        champ_tok = Tokenizer.from_metadata(champion_md)
        draft_tok = _read_tokenizer(draft_md, "draft", notes)
    except TokenizerError as e:
        return PairReport(False, [f"a tokenizer cannot be read, so the draft's ids name no known "
                                  f"text ({e})"], notes)
    try:
        champ_cfg, draft_cfg = Config.from_metadata(champion_md), Config.from_metadata(draft_md)
    except ModelError as e:
        return PairReport(False, [str(e)], notes)
    reasons = [f"the {who}'s output head has {cfg.vocab_size} rows but its tokenizer "
               f"{tok.vocab_size} tokens, so its logits do not name its tokens"
               for who, cfg, tok in (("champion", champ_cfg, champ_tok),
                                     ("draft", draft_cfg, draft_tok))
               if cfg.vocab_size != tok.vocab_size]
    if reasons:
        return PairReport(False, reasons, notes)
    notes.append(f"champion: {champ_cfg.n_layers} layers, width {champ_cfg.d_model}, "
                 f"vocabulary {champ_tok.vocab_size}")
    notes.append(f"draft: {draft_cfg.n_layers} layers, width {draft_cfg.d_model}, "
                 f"vocabulary {draft_tok.vocab_size}")
    if champ_tok.template_hash() != draft_tok.template_hash():
        notes.append("chat templates differ: the champion's renders the prompt and the draft "
                     "reads that prompt (speed only, never the output)")
    if draft_cfg.context_length < champ_cfg.context_length:
        notes.append(f"the draft's context is {draft_cfg.context_length} positions, the "
                     f"champion's {champ_cfg.context_length}: past position "
                     f"{draft_cfg.context_length} the champion decodes alone")
    notes.append(_family_note(champion_md, draft_md, champ_cfg, draft_cfg, champ_tok, draft_tok))
    if champ_tok.fingerprint() == draft_tok.fingerprint():
        return PairReport(True, [], notes, "identical", vocab=champ_tok.vocab_size)
    bridge = make_bridge(champ_tok, draft_tok)
    if bridge.size == 0:
        return PairReport(False, ["the two vocabularies share no token, so the draft could "
                                  "never propose one"], notes)
    return PairReport(True, [], notes, bridge.kind, bridge)


def _tokenizer_name(tok: Tokenizer) -> str:
    return "SentencePiece-style" if tok.model == "llama" else f"byte-level BPE ({tok.pre})"


def _family_note(champion_md: dict, draft_md: dict, champ_cfg: Config, draft_cfg: Config,
                 champ_tok: Tokenizer, draft_tok: Tokenizer) -> str:
    """What the two models are to each other: one family at two sizes, or two families."""
    arch = champion_md.get("general.architecture"), draft_md.get("general.architecture")
    if champ_tok.fingerprint() == draft_tok.fingerprint():
        size = ("at another size" if (champ_cfg.n_layers, champ_cfg.d_model)
                != (draft_cfg.n_layers, draft_cfg.d_model) else "at the same size")
        kin = f"the same family ({arch[0]}) {size}" if arch[0] == arch[1] else \
            f"architectures {arch[0]} and {arch[1]}"
        return f"{kin}, one tokenizer ({_tokenizer_name(champ_tok)}): shared ids"
    return (f"other tokenizers: the champion's {arch[0]} {_tokenizer_name(champ_tok)}, the "
            f"draft's {arch[1]} {_tokenizer_name(draft_tok)}; bridged by their byte strings")


def make_bridge(champion: Tokenizer, draft: Tokenizer) -> Bridge:
    """The bridge between two tokenizers that differ: "idmap" when every token of each pairs with
    one of the other, else "tli"."""
    cv, dv = Vocab(champion), Vocab(draft)
    pairs = cv.matched_with(dv)
    to_draft = np.full(cv.size, -1, np.int64)
    to_champion = np.full(dv.size, -1, np.int64)
    if pairs:
        c_ids = np.fromiter(pairs.keys(), np.int64, len(pairs))
        d_ids = np.fromiter(pairs.values(), np.int64, len(pairs))
        to_draft[c_ids], to_champion[d_ids] = d_ids, c_ids
    total = len(pairs) == cv.size == dv.size
    # Cut alike: the same merges over the same token texts, so BPE gives the same texts.
    same_cut = (total and champion.merges == draft.merges and champion.pre == draft.pre
                and all(champion.tokens[c] == draft.tokens[d] for c, d in pairs.items()))
    return Bridge("idmap" if total else "tli", champion, draft, cv, dv, to_draft, to_champion,
                  same_cut)
