"""The stats history: samples of the cache's figures, in the API's own table of the store's index
database (chunkstore/api/history_schema.py), so they survive restarts.

Invariants: rows are read and written through the API's own connections (history_db.py, its own
migrations) and written under the store's writer lock (one writer in this process, as every index
write; never for a read-only store); every row carries the key of the server that wrote it
(``server_key``), and a server reads and bounds only the rows of its own key: each append also
deletes that key's rows beyond its newest ``max_rows``, so the table stays bounded and one server's
trim never touches another's rows on a shared tier; one sampler thread per app writes, every
``interval_s``; a sample that cannot be taken or written (no disk tier, read-only store, a rebuild
in progress) is skipped, never retried late.
"""

from __future__ import annotations

import logging
import socket
import threading

from sqlalchemy import Connection, delete, insert, select, update

from chunkstore.disk.store import ChunkStore, ReadOnlyStoreError

from chunkstore.api.backend.base import AdminBackend, BackendError, BackendSnapshot
from chunkstore.api.history_db import HistoryDatabase
from chunkstore.api.history_schema import STATS_HISTORY_FIGURES, STATS_HISTORY_SERVING, stats_history

log = logging.getLogger(__name__)

COLUMNS = ("sampled_at", "uptime_s", *STATS_HISTORY_FIGURES, *STATS_HISTORY_SERVING)


def sample_of(snap: BackendSnapshot) -> dict[str, float | int | None]:
    """One history row from a snapshot (memory and lookup figures None offline, serving ones without an engine)."""
    row: dict[str, float | int | None] = dict.fromkeys(COLUMNS)
    row.update(sampled_at=snap.taken_at, uptime_s=snap.uptime_s)
    c, s = snap.cache, snap.store
    if c is not None:
        row.update(device_used_bytes=c.device.used_bytes, device_capacity_bytes=c.device.capacity_bytes,
                   host_used_bytes=c.host.used_bytes, host_capacity_bytes=c.host.capacity_bytes,
                   lookups=c.lookups, lookup_tokens=c.lookup_tokens, evicted_device_pages=c.evicted_pages["device"],
                   evicted_host_pages=c.evicted_pages["host"])
        for tier, n in c.hit_tokens.items():
            row[f"hit_tokens_{tier}"] = n
        for path, p in c.paths.items():
            row[f"bytes_{path}"] = p.num_bytes
    if snap.serving is not None:
        v = snap.serving
        row.update(requests_total=v.requests_total, completion_tokens_total=v.completion_tokens_total,
                   ttft_sum_s=v.ttft_sum_s, ttft_count=v.ttft_count)
    if s is not None:
        row.update(disk_stored_bytes=s.stored_bytes, disk_raw_bytes=s.raw_bytes, disk_capacity_bytes=s.capacity_bytes,
                   disk_chunks=s.num_chunks, disk_evictions=s.evictions, disk_hits=s.hits, disk_misses=s.misses)
    return row


def server_key(store: ChunkStore) -> str:
    """This server's key in the stats history: '' for a store of its own (the rows written before
    migration 0007 have it too); on a shared tier, where many servers write one index, the host
    name and the store's folder. A restart keeps both (not the pid), so a server's history stays
    continuous; two live servers never share one (each holds its folder's writer lock)."""
    if not store.shared:
        return ""
    return f"{socket.gethostname()}:{store.root.resolve()}"


