"""A crash soak for a shared tier (tests/test_shared_crash.py): writer processes on a store of the
tier (its index in PostgreSQL, its payloads in a bucket), SIGKILLed at random points, and the
checks run after each kill.

chunkstore/testing/crash_soak.py's soak opens folder stores only (``run_writer`` and
``run_crash_cycles`` take a folder); this one reuses its steps, pages and checks (``plan``,
``chain_for``, ``expected_page``, ``check_store``) on the tier's stores, and adds the tier's own
invariants: a dead writer's claims lapse, and once the sweeper has run, no claim is left and the
bucket holds exactly one object per row.

Writers are forked by one server process that imported torch and the store once (as the folder
soak's fork server does), so a cycle costs a fork, not the seconds of an interpreter's imports:

    python -m tests.helpers.shared_soak     # reads one JSON request a line on stdin (ForkServer)

Each request names a job (JOBS): ``soak`` (the soak's writer), ``stall`` (a put whose rows wait
forever after its uploads), ``die_in_first_migration`` (an open that SIGKILLs itself half way
through creating the index's tables).
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from chunkstore.disk.store import ChunkStore
from chunkstore.testing import crash_soak as soak
from tests.helpers.crash import die_in_the_first_migration

REPO_ROOT = Path(__file__).resolve().parents[2]
_REPLY_TIMEOUT_S = 120.0


# -- the tier, as a child process reaches it --------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Tier:
    """What a process needs to open a store of the tier (JSON-able, for the fork server)."""

    index_url: str
    bucket_url: str
    endpoint_url: str
    region: str
    access_key_id: str
    secret_access_key: str

    @classmethod
    def of(cls, index_url: str, bucket_url: str, s3) -> "Tier":
        return cls(index_url, bucket_url, s3.endpoint_url, s3.region, s3.access_key_id, s3.secret_access_key)

    def open(self, folder: str | os.PathLike, **kwargs) -> ChunkStore:
        """A store of the soak's model on this tier, in ``folder``."""
        from chunkstore.disk.objects import ObjectPayloads, ObjectStoreConfig

        config = ObjectStoreConfig(self.bucket_url, endpoint_url=self.endpoint_url, region=self.region,
                                   access_key_id=self.access_key_id, secret_access_key=self.secret_access_key)
        return ChunkStore(folder, soak.SOAK_IDENTITY, index_url=self.index_url, payloads=ObjectPayloads(config),
                          **kwargs)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()  # one write per line: the parent reads what got out before the kill


# -- the jobs (run in a forked child) ---------------------------------------------------------

def soak_writer(folder: str, tier: dict, seed: int, *, claim_ttl_s: float = 0.3,
                capacity_bytes: int = soak.DEFAULT_CAPACITY_BYTES, max_steps: int | None = None,
                say: Callable[[str], None] = _say) -> int:
    """crash_soak.run_writer on the tier: the steps of ``plan(seed)``, one JSON line per step done,
    until killed (or ``max_steps``). Its claims lapse ``claim_ttl_s`` after they are made, so that
    the checker finds a dead writer's claims lapsed soon after the kill. Returns 3 on wrong bytes."""
    say(soak.READY_LINE)
    with Tier(**tier).open(folder, capacity_bytes=capacity_bytes, claim_ttl_s=claim_ttl_s, num_workers=2) as store:
        say("open")
        return soak.run_steps(store, seed, max_steps=max_steps, say=say)


def stall_writer(folder: str, tier: dict, digits: list[int], claim_ttl_s: float = 0.5) -> int:
    """A put of ``chain_for("default", digits)`` whose uploads go through and whose rows wait for
    ever (an index whose inserts are held): the parent kills it there."""
    from tests.helpers.faults import IndexFaults, faulty_index

    faults = IndexFaults(hold_inserts=threading.Event())  # never set
    store = Tier(**tier).open(folder, claim_ttl_s=claim_ttl_s, num_workers=2, index_factory=faulty_index(faults))
    _say("open")
    pages = soak.chain_for("default", tuple(digits))
    store.put(pages, [soak.expected_page(p.key) for p in pages])
    return 1  # never reached: the rows wait until the kill


