"""The chunk index on PostgreSQL (a real server the suite starts, tests/conftest.py): the store's
contract tests that take the ``store`` fixture run again here with their index in a fresh
PostgreSQL database, then what only a database server has: the migrations match the schema
modules there, sizes past 32 bits, a database claimed by one store, a rebuild from the chunk
files, a read-only view beside the writer."""

from __future__ import annotations

import hashlib
import inspect
import logging

import pytest
import torch
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from chunkstore.api.history_schema import metadata as api_metadata
from sqlalchemy import create_engine
from sqlalchemy.exc import DBAPIError

from chunkstore import ChunkStore, ModelMismatchError, chain_pages
from chunkstore.disk import migrations
from chunkstore.disk.index import ChunkIndex, ChunkRow, IndexMissingError, NoRoomError, RoomLimits, sqlite_url
from chunkstore.disk.maintenance import rebuild
from chunkstore.disk.schema import KEY_HASH_INDEX
from chunkstore.disk.schema import metadata as disk_metadata
from tests import test_store, test_store_delete
from tests.helpers import kv_pages

# The contract tests of the store fixture, collected here again (they then run on the fixture
# below); not those that open the folder a second time, which would find its SQLite index.
for _module in (test_store, test_store_delete):
    for _name, _test in inspect.getmembers(_module, inspect.isfunction):
        if (_name.startswith("test_") and "store" in inspect.signature(_test).parameters
                and "ChunkStore(" not in inspect.getsource(_test)):
            globals()[_name] = _test

# compare_metadata leaves out alembic's own version table only: the API keeps its revision apart.
NOT_THE_API_VERSION = {"include_object": lambda obj, name, kind, reflected, other: name != "api_alembic_version"}


@pytest.fixture
def store(tmp_path, identity, postgres_url):
    s = ChunkStore(tmp_path / "store", identity, index_url=postgres_url)
    yield s
    s.close()


def test_migrations_match_the_schema_modules_on_postgresql(postgres_url):
    from chunkstore.api.history_db import HistoryDatabase

    ChunkIndex(postgres_url).close()
    db = HistoryDatabase(postgres_url)  # the management API's own migrations, beside the disk tier's
    db.migrate()
    db.close()
    engine = create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts=NOT_THE_API_VERSION), [disk_metadata, api_metadata])
            assert migrations.current_revision(conn) == migrations.head_revision()
    finally:
        engine.dispose()
    assert diff == [], diff


def test_a_prefix_lookup_reads_the_key_hash_index(postgres_url):
    """A lookup of a chain's keys reads one bucket page of the hash index a key (alembic 0010),
    not a B-tree descent that deepens with the rows."""
    index = ChunkIndex(postgres_url)
    try:
        rows = [ChunkRow(hashlib.sha256(i.to_bytes(4, "little")).digest(), b"\0" * 32, "ns", 16, 100, 60, 1.0, 1.0)
                for i in range(50_000)]
        index.insert(rows)
        chain = [r.key for r in rows[:20]]
        engine = create_engine(postgres_url)
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("ANALYZE chunks")
                method = conn.exec_driver_sql("SELECT am.amname FROM pg_class c JOIN pg_am am ON am.oid = c.relam "
                                              "WHERE c.relname = %(name)s", {"name": KEY_HASH_INDEX}).scalar()
                plan = "\n".join(conn.exec_driver_sql("EXPLAIN SELECT key FROM chunks WHERE key = ANY(%(keys)s)",
                                                       {"keys": chain}).scalars())
        finally:
            engine.dispose()
        assert method == "hash"
        assert KEY_HASH_INDEX in plan, plan
        assert index.present(chain + [b"\1" * 32]) == set(chain)
    finally:
        index.close()


