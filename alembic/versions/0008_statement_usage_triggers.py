"""PostgreSQL keeps per-namespace usage with one trigger call per statement instead of one per
row: a shared tier's put commits a batch of rows in one INSERT, and the row triggers updated the
namespace's one usage row once per chunk (a new row version each time, and the row locked longer
against the other servers). The statement triggers read the rows the statement inserted or
deleted (transition tables) and update each namespace once, in namespace order.

SQLite keeps its row triggers (it has no statement triggers); its indexes are unchanged.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


# Spelled out (not imported from 0001): a migration is frozen once released.
_ROW_INSERT = """
    BEGIN
        INSERT INTO namespace_usage AS u (namespace, num_chunks, raw_bytes, stored_bytes)
        VALUES (NEW.namespace, 1, NEW.raw_bytes, NEW.stored_bytes)
        ON CONFLICT (namespace) DO UPDATE SET
            num_chunks = u.num_chunks + 1,
            raw_bytes = u.raw_bytes + NEW.raw_bytes,
            stored_bytes = u.stored_bytes + NEW.stored_bytes;
        RETURN NULL;
    END"""
_ROW_DELETE = """
    BEGIN
        UPDATE namespace_usage SET
            num_chunks = num_chunks - 1,
            raw_bytes = raw_bytes - OLD.raw_bytes,
            stored_bytes = stored_bytes - OLD.stored_bytes
        WHERE namespace = OLD.namespace;
        RETURN NULL;
    END"""
_STATEMENT_INSERT = """
    BEGIN
        INSERT INTO namespace_usage AS u (namespace, num_chunks, raw_bytes, stored_bytes)
        SELECT namespace, count(*), sum(raw_bytes), sum(stored_bytes)
        FROM added GROUP BY namespace ORDER BY namespace
        ON CONFLICT (namespace) DO UPDATE SET
            num_chunks = u.num_chunks + excluded.num_chunks,
            raw_bytes = u.raw_bytes + excluded.raw_bytes,
            stored_bytes = u.stored_bytes + excluded.stored_bytes;
        RETURN NULL;
    END"""
_STATEMENT_DELETE = """
    DECLARE
        gone record;
    BEGIN
        -- One namespace at a time, in order: two statements' locks are then taken in one order.
        FOR gone IN SELECT namespace, count(*) AS n, sum(raw_bytes) AS raw, sum(stored_bytes) AS stored
                    FROM removed GROUP BY namespace ORDER BY namespace LOOP
            UPDATE namespace_usage SET
                num_chunks = num_chunks - gone.n,
                raw_bytes = raw_bytes - gone.raw,
                stored_bytes = stored_bytes - gone.stored
            WHERE namespace = gone.namespace;
        END LOOP;
        RETURN NULL;
    END"""


def _set_triggers(insert_body: str, delete_body: str, per_statement: bool) -> None:
    """Replace the usage triggers on ``chunks`` (PostgreSQL only; SQLite's stay as 0001 made them)."""
    if op.get_bind().dialect.name != "postgresql":
        return
    for event, body in (("insert", insert_body), ("delete", delete_body)):
        op.execute(f"DROP TRIGGER IF EXISTS chunks_usage_{event} ON chunks")
        op.execute(f"CREATE OR REPLACE FUNCTION chunks_usage_{event}() RETURNS trigger LANGUAGE plpgsql AS "
                   f"$${body} $$")
    if per_statement:
        op.execute("CREATE TRIGGER chunks_usage_insert AFTER INSERT ON chunks REFERENCING NEW TABLE AS added "
                   "FOR EACH STATEMENT EXECUTE FUNCTION chunks_usage_insert()")
        op.execute("CREATE TRIGGER chunks_usage_delete AFTER DELETE ON chunks REFERENCING OLD TABLE AS removed "
                   "FOR EACH STATEMENT EXECUTE FUNCTION chunks_usage_delete()")
    else:
        op.execute("CREATE TRIGGER chunks_usage_insert AFTER INSERT ON chunks FOR EACH ROW "
                   "EXECUTE FUNCTION chunks_usage_insert()")
        op.execute("CREATE TRIGGER chunks_usage_delete AFTER DELETE ON chunks FOR EACH ROW "
                   "EXECUTE FUNCTION chunks_usage_delete()")


def upgrade() -> None:
    _set_triggers(_STATEMENT_INSERT, _STATEMENT_DELETE, per_statement=True)


def downgrade() -> None:
    """Back to 0001's row triggers."""
    _set_triggers(_ROW_INSERT, _ROW_DELETE, per_statement=False)
