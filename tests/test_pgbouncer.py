"""The chunk index behind PgBouncer (Debian's, in front of the suite's PostgreSQL server,
chunkstore.testing.pgbouncer). In transaction pooling mode the index finds the pooler when it
opens and prepares nothing server-side (psycopg prepares a statement after 5 runs, which breaks
there); directly and behind session pooling it keeps psycopg's prepares; statement pooling, which
allows no transaction, is refused with the mode to use, by the index and by `chunkstore serve`.
The transaction-scoped locks (the evictor's, with its lock_timeout, and the migrations') hold
through the pooler. The store's and the shared tier's contract tests run through it too
(tests/test_pgbouncer_store.py, tests/test_pgbouncer_shared.py)."""

from __future__ import annotations

import argparse
import threading

import psycopg
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from chunkstore.disk import eviction, migrations
from chunkstore.disk.eviction import EvictionSelection, ScanSizes
from chunkstore.disk.index import ChunkIndex, ChunkRow
from chunkstore.disk.index_dialect import PoolerModeError
from chunkstore.testing.pgbouncer import PgBouncer, PoolMode


def _rows(keys: list[bytes]) -> list[ChunkRow]:
    return [ChunkRow(k, b"\0" * 32, "ns", 4, 10, 10, 1.0, 1.0) for k in keys]


def _prepare_thresholds(index: ChunkIndex) -> set[int | None]:
    """psycopg's prepare_threshold of every connection the index's pool may hold."""
    pooled = [index.engine.connect() for _ in range(16)]
    try:
        return {c.connection.driver_connection.prepare_threshold for c in pooled}
    finally:
        for c in pooled:
            c.close()


def test_the_helper_listens_on_loopback_in_its_mode_and_stops_by_its_pid(postgres_server):
    bouncer = PgBouncer(postgres_server, pool_mode="session")
    with bouncer:
        config = {row["key"]: row["value"] for row in bouncer.show("CONFIG")}
        assert (config["listen_addr"], config["pool_mode"], config["unix_socket_dir"]) == ("127.0.0.1", "session", "")
        folder, pid = bouncer.folder, bouncer.pid
        assert folder.is_dir() and bouncer.is_running
    assert not bouncer.is_running and bouncer.pid is None and not folder.exists()
    with pytest.raises(ValueError, match="SHOW"):
        bouncer.show("PAUSE; SHOW")
    with pytest.raises(ValueError, match="valid values"):
        PgBouncer(postgres_server, pool_mode="per-query")
    assert pid > 0


def test_psycopgs_own_prepares_break_behind_transaction_pooling(pgbouncer, postgres_url):
    """Why the index turns them off there: two client connections each running one query past
    psycopg's threshold meet each other's "_pg3_0" on the server sessions they share."""
    if pgbouncer.version >= (1, 21):
        pytest.skip(f"PgBouncer {pgbouncer.version} can track prepared statements (max_prepared_statements)")
    name = make_url(postgres_url).database
    connect = dict(host="127.0.0.1", port=pgbouncer.port, user=pgbouncer.user, dbname=name, autocommit=True)
    with psycopg.connect(**connect) as a, psycopg.connect(**connect) as b:
        with pytest.raises(psycopg.Error, match="prepared statement"):
            for i in range(12):
                for conn in (a, b):
                    conn.execute("SELECT %s::int + 1", [i]).fetchone()


def test_behind_transaction_pooling_the_index_prepares_nothing_and_works(pgbouncer, pgbouncer_url, postgres_url):
    index = ChunkIndex(pgbouncer_url)
    try:
        assert index.dialect.behind_pooler
        keys = [bytes([i]) * 32 for i in range(64)]
        for i in range(0, 64, 4):  # each statement well past psycopg's threshold of 5
            for _ in range(4):
                assert index.present(keys[:i]) == set(keys[:i])
                index.quota("ns")
            assert index.claim(keys[i:i + 4], "w", 60.0) == set(keys[i:i + 4])
            assert index.insert_claimed(_rows(keys[i:i + 4]), "w") == set(keys[i:i + 4])
            assert set(index.rows(keys[:i + 4])) == set(keys[:i + 4])
            index.touch(keys[i:i + 4])
            index.flush()
        assert index.count() == 64
        for _ in range(6):  # the planner's reads, each past the threshold, its counts on two connections at once
            plan = eviction.plan(index, EvictionSelection(), generation=0, scan=ScanSizes(2, 4, 0, 2))
            assert sorted(plan.keys) == sorted(keys[1:])  # (keys[0] is every row's parent, its own too)
        assert _prepare_thresholds(index) == {None}
    finally:
        index.close()
    database = make_url(postgres_url).database
    assert any(row["database"] == database and row["total_xact_count"] > 0 for row in pgbouncer.show("STATS"))
    direct = ChunkIndex(postgres_url)  # the same database without the pooler keeps psycopg's prepares
    try:
        assert not direct.dialect.behind_pooler and _prepare_thresholds(direct) == {5}
    finally:
        direct.close()


