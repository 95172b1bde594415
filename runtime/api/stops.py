"""Stop sequences over streamed text: a piece is released only once no stop
string can still begin inside it, so a client never sees part of a stop."""

from __future__ import annotations


class StopScanner:
    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.held = ""  # text that may be the start of a stop string
        self.stopped = False

    def push(self, piece: str) -> str:
        """The text that is safe to emit now; sets .stopped when a stop string appeared."""
        if self.stopped:
            return ""
        text = self.held + piece
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self.held = True, ""
            return text[:min(hits)]
        keep = 0  # the longest tail of text that is a proper prefix of some stop string
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), keep, -1):
                if text.endswith(s[:n]):
                    keep = n
                    break
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        """At the end of generation the held text was no stop after all."""
        held, self.held = self.held, ""
        return "" if self.stopped else held
