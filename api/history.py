"""The stats history: samples of the cache's figures, in the API's own table of the store's index
file (api/history_schema.py), so they survive restarts.

Invariants: rows are written only through the store's side-table transaction, under its writer
lock (one writer, as every index write); each append also deletes the rows beyond the newest
``max_rows``, so the table stays bounded; one sampler thread per app writes, every ``interval_s``;
a sample that cannot be taken or written (no disk tier, read-only store, a rebuild in progress) is
skipped, never retried late.
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy import delete, func, insert, select

from chunkstore.disk.store import ChunkStore

from chunkstore.api.backend.base import AdminBackend, BackendError, BackendSnapshot
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


class HistoryTable:
    """Reads and bounded appends of ``stats_history`` in a store's index file."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows

    def append(self, store: ChunkStore, rows: list[dict]) -> None:
        """Insert ``rows`` and drop all but the newest ``max_rows``. Takes the store's writer lock.
        Raises ReadOnlyStoreError (a PermissionError) for a read-only store."""
        with store.write_side_tables() as conn:
            if not rows:
                return
            conn.execute(insert(stats_history), rows)
            newest = conn.execute(select(func.max(stats_history.c.id))).scalar() or 0
            conn.execute(delete(stats_history).where(stats_history.c.id <= newest - self.max_rows))

    def read(self, store: ChunkStore, *, since: float | None = None, until: float | None = None,
             limit: int | None = None) -> list[dict]:
        """Samples in time order: the newest ``limit`` of those taken in [since, until]."""
        stmt = select(*(stats_history.c[name] for name in COLUMNS))
        if since is not None:
            stmt = stmt.where(stats_history.c.sampled_at >= since)
        if until is not None:
            stmt = stmt.where(stats_history.c.sampled_at <= until)
        stmt = stmt.order_by(stats_history.c.id.desc())
        if limit is not None:
            stmt = stmt.limit(limit)
        with store.read_side_tables() as conn:
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
