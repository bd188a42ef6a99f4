"""The EAGLE-style draft: a head that reads the champion's own final residual states.

Row s of the head takes f_{s-1}, the champion's final residual state at position s - 1 (zeros
at row 0), through the champion's final norm, and the embedding of token s:
u_s = W_f norm(f_{s-1}) + W_e e(y_s). One Llama layer over the rows (its own cache, RoPE at
position s) gives z_s, a guess of f_s; the champion's final norm and head turn z_s into the
draft's logits for token s + 1. So a draft token costs the two input products, one layer and
the champion's head, and the head brings no embedding or output matrix of its own: it is bound
to the champion it was trained on (its GGUF names that champion's sha256; `EagleHead` refuses
another). A head may also have several layers and its own embedding, final norm and head: a
draft model fed with the champion's states (EagleHead, train/eagle.py --init-draft).

Drafting from the committed y_0..y_c: the champion's cache holds rows 0..c-1 and, kept by
`KVCache.keep_states`, their states f. Each proposal first feeds the head every row it has not
seen with true states (the rows the last verify pass committed, or the whole prompt at the first
cycle); the last of them, row c (f_{c-1} and y_c), gives the first draft. Each further draft
feeds a row made of the head's own guess z and the drafted token. Those guess rows stay pending and
are always dropped: the next proposal feeds the same positions again with the champion's true
states. `train/eagle.py` trains the head for exactly this (its training-time test).
"""

from __future__ import annotations

import time

import numpy as np

from ..cpu.model import LAYER_TENSORS, Config, Model, ModelError, layer_shapes, rms_norm
from ..cycle import Proposal, Rule
from ..formats.gguf import GGUFError, GGUFFile
from .pairing import IncompatiblePairError

EAGLE_TENSORS = ("eagle.fc_feat.weight", "eagle.fc_embd.weight")   # W_f, W_e: (d, d) each


def is_eagle(metadata: dict) -> bool:
    """Is this GGUF an EAGLE-style head (not a standalone model)?"""
    return metadata.get("pyspec.draft.kind") == "eagle"


def binding_problem(head_md: dict, champion_md: dict, champion_sha256: str) -> str | None:
    """Why a head cannot serve this champion (another shape, or trained on another champion:
    its GGUF names that champion's sha256), or None."""
    head, champion = Config.from_metadata(head_md), Config.from_metadata(champion_md)
    for key in ("d_model", "n_heads", "n_kv_heads", "head_dim", "vocab_size"):
        if getattr(head, key) != getattr(champion, key):
            return (f"the head has {key} = {getattr(head, key)} but the champion "
                    f"{getattr(champion, key)}; a head only serves the champion it was trained on")
    bound = head_md.get("pyspec.eagle.champion_sha256")
    if bound != champion_sha256:
        return (f"the head was trained on the champion with sha256 {bound}, not on this one "
                f"({champion_sha256}): use the champion it names, or a draft model / ngram")
    return None


class EagleHead(Model):
    """The head's own weights (its layers, W_f, W_e) over the champion's states. Its embedding,
    final norm and (tied) head are the champion's, shared, not copied, unless its GGUF holds its
    own token_embd.weight and output_norm.weight: a draft model fed with the champion's states
    (train/eagle.py --init-draft: a trained draft's layers, embedding and norm, W_f starting at
    zero, so that it starts as that draft). The states are read through the champion's final
    norm either way (`inputs`). `forward(..., inputs=u)` runs the layers over rows u."""

    def __init__(self, f: GGUFFile, champion: Model):
        self._open(f, champion.dtype)
        cfg = self.config
        if not is_eagle(f.metadata):
            raise ModelError(f"{f.source} is not an EAGLE-style head (pyspec.draft.kind)")
        problem = binding_problem(f.metadata, champion.metadata, champion.sha256())
        if problem:
            raise IncompatiblePairError(f"{f.source}: {problem}")
        d, shapes = cfg.d_model, layer_shapes(cfg)
        self.own_head = f.has("token_embd.weight")
        try:
            self.fc_feat, self.fc_embd = (self._load(n, (d, d)) for n in EAGLE_TENSORS)
            self.layers = [{n: self._load(f"blk.{i}.{n}.weight", shapes[n])
                            for n in LAYER_TENSORS} for i in range(cfg.n_layers)]
            if self.own_head:          # a head tied to the embedding unless output.weight
                self.tok_embd = self.head = self._load("token_embd.weight", (cfg.vocab_size, d))
                self.out_norm = self._load("output_norm.weight", (d,))
                if f.has("output.weight"):
                    self.head = self._load("output.weight", (cfg.vocab_size, d))
        except GGUFError as e:
            raise ModelError(f"{f.source} is not a complete EAGLE-style head: {e.reason}") from e
        if not self.own_head:
            self.tok_embd, self.out_norm, self.head = (champion.tok_embd, champion.out_norm,
                                                       champion.head)
        self.state_norm = champion.out_norm

    @property
    def weight_bytes(self) -> int:
        """Its own weights only (the embedding, norm and head count where they are its own)."""
        own = 0
        if self.own_head:
            own = self.tok_embd.nbytes + self.out_norm.nbytes
            own += self.head.nbytes if self.head is not self.tok_embd else 0
        return (own + self.fc_feat.nbytes + self.fc_embd.nbytes
                + sum(w.nbytes for layer in self.layers for w in layer.values()))

    def inputs(self, states: np.ndarray, next_tokens) -> np.ndarray:
        """u = W_f norm(f) + W_e e(y), norm the champion's final norm, e the head's embedding:
        states (m, d), next_tokens (m,) -> (m, d)."""
        e = self.tok_embd[np.asarray(next_tokens, dtype=np.int64)]
        h = rms_norm(states, self.state_norm, self.config.rms_eps)
        return (self.product(h, self.fc_feat, exact=False)
                + self.product(e, self.fc_embd, exact=False))


