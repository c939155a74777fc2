"""The alembic migrations describe the same database as chunkstore/disk/schema.py (the disk tier's
tables) and api/history_schema.py (the management API's own table) together, the disk tier's schema
holds none of the API's tables, and the usage triggers keep per-namespace totals equal to the rows."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from chunkstore.api.history_schema import metadata as api_metadata
from sqlalchemy import create_engine, text

from chunkstore.disk import migrations
from chunkstore.disk.index import ChunkIndex, ChunkRow, sqlite_url
from chunkstore.disk.schema import metadata as disk_metadata


def test_migrations_match_the_schema_module(tmp_path):
    ChunkIndex(sqlite_url(tmp_path)).close()
    engine = create_engine(f"sqlite:///{tmp_path / 'index.db'}")
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), [disk_metadata, api_metadata])
        assert migrations.current_revision(conn) == migrations.head_revision()
    engine.dispose()
    assert diff == [], diff


def test_the_disk_schema_holds_only_the_disk_tiers_tables():
    assert set(disk_metadata.tables) == {"store_meta", "chunks", "namespace_usage", "namespace_quotas", "counters",
                                         "chunk_claims"}
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


def test_usage_triggers_follow_inserts_and_deletes(tmp_path):
    index = ChunkIndex(sqlite_url(tmp_path))
    rows = [ChunkRow(bytes([i]) * 32, b"\0" * 32, "ns" if i % 2 else "other", 4, 100, 60 + i, 1.0, 1.0)
            for i in range(10)]
    assert index.insert(rows) == 10
    assert index.insert(rows[:3]) == 0  # duplicates are ignored, totals unchanged
    index.delete([rows[1].key, rows[2].key])
    usage = {u.namespace: u for u in index.usage()}
    for ns in ("ns", "other"):
        kept = [r for r in rows if r.namespace == ns and r.key not in (rows[1].key, rows[2].key)]
        assert usage[ns].num_chunks == len(kept)
        assert usage[ns].stored_bytes == sum(r.stored_bytes for r in kept)
        assert usage[ns].raw_bytes == 100 * len(kept)
    index.close()
