"""Stop strings (OpenAI `stop`): end generation at the first character where one of them is
complete, cut it from the output, and never show a partial one.

`StopStrings.feed(piece)` takes the text of each committed token in order (the incremental
detokenizer's output) and returns what may be shown now. It holds back the longest suffix of the
text that is a proper prefix of some stop string, until the next pieces decide it, so a stream
never shows a stop string's beginning that later turns out to be one. Which stop wins: the one
complete at the earliest character; among those complete at the same character, the one that
starts earliest. This is a function of the text alone, not of how it was split into tokens or
cycles, so a speculative run stops exactly where champion-only decoding does (the engine feeds
token by token and drops the tokens after the one that completed the stop).

What is held back is a function of the text so far (`held_suffix`), so a resumed run, given the
ids an interrupted run's chunks carried, recomputes it: the chunks' text is the ids' text less
that suffix. Not here: detokenizing, the loop and finish reasons (engine.py).
"""

from __future__ import annotations

MAX_STOPS = 4    # as in the OpenAI API


def held_suffix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    for n in range(min(len(text), max((len(s) for s in stops), default=1) - 1), 0, -1):
        tail = text[-n:]
        if any(len(s) > n and s.startswith(tail) for s in stops):
            return n
    return 0


class StopStrings:
    """The request's stop strings and the text held back for them; see the module docstring."""

    def __init__(self, stops=()):
        self.stops = tuple(stops)
        self.held = ""    # text not shown yet: a proper prefix of some stop string

    def feed(self, piece: str) -> tuple[str, bool]:
        """Add a token's text; returns (text to show now, whether a stop string completed).
        When one completed, the text shown ends right before it and nothing is held."""
        if not self.stops:
            return piece, False
        buf, old = self.held + piece, len(self.held)
        best = None   # (end, start): the earliest end, then the earliest start
        for s in self.stops:
            # The held text holds no whole stop string: an occurrence ends inside `piece`.
            at = buf.find(s, max(0, old - len(s) + 1))
            if at >= 0 and (best is None or (at + len(s), at) < best):
                best = (at + len(s), at)
        if best is not None:
            self.held = ""
            return buf[:best[1]], True
        keep = held_suffix(buf, self.stops)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep], False

    def flush(self) -> str:
        """The held text, at an end that is not a stop string (length, end of generation)."""
        out, self.held = self.held, ""
        return out
