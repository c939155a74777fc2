"""A throwaway Ceph RADOS Gateway for tests: a real S3 server (radosgw) on a one-OSD cluster, all
child processes of this one.

The cluster is one monitor, one OSD on the in-memory objectstore (memstore) and one radosgw with
the beast frontend, made from scratch in `folder` on every start (a fresh fsid and fresh cephx
keys; cephx is required of every daemon and client), then one S3 user with known keys.

Invariants:
- Everything listens on 127.0.0.1 only (the monitor on msgr2 only, the OSD on ports Ceph picks in
  6800-7300, the gateway on `port`).
- Each daemon runs in the foreground (`-d`, its output in `folder/log/<daemon>.log`) and is stopped
  by the PID it was started with (SIGTERM, then SIGKILL after `stop_timeout_s`), the gateway
  first and the monitor last; never by name, never through systemd.
- Every daemon and tool gets `-c folder/ceph.conf`, its own keyring path and paths for its data,
  logs, crash dumps and sockets: nothing is read from /etc/ceph and nothing is written outside
  `folder` except one private `mkdtemp` under /tmp (the sockets' folder, when `folder`'s path is
  too long for a unix socket), which `stop` removes.
- `stop` is idempotent and also undoes a `start` that failed halfway. The data lives in the OSD's
  memory (about twice the bytes stored; `store_size_bytes` is the capacity the OSD reports):
  `stop_gateway` / `start_gateway` take the gateway away and bring it back on the same port with
  the same buckets and objects; after `stop` a new `start` begins an empty cluster.

    with RadosGateway(tmp_path / "rgw") as rgw:
        rgw.create_bucket("chunks")
        ObjectPayloads(rgw.config("s3://chunks/prefix"))
        rgw.stop_gateway()    # requests now fail with a connection error
        rgw.start_gateway()   # the same objects again
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from datetime import datetime, timezone
from pathlib import Path

from chunkstore.testing.postgres import HOST, free_port, log_tail
from chunkstore.testing.s3 import S3Endpoint
from chunkstore.testing.throwaway import Throwaway, end_process

DEFAULT_BIN_DIR = Path("/usr/bin")
BINARIES = ("ceph-authtool", "monmaptool", "ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph")
INSTALL_HINT = ("install Ceph's monitor, OSD and gateway with `DEBIAN_FRONTEND=noninteractive "
                "apt-get install -y ceph-mon ceph-osd radosgw ceph-common` (Debian, Ubuntu)")
# An admin socket is <run dir>/client.rgw.gw.<pid up to 7 digits>.asok (27 more bytes at most) and
# sun_path holds 107 bytes.
MAX_RUN_DIR_BYTES = 72
MON_ID = "a"
OSD_ID = 0
GATEWAY_NAME = "client.rgw.gw"
ADMIN_NAME = "client.admin"
OSD_UP_LINE = b"state: booting -> active"  # what ceph-osd logs once the monitor marks it up
STORE_SIZE_BYTES = 2 << 30  # what memstore reports as the OSD's capacity; memory is used as data comes
USER_ID = "chunkstore"
ACCESS_KEY_ID = "CHUNKSTORETESTKEY000"
SECRET_ACCESS_KEY = "chunkstore-test-secret-key-0000000000000"
REGION = "us-east-1"  # RGW signs with the request's region; its default zonegroup takes any
# Start-up measured at 1.8-2.5 s on 2 cores with Ceph 16.2: 0.6 s keys and monmap (8 tool runs),
# 0.4 s `ceph osd new`, 0.3 s the OSD's mkfs and boot, 0.5 s the gateway making its pools (one OSD
# map epoch each, hence paxos_propose_interval), 0.2 s the user; the bound is for loaded CI machines.
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 15.0
TOOL_TIMEOUT_S = 60.0
POLL_S = 0.05
MAX_ERROR_LINES = 20  # of a daemon that exits during start-up, quoted in the error


class RadosGatewayError(RuntimeError):
    """The cluster or the gateway could not be set up, started or stopped; the message names the log
    to read."""


class RadosGatewayNotInstalled(RadosGatewayError):
    """Ceph's binaries (ceph-mon, ceph-osd, radosgw, radosgw-admin, ceph-authtool, ...) are missing."""


