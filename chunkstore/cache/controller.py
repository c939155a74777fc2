"""TierController: one worker thread and one queue per transfer path; it moves bytes and reports acks.

Invariants: the controller never touches the radix tree; every copy between tiers runs here (on
a worker, or on the caller's thread with ``run_now``) and hands every outcome, success or failure,
to the cache as an ``Ack`` (so a slot is never left owned by nobody and a page is never marked
present by a failed copy); the controller's ``InFlight`` registry is the one record of work in
flight: an operation is in it from submission until its last ack was applied, and its ``done`` is
set only then; a worker survives any error of one operation. On CUDA, the two copy paths run on
their own streams, ordered after the compute that wrote the pages. The workers of the copies
nobody waits for (backup, persist: BACKGROUND_PATHS) run at ``background_priority``, and so do
the store reads of speculative prefetches (for queued requests); a request's own loads, the
load-back and ``run_now`` keep the request path's.
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
from chunkstore.cache.tiers import Tier
from chunkstore.disk.store import ChunkStore
from chunkstore.priority import ThreadPriority, lower_this_thread

log = logging.getLogger(__name__)

DEFAULT_PREFETCH_BATCH_PAGES = 128  # pages per store read batch: as the store benchmark's batches
BACKGROUND_PATHS = (TransferPath.DEVICE_TO_HOST, TransferPath.HOST_TO_DISK)


class InFlight:
    """The operations submitted and not finished yet, by path and by page key.

    An operation is added at submission and finished once its last ack was applied: its keys leave
    the registry, then ``done`` is set (so a caller that sees ``done`` never finds the op here),
    then waiters of ``wait_idle`` wake. A key maps to the newest op of its path that covers it, and
    to the one before once that one finishes. Thread-safe; its lock is a leaf (held for dict updates
    only, never while calling out), so the cache may ask it under the tree's lock.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._ops: dict[TransferPath, set[TransferOp]] = {p: set() for p in TransferPath}
        # per path, per key: the ops covering it, oldest first (almost always one)
        self._by_key: dict[TransferPath, dict[bytes, list[TransferOp]]] = {p: {} for p in TransferPath}

    def add(self, op: TransferOp) -> None:
        with self._changed:
            self._ops[op.path].add(op)
            by_key = self._by_key[op.path]
            for key in op.keys:
                by_key.setdefault(key, []).append(op)

    def finish(self, op: TransferOp) -> None:
        """Drop ``op`` (a no-op when it is not here), set its ``done`` and wake the idle waiters."""
        with self._changed:
            if op in self._ops[op.path]:
                self._ops[op.path].discard(op)
                by_key = self._by_key[op.path]
                for key in op.keys:
                    ops = by_key[key]
                    ops.remove(op)
                    if not ops:
                        del by_key[key]
            op.done.set()
            if self.num_ops == 0:
                self._changed.notify_all()

    def op_for(self, path: TransferPath, key: bytes) -> TransferOp | None:
        """The op of ``path`` in flight that covers the page ``key``, or None."""
        with self._changed:
            ops = self._by_key[path].get(key)
            return ops[-1] if ops else None

    def covers(self, path: TransferPath, key: bytes) -> bool:
        return self.op_for(path, key) is not None

    @property
    def num_ops(self) -> int:
        """Operations in flight, all paths."""
        return sum(len(ops) for ops in self._ops.values())

    def depths(self) -> dict[TransferPath, int]:
        """Operations in flight per path."""
        with self._changed:
            return {p: len(ops) for p, ops in self._ops.items()}

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until no operation is in flight; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self.num_ops == 0, timeout_s)


class _Worker:
    """One thread draining one queue; each op's acks go to ``on_ack`` in order, and the last one
    finishes the op in ``in_flight``."""

    def __init__(self, path: TransferPath, run: Callable[[TransferOp], Iterator[Ack]],
                 on_ack: Callable[[Ack], None], in_flight: InFlight,
                 priority: ThreadPriority = ThreadPriority.NORMAL) -> None:
        self.path, self.priority = path, priority
        self.queue: queue.Queue[TransferOp | None] = queue.Queue()
        self._run, self._on_ack, self._in_flight = run, on_ack, in_flight
        self._started = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"chunkstore-{path.value}", daemon=True)
        self.thread.start()
        self._started.wait()  # at its priority before any op reaches it

    def _loop(self) -> None:
        lower_this_thread(self.priority)
        self._started.set()
        while True:
            op = self.queue.get()
            if op is None:
                return
            try:
                self._execute(op)
            finally:
                self._in_flight.finish(op)  # already done after its last ack; here for a bug's sake

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
        op = ack.op
        op.num_acked_pages = ack.start_page + len(ack.ok)
        op.num_failed_pages += len(ack.ok) - ack.num_ok
        try:
            self._on_ack(ack)
        except Exception:  # the cache's bug must not kill the worker (nor hang the waiters)
            log.exception("applying an ack of %s failed", self.path.value)
        finally:
            if ack.is_last:
                self._in_flight.finish(op)


