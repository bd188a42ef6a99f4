"""Champion/draft pairing checks (DESIGN §3).

A draft may propose tokens for a champion only when both read and write the same token ids: the
same tokenizer (tokens, merges, token types, special ids) and the same chat template. Anything
else would make the draft's proposals mean different text, so such a pair is refused with a
message that says which part differs. (Bridges between vocabularies are future work; none is
declared here, so none is accepted.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import PyspecError
from .model import Config, ModelError
from .tokenizer import Tokenizer, TokenizerError


class IncompatiblePairError(PyspecError, ValueError):
    """The draft cannot serve this champion."""

    code = "incompatible_draft"


@dataclass
class PairReport:
    ok: bool
    reasons: list[str] = field(default_factory=list)   # why not (empty when ok)
    notes: list[str] = field(default_factory=list)     # facts about the pair

    def raise_if_bad(self) -> None:
        if not self.ok:
            raise IncompatiblePairError(
                "the draft cannot be used with this champion: " + "; ".join(self.reasons)
                + ". Pick a draft built for the same tokenizer, or use --draft ngram / self:L.")


def check_pair(champion_md: dict, draft_md: dict) -> PairReport:
    """Compare two GGUF metadata dicts."""
    report = PairReport(ok=True)
    try:
        champ_tok, draft_tok = Tokenizer.from_metadata(champion_md), Tokenizer.from_metadata(draft_md)
    except TokenizerError as e:
        return PairReport(False, [f"a tokenizer cannot be read ({e})"])
    try:
        champ_cfg, draft_cfg = Config.from_metadata(champion_md), Config.from_metadata(draft_md)
    except ModelError as e:
        return PairReport(False, [str(e)])

    if champ_tok.vocab_size != draft_tok.vocab_size:
        report.reasons.append(f"tokenizer vocabularies differ in size ({champ_tok.vocab_size} vs "
                              f"{draft_tok.vocab_size})")
    elif champ_tok.fingerprint() != draft_tok.fingerprint():
        report.reasons.append("tokenizers differ (tokens, merges, token types or special ids)")
    if champ_tok.template_hash() != draft_tok.template_hash():
        report.reasons.append("chat templates differ")
    if champ_cfg.vocab_size != draft_cfg.vocab_size:
        report.reasons.append(f"output heads differ in size ({champ_cfg.vocab_size} vs "
                              f"{draft_cfg.vocab_size})")
    report.ok = not report.reasons
    report.notes.append(f"champion: {champ_cfg.n_layers} layers, width {champ_cfg.d_model}")
    report.notes.append(f"draft: {draft_cfg.n_layers} layers, width {draft_cfg.d_model}")
    return report
