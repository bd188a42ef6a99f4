"""Every generation option of a request, once: its type, default and range, and the check that
a request's values are usable. The engine reads an `Options`; the front ends build one.

Not here: what the options do (the engine, rules/processors.py, text/stops.py, rules/jsonschema.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import schedule
from .cycle import VERIFY_MODES
from .errors import OptionsError
from .rules.jsonschema import compile_schema
from .rules.processors import Sampling
from .text.stops import MAX_STOPS


@dataclass
class Options:
    max_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    verify: str | None = None     # None: greedy at T = 0, replay above
    k: str = "heuristic"
    stop_at_eos: bool = True
    stop_ids: tuple = ()          # more token ids that end generation, besides the model's EOG
    # The sampling controls (processors.py: their order, counting, ties), OpenAI-style names.
    top_k: int = 0                # 0 = off
    top_p: float = 1.0            # 1 = off
    min_p: float = 0.0            # 0 = off
    repetition_penalty: float = 1.0        # prompt and output tokens (HF); 1 = off
    presence_penalty: float = 0.0          # output tokens only (OpenAI)
    frequency_penalty: float = 0.0         # output tokens only (OpenAI)
    logit_bias: dict = field(default_factory=dict)   # token id -> bias in [-100, 100]
    stop: tuple = ()              # up to 4 stop strings (stops.py), cut from the output
    json_schema: dict | str | None = None  # the output follows this schema (jsonschema.py)

    def sampling(self) -> Sampling:
        return Sampling(logit_bias=self.logit_bias, repetition_penalty=self.repetition_penalty,
                        presence_penalty=self.presence_penalty,
                        frequency_penalty=self.frequency_penalty, top_k=self.top_k,
                        top_p=self.top_p, min_p=self.min_p)

    def resolved_verify(self) -> str:
        """T = 0 is always greedy: every rule reduces to argmax there."""
        if self.temperature == 0:
            return "greedy"
        return self.verify or "replay"

    def check(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise OptionsError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not (self.temperature >= 0 and np.isfinite(self.temperature)):
            raise OptionsError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.verify not in (None, *VERIFY_MODES):
            raise OptionsError(f"unknown verify mode {self.verify!r}: use one of {VERIFY_MODES}")
        if self.verify == "greedy" and self.temperature > 0:
            raise OptionsError("verify=greedy needs temperature 0; use replay or rejection")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 1 << 64:
            raise OptionsError(f"seed must be an integer in [0, 2^64), got {self.seed!r}")
        schedule.parse(self.k)
        self.sampling().check()
        stop = self.stop
        if not isinstance(stop, (list, tuple)) or len(stop) > MAX_STOPS or not all(
                isinstance(s, str) and s for s in stop):
            raise OptionsError(f"stop must be a list of at most {MAX_STOPS} non-empty strings, "
                               f"got {stop!r}")
        if self.json_schema is not None:
            if not self.stop_at_eos:
                raise OptionsError("json_schema needs stop_at_eos: the end-of-text token is "
                                   "what ends the JSON value")
            compile_schema(self.json_schema)   # a SchemaError names what is not supported