class TierController:
    """Runs transfers between the device pool, the host pool and the store on four worker threads.

    ``on_ack(ack)`` is called on the worker's thread for every outcome (the cache applies it under
    its own lock; an op with ``is_applied_by_caller`` is applied by whoever waits for it instead).
    ``in_flight`` is the registry of the ops not finished yet, which the cache asks before it
    starts a copy. ``store`` may be None (no disk tier: nothing may be submitted to the disk
    paths). Thread-safe.
    """

    def __init__(self, device_pool: PagePool, host_pool: PagePool, store: ChunkStore | None,
                 on_ack: Callable[[Ack], None], *,
                 prefetch_batch_pages: int = DEFAULT_PREFETCH_BATCH_PAGES,
                 background_priority: ThreadPriority = ThreadPriority.NORMAL) -> None:
        if prefetch_batch_pages < 1:
            raise ValueError(f"prefetch_batch_pages must be >= 1, got {prefetch_batch_pages}")
        self.device_pool, self.host_pool, self.store = device_pool, host_pool, store
        self.prefetch_batch_pages = prefetch_batch_pages
        uses_cuda = device_pool.device.type == "cuda"
        self._streams = {p: torch.cuda.Stream(device_pool.device) if uses_cuda else None
                         for p in (TransferPath.DEVICE_TO_HOST, TransferPath.HOST_TO_DEVICE)}
        self.in_flight = InFlight()
        self._submitting = threading.Lock()  # orders submissions against close's stop markers
        self._is_closed = False
        runs = {
            TransferPath.DEVICE_TO_HOST: self._backup,
            TransferPath.HOST_TO_DISK: self._persist,
            TransferPath.DISK_TO_HOST: self._prefetch,
            TransferPath.HOST_TO_DEVICE: self._load_back,
        }
        background = ThreadPriority.parse(background_priority)
        self._workers = {p: _Worker(p, run, on_ack, self.in_flight,
                                    background if p in BACKGROUND_PATHS else ThreadPriority.NORMAL)
                         for p, run in runs.items()}

    # -- submission and waiting --------------------------------------------------------------------

    def submit(self, op: TransferOp) -> None:
        """Queue ``op`` on its path's worker; it is in ``in_flight`` from now until its last ack was
        applied. After ``close`` the op fails at once, on this thread: its failure ack is delivered
        (so the cache frees what the op owned) and ``done`` is set. Never waits (the cache submits
        under its lock). Raises ValueError for a disk path without a store."""
        if Tier.DISK in (op.path.source, op.path.destination) and self.store is None:
            raise ValueError(f"{op.path.value} needs a disk tier")
        self.in_flight.add(op)
        with self._submitting:
            is_closed = self._is_closed
            if not is_closed:
                self._workers[op.path].queue.put(op)  # unbounded: never blocks
        if is_closed:
            op.error = "the tier controller is closed"
            self._workers[op.path].deliver(Ack(op, 0, (False,) * op.num_pages, 0, 0.0, True, op.error))

    def run_now(self, op: TransferOp) -> None:
        """Run ``op`` on the calling thread, acks and all, as its worker would; ``done`` is set on
        return, and ``op.num_failed_pages`` says how it went. For a copy the caller would only wait
        for: on a CPU pool, handing it to a worker costs two thread switches (each up to the
        interpreter's switch interval when other threads hold the GIL) and overlaps nothing; and
        for the copy an eviction makes under the cache's lock (``is_applied_by_caller``), which
        must not wait for a worker. Works after ``close`` too (it needs no thread)."""
        self.in_flight.add(op)
        try:
            self._workers[op.path]._execute(op)
        finally:
            self.in_flight.finish(op)

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until no operation is queued or running (acks applied); False on timeout.

        Never call it while holding the cache's lock: applying acks takes that lock.
        """
        return self.in_flight.wait_idle(timeout_s)

    @property
    def num_pending(self) -> int:
        """Operations submitted whose last ack has not been applied yet."""
        return self.in_flight.num_ops

    def queue_depths(self) -> dict[str, int]:
        """Operations queued or running, per path (by its value)."""
        return {p.value: n for p, n in self.in_flight.depths().items()}

    def close(self, timeout_s: float | None = None) -> None:
        """Finish what is queued, then stop the threads. Idempotent."""
        with self._submitting:
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
        try:
            return src.copy_to(dst, src_slots, dst_slots, non_blocking=stream is not None, stream=stream)
        except BaseException:
            if stream is not None:
                # A copy may be queued before the failure: its slots are freed once this fails.
                stream.synchronize()
            raise

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
            hits = self.store.get_into(op.pages[begin:end], self.host_pool.views(op.host_slots[begin:end]),
                                       background=op.speculative)
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