class RadosGateway(Throwaway, S3Endpoint):
    """One Ceph cluster (mon, memstore OSD, radosgw) in `folder`, its S3 API on 127.0.0.1:`port`.

    `port=None` picks a free port (bound on 127.0.0.1:0 and released just before the gateway binds
    it). `bin_dir` is where the Ceph binaries are (default: the folder of `radosgw` on PATH, else
    /usr/bin). `start`, `stop`, `stop_gateway` and `start_gateway` are not thread-safe; call them
    from one thread (a pytest fixture, the test itself).
    """

    def __init__(self, folder: Path, *, port: int | None = None, bin_dir: Path | None = None,
                 access_key_id: str = ACCESS_KEY_ID, secret_access_key: str = SECRET_ACCESS_KEY,
                 store_size_bytes: int = STORE_SIZE_BYTES, start_timeout_s: float = START_TIMEOUT_S,
                 stop_timeout_s: float = STOP_TIMEOUT_S) -> None:
        self.folder = Path(folder).absolute()
        self.bin_dir = self.find_binaries(bin_dir)
        self.port = port if port is not None else free_port()
        self.endpoint_url = f"http://{HOST}:{self.port}"
        self.user_id = USER_ID
        self.access_key_id = access_key_id
        self.secret_access_key = secret_access_key
        self.region = REGION
        self.store_size_bytes = store_size_bytes
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.conf_path = self.folder / "ceph.conf"
        self.log_dir = self.folder / "log"
        self.setup_log_path = self.log_dir / "setup.log"  # every tool's command line and output
        self.mon_log_path = self.log_dir / "mon.log"
        self.osd_log_path = self.log_dir / "osd.log"
        self.gateway_log_path = self.log_dir / "radosgw.log"
        self.startup_s: float | None = None  # from nothing to the user listing its buckets
        self.gateway_startup_s: float | None = None  # the last start of the gateway alone
        self._processes: dict[str, subprocess.Popen[bytes]] = {}  # in start order: mon, osd, rgw
        self._log_starts: dict[str, int] = {}  # where each daemon's last launch begins in its log
        self._scratch: Path | None = None  # the mkdtemp under /tmp, when one was needed
        self._run_dir: Path | None = None
        self._fsid = ""  # the cluster's, fresh on every start
        self._mon_port = 0

    # -- binaries ------------------------------------------------------------------------------

    @staticmethod
    def find_binaries(bin_dir: Path | None = None) -> Path:
        """The folder holding every Ceph binary this class runs (`BINARIES`).

        Raises RadosGatewayNotInstalled, naming the missing ones and how to install them.
        """
        if bin_dir is None:
            found = shutil.which("radosgw")
            bin_dir = Path(found).parent if found else DEFAULT_BIN_DIR
        bin_dir = Path(bin_dir)
        missing = [name for name in BINARIES if not os.access(bin_dir / name, os.X_OK)]
        if missing:
            raise RadosGatewayNotInstalled(
                f"Ceph's binaries {', '.join(missing)} were not found in {bin_dir}: {INSTALL_HINT}")
        return bin_dir

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def pids(self) -> dict[str, int]:
        """The PIDs of the daemons started and not yet stopped, by daemon (mon, osd, rgw)."""
        return {name: process.pid for name, process in self._processes.items()}

    @property
    def is_running(self) -> bool:
        """Whether the monitor, the OSD and the gateway are all alive."""
        return all(self._alive(name) for name in ("mon", "osd", "rgw"))

    @property
    def gateway_pid(self) -> int | None:
        process = self._processes.get("rgw")
        return process.pid if process is not None else None

    def start(self) -> None:
        """Make a new cluster in `folder`, start its daemons and the S3 user; return once the user
        lists its buckets.

        Raises RadosGatewayError, with the tail of the log to read, when a tool fails, a daemon
        exits during start-up or the gateway does not serve the user within `start_timeout_s`
        (everything started is then stopped and the scratch folder removed).
        """
        if self._processes:
            raise RadosGatewayError(f"the cluster in {self.folder} is already started (PIDs {self.pids})")
        began = time.monotonic()
        deadline = began + self.start_timeout_s
        try:
            self._make_folder()
            self._write_conf()
            self._make_keys(deadline)
            self._start_monitor(deadline)
            self._start_osd(deadline)
            self._wait_for_osd(deadline)
            self._launch_gateway()
            self._wait_for_http(deadline)
            self._create_user(deadline)
            self._wait_for_user(deadline)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - began
        self.gateway_startup_s = self.startup_s

    def stop(self) -> None:
        """Stop every daemon by its PID, the gateway first and the monitor last (SIGTERM, then
        SIGKILL after `stop_timeout_s`); then remove the scratch folder. Idempotent. The
        configuration and the logs stay in the folder for a post-mortem.
        """
        for name in reversed(list(self._processes)):
            self._stop_daemon(name, signal.SIGTERM)
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
            self._run_dir = None

    def stop_gateway(self, *, kill: bool = False) -> None:
        """Stop the gateway alone (SIGTERM, or SIGKILL when `kill`): the S3 endpoint goes away and
        requests fail with a connection error, while the cluster keeps the data. Idempotent."""
        self._stop_daemon("rgw", signal.SIGKILL if kill else signal.SIGTERM)

    def start_gateway(self) -> None:
        """Start the gateway again on the same port over the same cluster; return once the user
        lists its buckets. Raises RadosGatewayError (with the gateway's log) as `start` does, and
        leaves the gateway stopped then."""
        if not (self._alive("mon") and self._alive("osd")):
            raise RadosGatewayError(f"the cluster in {self.folder} is not running (PIDs {self.pids}); "
                                    f"start it with start(); see {self.mon_log_path} and {self.osd_log_path}")
        if self._alive("rgw"):
            raise RadosGatewayError(f"the gateway is already started (PID {self.gateway_pid})")
        self._stop_daemon("rgw", signal.SIGKILL)  # reaps a gateway that exited by itself
        began = time.monotonic()
        deadline = began + self.start_timeout_s
        try:
            self._launch_gateway()
            self._wait_for_http(deadline)
            self._wait_for_user(deadline)
        except BaseException:
            self.stop_gateway(kill=True)
            raise
        self.gateway_startup_s = time.monotonic() - began

    # -- S3 ------------------------------------------------------------------------------------

    def client(self, **config_options):
        """A boto3 S3 client for the user (path-style addressing; checksums only where S3 requires
        them, since RGW 16.2 does not read the trailing checksums boto3 sends by default).
        `config_options` go to botocore's Config (e.g. retries, connect_timeout)."""
        import boto3
        from botocore.config import Config

        options = {"s3": {"addressing_style": "path"}, "request_checksum_calculation": "when_required",
                   "response_checksum_validation": "when_required"}
        options.update(config_options)
        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region,
                            aws_access_key_id=self.access_key_id,
                            aws_secret_access_key=self.secret_access_key, config=Config(**options))

    # -- steps of start ------------------------------------------------------------------------

    def _make_folder(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        for old in ("mon", "osd", "rgw", "run"):  # a cluster is made anew on every start
            shutil.rmtree(self.folder / old, ignore_errors=True)
        for sub in ("mon", f"osd/ceph-{OSD_ID}", "rgw", "crash", "log"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        run_dir = self.folder / "run"
        if len(os.fsencode(run_dir)) > MAX_RUN_DIR_BYTES:
            self._scratch = Path(tempfile.mkdtemp(prefix="chunkstore-rgw-", dir="/tmp"))
            run_dir = self._scratch / "run"
        run_dir.mkdir(mode=0o700)
        self._run_dir = run_dir

    def _write_conf(self) -> None:
        self._fsid, self._mon_port = str(uuid.uuid4()), free_port()
        self.conf_path.write_text(ceph_conf(
            folder=self.folder, run_dir=self._run_dir or self.folder / "run", fsid=self._fsid,
            mon_port=self._mon_port, gateway_port=self.port, store_size_bytes=self.store_size_bytes))

    def _make_keys(self, deadline: float) -> None:
        caps = {
            "mon.": ["--cap", "mon", "allow *"],
            ADMIN_NAME: ["--cap", "mon", "allow *", "--cap", "osd", "allow *", "--cap", "mgr", "allow *"],
            f"osd.{OSD_ID}": ["--cap", "mon", "allow profile osd", "--cap", "mgr", "allow profile osd",
                              "--cap", "osd", "allow *"],
            GATEWAY_NAME: ["--cap", "mon", "allow rw", "--cap", "osd", "allow rwx"],
        }
        for name, cap_args in caps.items():
            self._tool(deadline, "ceph-authtool", "--create-keyring", str(self._keyring(name)),
                       "--gen-key", "-n", name, *cap_args)
        for name in (ADMIN_NAME, f"osd.{OSD_ID}", GATEWAY_NAME):  # the monitor's mkfs imports them all
            self._tool(deadline, "ceph-authtool", str(self._keyring("mon.")), "--import-keyring",
                       str(self._keyring(name)))

    def _start_monitor(self, deadline: float) -> None:
        monmap = self.folder / "monmap"
        monmap.unlink(missing_ok=True)
        self._tool(deadline, "monmaptool", "--create", "--fsid", self._fsid,
                   "--addv", MON_ID, f"[v2:{HOST}:{self._mon_port}]", str(monmap))
        self._tool(deadline, "ceph-mon", "-c", str(self.conf_path), "--mkfs", "-i", MON_ID,
                   "--monmap", str(monmap), "--keyring", str(self._keyring("mon.")))
        self._launch("mon", ["ceph-mon", "-i", MON_ID, "--keyring", str(self._keyring("mon."))],
                     self.mon_log_path)

    def _start_osd(self, deadline: float) -> None:
        osd_uuid = str(uuid.uuid4())
        # `ceph` waits for the monitor's quorum (up to --connect-timeout) and registers the OSD.
        self._tool(deadline, "ceph", "-c", str(self.conf_path), "-n", ADMIN_NAME, "--keyring",
                   str(self._keyring(ADMIN_NAME)), "--connect-timeout", str(max(1, int(self._left_s(deadline)))),
                   "osd", "new", osd_uuid, str(OSD_ID))
        self._tool(deadline, "ceph-osd", "-c", str(self.conf_path), "-i", str(OSD_ID), "--mkfs",
                   "--osd-uuid", osd_uuid, "--keyring", str(self._keyring(f"osd.{OSD_ID}")))
        self._launch("osd", ["ceph-osd", "-i", str(OSD_ID), "--keyring", str(self._keyring(f"osd.{OSD_ID}"))],
                     self.osd_log_path)

    def _wait_for_osd(self, deadline: float) -> None:
        """Until the OSD is up in the OSD map (its log says so). A gateway started sooner makes its
        first pool while no OSD is up, and its first writes then wait for the objecter's 5 s tick."""
        offset = self._log_starts["osd"]  # the log is appended to: what an earlier start wrote is old
        while time.monotonic() < deadline:
            self._check_alive()
            with open(self.osd_log_path, "rb") as log:
                log.seek(offset)
                seen = log.read()
            if OSD_UP_LINE in seen:
                return
            offset += max(0, len(seen) - len(OSD_UP_LINE))  # the line may be half written
            time.sleep(POLL_S)
        self._timed_out(f"osd.{OSD_ID} (PID {self._processes['osd'].pid}) did not come up", None,
                        self.osd_log_path)

    def _launch_gateway(self) -> None:
        self._launch("rgw", ["radosgw", "-n", GATEWAY_NAME, "--keyring", str(self._keyring(GATEWAY_NAME))],
                     self.gateway_log_path)

    def _wait_for_http(self, deadline: float) -> None:
        """Until the gateway answers an anonymous GET / (it binds its port only once its pools and
        zone are ready)."""
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(f"{self.endpoint_url}/", timeout=2) as answer:
                    answer.read()
                return
            except urllib.error.HTTPError:
                return  # any HTTP answer is the gateway's
            except OSError as error:  # refused while it makes its pools
                last_error = error
            time.sleep(POLL_S)
        self._timed_out(f"radosgw (PID {self.gateway_pid}) did not answer on {self.endpoint_url}",
                        last_error, self.gateway_log_path)

    def _create_user(self, deadline: float) -> None:
        self._tool(deadline, "radosgw-admin", "-c", str(self.conf_path), "-n", ADMIN_NAME, "--keyring",
                   str(self._keyring(ADMIN_NAME)), "user", "create", f"--uid={self.user_id}",
                   f"--display-name={self.user_id}", f"--access-key={self.access_key_id}",
                   f"--secret={self.secret_access_key}")

    def _wait_for_user(self, deadline: float) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10)
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                client.list_buckets()
                return
            except (BotoCoreError, ClientError) as error:  # refused, or the user not yet seen
                last_error = error
            time.sleep(POLL_S)
        self._timed_out(f"the user {self.user_id} could not list its buckets on {self.endpoint_url}",
                        last_error, self.gateway_log_path)

    # -- processes -----------------------------------------------------------------------------

    def _launch(self, name: str, command: list[str], log_path: Path) -> None:
        argv = [str(self.bin_dir / command[0]), "-c", str(self.conf_path), "-d", *command[1:]]
        with open(log_path, "ab") as log:
            log.write(f"--- {timestamp()} {' '.join(argv)}\n".encode())
            log.flush()
            self._log_starts[name] = log.tell()
            # A session of its own: a Ctrl-C in the test's terminal does not reach the daemons
            # all at once, so `stop` still stops them in order.
            self._processes[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                                     stderr=subprocess.STDOUT, env=ceph_env(),
                                                     cwd=self.folder, start_new_session=True)

    def _stop_daemon(self, name: str, first_signal: signal.Signals) -> None:
        process = self._processes.pop(name, None)
        if process is None:
            return
        end_process(process, first_signal, self.stop_timeout_s)

    def _alive(self, name: str) -> bool:
        process = self._processes.get(name)
        return process is not None and process.poll() is None

    def _check_alive(self) -> None:
        logs = {"mon": self.mon_log_path, "osd": self.osd_log_path, "rgw": self.gateway_log_path}
        for name, process in self._processes.items():
            if process.poll() is not None:
                errors = error_lines(logs[name], self._log_starts.get(name, 0))
                # (radosgw exits with EADDRINUSE for a taken port, or now and then crashes on its way out)
                taken = name == "rgw" and port_taken(self.port)
                why = f"; port {self.port} is taken by another process" if taken else ""
                raise RadosGatewayError(
                    f"{name} (PID {process.pid}) exited with {exit_meaning(process.returncode)} during start-up"
                    f"{why}; see {logs[name]}; its errors:\n{errors}\nthe log's end:\n{log_tail(logs[name])}")

    def _tool(self, deadline: float, tool: str, *args: str) -> None:
        """Run one Ceph tool to completion, its command line and output appended to the setup log."""
        argv = [str(self.bin_dir / tool), *args]
        timeout_s = min(TOOL_TIMEOUT_S, self._left_s(deadline))
        with open(self.setup_log_path, "ab") as log:
            log.write(f"--- {timestamp()} {' '.join(argv)}\n".encode())
            log.flush()
            try:
                done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                      env=ceph_env(), cwd=self.folder, timeout=timeout_s, check=False)
            except subprocess.TimeoutExpired:
                raise RadosGatewayError(f"{tool} did not finish within {timeout_s:.0f} s; see "
                                        f"{self.setup_log_path}:\n{log_tail(self.setup_log_path)}") from None
        if done.returncode != 0:
            raise RadosGatewayError(f"{tool} exited with {done.returncode}; see {self.setup_log_path}:\n"
                                    f"{log_tail(self.setup_log_path)}")

    def _timed_out(self, what: str, last_error: Exception | None, log_path: Path) -> None:
        because = f" (last error: {last_error})" if last_error is not None else ""
        raise RadosGatewayError(f"{what} within {self.start_timeout_s:.0f} s{because}; see {log_path}:\n"
                                f"{log_tail(log_path)}")

    def _left_s(self, deadline: float) -> float:
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            raise RadosGatewayError(f"the cluster in {self.folder} did not start within "
                                    f"{self.start_timeout_s:.0f} s; see {self.setup_log_path}")
        return left_s

    def _keyring(self, name: str) -> Path:
        return self.folder / f"{name.rstrip('.')}.keyring"


