"""The chunk index: one SQLite database (WAL) or one PostgreSQL database, through SQLAlchemy Core,
named by a URL.

The URL is the store's index seam: ``sqlite_url(folder)`` (the store's own folder) by default,
any SQLite file, or a PostgreSQL database (``postgresql+psycopg://user@host/db``; the same tables
and alembic migrations) by choice. Another database's URL is refused with ValueError when the index
opens, before anything is written.

Invariants: a row exists only for a chunk whose file was published first (the store writes the
file, then the row; deletes the row, then the file); all writes go through one connection under
one lock (one writer at a time) in batched transactions; reads use pooled connections and never
block on the writer (WAL); ``generation`` grows with every committed change to the rows, so an
eviction plan knows whether it is still exact. Nothing per chunk is kept in Python memory.
Counters (per namespace, and per server in ``server_counters``: one row per process, ``host:pid``,
read by a shared tier's stats) are buffered and written with write transactions made anyway. The
index is the store's own (ChunkStore._index): other parts call the store's methods. The database file is
created 0600 before SQLite opens it (SQLite gives the -wal and -shm files the main file's mode),
and a writer makes existing index files 0600. What SQLite and PostgreSQL do differently is one
object's (``self.dialect``, index_dialect.py): no method here asks which database it is on. Each
write method is one transaction; one that PostgreSQL rolls back for another's sake (a deadlock
between servers) runs again (``_retried_on_conflict``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import and_, bindparam, create_engine, func, or_, select, text, tuple_, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from chunkstore.choices import Choice
from chunkstore.disk import migrations
# What differs between SQLite and PostgreSQL, and the URL helpers, owned there; importable from here.
from chunkstore.disk.index_dialect import (BACKENDS, DB_FILENAME, EVICTOR_LOCK_KEY, LOOKUP_SQL, ROOM_LOCK_KEY,
                                          IndexDialect, IndexMissingError, LockStats, NoRoomError, RoomLimits,
                                          batches, db_files, dialect_for, display_url, index_backend,
                                          prepare_db_files, release_in, row_values, sqlite_path, sqlite_url,
                                          unchecked_checkout)
from chunkstore.disk.schema import (SERVER_COUNTS, chunk_claims, chunks, counters, namespace_quotas, namespace_usage,
                                    server_counters, store_meta)

EVICTOR_LOCK_TIMEOUT_S = 30.0  # how long an evictor waits for another to finish
__all__ = [
    "ChunkIndex", "ChunkOrder", "ChunkQuery", "ChunkRow", "NamespaceUsage", "ServerCounts", "Victim",
    "drop_index", "upgrade_index", "default_server_name", "EVICTOR_LOCK_TIMEOUT_S", "SERVER_EVENTS",
    "SERVER_PRUNE_S", "SERVER_WRITE_INTERVAL_S", "COUNTER_FLUSH_S",
    # owned by index_dialect.py
    "BACKENDS", "DB_FILENAME", "EVICTOR_LOCK_KEY", "LOOKUP_SQL", "ROOM_LOCK_KEY", "IndexDialect", "IndexMissingError",
    "LockStats", "NoRoomError", "RoomLimits", "db_files", "dialect_for", "display_url", "index_backend",
    "prepare_db_files", "sqlite_path", "sqlite_url",
]
# Per-server counters (schema 0006): the events counted per server beside their namespace's counter
# (``count_event``), and how often a write transaction carries them (an explicit flush always does,
# and writes the server's row even with nothing to add: ``last_seen_at`` then says it is alive).
SERVER_EVENTS = frozenset(SERVER_COUNTS) - {"published"}  # published: the rows this index inserted
SERVER_WRITE_INTERVAL_S = 5.0
# Buffered counters and access times are written at least this often while a writer reads (a
# server that only serves hits makes no other write), so another process's `chunkstore stats`
# sees them within seconds.
COUNTER_FLUSH_S = 5.0
SERVER_PRUNE_S = 7 * 86400.0  # a server's row not written for this long is deleted (at most hourly)
_SERVER_PRUNE_EVERY_S = 3600.0
# A write transaction PostgreSQL rolls back for another's sake (a deadlock's victim: two servers'
# transactions took row locks in opposite orders) runs again, up to this many times in all, after
# a random pause of up to CONFLICT_PAUSE_S doubling each time; then the error reaches the caller.
CONFLICT_ATTEMPTS = 5
CONFLICT_PAUSE_S = 0.01
log = logging.getLogger(__name__)


def _retried_on_conflict(method):
    """Run an index write again when its database rolled it back for another transaction's sake.
    Safe for every method it wraps: each is one transaction of its own, and nothing of a rolled
    back one was written (its buffered counters went back to the buffer)."""
    @functools.wraps(method)
    def run(self: ChunkIndex, *args, **kwargs):
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            try:
                return method(self, *args, **kwargs)
            except DBAPIError as e:
                if attempt == CONFLICT_ATTEMPTS or not self.dialect.lost_a_conflict(e):
                    raise
                self.conflicts_retried += 1
                log.debug("index %s: %s rolled back by a conflict (%s); attempt %d of %d",
                          self.dialect.name_shown, method.__name__, e.orig, attempt + 1, CONFLICT_ATTEMPTS)
                time.sleep(random.uniform(0, CONFLICT_PAUSE_S * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")
    return run


class _DeadConnection(OperationalError):
    """A lookup met a pooled connection that was dead (the pool is renewed by then)."""


@dataclass(frozen=True, slots=True)
class ChunkRow:
    key: bytes
    parent_key: bytes
    namespace: str
    num_tokens: int
    raw_bytes: int
    stored_bytes: int
    created_at: float
    last_access_at: float
    hit_count: int = 0
    pinned: bool = False


# ChunkRow's fields in order: the columns of a query that builds rows from plain tuples.
_ROW_COLUMNS = tuple(f.name for f in dataclasses.fields(ChunkRow))


@dataclass(frozen=True, slots=True)
class Victim:
    """A chunk to drop: what deleting it needs (its row goes first, then its file)."""

    key: bytes
    namespace: str
    stored_bytes: int
    raw_bytes: int


@dataclass(frozen=True, slots=True)
class NamespaceUsage:
    namespace: str
    num_chunks: int
    raw_bytes: int
    stored_bytes: int
    quota_bytes: int | None


@dataclass(frozen=True, slots=True)
class ServerCounts:
    """One server's row of ``server_counters`` (its counts since its row was first written)."""

    server: str
    hits: int = 0
    misses: int = 0
    published: int = 0
    dedup_hits: int = 0
    write_errors: int = 0
    first_seen_at: float | None = None  # None: this process's counts, not written yet
    last_seen_at: float | None = None


