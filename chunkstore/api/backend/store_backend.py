"""StoreBackend: the management API over a chunk store on disk, with no cache running (`chunkstore admin`).

Invariants: the model identity comes from the store's own store.json; the store is opened for
writing (taking its writer lock, so no cache runs on it meanwhile) unless ``read_only``; its index
and payloads are the folder's own unless ``index_url`` / ``object_store`` name a shared tier's
(a PostgreSQL database, a bucket: docs/FLEET.md), which every open (a rebuild's too) uses; a rebuild
swaps the store only once no request uses it (requests arriving meanwhile get
StoreUnavailableError), and the backend closes every store it opened.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chunkstore.disk import Durability, StoreSpec, open_store
from chunkstore.disk.maintenance import Progress, RebuildReport
from chunkstore.disk.maintenance import rebuild as rebuild_index
from chunkstore.disk.store import ChunkStore, read_identity

if TYPE_CHECKING:
    from chunkstore.disk.objects import ObjectStoreConfig
    from chunkstore.disk.seal_keys import KeyProvider

from chunkstore.api.backend.base import (
    AdminBackend, BackendError, BackendKind, BackendSnapshot, Decode, FlushOutcome, ReadOnlyError, StartClock,
    StoreUnavailableError, UnsupportedError,
)


class StoreBackend(AdminBackend):
    """A ChunkStore opened from ``path``; with ``index_url`` (a PostgreSQL database) and
    ``object_store`` (``s3://bucket[/prefix]``, endpoint and keys from the AWS_* variables, or an
    ObjectStoreConfig) the shared tier's; ``seal_key`` the master key of a sealed store. Raises
    FileNotFoundError (no store there, no bucket),
    StoreBusyError (another process writes it; use ``read_only``), IndexMissingError, ValueError (a
    bad URL), sqlalchemy's DatabaseError (a database that cannot be used), or RuntimeError (an
    index that needs `chunkstore db upgrade` before a read-only open)."""

    kind = BackendKind.STORE

    def __init__(self, path: str | Path, *, read_only: bool = False, decode: Decode | None = None,
                 durability: Durability = Durability.FSYNC, index_url: str | None = None,
                 object_store: str | ObjectStoreConfig | None = None, seal_key: KeyProvider | None = None) -> None:
        self.root = Path(path)
        self.spec = StoreSpec(self.root, index_url=index_url, object_store=object_store, durability=durability,
                              read_only=read_only, seal_key=seal_key)
        identity = read_identity(self.root)
        if identity is None:
            raise FileNotFoundError(f"no chunk store at {self.root} (no store.json)")
        self.identity = identity
        self.decode = decode
        self.read_only = read_only
        self._clock = StartClock()
        self._cond = threading.Condition()
        self._users = 0
        self._is_rebuilding = False
        self._store: ChunkStore | None = self._open()

    def _open(self, *, reset_index: bool = False) -> ChunkStore:
        return open_store(self.spec, self.identity, reset_index=reset_index)  # a new bucket client per open

    @property
    def data_dir(self) -> Path:
        return self.root

    @contextmanager
    def using_store(self, *, write: bool = False) -> Iterator[ChunkStore]:
        with self._cond:
            if self._is_rebuilding:
                raise StoreUnavailableError("the store's index is being rebuilt; retry when the rebuild job ends")
            if self._store is None:
                raise StoreUnavailableError(f"the store at {self.root} is closed")
            if write and self.read_only:
                raise ReadOnlyError(f"the store at {self.root} is open read-only (`chunkstore admin --read-only`)")
            self._users += 1
            store = self._store
        try:
            yield store
        finally:
            with self._cond:
                self._users -= 1
                self._cond.notify_all()

    def snapshot(self) -> BackendSnapshot:
        with self.using_store() as store:
            return BackendSnapshot(time.time(), self._clock.uptime_s, None, store.stats(), store.read_only)

    def is_ready(self) -> bool:
        with self._cond:
            return self._store is not None and not self._is_rebuilding

    def settings(self) -> dict[str, Any]:
        return {}

    def reconfigure(self, changes: dict[str, Any]) -> None:
        other = sorted(set(changes) - {"disk_size"})
        if other:
            raise UnsupportedError(f"{', '.join(other)}: no cache runs here (an offline store); only disk_size "
                                   f"can change")
        if "disk_size" in changes:
            size = changes["disk_size"]
            with self.using_store(write=True) as store:
                store.capacity_bytes = None if size is None else int(size * 1e9)

    def flush(self, timeout_s: float | None) -> FlushOutcome:
        with self.using_store(write=True) as store:
            store.flush()
        return FlushOutcome(0, 0)

    def rebuild(self, progress: Progress) -> RebuildReport:
        """Close the store, reopen it with a fresh index and index every chunk file that verifies
        (see `chunkstore rebuild`). Waits for requests using the store to end; new ones get
        StoreUnavailableError until it is done."""
        self.check_rebuild()
        with self._cond:
            if self._is_rebuilding:
                raise BackendError("a rebuild is already running")
            self._is_rebuilding = True
            self._cond.wait_for(lambda: self._users == 0)
            old, self._store = self._store, None
        try:
            if old is not None:
                old.close()
            try:
                store = self._open(reset_index=True)
            except Exception:
                self._store = self._reopen_quietly()
                raise
            self._store = store
            return rebuild_index(store, progress=progress)
        finally:
            with self._cond:
                self._is_rebuilding = False
                self._cond.notify_all()

    def check_rebuild(self) -> None:
        if self.read_only:
            raise ReadOnlyError("a rebuild needs the store opened for writing (not `--read-only`)")

    def _reopen_quietly(self) -> ChunkStore | None:
        try:
            return self._open()
        except Exception:
            return None

    def close(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._users == 0, timeout=30.0)
            store, self._store = self._store, None
        if store is not None:
            store.close()
