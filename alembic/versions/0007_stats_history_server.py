"""The stats history gains a server key: on a shared tier (many servers on one PostgreSQL index)
each server writes, reads and trims only its own samples (chunkstore/api/history.py). The key outlives a
restart (the host name and the server's store folder), so a server's history stays continuous.

Existing rows get '', the key of a store of its own (SQLite, one server), so such a store keeps its
whole history; on a shared tier the first server that samples adopts them.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-10
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("stats_history") as batch:
        batch.add_column(sa.Column("server", sa.String, nullable=False, server_default=""))
    op.create_index("ix_stats_history_server_id", "stats_history", ["server", "id"])


def downgrade() -> None:
    op.drop_index("ix_stats_history_server_id", "stats_history")
    with op.batch_alter_table("stats_history") as batch:
        batch.drop_column("server")
