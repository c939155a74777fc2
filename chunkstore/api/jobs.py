"""Background maintenance jobs (verify, rebuild, gc) with progress, one of a kind at a time.

Invariants: at most one job of each kind runs, and a rebuild runs alone (it replaces the index
the others read); a job's state only moves running -> succeeded | failed, and ``version`` grows
with every change (so a stream can send only what changed); finished jobs beyond ``keep`` are
forgotten oldest first; closing asks running jobs to stop at their next progress report and waits.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from chunkstore.choices import Choice
from chunkstore.disk.maintenance import evict_down_to, gc, verify

from chunkstore.api.backend.base import AdminBackend
from chunkstore.api.history import HistoryTable

log = logging.getLogger(__name__)


class JobKind(Choice):
    VERIFY = "verify"
    REBUILD = "rebuild"
    GC = "gc"


class JobState(Choice):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class JobConflictError(Exception):
    """A job that may not start now (one of its kind, or a rebuild, is running)."""


class JobCancelledError(Exception):
    """Raised from a job's progress report when the API shuts down."""


@dataclass(slots=True)
class Job:
    id: str
    kind: JobKind
    params: dict[str, Any]
    created_at: float
    state: JobState = JobState.RUNNING
    done: int = 0
    total: int | None = None
    finished_at: float | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    version: int = 0

    def copy(self) -> "Job":
        return dataclasses.replace(self, params=dict(self.params),
                                   result=None if self.result is None else dict(self.result))


class JobRunner:
    """Runs jobs on ``backend``, one thread each; thread-safe."""

    def __init__(self, backend: AdminBackend, history: HistoryTable, keep: int = 50) -> None:
        self.backend, self.history, self.keep = backend, history, keep
        self._jobs: dict[str, Job] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closing = threading.Event()

    def check_can_start(self, kind: JobKind) -> None:
        """Raises JobConflictError when a job of ``kind`` may not start now."""
        with self._lock:
            self._check_locked(kind)

    def _check_locked(self, kind: JobKind) -> None:
        running = [j for j in self._jobs.values() if j.state is JobState.RUNNING]
        if any(j.kind is kind for j in running):
            raise JobConflictError(f"a {kind.value} job is already running")
        if kind is JobKind.REBUILD and running:
            raise JobConflictError(f"a rebuild runs alone; wait for: {', '.join(j.kind.value for j in running)}")
        if any(j.kind is JobKind.REBUILD for j in running):
            raise JobConflictError("a rebuild is running; retry when it ends")

    def start(self, kind: JobKind, params: dict[str, Any]) -> Job:
        """Start a job in a thread; returns a copy of it. Raises JobConflictError."""
        with self._lock:
            self._check_locked(kind)
            job = Job(id=f"{kind.value}-{next(self._ids)}-{int(time.time())}", kind=kind, params=dict(params),
                      created_at=time.time())
            self._jobs[job.id] = job
            self._forget_old()
            thread = threading.Thread(target=self._run, args=(job,), name=f"chunkstore-admin-{job.id}", daemon=True)
            self._threads[job.id] = thread
            copy = job.copy()
        thread.start()
        return copy

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            job = self._jobs.get(job_id)
            return None if job is None else job.copy()

    def list(self) -> list[Job]:
        with self._lock:
            return [j.copy() for j in sorted(self._jobs.values(), key=lambda j: j.created_at)]

    def close(self, timeout_s: float = 30.0) -> None:
        self._closing.set()
        for thread in list(self._threads.values()):
            thread.join(timeout_s)

    def _forget_old(self) -> None:
        finished = sorted((j for j in self._jobs.values() if j.state is not JobState.RUNNING),
                          key=lambda j: j.created_at)
        for job in finished[:max(0, len(finished) - self.keep)]:
            del self._jobs[job.id]
            self._threads.pop(job.id, None)

    def _update(self, job: Job, **changes: Any) -> None:
        with self._lock:
            for name, value in changes.items():
                setattr(job, name, value)
            job.version += 1

    def _progress(self, job: Job):
        def report(n: int) -> None:
            if self._closing.is_set():
                raise JobCancelledError("the API is shutting down")
            self._update(job, done=job.done + n)
        return report

    def _run(self, job: Job) -> None:
        try:
            result = getattr(self, f"_run_{job.kind.value}")(job)
        except JobCancelledError as exc:
            self._update(job, state=JobState.FAILED, error=f"cancelled: {exc}", finished_at=time.time())
        except Exception as exc:
            log.warning("%s job %s failed: %r", job.kind.value, job.id, exc)
            self._update(job, state=JobState.FAILED, error=f"{type(exc).__name__}: {exc}", finished_at=time.time())
        else:
            self._update(job, state=JobState.SUCCEEDED, result=dataclasses.asdict(result), finished_at=time.time())

    def _run_verify(self, job: Job):
        repair = bool(job.params.get("repair"))
        with self.backend.using_store(write=repair) as store:
            self._update(job, total=store.num_chunks())
            return verify(store, repair=repair, progress=self._progress(job))

    def _run_gc(self, job: Job):
        size = job.params.get("disk_size_bytes")
        with self.backend.using_store(write=True) as store:
            self._update(job, total=1)
            evicted_chunks = evicted_bytes = 0
            if size is not None:
                done = evict_down_to(store, size)
                evicted_chunks, evicted_bytes = done.num_chunks, done.stored_bytes
            report = gc(store, purge_quarantine=bool(job.params.get("purge_quarantine")))
            report.evicted_chunks += evicted_chunks
            report.evicted_bytes += evicted_bytes
            self._progress(job)(1)
            return report

    def _run_rebuild(self, job: Job):
        with self.backend.using_store() as store:  # the history lives in the index's database: carry
            kept = self.history.read(store, every_server=True)  # it over, every server's
        self.history.close()  # a rebuilt SQLite index is a new file: connect to it afresh after
        report = self.backend.rebuild(self._progress(job))
        self.history.close()  # (and any connection a sample made before the rebuild began)
        try:
            with self.backend.using_store(write=True) as store:
                # A PostgreSQL index keeps the API's tables through a rebuild; a SQLite one is new.
                if not self.history.read(store, every_server=True, limit=1):
                    self.history.append(store, kept)
        except Exception as exc:
            log.warning("the stats history could not be carried over the rebuild: %r", exc)
        return report
