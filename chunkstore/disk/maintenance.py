"""Offline care of a store: verify (and repair), rebuild the index from chunk headers, gc, and bulk
eviction (``evict_bytes``: the store's one planner, in bounded rounds). Only the store's public
methods are used (its index is private to it), and its payload store's reading methods (listing,
existence, mtime) for the scans.

Invariants: verify without repair changes nothing and reports as damage corrupt files, rows whose
file is missing, chunk files without a row (orphans) and leftover temp files, never a put in
flight (what it finds is looked at again under the writer lock, or after ``SETTLE_S`` when
another process may be writing); repair only removes rows whose file is missing, quarantines
files that fail verification, adopts valid files that have no row and removes leftover temp
files; rebuild indexes exactly the chunk files that verify, and refuses, before it indexes or
quarantines anything, a store whose chunks are another model's than its store.json names
(chunk_owner.py; `check_before_rebuild` asks the same of the unsealed chunks before the index is
dropped). Each walks the store in bounded batches.
"""

from __future__ import annotations

import dataclasses
import errno
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

from sqlalchemy.exc import SQLAlchemyError

from chunkstore.disk.chunk_owner import ForeignChunksError, Ownership, judge
from chunkstore.disk.eviction import EvictionSelection
from chunkstore.disk.file_check import FileCheck, FileStatus
from chunkstore.disk.files import ChunkFiles
from chunkstore.disk.identity import ModelIdentity
from chunkstore.disk.index import ChunkIndex, ChunkRow, IndexMissingError, sqlite_url
from chunkstore.disk.payloads import PayloadsUnavailable
from chunkstore.disk.store import STORE_WIDE, ChunkStore, EvictResult
from chunkstore.disk.store_spec import StoreSpec

Progress = Callable[[int], None]  # called with the number of items just done
_BATCH = 64
_EVICT_ROUND_CHUNKS = 4096  # chunks planned per round of a bulk eviction: a plan's rows stay bounded
# How long a read-only verify waits before it looks again at the orphans and temp files it found:
# beside a running writer, a put's file is between its publish and its row, or its temp file is
# being written, for about as long as a batch's fsyncs take.
SETTLE_S = 2.0


@dataclass(slots=True)
class VerifyReport:
    checked: int = 0
    ok: int = 0
    corrupt: int = 0
    missing: int = 0
    quarantined: int = 0
    rows_dropped: int = 0
    orphans: int = 0  # chunk files without an index row
    adopted: int = 0
    temps: int = 0  # leftover temp files found (not puts in flight)
    temps_removed: int = 0

    @property
    def damage(self) -> int:
        """What was found wrong: corrupt files, missing files, orphan files, leftover temp files."""
        return self.corrupt + self.missing + self.orphans + self.temps


@dataclass(slots=True)
class RebuildReport:
    scanned: int = 0
    indexed: int = 0
    quarantined: int = 0


@dataclass(slots=True)
class GcReport:
    temps_removed: int = 0
    evicted_chunks: int = 0
    evicted_bytes: int = 0
    quarantine_purged: int = 0
    lapsed_claims: int = 0  # a shared tier's (ChunkStore.sweep)
    swept_objects: int = 0


def _chunked(items: Iterable, size: int) -> Iterator[list]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


def check_file(store: ChunkStore, key: bytes, row: ChunkRow | None = None) -> FileCheck:
    """What the payload of ``key`` holds, fully verified (and, given its index ``row``, agreeing
    with it)."""
    return store.verify_file(key, row=row)


def _row_from(store: ChunkStore, key: bytes, check: FileCheck, mtime: float) -> ChunkRow:
    """The index row of the verified payload of ``key`` (its stored key, and its parent's as the
    check named it: a sealed store's names, not the header's chain keys)."""
    header = check.header
    return ChunkRow(key=key, parent_key=check.parent_key, namespace=header.namespace,
                    num_tokens=store.identity.page_size, raw_bytes=header.raw_size_bytes, stored_bytes=check.size_bytes,
                    created_at=mtime, last_access_at=mtime)


def _mtime(store: ChunkStore, key: bytes) -> float:
    mtime = store.payloads.modified_at(key)
    return time.time() if mtime is None else mtime


