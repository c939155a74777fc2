"""What the chunk index does differently on SQLite and on PostgreSQL, in one object per database
(``dialect_for(url)``), so that ChunkIndex states each operation once.

Invariants: both dialects give the same answers to the same calls (tests/test_store_postgres.py
and the shared-tier suites run the store's contract on both); SQLite has one writer at a time, so
its evictor lock is the index's write lock and a claim releases a key with a row in the same
transaction; on PostgreSQL every hot statement is constant text over arrays (``%b``: binary, no
per-element quoting in Python), sent in autocommit when it is alone (one round trip), and a raw
connection goes back to the pool transactional, or not at all; behind a pooler that hands out
server sessions per transaction (PgBouncer's transaction mode) no statement is prepared
server-side, and one that allows no transaction (statement mode) is refused when the index opens.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import LargeBinary, any_, bindparam, column, create_engine, event, func, literal, select, table
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError

from chunkstore.disk import migrations
from chunkstore.disk.files import PRIVATE_FILE_MODE, make_private
from chunkstore.disk.schema import chunk_claims, chunks, namespace_usage

DB_FILENAME = "index.db"
BACKENDS = ("sqlite", "postgresql")
_IN_BATCH = 500  # keys per IN (...) query, well under SQLite's variable limit
_MIGRATION_LOCK = 0x6368756E6B  # PostgreSQL advisory lock key of schema migrations ("chunk")
LOOKUP_SQL = "SELECT key FROM chunks WHERE key = ANY(%b)"  # PostgreSQL: which keys are stored, in one statement
EVICTOR_LOCK_KEY = 0x6368756E6B01  # PostgreSQL advisory lock key of a shared tier's one evictor at a time
ROOM_LOCK_KEY = 0x6368756E6B02  # ... and of its bounded row commits' room check, one at a time
# A per-query key list, in the connection's temp schema: created inside the read transaction, so
# the rollback that ends it removes the table again. No SQLite variable limit applies to it.
_QUERY_KEYS = table("chunk_query_keys", column("key"), schema="temp")


class IndexMissingError(RuntimeError):
    """The SQLite index is gone while chunk files remain: `chunkstore rebuild` recreates it."""


class PoolerModeError(ValueError):
    """The index URL reaches PostgreSQL through a pooler whose mode the index cannot work in."""


log = logging.getLogger(__name__)


# -- URLs ------------------------------------------------------------------------------------

def index_backend(url: str) -> str:
    """``"sqlite"`` or ``"postgresql"``: the database an index URL names. Raises ValueError for a
    URL that is not one, or names another database."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ValueError(f"not a database URL: {url!r}") from exc
    backend = parsed.get_backend_name()
    if backend not in BACKENDS:
        raise ValueError(f"index URL {parsed.render_as_string()!r}: only sqlite:///PATH and "
                         "postgresql+psycopg://USER@HOST/DATABASE URLs are supported")
    return backend


def display_url(url: str) -> str:
    """The URL with its password hidden (for messages and logs)."""
    return make_url(url).render_as_string(hide_password=True)


def sqlite_url(folder: str | os.PathLike) -> str:
    """The URL of the index kept in a store's folder (``index.db`` there): the default."""
    return f"sqlite:///{Path(folder) / DB_FILENAME}"


def sqlite_path(url: str) -> Path:
    """The database file of a SQLite index URL. Raises ValueError for a URL that is not one, for
    another database and for an in-memory database (an index must outlive the process)."""
    if index_backend(url) != "sqlite":
        raise ValueError(f"index URL {display_url(url)!r} is not a SQLite file")
    parsed = make_url(url)
    if not parsed.database or parsed.database == ":memory:" or parsed.database.startswith("file:"):
        raise ValueError(f"index URL {url!r} names no database file (write sqlite:///PATH)")
    return Path(parsed.database)


def db_files(url: str) -> list[Path]:
    """The index file of ``url`` and its WAL and shared-memory files."""
    db = sqlite_path(url)
    return [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]


def prepare_db_files(url: str) -> None:
    """Create the index file empty with mode 0600 unless it exists (an empty file is an empty
    SQLite database), and make the existing index, WAL and shared-memory files 0600: SQLite
    creates files 0644, and the -wal and -shm files with the main file's mode."""
    db = sqlite_path(url)
    try:
        os.close(os.open(db, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE))
    except FileExistsError:
        pass
    for f in db_files(url):
        make_private(f, PRIVATE_FILE_MODE)


