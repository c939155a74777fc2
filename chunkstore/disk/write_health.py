"""The disk tier's write health: every failed chunk write counted, the last one remembered, all logged
without flooding the log.

Invariants: every recorded failure is counted (the counts only grow while the store is open); the
first failure after a healthy spell is logged at once, later ones at most once per ``log_interval_s``
as one summary line (how many failed since the last line, the last reason, the folder), and a summary
still owed is logged when a write succeeds again or the store closes, so no failure goes unreported;
the store is degraded from a failed write until a write succeeds.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("chunkstore.disk.store")

LOG_INTERVAL_S = 60.0  # at most one summary line of failed writes per this many seconds


@dataclass(frozen=True, slots=True)
class WriteHealth:
    """The writes of one open store (a process's view: it starts healthy at every open)."""

    failures: int = 0  # failed write operations: a page's file, a batch's publish or commit, an index flush
    failed_pages: int = 0  # pages those failures left unwritten
    last_error: str | None = None  # what failed and why, e.g. "chunk file: [ENOSPC] No space left on device"
    last_error_at: float | None = None  # epoch seconds
    last_ok_at: float | None = None  # epoch seconds of the last write that succeeded
    degraded: bool = False  # the last write failed and none has succeeded since


def describe(exc: BaseException) -> str:
    """The reason of a failed write: the errno's name and text, or SQLite's own message."""
    if isinstance(exc, OSError) and exc.errno is not None:
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        return f"[{name}] {exc.strerror or exc}"
    orig = getattr(exc, "orig", None)  # SQLAlchemy wraps the sqlite3 error
    return str(orig if orig is not None else exc) or type(exc).__name__


class WriteFailures:
    """Records the outcome of the writes to the store at ``folder``; thread-safe."""

    def __init__(self, folder: Path, log_interval_s: float = LOG_INTERVAL_S, kind: str = "write") -> None:
        self.folder = folder
        self.kind = kind  # "write", or "read" (a shared tier's index or bucket that stops answering)
        self.log_interval_s = log_interval_s
        self._lock = threading.Lock()
        self._health = WriteHealth()
        self._unlogged = 0  # failures since the last line about them
        self._unlogged_pages = 0
        self._logged_at = float("-inf")  # time.monotonic() of that line

    def failed(self, what: str, exc: BaseException, num_pages: int = 1) -> None:
        """Count a failed write of ``num_pages`` pages (0: an index write of no page); ``what``
        names the step (chunk file, publish, index commit, index flush)."""
        reason = f"{what}: {describe(exc)}"
        now = time.monotonic()
        with self._lock:
            h = self._health
            first = not h.degraded
            self._health = WriteHealth(h.failures + 1, h.failed_pages + num_pages, reason, time.time(),
                                       h.last_ok_at, True)
            self._unlogged += 1
            self._unlogged_pages += num_pages
            line = self._take_line(now) if first or now - self._logged_at >= self.log_interval_s else None
        if line is None:
            return
        if first:
            log.error("%ss of the store at %s fail: %s (%d page(s)); further failures are summarised at most "
                      "every %.0f s", self.kind, self.folder, reason, num_pages, self.log_interval_s)
        else:
            self._log_summary(line)

    def succeeded(self) -> None:
        """A write reached the disk: the store is healthy again (logged if it was not)."""
        with self._lock:
            h = self._health
            self._health = WriteHealth(h.failures, h.failed_pages, h.last_error, h.last_error_at, time.time(), False)
            line = self._take_line(time.monotonic()) if h.degraded else None
        if line is not None:
            self._log_summary(line)
            log.warning("%ss of the store at %s succeed again (%d failed %s(s) since it opened)",
                        self.kind, self.folder, h.failures, self.kind)

    def flush_log(self) -> None:
        """Log the summary still owed (at close)."""
        with self._lock:
            line = self._take_line(time.monotonic())
        self._log_summary(line)

    def health(self) -> WriteHealth:
        with self._lock:
            return self._health

    def _take_line(self, now: float) -> tuple[int, int, str | None]:
        line = (self._unlogged, self._unlogged_pages, self._health.last_error)
        self._unlogged = self._unlogged_pages = 0
        self._logged_at = now
        return line

    def _log_summary(self, line: tuple[int, int, str | None]) -> None:
        count, pages, reason = line
        if count:
            log.error("%d more %s(s) of the store at %s failed (%d page(s)); the last: %s",
                      count, self.kind, self.folder, pages, reason)
