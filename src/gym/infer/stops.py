"""Stop strings: text is cut before the first one, as in OpenAI's API, and never streamed."""

from __future__ import annotations

from collections.abc import Iterator


class StopFilter:
    """Text in, text out, up to the first stop string (not included, as in OpenAI's API). Text that could
    still turn into a stop string is held back until it cannot, so a stop string is never streamed."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self.held = ""
        self.stopped = False

    def push(self, piece: str) -> str:
        """The text now safe to emit; after a stop string is seen, `stopped` is set and nothing more passes."""
        if self.stopped:
            return ""
        if not self.stops:
            return piece
        self.held += piece
        found = [i for i in (self.held.find(s) for s in self.stops) if i >= 0]
        if found:
            self.stopped = True
            out, self.held = self.held[: min(found)], ""
            return out
        # Keep the longest tail that is a prefix of some stop string; the rest is safe to emit.
        keep = next((n for n in range(min(self.longest - 1, len(self.held)), 0, -1)
                     if any(s.startswith(self.held[-n:]) for s in self.stops)), 0)
        out, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep:]
        return out

    def flush(self) -> str:
        """What was held back, once the text has ended without a stop string."""
        out, self.held = ("" if self.stopped else self.held), ""
        return out


def cut_at_stop(pieces: Iterator[str], stops: list[str]) -> Iterator[str]:
    """Pass text through until the first stop string, which is not passed (see StopFilter)."""
    stop_filter = StopFilter(stops)
    for piece in pieces:
        out = stop_filter.push(piece)
        if out:
            yield out
        if stop_filter.stopped:
            return
    tail = stop_filter.flush()
    if tail:
        yield tail
