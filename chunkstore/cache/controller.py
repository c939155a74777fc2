"""TierController: one worker thread and one queue per transfer path; it moves bytes and reports acks.

Invariants: the controller never touches the radix tree; it runs an operation's copy and hands
every outcome, success or failure, to the cache as an ``Ack`` (so a slot is never left owned by
nobody and a page is never marked present by a failed copy); an operation's ``done`` is set only
after its last ack was applied; a worker survives any error of one operation. On CUDA, the two
copy paths run on their own streams, ordered after the compute that wrote the pages.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator

import torch

from chunkstore.cache.ops import (
    Ack, BackupOp, LoadBackOp, PersistOp, PrefetchOp, TransferOp, TransferPath,
)
from chunkstore.cache.pools import PagePool
from chunkstore.disk.store import ChunkStore

log = logging.getLogger(__name__)

DEFAULT_PREFETCH_BATCH_PAGES = 128  # pages per store read batch: as the store benchmark's batches


class _Worker:
    """One thread draining one queue; each op's acks go to ``on_ack`` in order."""

    def __init__(self, path: TransferPath, run: Callable[[TransferOp], Iterator[Ack]],
                 on_ack: Callable[[Ack], None], on_finished: Callable[[TransferOp], None]) -> None:
        self.path = path
        self.queue: queue.Queue[TransferOp | None] = queue.Queue()
        self._run, self._on_ack, self._on_finished = run, on_ack, on_finished
        self.thread = threading.Thread(target=self._loop, name=f"chunkstore-{path.value}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            op = self.queue.get()
            if op is None:
                return
            try:
                self._execute(op)
            finally:
                op.done.set()
                self._on_finished(op)

    def _execute(self, op: TransferOp) -> None:
        is_finished = False
        try:
            for ack in self._run(op):
                self.deliver(ack)
                is_finished = ack.is_last
                if is_finished:
                    return
        except Exception as exc:  # the op failed; the rest of its pages are reported failed
            log.error("%s of %d pages failed: %s", self.path.value, op.num_pages, exc)
            op.error = f"{type(exc).__name__}: {exc}"
        if not is_finished:
            rest = op.num_pages - op.num_acked_pages
            self.deliver(Ack(op, op.num_acked_pages, (False,) * rest, 0, 0.0, True, op.error or "stopped"))

    def deliver(self, ack: Ack) -> None:
        ack.op.num_acked_pages = ack.start_page + len(ack.ok)
        try:
            self._on_ack(ack)
        except Exception:  # the cache's bug must not kill the worker (nor hang the waiters)
            log.exception("applying an ack of %s failed", self.path.value)


class TierController:
    """Runs transfers between the device pool, the host pool and the store on four worker threads.

    ``on_ack(ack)`` is called on the worker's thread for every outcome (the cache applies it under
    its own lock). ``store`` may be None (no disk tier: nothing may be submitted to the disk paths).
    Thread-safe.
    """

    def __init__(self, device_pool: PagePool, host_pool: PagePool, store: ChunkStore | None,
                 on_ack: Callable[[Ack], None], *,
                 prefetch_batch_pages: int = DEFAULT_PREFETCH_BATCH_PAGES) -> None:
        if prefetch_batch_pages < 1:
            raise ValueError(f"prefetch_batch_pages must be >= 1, got {prefetch_batch_pages}")
        self.device_pool, self.host_pool, self.store = device_pool, host_pool, store
        self.prefetch_batch_pages = prefetch_batch_pages
        uses_cuda = device_pool.device.type == "cuda"
        self._streams = {p: torch.cuda.Stream(device_pool.device) if uses_cuda else None
                         for p in (TransferPath.DEVICE_TO_HOST, TransferPath.HOST_TO_DEVICE)}
        self._pending = 0
        self._pending_by_path = dict.fromkeys(TransferPath, 0)  # counted with _pending, under _idle
        self._idle = threading.Condition()
        self._is_closed = False
        runs = {
            TransferPath.DEVICE_TO_HOST: self._backup,
            TransferPath.HOST_TO_DISK: self._persist,
            TransferPath.DISK_TO_HOST: self._prefetch,
            TransferPath.HOST_TO_DEVICE: self._load_back,
        }
        self._workers = {p: _Worker(p, run, on_ack, self._finished) for p, run in runs.items()}

    # -- submission and waiting --------------------------------------------------------------------

    def submit(self, op: TransferOp) -> None:
        """Queue ``op`` on its path's worker. After ``close`` the op fails at once, on this thread:
        its failure ack is delivered (so the cache frees what the op owned) and ``done`` is set.
        Raises ValueError for a disk path without a store."""
        if op.path in (TransferPath.HOST_TO_DISK, TransferPath.DISK_TO_HOST) and self.store is None:
            raise ValueError(f"{op.path.value} needs a disk tier")
        with self._idle:
            is_closed = self._is_closed
            if not is_closed:
                self._pending += 1
                self._pending_by_path[op.path] += 1
        if is_closed:
            op.error = "the tier controller is closed"
            self._workers[op.path].deliver(Ack(op, 0, (False,) * op.num_pages, 0, 0.0, True, op.error))
            op.done.set()
            return
        self._workers[op.path].queue.put(op)

    def run_now(self, op: TransferOp) -> None:
        """Run ``op`` on the calling thread, acks and all, as its worker would; ``done`` is set on
        return. For a copy the caller would only wait for: on a CPU pool, handing it to a worker
        costs two thread switches (each up to the interpreter's switch interval when other
        threads hold the GIL) and overlaps nothing."""
        with self._idle:
            self._pending += 1
            self._pending_by_path[op.path] += 1
        worker = self._workers[op.path]
        try:
            worker._execute(op)
        finally:
            op.done.set()
            self._finished(op)

    def _finished(self, op: TransferOp) -> None:
        with self._idle:
            self._pending -= 1
            self._pending_by_path[op.path] -= 1
            if self._pending == 0:
                self._idle.notify_all()

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until no operation is queued or running (acks applied); False on timeout.

        Never call it while holding the cache's lock: applying acks takes that lock.
        """
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout_s)

    @property
    def num_pending(self) -> int:
        """Operations submitted whose last ack has not been applied yet."""
        return self._pending

    def queue_depths(self) -> dict[str, int]:
        """Operations queued or running, per path."""
        with self._idle:  # counted at submit and at the last ack: never 0 while a worker holds an op
            return {p.value: n for p, n in self._pending_by_path.items()}

    def close(self, timeout_s: float | None = None) -> None:
        """Finish what is queued, then stop the threads. Idempotent."""
        with self._idle:
            if self._is_closed:
                return
            self._is_closed = True
        for w in self._workers.values():
            w.queue.put(None)
        for w in self._workers.values():
            w.thread.join(timeout_s)

    # -- the four paths (each yields acks; an exception fails the op's remaining pages) -------------

    def _copy(self, path: TransferPath, src: PagePool, dst: PagePool, src_slots: torch.Tensor,
              dst_slots: torch.Tensor, ready: "torch.cuda.Event | None" = None) -> "torch.cuda.Event | None":
        stream = self._streams[path]
        if stream is not None and ready is not None:
            stream.wait_event(ready)
        return src.copy_to(dst, src_slots, dst_slots, non_blocking=stream is not None, stream=stream)

    def _backup(self, op: BackupOp) -> Iterator[Ack]:
        start = time.perf_counter()
        event = self._copy(op.path, self.device_pool, self.host_pool, op.device_slots, op.host_slots, op.ready)
        if event is not None:
            event.synchronize()  # the host copy is valid only once it has landed
        yield self._all_ok(op, start)

    def _load_back(self, op: LoadBackOp) -> Iterator[Ack]:
        start = time.perf_counter()
        op.event = self._copy(op.path, self.host_pool, self.device_pool, op.host_slots, op.device_slots,
                              op.ready)
        if op.event is not None:
            op.event.synchronize()  # acked only once landed: other requests may use the pages at once
        yield self._all_ok(op, start)

    def _persist(self, op: PersistOp) -> Iterator[Ack]:
        start = time.perf_counter()
        result = self.store.put(op.pages, self.host_pool.views(op.host_slots))
        ok = tuple(p.key not in result.failed for p in op.pages)
        if result.failed:
            op.error = next(iter(result.failed.values()))
        yield Ack(op, 0, ok, sum(ok) * self.host_pool.layout.page_size_bytes,
                  time.perf_counter() - start, True, op.error)

    def _prefetch(self, op: PrefetchOp) -> Iterator[Ack]:
        batch, n = self.prefetch_batch_pages, op.num_pages
        page_bytes = self.host_pool.layout.page_size_bytes
        for begin in range(0, n, batch):
            end = min(begin + batch, n)
            start = time.perf_counter()
            hits = self.store.get_into(op.pages[begin:end], self.host_pool.views(op.host_slots[begin:end]))
            ok = tuple(hits)
            if not all(ok):  # a hole ends the chain: the pages after it are of no use
                good = ok.index(False)  # pages read after the hole are discarded: not moved
                yield Ack(op, begin, ok[:good] + (False,) * (n - begin - good), good * page_bytes,
                          time.perf_counter() - start, True, "missing or corrupt on disk")
                return
            yield Ack(op, begin, ok, len(ok) * page_bytes, time.perf_counter() - start, end == n)

    def _all_ok(self, op: TransferOp, start: float) -> Ack:
        return Ack(op, 0, (True,) * op.num_pages, op.num_pages * self.host_pool.layout.page_size_bytes,
                   time.perf_counter() - start, True)
