"""Grammar-forced drafts: under a JSON schema, the tokens the mask forces go into the block for
free, around the proposals of the request's own drafter.

A cycle's block is: the forced tokens from the committed state (each the only token its mask
allows, q = 1: the champion's masked distribution is one-hot there, so a forced token is always
accepted once every draft before it is); then the inner drafter's proposals (n-gram, a CPU
draft model), walked through the grammar and cut before the first one the mask forbids (it
could only be rejected); then the forced tokens after them. Nothing after an EOS is drafted.
The inner drafter sees the forced prefix as context; its `confirm` gets the count of its own
drafts that were accepted, so a draft model keeps exactly the cache rows it can prove
(the forced prefix counts as committed context for it: forced tokens are always accepted).
`self:L` shares the champion's cache and feeds only the last committed token, so it is asked
only in cycles without a forced prefix.
Not here: the masks (jsonmask.py), the rules (verify.py).
"""

from __future__ import annotations

from ..cycle import Proposal, Rule


class ForcedDrafter:
    """The drafter protocol (drafters/__init__.py) over `inner` (None: forced tokens only) and
    a request's jsonmask.Constraint."""

    def __init__(self, inner, constraint):
        self.inner, self.constraint = inner, constraint
        self.name = f"forced+{inner.name}" if inner else "forced"
        self.kind = inner.kind if inner else "forced"
        self.weight_bytes = inner.weight_bytes if inner else 0
        self.kv_bytes = inner.kv_bytes if inner else 0
        for attr in ("model", "layers", "bridge_stats"):   # what the receipt reads
            setattr(self, attr, getattr(inner, attr, None))
        self.forced_drafted = 0
        self._own_calls = 0
        self._prefix = self._inner_kept = 0
        self._asked = False

    @property
    def calls(self) -> int:
        return self._own_calls + (self.inner.calls if self.inner else 0)

    def reset(self, tokens: list[int]) -> None:
        if self.inner:
            self.inner.reset(tokens)

    def _forced_run(self, out: Proposal, state, k: int):
        """Append forced tokens while the mask forces one; returns the state after them (None
        after EOS: nothing follows it)."""
        masker = self.constraint.masker
        while len(out.tokens) < k and state is not None:
            if state is self.constraint.done:
                return None
            forced = masker.mask(state).forced
            if forced is None:
                break
            out.tokens.append(forced)
            out.q_draft.append(None)    # one-hot: q = 1 on the forced token
            self.forced_drafted += 1
            state = masker.advance(state, forced)
        return state

    def propose(self, tokens: list[int], k: int, rule: Rule) -> Proposal:
        self._own_calls += 1
        self._prefix = self._inner_kept = 0
        self._asked = False
        c = self.constraint
        out = Proposal()
        state = self._forced_run(out, c.state_after(list(tokens[c.prompt_len:])), k)
        self._prefix = len(out.tokens)
        if (state is None or state is c.done or len(out.tokens) >= k or self.inner is None
                or (self.inner.kind == "self" and self._prefix)):
            return out
        inner = self.inner.propose(list(tokens) + out.tokens, k - len(out.tokens), rule)
        self._asked = True
        for t, q in zip(inner.tokens, inner.q_draft):
            if state is c.done or not c.masker.mask(state).allows(t):
                if q is not None:
                    # A draft sampled from q (a GPU draft read back never sees the mask) stays,
                    # as the block's last: dropping it for its own value would leave verification
                    # a draft that no longer follows q. The mask gives it p = 0, so it is
                    # rejected and the residual is sampled, exactly.
                    out.tokens.append(t)
                    out.q_draft.append(q)
                    self._inner_kept += 1
                    return out
                break
            out.tokens.append(t)
            out.q_draft.append(q)
            self._inner_kept += 1
            state = c.masker.advance(state, t)
        if state is not None and state is not c.done:
            self._forced_run(out, state, k)
        return out

    def confirm(self, n_accepted: int) -> None:
        if self.inner is not None and self._asked:
            self.inner.confirm(max(0, min(n_accepted - self._prefix, self._inner_kept)))
        self._asked = False