def verify(store: ChunkStore, repair: bool = False, progress: Progress | None = None) -> VerifyReport:
    """Read and verify every indexed chunk; with ``repair`` also fix what is found (see module doc)."""
    if repair and store.read_only:
        raise PermissionError("repair needs the store opened for writing")
    report = VerifyReport()
    for rows in _chunked(store.iter_rows(), _BATCH):
        results = store.map_workers(lambda r: check_file(store, r.key, r), rows)
        missing: list[bytes] = []
        for row, check in zip(rows, results):
            report.checked += 1
            if check.is_ok:
                report.ok += 1
            elif check.status is FileStatus.UNAVAILABLE:
                raise unavailable_error(store, check)
            elif check.status is FileStatus.MISSING:
                report.missing += 1
                missing.append(row.key)
            else:
                report.corrupt += 1
                if repair and store.quarantine(row.key, row.namespace, check.text, row=row):
                    report.quarantined += 1
        if repair and missing:
            report.rows_dropped += store.drop_missing(missing)
        if progress:
            progress(len(rows))
    if repair:
        report.temps = report.temps_removed = _remove_temps(store)
        _adopt_orphans(store, report)
    else:
        report.orphans, report.temps = _count_leftovers(store)
    return report


def unavailable_error(store: ChunkStore, check: FileCheck) -> PayloadsUnavailable:
    """Why a verify or rebuild stops: a chunk could not be read (its storage did not answer, or a
    sealed store's key for it cannot be opened), so nothing can be concluded."""
    return PayloadsUnavailable(errno.EIO, f"stopped: a chunk at {store.payloads.location} could not be read "
                                          f"({check.text}); nothing was changed for the chunks not yet checked")


def _remove_temps(store: ChunkStore) -> int:
    """Temp files of dead writers; this process's own may belong to puts in flight."""
    return store.remove_leftover_temps()


def _without_rows(store: ChunkStore, batch: list[bytes]) -> list[bytes]:
    """The keys of ``batch`` with no index row and, on a shared tier, no claim: a claimed key's
    object is another server's put, eviction or sweep in flight (or a dead writer's, which the
    sweeper of `gc` deletes), never an orphan to adopt."""
    present = {k for k, ok in zip(batch, store.exists(batch)) if ok}
    keys = [k for k in batch if k not in present]
    claimed = store.claimed_keys(keys) if keys else set()
    return [k for k in keys if k not in claimed]


def _orphan_batches(store: ChunkStore) -> Iterator[list[bytes]]:
    """Keys of chunk files that have no index row, a batch at a time (a full scan of the tree)."""
    for batch in _chunked(store.payloads.keys(), _BATCH):
        if orphans := _without_rows(store, batch):
            yield orphans


def _still_orphans(store: ChunkStore, keys: list[bytes]) -> int:
    n = 0
    for batch in _chunked(keys, _BATCH):
        n += sum(1 for k in _without_rows(store, batch) if store.payloads.exists(k))
    return n


def _count_leftovers(store: ChunkStore) -> tuple[int, int]:
    """(orphan files, leftover temp files), changing nothing. A writer's puts in flight are not
    leftovers: this process's own temp files are left out, and what was found is looked at again
    under the writer lock (publish and row, or row delete and unlink, happen under it), or, when
    another process may hold it (a read-only store), after ``SETTLE_S``."""
    candidates = [k for batch in _orphan_batches(store) for k in batch]
    temps = store.payloads.leftovers(keep_own=True)
    if not candidates and not temps:
        return 0, 0
    if store.read_only:
        time.sleep(SETTLE_S)
        return _still_orphans(store, candidates), len(temps & store.payloads.leftovers(keep_own=True))
    with store.exclusive():
        return _still_orphans(store, candidates), len(temps)


def _index_valid(store: ChunkStore, keys: Sequence[bytes]) -> tuple[int, int]:
    """Check the payloads of ``keys`` (which have no row) on the store's workers: index the valid
    ones, quarantine the bad ones; returns (rows added, quarantined). Raises PayloadsUnavailable
    (storage that does not answer) before anything of the batch changes."""
    results = store.map_workers(lambda k: check_file(store, k), keys)
    rows, bad = [], []
    for key, check in zip(keys, results):
        if check.is_ok:
            rows.append(_row_from(store, key, check, _mtime(store, key)))
        elif check.status is FileStatus.UNAVAILABLE:
            raise unavailable_error(store, check)
        elif check.is_bad:
            bad.append((key, check.text))
    quarantined = sum(1 for key, why in bad if store.quarantine(key, STORE_WIDE, why))
    return store.adopt(rows), quarantined


def _adopt_orphans(store: ChunkStore, report: VerifyReport) -> None:
    for orphans in _orphan_batches(store):
        report.orphans += len(orphans)
        adopted, quarantined = _index_valid(store, orphans)
        report.adopted += adopted
        report.quarantined += quarantined


def _refuse_foreign(ownership: Ownership, where: str) -> Ownership:
    if ownership.is_foreign:
        raise ForeignChunksError(ownership.refusal(where))
    return ownership


