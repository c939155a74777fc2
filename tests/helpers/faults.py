"""Faults on cue, through the store's seams: a PayloadStore and a chunk index that fail or wait
when a test says so, wrapped around the real ones (the folder tree, the SQLite index), so no test
reaches into a store to replace its private methods.

    payloads = FaultyPayloads(ChunkFiles(root))
    store = ChunkStore(root, identity, payloads=payloads)
    payloads.fail("stage", key=page.key)          # that page's write fails (ENOSPC by default)
    with payloads.held("read"):                   # every read waits until the block ends
        ...
"""

from __future__ import annotations

import contextlib
import errno
import functools
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import sqlalchemy.exc

from chunkstore.disk.index import ChunkIndex
from chunkstore.disk.payloads import PayloadStore, Staged

# What a hook is called with: the key of the call (None for calls about no one key) and, for
# "stage_segment", the index of the piece about to be written: each segment is passed on in two
# halves, so a hook can stop a file midway whatever its segments (the store writes a compressed
# chunk as one). Hooks run before the operation, but "staged", which runs once a stage has returned.
Hook = Callable[..., None]
OPERATIONS = ("stage", "stage_segment", "staged", "publish", "discard", "read", "exists", "delete", "quarantine",
              "leftovers", "remove_leftovers", "keys")


def disk_full() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device (injected)")