def batches(items: Sequence, size: int = _IN_BATCH) -> Iterator[Sequence]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def row_values(rows: Iterable[Any]) -> list[dict]:
    """ChunkRows as the ``chunks`` table's insert parameters."""
    return [dict(key=r.key, parent_key=r.parent_key, namespace=r.namespace, num_tokens=r.num_tokens,
                 raw_bytes=r.raw_bytes, stored_bytes=r.stored_bytes, created_at=r.created_at,
                 last_access_at=r.last_access_at, hit_count=r.hit_count, pinned=r.pinned)
            for r in rows]


def release_in(conn: Connection, keys: Sequence[bytes], writer: str) -> int:
    """Delete ``writer``'s claims on ``keys`` in the caller's transaction; returns how many."""
    n = 0
    for batch in batches(list(keys)):
        stmt = chunk_claims.delete().where(chunk_claims.c.key.in_(bindparam("keys", expanding=True)),
                                           chunk_claims.c.writer == writer)
        n += conn.execute(stmt, {"keys": list(batch)}).rowcount
    return n


_CONFLICT_SQLSTATES = frozenset({"40P01", "40001"})  # deadlock_detected, serialization_failure


# -- the two dialects ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LockStats:
    """This process's passes through one of a shared tier's fleet-wide locks since it opened the
    store: the evictor lock (evictions, and bounded puts that must evict) or the room lock
    (bounded puts' row commits, within a capacity). The fleet passes each one at a time, so the
    rate of ``held_s`` summed over the servers is the lock's utilisation, which bounds the fleet
    whatever the database's cores (docs/FLEET.md, Sizing)."""

    acquired: int = 0  # times this process took it
    waited_s: float = 0.0  # seconds spent waiting for it
    held_s: float = 0.0  # seconds this process held it (to its transaction's end)


@dataclass(frozen=True, slots=True)
class RoomLimits:
    """What a bounded put's rows must fit within once committed: the tier's capacity (this
    server's setting) and the quotas of the namespaces it puts into (``insert_claimed``)."""

    capacity_bytes: int | None = None
    quotas: dict[str, int] = field(default_factory=dict)  # namespace: its quota in bytes


class NoRoomError(Exception):
    """A bounded row commit that would have overfilled the tier or a namespace's quota: it was
    rolled back, and nothing of it was committed (the put evicts, then commits again)."""


def over_limits(conn: Connection, room: RoomLimits, namespaces: set[str]) -> str | None:
    """Which of ``room``'s limits the stored bytes are past, read in ``conn``'s transaction (None
    when within all)."""
    if room.capacity_bytes is not None:
        total = conn.execute(select(func.coalesce(func.sum(namespace_usage.c.stored_bytes), 0))).scalar()
        if int(total or 0) > room.capacity_bytes:
            return f"capacity of {room.capacity_bytes} bytes"
    quotas = {ns: q for ns, q in room.quotas.items() if ns in namespaces}
    if quotas:
        stmt = (select(namespace_usage.c.namespace, namespace_usage.c.stored_bytes)
                .where(namespace_usage.c.namespace.in_(list(quotas))))
        for ns, stored in conn.execute(stmt):
            if stored > quotas[ns]:
                return f"namespace quota of {quotas[ns]} bytes"
    return None


class LockCounts:
    """A lock's LockStats as this process's threads add their passes."""

    def __init__(self) -> None:
        self._stats = LockStats()
        self._lock = threading.Lock()

    def add(self, waited_s: float, held_s: float) -> None:
        with self._lock:
            t = self._stats
            self._stats = LockStats(t.acquired + 1, t.waited_s + waited_s, t.held_s + held_s)

    @property
    def stats(self) -> LockStats:
        return self._stats