class HistoryTable:
    """Reads and bounded appends of ``stats_history`` in a store's index database, each server's
    own, through the API's own connection to it (one per database, kept until ``close``)."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self._adopted: set[str] = set()  # the keys that took over the rows written before migration 0007
        self._databases: dict[str, HistoryDatabase] = {}
        self._lock = threading.Lock()

    def _database(self, store: ChunkStore) -> HistoryDatabase:
        with self._lock:
            db = self._databases.get(store.index_url)
            if db is None:
                db = self._databases[store.index_url] = HistoryDatabase(store.index_url)
            return db

    def prepare(self, store: ChunkStore) -> None:
        """Make or upgrade the API's tables in ``store``'s index database (a writable store's; a
        read-only one's are left as they are). Raises sqlalchemy's errors."""
        if not store.read_only:
            self._database(store).migrate()

    def close(self) -> None:
        """Close the connections (a rebuild deletes a SQLite index: the next use connects again)."""
        with self._lock:
            databases, self._databases = self._databases, {}
        for db in databases.values():
            db.close()

    def append(self, store: ChunkStore, rows: list[dict]) -> None:
        """Insert ``rows`` under this server's key (a row that names its ``server``, as the rows that
        ``read(every_server=True)`` returns, keeps it) and drop all but the newest ``max_rows`` of
        each key written. On a shared tier the first append also adopts the rows written before
        migration 0007 (key ''). Takes the store's writer lock. Raises ReadOnlyStoreError (a
        PermissionError) for a read-only store."""
        if store.read_only:
            raise ReadOnlyStoreError(f"the stats history: the store at {store.root} is opened read-only")
        key = server_key(store)
        db = self._database(store)
        db.migrate()
        with store.exclusive(), db.engine.begin() as conn:
            if not rows:
                return
            if key and key not in self._adopted:  # concurrent first samples: one server takes them
                conn.execute(update(stats_history).where(stats_history.c.server == "").values(server=key))
            conn.execute(insert(stats_history), [{"server": key, **row} for row in rows])
            for written in sorted({row.get("server", key) for row in rows}):
                self._trim(conn, written)
        if key:
            self._adopted.add(key)

    def _trim(self, conn: Connection, key: str) -> None:
        mine = stats_history.c.server == key
        oldest_dropped = conn.execute(select(stats_history.c.id).where(mine).order_by(stats_history.c.id.desc())
                                      .offset(self.max_rows).limit(1)).scalar()
        if oldest_dropped is not None:
            conn.execute(delete(stats_history).where(mine, stats_history.c.id <= oldest_dropped))

    def read(self, store: ChunkStore, *, since: float | None = None, until: float | None = None,
             limit: int | None = None, every_server: bool = False) -> list[dict]:
        """This server's samples in time order: the newest ``limit`` of those taken in [since,
        until]. ``every_server``: every server's, each row with its ``server`` key (a rebuild
        carries them over). Nothing where the API has not made its table yet."""
        columns = (*COLUMNS, "server") if every_server else COLUMNS
        stmt = select(*(stats_history.c[name] for name in columns))
        if not every_server:
            stmt = stmt.where(stats_history.c.server == server_key(store))
        if since is not None:
            stmt = stmt.where(stats_history.c.sampled_at >= since)
        if until is not None:
            stmt = stmt.where(stats_history.c.sampled_at <= until)
        stmt = stmt.order_by(stats_history.c.id.desc())
        if limit is not None:
            stmt = stmt.limit(limit)
        db = self._database(store)
        with db.engine.connect() as conn:
            if not db.has_tables(conn):
                return []
            rows = [dict(r) for r in conn.execute(stmt).mappings()]
        rows.reverse()
        return rows


class HistorySampler:
    """A daemon thread appending one sample of ``backend`` every ``interval_s``."""

    def __init__(self, backend: AdminBackend, table: HistoryTable, interval_s: float) -> None:
        self.backend, self.table, self.interval_s = backend, table, interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._has_warned = False
        self.num_samples = 0

    @property
    def is_recording(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="chunkstore-admin-history", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def sample_now(self) -> bool:
        """Take and write one sample; False when it was skipped (see the module invariants)."""
        try:
            snap = self.backend.snapshot()
            with self.backend.using_store(write=True) as store:
                self.table.append(store, [sample_of(snap)])
        except (BackendError, PermissionError):
            return False
        except Exception as exc:  # a sampler must outlive a transient error (disk full, locked DB)
            if not self._has_warned:
                log.warning("stats history sample failed (further failures are not logged): %r", exc)
                self._has_warned = True
            return False
        self.num_samples += 1
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample_now()
