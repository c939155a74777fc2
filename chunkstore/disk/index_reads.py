"""IndexReads: the store's read view of its index (rows, counts, usage, quotas).

Invariants: every method reads and none changes anything, so a read-only store serves them all;
none opens a payload; the index stays private to the store (``_index``), and what callers see of
it is these methods. ChunkStore inherits them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from chunkstore.disk.index import ChunkOrder, ChunkQuery, ChunkRow, NamespaceUsage

if TYPE_CHECKING:
    from chunkstore.disk.index import ChunkIndex


class IndexReads:
    """What the index says, read through the store (``_index`` is the store's ChunkIndex)."""

    _index: ChunkIndex

    def num_chunks(self) -> int:
        """How many chunks are stored (rows of the index)."""
        return self._index.count()

    def stored_bytes(self, namespace: str | None = None) -> int:
        """The stored (compressed) bytes of every chunk, or of ``namespace``'s."""
        return self._index.stored_bytes(namespace)

    def chunk_rows(self, keys: Sequence[bytes]) -> dict[bytes, ChunkRow]:
        """The index rows of the stored keys among ``keys`` (access times still buffered are not
        seen). Opens no file."""
        return self._index.rows(keys)

    def iter_rows(self, batch_size: int = 1000) -> Iterator[ChunkRow]:
        """Every row in key order, a batch at a time (bounded memory)."""
        return self._index.iter_rows(batch_size)

    def list_chunks(self, query: ChunkQuery = ChunkQuery(), *, order: ChunkOrder = ChunkOrder.LAST_ACCESS,
                    descending: bool = True, limit: int = 100,
                    after: tuple[float, bytes] | None = None) -> list[ChunkRow]:
        """Up to ``limit`` rows matching ``query``, sorted by ``order`` then key, after the (sort
        value, key) ``after`` (keyset paging; ChunkIndex.list_chunks)."""
        return self._index.list_chunks(query, order=order, descending=descending, limit=limit, after=after)

    def count_chunks(self, query: ChunkQuery = ChunkQuery()) -> int:
        """How many rows match ``query``."""
        return self._index.count_chunks(query)

    def child_keys(self, key: bytes) -> list[bytes]:
        """The stored chunks that extend ``key`` by one page."""
        return self._index.child_keys(key)

    def namespace_usage(self) -> list[NamespaceUsage]:
        """Per namespace with chunks or a quota: chunks, raw and stored bytes, quota (kept by the
        index's triggers, so never drifting from the rows)."""
        return self._index.usage()

    def quota(self, namespace: str) -> int | None:
        """The quota of ``namespace`` in stored bytes, None when it has none."""
        return self._index.quota(namespace)