def die_in_first_migration(folder: str, tier: dict) -> int:
    """Open a store on a tier whose database has no tables yet, SIGKILLing this process on the
    second index the first migration creates (as tests/test_crash.py::test_kill_during_first_
    migration does on SQLite)."""
    die_in_the_first_migration()
    Tier(**tier).open(folder)
    return 1  # not reached


JOBS: dict[str, Callable[..., int]] = {"soak": soak_writer, "stall": stall_writer,
                                       "die_in_first_migration": die_in_first_migration}


def serve_forks() -> int:
    """Read one JSON request a line from stdin ({"job", "kwargs", "stdout", "stderr"}); fork a child
    that runs the job with its output in those files; reply 'pid N', reap it, reply 'exit CODE'.
    Only imports happen here before forking: no threads, no connections."""
    import alembic.op  # noqa: F401  (imported once, before the forks)
    import torch  # noqa: F401

    import chunkstore.disk.maintenance  # noqa: F401
    import chunkstore.disk.objects  # noqa: F401
    import tests.helpers.faults  # noqa: F401

    print("ready", flush=True)
    return soak.serve_fork_requests(lambda req: JOBS[req["job"]](**req["kwargs"]))


# -- the parent's side ------------------------------------------------------------------------

def _pump(stream, sink: queue.Queue) -> None:
    for raw in stream:
        sink.put(raw.decode(errors="replace").rstrip("\n"))
    sink.put(None)  # EOF


@dataclasses.dataclass
class Child:
    """A forked job: its PID, where its output goes, and its exit code once reaped."""

    pid: int
    stdout: Path
    stderr: Path
    returncode: int | None = None

    def lines(self) -> list[str]:
        return self.stdout.read_text(errors="replace").splitlines()

    def errors(self) -> str:
        return self.stderr.read_text(errors="replace")[-3000:]


class ForkServer:
    """`python -m tests.helpers.shared_soak` (see serve_forks), one child at a time. ``close``
    ends it (end of input, then SIGKILL by its PID if it does not exit)."""

    def __init__(self, scratch: Path):
        self.scratch = Path(scratch)
        self.scratch.mkdir(parents=True, exist_ok=True)
        self._err = open(self.scratch / "fork-server.err", "w+b")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.shared_soak"], cwd=REPO_ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err)
        self._replies: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(self.proc.stdout, self._replies), daemon=True).start()
        self._reply("ready", exact=True)
        self._n = 0

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._err.close()

    def _reply(self, what: str, exact: bool = False, timeout_s: float = _REPLY_TIMEOUT_S) -> str:
        line = self._replies.get(timeout=timeout_s)
        if line is None or not (line == what if exact else line.startswith(what + " ")):
            self._err.seek(0)
            raise RuntimeError(f"the fork server failed ({line!r}): {self._err.read().decode(errors='replace')[-3000:]}")
        return line[len(what) + 1:]

    def start(self, job: str, **kwargs) -> Child:
        """Fork ``job(**kwargs)``; returns at once with the child (running)."""
        self._n += 1
        child = Child(0, self.scratch / f"{self._n}.out", self.scratch / f"{self._n}.err")
        for path in (child.stdout, child.stderr):  # there (empty) even if the kill comes before its redirect
            path.write_bytes(b"")
        request = {"job": job, "kwargs": kwargs, "stdout": str(child.stdout), "stderr": str(child.stderr)}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        child.pid = int(self._reply("pid"))
        return child

    def wait(self, child: Child, timeout_s: float = _REPLY_TIMEOUT_S) -> int:
        """The child's exit code, once it has ended by itself."""
        child.returncode = int(self._reply("exit", timeout_s=timeout_s))
        return child.returncode

    def kill(self, child: Child) -> int:
        """SIGKILL the child (by its PID: still the server's unreaped child until 'exit' is read)."""
        try:
            os.kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended and was reaped just now; its 'exit' reply follows
            pass
        return self.wait(child)

    def kill_after(self, child: Child, delay_s: float) -> int:
        """Let the child run ``delay_s`` (or until it ends by itself), then SIGKILL it."""
        try:
            early = self._replies.get(timeout=delay_s) if delay_s > 0 else None
        except queue.Empty:
            early = None
        if early is None:
            return self.kill(child)
        if not early.startswith("exit "):
            raise RuntimeError(f"the fork server said {early!r}")
        child.returncode = int(early[5:])
        return child.returncode