class EagleDrafter:
    """Drafts with an EagleHead over the champion's states (module docstring)."""

    kind = "eagle"

    def __init__(self, head: EagleHead, champion_cache, max_ctx: int | None = None):
        self.head = head
        self.name = f"eagle:{head.source}"
        self.champion_kv = champion_cache
        champion_cache.keep_states(head.config.d_model, head.dtype)
        self.kv = head.new_cache(max_ctx or champion_cache.max_ctx)
        self.kv.keep_states(head.config.d_model, head.dtype)
        self.fed = 0           # true rows fed by the last proposal (pending until confirm)
        self.steady = 1        # rows a proposal feeds after a cycle it drafted (confirm)
        self.calls = 0
        self.catch_up_s = 0.0  # seconds the last proposal spent catching up (not drafting)

    @property
    def weight_bytes(self) -> int:
        return self.head.weight_bytes

    @property
    def kv_bytes(self) -> int:
        return self.kv.nbytes

    def reset(self, tokens: list[int]) -> None:
        self.kv.truncate(0)    # the first proposal feeds the prompt's rows
        self.fed, self.steady = 0, 1

    def propose(self, tokens: list[int], k: int, rule: Rule) -> Proposal:
        self.kv.rollback()
        self.fed = 0
        c, start = len(tokens) - 1, self.kv.committed
        if start > c or self.champion_kv.committed < c or c + k > self.kv.max_ctx:
            return Proposal()  # nothing to read (no state yet), or the context is full
        head, out = self.head, Proposal()
        nxt = tokens[start:c + 1]                  # rows start..c read f_{s-1} and y_s
        states = self.champion_kv.states[max(0, start - 1):c]
        if start == 0:                             # row 0 reads no state: zeros
            states = np.concatenate([np.zeros((1, states.shape[1]), states.dtype), states])
        self.catch_up_s, catch = 0.0, len(nxt) - self.steady
        if catch > 0:
            # The prompt's rows, or the rows of cycles it sat out (the guard had it off): fed
            # ahead of the steps and timed apart, as a draft model's (model_draft.ModelDrafter),
            # so that the guard's time per draft token is a step's. Pending with the rest: only
            # confirm commits true rows.
            t0 = time.perf_counter()
            head.forward(nxt[:catch], self.kv, logits_from=catch, exact=False,
                         inputs=head.inputs(states[:catch], nxt[:catch]))
            nxt, states = nxt[catch:], states[catch:]
            self.catch_up_s = time.perf_counter() - t0
        logits = head.forward(nxt, self.kv, last_only=True, exact=False,
                              inputs=head.inputs(states, nxt))[0]
        self.fed = c + 1 - start
        for i in range(k):
            token, q_row, confidence = rule.choose(logits, c + 1 + i, tokens + out.tokens)
            if rule.stops(confidence):
                break
            out.tokens.append(token)
            out.q_draft.append(q_row)
            if i + 1 < k:  # the last draft token is never fed: its logits would not be used
                z = self.kv.states[self.kv.length - 1:self.kv.length]        # (1, d) the guess
                logits = head.forward([token], self.kv, exact=False,
                                      inputs=head.inputs(z, [token]))[0]
        self.calls += 1 + min(len(out.tokens), k - 1)
        return out

    def confirm(self, n_accepted: int) -> None:
        # Only the true rows stay; the guess rows are fed again with true states next time.
        if self.fed:   # a cycle it drafted: the next proposal feeds its accepted rows and one
            self.steady = n_accepted + 1
        self.kv.commit(self.fed)
        self.fed = 0