def default_server_name() -> str:
    """The name this process's counts go under: ``host:pid`` (a store's ``writer_id`` adds a
    random part per store)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class ChunkOrder(Choice):
    """What ``ChunkIndex.list_chunks`` sorts by (then by key)."""

    LAST_ACCESS = "last_access"
    HITS = "hits"
    SIZE = "size"  # stored bytes
    CREATED = "created"


@dataclass(frozen=True, slots=True)
class ChunkQuery:
    """Which rows ``list_chunks`` / ``count_chunks`` return; None leaves a condition out."""

    namespace: str | None = None
    pinned: bool | None = None
    min_stored_bytes: int | None = None
    max_stored_bytes: int | None = None
    accessed_before: float | None = None  # last access strictly before (epoch seconds)
    accessed_after: float | None = None  # last access at or after
    keys: frozenset[bytes] | None = None  # only these keys (e.g. the pages a memory tier holds)


_ORDER_COLUMNS = {ChunkOrder.LAST_ACCESS: chunks.c.last_access_at, ChunkOrder.HITS: chunks.c.hit_count,
                  ChunkOrder.SIZE: chunks.c.stored_bytes, ChunkOrder.CREATED: chunks.c.created_at}
def drop_index(url: str) -> None:
    """Delete the index of ``url`` (for a rebuild from the chunk headers); the payloads stay. On
    PostgreSQL, the index's tables (the database stays)."""
    dialect_for(url).drop()


def _upgrade_in(conn: Connection, dialect: IndexDialect) -> tuple[str | None, str]:
    dialect.lock_migrations(conn)  # one migration at a time, however many servers start at once
    return migrations.upgrade(conn)


def upgrade_index(url: str) -> tuple[str | None, str]:
    """Migrate the index at ``url`` to the newest schema (``chunkstore db upgrade``); returns (revision
    before, head). A new SQLite file is made 0600 first. Raises ValueError for an unsupported URL."""
    dialect = dialect_for(url)
    dialect.prepare(read_only=False, must_exist=False)  # SQLite would create the index (and its WAL) 0644
    engine = create_engine(url)
    try:
        dialect.fit_to_pooler(engine)
        with engine.begin() as conn:
            return _upgrade_in(conn, dialect)
    finally:
        engine.dispose()


