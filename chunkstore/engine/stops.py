"""OutputText: a generation's text as it grows, cut at the first stop string, streamed safely.

Invariants: ``text`` never contains a stop string (it ends where the earliest one began); the
deltas returned by ``append`` and ``finish``, concatenated, equal ``text``; nothing is emitted
that a later stop string could still cut off (a tail that is a prefix of a stop string is held
back until it is decided); the work per appended delta is O(number of stops x (longest stop +
delta)), never a rescan of the text: a stop can only end in the new text, and the held-back tail
can only start at or after the first character not yet emitted (an emitted position began no stop
string, and no later text can make it begin one).
"""

from __future__ import annotations

from collections.abc import Sequence


class OutputText:
    """Accumulates text deltas and watches for ``stop`` strings."""

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self.stop = tuple(stop)
        self._longest_stop = max((len(s) for s in self.stop), default=0)
        self.text = ""
        self._emitted = 0  # characters of text already returned
        self.is_stopped = False

    def append(self, delta: str) -> str:
        """Add ``delta``; returns the text now safe to stream. Sets ``is_stopped`` (and cuts
        ``text``) when a stop string appears. Raises ValueError after a stop."""
        if self.is_stopped:
            raise ValueError("text appended after a stop string")
        # A stop string that ends in the new text starts at most longest_stop - 1 characters before it.
        search_from = max(0, len(self.text) - self._longest_stop + 1)
        self.text += delta
        cut = min((i for i in (self.text.find(s, search_from) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.text = self.text[:cut]
            self.is_stopped = True
            return self._emit(len(self.text))
        return self._emit(len(self.text) - self._held_back())

    def finish(self) -> str:
        """The rest of the text (what was held back), at the end of the generation."""
        return self._emit(len(self.text))

    def _held_back(self) -> int:
        """Length of the longest tail of ``text`` that begins some stop string. The positions
        checked start at the first one not emitted; those that fail are emitted by the caller, so
        each is checked at most once more than the tokens it stays held back for."""
        for start in range(max(self._emitted, len(self.text) - self._longest_stop + 1), len(self.text)):
            if any(s.startswith(self.text[start:]) for s in self.stop):
                return len(self.text) - start
        return 0

    def _emit(self, end: int) -> str:
        end = max(end, self._emitted)
        delta, self._emitted = self.text[self._emitted:end], end
        return delta