class SqliteDialect:
    """A SQLite file (WAL, synchronous=NORMAL), one writer at a time."""

    name = "sqlite"
    insert = staticmethod(sqlite_insert)
    one_statement = False  # no round trips to save
    pool_pre_ping = False
    caches_quota = True  # only the process holding the store's writer lock changes a quota
    serves_many_stores = False  # a file in (or beside) its store's folder
    behind_pooler = False

    def __init__(self, url: str) -> None:
        self.url = url
        self.path: Path | None = sqlite_path(url)
        self.name_shown = str(self.path)

    def prepare(self, *, read_only: bool, must_exist: bool) -> None:
        """Before the engine opens: IndexMissingError for a missing file that must be there; a
        writer's new file is made 0600 first."""
        if (read_only or must_exist) and not self.path.is_file():
            raise IndexMissingError(f"the index {self.path} is missing; run `chunkstore rebuild --disk-path "
                                    f"{self.path.parent}`")
        if not read_only:
            prepare_db_files(self.url)

    def configure(self, engine: Engine) -> None:
        event.listen(engine, "connect", _on_connect)
        event.listen(engine, "begin", _on_begin)

    def fit_to_pooler(self, engine: Engine) -> None:
        pass  # a file: no pooler stands between

    def check_tables(self, revision: str | None, *, must_have: bool) -> None:
        pass  # a missing file was refused by ``prepare``; an empty one is a new index

    def present(self, conn: Any, keys: Sequence[bytes]) -> set[bytes]:
        found: set[bytes] = set()
        cursor = conn.cursor()
        for batch in batches(list(keys)):
            sql = f"SELECT key FROM chunks WHERE key IN ({','.join('?' * len(batch))})"
            found.update(row[0] for row in cursor.execute(sql, list(batch)))
        cursor.close()
        return found

    def after_raw(self, conn: Any, errors: type[Exception]) -> None:
        pass

    def keys_condition(self, keys: frozenset[bytes]):
        return chunks.c.key.in_(select(_QUERY_KEYS.c.key))

    def children_counts(self, conn: Connection, keys: Sequence[bytes]) -> dict[bytes, int]:
        out: dict[bytes, int] = {}
        for batch in batches(list(keys)):
            sql = (f"SELECT parent_key, count(*) FROM chunks WHERE parent_key IN ({','.join('?' * len(batch))}) "
                   "GROUP BY parent_key")
            out.update(conn.exec_driver_sql(sql, tuple(batch)).all())
        return out

    def load_query_keys(self, conn: Connection, keys: frozenset[bytes] | None) -> None:
        if keys is not None:
            conn.exec_driver_sql("CREATE TEMP TABLE IF NOT EXISTS chunk_query_keys (key BLOB PRIMARY KEY)")
            conn.exec_driver_sql("DELETE FROM temp.chunk_query_keys")
            conn.exec_driver_sql("INSERT OR IGNORE INTO temp.chunk_query_keys VALUES (?)", [(k,) for k in keys])

    def touch(self, conn: Connection, touches: Sequence[tuple[bytes, int, float]]) -> None:
        """Add (key, hits, time) to the rows' hit counts and access times: a statement per row
        (a local file: no round trip to save)."""
        stmt = (chunks.update().where(chunks.c.key == bindparam("k"))
                .values(hit_count=chunks.c.hit_count + bindparam("n"),
                        last_access_at=self.greater(chunks.c.last_access_at, bindparam("t"))))
        conn.execute(stmt, [{"k": k, "n": n, "t": t} for k, n, t in touches])

    def claim(self, conn: Connection, ordered: list[bytes], writer: str, expires_at: float, now: float) -> set[bytes]:
        won: set[bytes] = set()
        for batch in batches(ordered):
            stmt = self.insert(chunk_claims).values([{"key": k, "writer": writer, "expires_at": expires_at}
                                                     for k in batch])
            stmt = stmt.on_conflict_do_update(
                index_elements=["key"], set_={"writer": stmt.excluded.writer, "expires_at": stmt.excluded.expires_at},
                where=chunk_claims.c.expires_at < now).returning(chunk_claims.c.key)
            won.update(bytes(k) for k in conn.execute(stmt).scalars())
        # One writer at a time: a key with a row is released in the same transaction.
        stored: set[bytes] = set()
        for batch in batches(list(won)):
            stmt = select(chunks.c.key).where(chunks.c.key.in_(bindparam("keys", expanding=True)))
            stored.update(bytes(k) for k in conn.execute(stmt, {"keys": list(batch)}).scalars())
        if stored:
            release_in(conn, list(stored), writer)
        return won - stored

    def insert_claimed(self, conn: Connection, rows: Sequence[Any], writer: str) -> tuple[set[bytes], int]:
        held: set[bytes] = set()
        for batch in batches([r.key for r in rows]):
            stmt = (chunk_claims.delete()
                    .where(chunk_claims.c.key.in_(bindparam("keys", expanding=True)), chunk_claims.c.writer == writer)
                    .returning(chunk_claims.c.key))
            held.update(bytes(k) for k in conn.execute(stmt, {"keys": list(batch)}).scalars())
        if mine := [r for r in rows if r.key in held]:
            conn.execute(self.insert(chunks).on_conflict_do_nothing(), row_values(mine))
        return held, len(held)

    @contextmanager
    def evictor_lock(self, engine: Engine, write_lock: threading.RLock, timeout_s: float) -> Iterator[None]:
        with write_lock:  # the index's one writer is the tier's one evictor
            yield

    def evictor_lock_stats(self) -> LockStats:
        return LockStats()  # no lock across processes: one writer

    def insert_claimed_within(self, conn: Connection, rows: Sequence[Any], writer: str, room: RoomLimits,
                              timeout_s: float) -> tuple[set[bytes], int]:
        """``insert_claimed``, then the room it left checked in the same transaction; raises
        NoRoomError past a limit (the caller's transaction then rolls back)."""
        held, added = self.insert_claimed(conn, rows, writer)
        if over := over_limits(conn, room, {r.namespace for r in rows}):
            raise NoRoomError(f"the rows would go past the {over}")
        return held, added

    def room_lock_stats(self) -> LockStats:
        return LockStats()

    @staticmethod
    def lost_a_conflict(error: DBAPIError) -> bool:
        """A transaction this database rolled back for another's sake (none on SQLite: one writer)."""
        return False

    def greater(self, a, b):
        return func.max(a, b)  # SQLite's two-argument max

    def checkpoint(self, conn: Connection) -> None:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")

    def lock_migrations(self, conn: Connection) -> None:
        pass  # the file's one writer

    def lock_table(self, conn: Connection, table: str) -> None:
        pass  # the file's one writer

    def drop(self) -> None:
        for f in db_files(self.url):
            f.unlink(missing_ok=True)


