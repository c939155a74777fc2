"""SQLAlchemy Core tables of the chunk index (the schema itself is owned by alembic/ migrations).

Invariant: these definitions match the newest migration; tests/test_schema.py compares them.
Per-namespace usage is kept by triggers on ``chunks`` (SQLite's, or PL/pgSQL on PostgreSQL), so it
can never drift from the rows.
Only the disk tier's tables are here: the index database also holds the management API's own
``stats_history`` (chunkstore/api/history_schema.py), which the API makes and migrates itself
(chunkstore/api/migrations, its own version table).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Column, Float, Index, Integer, LargeBinary, MetaData, String, Table, Text

# 64-bit on PostgreSQL (alembic 0004); SQLite's INTEGER is 64-bit already and stays as created.
WideInteger = Integer().with_variant(BigInteger(), "postgresql")

metadata = MetaData()
KEY_HASH_INDEX = "ix_chunks_key_hash"  # PostgreSQL's only: SQLite's table is a B-tree on the key already
POSTGRESQL_ONLY_INDEXES = frozenset({KEY_HASH_INDEX})

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
    Column("raw_bytes", WideInteger, nullable=False),
    Column("stored_bytes", WideInteger, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("last_access_at", Float, nullable=False),
    Column("hit_count", WideInteger, nullable=False, server_default="0"),
    Column("pinned", Boolean, nullable=False, server_default="0"),
    Index("ix_chunks_parent_key", "parent_key"),
    Index("ix_chunks_last_access_at", "last_access_at"),
    Index("ix_chunks_namespace_last_access_at", "namespace", "last_access_at"),
    # PostgreSQL only (alembic 0010): a key's lookup reads one bucket page at any number of rows
    Index(KEY_HASH_INDEX, "key", postgresql_using="hash").ddl_if(dialect="postgresql"),
    sqlite_with_rowid=False,
)

namespace_usage = Table(
    "namespace_usage", metadata,
    Column("namespace", String, primary_key=True),
    Column("num_chunks", WideInteger, nullable=False, server_default="0"),
    Column("raw_bytes", WideInteger, nullable=False, server_default="0"),
    Column("stored_bytes", WideInteger, nullable=False, server_default="0"),
)

namespace_quotas = Table(
    "namespace_quotas", metadata,
    Column("namespace", String, primary_key=True),
    Column("quota_bytes", WideInteger, nullable=False),
)

counters = Table(
    "counters", metadata,
    Column("namespace", String, primary_key=True),
    Column("name", String, primary_key=True),
    Column("value", WideInteger, nullable=False, server_default="0"),
)

# A shared tier's publish claims (alembic 0005): a writer's claim on a key while it uploads the
# key's object; the row in ``chunks`` replaces it in one transaction, and it lapses at ``expires_at``.
chunk_claims = Table(
    "chunk_claims", metadata,
    Column("key", LargeBinary(32), primary_key=True),
    Column("writer", String, nullable=False),
    Column("expires_at", Float, nullable=False),
    Index("ix_chunk_claims_expires_at", "expires_at"),
    sqlite_with_rowid=False,
)

# Per-server counters (alembic 0006): each server (a process, ``host:pid``) adds its page hits,
# misses, pages published, duplicates and failed page writes with the index's buffered counter
# flush; ``last_seen_at`` is when its counts were last written (stale rows are pruned).
SERVER_COUNTS = ("hits", "misses", "published", "dedup_hits", "write_errors")
server_counters = Table(
    "server_counters", metadata,
    Column("server", String, primary_key=True),
    *(Column(name, WideInteger, nullable=False, server_default="0") for name in SERVER_COUNTS),
    Column("first_seen_at", Float, nullable=False),
    Column("last_seen_at", Float, nullable=False),
    Index("ix_server_counters_last_seen_at", "last_seen_at"),
)

# A sealed store's keys (alembic 0009): per namespace, its data and naming keys wrapped by the
# master key ``master_key_id`` names (sealing.py); ``key_id`` is the public id every sealed chunk of
# the namespace names. Deleting a row crypto-shreds its namespace.
seal_keys = Table(
    "seal_keys", metadata,
    Column("namespace", String, primary_key=True),
    Column("key_id", LargeBinary(8), nullable=False),
    Column("master_key_id", String, nullable=False),
    Column("wrapped", LargeBinary, nullable=False),
    Column("created_at", Float, nullable=False),
    Index("ix_seal_keys_key_id", "key_id", unique=True),
)
