"""SQLAlchemy Core tables of the chunk index (the schema itself is owned by alembic/ migrations).

Invariant: these definitions match the newest migration; tests/test_schema.py compares them.
Per-namespace usage is kept by SQLite triggers on ``chunks``, so it can never drift from the rows.
``stats_history`` holds the management API's periodic samples (bounded by its writer, api/history.py).
"""

from __future__ import annotations

from sqlalchemy import Boolean, Column, Float, Index, Integer, LargeBinary, MetaData, String, Table, Text

metadata = MetaData()

store_meta = Table(
    "store_meta", metadata,
    Column("name", String, primary_key=True),
    Column("value", Text, nullable=False),
)

chunks = Table(
    "chunks", metadata,
    Column("key", LargeBinary(32), primary_key=True),
    Column("parent_key", LargeBinary(32), nullable=False),
    Column("namespace", String, nullable=False),
    Column("num_tokens", Integer, nullable=False),
    Column("raw_bytes", Integer, nullable=False),
    Column("stored_bytes", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("last_access_at", Float, nullable=False),
    Column("hit_count", Integer, nullable=False, server_default="0"),
    Column("pinned", Boolean, nullable=False, server_default="0"),
    Index("ix_chunks_parent_key", "parent_key"),
    Index("ix_chunks_last_access_at", "last_access_at"),
    Index("ix_chunks_namespace_last_access_at", "namespace", "last_access_at"),
    sqlite_with_rowid=False,
)

namespace_usage = Table(
    "namespace_usage", metadata,
    Column("namespace", String, primary_key=True),
    Column("num_chunks", Integer, nullable=False, server_default="0"),
    Column("raw_bytes", Integer, nullable=False, server_default="0"),
    Column("stored_bytes", Integer, nullable=False, server_default="0"),
)

namespace_quotas = Table(
    "namespace_quotas", metadata,
    Column("namespace", String, primary_key=True),
    Column("quota_bytes", Integer, nullable=False),
)

counters = Table(
    "counters", metadata,
    Column("namespace", String, primary_key=True),
    Column("name", String, primary_key=True),
    Column("value", Integer, nullable=False, server_default="0"),
)

# One row per sample of the cache's figures (api/history.py writes and bounds it). Memory-tier and
# lookup columns are NULL for an offline store. Counters are cumulative since ``uptime_s`` began,
# so a restart shows as an uptime that went down.
STATS_HISTORY_FIGURES = (
    "device_used_bytes", "device_capacity_bytes", "host_used_bytes", "host_capacity_bytes",
    "disk_stored_bytes", "disk_raw_bytes", "disk_capacity_bytes", "disk_chunks",
    "lookups", "lookup_tokens", "hit_tokens_device", "hit_tokens_host", "hit_tokens_disk",
    "bytes_device_to_host", "bytes_host_to_disk", "bytes_disk_to_host", "bytes_host_to_device",
    "evicted_device_pages", "evicted_host_pages", "disk_evictions", "disk_hits", "disk_misses",
)

# The engine's serving counters (migration 0003), None without an engine.
STATS_HISTORY_SERVING = ("requests_total", "completion_tokens_total", "ttft_sum_s", "ttft_count")

stats_history = Table(
    "stats_history", metadata,
    Column("id", Integer, primary_key=True),
    Column("sampled_at", Float, nullable=False),
    Column("uptime_s", Float, nullable=False),
    *(Column(name, Integer, nullable=True) for name in STATS_HISTORY_FIGURES),
    *(Column(name, Float if name.endswith("_s") else Integer, nullable=True) for name in STATS_HISTORY_SERVING),
    Index("ix_stats_history_sampled_at", "sampled_at"),
)