# A shared tier's publish statements on PostgreSQL: constant text over arrays (one round trip per
# batch, and nothing for SQLAlchemy to compile per batch size, which cost more than the query).
_PG_CLAIM = ("INSERT INTO chunk_claims AS c (key, writer, expires_at) "
             "SELECT k, %(writer)s, %(expires_at)s FROM unnest(%(keys)b::bytea[]) WITH ORDINALITY AS t(k, i) "
             "WHERE NOT EXISTS (SELECT 1 FROM chunks WHERE chunks.key = t.k) ORDER BY i "
             "ON CONFLICT (key) DO UPDATE SET writer = excluded.writer, expires_at = excluded.expires_at "
             "WHERE c.expires_at < %(now)s RETURNING key")
# The arrays come in key order and the join walks them in it (a nested loop over a few keys), so
# two servers' touches lock their common rows in one order; a deadlock all the same is run again.
_PG_TOUCH = ("UPDATE chunks SET hit_count = chunks.hit_count + t.n, "
             "last_access_at = greatest(chunks.last_access_at, t.at) "
             "FROM unnest(%(keys)b::bytea[], %(hits)s::bigint[], %(times)s::float8[]) AS t(k, n, at) "
             "WHERE chunks.key = t.k")
_ROW_COLUMNS = (("key", "bytea"), ("parent_key", "bytea"), ("namespace", "text"), ("num_tokens", "integer"),
                ("raw_bytes", "bigint"), ("stored_bytes", "bigint"), ("created_at", "float8"),
                ("last_access_at", "float8"), ("hit_count", "bigint"), ("pinned", "boolean"))
_ROW_NAMES = ", ".join(name for name, _ in _ROW_COLUMNS)
# The claims of ``writer`` on the rows' keys are deleted and a row inserted for each claim held;
# answers (key, whether its row went in) for each claim held.
_PG_COMMIT_CLAIMED = (
    "WITH held AS (DELETE FROM chunk_claims WHERE key = ANY(%(key)b) AND writer = %(writer)s RETURNING key), "
    f"added AS (INSERT INTO chunks ({_ROW_NAMES}) "
    f"SELECT * FROM unnest({', '.join(f'%({name})b::{kind}[]' for name, kind in _ROW_COLUMNS)}) AS r({_ROW_NAMES}) "
    "WHERE r.key IN (SELECT key FROM held) ON CONFLICT DO NOTHING RETURNING key) "
    "SELECT held.key, added.key IS NOT NULL FROM held LEFT JOIN added ON added.key = held.key")


# A bounded commit's room lock, and the seconds it waited for it (the database's own clock).
_PG_ROOM_LOCK = (f"SELECT set_config('lock_timeout', %(timeout)s, true), pg_advisory_xact_lock({ROOM_LOCK_KEY}), "
                 "extract(epoch FROM clock_timestamp() - statement_timestamp())::float8")
