"""The PostgreSQL index's pooled connections: one used within PING_IDLE_S goes out unchecked, one
idle longer is checked first and replaced when the server dropped it; a lookup's is never checked
(no round trip of its own before a lookup): a lookup that meets a dropped connection runs once
more on a new one, and when that fails too it is an error the store turns into a miss (a
DBAPIError, never the driver's own), after which the pool answers again."""

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


def _allow_connections(url: str, allowed: bool) -> None:
    u = make_url(url)
    with psycopg.connect(host=u.host, port=u.port, user=u.username, dbname="postgres", autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {u.database} ALLOW_CONNECTIONS {str(allowed).lower()}")


@pytest.fixture
def pings(index, monkeypatch):
    """The idle checks' round trips, counted (SQLAlchemy's dialect runs each)."""
    done = []
    ping = index.engine.dialect.do_ping
    monkeypatch.setattr(index.engine.dialect, "do_ping", lambda conn: done.append(1) or ping(conn))
    return done


def test_a_lookup_on_a_dropped_connection_runs_again_on_a_new_one(index, postgres_url, pings):
    assert index.present(KEYS) == set(KEYS)
    assert _drop_every_connection(postgres_url) >= 1
    assert index.present(KEYS) == set(KEYS)  # handed out unchecked, dead: the pool renewed, the lookup run again
    assert pings == []


def test_a_lookup_that_finds_no_live_connection_is_an_index_error_then_the_pool_answers(index, postgres_url):
    assert index.present(KEYS) == set(KEYS)
    assert _drop_every_connection(postgres_url) >= 1
    _allow_connections(postgres_url, False)
    try:
        with pytest.raises(DBAPIError):  # (the store's lookups catch DBAPIError: a miss, logged)
            index.present(KEYS)  # dead, and no new connection opens
    finally:
        _allow_connections(postgres_url, True)
    assert index.present(KEYS) == set(KEYS)


def test_a_connection_idle_past_the_threshold_is_checked_and_replaced(index, postgres_url, pings):
    assert index.count() == len(KEYS)
    assert _drop_every_connection(postgres_url) >= 1
    time.sleep(PING_IDLE_S + 0.2)
    assert index.count() == len(KEYS)  # checked at checkout, found dead, replaced: no error
    assert pings == [1]


def test_a_lookup_after_a_long_idle_takes_no_round_trip_first(index, pings):
    assert index.present(KEYS) == set(KEYS)
    time.sleep(PING_IDLE_S + 0.2)
    assert index.present(KEYS) == set(KEYS)
    assert pings == []
    time.sleep(PING_IDLE_S + 0.2)
    assert index.count() == len(KEYS)  # any other statement's connection is checked
    assert pings == [1]

