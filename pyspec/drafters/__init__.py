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
Modules: proposal.py (Proposal), spec.py (parse_draft), ngram.py, model_draft.py, bridge.py (a
draft model with another vocabulary), eagle.py (a head over the champion's states), combo.py
(n-gram or a draft model, one per cycle); here the CPU drafter for a spec.
"""

from __future__ import annotations

import os

from .bridge import BridgedDrafter, BridgedModel
from .combo import Combo
from .eagle import EagleDrafter, EagleHead
from .model_draft import ModelDrafter, SelfDrafter
from .ngram import NgramDrafter
from .proposal import Proposal
from .spec import DraftSpec, DraftSpecError, parse_draft

__all__ = ["Combo", "DraftSpec", "DraftSpecError", "Proposal", "make_drafter", "model_drafter",
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


def make_drafter(spec: str, champion, champion_cache=None, load_model=None, *,
                 named: str | None = None):
    """A CPU drafter for a draft spec (None for "none").

    `champion_cache` is the champion's KV cache (self:L shares it); `load_model(path)` loads an
    independent draft model, or a drafts.BridgedModel for a draft with another vocabulary
    (load.load_draft_checked checks the pair and bridges it). `named`: the spec as the user gave
    it, for errors about a part of it (a combination's model)."""
    d = parse_draft(spec, champion.config.n_layers)
    if d.kind == "none":
        return None
    if d.kind == "ngram":
        return NgramDrafter()
    if d.kind == "self":
        return SelfDrafter(champion, champion_cache, d.layers)
    if d.kind == "combo":
        return Combo(NgramDrafter(), make_drafter(str(d.model), champion, champion_cache,
                                                  load_model, named=spec))
    if load_model is None or d.path is None or not os.path.exists(d.path):
        raise no_draft_model(named or spec, d.path)
    return model_drafter(load_model(d.path), champion_cache.max_ctx if champion_cache else None,
                         champion_cache)


def model_drafter(loaded, max_ctx: int | None = None, champion_cache=None):
    """The drafter for a loaded draft model: a ModelDrafter for the champion's own vocabulary, a
    BridgedDrafter for a BridgedModel, an EagleDrafter for an EagleHead (it reads the states
    `champion_cache` keeps)."""
    if isinstance(loaded, BridgedModel):
        return BridgedDrafter(loaded.model, loaded.bridge, max_ctx)
    if isinstance(loaded, EagleHead):
        if champion_cache is None:
            raise DraftSpecError(f"{loaded.source}: an EAGLE-style head reads the champion's "
                                 "states, and this engine does not keep them")
        return EagleDrafter(loaded, champion_cache, max_ctx)
    return ModelDrafter(loaded, max_ctx)
