"""Eviction from the disk tier by the API's selectors, planned first so that a dry run is exact.

Invariants: a plan follows the store's own eviction order (least recently used among the chunks
no stored chunk extends, so descendants go before their parent) and never includes a pinned chunk
or an ancestor of one it keeps; planning only reads the index; a real eviction plans and drops under
the store's writer lock, so the chunks dropped are exactly the plan (a dry run made just before
returns the same list unless a put or an access changed the store in between). At most
``max_chunks`` are planned per call (``is_complete`` says whether more would have gone).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from chunkstore.disk.index import ChunkIndex, ChunkRow
from chunkstore.disk.store import ChunkStore

from chunkstore.api.backend.base import BackendError

_LEAF_BATCH = 256


class ChunkNotFoundError(BackendError):
    status = 404
    code = "not_found"


@dataclass(frozen=True, slots=True)
class DiskSelection:
    """What to evict. ``key`` (with or without its descendants) is exclusive of the others; otherwise
    least recently used first, within ``namespace``, until ``bytes_to_free`` stored bytes are gone or
    the next chunk was accessed at or after ``accessed_before``; with neither, every unpinned chunk."""

    namespace: str | None = None
    bytes_to_free: int | None = None
    accessed_before: float | None = None  # epoch seconds
    key: bytes | None = None
    descendants: bool = False


@dataclass(frozen=True, slots=True)
class DiskPlan:
    victims: tuple[ChunkRow, ...]
    skipped_pinned: int  # pinned chunks (and their ancestors) that the selection named but kept
    is_complete: bool

    @property
    def stored_bytes(self) -> int:
        return sum(v.stored_bytes for v in self.victims)


def plan(index: ChunkIndex, selection: DiskSelection, max_chunks: int) -> DiskPlan:
    """What ``selection`` evicts, changing nothing. Raises ChunkNotFoundError for an unknown key and
    BackendError when evicting a key alone would strand its stored descendants."""
    if selection.key is not None:
        return _plan_key(index, selection, max_chunks)
    return _plan_lru(index, selection, max_chunks)


def _plan_key(index: ChunkIndex, selection: DiskSelection, max_chunks: int) -> DiskPlan:
    rows = index.subtree(selection.key, max_chunks + 1)
    if not rows:
        raise ChunkNotFoundError(f"no chunk {selection.key.hex()} on disk")
    if not selection.descendants and len(rows) > 1:
        raise BackendError(f"chunk {selection.key.hex()} has {len(rows) - 1} stored descendants, which evicting it "
                           f"alone would leave unreachable; pass descendants: true to evict them too")
    is_complete = len(rows) <= max_chunks
    if not is_complete:  # the deepest first: a partial plan still evicts leaves before parents
        rows = rows[:max_chunks]
    parent_of = {row.key: row.parent_key for row, _ in rows}
    kept: set[bytes] = set()
    for row, _ in rows:
        if row.pinned:  # it stays, and so does every ancestor up to the key: no hole above a kept chunk
            k = row.key
            while k in parent_of and k not in kept:
                kept.add(k)
                k = parent_of[k]
    victims = tuple(row for row, _ in rows if row.key not in kept)
    if not is_complete:
        # A partial subtree may hold a parent whose children are beyond the limit: keep only
        # chunks none of whose stored children is left behind.
        victims = tuple(v for v in victims if all(c in parent_of and c not in kept for c in index.child_keys(v.key)))
    return DiskPlan(victims, len(kept), is_complete)


def _plan_lru(index: ChunkIndex, selection: DiskSelection, max_chunks: int) -> DiskPlan:
    """Simulate the store's eviction: a heap of current leaves (fetched from the index in batches,
    in order) plus the parents that become leaves as the plan removes their last children."""
    heap: list[tuple[float, bytes, ChunkRow, bool]] = []  # (last access, key, row, fetched from the index)
    after: tuple[float, bytes] | None = None
    fetched_in_heap, is_exhausted = 0, False
    children_left: dict[bytes, int] = {}
    removed: set[bytes] = set()
    victims: list[ChunkRow] = []
    freed = 0
    while True:
        # Keep at least one fetched leaf in the heap: every leaf not fetched yet is newer than it.
        if fetched_in_heap == 0 and not is_exhausted:
            batch = index.leaves(selection.namespace, after, _LEAF_BATCH)
            for row in batch:
                heapq.heappush(heap, (row.last_access_at, row.key, row, True))
            fetched_in_heap += len(batch)
            is_exhausted = len(batch) < _LEAF_BATCH
            if batch:
                after = (batch[-1].last_access_at, batch[-1].key)
        if not heap:
            return DiskPlan(tuple(victims), 0, True)
        if selection.bytes_to_free is not None and freed >= selection.bytes_to_free:
            return DiskPlan(tuple(victims), 0, True)
        if selection.accessed_before is not None and heap[0][0] >= selection.accessed_before:
            return DiskPlan(tuple(victims), 0, True)
        if len(victims) >= max_chunks:
            return DiskPlan(tuple(victims), 0, False)
        _, key, row, is_fetched = heapq.heappop(heap)
        fetched_in_heap -= is_fetched
        victims.append(row)
        removed.add(key)
        freed += row.stored_bytes
        parent = row.parent_key
        if parent not in children_left:
            children_left[parent] = sum(1 for c in index.child_keys(parent) if c not in removed)
        else:
            children_left[parent] -= 1
        if children_left[parent] == 0:
            prow = index.rows([parent]).get(parent)
            if prow is not None and not prow.pinned:
                heapq.heappush(heap, (prow.last_access_at, prow.key, prow, False))


def evict(store: ChunkStore, selection: DiskSelection, *, max_chunks: int, dry_run: bool) -> DiskPlan:
    """Plan, and unless ``dry_run`` delete the plan's chunks (``ChunkStore.delete``: row, then file;
    counted as evictions), all under the store's writer lock. Raises as ``plan`` and PermissionError
    for a read-only store."""
    if dry_run:
        store.flush()  # buffered access times decide the order (no-op on a read-only store)
        return plan(store.index, selection, max_chunks)
    if store.read_only:
        raise PermissionError("store opened read-only")
    with store.index.write_lock:  # re-entrant: delete takes it again, so nothing runs between plan and drop
        store.flush()
        result = plan(store.index, selection, max_chunks)
        store.delete([v.key for v in result.victims])  # row, then file; counted as evictions
    return result
