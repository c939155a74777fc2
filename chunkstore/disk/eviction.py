"""Disk eviction planned as data: what a selection evicts, worked out from the index alone.

Invariants: there is one eviction order, least recently used (ties by key) among the unpinned
chunks that no stored chunk extends, so descendants go before their parent; a plan never holds a
pinned chunk, an ancestor of a chunk it keeps, or a key in ``exclude``; planning only reads the
index. ChunkStore.plan_eviction and ChunkStore.evict are the only callers: capacity and quota
eviction in put, the CLI, maintenance and the management API (dry runs and evictions) all plan here.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Set
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from chunkstore.disk.index import ChunkIndex, ChunkRow


@dataclass(frozen=True, slots=True)
class ScanSizes:
    """How a plan reads the index: in batches of ``first_rows`` rows, doubling up to ``max_rows``
    (a put's plan takes a few chunks, and its reads hold the fleet's evictor lock). Once a plan has
    taken ``parallel_from`` chunks (a sweep, a CLI eviction; never a put's), each batch's rows are
    read alone and their children counted on other connections, ``in_flight`` batches at once:
    the counts are random index probes, nine tenths of the work at 10M rows."""

    first_rows: int = 256
    max_rows: int = 4096
    parallel_from: int = 1024
    in_flight: int = 2


class ChunkNotStoredError(LookupError):
    """An eviction by key names a chunk that is not stored."""


class StrandedDescendantsError(ValueError):
    """Evicting a key alone would leave its stored descendants unreachable."""


@dataclass(frozen=True, slots=True)
class EvictionSelection:
    """What to evict. ``key`` (with or without its descendants) excludes ``bytes_to_free`` and
    ``accessed_before``; otherwise least recently used first, within ``namespace``, until
    ``bytes_to_free`` stored bytes are planned or the next chunk was accessed at or after
    ``accessed_before``; with neither, every unpinned chunk. At most ``max_chunks`` (None: no
    bound) per plan. Raises ValueError for a selection that mixes ``key`` with the others."""

    namespace: str | None = None
    bytes_to_free: int | None = None
    accessed_before: float | None = None  # epoch seconds
    key: bytes | None = None
    descendants: bool = False
    max_chunks: int | None = None

    def __post_init__(self) -> None:
        if self.descendants and self.key is None:
            raise ValueError("descendants needs a key")
        if self.key is not None and (self.bytes_to_free is not None or self.accessed_before is not None):
            raise ValueError("key selects the chunks itself: leave out bytes_to_free and accessed_before")
        if self.max_chunks is not None and self.max_chunks < 1:
            raise ValueError(f"max_chunks must be at least 1, got {self.max_chunks}")
        if self.bytes_to_free is not None and self.bytes_to_free < 0:
            raise ValueError(f"bytes_to_free must be >= 0, got {self.bytes_to_free}")


@dataclass(frozen=True, slots=True)
class EvictionPlan:
    """The chunks a selection evicts, in eviction order (descendants first). ``generation`` is the
    index's write generation the plan was made at (ChunkStore.evict carries out exactly this plan
    while it is unchanged). ``skipped_pinned``: by key, the pinned chunks (and their ancestors)
    kept; ``is_complete``: False when ``max_chunks`` cut the plan short."""

    selection: EvictionSelection
    victims: tuple[ChunkRow, ...]
    skipped_pinned: int
    is_complete: bool
    generation: int

    @property
    def keys(self) -> tuple[bytes, ...]:
        return tuple(v.key for v in self.victims)

    @property
    def num_chunks(self) -> int:
        return len(self.victims)

    @property
    def stored_bytes(self) -> int:
        return sum(v.stored_bytes for v in self.victims)


def plan(index: ChunkIndex, selection: EvictionSelection, *, generation: int,
         exclude: Set[bytes] = frozenset(), scan: ScanSizes = ScanSizes()) -> EvictionPlan:
    """What ``selection`` evicts now, leaving out ``exclude`` (and so their ancestors). Changes
    nothing. Raises ChunkNotStoredError (an unknown key) and StrandedDescendantsError."""
    if selection.key is not None:
        return _plan_key(index, selection, generation)
    return _plan_lru(index, selection, generation, exclude, scan)


def _plan_key(index: ChunkIndex, selection: EvictionSelection, generation: int) -> EvictionPlan:
    max_chunks = selection.max_chunks
    rows = index.subtree(selection.key, None if max_chunks is None else max_chunks + 1)
    if not rows:
        raise ChunkNotStoredError(f"no chunk {selection.key.hex()} on disk")
    if not selection.descendants and len(rows) > 1:
        raise StrandedDescendantsError(
            f"chunk {selection.key.hex()} has {len(rows) - 1} stored descendants, which evicting it alone "
            f"would leave unreachable; pass descendants: true to evict them too")
    is_complete = max_chunks is None or len(rows) <= max_chunks
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
    return EvictionPlan(selection, victims, len(kept), is_complete, generation)


class _RowScan:
    """The index's unpinned rows by last access, oldest first, with their children counts, in
    batches (``next``), each read from the end of the one before; in parallel, the next batches'
    counts are under way while this one is planned."""

    def __init__(self, index: ChunkIndex, namespace: str | None, sizes: ScanSizes) -> None:
        self._index, self._namespace, self._sizes = index, namespace, sizes
        self._after: tuple[float, bytes] | None = None
        self._rows = sizes.first_rows  # the next batch's size
        self._pending: deque[tuple[list[tuple[ChunkRow, int | None]], Future | None]] = deque()  # read, counting
        self._rows_exhausted = False
        self._pool: ThreadPoolExecutor | None = None
        self.reached_access: float | None = None  # the last access of the last row returned

    @property
    def is_exhausted(self) -> bool:
        return self._rows_exhausted and not self._pending

    def next(self, parallel: bool) -> list[tuple[ChunkRow, int]]:
        """The next batch (empty at the end); ``parallel``: count the next batches' children on
        other connections meanwhile."""
        while len(self._pending) < (self._sizes.in_flight if parallel else 1) and not self._rows_exhausted:
            self._read(parallel)
        if not self._pending:
            return []
        batch, counting = self._pending.popleft()
        if batch:
            self.reached_access = batch[-1][0].last_access_at
        if counting is None:  # counted by the query itself
            return batch  # type: ignore[return-value]
        counts = counting.result()
        return [(row, counts.get(row.key, 0)) for row, _ in batch]

    def _read(self, parallel: bool) -> None:
        asked = self._rows
        batch = self._index.by_last_access(self._namespace, self._after, asked, count_children=not parallel)
        self._rows = min(2 * asked, self._sizes.max_rows)
        self._rows_exhausted = len(batch) < asked
        if batch:
            self._after = (batch[-1][0].last_access_at, batch[-1][0].key)
        counting = None
        if parallel and batch:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self._sizes.in_flight, thread_name_prefix="chunkstore-plan")
            counting = self._pool.submit(self._index.children_counts, [row.key for row, _ in batch])
        self._pending.append((batch, counting))

    def close(self) -> None:
        """Stop counting ahead (a count under way ends on its own; it is not needed)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _plan_lru(index: ChunkIndex, selection: EvictionSelection, generation: int,
              exclude: Set[bytes], sizes: ScanSizes) -> EvictionPlan:
    """One scan of the unpinned rows by last access, oldest first, each with its count of stored
    children. A row is ready once every chunk extending it is planned: at once for a leaf, when
    its last child is planned for a parent. The heap holds the ready rows; every row in it was
    scanned, and every row not scanned yet is newer than all of them, so the heap's oldest is the
    next victim whenever the heap is not empty, and the scan goes on only when it is empty. A
    parent is read once, in the scan, never asked for again."""
    heap: list[tuple[float, bytes, ChunkRow]] = []  # (last access, key, row): ready rows
    waiting: dict[bytes, tuple[ChunkRow, int]] = {}  # scanned, not ready: row, stored children not planned
    planned_children: dict[bytes, int] = {}  # a key not scanned (yet) -> its children planned so far
    victims: list[ChunkRow] = []
    freed = 0
    scan = _RowScan(index, selection.namespace, sizes)
    try:
        while True:
            if not heap:
                # Nothing ready: only rows not scanned yet can be, and they are newer than the scan.
                if scan.is_exhausted or (selection.accessed_before is not None and scan.reached_access is not None
                                         and scan.reached_access >= selection.accessed_before):
                    return EvictionPlan(selection, tuple(victims), 0, True, generation)
                for row, num_children in scan.next(parallel=len(victims) >= sizes.parallel_from):
                    left = num_children - planned_children.pop(row.key, 0)
                    if left > 0:
                        waiting[row.key] = (row, left)
                    elif row.key not in exclude:
                        heapq.heappush(heap, (row.last_access_at, row.key, row))
                continue
            if ((selection.bytes_to_free is not None and freed >= selection.bytes_to_free)
                    or (selection.accessed_before is not None and heap[0][0] >= selection.accessed_before)):
                return EvictionPlan(selection, tuple(victims), 0, True, generation)
            if selection.max_chunks is not None and len(victims) >= selection.max_chunks:
                return EvictionPlan(selection, tuple(victims), 0, False, generation)
            row = heapq.heappop(heap)[2]
            victims.append(row)
            freed += row.stored_bytes
            parent = row.parent_key
            if parent not in waiting:  # not scanned yet (or not stored, or in another namespace)
                planned_children[parent] = planned_children.get(parent, 0) + 1
                continue
            parent_row, left = waiting[parent]
            if left > 1:
                waiting[parent] = (parent_row, left - 1)
            else:
                del waiting[parent]
                if parent not in exclude:
                    heapq.heappush(heap, (parent_row.last_access_at, parent, parent_row))
    finally:
        scan.close()
