"""The management API's own connection to the database its tables live in (a store's index: the
SQLite file in the store's folder, or a shared tier's PostgreSQL), and the API's own migrations.

Invariants: the API reaches its tables through this engine only, never through the store's
connections, and changes no table of the disk tier's; its migrations run under its own version
table (history_schema.API_VERSION_TABLE), once per database and process, before the first write,
one server at a time on PostgreSQL (an advisory lock of the API's own); a read of a database the
API never wrote finds no table and answers nothing. alembic is imported only for an upgrade.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import Connection, Engine

from chunkstore.api.history_schema import API_VERSION_TABLE

log = logging.getLogger(__name__)
SCRIPTS = Path(__file__).resolve().parent / "migrations"
HEAD_REVISION = "h0001"  # the newest of SCRIPTS/versions (a test checks alembic agrees)
_MIGRATION_LOCK = 0x63736B61  # PostgreSQL advisory lock of the API's migrations ("cska"), not the disk tier's


def _busy_timeout(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=10000")  # the store writes the same file: wait for its lock, not fail
    cur.close()


class HistoryDatabase:
    """The API's engine on ``url`` (a store's ``index_url``). Thread-safe."""

    def __init__(self, url: str) -> None:
        self.url = url
        # On PostgreSQL no statement is prepared server-side (psycopg's prepare_threshold None): a
        # sample a minute gains nothing from it, and behind a transaction pooler (PgBouncer) two
        # connections' prepares meet on one server session and fail. The disk tier's own engine
        # turns them off only where it finds a pooler.
        postgres = url.startswith("postgresql")
        self.engine: Engine = create_engine(url, pool_size=2, max_overflow=2, pool_pre_ping=True,
                                            connect_args={"prepare_threshold": None} if postgres else {})
        self.is_sqlite = self.engine.dialect.name == "sqlite"
        if self.is_sqlite:
            event.listen(self.engine, "connect", _busy_timeout)
        self._migrated = False
        self._lock = threading.Lock()

    def close(self) -> None:
        self.engine.dispose()

    def has_tables(self, conn: Connection) -> bool:
        return inspect(conn).has_table(API_VERSION_TABLE)

    def migrate(self) -> None:
        """Bring the API's tables to HEAD_REVISION (once per process; a no-op when they are)."""
        with self._lock:
            if self._migrated:
                return
            with self.engine.begin() as conn:
                if not self.is_sqlite:
                    conn.execute(text(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})"))
                if self._revision(conn) != HEAD_REVISION:
                    from alembic import command
                    from alembic.config import Config

                    cfg = Config()
                    cfg.set_main_option("script_location", str(SCRIPTS))
                    cfg.attributes["connection"] = conn
                    command.upgrade(cfg, "head")
                    log.debug("the management API's tables: upgraded to revision %s", HEAD_REVISION)
            self._migrated = True

    def _revision(self, conn: Connection) -> str | None:
        if not self.has_tables(conn):
            return None
        return conn.execute(text(f"SELECT version_num FROM {API_VERSION_TABLE}")).scalar()