def test_sizes_and_counters_past_32_bits(postgres_url):
    index = ChunkIndex(postgres_url)
    try:
        big = 5 * 2**30  # 5 GiB: past PostgreSQL's 32-bit INTEGER
        index.set_quota("ns", big)
        index.insert([ChunkRow(bytes([i]) * 32, b"\0" * 32, "ns", 4, big, big, 1.0, 1.0) for i in range(3)])
        index.count_event("ns", "hits", big)
        index.flush()
        assert index.quota("ns") == big
        assert index.stored_bytes("ns") == 3 * big
        assert index.counter_values()[("ns", "hits")] == big
    finally:
        index.close()


def test_a_database_is_claimed_by_one_store(tmp_path, identity, postgres_url, chain):
    with ChunkStore(tmp_path / "a", identity, index_url=postgres_url) as store:
        store.put(*chain)
    with pytest.raises(ModelMismatchError, match="belongs to another store"):
        ChunkStore(tmp_path / "b", identity, index_url=postgres_url)  # its rows name a's files
    with ChunkStore(tmp_path / "a", identity, index_url=postgres_url) as store:  # a's own: fine
        assert store.num_chunks() == len(chain[0])


def test_a_read_only_view_beside_the_writer_and_after_it(tmp_path, identity, postgres_url, chain):
    pages, kv = chain
    with ChunkStore(tmp_path / "s", identity, index_url=postgres_url) as writer:
        writer.put(pages[:4], kv[:4])
        with ChunkStore(tmp_path / "s", identity, index_url=postgres_url, read_only=True) as reader:
            assert reader.longest_prefix([p.key for p in pages]) == 4
            writer.put(pages[4:], kv[4:])
            assert reader.longest_prefix([p.key for p in pages]) == len(pages)  # sees new rows at once
    with ChunkStore(tmp_path / "s", identity, index_url=postgres_url, read_only=True) as reader:
        out = [torch.empty_like(t) for t in kv]
        assert all(reader.get_into(pages, out)) and all(torch.equal(a, b) for a, b in zip(out, kv))


def test_an_empty_database_is_no_index_for_a_reader(tmp_path, identity, postgres_url):
    with pytest.raises(IndexMissingError, match="no chunkstore tables"):
        ChunkIndex(postgres_url, read_only=True)


def test_rebuild_re_indexes_the_chunk_files(tmp_path, identity, postgres_url):
    pages = chain_pages(identity, list(range(identity.page_size * 6)))
    kv = kv_pages(identity, len(pages))
    with ChunkStore(tmp_path / "s", identity, index_url=postgres_url) as store:
        store.put(pages, kv)
    with ChunkStore(tmp_path / "s", identity, index_url=postgres_url, reset_index=True) as store:
        assert store.num_chunks() == 0  # the tables were dropped and made again; the files stay
        rebuild(store)
        assert store.longest_prefix([p.key for p in pages]) == len(pages)
        out = [torch.empty_like(t) for t in kv]
        assert all(store.get_into(pages, out)) and all(torch.equal(a, b) for a, b in zip(out, kv))


