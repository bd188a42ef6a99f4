"""What a request gives back: the chunks it streams, its result, and a Resume to go on from.

Text is emitted only for committed tokens, so a chunk never shows a token twice; each chunk
carries the ids behind its text, which is what a Resume needs after a fault (docs/faults.md).
Not here: the loop that makes them (engine.py), the stats (stats.py), the receipt (receipts.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Chunk:
    """Text newly shown, and the tokens committed since the last chunk. With stop strings, the
    ids may include tokens whose text is (partly) held back (stops.py): the held tail is a
    function of the text, so a Resume from the ids recomputes it and shows it when decided."""
    offset: int          # character offset of `text` in the whole output
    text: str
    n_tokens: int        # tokens committed since the last chunk: len(ids)
    ids: list[int] = field(default_factory=list)   # their ids, what a Resume goes on from
    cycle: int = 0       # cycles this request has run so far (fault drills strike by it)
    kinds: list[str] = field(default_factory=list)  # each id's TOKEN_KINDS entry
    starts: list[int] = field(default_factory=list) # each id's character offset in the output
                                                    # (where its text begins; never in receipts)


# What each emitted token was, for pages that show speculation at work: "champion" a plain decode
# step (k = 0), "accepted" a draft the champion accepted, "corrected" the champion's own token at
# the first rejected draft, "bonus" its token after a block accepted whole, "forced" the one token
# a JSON schema allowed (drafted for free). A forced token is also an accepted draft; forced wins.
TOKEN_KINDS = ("champion", "accepted", "corrected", "bonus", "forced")


def token_kind(i: int, n_accepted: int, k: int) -> str:
    """The kind of token i of a cycle's verdict (n_accepted drafts of k, then one champion token)."""
    if i < n_accepted:
        return "accepted"
    return "champion" if k == 0 else "bonus" if n_accepted == k else "corrected"


@dataclass
class Resume:
    """Where an interrupted run of the same request got to: `ids`, the token ids its
    chunks carried (all it committed, in order), and `fault`, what interrupted it, for the
    receipt: {"kind": a code, "cycle": int, "restart_s": seconds from the fault until this
    request began}. The request goes on from prompt + ids; the ids count toward max_tokens."""
    ids: list[int]
    fault: dict | None = None


@dataclass
class Result:
    text: str
    tokens: list[int]
    finish_reason: str   # "stop" (end of generation token), "length" (max_tokens), "context",
                         # "cancelled" (should_stop said so between cycles), "tool_calls"
                         # (an end of generation after the calls of a tools request)
    stats: dict
    receipt: dict
    # A tools request's answer split (text/toolcalls.result): its calls in OpenAI's shape
    # ([] where it called none) and the content before them; None for any other request.
    tool_calls: list | None = None
    content: str | None = None
