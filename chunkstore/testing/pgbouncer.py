"""A throwaway PgBouncer for tests: Debian's `pgbouncer` in front of a test PostgreSQL server, as
a child process, in transaction pooling mode unless told otherwise.

Invariants: it listens on 127.0.0.1 only (no unix socket), with `trust` auth for the one user of
its own auth file (the PostgreSQL server's user) and that user as the admin console's; every
database name is passed through to the server it fronts; its config, auth file and log live in
one private `mkdtemp` under /tmp (reachable by the server's OS user, which is `postgres` when
running as root: PgBouncer refuses to run as root), which `stop` removes; it is stopped by the
PID it was started with (SIGTERM: immediate shutdown, then SIGKILL after `stop_timeout_s`),
never by name or through systemd.

    with PostgresServer(tmp_path / "pg") as pg, PgBouncer(pg) as bouncer:
        url = bouncer.url(pg_database_name)   # postgresql+psycopg://postgres@127.0.0.1:PORT/NAME
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from chunkstore.choices import Choice
from chunkstore.testing.postgres import HOST, PostgresServer, free_port, log_tail, server_account
from chunkstore.testing.throwaway import Throwaway, end_process

INSTALL_HINT = "install PgBouncer with `apt-get install pgbouncer` (Debian, Ubuntu)"
SEARCH_PATH = ("/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin")
START_TIMEOUT_S = 30.0  # measured at ~0.1 s; the bound is for loaded CI machines
STOP_TIMEOUT_S = 10.0
# Server connections per (database, user): the test suites open several stores at once, each with
# up to 16 client connections; a transaction holds one server connection only while it runs.
POOL_SIZE = 20
MAX_CLIENT_CONNECTIONS = 1000


class PoolMode(Choice):
    """PgBouncer's `pool_mode`: when a client's server connection goes back to the pool."""

    SESSION = "session"  # when the client disconnects
    TRANSACTION = "transaction"  # after each transaction (and each autocommit statement)
    STATEMENT = "statement"  # after each statement; multi-statement transactions are refused


class PgBouncerError(RuntimeError):
    """PgBouncer could not be set up, started or stopped; the message quotes its log."""


class PgBouncerNotInstalled(PgBouncerError):
    """The `pgbouncer` binary is not on this machine."""


class PgBouncer(Throwaway):
    """PgBouncer on 127.0.0.1:`port` (a free one by default) in front of `postgres`, a started
    PostgresServer. `start` and `stop` are not thread-safe; call them from one thread (a fixture)."""

    def __init__(self, postgres: PostgresServer, *, pool_mode: PoolMode | str = PoolMode.TRANSACTION,
                 pool_size: int = POOL_SIZE, port: int | None = None, binary: Path | None = None,
                 start_timeout_s: float = START_TIMEOUT_S, stop_timeout_s: float = STOP_TIMEOUT_S) -> None:
        if pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, not {pool_size}")
        self.postgres = postgres
        self.pool_mode = PoolMode.parse(pool_mode)
        self.pool_size = pool_size
        self.binary = Path(binary) if binary is not None else self.find_binary()
        self.port = port if port is not None else free_port()
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.account = server_account()
        self.user = postgres.user  # the one user of the auth file: the server's own
        self.version = binary_version(self.binary)
        self.folder: Path | None = None  # the private mkdtemp while started
        self._process: subprocess.Popen[bytes] | None = None
        self._last_log = ""  # the log's tail, kept when stop removes the folder

    @staticmethod
    def find_binary() -> Path:
        """The `pgbouncer` executable (PATH, then sbin folders, which PATH may lack). Raises
        PgBouncerNotInstalled, saying how to install it, when there is none."""
        found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path=os.pathsep.join(SEARCH_PATH))
        if found is None:
            raise PgBouncerNotInstalled(f"PgBouncer's `pgbouncer` was not found: {INSTALL_HINT}")
        return Path(found)

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """PgBouncer's PID while it is started, else None."""
        return self._process.pid if self._process is not None else None

    @property
    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def log_path(self) -> Path | None:
        return self.folder / "pgbouncer.log" if self.folder is not None else None

    def start(self) -> None:
        """Write the config and auth file, start PgBouncer and return once a query through it is
        answered by the server. Raises PgBouncerError, with the log's tail, when it exits during
        start-up or does not answer within `start_timeout_s` (it is then stopped)."""
        if self._process is not None:
            raise PgBouncerError(f"PgBouncer is already started (PID {self.pid})")
        if not self.postgres.is_running:
            raise PgBouncerError("the PostgreSQL server to front is not running")
        try:
            self._write_files()
            self._launch()
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop PgBouncer by its PID (SIGTERM, then SIGKILL after `stop_timeout_s`) and remove its
        folder (the log's tail stays in `last_log`). Idempotent."""
        process, self._process = self._process, None
        if process is not None:
            end_process(process, signal.SIGTERM, self.stop_timeout_s)
        if self.folder is not None:
            self._last_log = log_tail(self.log_path)
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    @property
    def last_log(self) -> str:
        """The tail of PgBouncer's log (the current one while started, the last one after)."""
        return log_tail(self.log_path) if self.log_path is not None else self._last_log

    # -- URLs and the admin console ------------------------------------------------------------

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of `database` on the server, through PgBouncer."""
        return f"postgresql+psycopg://{self.user}@{HOST}:{self.port}/{database}"

    def through(self, direct_url: str) -> str:
        """`direct_url` (a database on the fronted server) through PgBouncer instead."""
        from sqlalchemy.engine import make_url

        return self.url(make_url(direct_url).database)

    def show(self, what: str) -> list[dict[str, object]]:
        """An admin console command's rows (`SHOW POOLS`, `SHOW STATS`, ...) as dicts. Raises
        ValueError for anything but a SHOW command (the console can also pause and kill)."""
        import psycopg
        from psycopg.rows import dict_row

        if not re.fullmatch(r"[A-Z_]+", what):
            raise ValueError(f"not an admin console SHOW command: {what!r}")
        with psycopg.connect(host=HOST, port=self.port, user=self.user, dbname="pgbouncer", autocommit=True,
                             prepare_threshold=None, connect_timeout=10) as conn:
            return conn.cursor(row_factory=dict_row).execute(f"SHOW {what}").fetchall()

    # -- steps of start ------------------------------------------------------------------------

    def _write_files(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="chunkstore-pgbouncer-", dir="/tmp"))
        (self.folder / "userlist.txt").write_text(f'"{self.user}" ""\n')
        (self.folder / "pgbouncer.ini").write_text(config_text(
            folder=self.folder, port=self.port, server_port=self.postgres.port, user=self.user,
            pool_mode=self.pool_mode, pool_size=self.pool_size))
        if os.geteuid() == 0:
            for path in (self.folder, self.folder / "userlist.txt", self.folder / "pgbouncer.ini"):
                os.chown(path, self.account.pw_uid, self.account.pw_gid)

    def _launch(self) -> None:
        # In the foreground (no -d): the PID of the child is PgBouncer's. As root, as the server's
        # OS user (setuid in the child; no preexec function, which is unsafe with threads).
        as_user = ({"user": self.account.pw_uid, "group": self.account.pw_gid, "extra_groups": []}
                   if os.geteuid() == 0 else {})
        self._process = subprocess.Popen([str(self.binary), str(self.folder / "pgbouncer.ini")],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, cwd=self.folder, env={"LC_ALL": "C"},
                                         start_new_session=True, **as_user)

    def _wait_until_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + self.start_timeout_s
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                code = self._process.returncode if self._process is not None else None
                raise PgBouncerError(f"pgbouncer exited with {code} during start-up (port {self.port}); "
                                     f"its log:\n{self.last_log}")
            try:
                with psycopg.connect(host=HOST, port=self.port, user=self.user, dbname="postgres", autocommit=True,
                                     prepare_threshold=None, connect_timeout=2) as conn:  # (statement mode too)
                    conn.execute("SELECT 1")
                    return
            except psycopg.OperationalError as error:  # not listening yet
                last_error = error
            time.sleep(0.05)
        raise PgBouncerError(f"pgbouncer (PID {self.pid}) did not answer on {HOST}:{self.port} within "
                             f"{self.start_timeout_s:.0f} s (last error: {last_error}); its log:\n{self.last_log}")


def config_text(*, folder: Path, port: int, server_port: int, user: str, pool_mode: PoolMode,
                pool_size: int) -> str:
    """pgbouncer.ini: every database passed through to 127.0.0.1:`server_port`."""
    return "\n".join([
        "; chunkstore.testing.pgbouncer: 127.0.0.1 only, trust for the auth file's one user",
        "[databases]",
        f"* = host={HOST} port={server_port}",
        "[pgbouncer]",
        f"listen_addr = {HOST}",
        f"listen_port = {port}",
        "unix_socket_dir =",  # none: TCP on 127.0.0.1 only
        "auth_type = trust",
        f"auth_file = {folder / 'userlist.txt'}",
        f"admin_users = {user}",
        f"stats_users = {user}",
        f"pool_mode = {pool_mode.value}",
        f"default_pool_size = {pool_size}",
        f"max_client_conn = {MAX_CLIENT_CONNECTIONS}",
        f"logfile = {folder / 'pgbouncer.log'}",
        "log_connections = 0",
        "log_disconnections = 0",
        "ignore_startup_parameters = extra_float_digits",
        "",
    ])


def binary_version(binary: Path) -> tuple[int, ...]:
    """PgBouncer's version as numbers (``pgbouncer --version``: "PgBouncer 1.18.0"). Raises
    PgBouncerError when the binary does not say."""
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=10, check=False)
    found = re.search(r"PgBouncer (\d+(?:\.\d+)*)", done.stdout)
    if found is None:
        raise PgBouncerError(f"{binary} --version said no version: {done.stdout.strip() or done.stderr.strip()}")
    return tuple(int(part) for part in found.group(1).split("."))
