"""Prefault a CPU page pool's memory in the background, at idle priority.

A pool's buffer is allocated empty, so start-up does not wait for gigabytes to be zeroed; but a
CPU page written for the first time pays a page fault and the kernel's zeroing (about 7x the cost
of a later write here), which would fall on the first loads into each slot. ``Prefaulter`` asks the
kernel to map the whole buffer writable in the background, 64 MiB at a time, with
``madvise(MADV_POPULATE_WRITE)``.

Invariants: populating never changes a byte that is already mapped (it only maps what is not), so
it races with no writer and needs no lock; the thread runs under SCHED_IDLE (only on cycles nothing
else wants) where Linux allows it; ``close`` stops it between two steps and joins it, so no call is
in flight after the pool's owner closes; where the call is missing (another OS, a kernel before
5.14) nothing happens and pages fault on first write, as they would without this.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading

import torch

log = logging.getLogger(__name__)

MADV_POPULATE_WRITE = 23  # Linux 5.14+
STEP_BYTES = 64 << 20


def _madvise():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _run_at_idle_priority() -> None:
    try:  # pid 0: the calling thread
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass


class Prefaulter:
    """Maps ``buffer`` (a CPU tensor) writable in the background; ``close()`` stops and joins."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer  # kept alive while the thread may touch its memory
        self._stop = threading.Event()
        self.populated_bytes = 0
        self._thread = threading.Thread(target=self._run, name="chunkstore-prefault", daemon=False)
        self._thread.start()

    def _run(self) -> None:
        madvise = _madvise()
        if madvise is None:
            return
        _run_at_idle_priority()
        page = os.sysconf("SC_PAGE_SIZE")
        addr = self._buffer.data_ptr()
        start = -(-addr // page) * page  # the partial pages at either end fault on first write
        end = (addr + self._buffer.numel() * self._buffer.element_size()) // page * page
        while start < end and not self._stop.is_set():
            length = min(STEP_BYTES, end - start)
            if madvise(start, length, MADV_POPULATE_WRITE) != 0:
                log.debug("prefault stopped: madvise errno %d", ctypes.get_errno())
                return
            start += length
            self.populated_bytes += length

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the whole buffer (tests, benchmarks); True when the thread is done."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
