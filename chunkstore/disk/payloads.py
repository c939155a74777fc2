"""PayloadStore: where the chunk payloads live (the store's second seam, beside the index).

A payload is one whole chunk file (header and encoded planes, chunkfile.py), stored under its
32-byte key. The store reaches payloads only through this interface, so that another kind of
storage (an object store) can stand where the folder tree (files.py, the default) stands, with no
change above the store.

Invariants every implementation keeps:
- Write-once, all or nothing: a key holds a complete payload or none. A payload is first *staged*
  (written where no reader looks), then *published* under its key; what is published is never
  changed in place, only deleted (a key published again gets the same bytes: keys are content
  hashes of what the payload holds).
- A failed stage or publish leaves nothing visible under the key and nothing staged behind.
- Reads never allocate more than ``max_size_bytes`` for a payload (a swapped or hostile one
  fails with OSError(EFBIG) instead) and fill the caller's page-aligned buffer when given one.
- Staged payloads of a writer that died are *leftovers*, found and removed by ``leftovers`` and
  ``remove_leftovers``; a live writer's own are never counted (``keep_own``).
The store calls ``publish``, ``delete`` and ``quarantine`` under its writer lock, after (publish)
or before (delete) the index row, so the index never names a payload that is not there.
"""

from __future__ import annotations

import abc
import mmap
import queue
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chunkstore.disk.payload_cache import LocalCopyStats

_ALIGN = 4096  # O_DIRECT needs page-aligned buffers, offsets and lengths