def test_one_statement_lookups_leave_the_pool_transactional(postgres_url):
    """Lookups, claims and row commits run their one statement in autocommit (a round trip, not
    three); the connections they used go back to the pool as they came, so a transaction on any
    of them still commits or rolls back as a whole."""
    index = ChunkIndex(postgres_url)
    try:
        keys = [bytes([i]) * 32 for i in range(4)]
        for _ in range(20):
            index.present(keys)
            index.quota("ns")
        assert index.claim(keys, "w", 60.0) == set(keys)
        rows = [ChunkRow(k, b"\0" * 32, "ns", 4, 10, 10, 1.0, 1.0) for k in keys]
        assert index.insert_claimed(rows, "w") == set(keys)
        assert index.present(keys) == set(keys)
        pooled = [index.engine.connect() for _ in range(16)]  # every connection the pool may hold
        try:
            assert not any(c.connection.driver_connection.autocommit for c in pooled)
            with pooled[0].begin() as tx:
                pooled[0].exec_driver_sql("DELETE FROM chunks")
                tx.rollback()
        finally:
            for c in pooled:
                c.close()
        assert index.present(keys) == set(keys)
    finally:
        index.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_bounded_commit_checks_its_room_on_either_database(backend, tmp_path, request):
    """The same row commit within limits on SQLite (the insert, then the check, in one
    transaction) as on PostgreSQL (one pipeline): past a limit nothing goes in. A namespace is
    any text (quotes, dollar quotes, SQL): it never becomes part of a statement."""
    url = sqlite_url(tmp_path) if backend == "sqlite" else request.getfixturevalue("postgres_url")
    index = ChunkIndex(url)
    ns = "t$room$'; DROP TABLE chunks; --"
    try:
        keys = [bytes([i]) * 32 for i in range(3)]
        assert index.claim(keys, "w", 60.0) == set(keys)
        rows = [ChunkRow(k, b"\0" * 32, ns, 4, 10, 100, 1.0, 1.0) for k in keys]
        for room in (RoomLimits(capacity_bytes=299), RoomLimits(quotas={ns: 299})):
            with pytest.raises(NoRoomError):
                index.insert_claimed(rows, "w", room)
            assert index.present(keys) == set() and index.stored_bytes() == 0 and index.claimed(keys) == set(keys)
        assert index.insert_claimed(rows, "w", RoomLimits(capacity_bytes=300, quotas={ns: 300})) == set(keys)
        assert index.stored_bytes(ns) == 300 and index.present(keys) == set(keys)
    finally:
        index.close()


def test_a_bounded_commit_past_its_room_or_its_lock_timeout_commits_nothing(postgres_url, caplog):
    """A bounded row commit (one pipeline: the room lock, the insert, the room check, COMMIT)
    that finds no room raises NoRoomError and one whose lock wait times out raises a DBAPIError
    with the database's code: in both, no row went in and the writer's claims are kept (the put
    evicts and commits again, or fails its pages); the connection goes back to the pool usable,
    and a commit within the room then goes in, counted as a pass through the room lock. None of
    it logs a warning: a full tier finds no room on every put that must evict, and the driver's
    "error ignored terminating" line for the pipeline's skipped COMMIT would say so each time."""
    caplog.set_level(logging.WARNING, logger="psycopg")
    index, other = ChunkIndex(postgres_url), ChunkIndex(postgres_url)
    try:
        keys = [bytes([i]) * 32 for i in range(4)]
        assert index.claim(keys, "w", 60.0) == set(keys)
        rows = [ChunkRow(k, b"\0" * 32, "ns", 4, 10, 100, 1.0, 1.0) for k in keys]
        with pytest.raises(NoRoomError, match="capacity of 399 bytes"):
            index.insert_claimed(rows, "w", RoomLimits(capacity_bytes=399))
        with pytest.raises(NoRoomError, match="namespace quota of 300 bytes"):
            index.insert_claimed(rows, "w", RoomLimits(quotas={"ns": 300, "other": 1}))
        assert index.present(keys) == set() and index.stored_bytes() == 0
        with other.engine.begin() as held:
            other.dialect.lock_room(held, 30.0)  # another server's bounded commit, in progress
            with pytest.raises(DBAPIError) as lock_wait, index.engine.begin() as conn:
                index.dialect.insert_claimed_within(conn, rows, "w", RoomLimits(capacity_bytes=400), 0.2)
        assert lock_wait.value.orig.sqlstate == "55P03"  # lock_not_available
        assert index.present(keys) == set() and index.claimed(keys) == set(keys)
        with pytest.raises(DBAPIError) as dropped, index.engine.begin() as conn:
            backend = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            with other.engine.begin() as killer:  # the database restarted under this connection
                killer.exec_driver_sql("SELECT pg_terminate_backend(%(pid)s)", {"pid": backend})
            index.dialect.insert_claimed_within(conn, rows, "w", RoomLimits(capacity_bytes=400), 30.0)
        assert dropped.value.connection_invalidated  # not handed out again
        assert index.present(keys) == set() and index.claimed(keys) == set(keys)
        before = index.room_lock_stats()
        assert index.insert_claimed(rows, "w", RoomLimits(capacity_bytes=400, quotas={"ns": 400})) == set(keys)
        assert index.stored_bytes() == 400 and index.claimed(keys) == set()
        after = index.room_lock_stats()
        assert after.acquired == before.acquired + 1 and after.held_s > before.held_s
        assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []
    finally:
        index.close()
        other.close()


