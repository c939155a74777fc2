"""What ``bench fleet --simulate-servers`` reads off the services while the fleet runs: the CPU
seconds of PostgreSQL, of the S3 server and of the machine (/proc), PostgreSQL's statements
(pg_stat_statements), its sessions and evictor-lock waiters (pg_stat_activity, sampled), and
radosgw's request counters (its admin socket).

Invariants: every probe reads and changes nothing the fleet uses (resetting pg_stat_statements
aside, which only the bench reads); CPU seconds of PostgreSQL include its exited backends (the
postmaster's reaped children); a probe that cannot be read says None, never a guess.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import threading
from dataclasses import dataclass

from chunkstore.disk.index import EVICTOR_LOCK_KEY, LOOKUP_SQL

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
SAMPLE_EVERY_S = 0.1


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def process_cpu_s(pids: list[int]) -> float:
    """User and system CPU seconds of the live processes ``pids``."""
    total = 0
    for pid in pids:
        if (fields := _stat_fields(pid)) is not None:
            total += int(fields[11]) + int(fields[12])
    return total * _TICK_S


def tree_cpu_s(root_pid: int) -> float:
    """CPU seconds of ``root_pid``, its live children and its reaped ones (PostgreSQL's postmaster
    and its backends, those that exited included)."""
    total = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(int(entry))) is not None:
            if int(entry) == root_pid:
                total += sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
            elif int(fields[1]) == root_pid:
                total += int(fields[11]) + int(fields[12])
    return total * _TICK_S


def machine_busy_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, every core summed."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values) - idle) * _TICK_S, sum(values) * _TICK_S


def _normalised(query: str) -> str:
    """A statement's text without its parameters' names (``$1`` as pg_stat_statements shows them,
    ``%b`` as the store sends them) and with its spaces folded."""
    return " ".join(query.replace("%b", "$1").split())


_LOOKUP = _normalised(LOOKUP_SQL)


class StatementCounts:
    """pg_stat_statements of one database, through a connection of the bench's own (direct, to the
    server's ``postgres`` database, which holds the view)."""

    def __init__(self, admin_url: str, database: str):
        import psycopg
        from sqlalchemy.engine import make_url

        url = make_url(admin_url)
        self._conn = psycopg.connect(host=url.host, port=url.port, user=url.username, dbname="postgres",
                                     autocommit=True, prepare_threshold=None)
        self.database = database

    def reset(self) -> None:
        self._conn.execute("SELECT pg_stat_statements_reset()")

    def read(self, top: int = 10) -> dict:
        """Calls of every statement in the database since the reset, the ``top`` most called, and
        the prefix lookup's own execution times in the database (``lookup``: its calls and mean,
        standard deviation and largest in ms; None before any lookup)."""
        rows = self._conn.execute(
            "SELECT query, calls, total_exec_time, mean_exec_time, stddev_exec_time, max_exec_time "
            "FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname = %s ORDER BY calls DESC", [self.database]).fetchall()
        lookups = [r for r in rows if _normalised(r[0]) == _LOOKUP]
        return {"calls": sum(r[1] for r in rows), "exec_ms": sum(r[2] for r in rows),
                "top": [{"query": " ".join(r[0].split())[:160], "calls": r[1]} for r in rows[:top]],
                "lookup": None if not lookups else
                {"calls": lookups[0][1], "mean_ms": lookups[0][3], "stddev_ms": lookups[0][4], "max_ms": lookups[0][5]}}

    def close(self) -> None:
        self._conn.close()


@dataclass(frozen=True, slots=True)
class ActivitySummary:
    samples: int
    max_connections: int
    mean_connections: float
    waiting_share: float  # of samples, those with a session waiting for the evictor lock
    mean_waiting: float  # sessions waiting for it, on average
    held_share: float  # of samples, those with the evictor lock held: its utilisation


class ActivitySampler:
    """Samples pg_stat_activity and pg_locks of one database every SAMPLE_EVERY_S on a thread of
    its own: the sessions open, those waiting for the evictor lock, and whether it is held."""

    def __init__(self, admin_url: str, database: str):
        import psycopg
        from sqlalchemy.engine import make_url

        url = make_url(admin_url)
        self._conn = psycopg.connect(host=url.host, port=url.port, user=url.username, dbname="postgres",
                                     autocommit=True, prepare_threshold=None)
        self.database = database
        self._samples: list[tuple[int, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-activity", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        # A bigint advisory key shows in pg_locks as its high and low 32 bits (objsubid 1).
        query = ("SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = %(db)s), "
                 "count(*) FILTER (WHERE NOT granted), count(*) FILTER (WHERE granted) FROM pg_locks "
                 "WHERE locktype = 'advisory' AND objsubid = 1 AND classid = %(high)s AND objid = %(low)s "
                 "AND database = (SELECT oid FROM pg_database WHERE datname = %(db)s)")
        key = {"db": self.database, "high": EVICTOR_LOCK_KEY >> 32, "low": EVICTOR_LOCK_KEY & 0xFFFFFFFF}
        while not self._stop.wait(SAMPLE_EVERY_S):
            self._samples.append(self._conn.execute(query, key).fetchone())

    def stop(self) -> ActivitySummary:
        self._stop.set()
        self._thread.join()
        self._conn.close()
        s = self._samples or [(0, 0, 0)]
        return ActivitySummary(samples=len(self._samples), max_connections=max(c for c, _, _ in s),
                               mean_connections=sum(c for c, _, _ in s) / len(s),
                               waiting_share=sum(1 for _, w, _ in s if w) / len(s),
                               mean_waiting=sum(w for _, w, _ in s) / len(s),
                               held_share=sum(1 for _, _, h in s if h) / len(s))


def rgw_counters(gateway) -> dict | None:
    """radosgw's request counters (``req``, ``get``, ``put``) from its admin socket, or None when
    ``gateway`` is not a RadosGateway or the socket cannot be read (moto counts nothing)."""
    pid = getattr(gateway, "gateway_pid", None)
    folder = getattr(gateway, "folder", None)
    if pid is None or folder is None:
        return None
    sockets = glob.glob(str(folder / "run" / f"client.rgw.*.{pid}.asok"))
    if not sockets:
        return None
    try:
        done = subprocess.run(["ceph", "--admin-daemon", sockets[0], "perf", "dump"], capture_output=True,
                              text=True, timeout=30, check=True)
        rgw = json.loads(done.stdout)["rgw"]
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        return None
    return {name: int(rgw[name]) for name in ("req", "get", "put")}


def s3_pids(gateway) -> list[int]:
    """The S3 server's processes: radosgw and its cluster's daemons, or moto's server."""
    pids = getattr(gateway, "pids", None)
    if isinstance(pids, dict):
        return list(pids.values())
    return [gateway.pid] if getattr(gateway, "pid", None) else []

