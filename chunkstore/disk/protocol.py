"""How a store's pages become visible and go again: the put path they share, and the folder's
protocol (FolderProtocol); a shared tier's is SharedProtocol (shared_protocol.py). The store
chooses one when it opens, by its payloads (``shared_name``), and is the only place that knows which.

Invariants, for both: a payload is published before its row is committed, and a row deleted
before its payload; nothing of a batch that failed stays visible (its payloads are removed again,
or left without a row, invisible, for verify --repair or the sweeper); a put under a capacity or
quota evicts within it first, never a stored parent of the batch (the new pages extend it), and
what does not fit fails. Folder: one process writes the store, so the writer lock is the only
lock, and a key stored by another thread meanwhile is found again under it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np
from sqlalchemy.exc import DBAPIError

from chunkstore.disk.eviction import EvictionPlan, EvictionSelection
from chunkstore.disk.eviction import plan as plan_of
from chunkstore.disk.file_check import FileStatus
from chunkstore.disk.index import ChunkRow, Victim
from chunkstore.disk.keys import PageRef
from chunkstore.disk.lanes import submit_all
from chunkstore.disk.page_io import encode_page
from chunkstore.disk.payloads import PayloadsUnavailable, Staged
from chunkstore.disk.results import PutResult, StoreStats, SweepResult

if TYPE_CHECKING:
    from chunkstore.disk.store import ChunkStore

# The pages a put still has to store, by stored key: each as the store keeps it (its stored key and
# its parent's: a sealed store's names, keyring.py), its bytes, and the page as the caller named it
# (what its chunk header holds).
Todo = dict[bytes, tuple[PageRef, np.ndarray, PageRef]]
Written = dict[bytes, tuple[Staged, int]]  # their staged payloads and stored sizes, by key


class StoreProtocol:
    """The put path both protocols share (encode and stage on the worker pool, make room, publish,
    commit), over the parts of ``store`` (its index, payloads, write health and workers); the
    steps where they differ are the methods a protocol overrides."""

    is_shared = False
    write_step = "chunk file"  # what a failed worker task is logged as
    replans_always = False  # whether an eviction plan is always made again under the locks

    def __init__(self, store: ChunkStore) -> None:
        self.store = store
        self.index = store._index
        self.payloads = store.payloads
        self.writes = store._writes
        self.pool = store._pool

    # -- the put path ------------------------------------------------------------------------

    def put(self, pages: Sequence[PageRef], arrays: Sequence[np.ndarray], originals: Sequence[PageRef],
            result: PutResult) -> PutResult:
        """Store ``pages`` (as the store keeps them) with their bytes ``arrays``; ``originals`` are
        the pages as the caller named them (the same, unless the store is sealed)."""
        raise NotImplementedError

    def todo(self, pages: Sequence[PageRef], arrays: Sequence[np.ndarray], originals: Sequence[PageRef],
             stored: set[bytes], result: PutResult) -> Todo:
        """The pages to write: a key ``stored`` already, or twice in the batch, is a duplicate."""
        todo: Todo = {}
        for p, t, original in zip(pages, arrays, originals):
            if p.key in stored or p.key in todo:
                result.deduplicated.append(p.key)
                self.index.count_event(p.namespace, "dedup_hits")
            else:
                todo[p.key] = (p, t, original)
        return todo

    def encode_and_stage(self, page: PageRef, raw: np.ndarray, original: PageRef) -> tuple[Staged, int]:
        """The chunk file of ``original`` (sealed under ``page``'s stored key in a sealed store),
        staged under that key; returns it and its size."""
        store = self.store
        segments, size = encode_page(original, raw, store.identity, store.codec, store.zstd_level)
        segments, size = store.sealing.seal(page, segments, size)
        return self.payloads.stage(page.key, segments), size

    def submit(self, todo: Todo, task) -> dict[bytes, Future]:
        """``task(page, raw)`` for every page on the worker pool, a future per page (lanes.py:
        one submission per worker thread, not per page)."""
        return dict(zip(todo, submit_all(self.pool, self.store.num_workers, task, list(todo.values()))))

    def collect(self, futures: dict[bytes, Future], todo: Todo, result: PutResult) -> Written:
        """Wait for the pages' tasks: what was written, with each failure listed in ``result``."""
        written: Written = {}
        try:
            for key, fut in futures.items():
                try:
                    written[key] = fut.result()
                except OSError as exc:
                    result.failed[key] = f"write failed: {exc}"
                    self.index.count_event(todo[key][0].namespace, "write_errors")
                    self.writes.failed(self.write_step, exc)
        except BaseException:  # an unexpected error: leave nothing of these pages staged
            for fut in futures.values():
                if not fut.cancel() and fut.exception() is None:
                    self.payloads.discard(fut.result()[0])
            raise
        return written

    def publish(self, todo: Todo, written: Written, result: PutResult,
                quotas: dict[str, int | None] | None = None) -> list[bytes]:
        """Make room, publish, then commit the rows, under the writer lock; returns the keys
        committed. On failure nothing of the batch stays visible."""
        quotas = {} if quotas is None else quotas
        with self.index.write_lock:
            if not self.recheck(todo, written, result):
                return []
            try:
                # Each namespace's quota, read once per put (on a shared tier: from the database).
                for ns in {todo[k][0].namespace for k in written} - quotas.keys():
                    quotas[ns] = self.index.quota(ns)
                if self.bounded(quotas):
                    return self.commit_bounded(todo, written, result, quotas)
                return self.commit_within_room(todo, written, result, quotas)
            except DBAPIError as exc:  # the quota lookup or the evictor lock: no row of it was committed
                self.unpublish(todo, written, [k for k in written if k not in result.failed
                                               and k not in result.stored], result, "evictor lock", exc)
                return [k for k in written if k in result.stored]

    def recheck(self, todo: Todo, written: Written, result: PutResult) -> bool:
        """Under the writer lock, before anything is published: False when the batch failed."""
        return True

    def bounded(self, quotas: dict[str, int | None]) -> bool:
        """Whether the batch's room check and row commit must be one step against other writers
        (``commit_bounded``)."""
        return False

    def commit_bounded(self, todo: Todo, written: Written, result: PutResult,
                       quotas: dict[str, int | None]) -> list[bytes]:
        """``commit_within_room`` for a batch under a capacity or a quota: its room check and its
        row commit under the evictor lock together."""
        with self.index.evictor_lock():
            return self.commit_within_room(todo, written, result, quotas)

    def commit_within_room(self, todo: Todo, written: Written, result: PutResult,
                           quotas: dict[str, int | None], *, evict: bool = True) -> list[bytes]:
        """Make room (unless not ``evict``), publish, commit; returns the keys committed."""
        step, admitted = "index commit", list(written)
        try:
            if evict:
                admitted = self.make_room(todo, written, result, quotas)  # evicting writes the index too
            if not admitted:
                return []
            now = time.time()
            identity = self.store.identity
            rows = [ChunkRow(key=k, parent_key=todo[k][0].parent_key, namespace=todo[k][0].namespace,
                             num_tokens=identity.page_size, raw_bytes=identity.page_size_bytes,
                             stored_bytes=written[k][1], created_at=now, last_access_at=now)
                    for k in admitted]
            step = "publish"
            self.publish_payloads([written[k][0] for k in admitted])
            step = "index commit"
            admitted = self.commit_rows(rows, todo, result)
        except (OSError, DBAPIError) as exc:
            self.unpublish(todo, written, admitted, result, step, exc)
            return []
        result.stored.extend(admitted)
        self.writes.succeeded()
        return admitted

    def publish_payloads(self, staged: list[Staged]) -> None:
        """Make the admitted pages' payloads visible under their keys (before their rows)."""
        self.payloads.publish(staged, self.pool)

    def commit_rows(self, rows: list[ChunkRow], todo: Todo, result: PutResult) -> list[bytes]:
        """Commit the rows of published payloads; returns the keys committed."""
        self.index.insert(rows)
        return [r.key for r in rows]

    def unpublish(self, todo: Todo, written: Written, keys: Sequence[bytes], result: PutResult, step: str,
                  exc: BaseException) -> None:
        """Nothing of a failed batch may stay visible: no row of ``keys`` was committed, so their
        payloads (all new keys, checked under the writer lock, or claimed) are removed again and
        the pages failed."""
        for k in keys:
            self.payloads.discard(written[k][0])
            with contextlib.suppress(PayloadsUnavailable):  # left without a row: invisible,
                self.payloads.delete(k)  # and an orphan for verify --repair or the sweeper
            result.failed[k] = f"publish failed: {exc}"
            self.index.count_event(todo[k][0].namespace, "write_errors")
        self.writes.failed(step, exc, num_pages=len(keys))

    def make_room(self, todo: Todo, written: Written, result: PutResult,
                  quotas: dict[str, int | None]) -> list[bytes]:
        """Evict to fit the written pages under quotas and capacity; returns the keys that fit.

        The stored parents of the batch are never evicted for it: the new pages extend them.
        """
        protect = {todo[k][0].parent_key for k in written}
        by_ns: dict[str, int] = {}
        for k, (_, size) in written.items():
            ns = todo[k][0].namespace
            by_ns[ns] = by_ns.get(ns, 0) + size
        rejected: dict[str, str] = {}
        for ns, need in by_ns.items():
            quota = quotas[ns]
            if quota is not None and not self.fit(need, quota, ns, protect):
                rejected[ns] = f"namespace quota of {quota} bytes"
        total = sum(need for ns, need in by_ns.items() if ns not in rejected)
        capacity = self.store.capacity_bytes
        if capacity is not None and total and not self.fit(total, capacity, None, protect):
            for ns in by_ns:
                rejected.setdefault(ns, f"capacity of {capacity} bytes")
        admitted: list[bytes] = []
        for k, (staged, _) in written.items():
            ns = todo[k][0].namespace
            if ns in rejected:
                self.reject(k, staged)
                result.failed[k] = f"no room within the {rejected[ns]} (the rest is pinned or in use)"
            else:
                admitted.append(k)
        return admitted

    def reject(self, key: bytes, staged: Staged) -> None:
        """A written page that does not fit: nothing of it may stay."""
        self.payloads.discard(staged)

    def fit(self, need: int, limit: int, namespace: str | None, protect: set[bytes]) -> bool:
        if need > limit:
            return False
        excess = self.index.stored_bytes(namespace) + need - limit
        if excess > 0:
            with self.index.evictor_lock():  # a shared tier: one evictor at a time, fleet-wide
                excess = self.index.stored_bytes(namespace) + need - limit
                if excess > 0:
                    ahead = self.evict_ahead_bytes(need, limit)
                    selection = EvictionSelection(namespace=namespace, bytes_to_free=excess + ahead)
                    self.drop(self.plan(selection, protect).victims)
        return self.index.stored_bytes(namespace) + need <= limit

    def evict_ahead_bytes(self, need: int, limit: int) -> int:
        """What a put that must evict frees beyond its own ``need`` under ``limit`` (a folder's:
        nothing; its evictor lock is the process's own)."""
        return 0

    def count_failed(self, todo: Todo, keys: Sequence[bytes], result: PutResult, why: str) -> None:
        for k in keys:
            result.failed[k] = why
            self.index.count_event(todo[k][0].namespace, "write_errors")

    def deduplicated(self, todo: Todo, key: bytes, result: PutResult) -> None:
        result.deduplicated.append(key)
        self.index.count_event(todo.pop(key)[0].namespace, "dedup_hits")

    # -- eviction ----------------------------------------------------------------------------

    def plan(self, selection: EvictionSelection, exclude: frozenset[bytes] | set[bytes] = frozenset()) -> EvictionPlan:
        """What ``selection`` evicts now; buffered access times are written first on a writable
        store (they decide the order)."""
        if not self.store.read_only:
            self.index.flush()
        return plan_of(self.index, selection, generation=self.index.generation, exclude=exclude)

    def drop(self, victims: Sequence[ChunkRow | Victim]) -> None:
        """Delete chunks, row first, then payload; counted as evictions."""
        if not victims:
            return
        self.delete_rows_then_payloads([v.key for v in victims])
        for v in victims:
            self.index.count_event(v.namespace, "evictions")

    def delete_rows_then_payloads(self, keys: list[bytes]) -> None:
        raise NotImplementedError

    # -- a read's clean-up and offline care ---------------------------------------------------

    def quarantine(self, key: bytes, page: PageRef | None, row: ChunkRow | None) -> str | None:
        """Under the writer lock: check the payload of ``key`` again and, when it is still bad,
        drop its row and move it aside. Returns where it went, or None (good now, or unknown)."""
        raise NotImplementedError

    def drop_missing(self, keys: Sequence[bytes]) -> int:
        raise NotImplementedError

    def adopt(self, rows: Sequence[ChunkRow]) -> int:
        raise NotImplementedError

    def sweep(self, grace_s: float) -> SweepResult:
        return SweepResult()  # nothing to do for a store whose payloads only it writes

    def lapsed_claims(self, now: float | None, limit: int) -> list[tuple[bytes, str]]:
        return []

    def claimed_keys(self, keys: Sequence[bytes]) -> set[bytes]:
        return set()

    def stats(self, stats: StoreStats) -> StoreStats:
        return stats


class FolderProtocol(StoreProtocol):
    """A store whose payloads only it writes (its folder, or a bucket of its own)."""

    def put(self, pages: Sequence[PageRef], arrays: Sequence[np.ndarray], originals: Sequence[PageRef],
            result: PutResult) -> PutResult:
        try:
            present = self.index.present([p.key for p in pages])
        except DBAPIError as exc:  # the index does not answer: nothing is written, nothing lost
            for p in pages:
                result.failed[p.key] = f"write failed: index unavailable: {exc.orig}"
            self.writes.failed("index lookup", exc, num_pages=len(pages))
            return result
        todo = self.todo(pages, arrays, originals, present, result)
        written = self.collect(self.submit(todo, self.encode_and_stage), todo, result)
        if written:
            self.publish(todo, written, result)
        return result

    def recheck(self, todo: Todo, written: Written, result: PutResult) -> bool:
        try:
            again = self.index.present(list(written))
        except DBAPIError as exc:  # nothing published yet: every written page fails
            num_pages = len(written)
            for k in list(written):
                self.payloads.discard(written.pop(k)[0])
                result.failed[k] = f"publish failed: index unavailable: {exc.orig}"
                self.index.count_event(todo[k][0].namespace, "write_errors")
            self.writes.failed("index lookup", exc, num_pages=num_pages)
            return False
        for key in again:  # another thread stored it meanwhile
            self.payloads.discard(written.pop(key)[0])
            result.deduplicated.append(key)
            self.index.count_event(todo[key][0].namespace, "dedup_hits")
        return True

    def delete_rows_then_payloads(self, keys: list[bytes]) -> None:
        self.index.delete(keys)  # row first, then the file
        for key in keys:
            self.payloads.delete(key)

    def quarantine(self, key: bytes, page: PageRef | None, row: ChunkRow | None) -> str | None:
        check = self.store.verify_file(key, page, row=row)
        if check.is_ok or check.status is FileStatus.UNAVAILABLE:  # good now, or unknown
            return None
        self.index.delete([key])
        return self.payloads.quarantine(key)

    def drop_missing(self, keys: Sequence[bytes]) -> int:
        with self.index.write_lock:
            try:
                gone = [k for k in keys if not self.payloads.exists(k)]
            except PayloadsUnavailable:  # asked again on a later miss
                return 0
            return self.index.delete(gone) if gone else 0

    def adopt(self, rows: Sequence[ChunkRow]) -> int:
        return self.index.insert(rows)