def aligned_size(n: int) -> int:
    """``n`` rounded up to the O_DIRECT alignment (at least one block): how long a read buffer for
    ``n`` bytes must be."""
    return max(_ALIGN, (n + _ALIGN - 1) // _ALIGN * _ALIGN)


def read_buffer(local: threading.local, size: int, buffer: mmap.mmap | None) -> memoryview:
    """Where a read of ``size`` bytes lands: the caller's ``buffer`` (checked long enough), or a
    page-aligned per-thread buffer kept in ``local`` (grown as needed; valid until the thread's
    next read)."""
    if buffer is not None:
        if len(buffer) < aligned_size(size):
            raise ValueError(f"read buffer of {len(buffer)} bytes for a {size}-byte payload")
        return memoryview(buffer)
    buf = getattr(local, "buf", None)
    if buf is None or len(buf) < aligned_size(size):
        # (the old buffer is unmapped once no view of it is left)
        buf = local.buf = mmap.mmap(-1, aligned_size(size))  # page-aligned, for O_DIRECT
    return memoryview(buf)


class ReadBuffers:
    """A bounded pool of page-aligned read buffers, so reads ahead of decoding use fixed memory.

    ``acquire`` blocks while all ``count`` buffers are out; ``release`` returns one.
    """

    def __init__(self, count: int, size_bytes: int):
        self.size_bytes = aligned_size(size_bytes)
        self._free: queue.LifoQueue[mmap.mmap] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(count)

    def acquire(self) -> mmap.mmap:
        self._slots.acquire()
        try:
            return self._free.get_nowait()
        except queue.Empty:
            return mmap.mmap(-1, self.size_bytes)

    def release(self, buf: mmap.mmap) -> None:
        self._free.put(buf)
        self._slots.release()


@dataclass(frozen=True, slots=True)
class Staged:
    """A payload written but not yet visible: ``handle`` is the implementation's own (a temp file's
    path for the folder tree)."""

    key: bytes
    handle: object


class PayloadsUnavailable(OSError):
    """The storage did not answer (an object store that is down or unreachable, bad credentials):
    a read is a miss, and nothing is concluded about the payload (it is not missing, not corrupt).
    Only a storage's own answer that a key is absent is FileNotFoundError."""


class PayloadStore(abc.ABC):
    """The chunk payloads of one store, by key. Thread-safe: the store stages and reads from its
    worker threads."""

    #: Where the payloads are, for messages (a folder, a bucket URL).
    location: str
    #: The name other processes know these payloads by when they may write them too (a bucket
    #: URL), making the store on them a shared tier (the publish protocol: claims in the index);
    #: None for payloads only this store writes (the folder tree, under its writer lock).
    shared_name: str | None = None

    @property
    def origin(self) -> "PayloadStore":
        """The payloads of record: these, or, for a local copy in front of a bucket
        (payload_cache.py), the bucket. Verification reads from here."""
        return self

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Release what the payloads hold open (the store calls it as it closes)."""
        return None

    @abc.abstractmethod
    def create(self) -> None:
        """Make ready for writing (cheap: called on every writable open)."""

    @abc.abstractmethod
    def make_private(self) -> int:
        """Restrict every payload to its owner; returns how many entries changed (0 where the
        storage has no such notion)."""

    @abc.abstractmethod
    def has_any(self) -> bool:
        """Whether any payload may be stored (a cheap test; True may be a false positive)."""

    # -- writing ---------------------------------------------------------------------------

    @abc.abstractmethod
    def stage(self, key: bytes, segments: Sequence[bytes | memoryview]) -> Staged:
        """Write the payload of ``key`` (``segments`` concatenated) where no reader looks. Raises
        OSError when it cannot (ENOSPC for a full disk), leaving nothing staged. Keeps nothing of
        ``segments`` once it returns (a sealed store reuses their buffer for its next chunk)."""

    @abc.abstractmethod
    def publish(self, staged: Sequence[Staged], executor: Executor | None = None) -> None:
        """Make staged payloads visible under their keys (``executor`` may run the work in
        parallel). Raises OSError; the caller then deletes the keys and discards the rest."""

    @abc.abstractmethod
    def discard(self, staged: Staged) -> None:
        """Drop a staged payload that will not be published (idempotent; never raises)."""

    # -- reading ---------------------------------------------------------------------------

    @abc.abstractmethod
    def read(self, key: bytes, max_size_bytes: int, buffer: mmap.mmap | None = None) -> memoryview:
        """The whole payload of ``key``, in ``buffer`` (at least ``aligned_size(max_size_bytes)``
        long) or by default in a per-thread buffer valid until this thread's next read. Raises
        FileNotFoundError when absent, OSError(EFBIG) when over ``max_size_bytes``, OSError."""

    @abc.abstractmethod
    def exists(self, key: bytes) -> bool:
        """Whether a payload is published under ``key``."""

    @abc.abstractmethod
    def modified_at(self, key: bytes) -> float | None:
        """When the payload of ``key`` was published (Unix seconds), None when absent."""

    @abc.abstractmethod
    def keys(self) -> Iterator[bytes]:
        """Every published key (a full listing: for verify and rebuild only)."""

    # -- removing --------------------------------------------------------------------------

    @abc.abstractmethod
    def delete(self, key: bytes) -> bool:
        """Remove the payload of ``key``; returns whether there was one."""

    def delete_many(self, keys: Sequence[bytes]) -> None:
        """Remove the payloads of ``keys`` (absent ones included); an object store batches this."""
        for key in keys:
            self.delete(key)

    def drop_copy(self, key: bytes) -> None:
        """Forget any local copy of ``key`` (the payloads of record stay): one that failed a check
        the payload of record passes. Nothing to do where there is no copy."""
        return None

    @abc.abstractmethod
    def quarantine(self, key: bytes) -> str | None:
        """Move the payload of ``key`` aside (kept for a post-mortem, never read again); returns
        where it went, None when it was already gone."""

    @abc.abstractmethod
    def purge_quarantine(self) -> int:
        """Delete every quarantined payload; returns how many."""

    @abc.abstractmethod
    def leftovers(self, keep_own: bool = False) -> set[str]:
        """Names of staged payloads that were never published nor discarded (a writer died);
        ``keep_own`` leaves out this process's, which may be puts in flight."""

    @abc.abstractmethod
    def remove_leftovers(self, keep_own: bool = False) -> int:
        """Delete the leftovers (call only under the store's writer lock); returns how many."""

    def local_copy_stats(self) -> "LocalCopyStats | None":
        """The local copy's figures when these payloads keep one (payload_cache.py), else None."""
        return None
