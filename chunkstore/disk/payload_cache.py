"""CachedPayloads: a shared tier's payloads (the bucket, the store of record) with a bounded copy
on this server's local disk of what it read, so a hot prefix is not fetched over the network
each time its pages leave host memory.

Invariants:
- The bucket is the only store of record: writes, listings, existence and deletes go to it; the
  local copy is never the reason a key is a hit (the index rows decide that, as without a copy).
- A local copy is the bucket's bytes for its key plus their xxh3-128 digest (16 bytes at the
  end). A copy whose digest does not match (a torn write, a bad disk block) is dropped and the
  read goes to the bucket: a bad copy never makes the store quarantine a good object. Above the
  digest, every read is verified as any other (chunk header, key, raw checksum).
- Bounded: the copies' bytes stay within ``capacity_bytes`` (least recently read go first),
  tracked in ``entries.db`` (a SQLite file of this folder: key, size, last read), not in Python
  memory. An entry is written before its file and removed after it, so a crash leaves at most an
  entry without a file (a local miss), never a file that nothing will evict; an entries file that
  cannot be read empties the folder (it is a cache).
- A copy that cannot be written (a full disk) is skipped: the read still returns the bucket's
  bytes. Deleting or quarantining a key drops its copy too.
The folder is this server's own: its store's writer lock covers it, so one process writes it.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import xxhash

from chunkstore.disk.files import PRIVATE_FILE_MODE, ChunkFiles, Durability, make_private_dir
from chunkstore.disk.payloads import PayloadStore, Staged

log = logging.getLogger(__name__)

LOCAL_COPY_FOLDER = "shared-cache"  # in a shared tier's store folder
DIGEST_SIZE_BYTES = 16  # xxh3-128 of the copy's bytes, after them
ENTRIES_FILENAME = "entries.db"
TOUCH_BUFFER_ENTRIES = 256  # last-read times written in batches of this many


@dataclass(frozen=True, slots=True)
class LocalCopyStats:
    """The local copy of a shared tier's payloads, since this process opened it (the sizes: now)."""

    folder: str
    capacity_bytes: int
    size_bytes: int  # the copies' bytes now
    entries: int  # copies now
    hits: int  # reads served from a local copy
    misses: int  # reads that went to the bucket
    fills: int  # copies written
    fill_failures: int  # copies that could not be written (the read still succeeded)
    dropped: int  # copies whose digest did not match, removed
    evicted: int  # copies removed to stay within the capacity


