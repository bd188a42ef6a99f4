"""A conversation's prompt when it outgrows the context: the context-full policy.

When the rendered messages plus `max_tokens` would not fit in the context, the default policy
("drop_oldest") drops the oldest whole turns, a user message together with the assistant
messages that answer it, until they fit. It never drops a system message, never the last user
message (the one being answered), and never part of a message. Where even every older turn left
out would not make room for `max_tokens` (a max_tokens near or past the context), leaving turns
out cannot honour it, so only those the prompt itself needs are left out and the answer is cut
at the context; the notice says how long it can run. If the prompt still leaves no room for one
token, or under the policy "error", the request is refused with PromptTooLongError (code
prompt_too_long). What was dropped is reported as counts only (the receipt's `context`);
the caller shows the notice.

The conversation cache itself (reusing the KV rows of earlier turns) is the engine's
(Engine.reusable): dropping a turn changes the token prefix, so the next request prefills from
the first token that differs.
Not here: rendering and tokenizing (tokenizer.py, chat.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import OptionsError, PromptTooLongError

POLICIES = ("drop_oldest", "error")


@dataclass
class Fitted:
    ids: list[int]              # the prompt's token ids after the policy
    dropped_messages: int = 0
    dropped_tokens: int = 0
    answer_room: int | None = None   # tokens the answer can run to when fewer than max_tokens

    def notice(self) -> str | None:
        """The user-facing notice, or None when nothing was dropped and the answer has the room
        it asked for."""
        parts = []
        if self.dropped_messages:
            parts.append(f"The conversation was longer than the context: the "
                         f"{self.dropped_messages} oldest message(s) ({self.dropped_tokens} "
                         "tokens) were left out of this prompt.")
        if self.answer_room is not None:
            parts.append(f"The answer can run to {self.answer_room} tokens at most: the context "
                         f"ends there (the prompt takes {len(self.ids)}).")
        return " ".join(parts) or None

    def receipt(self) -> dict:
        return {"dropped_messages": self.dropped_messages, "dropped_tokens": self.dropped_tokens}

    def annotate(self, report: dict) -> None:
        """Record the policy's counts in a finished request's stats and receipt (`context`), and
        its notice (None when nothing was dropped) as `notice`."""
        report["stats"]["context"] = self.receipt()
        report["receipt"]["context"] = self.receipt()
        report["notice"] = self.notice()


def _turns(messages: list[dict]) -> list[list[int]]:
    """Indices of the droppable turns, oldest first: each non-system message run that starts at
    a user message (or at the start), up to the next user message; the last user message and
    everything after it are never included."""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    end = len(messages) if last_user is None else last_user
    turns: list[list[int]] = []
    for i in range(end):
        if messages[i].get("role") == "system":
            continue
        if messages[i].get("role") == "user" or not turns:
            turns.append([])
        turns[-1].append(i)
    return turns


def room_advice(shorten: str, ctx: int, most: int | None = None) -> str:
    """What to do about a prompt too long for a context of `ctx` positions: `shorten` it, lower
    max_tokens, or raise the context length, up to the model's own `most` where it is known;
    not that where the context is all of the model's already."""
    if most is not None and ctx >= most:
        return f"{shorten} or lower max_tokens ({most} positions is the model's whole context)"
    up_to = f" (up to the model's {most})" if most is not None else ""
    return f"{shorten}, lower max_tokens or raise the context length{up_to}"


def fit(tokenizer, messages: list[dict], max_tokens: int, ctx: int,
        policy: str = "drop_oldest", most: int | None = None, tools: list | None = None) -> Fitted:
    """The prompt ids for `messages` (and `tools`, which the template renders) under the
    context-full policy (see the module docstring). `most`, the model's own context where known,
    is what an error's advice names."""
    if policy not in POLICIES:
        raise OptionsError(f"unknown context_overflow policy {policy!r}: use one of {POLICIES}")
    ids = tokenizer.encode_chat(messages, tools=tools)
    if len(ids) + max_tokens <= ctx:
        return Fitted(ids)
    full, gone = len(ids), set()
    if policy == "drop_oldest":
        turns = _turns(messages)

        def without(n: int) -> tuple[set, list[int]]:     # the n oldest turns left out
            out = {i for turn in turns[:n] for i in turn}
            return out, tokenizer.encode_chat([m for i, m in enumerate(messages) if i not in out],
                                              tools=tools)

        # Room for max_tokens, or, where no count of turns left out makes it, room for the
        # prompt alone (the answer is cut at the context: leaving more out would lose the
        # conversation and still not honour max_tokens).
        room = max_tokens if len(without(len(turns))[1]) + max_tokens <= ctx else 1
        # The fewest turns to leave out; fitting only gets easier with more left out, so a
        # binary search over the count (a conversation may have thousands of messages).
        lo, hi = 0, len(turns)
        while lo < hi:
            mid = (lo + hi) // 2
            if len(without(mid)[1]) + room <= ctx:
                hi = mid
            else:
                lo = mid + 1
        if lo:
            gone, ids = without(lo)
    if policy == "error" and len(ids) + max_tokens > ctx:
        raise PromptTooLongError(
            f"the prompt needs {len(ids)} tokens + max_tokens {max_tokens} but the context holds "
            f"{ctx} (context_overflow is 'error'; 'drop_oldest' leaves out the oldest turns)"
            + "; " + room_advice("shorten the last message", ctx, most))
    if len(ids) >= ctx:
        older = " even with every older turn left out" if gone else ""
        raise PromptTooLongError(
            f"the prompt needs {len(ids)} tokens{older} and the context holds {ctx}, which "
            "leaves no room for an answer; " + room_advice("shorten the last message", ctx, most))
    short = ctx - len(ids) if len(ids) + max_tokens > ctx else None
    return Fitted(ids, len(gone), full - len(ids), short)