def ceph_conf(*, folder: Path, run_dir: Path, fsid: str, mon_port: int, gateway_port: int,
              store_size_bytes: int) -> str:
    """ceph.conf of a one-OSD cluster in `folder`: 127.0.0.1 only (msgr2 only), cephx, memstore,
    pools of one replica (size 1 needs mon_allow_pool_size_one), 8 PGs a pool without the
    autoscaler (there is no ceph-mgr), and the monitor's proposal interval short: every pool the
    gateway makes at its first start costs an OSD map epoch, and at the default 1 s the start-up
    took 12 s instead of 2 s. The disk-space checks are off (mon_data_avail_*: the monitor's store
    is tiny, and at the default 5 % free a full CI disk would stop it), the gateway waits at most
    1 s for requests in flight when stopped (at 5 s, a stop of a gateway that had served a
    client took the whole 5 s), and paths for every file and socket are in `folder`
    or `run_dir`, none under /var or /etc."""
    return f"""# chunkstore.testing.radosgw: a throwaway one-OSD cluster; made anew on every start
[global]
fsid = {fsid}
mon_host = v2:{HOST}:{mon_port}
public_addr = {HOST}
cluster_addr = {HOST}
ms_bind_msgr1 = false
ms_bind_msgr2 = true
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
auth_allow_insecure_global_id_reclaim = false
run_dir = {run_dir}
admin_socket = $run_dir/$name.$pid.asok
crash_dir = {folder}/crash
log_file = {folder}/log/$name.log
mon_cluster_log_file = {folder}/log/cluster.log
osd_pool_default_size = 1
osd_pool_default_min_size = 1
mon_allow_pool_size_one = true
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
mon_max_pg_per_osd = 1000
osd_crush_chooseleaf_type = 0
paxos_propose_interval = 0.01
paxos_min_wait = 0.001
mon_data_avail_warn = 1
mon_data_avail_crit = 0

[mon]
mon_data = {folder}/mon/$cluster-$id

[osd]
osd_data = {folder}/osd/$cluster-$id
osd_objectstore = memstore
memstore_device_bytes = {store_size_bytes}
osd_op_num_shards = 2
osd_op_num_threads_per_shard = 2

[{GATEWAY_NAME}]
rgw_data = {folder}/rgw
rgw_frontends = beast endpoint={HOST}:{gateway_port}
rgw_enable_apis = s3, admin
rgw_thread_pool_size = 64
rgw_exit_timeout_secs = 1
rgw_gc_obj_min_wait = 60
rgw_gc_processor_period = 60
"""


