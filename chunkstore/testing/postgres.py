"""A throwaway PostgreSQL server for tests: its own cluster (initdb), started as a child process.

Invariants: the server listens on 127.0.0.1 only (plus a unix socket in a private folder), with
`trust` auth for local and 127.0.0.1 connections only; it is stopped by the PID it was started
with (SIGINT, then SIGKILL after `stop_timeout_s`), never by name or through systemd; nothing is
written outside its folder except one private `mkdtemp` under /tmp (the socket folder when the
folder's path is too long for a socket, and the cluster itself when the server's user cannot reach
the folder), which `stop` removes. PostgreSQL refuses to run as root: as root the server runs as
the `postgres` OS user (Debian's package creates it), otherwise as the current user.

    with PostgresServer(tmp_path / "pg") as server:
        url = server.create_database("t1")   # postgresql+psycopg://postgres@127.0.0.1:PORT/t1
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from chunkstore.testing.throwaway import Throwaway, end_process

HOST = "127.0.0.1"
INSTALL_ROOT = Path("/usr/lib/postgresql")
INSTALL_HINT = "install PostgreSQL's server with `apt-get install postgresql` (Debian, Ubuntu)"
# A socket's path is <folder>/.s.PGSQL.<port> (up to 17 more bytes) and sun_path holds 107 bytes.
MAX_SOCKET_DIR_BYTES = 80
DATABASE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
LOG_TAIL_BYTES = 4000
# Start-up (initdb, then until it accepts connections) measured at 0.8 s with PostgreSQL 15 and
# fsync off; the bound is for loaded CI machines.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


class PostgresServerError(RuntimeError):
    """The server could not be set up, started or stopped; the message names the log to read."""


class PostgresNotInstalled(PostgresServerError):
    """PostgreSQL's server binaries (initdb, postgres) are not on this machine."""