class _Entries:
    """What the local copies are, in a SQLite file: key, size, last read. Thread-safe (one lock:
    its statements take microseconds)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.exists():  # created 0600 before SQLite opens it (its WAL takes its mode)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, PRIVATE_FILE_MODE))
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=OFF")  # a lost entry is a local miss, nothing more
        self._db.execute("CREATE TABLE IF NOT EXISTS entries (key BLOB PRIMARY KEY, size_bytes INTEGER NOT NULL,"
                         " last_read REAL NOT NULL)")
        self._db.execute("CREATE INDEX IF NOT EXISTS ix_entries_last_read ON entries (last_read)")
        self.lock = threading.Lock()
        self.size_bytes, self.count = self._db.execute(
            "SELECT coalesce(sum(size_bytes), 0), count(*) FROM entries").fetchone()
        self._touched: dict[bytes, float] = {}

    def add(self, key: bytes, size_bytes: int) -> None:
        with self.lock:
            old = self._db.execute("SELECT size_bytes FROM entries WHERE key = ?", (key,)).fetchone()
            self._db.execute("INSERT OR REPLACE INTO entries VALUES (?, ?, ?)", (key, size_bytes, time.time()))
            self.size_bytes += size_bytes - (old[0] if old else 0)
            self.count += 0 if old else 1

    def remove(self, keys: Sequence[bytes]) -> None:
        if not keys:
            return
        with self.lock:
            self._flush_touched()
            for key in keys:
                row = self._db.execute("DELETE FROM entries WHERE key = ? RETURNING size_bytes", (key,)).fetchone()
                if row is not None:
                    self.size_bytes -= row[0]
                    self.count -= 1

    def touch(self, key: bytes) -> None:
        with self.lock:
            self._touched[key] = time.time()
            if len(self._touched) >= TOUCH_BUFFER_ENTRIES:
                self._flush_touched()

    def oldest(self, need_bytes: int, spare: bytes) -> list[bytes]:
        """The least recently read keys whose sizes add up to ``need_bytes`` (``spare`` left out)."""
        keys: list[bytes] = []
        with self.lock:
            self._flush_touched()
            freed = 0
            for key, size in self._db.execute("SELECT key, size_bytes FROM entries ORDER BY last_read, key"):
                if freed >= need_bytes:
                    break
                if key != spare:
                    keys.append(key)
                    freed += size
        return keys

    def _flush_touched(self) -> None:
        if self._touched:
            self._db.executemany("UPDATE entries SET last_read = ? WHERE key = ?",
                                 [(t, k) for k, t in self._touched.items()])
            self._touched.clear()

    def close(self) -> None:
        with self.lock:
            try:
                self._flush_touched()
            except sqlite3.Error as exc:  # a full disk: the last-read times are mere hints
                log.warning("cannot write the local copies' read times to %s: %s", self.path, exc)
            self._db.close()


class CachedPayloads(PayloadStore):
    """``source`` (a shared tier's bucket) with copies of what this process read from it in
    ``folder`` (a folder tree, written without fsync: the digest catches a torn copy), at most
    ``capacity_bytes`` of them."""

    def __init__(self, source: PayloadStore, folder: str | os.PathLike, capacity_bytes: int):
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        self.source = source
        self.location = source.location
        self.shared_name = source.shared_name
        self.folder = Path(folder)
        self.capacity_bytes = capacity_bytes
        self.copies = ChunkFiles(self.folder, Durability.NONE)
        self._entries: _Entries | None = None
        self._counts_lock = threading.Lock()
        self._counts = dict.fromkeys(("hits", "misses", "fills", "fill_failures", "dropped", "evicted"), 0)

    @property
    def origin(self) -> PayloadStore:
        return self.source

    def _count(self, name: str, n: int = 1) -> None:
        with self._counts_lock:
            self._counts[name] += n

    # -- lifecycle -------------------------------------------------------------------------

    def create(self) -> None:
        self.source.create()
        make_private_dir(self.folder)
        self.copies.create()
        self.copies.remove_leftovers()
        if self._entries is None:
            self._entries = self._open_entries()

    def _open_entries(self) -> _Entries:
        path = self.folder / ENTRIES_FILENAME
        try:
            return _Entries(path)
        except sqlite3.Error as exc:
            log.warning("the local copies' entries at %s cannot be read (%s): emptying %s", path, exc, self.folder)
        for name in ("chunks", "tmp", "quarantine", ENTRIES_FILENAME, ENTRIES_FILENAME + "-wal",
                     ENTRIES_FILENAME + "-shm"):
            target = self.folder / name
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
        self.copies.create()
        return _Entries(path)

    def close(self) -> None:
        if self._entries is not None:
            self._entries.close()
            self._entries = None
        self.source.close()

    def make_private(self) -> int:
        return self.source.make_private() + self.copies.make_private()

    def has_any(self) -> bool:
        return self.source.has_any()

    # -- writing (the bucket's) --------------------------------------------------------------

    def stage(self, key: bytes, segments: Sequence[bytes | memoryview]) -> Staged:
        return self.source.stage(key, segments)

    def publish(self, staged: Sequence[Staged], executor: Executor | None = None) -> None:
        self.source.publish(staged, executor)

    def discard(self, staged: Staged) -> None:
        self.source.discard(staged)

    # -- reading ---------------------------------------------------------------------------

    def read(self, key: bytes, max_size_bytes: int, buffer: mmap.mmap | None = None) -> memoryview:
        """The local copy of ``key`` when there is a good one, else the bucket's object (and a
        copy of it kept). Raises as the bucket's ``read``."""
        entries = self._entries
        if entries is not None:
            view = self._read_copy(entries, key, max_size_bytes, buffer)
            if view is not None:
                return view
        view = self.source.read(key, max_size_bytes, buffer)
        if entries is not None:
            self._count("misses")
            self._keep_copy(entries, key, view, max_size_bytes)
        return view

    def _read_copy(self, entries: _Entries, key: bytes, max_size_bytes: int,
                   buffer: mmap.mmap | None) -> memoryview | None:
        try:
            view = self.copies.read(key, max_size_bytes, buffer)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:  # unreadable or over the bound: the bucket decides
            if exc.errno != errno.EFBIG:  # over this read's bound only: the copy may serve another
                self._drop(entries, key, f"unreadable: {exc}")
            return None
        size = len(view) - DIGEST_SIZE_BYTES
        if size < 0 or xxhash.xxh3_128_digest(view[:size]) != view[size:]:
            self._drop(entries, key, "its digest does not match")
            return None
        entries.touch(key)
        self._count("hits")
        return view[:size]

    def _drop(self, entries: _Entries, key: bytes, why: str) -> None:
        log.warning("dropping the local copy of chunk %s in %s: %s", key.hex(), self.folder, why)
        self.copies.delete(key)
        entries.remove([key])
        self._count("dropped")

    def _keep_copy(self, entries: _Entries, key: bytes, view: memoryview, max_size_bytes: int) -> None:
        size = len(view) + DIGEST_SIZE_BYTES
        if size > min(max_size_bytes, self.capacity_bytes):
            return
        entries.add(key, size)  # the entry first: a crash leaves no copy that nothing evicts
        try:
            staged = self.copies.stage(key, [view, xxhash.xxh3_128_digest(view)])
            try:
                self.copies.publish([staged])
            except BaseException:
                self.copies.discard(staged)
                raise
        except OSError as exc:
            entries.remove([key])
            self._count("fill_failures")
            log.debug("cannot keep a local copy of chunk %s in %s: %s", key.hex(), self.folder, exc)
            return
        self._count("fills")
        if entries.size_bytes > self.capacity_bytes:
            self._evict(entries, entries.size_bytes - self.capacity_bytes, spare=key)

    def _evict(self, entries: _Entries, need_bytes: int, spare: bytes) -> None:
        keys = entries.oldest(need_bytes, spare)
        for key in keys:  # the file first, then its entry
            self.copies.delete(key)
        entries.remove(keys)
        self._count("evicted", len(keys))

    def exists(self, key: bytes) -> bool:
        return self.source.exists(key)

    def modified_at(self, key: bytes) -> float | None:
        return self.source.modified_at(key)

    def keys(self) -> Iterator[bytes]:
        return self.source.keys()

    # -- removing --------------------------------------------------------------------------

    def _forget(self, keys: Sequence[bytes]) -> None:
        entries = self._entries
        for key in keys:
            self.copies.delete(key)
        if entries is not None:
            entries.remove(keys)

    def drop_copy(self, key: bytes) -> None:
        if self._entries is not None and self.copies.exists(key):
            log.warning("dropping the local copy of chunk %s in %s: it failed verification, the bucket's passes",
                        key.hex(), self.folder)
            self._forget([key])
            self._count("dropped")

    def delete(self, key: bytes) -> bool:
        self._forget([key])
        return self.source.delete(key)

    def delete_many(self, keys: Sequence[bytes]) -> None:
        self._forget(keys)
        self.source.delete_many(keys)

    def quarantine(self, key: bytes) -> str | None:
        """Quarantine the bucket's object (the store found the bytes bad: the copy held the same
        bytes, as its digest matched) and drop the copy."""
        self._forget([key])
        return self.source.quarantine(key)

    def purge_quarantine(self) -> int:
        return self.source.purge_quarantine() + self.copies.purge_quarantine()

    def leftovers(self, keep_own: bool = False) -> set[str]:
        return self.source.leftovers(keep_own)

    def remove_leftovers(self, keep_own: bool = False) -> int:
        return self.source.remove_leftovers(keep_own)

    # -- stats -----------------------------------------------------------------------------

    def local_copy_stats(self) -> LocalCopyStats | None:
        entries = self._entries
        with self._counts_lock:
            counts = dict(self._counts)
        return LocalCopyStats(folder=str(self.folder), capacity_bytes=self.capacity_bytes,
                              size_bytes=entries.size_bytes if entries else 0,
                              entries=entries.count if entries else 0, **counts)