class ChunkIndex:
    """Rows of the chunk index; thread-safe. Writes are serialised by ``write_lock``."""

    def __init__(self, url: str, *, read_only: bool = False, must_exist: bool = False,
                 server_name: str | None = None):
        """Open (and migrate, unless ``read_only``) the index at ``url`` (``sqlite_url(folder)``).
        ``server_name`` names this process's row of per-server counters (default ``host:pid``;
        tests name several servers in one process). Raises IndexMissingError when there is no index
        file and ``read_only`` or ``must_exist``, ValueError for a URL that names no SQLite file."""
        if server_name is not None and not server_name:
            raise ValueError("server_name must not be empty")
        self.url = url
        self.server_name = server_name or default_server_name()
        # What SQLite and PostgreSQL do differently, in one object (index_dialect.py).
        self.dialect: IndexDialect = dialect_for(url)
        self.backend = self.dialect.name
        self.path = self.dialect.path
        self.name = self.dialect.name_shown
        self.read_only = read_only
        self.dialect.prepare(read_only=read_only, must_exist=must_exist)
        self.engine: Engine = create_engine(url, pool_size=8, max_overflow=8, pool_pre_ping=self.dialect.pool_pre_ping)
        # PostgreSQL: a put's claim and row commit are one statement each, sent in autocommit: one
        # round trip where a transaction takes three (BEGIN, the statement, COMMIT).
        self._autocommit: Engine = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        self.dialect.configure(self.engine)
        self._insert = self.dialect.insert
        self.write_lock = threading.RLock()
        self._pending_touch: dict[bytes, tuple[int, float]] = {}
        self._pending_counts: Counter[tuple[str, str]] = Counter()
        self._pending_server: Counter[str] = Counter()  # this server's counts (SERVER_COUNTS)
        self._server_written_at = 0.0  # when this server's row was last written (time.time())
        self._buffers_written_at = time.monotonic()  # when the buffers were last written (any write)
        self._pruned_at = 0.0
        self._pending_lock = threading.Lock()
        # The writer's quotas, read once per namespace: only set_quota changes them while this
        # process holds the store's writer lock (every put asks, per namespace).
        self._quotas: dict[str, int | None] = {}
        # Grows with every committed change to the rows (inserts, deletes, pins, access times): an
        # eviction plan made at one generation is still exact at the same generation.
        self.generation = 0
        self.conflicts_retried = 0  # write transactions run again after PostgreSQL rolled them back
        with self.engine.begin() as conn:
            revision = migrations.current_revision(conn)
            self.dialect.check_tables(revision, must_have=read_only or must_exist)
            migrations.check_known(revision, self.name)
            if read_only:
                if revision != migrations.head_revision():
                    raise RuntimeError(f"index {self.name} is not at the current schema; run `chunkstore db upgrade`")
            else:
                _upgrade_in(conn, self.dialect)

    def close(self) -> None:
        """Write the buffered counters and dispose of the connections (even when that write
        fails, e.g. on a full disk: the error is raised after)."""
        try:
            if not self.read_only:
                self.flush()
        finally:
            self.engine.dispose()

    # -- meta ------------------------------------------------------------------------------

    def get_meta(self, name: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(select(store_meta.c.value).where(store_meta.c.name == name)).scalar()

    def set_meta(self, name: str, value: str) -> None:
        with self.write_lock, self.engine.begin() as conn:
            stmt = self._insert(store_meta).values(name=name, value=value)
            conn.execute(stmt.on_conflict_do_update(index_elements=["name"], set_={"value": value}))

    # -- lookups ---------------------------------------------------------------------------

    def present(self, keys: Sequence[bytes]) -> set[bytes]:
        """The stored keys among ``keys``. On every lookup's path (each request asks), so it runs
        plain DB-API statements on a pooled connection: SQLAlchemy's statement building cost ten
        times the query. On PostgreSQL the one statement runs in autocommit: one round trip, where
        a transaction adds a BEGIN before it and a ROLLBACK when the connection goes back. The
        connection is not checked first, however long it sat idle (a round trip of its own): a
        lookup that meets a dead one renews the pool and runs once more, on a new connection."""
        try:
            with unchecked_checkout():
                return self._present_once(keys)
        except _DeadConnection:
            return self._present_once(keys)

    def _present_once(self, keys: Sequence[bytes]) -> set[bytes]:
        """``present`` on one pooled connection; raises _DeadConnection (a DBAPIError) when it was
        dead, after renewing the pool."""
        try:
            conn = self.engine.raw_connection()
        except DBAPIError:
            raise
        except self.engine.dialect.loaded_dbapi.Error as exc:  # a raw connection's errors are the driver's
            raise OperationalError("connect", None, exc) from exc
        errors = self.engine.dialect.loaded_dbapi.Error
        try:
            return self.dialect.present(conn, keys)
        except errors as exc:  # as SQLAlchemy does for its own statements: the driver's error as a DBAPIError,
            if self.engine.dialect.is_disconnect(exc, conn.driver_connection, None):
                conn.invalidate(exc)  # and a dead connection's pool renewed (its others died with it)
                self.engine.dispose()
                raise _DeadConnection("SELECT key FROM chunks", None, exc) from exc
            raise OperationalError("SELECT key FROM chunks", None, exc) from exc
        finally:
            if conn.is_valid:
                self.dialect.after_raw(conn, errors)
            conn.close()

    def rows(self, keys: Sequence[bytes]) -> dict[bytes, ChunkRow]:
        out: dict[bytes, ChunkRow] = {}
        with self.engine.connect() as conn:
            for batch in batches(list(keys)):
                stmt = select(chunks).where(chunks.c.key.in_(bindparam("keys", expanding=True)))
                for r in conn.execute(stmt, {"keys": list(batch)}).mappings():
                    out[r["key"]] = ChunkRow(**r)
        return out

    def iter_rows(self, batch_size: int = 1000) -> Iterator[ChunkRow]:
        """Every row in key order, a batch at a time (bounded memory)."""
        after = b""
        while True:
            with self.engine.connect() as conn:
                stmt = select(chunks).where(chunks.c.key > after).order_by(chunks.c.key).limit(batch_size)
                batch = [ChunkRow(**r) for r in conn.execute(stmt).mappings()]
            if not batch:
                return
            yield from batch
            after = batch[-1].key

    def count(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(chunks)).scalar() or 0)

    def usage(self) -> list[NamespaceUsage]:
        with self.engine.connect() as conn:
            quotas = dict(conn.execute(select(namespace_quotas.c.namespace, namespace_quotas.c.quota_bytes)).all())
            rows = conn.execute(select(namespace_usage)).mappings().all()
        seen = {r["namespace"] for r in rows}
        out = [NamespaceUsage(r["namespace"], r["num_chunks"], r["raw_bytes"], r["stored_bytes"],
                              quotas.get(r["namespace"])) for r in rows]
        out += [NamespaceUsage(ns, 0, 0, 0, q) for ns, q in quotas.items() if ns not in seen]
        return sorted(out, key=lambda u: u.namespace)

    def stored_bytes(self, namespace: str | None = None) -> int:
        with self._autocommit.connect() as conn:  # one statement: no BEGIN, no ROLLBACK (up to three a put)
            stmt = select(func.coalesce(func.sum(namespace_usage.c.stored_bytes), 0))
            if namespace is not None:
                stmt = stmt.where(namespace_usage.c.namespace == namespace)
            return int(conn.execute(stmt).scalar() or 0)

    def quota(self, namespace: str) -> int | None:
        # Another process may set it: a read-only store's writer, a shared tier's other servers.
        if self.read_only or not self.dialect.caches_quota:
            return self._read_quota(namespace)
        with self.write_lock:  # filled and changed only under it, so never from a stale read
            if namespace not in self._quotas:
                self._quotas[namespace] = self._read_quota(namespace)
            return self._quotas[namespace]

    def _read_quota(self, namespace: str) -> int | None:
        with self._autocommit.connect() as conn:  # one statement: no BEGIN, no ROLLBACK
            return conn.execute(select(namespace_quotas.c.quota_bytes)
                                .where(namespace_quotas.c.namespace == namespace)).scalar()

    def counter_values(self) -> dict[tuple[str, str], int]:
        with self.engine.connect() as conn:
            values = {(ns, name): int(v) for ns, name, v in conn.execute(select(counters)).all()}
        with self._pending_lock:
            for k, v in self._pending_counts.items():
                values[k] = values.get(k, 0) + v
        return values

    def server_counts(self, limit: int = 500) -> list[ServerCounts]:
        """The per-server counters, most recently seen first (at most ``limit`` servers), with this
        process's counts not yet written added to its own row (which is always there: with
        ``first_seen_at`` None before its first write)."""
        c = server_counters.c
        with self.engine.connect() as conn:
            stmt = select(server_counters).order_by(c.last_seen_at.desc(), c.server).limit(limit)
            rows = {r["server"]: ServerCounts(**{k: (int(v) if k in SERVER_COUNTS else v) for k, v in r.items()})
                    for r in conn.execute(stmt).mappings()}
        with self._pending_lock:
            pending = Counter(self._pending_server)
        mine = rows.get(self.server_name) or ServerCounts(self.server_name)
        rows[self.server_name] = dataclasses.replace(
            mine, **{name: getattr(mine, name) + pending.get(name, 0) for name in SERVER_COUNTS})
        return list(rows.values())

    def keys_in_namespace(self, namespace: str, limit: int) -> list[Victim]:
        with self.engine.connect() as conn:
            stmt = (select(chunks.c.key, chunks.c.namespace, chunks.c.stored_bytes, chunks.c.raw_bytes)
                    .where(chunks.c.namespace == namespace).limit(limit))
            return [Victim(*r) for r in conn.execute(stmt).all()]

    # -- browsing (read-only; the management API's chunk browser) -------------------------

    def _query_conditions(self, query: ChunkQuery) -> list:
        c = chunks.c
        conds = []
        if query.namespace is not None:
            conds.append(c.namespace == query.namespace)
        if query.pinned is not None:
            conds.append(c.pinned == query.pinned)
        if query.min_stored_bytes is not None:
            conds.append(c.stored_bytes >= query.min_stored_bytes)
        if query.max_stored_bytes is not None:
            conds.append(c.stored_bytes <= query.max_stored_bytes)
        if query.accessed_before is not None:
            conds.append(c.last_access_at < query.accessed_before)
        if query.accessed_after is not None:
            conds.append(c.last_access_at >= query.accessed_after)
        if query.keys is not None:
            conds.append(self.dialect.keys_condition(query.keys))
        return conds

    def _load_query_keys(self, conn: Connection, query: ChunkQuery) -> None:
        self.dialect.load_query_keys(conn, query.keys)

    def list_chunks(self, query: ChunkQuery = ChunkQuery(), *, order: ChunkOrder = ChunkOrder.LAST_ACCESS,
                    descending: bool = True, limit: int = 100,
                    after: tuple[float, bytes] | None = None) -> list[ChunkRow]:
        """Up to ``limit`` rows matching ``query``, sorted by ``order`` then key. ``after`` is the
        (sort value, key) of the last row of the previous page (keyset paging: each page costs the
        same however deep). Changes nothing; access times still in the touch buffer are not seen."""
        if query.keys is not None and not query.keys:
            return []
        col = _ORDER_COLUMNS[ChunkOrder.parse(order)]
        stmt = select(chunks).where(*self._query_conditions(query))
        if after is not None:
            pos = tuple_(col, chunks.c.key)
            stmt = stmt.where(pos < tuple_(*after) if descending else pos > tuple_(*after))
        keys = (col.desc(), chunks.c.key.desc()) if descending else (col.asc(), chunks.c.key.asc())
        stmt = stmt.order_by(*keys).limit(limit)
        with self.engine.connect() as conn:
            self._load_query_keys(conn, query)
            return [ChunkRow(**r) for r in conn.execute(stmt).mappings()]

    def count_chunks(self, query: ChunkQuery = ChunkQuery()) -> int:
        """How many rows match ``query``. Changes nothing."""
        if query.keys is not None and not query.keys:
            return 0
        stmt = select(func.count()).select_from(chunks).where(*self._query_conditions(query))
        with self.engine.connect() as conn:
            self._load_query_keys(conn, query)
            return int(conn.execute(stmt).scalar() or 0)

    def child_keys(self, key: bytes) -> list[bytes]:
        """The stored chunks that extend ``key`` by one page."""
        with self.engine.connect() as conn:
            return list(conn.execute(select(chunks.c.key).where(chunks.c.parent_key == key)).scalars())

    def children_of(self, keys: Sequence[bytes]) -> dict[bytes, list[bytes]]:
        """The stored chunks that extend each of ``keys`` by one page (only keys that have some)."""
        out: dict[bytes, list[bytes]] = {}
        with self.engine.connect() as conn:
            for batch in batches(list(keys)):
                stmt = select(chunks.c.parent_key, chunks.c.key).where(
                    chunks.c.parent_key.in_(bindparam("keys", expanding=True)))
                for parent, child in conn.execute(stmt, {"keys": list(batch)}):
                    out.setdefault(parent, []).append(child)
        return out

    def subtree(self, key: bytes, limit: int | None = None) -> list[tuple[ChunkRow, int]]:
        """``key``'s row and the rows of every stored chunk that extends it, with their depth below
        it (0 for ``key``), deepest first; at most ``limit`` rows (the deepest; None: all). Empty
        when ``key`` is not stored."""
        # (no LIMIT clause for all of them: SQLite reads LIMIT -1 as none, PostgreSQL refuses it)
        sql = text(
            """WITH RECURSIVE sub(key, depth) AS (
                   SELECT key, 0 FROM chunks WHERE key = :key
                   UNION ALL
                   SELECT c.key, sub.depth + 1 FROM chunks c JOIN sub ON c.parent_key = sub.key
               )
               SELECT c.*, sub.depth AS depth FROM sub JOIN chunks c ON c.key = sub.key
               ORDER BY sub.depth DESC, c.key""" + ("" if limit is None else " LIMIT :limit")
        )
        params = {"key": key} if limit is None else {"key": key, "limit": limit}
        with self.engine.connect() as conn:
            rows = conn.execute(sql, params).mappings().all()
        out = []
        for r in rows:
            fields = {k: v for k, v in r.items() if k != "depth"}
            fields["pinned"] = bool(fields["pinned"])
            out.append((ChunkRow(**fields), int(r["depth"])))
        return out

    def by_last_access(self, namespace: str | None = None, after: tuple[float, bytes] | None = None,
                       limit: int = 256, *, count_children: bool = True) -> list[tuple[ChunkRow, int | None]]:
        """Unpinned rows by (last access, key), oldest first, starting after ``after``, each with
        how many stored chunks extend it (None each without ``count_children``: then
        ``children_counts`` counts them, e.g. on other connections at once): the one read eviction
        plans from (chunkstore/disk/eviction.py). Changes nothing."""
        c = chunks.c
        columns = [c[name] for name in _ROW_COLUMNS]
        if count_children:
            child = chunks.alias("child")
            columns.append(select(func.count()).select_from(child).where(child.c.parent_key == c.key)
                           .scalar_subquery())
        stmt = select(*columns).where(c.pinned.is_(False))
        if namespace is not None:
            stmt = stmt.where(c.namespace == namespace)
        if after is not None:  # (the first condition lets the index start at ``after``; the OR alone scanned from the oldest)
            stmt = stmt.where(c.last_access_at >= after[0],
                              or_(c.last_access_at > after[0], and_(c.last_access_at == after[0], c.key > after[1])))
        stmt = stmt.order_by(c.last_access_at, c.key).limit(limit)
        with self.engine.connect() as conn:
            result = conn.execute(stmt).all()
        if count_children:
            return [(ChunkRow(*fields), n) for *fields, n in result]
        return [(ChunkRow(*fields), None) for fields in result]

    def children_counts(self, keys: Sequence[bytes]) -> dict[bytes, int]:
        """How many stored chunks extend each of ``keys`` (keys that none extends are absent): an
        index-only count, no row read."""
        with self.engine.connect() as conn:
            return self.dialect.children_counts(conn, keys)

    # -- writes (each takes write_lock) ----------------------------------------------------

    @_retried_on_conflict
    def insert(self, rows: Iterable[ChunkRow]) -> int:
        """Insert rows, ignoring keys already present; returns how many were new (counted from the
        keys the statement returns: an executemany's rowcount is -1 on PostgreSQL)."""
        values = row_values(rows)
        if not values:
            return 0
        with self._writing() as conn:
            stmt = self._insert(chunks).on_conflict_do_nothing().returning(chunks.c.key)
            n = len(conn.execute(stmt, values).all())
        self._count_published(n)
        return n

    @_retried_on_conflict
    def delete(self, keys: Sequence[bytes]) -> int:
        n = 0
        with self._writing() as conn:
            for batch in batches(sorted(set(keys))):
                stmt = chunks.delete().where(chunks.c.key.in_(bindparam("keys", expanding=True)))
                n += conn.execute(stmt, {"keys": list(batch)}).rowcount
        return n

    @_retried_on_conflict
    def delete_unchanged(self, seen: dict[bytes, float], claim_for: tuple[str, float] | None = None) -> set[bytes]:
        """Delete the rows of ``seen``'s keys that are still the ones seen (``created_at`` as
        given): a row another writer committed since (the chunk evicted and stored again) stays.
        With ``claim_for`` (writer, ttl_s) the deleted keys are claimed for that writer in the same
        transaction (a quarantine: no writer uploads the key while its object moves). Returns the
        keys whose rows went."""
        gone: set[bytes] = set()
        if not seen:
            return gone
        with self._writing() as conn:
            for key, created_at in sorted(seen.items()):
                stmt = (chunks.delete().where(chunks.c.key == key, chunks.c.created_at == created_at)
                        .returning(chunks.c.key))
                gone.update(bytes(k) for k in conn.execute(stmt).scalars())
            if claim_for is not None and gone:
                writer, ttl_s = claim_for
                expires_at = time.time() + ttl_s
                claim = self._insert(chunk_claims).values(
                    [{"key": k, "writer": writer, "expires_at": expires_at} for k in sorted(gone)])
                conn.execute(claim.on_conflict_do_update(index_elements=["key"],
                                                         set_={"writer": writer, "expires_at": expires_at}))
        return gone

    # -- publish claims (a shared tier: many writers, schema 0005) --------------------------

    @_retried_on_conflict
    def claim(self, keys: Sequence[bytes], writer: str, ttl_s: float, now: float | None = None) -> set[bytes]:
        """Claim ``keys`` for ``writer`` until ``now + ttl_s``: the keys this writer may now upload.
        A key claimed by another writer is left to it unless that claim has lapsed (a dead
        writer's), which is taken over; a key that already has a row is not claimed. One statement
        (``INSERT ... ON CONFLICT DO UPDATE ... WHERE the claim lapsed RETURNING key``): on
        PostgreSQL two writers racing for a key get it once.

        On PostgreSQL the statement also leaves out the keys with a row, as of its start: a row
        another writer commits while it runs is not seen, so that key can be claimed again. That is
        harmless: the upload finds the object there and keeps it (write-once), and the row insert
        finds the row and adds none (``insert_claimed``)."""
        now = time.time() if now is None else now
        # In key order: two writers' batches that overlap then lock their rows in one order, so
        # they never deadlock in PostgreSQL.
        ordered = sorted(set(keys))
        if not ordered:
            return set()
        # PostgreSQL: one statement of constant text over arrays, in autocommit.
        with self.write_lock, (self._autocommit.connect() if self.dialect.one_statement
                               else self.engine.begin()) as conn:
            return self.dialect.claim(conn, ordered, writer, now + ttl_s, now)

    @_retried_on_conflict
    def insert_claimed(self, rows: Sequence[ChunkRow], writer: str, room: RoomLimits | None = None) -> set[bytes]:
        """Commit the rows of keys ``writer`` claimed and uploaded: in one transaction, its claims on
        them are deleted and a row inserted for each claim it still held (the row replaces the
        claim). Returns those keys; a claim that lapsed and was taken over (a sweeper, an evictor,
        another writer) is not its to commit, so that key gets no row from it.

        ``room``: the commit must leave the tier within these limits, or it is rolled back and
        raises NoRoomError. The stored bytes are read after the insert, in its transaction: a
        namespace's usage row stays locked by the insert until the commit, and within a capacity
        the transaction first takes the room lock, so the bounded commits of every server are
        checked one after the other and no two can both take the last room. Nothing else waits:
        not reads, unbounded commits, nor evictions (their deletes only make room)."""
        if not rows:
            return set()
        if room is None:
            with self._writing(one_statement=self.dialect.one_statement) as conn:
                held, added = self.dialect.insert_claimed(conn, rows, writer)
            self._count_published(added)
            return held
        with self._writing() as conn:  # (raises NoRoomError with nothing committed)
            held, added = self.dialect.insert_claimed_within(conn, rows, writer, room, EVICTOR_LOCK_TIMEOUT_S)
        self._count_published(added)
        return held

    @_retried_on_conflict
    def release(self, keys: Iterable[bytes], writer: str) -> int:
        """Drop ``writer``'s claims on ``keys`` (a failed upload, or done); returns how many."""
        with self.write_lock, self.engine.begin() as conn:
            return release_in(conn, list(keys), writer)

    @_retried_on_conflict
    def delete_claiming(self, keys: Sequence[bytes], writer: str, ttl_s: float, now: float | None = None) -> int:
        """Delete the rows of ``keys`` and claim the keys for ``writer`` in one transaction (an
        evictor: no other writer may upload a key while its object is being deleted); returns how
        many rows went. The caller deletes the objects, then releases the claims."""
        now = time.time() if now is None else now
        n = 0
        with self._writing() as conn:
            for batch in batches(sorted(set(keys))):  # in key order, as claim
                stmt = chunks.delete().where(chunks.c.key.in_(bindparam("keys", expanding=True)))
                n += conn.execute(stmt, {"keys": list(batch)}).rowcount
                claim = self._insert(chunk_claims).values(
                    [{"key": k, "writer": writer, "expires_at": now + ttl_s} for k in batch])
                conn.execute(claim.on_conflict_do_update(
                    index_elements=["key"], set_={"writer": writer, "expires_at": now + ttl_s}))
        return n

    def lapsed_claims(self, now: float | None = None, limit: int = 1000) -> list[tuple[bytes, str]]:
        """Claims past their expiry (their writers died or stalled): (key, writer), oldest first."""
        now = time.time() if now is None else now
        with self.engine.connect() as conn:
            stmt = (select(chunk_claims.c.key, chunk_claims.c.writer).where(chunk_claims.c.expires_at < now)
                    .order_by(chunk_claims.c.expires_at).limit(limit))
            return [(bytes(k), w) for k, w in conn.execute(stmt)]

    def claim_counts(self, now: float | None = None) -> tuple[int, int]:
        """(claims held, of them lapsed at ``now``)."""
        now = time.time() if now is None else now
        with self.engine.connect() as conn:
            total = conn.execute(select(func.count()).select_from(chunk_claims)).scalar()
            lapsed = conn.execute(select(func.count()).select_from(chunk_claims)
                                  .where(chunk_claims.c.expires_at < now)).scalar()
        return int(total), int(lapsed)

    def claimed(self, keys: Sequence[bytes]) -> set[bytes]:
        """The keys among ``keys`` that some writer claims now (lapsed or not)."""
        found: set[bytes] = set()
        with self.engine.connect() as conn:
            for batch in batches(list(keys)):
                stmt = select(chunk_claims.c.key).where(chunk_claims.c.key.in_(bindparam("keys", expanding=True)))
                found.update(bytes(k) for k in conn.execute(stmt, {"keys": list(batch)}).scalars())
        return found

    @_retried_on_conflict
    def drop_claims(self, claims: Sequence[tuple[bytes, str]]) -> int:
        """Delete the claims ``(key, writer)`` (the sweeper, once it dealt with their objects)."""
        n = 0
        with self.write_lock, self.engine.begin() as conn:
            for key, writer in claims:
                stmt = chunk_claims.delete().where(chunk_claims.c.key == key, chunk_claims.c.writer == writer)
                n += conn.execute(stmt).rowcount
        return n

    @contextmanager
    def evictor_lock(self, timeout_s: float = EVICTOR_LOCK_TIMEOUT_S) -> Iterator[None]:
        """One evictor at a time across every writer of this index: on PostgreSQL a transaction-scoped
        advisory lock held on its own connection for the block (waiting at most ``timeout_s``, then
        sqlalchemy's OperationalError); on SQLite, whose index has one writer, nothing more than
        ``write_lock``. Reentrant in a thread (a put holds it around its room check and its row
        commit, and evicts inside). Take ``write_lock`` first when holding both."""
        with self.dialect.evictor_lock(self.engine, self.write_lock, timeout_s):
            yield

    def evictor_lock_stats(self) -> LockStats:
        """This process's passes through ``evictor_lock`` (PostgreSQL's; nothing on SQLite)."""
        return self.dialect.evictor_lock_stats()

    def room_lock_stats(self) -> LockStats:
        """This process's passes through the room lock of ``insert_claimed`` within a capacity
        (PostgreSQL's; nothing on SQLite)."""
        return self.dialect.room_lock_stats()

    @_retried_on_conflict
    def set_pinned(self, keys: Sequence[bytes], pinned: bool) -> int:
        n = 0
        with self.write_lock:
            with self.engine.begin() as conn:
                for batch in batches(list(keys)):
                    stmt = (update(chunks).where(chunks.c.key.in_(bindparam("keys", expanding=True)))
                            .values(pinned=pinned))
                    n += conn.execute(stmt, {"keys": list(batch)}).rowcount
            self.generation += 1
        return n

    @_retried_on_conflict
    def set_quota(self, namespace: str, quota_bytes: int | None) -> None:
        with self.write_lock, self.engine.begin() as conn:
            if quota_bytes is None:
                conn.execute(namespace_quotas.delete().where(namespace_quotas.c.namespace == namespace))
            else:
                stmt = self._insert(namespace_quotas).values(namespace=namespace, quota_bytes=quota_bytes)
                conn.execute(stmt.on_conflict_do_update(index_elements=["namespace"],
                                                        set_={"quota_bytes": quota_bytes}))
            self._quotas.pop(namespace, None)  # read again once committed (quota() waits for the lock)

    # -- access bookkeeping, batched -------------------------------------------------------

    def touch(self, keys: Iterable[bytes], now: float | None = None) -> None:
        """Record hits; written with the next write transaction or flush (bounded buffer)."""
        now = time.time() if now is None else now
        with self._pending_lock:
            for k in keys:
                n, _ = self._pending_touch.get(k, (0, now))
                self._pending_touch[k] = (n + 1, now)
            full = len(self._pending_touch) >= 4096
        if full and not self.read_only:
            self.flush()

    def count_event(self, namespace: str, name: str, n: int = 1) -> None:
        """Count ``n`` events ``name`` of ``namespace`` (and, for SERVER_EVENTS, of this server);
        written with the next write transaction or flush."""
        if n:
            with self._pending_lock:
                self._pending_counts[(namespace, name)] += n
                if name in SERVER_EVENTS:
                    self._pending_server[name] += n

    def _count_published(self, n: int) -> None:
        if n:
            with self._pending_lock:
                self._pending_server["published"] += n

    def flush_if_due(self) -> None:
        """``flush`` when something is buffered and nothing was written for COUNTER_FLUSH_S (a
        writer only). Raises as ``flush``."""
        if self.read_only or time.monotonic() - self._buffers_written_at < COUNTER_FLUSH_S:
            return
        with self._pending_lock:
            if not (self._pending_counts or self._pending_touch):
                return
        self.flush()

    @_retried_on_conflict
    def flush(self) -> None:
        """Write the buffered access times and counters, this server's row included (even with
        nothing to add: its ``last_seen_at`` moves)."""
        if self.read_only:
            return
        with self._writing(changes_rows=False, server_row=True):
            pass  # the transaction writes the buffers

    @contextmanager
    def _writing(self, changes_rows: bool = True, server_row: bool = False,
                 one_statement: bool = False) -> Iterator[Connection]:
        """A write transaction (under ``write_lock``) that first writes the buffered access times
        and counters; this server's counts too when ``server_row`` (an explicit flush) or at most
        every SERVER_WRITE_INTERVAL_S (so a put batch seldom pays a statement for them). When it
        fails (a full disk) the counters go back to the buffer for the next transaction that
        commits; access times are hints and are dropped, so the buffer stays bounded however long
        the disk is full. ``one_statement``: the caller runs a single statement, sent in
        autocommit when nothing is buffered (PostgreSQL; one round trip instead of three)."""
        with self.write_lock:
            now = time.time()
            due = server_row or now - self._server_written_at >= SERVER_WRITE_INTERVAL_S
            with self._pending_lock:
                touches, self._pending_touch = self._pending_touch, {}
                counts, self._pending_counts = self._pending_counts, Counter()
                servers: Counter[str] = Counter()
                if due:
                    servers, self._pending_server = self._pending_server, Counter()
            writes_server = bool(servers) or server_row
            alone = one_statement and not (touches or counts or writes_server)
            try:
                with (self._autocommit.connect() if alone else self.engine.begin()) as conn:
                    self._flush_in(conn, touches, counts)
                    if writes_server:
                        self._write_server_row(conn, servers, now)
                    yield conn
            except BaseException:
                with self._pending_lock:
                    self._pending_counts.update(counts)
                    self._pending_server.update(servers)
                raise
            if writes_server:
                self._server_written_at = now
            self._buffers_written_at = time.monotonic()
            if changes_rows or touches:
                self.generation += 1

    def _write_server_row(self, conn: Connection, counts: Counter[str], now: float) -> None:
        """Add ``counts`` to this server's row (made on its first write), ``last_seen_at`` = now;
        at most hourly, delete the rows of servers not seen for SERVER_PRUNE_S."""
        c = server_counters.c
        stmt = self._insert(server_counters).values(server=self.server_name, first_seen_at=now, last_seen_at=now,
                                                    **{name: counts.get(name, 0) for name in SERVER_COUNTS})
        changes = {name: c[name] + stmt.excluded[name] for name in SERVER_COUNTS}
        changes["last_seen_at"] = self._greater(c.last_seen_at, stmt.excluded.last_seen_at)
        conn.execute(stmt.on_conflict_do_update(index_elements=["server"], set_=changes))
        if now - self._pruned_at >= _SERVER_PRUNE_EVERY_S:
            conn.execute(server_counters.delete().where(c.last_seen_at < now - SERVER_PRUNE_S,
                                                        c.server != self.server_name))
            self._pruned_at = now

    def _flush_in(self, conn: Connection, touches: dict[bytes, tuple[int, float]],
                  counts: Counter[tuple[str, str]]) -> None:
        if touches:
            # In key order (and counters in name order): two servers' transactions then take these
            # rows' locks in one order; what still conflicts is run again (_retried_on_conflict).
            self.dialect.touch(conn, [(k, n, t) for k, (n, t) in sorted(touches.items())])
        if counts:
            stmt = self._insert(counters).values(namespace=bindparam("ns"), name=bindparam("nm"),
                                                  value=bindparam("v"))
            stmt = stmt.on_conflict_do_update(index_elements=["namespace", "name"],
                                              set_={"value": counters.c.value + stmt.excluded.value})
            conn.execute(stmt, [{"ns": ns, "nm": nm, "v": v} for (ns, nm), v in sorted(counts.items())])

    def _greater(self, a, b):
        """The larger of two values (SQLite's two-argument ``max``, PostgreSQL's ``greatest``)."""
        return self.dialect.greater(a, b)

    def checkpoint(self) -> None:
        """Fold SQLite's write-ahead log into the database file; nothing on PostgreSQL (its server
        checkpoints)."""
        with self.write_lock, self.engine.connect() as conn:
            self.dialect.checkpoint(conn)
