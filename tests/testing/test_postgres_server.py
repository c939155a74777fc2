"""chunkstore.testing.postgres against a real PostgreSQL, through SQLAlchemy and psycopg: the
session's server serves independent databases on 127.0.0.1 only; a server of a test's own stops by
its PID, and one that cannot start fails quickly with its log."""

from __future__ import annotations

import errno
import os
import socket
import time

import pytest
import sqlalchemy as sa

from chunkstore.testing.postgres import (
    PostgresNotInstalled,
    PostgresServer,
    PostgresServerError,
)

# The tests that start servers of their own skip (or fail under CI) with the session's server.
pytestmark = pytest.mark.usefixtures("postgres_server")


def scalar(url: str, query: str):
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(query)).scalar()
    finally:
        engine.dispose()


def refuses(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == errno.ECONNREFUSED


def test_connects_and_runs_a_query(postgres_url):
    assert postgres_url.startswith("postgresql+psycopg://")
    assert scalar(postgres_url, "SELECT 40 + 2") == 42
    assert scalar(postgres_url, "SELECT current_database()") == sa.make_url(postgres_url).database
    assert scalar(postgres_url, "SHOW server_encoding") == "UTF8"


def test_two_databases_are_independent(postgres_server, postgres_url):
    other = postgres_server.create_database("independent_other")
    try:
        engine = sa.create_engine(postgres_url)
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE chunk (key text PRIMARY KEY)"))
            conn.execute(sa.text("INSERT INTO chunk VALUES ('a')"))
        engine.dispose()
        assert scalar(postgres_url, "SELECT count(*) FROM chunk") == 1
        assert scalar(other, "SELECT to_regclass('chunk') IS NULL") is True
    finally:
        postgres_server.drop_database("independent_other")
    assert scalar(postgres_url, "SELECT count(*) FROM pg_database WHERE datname = 'independent_other'") == 0


def test_drop_ends_open_sessions(postgres_server):
    url = postgres_server.create_database("dropped_while_open")
    engine = sa.create_engine(url)
    conn = engine.connect()
    conn.execute(sa.text("SELECT 1"))
    postgres_server.drop_database("dropped_while_open")  # FORCE: the open session does not block it
    with pytest.raises(sa.exc.OperationalError, match="terminating connection"):
        conn.execute(sa.text("SELECT 1"))
    conn.invalidate()
    engine.dispose()
    admin = postgres_server.url("postgres")
    assert scalar(admin, "SELECT count(*) FROM pg_database WHERE datname = 'dropped_while_open'") == 0


def test_listens_on_127_0_0_1_only(postgres_server, postgres_url):
    assert scalar(postgres_url, "SHOW listen_addresses") == "127.0.0.1"
    assert scalar(postgres_url, "SELECT host(inet_server_addr())") == "127.0.0.1"
    assert scalar(postgres_url, "SELECT count(*) FROM pg_hba_file_rules "
                                "WHERE type = 'host' AND address <> '127.0.0.1'") == 0
    assert postgres_server.startup_s is not None and postgres_server.startup_s < 60


def test_stop_kills_the_pid_and_frees_the_port(tmp_path):
    with PostgresServer(tmp_path / "pg") as server:
        pid, port = server.pid, server.port
        assert scalar(server.create_database("d"), "SELECT 1") == 1
        os.kill(pid, 0)  # alive
    assert server.pid is None and not server.is_running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone, and reaped (no zombie left with that PID)
    assert refuses(port)
    assert server.log_path.is_relative_to(tmp_path)
    assert "database system is shut down" in server.log_path.read_text()


def test_stop_ends_open_sessions_within_its_bound(tmp_path):
    server = PostgresServer(tmp_path / "pg")
    server.start()
    engine = sa.create_engine(server.create_database("d"))
    conn = engine.connect()
    conn.execute(sa.text("SELECT 1"))
    began = time.monotonic()
    server.stop()  # SIGINT is a fast shutdown: an open session does not hold it up
    assert time.monotonic() - began < server.stop_timeout_s
    conn.invalidate()
    engine.dispose()
    server.stop()  # idempotent


def test_a_long_folder_gets_a_short_socket_folder_removed_on_stop(tmp_path):
    folder = tmp_path / ("long-" * 20) / "pg"
    with PostgresServer(folder) as server:
        assert len(os.fsencode(server._socket_dir)) <= 80
        scratch = server._scratch
        assert scratch is not None and scratch.exists()
        assert scalar(server.create_database("d"), "SELECT 1") == 1
    assert not scratch.exists()


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
def test_a_taken_port_fails_fast_naming_the_log(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = PostgresServer(tmp_path / "pg", port=taken.getsockname()[1], start_timeout_s=30)
        began = time.monotonic()
        with pytest.raises(PostgresServerError) as raised:
            server.start()
        assert time.monotonic() - began < 30  # it saw the server exit, it did not wait out the bound
    message = str(raised.value)
    assert str(server.log_path) in message
    assert "Address already in use" in message
    assert server.pid is None and server._scratch is None


def test_find_binaries_says_how_to_install(tmp_path):
    with pytest.raises(PostgresNotInstalled, match="apt-get install postgresql"):
        PostgresServer.find_binaries(tmp_path)
    for version in ("9.6", "15", "16"):
        (tmp_path / version / "bin").mkdir(parents=True)
        for name in ("initdb", "postgres"):
            (tmp_path / version / "bin" / name).touch(mode=0o755)
    (tmp_path / "17" / "bin").mkdir(parents=True)  # no binaries in it
    assert PostgresServer.find_binaries(tmp_path) == tmp_path / "16" / "bin"


@pytest.mark.parametrize("name", ["", "Upper", "1st", "a-b", 'x"; DROP', "a" * 64])
def test_database_names_are_checked(postgres_server, name):
    with pytest.raises(ValueError, match="database name"):
        postgres_server.create_database(name)
