"""The chunk index: chunks, per-namespace usage (kept by triggers), quotas, counters, store meta.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "store_meta",
        sa.Column("name", sa.String, primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_table(
        "chunks",
        sa.Column("key", sa.LargeBinary(32), primary_key=True),
        sa.Column("parent_key", sa.LargeBinary(32), nullable=False),
        sa.Column("namespace", sa.String, nullable=False),
        sa.Column("num_tokens", sa.Integer, nullable=False),
        sa.Column("raw_bytes", sa.Integer, nullable=False),
        sa.Column("stored_bytes", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("last_access_at", sa.Float, nullable=False),
        sa.Column("hit_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("pinned", sa.Boolean, nullable=False, server_default="0"),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_chunks_parent_key", "chunks", ["parent_key"])
    op.create_index("ix_chunks_last_access_at", "chunks", ["last_access_at"])
    op.create_index("ix_chunks_namespace_last_access_at", "chunks", ["namespace", "last_access_at"])
    op.create_table(
        "namespace_usage",
        sa.Column("namespace", sa.String, primary_key=True),
        sa.Column("num_chunks", sa.Integer, nullable=False, server_default="0"),
        sa.Column("raw_bytes", sa.Integer, nullable=False, server_default="0"),
        sa.Column("stored_bytes", sa.Integer, nullable=False, server_default="0"),
    )
    op.create_table(
        "namespace_quotas",
        sa.Column("namespace", sa.String, primary_key=True),
        sa.Column("quota_bytes", sa.Integer, nullable=False),
    )
    op.create_table(
        "counters",
        sa.Column("namespace", sa.String, primary_key=True),
        sa.Column("name", sa.String, primary_key=True),
        sa.Column("value", sa.Integer, nullable=False, server_default="0"),
    )
    if op.get_bind().dialect.name == "postgresql":
        _postgresql_triggers()
        return
    op.execute(
        """
        CREATE TRIGGER chunks_usage_insert AFTER INSERT ON chunks BEGIN
            INSERT INTO namespace_usage (namespace, num_chunks, raw_bytes, stored_bytes)
            VALUES (NEW.namespace, 1, NEW.raw_bytes, NEW.stored_bytes)
            ON CONFLICT (namespace) DO UPDATE SET
                num_chunks = num_chunks + 1,
                raw_bytes = raw_bytes + NEW.raw_bytes,
                stored_bytes = stored_bytes + NEW.stored_bytes;
        END
        """
    )
    op.execute(
        """
        CREATE TRIGGER chunks_usage_delete AFTER DELETE ON chunks BEGIN
            UPDATE namespace_usage SET
                num_chunks = num_chunks - 1,
                raw_bytes = raw_bytes - OLD.raw_bytes,
                stored_bytes = stored_bytes - OLD.stored_bytes
            WHERE namespace = OLD.namespace;
        END
        """
    )


def _postgresql_triggers() -> None:
    """The same usage bookkeeping on PostgreSQL: row triggers calling PL/pgSQL functions (added
    with PostgreSQL support; SQLite indexes are made exactly as before)."""
    op.execute(
        """
        CREATE FUNCTION chunks_usage_insert() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO namespace_usage AS u (namespace, num_chunks, raw_bytes, stored_bytes)
            VALUES (NEW.namespace, 1, NEW.raw_bytes, NEW.stored_bytes)
            ON CONFLICT (namespace) DO UPDATE SET
                num_chunks = u.num_chunks + 1,
                raw_bytes = u.raw_bytes + NEW.raw_bytes,
                stored_bytes = u.stored_bytes + NEW.stored_bytes;
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        """
        CREATE FUNCTION chunks_usage_delete() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            UPDATE namespace_usage SET
                num_chunks = num_chunks - 1,
                raw_bytes = raw_bytes - OLD.raw_bytes,
                stored_bytes = stored_bytes - OLD.stored_bytes
            WHERE namespace = OLD.namespace;
            RETURN NULL;
        END $$
        """
    )
    op.execute("CREATE TRIGGER chunks_usage_insert AFTER INSERT ON chunks FOR EACH ROW "
               "EXECUTE FUNCTION chunks_usage_insert()")
    op.execute("CREATE TRIGGER chunks_usage_delete AFTER DELETE ON chunks FOR EACH ROW "
               "EXECUTE FUNCTION chunks_usage_delete()")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS chunks_usage_delete ON chunks")
        op.execute("DROP TRIGGER IF EXISTS chunks_usage_insert ON chunks")
        op.execute("DROP FUNCTION IF EXISTS chunks_usage_delete(), chunks_usage_insert()")
    else:
        op.execute("DROP TRIGGER IF EXISTS chunks_usage_delete")
        op.execute("DROP TRIGGER IF EXISTS chunks_usage_insert")
    for table in ("counters", "namespace_quotas", "namespace_usage", "chunks", "store_meta"):
        op.drop_table(table)