def port_taken(port: int) -> bool:
    """Whether another process listens on ``port`` of the loopback address (a bind there fails)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (a closed connection's TIME_WAIT does not count)
        try:
            probe.bind((HOST, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def exit_meaning(returncode: int) -> str:
    """A daemon's exit status, with the errno it names: Ceph's daemons exit with the error that
    stopped them (radosgw with 98, EADDRINUSE, for a taken port), and may exit before their log
    thread has written the line that says so."""
    name = errno.errorcode.get(returncode) if returncode > 1 else None
    return f"{returncode} ({name}: {os.strerror(returncode)})" if name else str(returncode)


def error_lines(path: Path, offset: int, max_lines: int = MAX_ERROR_LINES) -> str:
    """The first `max_lines` error lines (Ceph's level -1) in `path` from `offset` on: what a daemon
    said before it exited, which the tail alone can miss (radosgw may dump a crash on its way out)."""
    found: list[str] = []
    try:
        with open(path, "rb") as log:
            log.seek(offset)
            for raw in log:  # bounded by the file; stops at max_lines
                fields = raw.decode("utf-8", "replace").split(maxsplit=3)
                if len(fields) == 4 and fields[2] == "-1" and fields[0][:1].isdigit():
                    found.append(" ".join(fields).rstrip())
                    if len(found) >= max_lines:
                        break
    except OSError as error:
        return f"(the log could not be read: {error})"
    return "\n".join(found) or "(none logged)"


def timestamp() -> str:
    """Now, to the millisecond, in the form Ceph's own logs use (UTC)."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def ceph_env() -> dict[str, str]:
    """The environment of Ceph's daemons and tools: no CEPH_ARGS or CEPH_CONF from outside, messages
    in English."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("CEPH_")}
    env["LC_ALL"] = "C"
    return env
