"""EvictionOps: the store's eviction, deletes, pins and quotas, over its protocol's ``drop``.

Invariants: eviction is planned in one place (eviction.py: least recently used, leaf-first, never
a pinned chunk) and carried out by ``evict(plan)`` under the writer lock and the evictor lock,
with the plan made again when the index changed since (or always, on a shared tier); a delete
never leaves a hole (a pinned chunk, or a stored child outside the set, refuses the whole set);
rows go before payloads (the protocol's ``drop``). ChunkStore inherits these methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from chunkstore.disk.eviction import EvictionPlan, EvictionSelection
from chunkstore.disk.eviction import plan as plan_of
from chunkstore.disk.read_only import mutation
from chunkstore.disk.results import EvictResult

if TYPE_CHECKING:
    from chunkstore.disk.index import ChunkIndex
    from chunkstore.disk.protocol import StoreProtocol

DROP_BATCH = 256  # rows deleted per index transaction


class EvictionOps:
    """What changes which chunks stay (``_index`` and ``_protocol`` are the store's)."""

    _index: ChunkIndex
    _protocol: StoreProtocol

    def plan_eviction(self, selection: EvictionSelection) -> EvictionPlan:
        """What ``selection`` evicts now, in eviction order (chunkstore/disk/eviction.py), changing
        nothing: the same plan serves a dry run and ``evict``. Buffered access times are written
        first on a writable store (they decide the order). Raises ChunkNotStoredError (an unknown
        key), StrandedDescendantsError (a key alone that has stored descendants)."""
        return self._protocol.plan(selection)

    @mutation
    def evict(self, plan: EvictionPlan) -> EvictionPlan:
        """Carry out ``plan`` (row, then file, per chunk; counted as evictions) under the writer
        lock, and return what was evicted: ``plan`` itself while the index is as it was planned,
        else the plan of the same selection made again under the lock (a put, access or pin since
        may have changed the order or made a chunk unsafe to drop), so a stale plan never drops a
        pinned chunk or leaves a hole. Raises as ``plan_eviction`` and ReadOnlyStoreError."""
        with self._index.write_lock, self._index.evictor_lock():
            self._index.flush()  # buffered access times count as a change of the order
            # (a shared tier's other writers change it unseen: its plans are always made again)
            if self._protocol.replans_always or plan.generation != self._index.generation:
                plan = plan_of(self._index, plan.selection, generation=self._index.generation)
            for i in range(0, len(plan.victims), DROP_BATCH):
                self._protocol.drop(plan.victims[i:i + DROP_BATCH])
        return plan

    @mutation
    def delete(self, keys: Sequence[bytes]) -> EvictResult:
        """Delete the stored chunks ``keys`` (row, then file; counted as evictions), under the writer
        lock; keys not stored are ignored. A set that would leave a hole is refused as a whole: a
        pinned chunk, or a stored chunk outside ``keys`` that extends one of them (it would become
        unreachable; give its subtree), raise ValueError and delete nothing. Raises
        ReadOnlyStoreError for a read-only store. Returns what was deleted (its keys in the order given)."""
        wanted = list(dict.fromkeys(keys))
        with self._index.write_lock:
            rows = self._index.rows(wanted)
            pinned = [k for k, r in rows.items() if r.pinned]
            if pinned:
                raise ValueError(f"{len(pinned)} of the chunks are pinned (e.g. {pinned[0].hex()}): unpin them first")
            for parent, children in self._index.children_of(list(rows)).items():
                outside = [c for c in children if c not in rows]
                if outside:
                    raise ValueError(f"chunk {parent.hex()} has stored descendants that are not being deleted "
                                     f"(e.g. {outside[0].hex()}); they would be left unreachable")
            victims = [rows[k] for k in wanted if k in rows]
            for i in range(0, len(victims), DROP_BATCH):
                self._protocol.drop(victims[i:i + DROP_BATCH])
        return EvictResult(len(victims), sum(v.stored_bytes for v in victims), tuple(v.key for v in victims))

    @mutation
    def delete_namespace(self, namespace: str) -> EvictResult:
        """Delete every chunk of ``namespace``, pinned ones included."""
        n = freed = 0
        with self._index.write_lock:
            while batch := self._index.keys_in_namespace(namespace, 1000):
                self._protocol.drop(batch)
                n += len(batch)
                freed += sum(v.stored_bytes for v in batch)
        return EvictResult(n, freed)

    @mutation
    def pin(self, keys: Sequence[bytes]) -> int:
        """Keep ``keys`` from eviction; returns how many stored chunks were changed."""
        return self._index.set_pinned(keys, True)

    @mutation
    def unpin(self, keys: Sequence[bytes]) -> int:
        return self._index.set_pinned(keys, False)

    @mutation
    def set_quota(self, namespace: str, quota_bytes: int | None) -> None:
        """Bound the stored bytes of ``namespace`` (None removes the quota). Takes effect on the
        next put into that namespace, which evicts within it to fit."""
        if quota_bytes is not None and quota_bytes < 0:
            raise ValueError("quota_bytes must be >= 0")
        self._index.set_quota(namespace, quota_bytes)
