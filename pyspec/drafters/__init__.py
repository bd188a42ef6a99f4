"""Draft sources: what proposes the tokens the champion verifies, and the --draft spec that names one.

Every drafter has the same calls:
  reset(tokens)                      a new request whose prompt is `tokens` (champion prefilled)
  propose(tokens, k, rule) -> Proposal    up to k tokens continuing the committed `tokens`
  confirm(n_accepted)                the last proposal's verdict: keep the cache rows it proves
and `name`, `kind`, `calls`, `weight_bytes`, `kv_bytes`. A drafter that is free to ask (no
device work, no state: n-gram) may also offer
  preview(tokens, k) -> list[int]    what propose would draft, not counted as a call
which the engine scores at champion-only cycles instead of the guard's probes (schedule.py).
`rule` is the request's cycle.Rule:
`rule.choose(logits, position, context)` turns draft logits into a token (argmax, Gumbel-coupled,
or a sample from q_draft; through the request's processors when given the context) and `rule.stops(confidence)` ends drafting early.

Drafters never decide what is emitted: that is verify.py's job, so a bad draft only costs speed.
Modules: spec.py (parse_draft), ngram.py, model_draft.py, bridge.py (a draft model with another
vocabulary), eagle.py (a head over the champion's states), combo.py (n-gram or a draft model,
one per cycle), forced.py (a schema's forced tokens), pairing.py (the pair checks); the
Proposal is cycle.py's. Building the drafter for a spec, on either backend, is load.make_drafter.
"""

from __future__ import annotations

from ..cycle import Proposal
from .bridge import BridgedDrafter, BridgedModel
from .combo import Combo
from .eagle import EagleDrafter, EagleHead
from .model_draft import ModelDrafter, SelfDrafter
from .ngram import NgramDrafter
from .spec import DraftSpec, DraftSpecError, parse_draft

__all__ = ["BridgedDrafter", "BridgedModel", "Combo", "DraftSpec", "DraftSpecError",
           "EagleDrafter", "EagleHead", "ModelDrafter", "NgramDrafter", "Proposal", "SelfDrafter",
           "no_draft_model", "parse_draft"]


def no_draft_model(spec: str, path: str | None) -> DraftSpecError:
    """The error for a draft spec whose model file is missing; `spec` is the whole spec the user
    gave (for `ngram+PATH`, with its `ngram+`); `path` None: the spec named `model`, the page's
    draft model given at init, which the command line has no way to give."""
    if path is None:
        return DraftSpecError(f"draft {spec!r}: `model` names the draft model given to the page "
                              "at init; here give its path instead (a .gguf file, or "
                              "model:PATH) or trained")
    return DraftSpecError(f"draft {spec!r}: no GGUF draft model at {path!r}; give the path of a "
                          "GGUF draft model, or use ngram, none or self:L")
