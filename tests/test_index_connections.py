"""The PostgreSQL index's pooled connections: one used within PING_IDLE_S goes out unchecked (no
round trip of its own before a lookup), one idle longer is checked first and replaced when the
server dropped it, and a lookup that meets a dropped connection is an error the store turns into
a miss (a DBAPIError, never the driver's own), after which the pool answers again."""

from __future__ import annotations

import time

import psycopg
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from chunkstore.disk.index import ChunkIndex, ChunkRow
from chunkstore.disk.index_dialect import PING_IDLE_S

KEYS = [bytes([i]) * 32 for i in range(1, 21)]


def _drop_every_connection(url: str) -> int:
    """What a server restart does to the index's pooled connections: their backends end."""
    u = make_url(url)
    with psycopg.connect(host=u.host, port=u.port, user=u.username, dbname=u.database, autocommit=True) as conn:
        return conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchone()[0]


@pytest.fixture
def index(postgres_url):
    index = ChunkIndex(postgres_url)
    index.insert([ChunkRow(k, b"\0" * 32, "ns", 4, 10, 10, 1.0, 1.0) for k in KEYS])
    yield index
    index.close()


def test_a_lookup_on_a_dropped_connection_is_an_index_error_then_the_pool_answers(index, postgres_url):
    assert index.present(KEYS) == set(KEYS)
    assert _drop_every_connection(postgres_url) >= 1
    with pytest.raises(DBAPIError):  # (the store's lookups catch DBAPIError: a miss, logged)
        index.present(KEYS)  # used just now: handed out unchecked (no round trip first), and dead
    assert index.present(KEYS) == set(KEYS)  # the pool was renewed


def test_a_connection_idle_past_the_threshold_is_checked_and_replaced(index, postgres_url):
    assert index.present(KEYS) == set(KEYS)
    assert _drop_every_connection(postgres_url) >= 1
    time.sleep(PING_IDLE_S + 0.2)
    assert index.present(KEYS) == set(KEYS)  # checked at checkout, found dead, replaced: no error
    assert index.count() == len(KEYS)

