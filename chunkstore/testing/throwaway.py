"""What every throwaway server of the tests has in common (postgres.py, pgbouncer.py, moto_s3.py,
radosgw.py): a context manager that starts it on entry and stops it on exit, and stopping a
process by its PID, a polite signal first and SIGKILL after a bound."""

from __future__ import annotations

import signal
import subprocess
from types import TracebackType
from typing import Self


class Throwaway:
    """A server that ``start`` starts and ``stop`` stops (idempotent, also after a failed start)."""

    def start(self) -> None:  # pragma: no cover - each server has its own
        raise NotImplementedError

    def stop(self) -> None:  # pragma: no cover - each server has its own
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def end_process(process: subprocess.Popen, first_signal: signal.Signals, timeout_s: float) -> None:
    """Stop ``process`` by its PID: ``first_signal``, then SIGKILL if it has not exited within
    ``timeout_s``; reaped either way. Nothing to do when it has exited already."""
    if process.poll() is not None:
        return
    process.send_signal(first_signal)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout_s)
