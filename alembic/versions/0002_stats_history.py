"""The management API's stats history: one row per sample, bounded by its writer (chunkstore/api/history.py).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# Spelled out (not imported from chunkstore.disk.schema): a migration is frozen once released.
_FIGURES = (
    "device_used_bytes", "device_capacity_bytes", "host_used_bytes", "host_capacity_bytes",
    "disk_stored_bytes", "disk_raw_bytes", "disk_capacity_bytes", "disk_chunks",
    "lookups", "lookup_tokens", "hit_tokens_device", "hit_tokens_host", "hit_tokens_disk",
    "bytes_device_to_host", "bytes_host_to_disk", "bytes_disk_to_host", "bytes_host_to_device",
    "evicted_device_pages", "evicted_host_pages", "disk_evictions", "disk_hits", "disk_misses",
)


def upgrade() -> None:
    op.create_table(
        "stats_history",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("sampled_at", sa.Float, nullable=False),
        sa.Column("uptime_s", sa.Float, nullable=False),
        *(sa.Column(name, sa.Integer, nullable=True) for name in _FIGURES),
    )
    op.create_index("ix_stats_history_sampled_at", "stats_history", ["sampled_at"])


def downgrade() -> None:
    op.drop_index("ix_stats_history_sampled_at", "stats_history")
    op.drop_table("stats_history")