def test_buffered_hits_are_written_in_one_statement_over_arrays(postgres_url):
    """A request's hits are one UPDATE whatever their number (a statement per row was the most
    frequent one a fleet sent): each row's count grows by its hits and its access time moves
    forward only, and a key whose row is gone changes nothing."""
    from sqlalchemy import event

    keys = [bytes([i]) * 32 for i in range(1, 41)]
    index = ChunkIndex(postgres_url)
    sent: list[tuple[str, bool]] = []
    try:
        index.insert([ChunkRow(k, b"\0" * 32, "ns", 4, 10, 10, 1.0, 100.0) for k in keys])
        event.listen(index.engine, "before_cursor_execute",
                     lambda conn, cursor, statement, params, context, many: sent.append((statement, many)))
        index.touch(keys, now=50.0)  # earlier than the rows' access time: only the counts move
        index.touch(keys[:10], now=200.0)
        index.touch([bytes([99]) * 32], now=300.0)  # no such row
        index.flush()
        updates = [(stmt, many) for stmt, many in sent if stmt.lstrip().upper().startswith("UPDATE CHUNKS")]
        assert len(updates) == 1 and not updates[0][1]
        rows = index.rows(keys)
        assert [rows[k].hit_count for k in keys] == [2] * 10 + [1] * 30
        assert [rows[k].last_access_at for k in keys] == [200.0] * 10 + [100.0] * 30
    finally:
        index.close()


def test_a_write_chosen_as_a_deadlocks_victim_runs_again(postgres_url):
    """Two servers' transactions that lock the same rows in opposite orders deadlock, and
    PostgreSQL rolls one back. Here the index is that one: its delete first writes a buffered
    hit on row y (locking it), then waits for row x, which another server's transaction holds
    while it waits for y. The index's delete runs again once the other commits, and deletes x."""
    import threading
    import time

    x, y = bytes([1]) * 32, bytes([2]) * 32
    index = ChunkIndex(postgres_url)
    other = create_engine(postgres_url)
    errors: list[BaseException] = []
    try:
        index.insert([ChunkRow(k, b"\0" * 32, "ns", 4, 10, 10, 1.0, 1.0) for k in (x, y)])
        # The watcher in autocommit: within one transaction pg_stat_activity keeps its first snapshot.
        with other.connect() as holder, other.connect().execution_options(isolation_level="AUTOCOMMIT") as watcher:
            holder.exec_driver_sql("BEGIN")
            holder.exec_driver_sql("SELECT key FROM chunks WHERE key = %(k)s FOR UPDATE", {"k": x})

            def the_other_server() -> None:
                try:
                    deadline = time.monotonic() + 30
                    waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    while not watcher.exec_driver_sql(waiting).scalar():  # the index waits for x
                        assert time.monotonic() < deadline, "the index's delete never waited for the row"
                        time.sleep(0.02)
                    holder.exec_driver_sql("UPDATE chunks SET hit_count = hit_count + 1 WHERE key = %(k)s", {"k": y})
                    holder.exec_driver_sql("COMMIT")
                except BaseException as e:  # the test's thread reports it below
                    errors.append(e)
                    holder.exec_driver_sql("ROLLBACK")  # the index's delete goes on, and the test fails

            thread = threading.Thread(target=the_other_server)
            thread.start()
            index.touch([y])  # written first by the next write transaction
            deleted = index.delete([x])
            thread.join(60)
        assert errors == []
        assert deleted == 1
        assert index.conflicts_retried == 1
        assert index.present([x, y]) == {y}
    finally:
        other.dispose()
        index.close()
