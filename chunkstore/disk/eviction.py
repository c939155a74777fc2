"""Disk eviction planned as data: what a selection evicts, worked out from the index alone.

Invariants: there is one eviction order, least recently used (ties by key) among the unpinned
chunks that no stored chunk extends, so descendants go before their parent; a plan never holds a
pinned chunk, an ancestor of a chunk it keeps, or a key in ``exclude``; planning only reads the
index. ChunkStore.plan_eviction and ChunkStore.evict are the only callers: capacity and quota
eviction in put, the CLI, maintenance and the management API (dry runs and evictions) all plan here.
"""

from __future__ import annotations

import heapq
from collections.abc import Set
from dataclasses import dataclass

from chunkstore.disk.index import ChunkIndex, ChunkRow, Leaf

_LEAF_BATCH = 256
# A parent the plan turns into a leaf is read with the lineage of the leaves waiting in the heap,
# so a plan that takes whole chains asks the database about once per batch of leaves, not once per
# chunk. The reads grow as the plan does: the first asks for the parent and _FIRST_LINEAGE_DEPTH
# pages above it, each next one for twice the keys and depth, up to _LINEAGE_BATCH keys with
# _LINEAGE_DEPTH pages above each. A put's plan takes a few chunks: reading the lineage of 256
# leaves for it held the fleet's evictor lock ten times longer.
_LINEAGE_BATCH = 256
_LINEAGE_DEPTH = 64
_FIRST_LINEAGE_DEPTH = 8


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
         exclude: Set[bytes] = frozenset()) -> EvictionPlan:
    """What ``selection`` evicts now, leaving out ``exclude`` (and so their ancestors). Changes
    nothing. Raises ChunkNotStoredError (an unknown key) and StrandedDescendantsError."""
    if selection.key is not None:
        return _plan_key(index, selection, generation)
    return _plan_lru(index, selection, generation, exclude)


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


def _plan_lru(index: ChunkIndex, selection: EvictionSelection, generation: int,
              exclude: Set[bytes]) -> EvictionPlan:
    """A heap of the current leaves (read from the index in batches, in order) plus the parents
    that become leaves as the plan takes their last stored children."""
    heap: list[tuple[float, bytes, ChunkRow, bool]] = []  # (last access, key, row, read as a leaf)
    after: tuple[float, bytes] | None = None
    fetched_in_heap, is_exhausted = 0, False
    children_left: dict[bytes, int] = {}  # parent key -> its stored children not planned yet
    victims: list[ChunkRow] = []
    freed = 0
    read_ahead: dict[bytes, Leaf | None] = {}  # rows read with a lineage, not yet asked for (None: not stored)
    lineage_read: set[bytes] = set()  # keys whose lineage has been read
    lineage_reads = 0

    def parent_leaf(parent: bytes) -> Leaf | None:
        nonlocal lineage_reads
        if parent not in read_ahead:
            scale = 1 << min(lineage_reads, 8)
            waiting = [item[1] for item in heap if item[1] not in lineage_read][:min(scale, _LINEAGE_BATCH) - 1]
            keys = [parent, *waiting]
            lineage_read.update(keys)
            found = index.lineage(keys, min(_FIRST_LINEAGE_DEPTH * scale, _LINEAGE_DEPTH))
            lineage_reads += 1
            read_ahead.update(found)
            if parent not in found:
                read_ahead[parent] = None
        lineage_read.add(parent)  # (read with a lineage already: not asked for again as a waiting leaf)
        return read_ahead.pop(parent)

    def done(is_complete: bool = True) -> EvictionPlan:
        return EvictionPlan(selection, tuple(victims), 0, is_complete, generation)

    while True:
        # Keep at least one leaf read from the index in the heap: every leaf not read yet is newer.
        if fetched_in_heap == 0 and not is_exhausted:
            batch = index.leaves(selection.namespace, after, _LEAF_BATCH)
            for leaf in batch:
                children_left.setdefault(leaf.row.parent_key, leaf.parent_num_children)
                if leaf.row.key not in exclude:
                    heapq.heappush(heap, (leaf.row.last_access_at, leaf.row.key, leaf.row, True))
                    fetched_in_heap += 1
            is_exhausted = len(batch) < _LEAF_BATCH
            if batch:
                after = (batch[-1].row.last_access_at, batch[-1].row.key)
            if fetched_in_heap == 0 and not is_exhausted:
                continue  # a whole batch of excluded leaves: read on
        if not heap:
            return done()
        if selection.bytes_to_free is not None and freed >= selection.bytes_to_free:
            return done()
        if selection.accessed_before is not None and heap[0][0] >= selection.accessed_before:
            return done()
        if selection.max_chunks is not None and len(victims) >= selection.max_chunks:
            return done(is_complete=False)
        _, key, row, is_fetched = heapq.heappop(heap)
        fetched_in_heap -= is_fetched
        victims.append(row)
        freed += row.stored_bytes
        parent = row.parent_key
        if parent not in children_left:  # a parent that is not stored: it never becomes a leaf
            continue
        children_left[parent] -= 1
        if children_left[parent] == 0 and parent not in exclude:
            leaf = parent_leaf(parent)
            if leaf is not None and not leaf.row.pinned and (selection.namespace is None
                                                             or leaf.row.namespace == selection.namespace):
                if leaf.parent_num_children is not None:
                    children_left.setdefault(leaf.row.parent_key, leaf.parent_num_children)
                heapq.heappush(heap, (leaf.row.last_access_at, leaf.row.key, leaf.row, False))
