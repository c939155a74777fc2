"""Security events of a sealed store: chunks that failed authentication (forged, damaged, moved
from another name, namespace or store, or sealed under a key the store does not hold).

Invariants: every event is counted (this process's count only grows while the store is open;
the index counts them per namespace as ``auth_failures``, across restarts and servers); the first
event of a quiet spell is logged at once, at error, later ones at most once per ``log_interval_s``
as one summary line, and a summary still owed is logged when the store closes, so none goes
unreported and an attacker cannot flood the log. A line names the namespace and the chunk's
stored name, never its contents.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

log = logging.getLogger("chunkstore.security")


class SecurityEvents:
    """Counts and logs the authentication failures of the store at ``where``; thread-safe."""

    def __init__(self, where: Path | str, log_interval_s: float) -> None:
        self.where = where
        self.log_interval_s = log_interval_s
        self._lock = threading.Lock()
        self.count = 0
        self.last_at: float | None = None  # epoch seconds of the last event
        self._unlogged = 0
        self._last_line: str | None = None
        self._logged_at = float("-inf")  # time.monotonic() of the last line

    def failed_authentication(self, name: bytes, namespace: str, why: str) -> None:
        what = f"namespace {namespace!r}, chunk {name.hex()}: {why}"
        now = time.monotonic()
        with self._lock:
            self.count += 1
            self.last_at = time.time()
            quiet = now - self._logged_at >= self.log_interval_s
            if quiet and not self._unlogged:
                self._logged_at = now
                line, summary = what, None
            else:
                self._unlogged += 1
                self._last_line = what
                line, summary = None, self._take_summary(now) if quiet else None
        if line is not None:
            log.error("security: a sealed chunk of the store at %s failed authentication and was not served "
                      "(it is quarantined): %s; further failures are summarised at most every %.0f s",
                      self.where, line, self.log_interval_s)
        self._log_summary(summary)

    def flush_log(self) -> None:
        """Log the summary still owed (at close)."""
        with self._lock:
            summary = self._take_summary(time.monotonic())
        self._log_summary(summary)

    def _take_summary(self, now: float) -> tuple[int, str | None] | None:
        if not self._unlogged:
            return None
        summary = (self._unlogged, self._last_line)
        self._unlogged, self._logged_at = 0, now
        return summary

    def _log_summary(self, summary: tuple[int, str | None] | None) -> None:
        if summary is not None:
            log.error("security: %d more sealed chunk(s) of the store at %s failed authentication and were not "
                      "served; the last: %s", summary[0], self.where, summary[1])