NO_ROOM_SQLSTATE = "CSNR1"  # raised by a bounded commit's room check (_PG_ROOM_CHECK)
# The room check: constant text (nothing of a request's is ever spliced into it), reading the
# limits from a transaction-local setting that a parameterized statement sets first
# (``_room_setting``): {"capacity": bytes or null, "quotas": {namespace: bytes}}.
_PG_ROOM_SETTING = "SELECT set_config('chunkstore.room', %(room)s, true)"
_PG_ROOM_CHECK = f"""DO $room$
DECLARE
    room jsonb := current_setting('chunkstore.room')::jsonb;
    over text;
BEGIN
    IF room->>'capacity' IS NOT NULL
       AND (SELECT coalesce(sum(stored_bytes), 0) FROM namespace_usage) > (room->>'capacity')::bigint THEN
        RAISE EXCEPTION 'capacity of % bytes', room->>'capacity' USING ERRCODE = '{NO_ROOM_SQLSTATE}';
    END IF;
    SELECT format('namespace quota of %s bytes', q.value) INTO over
      FROM jsonb_each_text(room->'quotas') AS q JOIN namespace_usage AS u ON u.namespace = q.key
     WHERE u.stored_bytes > q.value::bigint LIMIT 1;
    IF over IS NOT NULL THEN
        RAISE EXCEPTION '%', over USING ERRCODE = '{NO_ROOM_SQLSTATE}';
    END IF;
END $room$"""


def _room_setting(room: RoomLimits, namespaces: set[str]) -> str | None:
    """``room``'s limits that apply to rows of ``namespaces``, as the room check reads them (None
    when none does)."""
    quotas = {ns: int(q) for ns, q in room.quotas.items() if ns in namespaces}
    if room.capacity_bytes is None and not quotas:
        return None
    return json.dumps({"capacity": None if room.capacity_bytes is None else int(room.capacity_bytes),
                       "quotas": quotas})


@contextmanager
def _pipeline(pg: Any, errors: type[Exception]) -> Iterator[Any]:
    """``pg.pipeline()``, whose first error (``errors``: the driver's base exception) is raised
    once the pipeline has ended, not while it ends: psycopg logs "error ignored terminating" when
    the end fails (the statements after the error were skipped) with an error on its way out, and
    a full tier's puts that must evict would log it each time."""
    failed = None
    try:
        with pg.pipeline() as pipeline:
            try:
                yield pipeline
            except errors as exc:
                failed = exc
    except errors:  # the end's own failure: the first error says more
        if failed is None:
            raise
    if failed is not None:
        raise failed


PING_IDLE_S = 1.0  # a pooled connection idle this long is checked before it is handed out
_checkout = threading.local()  # .unchecked: this thread's next checkouts skip the idle check


@contextmanager
def unchecked_checkout() -> Iterator[None]:
    """Checkouts in this block (this thread's) skip ``ping_idle_connections``'s check: for a
    read that its caller runs again on a new connection when it meets a dead one."""
    _checkout.unchecked = True
    try:
        yield
    finally:
        _checkout.unchecked = False