def recorded_identity(spec: StoreSpec) -> ModelIdentity | None:
    """The model identity the index of the store ``spec`` names records (its first writer's),
    read before a rebuild drops it; None when there is no index that can be read. Opens the index
    read-only, as the store cannot open one that another model claims."""
    try:
        index = ChunkIndex(spec.index_url or sqlite_url(spec.folder), read_only=True)
    except (IndexMissingError, SQLAlchemyError, RuntimeError, ValueError, OSError):
        return None
    try:
        held = index.get_meta("identity")
        return None if held is None else ModelIdentity.from_json(held)
    except (SQLAlchemyError, ValueError, TypeError):
        return None
    finally:
        index.close()


@dataclass(frozen=True, slots=True)
class RebuildCheck:
    """What ``check_before_rebuild`` found: whether a chunk of the store's own model was seen (then
    ``rebuild`` need not judge again), and the other identity the old index records, if any."""

    has_own_chunk: bool
    recorded: ModelIdentity | None


def check_before_rebuild(spec: StoreSpec, identity: ModelIdentity) -> RebuildCheck:
    """Before a rebuild of the store ``spec`` names drops its index: raise ForeignChunksError,
    naming both identities, when a sample of its chunks shows them to be another model's than
    ``identity`` (its store.json's), changing nothing (chunk_owner.py). A sealed store's chunks
    are judged by ``rebuild`` itself, once the store has opened its keys."""
    recorded = recorded_identity(spec)
    candidates = () if recorded is None or recorded == identity else (recorded,)
    payloads = dataclasses.replace(spec, read_only=True).payloads() or ChunkFiles(spec.folder)
    try:
        ownership = _refuse_foreign(judge(payloads, identity, candidates=candidates), payloads.location)
    finally:
        payloads.close()
    return RebuildCheck(ownership.matching > 0, candidates[0] if candidates else None)


def rebuild(store: ChunkStore, progress: Progress | None = None, *, force: bool = False,
            recorded: ModelIdentity | None = None) -> RebuildReport:
    """Index every valid chunk file of a store whose index was just reset (see
    ChunkStore(reset_index=True)); files that fail verification are quarantined. Unless ``force``
    (`rebuild --force`, or ``check_before_rebuild`` saw a chunk of the store's own model), first
    judges a sample of the chunks (a sealed store's opened with its keys): when they are another
    model's than the store's identity, raises ForeignChunksError (a ModelMismatchError) naming
    both (``recorded``: what the old index said, from ``check_before_rebuild``) before anything is
    indexed or quarantined."""
    if not force:
        keys_by_id = store.sealing.keys_by_id if store.sealing.is_sealed else None
        _refuse_foreign(judge(store.payloads, store.identity, keys_by_id=keys_by_id,
                              candidates=() if recorded is None else (recorded,)), store.payloads.location)
    report = RebuildReport()
    for batch in _chunked(store.payloads.keys(), _BATCH):
        report.scanned += len(batch)
        indexed, quarantined = _index_valid(store, batch)
        report.indexed += indexed
        report.quarantined += quarantined
        if progress:
            progress(len(batch))
    return report


def evict_bytes(store: ChunkStore, bytes_to_free: int, namespace: str | None = None) -> EvictResult:
    """Evict least recently used, leaf-first, unpinned chunks (of ``namespace``) until
    ``bytes_to_free`` stored bytes are gone or nothing evictable is left: plans of at most
    ``_EVICT_ROUND_CHUNKS`` chunks, each carried out before the next is made (the order is the
    one plan's). Raises ReadOnlyStoreError."""
    keys: list[bytes] = []
    freed = 0
    while freed < bytes_to_free:
        selection = EvictionSelection(namespace=namespace, bytes_to_free=bytes_to_free - freed,
                                      max_chunks=_EVICT_ROUND_CHUNKS)
        done = store.evict(store.plan_eviction(selection))
        keys += done.keys
        freed += done.stored_bytes
        if done.is_complete or not done.victims:
            break
    return EvictResult(len(keys), freed, tuple(keys))


def evict_down_to(store: ChunkStore, stored_bytes: int) -> EvictResult:
    """Evict (as ``evict_bytes``) until at most ``stored_bytes`` are stored."""
    excess = store.stored_bytes() - stored_bytes
    return evict_bytes(store, excess) if excess > 0 else EvictResult(0, 0)


def gc(store: ChunkStore, purge_quarantine: bool = False) -> GcReport:
    """Remove leftover temp files (a shared tier: sweep lapsed claims and orphan objects), evict down
    to the capacity, optionally empty quarantine/, and checkpoint the SQLite WAL."""
    report = GcReport(temps_removed=_remove_temps(store))
    swept = store.sweep()
    report.lapsed_claims, report.swept_objects = swept.lapsed_claims, swept.objects_deleted
    if store.capacity_bytes is not None:
        done = evict_down_to(store, store.capacity_bytes)
        report.evicted_chunks, report.evicted_bytes = done.num_chunks, done.stored_bytes
    if purge_quarantine:
        report.quarantine_purged = store.purge_quarantine()
    store.flush()
    store.checkpoint()
    return report