# -- the cycles -------------------------------------------------------------------------------

@dataclasses.dataclass
class SharedCrashReport:
    cycles: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)
    steps_committed: int = 0
    kills_before_open: int = 0  # killed before its store was open
    lapsed_claims_swept: int = 0  # the dead writers' claims the sweeper took over
    objects_swept: int = 0  # objects the dead writers left without a row
    checks: soak.CrashReport = dataclasses.field(default_factory=soak.CrashReport)


def run_shared_cycles(server: ForkServer, tier: Tier, root: Path, cycles: int, rng_seed: int, *,
                      max_delay_s: float = 1.5, claim_ttl_s: float = 0.3,
                      capacity_bytes: int = soak.DEFAULT_CAPACITY_BYTES) -> SharedCrashReport:
    """``cycles`` soak writers on the tier one after another (in ``root / "writer"``), each
    SIGKILLed (20%: as it starts, else after 50 ms to ``max_delay_s``), and after each kill, on a
    fresh store of another server (``root / "checker"``): crash_soak.check_store (every page is a
    miss or its own bytes, no corrupt object, no row without its object, the last committed put
    survives), then, once the dead writer's claims have lapsed, a sweep, after which no claim is
    left and the bucket holds one object per row."""
    rng = random.Random(rng_seed)
    report = SharedCrashReport()
    for cycle in range(cycles):
        seed = rng.getrandbits(32)
        delay = 0.0 if rng.random() < 0.2 else rng.uniform(0.05, max_delay_s)
        child = server.start("soak", folder=str(root / "writer"), tier=dataclasses.asdict(tier), seed=seed,
                             claim_ttl_s=claim_ttl_s, capacity_bytes=capacity_bytes)
        code = server.kill_after(child, delay)
        lines = child.lines()
        steps = soak.reported_steps(lines)
        report.cycles += 1
        report.steps_committed += len(steps)
        report.kills_before_open += "open" not in lines
        tag = f"cycle {cycle} (writer seed {seed}, killed after {delay * 1000:.0f} ms, {len(steps)} steps)"
        if code != -signal.SIGKILL:
            report.failures.append(f"{tag}: writer exited with {code}: {child.errors()}")
        try:
            store = tier.open(root / "checker", capacity_bytes=capacity_bytes)
        except Exception as exc:  # noqa: BLE001 - failing to open after a kill is the finding
            report.failures.append(f"{tag}: the tier no longer opens: {type(exc).__name__}: {exc}")
            break
        with store:
            report.failures.extend(f"{tag}: {p}" for p in soak.check_store(store, report.checks,
                                                                             soak.surviving_pages(seed, steps)))
            deadline = time.monotonic() + 30 + claim_ttl_s
            while len(store.lapsed_claims(limit=100_000)) != len(store.lapsed_claims(time.time() + 3600, 100_000)):
                if time.monotonic() > deadline:
                    report.failures.append(f"{tag}: the dead writer's claims never lapsed")
                    break
                time.sleep(0.05)
            swept = store.sweep(grace_s=0)
            report.lapsed_claims_swept += swept.lapsed_claims
            report.objects_swept += swept.objects_deleted
            if left := store.lapsed_claims(now=time.time() + 3600):
                report.failures.append(f"{tag}: {len(left)} claims left after the sweep")
            rows, objects = {r.key for r in store.iter_rows()}, set(store.payloads.keys())
            if rows != objects:
                report.failures.append(f"{tag}: after the sweep {len(rows - objects)} rows without an object, "
                                       f"{len(objects - rows)} objects without a row")
    return report


if __name__ == "__main__":
    sys.exit(serve_forks())
