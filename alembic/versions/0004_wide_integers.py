"""64-bit integers for sizes, counts and counters on PostgreSQL, whose INTEGER is 32-bit (a
namespace's bytes pass 2^31 at 2 GiB). SQLite's INTEGER is 64-bit already: nothing changes there.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Spelled out (not imported from the schema modules): a migration is frozen once released.
_WIDE = {
    "chunks": ("raw_bytes", "stored_bytes", "hit_count"),
    "namespace_usage": ("num_chunks", "raw_bytes", "stored_bytes"),
    "namespace_quotas": ("quota_bytes",),
    "counters": ("value",),
    "stats_history": (
        "device_used_bytes", "device_capacity_bytes", "host_used_bytes", "host_capacity_bytes",
        "disk_stored_bytes", "disk_raw_bytes", "disk_capacity_bytes", "disk_chunks",
        "lookups", "lookup_tokens", "hit_tokens_device", "hit_tokens_host", "hit_tokens_disk",
        "bytes_device_to_host", "bytes_host_to_disk", "bytes_disk_to_host", "bytes_host_to_device",
        "evicted_device_pages", "evicted_host_pages", "disk_evictions", "disk_hits", "disk_misses",
        "requests_total", "completion_tokens_total", "ttft_count",
    ),
}


def _retype(kind: type) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, columns in _WIDE.items():
        for name in columns:
            op.alter_column(table, name, type_=kind())


def upgrade() -> None:
    _retype(sa.BigInteger)


def downgrade() -> None:
    _retype(sa.Integer)
