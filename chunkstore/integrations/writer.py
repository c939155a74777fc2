"""PageWriter: pages an engine hands over, put into a ChunkStore by one background thread.

Invariants: ``submit`` returns once the pages are queued (the caller has copied them out of the
engine's memory already), waiting first while ``max_pending_bytes`` are queued, so the engine's
thread never waits for compression or fsync and memory stays bounded; the thread runs at
``priority`` (``low`` by default, nice 19: under ``idle`` a thread descheduled while it holds the
GIL or the index's write lock would stall the engine on a saturated host); a page is visible in
the store only once ``put`` published it, so a failed write is a miss later, never a partial
page; ``flush`` waits until everything submitted has been put (or failed, or the thread died);
``close`` writes what is queued and joins the thread; a ``submit`` after ``close`` raises. A page
submitted is readable at once: until its put ends, ``pending`` hands out the caller's copy (an
engine that frees its own copy once a save returns finds the page when it asks right after), and
a put that ends published makes the store answer for it before the copy goes. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass

import torch

from chunkstore.disk import ChunkStore, PageRef
from chunkstore.priority import ThreadPriority, lower_this_thread

log = logging.getLogger(__name__)


def close_at_exit(owner: object) -> None:
    """Call ``owner.close()`` at interpreter exit, before the store's worker pools stop taking work
    (concurrent.futures' own exit hook: the hooks run newest first), so what an engine queued is
    written, not dropped, when it exits without closing its backend. Weakly referenced: an owner
    closed and dropped is not kept alive."""
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        ref = weakref.ref(owner)
        register(lambda: (o := ref()) is not None and o.close())


@dataclass(slots=True)
class _Batch:
    pages: list[PageRef]
    tensors: list[torch.Tensor]
    size_bytes: int


class PageWriter:
    def __init__(self, store: ChunkStore, *, priority: ThreadPriority = ThreadPriority.LOW,
                 max_pending_bytes: int = 1 << 30, name: str = "chunkstore-writer"):
        self.store, self.priority, self.max_pending_bytes = store, ThreadPriority.parse(priority), max_pending_bytes
        self._queue: deque[_Batch] = deque()
        self._pending_bytes = 0
        self._in_write = 0  # batches taken by the thread and not finished
        self._copies: dict[bytes, torch.Tensor] = {}  # page key -> its newest submitted copy, until put
        self._changed = threading.Condition()
        self._is_closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        close_at_exit(self)

    def submit(self, pages: list[PageRef], tensors: list[torch.Tensor]) -> None:
        """Queue ``tensors`` (the caller's own copies) for ``pages``. Raises RuntimeError once closed."""
        if not pages:
            return
        size = sum(t.numel() * t.element_size() for t in tensors)
        with self._changed:
            while True:
                if self._is_closed or not self._thread.is_alive():
                    raise RuntimeError("the page writer is closed")
                if not self._pending_bytes or self._pending_bytes + size <= self.max_pending_bytes:
                    break
                self._changed.wait(1.0)  # backpressure on the engine's saving thread
            self._queue.append(_Batch(pages, tensors, size))
            self._pending_bytes += size
            self._copies.update(zip((p.key for p in pages), tensors))
            self._changed.notify_all()

    def pending(self, keys: list[bytes]) -> list[torch.Tensor | None]:
        """The submitted copy of each page of ``keys`` whose put has not ended, else None (a page
        already put is the store's to answer for; one that failed is a miss). Read-only: the
        caller copies out of it."""
        with self._changed:
            return [self._copies.get(k) for k in keys]

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted batch is put (published or failed); False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._changed:
            while self._queue or self._in_write:
                if not self._thread.is_alive():
                    return False  # nothing will drain the queue any more
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(1.0 if left is None else min(left, 1.0))
        return True

    def close(self) -> None:
        """Write what is queued, then stop the thread. Idempotent; leaves the store open."""
        with self._changed:
            self._is_closed = True
            self._changed.notify_all()
        self._thread.join()

    def _loop(self) -> None:
        lower_this_thread(self.priority)
        while True:
            with self._changed:
                while not self._queue and not self._is_closed:
                    self._changed.wait()
                if not self._queue:
                    return  # closed and drained
                batch = self._queue.popleft()
                self._in_write += 1
            try:
                result = self.store.put(batch.pages, batch.tensors)
                if result.failed:
                    log.warning("chunkstore: %d of %d pages not stored: %s", len(result.failed), len(batch.pages),
                                next(iter(result.failed.values())))
            except Exception:  # the pages are misses later; the writer goes on
                log.exception("chunkstore: writing %d pages failed", len(batch.pages))
            finally:
                with self._changed:
                    self._in_write -= 1
                    self._pending_bytes -= batch.size_bytes
                    for page, tensor in zip(batch.pages, batch.tensors):
                        if self._copies.get(page.key) is tensor:  # not a newer submit's copy
                            del self._copies[page.key]
                    self._changed.notify_all()
