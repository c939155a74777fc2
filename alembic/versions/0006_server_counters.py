"""Per-server counters of a shared tier: one row per server (a process, ``host:pid``) with the page
hits, misses, pages published, duplicates skipped and failed page writes it counted, and when its
counts were first and last written, so that a dead server's row can be shown as stale and pruned.
Written with the index's buffered counter flush, as the per-namespace ``counters``.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-09
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# Spelled out (not imported from chunkstore.disk.schema): a migration is frozen once released.
_COUNTS = ("hits", "misses", "published", "dedup_hits", "write_errors")


def _wide() -> sa.types.TypeEngine:
    return sa.Integer().with_variant(sa.BigInteger(), "postgresql")  # 64-bit, as migration 0004's


def upgrade() -> None:
    op.create_table(
        "server_counters",
        sa.Column("server", sa.String, primary_key=True),
        *(sa.Column(name, _wide(), nullable=False, server_default="0") for name in _COUNTS),
        sa.Column("first_seen_at", sa.Float, nullable=False),
        sa.Column("last_seen_at", sa.Float, nullable=False),
    )
    op.create_index("ix_server_counters_last_seen_at", "server_counters", ["last_seen_at"])


def downgrade() -> None:
    op.drop_index("ix_server_counters_last_seen_at", "server_counters")
    op.drop_table("server_counters")
