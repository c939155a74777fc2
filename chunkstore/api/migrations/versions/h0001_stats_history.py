"""The management API's stats history, under the API's own version table: created in a new index,
adopted as it is in an index where the disk tier's history made it (its revisions 0002, 0003 and
0007, now empty), and brought to the newest shape whichever of them it had passed: the engine's
serving counters (0003), 64-bit integers on PostgreSQL (0004), the server key and its index (0007).

Revision ID: h0001
Revises:
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "h0001"
down_revision = None
branch_labels = None
depends_on = None

# Spelled out (not imported from chunkstore/api/history_schema.py): a migration is frozen once released.
_FIGURES = (
    "device_used_bytes", "device_capacity_bytes", "host_used_bytes", "host_capacity_bytes",
    "disk_stored_bytes", "disk_raw_bytes", "disk_capacity_bytes", "disk_chunks",
    "lookups", "lookup_tokens", "hit_tokens_device", "hit_tokens_host", "hit_tokens_disk",
    "bytes_device_to_host", "bytes_host_to_disk", "bytes_disk_to_host", "bytes_host_to_device",
    "evicted_device_pages", "evicted_host_pages", "disk_evictions", "disk_hits", "disk_misses",
)
_SERVING_INTEGERS = ("requests_total", "completion_tokens_total", "ttft_count")
_INDEXES = {"ix_stats_history_sampled_at": ["sampled_at"], "ix_stats_history_server_id": ["server", "id"]}


def _wide() -> sa.types.TypeEngine:
    return sa.Integer().with_variant(sa.BigInteger(), "postgresql")


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    if not inspector.has_table("stats_history"):
        op.create_table(
            "stats_history",
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("sampled_at", sa.Float, nullable=False),
            sa.Column("uptime_s", sa.Float, nullable=False),
            *(sa.Column(name, _wide(), nullable=True) for name in _FIGURES),
            sa.Column("requests_total", _wide(), nullable=True),
            sa.Column("completion_tokens_total", _wide(), nullable=True),
            sa.Column("ttft_sum_s", sa.Float, nullable=True),
            sa.Column("ttft_count", _wide(), nullable=True),
            sa.Column("server", sa.String, nullable=False, server_default=""),
        )
    else:  # made by the disk tier's history: bring it to this shape, rows as they are
        have = {c["name"]: c for c in inspector.get_columns("stats_history")}
        missing = [sa.Column(name, _wide(), nullable=True) for name in _SERVING_INTEGERS if name not in have]
        if "ttft_sum_s" not in have:
            missing.append(sa.Column("ttft_sum_s", sa.Float, nullable=True))
        if "server" not in have:
            missing.append(sa.Column("server", sa.String, nullable=False, server_default=""))
        if missing:
            with op.batch_alter_table("stats_history") as batch:
                for column in missing:
                    batch.add_column(column)
        if op.get_bind().dialect.name == "postgresql":  # 32-bit INTEGER columns of an index older than 0004
            for name in (*_FIGURES, *_SERVING_INTEGERS):
                if name in have and isinstance(have[name]["type"], sa.Integer) \
                        and not isinstance(have[name]["type"], sa.BigInteger):
                    op.alter_column("stats_history", name, type_=sa.BigInteger())
    present = {i["name"] for i in sa.inspect(op.get_bind()).get_indexes("stats_history")}
    for name, columns in _INDEXES.items():
        if name not in present:
            op.create_index(name, "stats_history", columns)


def downgrade() -> None:
    for name in _INDEXES:
        op.drop_index(name, "stats_history")
    op.drop_table("stats_history")
