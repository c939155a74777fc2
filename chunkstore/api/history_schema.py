"""The stats history table: the management API's own table, kept in the store's index database.

Invariants: the API alone reads and writes it (chunkstore/api/history.py, through its own
connections: history_db.py), the disk tier never does; its migrations are the API's own
(chunkstore/api/migrations/, versioned in API_VERSION_TABLE apart from the disk tier's); these
definitions match the newest of them (tests/test_schema.py compares them). Imports nothing but
SQLAlchemy, so the API's alembic env.py can load it.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Float, Index, Integer, MetaData, String, Table

# 64-bit on PostgreSQL (alembic 0004), as the disk tier's sizes; SQLite's INTEGER is 64-bit already.
WideInteger = Integer().with_variant(BigInteger(), "postgresql")

metadata = MetaData()
API_VERSION_TABLE = "api_alembic_version"  # the API's own revision, beside the disk tier's alembic_version

# One row per sample of the cache's figures (chunkstore/api/history.py writes and bounds it). Memory-tier and
# lookup columns are NULL for an offline store. Counters are cumulative since ``uptime_s`` began,
# so a restart shows as an uptime that went down. ``server`` (migration 0007) is the key of the server
# that took the sample (chunkstore/api/history.py: '' for a store of its own): on a shared tier every server
# writes, reads and trims only its own rows.
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
    *(Column(name, WideInteger, nullable=True) for name in STATS_HISTORY_FIGURES),
    *(Column(name, Float if name.endswith("_s") else WideInteger, nullable=True) for name in STATS_HISTORY_SERVING),
    Column("server", String, nullable=False, server_default=""),
    Index("ix_stats_history_sampled_at", "sampled_at"),
    Index("ix_stats_history_server_id", "server", "id"),
)