class PostgresServer(Throwaway):
    """One PostgreSQL cluster in `folder`, served on 127.0.0.1:`port` while started.

    `port=None` picks a free port (bound on 127.0.0.1:0 and released just before the server binds
    it). `start` and `stop` are not thread-safe; call them from one thread (a pytest fixture).
    """

    def __init__(self, folder: Path, *, port: int | None = None, bin_dir: Path | None = None,
                 start_timeout_s: float = START_TIMEOUT_S, stop_timeout_s: float = STOP_TIMEOUT_S,
                 track_statements: bool = False, settings: dict[str, str] | None = None) -> None:
        self.folder = Path(folder).absolute()
        # pg_stat_statements loaded at start (benchmarks count statements); `enable_statement_stats`
        # then creates its view.
        self.track_statements = track_statements
        self.settings = dict(settings or {})  # more server settings (name: value), e.g. shared_buffers
        self.bin_dir = Path(bin_dir) if bin_dir is not None else self.find_binaries()
        self.port = port if port is not None else free_port()
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.log_path = self.folder / "postgres.log"
        self.initdb_log_path = self.folder / "initdb.log"
        self.account = server_account()
        self.user = self.account.pw_name
        self.startup_s: float | None = None  # initdb plus the wait until it accepts connections
        self._process: subprocess.Popen[bytes] | None = None
        self._scratch: Path | None = None  # the mkdtemp under /tmp, when one was needed
        self._data_dir: Path | None = None
        self._socket_dir: Path | None = None

    # -- binaries ------------------------------------------------------------------------------

    @staticmethod
    def find_binaries(root: Path = INSTALL_ROOT) -> Path:
        """The newest `<root>/<version>/bin` holding both initdb and postgres.

        Raises PostgresNotInstalled, saying how to install them, when there is none.
        """
        found: list[tuple[tuple[int, ...], Path]] = []
        for bin_dir in Path(root).glob("*/bin"):
            version = bin_dir.parent.name
            if not re.fullmatch(r"\d+(\.\d+)*", version):
                continue
            if all(os.access(bin_dir / name, os.X_OK) for name in ("initdb", "postgres")):
                found.append((tuple(int(part) for part in version.split(".")), bin_dir))
        if not found:
            raise PostgresNotInstalled(
                f"PostgreSQL's server binaries (initdb, postgres) were not found in {root}/*/bin: {INSTALL_HINT}")
        return max(found)[1]

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The server's PID while it is started, else None."""
        return self._process.pid if self._process is not None else None

    @property
    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Make the cluster (initdb) and start the server; return once it accepts connections.

        Raises PostgresServerError, with the log's tail, when initdb fails, when the server exits
        during start-up or when it does not accept connections within `start_timeout_s` (the
        server is then stopped and the scratch folder removed).
        """
        if self._process is not None:
            raise PostgresServerError(f"the server in {self.folder} is already started (PID {self.pid})")
        began = time.monotonic()
        try:
            self._make_cluster()
            self._launch()
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - began

    def stop(self) -> None:
        """Stop the server by its PID: SIGINT (fast shutdown, which ends open sessions), then
        SIGKILL if it has not exited within `stop_timeout_s`; then remove the scratch folder.
        Idempotent. The cluster and the logs stay in the folder for a post-mortem.
        """
        process, self._process = self._process, None
        if process is not None:
            end_process(process, signal.SIGINT, self.stop_timeout_s)
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    # -- databases -----------------------------------------------------------------------------

    def url(self, name: str) -> str:
        """The SQLAlchemy URL of database `name` on this server."""
        return f"postgresql+psycopg://{self.user}@{HOST}:{self.port}/{name}"

    def create_database(self, name: str) -> str:
        """Create database `name` (lower-case letters, digits, `_`) and return its SQLAlchemy URL.

        Raises ValueError for another name, psycopg's errors when it already exists.
        """
        self._admin(f'CREATE DATABASE "{checked_name(name)}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop database `name` if it exists, ending any sessions still open on it (FORCE)."""
        self._admin(f'DROP DATABASE IF EXISTS "{checked_name(name)}" WITH (FORCE)')

    def enable_statement_stats(self) -> None:
        """Create the pg_stat_statements view in the `postgres` database (it counts every
        database's statements). Raises PostgresServerError unless started with `track_statements`."""
        if not self.track_statements:
            raise PostgresServerError("pg_stat_statements needs a server started with track_statements=True")
        self._admin("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

    def _admin(self, statement: str) -> None:
        import psycopg  # the driver is a dev dependency, needed only once a server is used

        if not self.is_running:
            raise PostgresServerError(f"the server in {self.folder} is not running; see {self.log_path}")
        with psycopg.connect(host=HOST, port=self.port, user=self.user, dbname="postgres",
                             autocommit=True, connect_timeout=10) as conn:
            conn.execute(statement)

    # -- steps of start ------------------------------------------------------------------------

    def _make_cluster(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(self.folder, self.account.pw_uid, self.account.pw_gid)
        base = self.folder
        if not self._can_write(base):
            # As root under pytest's tmp folder (/tmp/pytest-of-root is 0700) the postgres user
            # cannot reach the folder at all, whoever owns it.
            base = self._scratch_dir()
        socket_dir = base / "run"
        if len(os.fsencode(socket_dir)) > MAX_SOCKET_DIR_BYTES:
            socket_dir = self._scratch_dir() / "run"
        socket_dir.mkdir(mode=0o700, exist_ok=True)
        self._give(socket_dir)
        self._data_dir = base / "data"
        self._socket_dir = socket_dir
        if (self._data_dir / "PG_VERSION").exists():
            return  # a cluster made by an earlier start of a server in this folder
        command = [str(self.bin_dir / "initdb"), "-D", str(self._data_dir), "--auth=trust",
                   "--encoding=UTF8", "--locale=C", f"--username={self.user}", "--no-sync",
                   "--no-instructions"]
        with open(self.initdb_log_path, "wb") as log:
            done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=self._env(),
                                  cwd=base, timeout=self.start_timeout_s, check=False,
                                  **self._as_server_user())
        if done.returncode != 0:
            raise PostgresServerError(
                f"initdb exited with {done.returncode}; see {self.initdb_log_path}:\n"
                f"{log_tail(self.initdb_log_path)}")
        # initdb's pg_hba.conf also trusts ::1 and replication; only local and 127.0.0.1 are wanted.
        (self._data_dir / "pg_hba.conf").write_text(
            "# chunkstore.testing.postgres: trust for the unix socket and 127.0.0.1 only\n"
            "local all all trust\n"
            f"host  all all {HOST}/32 trust\n")

    def _launch(self) -> None:
        if self._data_dir is None or self._socket_dir is None:
            raise PostgresServerError("no cluster to start")
        command = [str(self.bin_dir / "postgres"), "-D", str(self._data_dir), "-p", str(self.port),
                   "-c", f"listen_addresses={HOST}", "-c", f"unix_socket_directories={self._socket_dir}",
                   "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                   "-c", "logging_collector=off"]
        if self.track_statements:
            command += ["-c", "shared_preload_libraries=pg_stat_statements"]
        for name, value in self.settings.items():
            command += ["-c", f"{name}={value}"]
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, env=self._env(),
                                             cwd=self._data_dir.parent, **self._as_server_user())

    def _wait_until_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + self.start_timeout_s
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                code = self._process.returncode if self._process is not None else None
                raise PostgresServerError(
                    f"postgres exited with {code} during start-up (port {self.port}); see {self.log_path}:\n"
                    f"{log_tail(self.log_path)}")
            try:
                with psycopg.connect(host=HOST, port=self.port, user=self.user, dbname="postgres",
                                     connect_timeout=2):
                    return
            except psycopg.OperationalError as error:  # refused, or "the database system is starting up"
                last_error = error
            time.sleep(0.05)
        raise PostgresServerError(
            f"postgres (PID {self.pid}) did not accept connections on {HOST}:{self.port} within "
            f"{self.start_timeout_s:.0f} s (last error: {last_error}); see {self.log_path}:\n"
            f"{log_tail(self.log_path)}")

    # -- the server's OS user ------------------------------------------------------------------

    def _as_server_user(self) -> dict[str, object]:
        """subprocess arguments that run a child as the server's user (setuid in the child, no
        preexec function, which is unsafe with threads); nothing when already that user."""
        if os.geteuid() != 0:
            return {}
        return {"user": self.account.pw_uid, "group": self.account.pw_gid, "extra_groups": []}

    def _can_write(self, folder: Path) -> bool:
        if os.geteuid() != 0:
            return os.access(folder, os.W_OK | os.X_OK)
        test = shutil.which("test") or "/usr/bin/test"
        done = subprocess.run([test, "-w", str(folder), "-a", "-x", str(folder)], cwd="/", check=False,
                              **self._as_server_user())
        return done.returncode == 0

    def _give(self, folder: Path) -> None:
        if os.geteuid() == 0:
            os.chown(folder, self.account.pw_uid, self.account.pw_gid)

    def _scratch_dir(self) -> Path:
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="chunkstore-pg-", dir="/tmp"))
            self._give(self._scratch)
        return self._scratch

    def _env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
        env["LC_ALL"] = "C"  # messages in English, whatever locale the machine has (or lacks)
        return env


def server_account() -> pwd.struct_passwd:
    """The OS account the server runs as: `postgres` when running as root, else the current user."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid())
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresNotInstalled(
            f"PostgreSQL refuses to run as root and there is no `postgres` OS user: {INSTALL_HINT}, "
            "which creates it, or run the tests as another user") from None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (another process may take it before the server binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def checked_name(name: str) -> str:
    if not DATABASE_NAME.fullmatch(name):
        raise ValueError(f"database name {name!r}: use 1-63 lower-case letters, digits and '_', "
                         "starting with a letter or '_'")
    return name


def log_tail(path: Path, size_bytes: int = LOG_TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - size_bytes))
            return log.read().decode("utf-8", "replace")
    except OSError as error:
        return f"(the log could not be read: {error})"