def ping_idle_connections(engine: Engine, idle_s: float) -> None:
    """Check a pooled connection with one round trip before ``engine``'s pool hands it out, when
    it sat idle for ``idle_s`` or more: a server that went away and came back (a restart, a
    failover) left it dead, and the pool then opens another. One used within ``idle_s`` goes out
    unchecked: checking every checkout (SQLAlchemy's pre-ping) cost a round trip each, 0.1 ms
    here, 40% of a prefix lookup. A statement that still meets a dead connection fails (the pool
    then renews its connections): a miss or a failed write, never wrong data. Inside
    ``unchecked_checkout`` nothing is checked."""

    @event.listens_for(engine, "checkin")
    def idle_from(dbapi_connection: Any, record: Any) -> None:
        record.info["idle_from"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def check(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        since = record.info.pop("idle_from", None)
        if since is None or time.monotonic() - since < idle_s or getattr(_checkout, "unchecked", False):
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as exc:
            raise DisconnectionError(f"a pooled connection went dead: {exc}") from exc  # the pool opens another


class PostgresDialect:
    """A PostgreSQL database: many writers (servers), a pool that outlives a server restart."""

    name = "postgresql"
    insert = staticmethod(postgresql_insert)
    one_statement = True  # a lone statement runs in autocommit: one round trip, not three
    pool_pre_ping = False  # (``ping_idle_connections`` instead: a round trip only after PING_IDLE_S idle)
    caches_quota = False  # the other servers set quotas too
    serves_many_stores = True  # a database any store can name: it records whose it is (claim_index)

    def __init__(self, url: str) -> None:
        self.url = url
        self.path: Path | None = None
        self.name_shown = display_url(url)
        self.behind_pooler = False  # found by ``configure``: server sessions handed out per transaction
        self._evictor = threading.local()  # .held: this thread holds the evictor lock
        self._evictor_times = LockCounts()  # this process's waits for it and holds of it
        self._room_times = LockCounts()  # the same of the room lock

    def prepare(self, *, read_only: bool, must_exist: bool) -> None:
        pass  # the database is the server's; its tables are checked once connected

    def configure(self, engine: Engine) -> None:
        ping_idle_connections(engine, PING_IDLE_S)
        self.fit_to_pooler(engine)

    def fit_to_pooler(self, engine: Engine) -> None:
        """Before ``engine``'s first use: behind a transaction pooler, no server-side prepares
        (``fit_to_pooler`` below). Raises PoolerModeError behind a pooler in statement mode."""
        self.behind_pooler = fit_to_pooler(engine, self.name_shown)

    def check_tables(self, revision: str | None, *, must_have: bool) -> None:
        if revision is None and must_have:
            raise IndexMissingError(f"the index {self.name_shown} has no chunkstore tables; run `chunkstore rebuild` "
                                    "(payloads exist) or open the store for writing once")

    def present(self, conn: Any, keys: Sequence[bytes]) -> set[bytes]:
        if not keys:
            return set()
        conn.driver_connection.autocommit = True  # one round trip for the whole prefix
        cursor = conn.cursor()
        cursor.execute(LOOKUP_SQL, [list(keys)])
        found = {bytes(row[0]) for row in cursor.fetchall()}
        cursor.close()
        return found

    def after_raw(self, conn: Any, errors: type[Exception]) -> None:
        """Back to transactional, as the pool's other users expect it (a local setting);
        ``errors``: the driver's base exception."""
        try:
            conn.driver_connection.autocommit = False
        except errors:  # mid-answer, or closed:
            conn.invalidate()  # never back into the pool in autocommit

    def keys_condition(self, keys: frozenset[bytes]):
        return chunks.c.key == any_(literal(list(keys), ARRAY(LargeBinary)))  # one array, however many keys

    def children_counts(self, conn: Connection, keys: Sequence[bytes]) -> dict[bytes, int]:
        """One statement over one array: 4,096 keys as bound parameters of an IN list cost more
        to send and plan than the index probes themselves."""
        rows = conn.exec_driver_sql("SELECT parent_key, count(*) FROM chunks WHERE parent_key = ANY(%(keys)s) "
                                    "GROUP BY parent_key", {"keys": list(keys)}).all()
        return {bytes(k): n for k, n in rows}

    def load_query_keys(self, conn: Connection, keys: frozenset[bytes] | None) -> None:
        pass

    def touch(self, conn: Connection, touches: Sequence[tuple[bytes, int, float]]) -> None:
        """One statement over three arrays, however many rows: a statement per row was the most
        frequent one a fleet's requests sent (eight per request at 32 servers)."""
        keys, hits, times = zip(*touches)
        conn.exec_driver_sql(_PG_TOUCH, {"keys": list(keys), "hits": list(hits), "times": list(times)})

    def claim(self, conn: Connection, ordered: list[bytes], writer: str, expires_at: float, now: float) -> set[bytes]:
        return {bytes(k) for k in conn.exec_driver_sql(_PG_CLAIM, {
            "keys": ordered, "writer": writer, "expires_at": expires_at, "now": now}).scalars()}

    def insert_claimed(self, conn: Connection, rows: Sequence[Any], writer: str) -> tuple[set[bytes], int]:
        arrays = {name: [getattr(r, name) for r in rows] for name, _ in _ROW_COLUMNS}
        answer = conn.exec_driver_sql(_PG_COMMIT_CLAIMED, {"writer": writer, **arrays}).all()
        held = {bytes(k) for k, _ in answer}
        return held, sum(1 for _, inserted in answer if inserted)  # (else another writer's row was there)

    @contextmanager
    def evictor_lock(self, engine: Engine, write_lock: threading.RLock, timeout_s: float) -> Iterator[None]:
        """A transaction-scoped advisory lock on a connection of its own for the block, reentrant
        in a thread."""
        if getattr(self._evictor, "held", False):
            yield
            return
        waited_s = acquired_at = None
        try:
            with engine.connect() as conn, conn.begin():
                conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{int(timeout_s * 1000)}ms'")
                began = time.perf_counter()
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({EVICTOR_LOCK_KEY})")
                acquired_at = time.perf_counter()
                waited_s = acquired_at - began
                self._evictor.held = True
                try:
                    yield
                finally:
                    self._evictor.held = False
        finally:  # held until the transaction's end released it
            if acquired_at is not None:
                self._evictor_times.add(waited_s, time.perf_counter() - acquired_at)

    def evictor_lock_stats(self) -> LockStats:
        """This process's waits for the evictor lock and holds of it, since the index opened."""
        return self._evictor_times.stats

    def lock_room(self, conn: Connection, timeout_s: float) -> float:
        """Take the room lock in ``conn``'s transaction, to its end, waiting at most ``timeout_s``
        (then sqlalchemy's OperationalError); returns the seconds waited, as the database measured
        them. (A bounded commit takes it in its pipeline: ``insert_claimed_within``.)"""
        row = conn.exec_driver_sql(_PG_ROOM_LOCK, {"timeout": f"{int(timeout_s * 1000)}ms"}).one()
        return float(row[2])

    def insert_claimed_within(self, conn: Connection, rows: Sequence[Any], writer: str, room: RoomLimits,
                              timeout_s: float) -> tuple[set[bytes], int]:
        """``insert_claimed`` and the room check, committed, as one pipeline: the room lock (within
        a capacity), the insert, the check (raising NO_ROOM_SQLSTATE past a limit) and COMMIT go
        out together, so the fleet's room lock is held for the database's own work on them, not
        across this process's round trips (each of which, on a busy machine, waits for a core).
        Raises NoRoomError (the transaction failed: the caller rolls it back) or the driver's
        error as a DBAPIError."""
        pg = conn.connection.driver_connection
        errors = conn.dialect.loaded_dbapi.Error
        arrays = {name: [getattr(r, name) for r in rows] for name, _ in _ROW_COLUMNS}
        setting = _room_setting(room, {r.namespace for r in rows})
        lock = None
        began = time.perf_counter()
        try:
            with _pipeline(pg, errors) as pipeline:
                if room.capacity_bytes is not None:
                    lock = pg.execute(_PG_ROOM_LOCK, {"timeout": f"{int(timeout_s * 1000)}ms"})
                answer = pg.execute(_PG_COMMIT_CLAIMED, {"writer": writer, **arrays})
                if setting is not None:
                    pg.execute(_PG_ROOM_SETTING, {"room": setting})
                    pg.execute(_PG_ROOM_CHECK)
                pg.execute("COMMIT")  # (the caller's transaction is left with nothing to commit)
                pipeline.sync()
        except errors as exc:
            if getattr(exc, "sqlstate", None) == NO_ROOM_SQLSTATE:
                raise NoRoomError(f"the rows would go past the {exc.diag.message_primary}") from None
            gone = conn.dialect.is_disconnect(exc, pg, None)
            if gone:  # as SQLAlchemy does for its own statements: the pool opens another
                conn.invalidate(exc)
            raise DBAPIError.instance("room commit", None, exc, errors, connection_invalidated=gone) from exc
        finally:
            if lock is not None:
                self._count_room_pass(lock, time.perf_counter() - began, errors)
        found = answer.fetchall()
        return {bytes(k) for k, _ in found}, sum(1 for _, inserted in found if inserted)

    def _count_room_pass(self, lock: Any, elapsed_s: float, errors: type[Exception]) -> None:
        """Count a pipelined pass through the room lock: its wait as the database measured it, its
        hold as the rest of the pipeline's time (none when the lock was never granted); ``errors``:
        the driver's base exception."""
        try:
            row = lock.fetchone()
        except errors:  # the pipeline failed before the lock was granted
            row = None
        if row is not None:
            waited_s = float(row[2])
            self._room_times.add(waited_s, max(elapsed_s - waited_s, 0.0))

    def room_lock_stats(self) -> LockStats:
        """This process's waits for the room lock and holds of it, since the index opened."""
        return self._room_times.stats

    @staticmethod
    def lost_a_conflict(error: DBAPIError) -> bool:
        """A transaction PostgreSQL rolled back for another's sake: chosen as a deadlock's victim
        (40P01), or a serialization failure (40001). Nothing of it was committed: run it again."""
        return getattr(error.orig, "sqlstate", None) in _CONFLICT_SQLSTATES

    def greater(self, a, b):
        return func.greatest(a, b)

    def checkpoint(self, conn: Connection) -> None:
        pass  # the server checkpoints

    def lock_migrations(self, conn: Connection) -> None:
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")  # one server at a time

    def lock_table(self, conn: Connection, table: str) -> None:
        """No other server writes ``table`` until the transaction ends (they wait; readers do not)."""
        conn.exec_driver_sql(f"LOCK TABLE {table} IN EXCLUSIVE MODE")

    def drop(self) -> None:
        """The index's tables (the disk tier's: the management API's own tables, under their own
        version table, stay with their rows); the database stays."""
        from chunkstore.disk.schema import metadata

        engine = create_engine(self.url)
        try:
            self.fit_to_pooler(engine)
            with engine.begin() as conn:
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {migrations.VERSION_TABLE}")
                metadata.drop_all(conn)
                conn.exec_driver_sql("DROP FUNCTION IF EXISTS chunks_usage_insert(), chunks_usage_delete()")
        finally:
            engine.dispose()


IndexDialect = SqliteDialect | PostgresDialect


def dialect_for(url: str) -> IndexDialect:
    """The dialect of an index URL. Raises ValueError as ``index_backend`` and ``sqlite_path``."""
    return SqliteDialect(url) if index_backend(url) == "sqlite" else PostgresDialect(url)


# -- poolers (PgBouncer) -------------------------------------------------------------------------
# psycopg prepares a statement server-side once a connection has run it 5 times (its
# prepare_threshold). Behind a pooler in transaction mode (PgBouncer before 1.21, or without
# max_prepared_statements) each transaction gets whichever server session is free, where that
# statement is not prepared, or another client's "_pg3_0" is: every lookup then fails. On direct
# connections prepares save the server 23 us of CPU per lookup of 32 keys (80 against 103 us: 30%)
# and 0.4 ms per claim and commit of 128 pages (2.8 against 3.3 ms; PostgreSQL 15 on 2 cores, 100k
# rows), so they are turned off only where a pooler is found.
_PROTOCOL_VIOLATION = "08P01"  # what PgBouncer answers a transaction in statement mode
_POOLER_PROBE_ROUNDS = 2  # of (A, A, B, B): 4 statements per connection, under psycopg's threshold


def behind_transaction_pooler(engine: Engine) -> bool:
    """Whether ``engine``'s connections reach PostgreSQL through a pooler that hands out server
    sessions per transaction (PgBouncer's transaction or statement mode). Two of its client
    connections, in autocommit, ask ``pg_backend_pid()`` in turns (A, A, B, B, twice). Directly,
    or behind a pooler in session mode, each client connection is one server session for its life:
    A always answers one pid and B another. Behind a transaction pooler, one that reuses the
    session freed last hands B A's session, and one that reuses the longest idle moves A from one
    session to the next. Changes nothing on the server."""
    with engine.connect() as a, engine.connect() as b:
        pids: dict[int, set[int]] = {0: set(), 1: set()}
        for conn in (a, b):
            conn.execution_options(isolation_level="AUTOCOMMIT")
        for _ in range(_POOLER_PROBE_ROUNDS):
            for which, conn in ((0, a), (0, a), (1, b), (1, b)):
                pids[which].add(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar())
    return len(pids[0]) > 1 or len(pids[1]) > 1 or bool(pids[0] & pids[1])


def fit_to_pooler(engine: Engine, name_shown: str) -> bool:
    """Make ``engine`` (PostgreSQL through psycopg, before its first use) work behind the pooler its
    URL reaches, if any; returns whether there is one. Behind a transaction pooler its connections
    prepare no statement server-side (``prepare_threshold`` None; the pool's connections made so
    far are closed). Raises PoolerModeError behind a pooler that refuses a transaction of two
    statements (PgBouncer's statement mode): the index's writes, its evictor lock and its
    migrations are such transactions."""
    try:
        if not behind_transaction_pooler(engine):
            return False
        event.listen(engine, "connect", _no_server_prepares)
        engine.dispose()  # the probe's connections may prepare; the next ones will not
        with engine.connect() as conn, conn.begin():
            conn.exec_driver_sql("SELECT 1")
            conn.exec_driver_sql("SELECT 1")
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) != _PROTOCOL_VIOLATION:
            raise  # a server that does not answer, a refused login: the caller's to report
        raise PoolerModeError(
            f"the index {name_shown} is reached through a connection pooler that refused a transaction "
            f"({str(exc.orig).strip()}): chunkstore needs PgBouncer's pool_mode = transaction (or session), "
            "not statement") from None
    log.info("index %s: reached through a transaction pooler; statements are not prepared server-side", name_shown)
    return True


def _no_server_prepares(dbapi_conn, _record) -> None:
    dbapi_conn.prepare_threshold = None  # psycopg's: never prepare a statement server-side


def _on_connect(dbapi_conn, _record) -> None:
    # pysqlite's own transaction handling runs DDL outside transactions, so a crash in the first
    # migration would leave half a schema; let SQLAlchemy's begin event issue BEGIN instead.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


def _on_begin(conn: Connection) -> None:
    conn.exec_driver_sql("BEGIN")
