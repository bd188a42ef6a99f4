"""Draft specs: the one reader of a --draft value (`parse_draft`), for the CPU and GPU backends and
the browser session. Not here: building a drafter from a spec (drafters/__init__.py on the CPU,
gpu/backend.py on the GPU).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import PyspecError


class DraftSpecError(PyspecError, ValueError):
    """An unknown --draft value."""

    code = "bad_config"


@dataclass(frozen=True)
class DraftSpec:
    """A parsed --draft value. kind: "none" (champion only), "ngram" (prompt lookup, no
    weights), "self" (the champion's first `layers` layers), "model" (a GGUF draft model: `path`,
    or in the browser the draft model given at init when path is None), "combo" (n-gram where
    the context repeats itself, the draft model at `path` elsewhere: drafters/combo.py). Later
    kinds add a kind here and a branch in each backend's drafter factory."""

    kind: str
    layers: int | None = None
    path: str | None = None
    # A combination's draft model as the user wrote it after "ngram+" (trained, model:PATH,
    # PATH): what its spec reads as, so that an error about it names what they typed.
    typed: str | None = field(default=None, compare=False)

    @property
    def needs_weights(self) -> bool:
        """Does this draft need weights of its own (fetched into OPFS in the browser)?
        web/worker.js keeps the same rule as a regular expression; tests check the two agree."""
        return self.kind in ("model", "combo")

    @property
    def model(self) -> "DraftSpec":
        """A combination's draft model, as a spec of its own."""
        return DraftSpec("model", path=self.path, typed=self.typed)

    def __str__(self) -> str:
        if self.kind == "combo":
            return f"ngram+{self.model}"
        if self.kind == "self":
            return f"self:{self.layers}"
        if self.kind == "model":
            return self.typed or (f"model:{self.path}" if self.path else "model")
        return self.kind


def parse_draft(spec: str, n_layers: int | None = None) -> DraftSpec:
    """"none" | "ngram" | "self:L" | "model" | "model:PATH" | "trained" (models/draft-l4.gguf)
    | a path (ending in .gguf, holding a slash, or an existing file) | "ngram+" one of the draft
    models before ->
    DraftSpec. With the champion's `n_layers`, self:L is checked to be in 1..n_layers - 1."""
    if not isinstance(spec, str) or not spec:
        raise DraftSpecError(f"a draft spec must be a non-empty string, got {spec!r}")
    if spec.startswith("ngram+"):
        inner = parse_draft(spec[6:], n_layers) if spec[6:] else DraftSpec("none")
        if inner.kind != "model":
            raise DraftSpecError(f"draft {spec!r}: after ngram+ name a draft model (trained, "
                                 f"model, model:PATH or the path of a GGUF draft model)")
        return DraftSpec("combo", path=inner.path, typed=spec[6:])
    if spec in ("none", "ngram"):
        return DraftSpec(spec)
    if spec.startswith("self:"):
        layers = int(spec[5:]) if spec[5:].isdecimal() else -1  # "²".isdigit(), int fails
        if layers < 1 or (n_layers is not None and layers >= n_layers):
            have = f" (the champion has {n_layers} layers)" if n_layers else ""
            top = n_layers - 1 if n_layers else "N-1"
            raise DraftSpecError(f"draft {spec!r}: L must be an integer in 1..{top}{have}")
        return DraftSpec("self", layers=layers)
    if spec == "model":
        return DraftSpec("model")
    if spec == "trained":  # the distilled draft shipped in models/ (models/MANIFEST.json)
        from .. import trained_draft_path
        try:
            return DraftSpec("model", path=trained_draft_path())
        except FileNotFoundError as e:
            raise DraftSpecError(f"draft 'trained': {e}; or pass the path of a GGUF draft") from e
    if spec.startswith("model:") and len(spec) > 6:
        return DraftSpec("model", path=spec[6:])
    if (spec.lower().endswith(".gguf") or "/" in spec or "\\" in spec
            or os.path.isfile(spec)):
        return DraftSpec("model", path=spec)
    raise DraftSpecError(f"unknown draft {spec!r}: use auto (the default), ngram, none, "
                         f"self:L, trained, the path of a GGUF draft model (or model:PATH), "
                         f"ngram+trained or ngram+PATH; no file {spec!r} exists here")
