"""The disk tier's alembic migrations describe the database of chunkstore/disk/schema.py, and the
management API's own migrations (chunkstore/api/migrations, their own version table) add its table
as chunkstore/api/history_schema.py describes it, adopting one an older index made; the disk tier
makes none of the API's tables, and the usage triggers keep per-namespace totals equal to the rows."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from chunkstore.api.history_schema import metadata as api_metadata
from sqlalchemy import create_engine, func, inspect, text

from chunkstore.api.history_db import HEAD_REVISION, SCRIPTS, HistoryDatabase
from chunkstore.api.history_schema import API_VERSION_TABLE
from chunkstore.disk import migrations
from chunkstore.disk.index import ChunkIndex, ChunkRow, sqlite_url
from chunkstore.disk.schema import POSTGRESQL_ONLY_INDEXES
from chunkstore.disk.schema import metadata as disk_metadata

# compare_metadata on SQLite leaves out the indexes only PostgreSQL has, and in the second check
# alembic's own version table too (the API keeps its revision apart).
ON_SQLITE = {"include_object": lambda obj, name, kind, reflected, other: name not in POSTGRESQL_ONLY_INDEXES}
ON_SQLITE_NOT_THE_API_VERSION = {"include_object": lambda obj, name, kind, reflected, other:
                                 name != "api_alembic_version" and name not in POSTGRESQL_ONLY_INDEXES}


def test_migrations_match_the_schema_module(tmp_path):
    ChunkIndex(sqlite_url(tmp_path)).close()
    url = f"sqlite:///{tmp_path / 'index.db'}"
    engine = create_engine(url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts=ON_SQLITE), disk_metadata)
        assert migrations.current_revision(conn) == migrations.head_revision()
        assert "stats_history" not in inspect(conn).get_table_names()  # the disk tier makes none of the API's
    db = HistoryDatabase(url)
    db.migrate()  # the API's own, beside them
    db.close()
    with engine.connect() as conn:
        both = compare_metadata(MigrationContext.configure(conn, opts=ON_SQLITE_NOT_THE_API_VERSION),
                                [disk_metadata, api_metadata])
        assert conn.execute(text(f"SELECT version_num FROM {API_VERSION_TABLE}")).scalar() == HEAD_REVISION
        assert migrations.current_revision(conn) == migrations.head_revision()
    engine.dispose()
    assert diff == [] and both == [], (diff, both)


def test_the_apis_head_revision_is_alembics():
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPTS))
    assert ScriptDirectory.from_config(cfg).get_current_head() == HEAD_REVISION


def test_the_disk_schema_holds_only_the_disk_tiers_tables():
    assert set(disk_metadata.tables) == {"store_meta", "chunks", "namespace_usage", "namespace_quotas", "counters",
                                         "chunk_claims", "server_counters", "seal_keys"}
    assert set(api_metadata.tables) == {"stats_history"}


def test_upgrade_is_idempotent_and_reports_revisions(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'index.db'}")
    with engine.begin() as conn:
        before, head = migrations.upgrade(conn)
        assert before is None and head == migrations.head_revision()
        assert migrations.upgrade(conn) == (head, head)
        tables = {r[0] for r in conn.execute(text("SELECT name FROM sqlite_master WHERE type='table'"))}
    engine.dispose()
    assert {"chunks", "namespace_usage", "namespace_quotas", "counters", "store_meta"} <= tables


def test_an_index_a_newer_release_migrated_is_refused_by_name(tmp_path, capsys):
    """An older server restarted after a newer one upgraded the shared index: a clear error naming
    both revisions (not alembic's traceback, nor "run db upgrade"), and the index left as it is."""
    from chunkstore import ChunkStore
    from chunkstore.cli import main
    from tests.helpers import TINY

    root = tmp_path / "store"
    ChunkStore(root, TINY).close()
    engine = create_engine(f"sqlite:///{root / 'index.db'}")
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {migrations.VERSION_TABLE} SET version_num = '9001'"))
    for read_only in (False, True):
        with pytest.raises(migrations.SchemaTooNewError, match=f"revision 9001.*newest is {migrations.head_revision()}"):
            ChunkIndex(sqlite_url(root), read_only=read_only)
    for argv in (["stats"], ["db", "upgrade"]):
        assert main([*argv, "--disk-path", str(root)]) == 2
        assert "revision 9001" in capsys.readouterr().err
    with engine.connect() as conn:
        assert migrations.current_revision(conn) == "9001"
    engine.dispose()


def _usage_rows(start: int, count: int) -> list[ChunkRow]:
    return [ChunkRow(bytes([i]) * 32, b"\0" * 32, "ns" if i % 2 else "other", 4, 100, 60 + i, 1.0, 1.0)
            for i in range(start, start + count)]


def _assert_usage_is_the_rows(index: ChunkIndex, kept: list[ChunkRow]) -> None:
    usage = {u.namespace: u for u in index.usage()}
    for ns in ("ns", "other"):
        mine = [r for r in kept if r.namespace == ns]
        assert (usage[ns].num_chunks, usage[ns].raw_bytes, usage[ns].stored_bytes) == (
            len(mine), sum(r.raw_bytes for r in mine), sum(r.stored_bytes for r in mine))


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_usage_triggers_follow_inserts_and_deletes(tmp_path, request, dialect):
    """SQLite's row triggers and PostgreSQL's statement triggers (0008) keep the same totals, over
    batches that span namespaces."""
    url = sqlite_url(tmp_path) if dialect == "sqlite" else request.getfixturevalue("postgres_url")
    index = ChunkIndex(url)
    rows = _usage_rows(0, 10)
    assert index.insert(rows) == 10
    assert index.insert(rows[:3]) == 0  # duplicates are ignored, totals unchanged
    index.delete([rows[1].key, rows[2].key])
    _assert_usage_is_the_rows(index, [r for r in rows if r not in (rows[1], rows[2])])
    index.close()


def test_migration_0008_keeps_the_usage_totals_across_its_upgrade_and_downgrade(postgres_url):
    """Rows counted by 0001's row triggers, then by 0008's statement triggers, then by the row
    triggers again after a downgrade: the totals stay the rows' sums throughout."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations.script_location()))
    engine = create_engine(postgres_url)
    rows = _usage_rows(0, 30)
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0007")
        index = ChunkIndex(postgres_url)  # upgrades to the head: 0008
        assert index.insert(rows[:10]) == 10
        index.close()
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0007")
            assert migrations.current_revision(conn) == "0007"
        with engine.begin() as conn:  # rows written under the row triggers
            conn.execute(text("INSERT INTO chunks (key, parent_key, namespace, num_tokens, raw_bytes, stored_bytes, "
                              "created_at, last_access_at) VALUES (:key, :parent, :ns, 4, 100, :stored, 1, 1)"),
                         [{"key": r.key, "parent": r.parent_key, "ns": r.namespace, "stored": r.stored_bytes}
                          for r in rows[10:20]])
            conn.execute(text("DELETE FROM chunks WHERE key = :key"), {"key": rows[0].key})
        index = ChunkIndex(postgres_url)  # back to 0008
        assert index.insert(rows[20:]) == 10
        index.delete([rows[5].key, rows[15].key, rows[25].key])
        _assert_usage_is_the_rows(index, [r for i, r in enumerate(rows) if i not in (0, 5, 15, 25)])
        index.close()
    finally:
        engine.dispose()


def test_server_counters_add_up_per_server_and_old_rows_are_pruned(tmp_path):
    from sqlalchemy import insert

    from chunkstore.disk.index import SERVER_PRUNE_S
    from chunkstore.disk.schema import server_counters

    url = sqlite_url(tmp_path)
    a, b = ChunkIndex(url, server_name="a"), ChunkIndex(url, server_name="b")
    with a.engine.begin() as conn:  # a server last seen over a week ago
        old = 1000.0
        conn.execute(insert(server_counters).values(server="old", hits=1, misses=0, published=0, dedup_hits=0,
                                                    write_errors=0, first_seen_at=old, last_seen_at=old))
    rows = [ChunkRow(bytes([i]) * 32, b"\0" * 32, "ns", 4, 100, 60, 1.0, 1.0) for i in range(3)]
    assert a.insert(rows) == 3 and a.insert(rows) == 0  # published: the rows new to the index
    a.count_event("ns", "hits", 2)
    a.count_event("other", "misses")
    a.count_event("ns", "evictions")  # a namespace's counter only
    b.count_event("ns", "dedup_hits", 4)
    mine = {c.server: c for c in a.server_counts()}["a"]  # not written yet: this process's own
    assert (mine.hits, mine.misses, mine.published) == (2, 1, 3)
    a.flush()  # the first flush also prunes rows not seen for SERVER_PRUNE_S
    b.flush()
    a.close()
    b.close()
    again = ChunkIndex(url, server_name="c")
    counts = {c.server: c for c in again.server_counts()}
    again.close()
    assert set(counts) == {"a", "b", "c"} and counts["c"].first_seen_at is None
    assert (counts["a"].hits, counts["a"].misses, counts["a"].published, counts["a"].dedup_hits) == (2, 1, 3, 0)
    assert (counts["b"].hits, counts["b"].dedup_hits) == (0, 4)
    assert counts["a"].first_seen_at <= counts["a"].last_seen_at and 1000.0 + SERVER_PRUNE_S < counts["a"].last_seen_at


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_the_api_adopts_a_stats_history_the_disk_tiers_old_revisions_made(tmp_path, request, dialect):
    """An index whose stats history the disk tier made (revisions 0002 and 0003, before they were
    emptied: 32-bit integers on PostgreSQL, no server key) keeps its rows: the API's migration
    adds the key ('' for the rows before), its index, and on PostgreSQL widens the integers."""
    from sqlalchemy import insert, select

    from chunkstore.api.history_schema import STATS_HISTORY_FIGURES, stats_history  # 0002 made these figures

    url = f"sqlite:///{tmp_path / 'index.db'}" if dialect == "sqlite" else request.getfixturevalue("postgres_url")
    ChunkIndex(url).close()
    engine = create_engine(url)
    try:
        with engine.begin() as conn:  # the table as 0002 and 0003 made it, with a sample
            figures = ", ".join(f"{name} INTEGER" for name in STATS_HISTORY_FIGURES)
            id_column = "id INTEGER NOT NULL PRIMARY KEY" if dialect == "sqlite" else "id SERIAL PRIMARY KEY"
            conn.execute(text(f"CREATE TABLE stats_history ({id_column}, sampled_at FLOAT NOT NULL, "
                              f"uptime_s FLOAT NOT NULL, {figures}, requests_total INTEGER, "
                              f"completion_tokens_total INTEGER, ttft_sum_s FLOAT, ttft_count INTEGER)"))
            conn.execute(text("CREATE INDEX ix_stats_history_sampled_at ON stats_history (sampled_at)"))
            conn.execute(text("INSERT INTO stats_history (sampled_at, uptime_s, lookups) VALUES (1.0, 2.0, 7)"))
        db = HistoryDatabase(url)
        db.migrate()
        db.close()
        with engine.begin() as conn:
            assert conn.execute(select(stats_history.c.server, stats_history.c.lookups)).all() == [("", 7)]
            indexes = {i["name"]: i["column_names"] for i in inspect(conn).get_indexes("stats_history")}
            assert indexes["ix_stats_history_server_id"] == ["server", "id"]
            assert compare_metadata(MigrationContext.configure(conn, opts=ON_SQLITE_NOT_THE_API_VERSION),
                                    [disk_metadata, api_metadata]) == []  # the newest shape
            conn.execute(insert(stats_history).values(sampled_at=3.0, uptime_s=3.0, disk_stored_bytes=2**40))
            assert conn.execute(select(func.max(stats_history.c.disk_stored_bytes))).scalar() == 2**40
    finally:
        engine.dispose()

