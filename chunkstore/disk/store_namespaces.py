"""NamespaceChecks: the store's inherited entry points that name a namespace (quotas, deletes,
shreds, eviction plans, listings) check it first, with the one rule (namespaces.py).

Invariant: a namespace that cannot be one is refused (NamespaceError, a ValueError naming it)
before the index or a payload is touched, so it never reaches a database driver (a lone
surrogate would fail there with an encoding error) nor the store's statistics. ChunkStore lists
this class first among its bases: each method checks, then calls the one it stands in front of
(store_eviction.py, index_reads.py, store_sealing.py); put, get, get_into, exists and
longest_prefix, the store's own, check inline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chunkstore.disk.index import ChunkQuery
from chunkstore.disk.namespaces import check_namespace
from chunkstore.disk.read_only import mutation

if TYPE_CHECKING:
    from chunkstore.disk.eviction import EvictionPlan, EvictionSelection
    from chunkstore.disk.index import ChunkRow
    from chunkstore.disk.results import EvictResult
    from chunkstore.disk.store_sealing import ShredResult


class NamespaceChecks:
    """Each method checks the namespace it is given, then calls the next class's method of the
    same name (named in its docstring), whose contract it keeps."""

    @mutation
    def set_quota(self, namespace: str, quota_bytes: int | None) -> None:
        """EvictionOps.set_quota, ``namespace`` checked first."""
        return super().set_quota(check_namespace(namespace), quota_bytes)  # type: ignore[misc]

    @mutation
    def delete_namespace(self, namespace: str) -> EvictResult:
        """EvictionOps.delete_namespace, ``namespace`` checked first."""
        return super().delete_namespace(check_namespace(namespace))  # type: ignore[misc]

    @mutation
    def shred_namespace(self, namespace: str) -> ShredResult:
        """SealOps.shred_namespace, ``namespace`` checked first."""
        return super().shred_namespace(check_namespace(namespace))  # type: ignore[misc]

    def quota(self, namespace: str) -> int | None:
        """IndexReads.quota, ``namespace`` checked first."""
        return super().quota(check_namespace(namespace))  # type: ignore[misc]

    def stored_bytes(self, namespace: str | None = None) -> int:
        """IndexReads.stored_bytes, ``namespace`` (when given) checked first."""
        return super().stored_bytes(_checked(namespace))  # type: ignore[misc]

    def plan_eviction(self, selection: EvictionSelection) -> EvictionPlan:
        """EvictionOps.plan_eviction, the selection's namespace (when given) checked first."""
        _checked(selection.namespace)
        return super().plan_eviction(selection)  # type: ignore[misc]

    def list_chunks(self, query: ChunkQuery = ChunkQuery(), **kw) -> list[ChunkRow]:
        """IndexReads.list_chunks, the query's namespace (when given) checked first."""
        _checked(query.namespace)
        return super().list_chunks(query, **kw)  # type: ignore[misc]

    def count_chunks(self, query: ChunkQuery = ChunkQuery()) -> int:
        """IndexReads.count_chunks, the query's namespace (when given) checked first."""
        _checked(query.namespace)
        return super().count_chunks(query)  # type: ignore[misc]


def _checked(namespace: str | None) -> str | None:
    return None if namespace is None else check_namespace(namespace)
