"""Shared fixtures: a tiny model identity and deterministic KV pages for it; a real PostgreSQL server
(one per run) and a fresh database on it per test; moto's S3 server and Ceph's RADOS Gateway (one
each per run) and fresh buckets on them. The tests of a server skip, with the reason, where its
binaries or client are missing, except under CI (the CI variable set), where they fail.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from chunkstore import ChunkStore, ModelIdentity, chain_pages
from tests.helpers import TINY, kv_pages

if TYPE_CHECKING:
    from chunkstore.testing.postgres import PostgresServer


def skip_unless_ci(reason: str) -> None:
    """Skip the test for ``reason``; under CI (which installs every server) fail it instead."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so these tests may not skip)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def identity() -> ModelIdentity:
    return TINY


@pytest.fixture
def store(tmp_path, identity):
    s = ChunkStore(tmp_path / "store", identity)
    yield s
    s.close()


@pytest.fixture
def chain(identity):
    """Ten pages of one prefix with their KV."""
    pages = chain_pages(identity, list(range(identity.page_size * 10)))
    return pages, kv_pages(identity, len(pages))


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory) -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole run, in its own folder, stopped by its PID at the end."""
    from chunkstore.testing.postgres import PostgresNotInstalled, PostgresServer

    try:
        import psycopg  # noqa: F401  (the driver: pip install "psycopg[binary]", in the dev extra)
        PostgresServer.find_binaries()
    except (ImportError, PostgresNotInstalled) as error:
        skip_unless_ci(f"PostgreSQL tests need PostgreSQL's server and psycopg: {error}")
    with PostgresServer(tmp_path_factory.mktemp("postgres")) as server:
        yield server


@pytest.fixture
def postgres_url(postgres_server) -> Iterator[str]:
    """The SQLAlchemy URL of a fresh database for this test, dropped (with FORCE) after it."""
    name = f"test_{uuid.uuid4().hex[:16]}"
    url = postgres_server.create_database(name)
    yield url
    postgres_server.drop_database(name)


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory):
    """moto's S3 server (a child process on 127.0.0.1) for the whole run: the fast stand-in that the
    object store's contract tests use; the end-to-end tests run on radosgw."""
    from chunkstore.testing.moto_s3 import MotoS3Server

    try:
        import moto.server  # noqa: F401  (moto[server], in the dev extra)
        import obstore  # noqa: F401  (the object store's client, in the fleet extra)
    except ImportError as error:
        skip_unless_ci(f"object store tests need moto[server] and obstore: {error}")
    with MotoS3Server(log_path=tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


@pytest.fixture
def bucket_url(moto_s3) -> str:
    """s3://<a fresh bucket>/<a prefix> on moto's server."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    moto_s3.create_bucket(name)
    return f"s3://{name}/fleet"


@pytest.fixture
def restartable_postgres(postgres_server):
    """A second PostgreSQL server whose cluster survives ``stop`` (started again with ``start``)."""
    from chunkstore.testing.postgres import PostgresServer

    folder = Path(tempfile.mkdtemp(prefix="chunkstore-pg-"))
    os.chmod(folder, 0o755)  # the server's OS user must reach the cluster (as root it is postgres)
    server = PostgresServer(folder / "pg")
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def radosgw_installed() -> bool:
    from chunkstore.testing.radosgw import RadosGateway, RadosGatewayNotInstalled

    try:
        RadosGateway.find_binaries()
    except RadosGatewayNotInstalled:
        return False
    return True


@pytest.fixture(scope="session")
def radosgw(tmp_path_factory):
    """Ceph's RADOS Gateway (one monitor, one memstore OSD, radosgw on 127.0.0.1) for the whole
    run, stopped by its PIDs at the end. Skips without Ceph's packages, except under CI."""
    from chunkstore.testing.radosgw import RadosGateway

    if not radosgw_installed():
        skip_unless_ci("needs Ceph's RADOS Gateway: apt-get install ceph-mon ceph-osd radosgw ceph-common")
    with RadosGateway(tmp_path_factory.mktemp("radosgw")) as gateway:
        yield gateway


@pytest.fixture
def shared_s3(request):
    """The S3 server of the shared tier's end-to-end tests (create_bucket, aws_env, config, client):
    radosgw where Ceph is installed (always under CI), else moto's server."""
    if radosgw_installed() or os.environ.get("CI"):
        return request.getfixturevalue("radosgw")
    return request.getfixturevalue("moto_s3")


@pytest.fixture(scope="session")
def pgbouncer(postgres_server):
    """PgBouncer in transaction pooling mode in front of the session's PostgreSQL server (one per
    run, on 127.0.0.1, stopped by its PID at the end). Skips without PgBouncer, except under CI."""
    from chunkstore.testing.pgbouncer import PgBouncer, PgBouncerNotInstalled

    try:
        PgBouncer.find_binary()
    except PgBouncerNotInstalled as error:
        skip_unless_ci(f"PgBouncer tests need PgBouncer: {error}")
    with PgBouncer(postgres_server) as bouncer:
        yield bouncer


@pytest.fixture
def pgbouncer_url(pgbouncer, postgres_url) -> str:
    """This test's fresh database (``postgres_url``), reached through PgBouncer in transaction mode."""
    return pgbouncer.through(postgres_url)