class FaultyPayloads(PayloadStore):
    """``inner`` with hooks run before its operations (OPERATIONS): a hook may raise (the call
    fails, ``inner`` is not called) or wait (the call is held). Thread-safe."""

    def __init__(self, inner: PayloadStore):
        self.inner = inner
        self.location = inner.location
        self.shared_name = inner.shared_name
        self._hooks: dict[str, list[Hook]] = {}
        self._read_through: Callable[..., memoryview] | None = None
        self._lock = threading.Lock()

    # -- cues ------------------------------------------------------------------------------

    def hook(self, op: str, fn: Hook) -> Hook:
        """Run ``fn(key, ...)`` before every ``op``; returns ``fn`` (for ``unhook``)."""
        if op not in OPERATIONS:
            raise ValueError(f"no operation {op!r}; one of {OPERATIONS}")
        with self._lock:
            self._hooks.setdefault(op, []).append(fn)
        return fn

    def unhook(self, op: str, fn: Hook) -> None:
        with self._lock:
            self._hooks[op].remove(fn)

    def clear(self) -> None:
        """Remove every hook and read-through: the calls reach ``inner`` again."""
        with self._lock:
            self._hooks.clear()
            self._read_through = None

    def read_through(self, fn: Callable[..., memoryview] | None) -> None:
        """Reads call ``fn(read, key, max_size_bytes, buffer)`` instead, where ``read`` is the inner
        read (after the "read" hooks): to change what a read returns, or act between the read and
        its caller; None restores plain reads."""
        with self._lock:
            self._read_through = fn

    def fail(self, op: str, error: Callable[[], BaseException] = disk_full, *, key: bytes | None = None,
             times: int | None = None) -> Hook:
        """Make ``op`` raise ``error()`` (for ``key`` only, when given; ``times`` times, when given)."""
        left = [times]

        def failing(k, *_):
            if key is not None and k != key:
                return
            with self._lock:
                if left[0] is not None:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
            raise error()

        return self.hook(op, failing)

    @contextlib.contextmanager
    def held(self, op: str, timeout_s: float = 60.0) -> Iterator[threading.Event]:
        """Every ``op`` that starts inside the block waits until it ends (or ``timeout_s``); yields
        an event set by the first call that waits."""
        gate, arrived = threading.Event(), threading.Event()

        def wait(*_):
            arrived.set()
            gate.wait(timeout_s)

        self.hook(op, wait)
        try:
            yield arrived
        finally:
            self.unhook(op, wait)
            gate.set()

    def _run(self, op: str, *args) -> None:
        with self._lock:
            hooks = list(self._hooks.get(op, ()))
        for fn in hooks:
            fn(*args)

    # -- PayloadStore, through the hooks -----------------------------------------------------

    def create(self) -> None:
        self.inner.create()

    def make_private(self) -> int:
        return self.inner.make_private()

    def has_any(self) -> bool:
        return self.inner.has_any()

    def stage(self, key: bytes, segments: Sequence[bytes | memoryview]) -> Staged:
        self._run("stage", key)

        def watched() -> Iterator[bytes | memoryview]:
            i = 0
            for seg in segments:
                view = memoryview(seg).cast("B")
                for half in (view[:len(view) // 2], view[len(view) // 2:]):
                    self._run("stage_segment", key, i)
                    i += 1
                    yield half

        staged = self.inner.stage(key, watched())
        self._run("staged", key)
        return staged

    def publish(self, staged: Sequence[Staged], executor: Executor | None = None) -> None:
        for item in staged:
            self._run("publish", item.key)
        self.inner.publish(staged, executor)

    def discard(self, staged: Staged) -> None:
        self._run("discard", staged.key)
        self.inner.discard(staged)

    def read(self, key, max_size_bytes, buffer=None):
        self._run("read", key)
        through = self._read_through
        if through is not None:
            return through(self.inner.read, key, max_size_bytes, buffer)
        return self.inner.read(key, max_size_bytes, buffer)

    def exists(self, key: bytes) -> bool:
        self._run("exists", key)
        return self.inner.exists(key)

    def modified_at(self, key: bytes) -> float | None:
        return self.inner.modified_at(key)

    def keys(self) -> Iterator[bytes]:
        self._run("keys", None)
        return self.inner.keys()

    def delete(self, key: bytes) -> bool:
        self._run("delete", key)
        return self.inner.delete(key)

    def quarantine(self, key: bytes) -> str | None:
        self._run("quarantine", key)
        return self.inner.quarantine(key)

    def purge_quarantine(self) -> int:
        return self.inner.purge_quarantine()

    def leftovers(self, keep_own: bool = False) -> set[str]:
        self._run("leftovers", None)
        return self.inner.leftovers(keep_own)

    def remove_leftovers(self, keep_own: bool = False) -> int:
        self._run("remove_leftovers", None)
        return self.inner.remove_leftovers(keep_own)


# -- the index ---------------------------------------------------------------------------------


def index_disk_full(statement: str) -> sqlalchemy.exc.OperationalError:
    """The error SQLite raises (through SQLAlchemy) for a write on a full disk."""
    return sqlalchemy.exc.OperationalError(statement, {}, sqlite3.OperationalError("database or disk is full"))


@dataclass(slots=True)
class IndexFaults:
    """Which index writes fail now (the test flips them)."""

    insert: bool = False
    delete: bool = False
    # Set to an Event: row inserts wait until it is set (a writer stalled, or about to die, after
    # its uploads and before its rows).
    hold_inserts: threading.Event | None = None
    # Set to n: the next n row inserts (or publish claims) succeed and every later one fails (a
    # database that goes away in the middle of a put).
    inserts_left: int | None = None
    claims_left: int | None = None


class FaultyIndex(ChunkIndex):
    """The real index, with its inserts and deletes refused as SQLite refuses them on a full disk
    while ``faults`` say so."""

    def __init__(self, url: str, faults: IndexFaults, **kwargs) -> None:
        super().__init__(url, **kwargs)
        self.faults = faults

    def _before_insert(self) -> None:
        if self.faults.hold_inserts is not None:
            self.faults.hold_inserts.wait()
        if self.faults.insert or _spent(self.faults, "inserts_left"):
            raise index_disk_full("INSERT INTO chunks")

    def claim(self, keys, writer, ttl_s, now=None):
        if _spent(self.faults, "claims_left"):
            raise index_disk_full("INSERT INTO chunk_claims")
        return super().claim(keys, writer, ttl_s, now)

    def insert(self, rows):
        self._before_insert()
        return super().insert(rows)

    def insert_claimed(self, rows, writer, room=None):
        self._before_insert()
        return super().insert_claimed(rows, writer, room)

    def delete(self, keys):
        if self.faults.delete:
            raise index_disk_full("DELETE FROM chunks")
        return super().delete(keys)


def _spent(faults: IndexFaults, budget: str) -> bool:
    """Whether the budget ``budget`` of ``faults`` is used up; counts this call against it."""
    left = getattr(faults, budget)
    if left is None:
        return False
    setattr(faults, budget, max(left - 1, 0))
    return left == 0


def faulty_index(faults: IndexFaults) -> Callable[..., ChunkIndex]:
    """An ``index_factory`` for ChunkStore whose index fails as ``faults`` say."""
    return functools.partial(FaultyIndex, faults=faults)