def test_behind_session_pooling_the_index_keeps_its_prepares(postgres_server, postgres_url):
    with PgBouncer(postgres_server, pool_mode=PoolMode.SESSION) as bouncer:
        index = ChunkIndex(bouncer.through(postgres_url))
        try:
            assert not index.dialect.behind_pooler
            keys = [bytes([i]) * 32 for i in range(4)]
            for _ in range(20):
                assert index.present(keys) == set()
        finally:
            index.close()


def test_statement_pooling_is_refused_with_the_mode_to_use(postgres_server, postgres_url, tmp_path, capsys):
    from chunkstore.serve import add_arguments, run

    with PgBouncer(postgres_server, pool_mode=PoolMode.STATEMENT) as bouncer:
        url = bouncer.through(postgres_url)
        with pytest.raises(PoolerModeError, match="pool_mode = transaction"):
            ChunkIndex(url)
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(["--preset", "tiny", "--disk-path", str(tmp_path / "d"), "--index-url", url])
        assert run(args) == 2
    err = capsys.readouterr().err
    assert "cannot open the cache" in err and "statement pooling mode" in err and "pool_mode = transaction" in err


def test_the_evictor_lock_waits_and_times_out_through_the_pooler(pgbouncer_url):
    """The lock is transaction-scoped (pg_advisory_xact_lock) with a SET LOCAL lock_timeout: both
    live in the one transaction that holds a server session for the block."""
    a, b = ChunkIndex(pgbouncer_url), ChunkIndex(pgbouncer_url)
    try:
        with a.evictor_lock():
            with a.evictor_lock():  # reentrant in a thread
                pass
            with pytest.raises(OperationalError, match="lock timeout"):
                with b.evictor_lock(timeout_s=0.2):
                    pass
        with b.evictor_lock(timeout_s=5.0):  # released with a's transaction
            pass
    finally:
        a.close()
        b.close()


def test_servers_opening_a_fresh_database_at_once_migrate_it_once(pgbouncer_url):
    opened: list[ChunkIndex] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            opened.append(ChunkIndex(pgbouncer_url))
        except BaseException as e:  # the test's thread reports it below
            errors.append(e)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert errors == [] and len(opened) == 4
        with opened[0].engine.connect() as conn:
            assert migrations.current_revision(conn) == migrations.head_revision()
    finally:
        for index in opened:
            index.close()


def test_stats_histories_on_one_database_work_through_the_pooler(pgbouncer_url, tmp_path):
    """The management API's own connections (its stats history) prepare nothing either: two
    processes' histories of one store (a server's API and the CLI, say), each statement well past
    psycopg's threshold, meet on the pooler's server sessions."""
    from chunkstore.api.history import COLUMNS, HistoryTable
    from chunkstore.api.history_db import HistoryDatabase
    from chunkstore.disk.store import ChunkStore
    from tests.helpers import TINY

    with ChunkStore(tmp_path / "store", TINY, index_url=pgbouncer_url) as store:
        tables = [HistoryTable(1000), HistoryTable(1000)]
        try:
            written = 0
            for _ in range(12):
                for table in tables:
                    batch = [{**dict.fromkeys(COLUMNS), "sampled_at": float(written + j), "uptime_s": 1.0}
                             for j in range(8)]  # a rebuild's carry-over: many rows in one statement
                    table.append(store, batch)
                    written += len(batch)
                    assert [r["sampled_at"] for r in table.read(store)] == [float(t) for t in range(written)]
        finally:
            for table in tables:
                table.close()
    db = HistoryDatabase(pgbouncer_url)  # what makes it so, whatever SQLAlchemy's pool does
    try:
        with db.engine.connect() as conn:
            assert conn.connection.driver_connection.prepare_threshold is None
    finally:
        db.close()
