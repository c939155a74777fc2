"""ChunkStore: the disk tier's only door (batch put / get / exists, eviction, pins, quotas, stats).

Invariants: the index is private (``_index``): every other part, the API, CLI, maintenance and
benchmarks included, calls the methods below; a key is present iff its index row exists, and a
row exists only after its file was published (file, then row; deleting: row, then file); every
read verifies the file (checksums, key, parent, tokens, layout) and a bad file is quarantined and
reported as a miss, never returned; eviction is planned in one place (eviction.py: least recently
used, leaf-first, never a pinned chunk) and carried out by ``evict(plan)``; a read-only store
refuses every mutating method (MUTATING_METHODS) through one guard, ``_mutation``;
one process writes a store at a time (an exclusive lock file), one thread at a time within it;
every failed write (a chunk file, a publish, an index commit or flush) is counted, logged
rate-limited, and marks the store degraded until a write succeeds; closing never raises for a
full disk (what could not be written is reported, the index is closed).
torch is imported only by what moves tensors (put, get, get_into, ``torch_dtype``): opening a store
and its offline care (stats, verify, gc, evict; maintenance.py) never load it, so the CLI's store
commands start in a fraction of a second.
Files in the data folder are 0600 and folders 0700 (see files.py); a writer makes an existing
store's top-level files and folders private on every open, and walks the chunk tree once, which
``store.json`` records (store_folder.py).
Two seams stand for another backend: the index is reached through its URL (``index_url``: a SQLite
file in the store's folder by default) and the payloads through a PayloadStore (``payloads``: the
folder tree of files.py by default); nothing above the store knows which is in use. The parts:
store_folder.py (store.json, the lock, ``store_root``), page_io.py (pages to payloads and back,
verified), eviction.py (the plans), results.py (what the methods return).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from chunkstore.disk.codec import Codec
from chunkstore.disk.eviction import EvictionPlan, EvictionSelection
from chunkstore.disk.eviction import plan as plan_of
from chunkstore.disk.file_check import FileCheck, FileStatus
from chunkstore.disk.files import ChunkFiles, Durability, make_private_dir
from chunkstore.disk.identity import ModelIdentity, ModelMismatchError
from chunkstore.disk.index import (ChunkIndex, ChunkOrder, ChunkQuery, ChunkRow, NamespaceUsage, Victim, drop_index,
                                   sqlite_url)
from chunkstore.disk.keys import PageRef, encode_tokens, page_key
from chunkstore.disk.lanes import submit_all
from chunkstore.disk.page_io import PageLoader, encode_page, page_arrays, torch_dtypes
from chunkstore.disk.payloads import PayloadStore, PayloadsUnavailable, Staged
from chunkstore.disk.results import (BUCKET_LISTING_META, STORE_WIDE, BucketListing, EvictResult, NamespaceStats,
                                     PutResult, ReadOnlyStoreError, SharedTierStats, StoreStats, SweepResult,
                                     listing_of, listing_text, server_stats, store_stats)
from chunkstore.disk.store_folder import (MODELS_DIRNAME, PRIVATE_MARKER, STORE_FILENAME, StoreBusyError, WriterLock,
                                          check_identity, make_private_once, read_identity, store_root,
                                          warn_if_not_private)
from chunkstore.disk.write_health import LOG_INTERVAL_S, WriteFailures
from chunkstore.priority import ThreadPriority, lower_this_thread

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
_T = TypeVar("_T")
_R = TypeVar("_R")

# Owned by the modules named; importable from here as before.
__all__ = [
    "ChunkStore", "MUTATING_METHODS", "READING_METHODS", "default_num_workers",
    "MODELS_DIRNAME", "PRIVATE_MARKER", "STORE_FILENAME", "StoreBusyError", "read_identity", "store_root",
    "STORE_WIDE", "EvictResult", "NamespaceStats", "PutResult", "ReadOnlyStoreError", "StoreStats",
]
_DROP_BATCH = 256  # rows deleted per index transaction

# The public methods of ChunkStore, each in one of two lists (tests/test_store_read_only.py checks
# the class against them, so a new method cannot skip the read-only guard): a mutation refuses a
# read-only store (``_mutation``), with ReadOnlyStoreError and changing nothing; the rest read, or
# write only the access times and counters that a read-only store keeps in memory (flush, close).
MUTATING_METHODS = (
    "put", "evict", "delete", "delete_namespace", "pin", "unpin", "set_quota",
    "adopt", "quarantine", "sweep", "drop_missing", "remove_leftover_temps", "purge_quarantine", "checkpoint",
    "write_side_tables",
)
READING_METHODS = (
    "close", "exists", "longest_prefix", "get", "get_into", "verify_file", "plan_eviction", "flush", "stats",
    "num_chunks", "stored_bytes", "chunk_rows", "iter_rows", "list_chunks", "count_chunks", "child_keys",
    "namespace_usage", "quota", "exclusive", "read_side_tables", "map_workers", "lapsed_claims", "claimed_keys",
)


def _mutation(method):
    """Refuse ``method`` on a read-only store (ReadOnlyStoreError, before anything runs): the one
    read-only check of every mutating method (MUTATING_METHODS)."""
    @functools.wraps(method)
    def guarded(self: "ChunkStore", *args, **kwargs):
        if self.read_only:
            raise ReadOnlyStoreError(f"{method.__name__}: the store at {self.root} is opened read-only")
        return method(self, *args, **kwargs)

    guarded.is_mutation = True
    return guarded


def claim_index(index: ChunkIndex, root: Path, identity: ModelIdentity, *, read_only: bool,
                allow_other_models: bool, shared_name: str | None = None) -> None:
    """Bind a database index to the store at ``root`` (or, for a shared tier, to the payloads every
    server names ``shared_name``): its rows claim those payloads and that model's pages. A SQLite
    index lives in (or beside) its folder; a database on a server could be named by two stores,
    whose rows would then claim each other's files. Raises ModelMismatchError (closing the index)
    for an index another store or model has claimed."""
    where = ("store_folder", str(Path(root).resolve())) if shared_name is None else ("payload_store", shared_name)
    claim = {where[0]: where[1], "identity": identity.to_json()}
    other = "payload_store" if shared_name is None else "store_folder"
    if (held := index.get_meta(other)) is not None:
        index.close()
        kind = "a shared tier" if shared_name is None else "one store's folder"
        raise ModelMismatchError(f"the index {index.name} belongs to {kind} ({other}: {held}); give each "
                                 "store its own database")
    for name, value in claim.items():
        held = index.get_meta(name)
        if held is None and not read_only:
            index.set_meta(name, value)
        elif held is not None and held != value and not (name == "identity" and allow_other_models):
            index.close()
            raise ModelMismatchError(f"the index {index.name} belongs to another store ({name}: {held}); give "
                                     "each store its own database")


# How long a shared tier's publish claim holds (index.claim): far longer than a batch's upload takes,
# short enough that a dead writer's keys are published by another server soon after.
CLAIM_TTL_S = 60.0
# A shared tier's put pipelines its index work with its uploads (ChunkStore._put_shared): its first
# claim is of one page per write worker, so every upload thread starts after one short round trip,
# and its last commit this small, so little of the commit is left once the uploads end.
COMMIT_TAIL_PAGES = 32
# A shared tier's uploads in flight at once (its write workers): an object store answers each PUT
# after a round trip, so its throughput grows with them (on this project's test machine, 16
# against 4 published a third faster, the raw PUTs as much).
SHARED_WRITE_WORKERS = 16
# How old an object with neither row nor claim must be before the sweeper deletes it.
SWEEP_GRACE_S = 600.0


def default_num_workers(shared: bool = False) -> int:
    """Threads that compress and write: two per core, as writes block in fsync; a shared tier's at
    least SHARED_WRITE_WORKERS, as its uploads wait on the network."""
    folder = max(4, 2 * (os.cpu_count() or 2))
    return max(folder, SHARED_WRITE_WORKERS) if shared else folder


class ChunkStore:
    """A persistent, content-addressed store of KV pages under ``path``.

    Thread-safe. ``capacity_bytes`` bounds the stored (compressed) bytes; None means unbounded.
    Raises ModelMismatchError when ``path`` holds another model's store (unless
    ``allow_other_models``: keys bind the identity, so models never share chunks) and
    StoreBusyError when another process is writing it. ``direct_reads`` reads chunk files around
    the page cache (O_DIRECT) where the file system allows it. Threads: ``num_workers`` compress
    and write (default 2 per core, at least 4; on a shared tier at least 16, as they upload),
    ``io_threads`` read (default 8), ``decode_threads``
    decode loaded pages (default 1 per core). ``background_priority`` is the CPU priority of the
    compress-and-write threads and of the reads asked for as ``background`` (priority.py): below
    the request path's, that work takes only the cycles it leaves; other reads keep the request
    path's priority. ``reset_index`` deletes the index (not the
    payloads) before opening, for `chunkstore rebuild`. Failed writes are logged at most once per
    ``failure_log_interval_s`` after the first (a summary line counts the rest).

    The seams: ``index_url`` names the index (default: ``index.db`` in ``path``; another SQLite
    file, or a PostgreSQL database, which the store claims: another store's folder or model is
    refused with ModelMismatchError), ``index_factory`` opens it (``ChunkIndex``'s signature: tests pass one whose commits
    fail); ``payloads`` holds the chunk files (default: the folder tree under ``path``, made with
    ``durability`` and ``direct_reads``, which a PayloadStore passed in brings its own of). The
    index is the store's own: callers use the store's methods, which keep its rules (file, then
    row; row, then file; the read-only guard). ``payloads`` is public for reading (listing,
    existence); every change to it goes through the store's methods too.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        identity: ModelIdentity,
        *,
        capacity_bytes: int | None = None,
        codec: Codec | None = None,
        zstd_level: int | None = None,
        durability: Durability = Durability.FSYNC,
        num_workers: int | None = None,
        io_threads: int | None = None,
        decode_threads: int | None = None,
        direct_reads: bool = True,
        allow_other_models: bool = False,
        read_only: bool = False,
        reset_index: bool = False,
        failure_log_interval_s: float = LOG_INTERVAL_S,
        claim_ttl_s: float = CLAIM_TTL_S,
        index_url: str | None = None,
        index_factory: Callable[..., ChunkIndex] = ChunkIndex,
        payloads: PayloadStore | None = None,
        background_priority: ThreadPriority = ThreadPriority.NORMAL,
    ):
        if capacity_bytes is not None and capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        self.background_priority = ThreadPriority.parse(background_priority)
        if claim_ttl_s <= 0:
            raise ValueError(f"claim_ttl_s must be positive, got {claim_ttl_s}")
        self.claim_ttl_s = claim_ttl_s
        # This store's name among a shared tier's writers (its publish claims carry it).
        self.writer_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.root = Path(path)
        self.identity = identity
        self.capacity_bytes = capacity_bytes
        self.codec = codec or Codec.default_for(identity.itemsize)
        self.zstd_level = zstd_level
        self.read_only = read_only
        self._writer_lock: WriterLock | None = None
        self._closed = False
        self._writes = WriteFailures(self.root, failure_log_interval_s)
        self._reads = WriteFailures(self.root, failure_log_interval_s, kind="read")
        if read_only:
            if not (self.root / STORE_FILENAME).is_file():
                raise FileNotFoundError(f"no chunk store at {self.root}")
        else:
            make_private_dir(self.root)
            self._writer_lock = WriterLock(self.root)
        try:
            check_identity(self.root, identity, read_only=read_only, allow_other_models=allow_other_models)
            self.payloads = ChunkFiles(self.root, durability, direct_reads) if payloads is None else payloads
            self.shared = self.payloads.shared_name is not None
            url = index_url or sqlite_url(self.root)
            if not read_only:
                self.payloads.create()
                self.payloads.remove_leftovers()
                if reset_index:  # the payloads stay; `maintenance.rebuild` re-indexes them
                    drop_index(url)
            # A writer that finds payloads but no index must not start an empty one (that would
            # hide every chunk): it asks for `chunkstore rebuild` instead.
            self._index = index_factory(url, read_only=read_only,
                                        must_exist=not reset_index and self.payloads.has_any())
            if not getattr(self._index, "is_sqlite", True):
                claim_index(self._index, self.root, identity, read_only=read_only,
                            allow_other_models=allow_other_models, shared_name=self.payloads.shared_name)
            if read_only:
                warn_if_not_private(self.root)
            else:
                make_private_once(self.root, self.payloads)
        except BaseException:
            self._release_writer_lock()
            raise
        self.num_workers = num_workers or default_num_workers(self.shared)
        self._loader = PageLoader(self.payloads, identity, io_threads=io_threads, decode_threads=decode_threads)
        self.io_threads, self.decode_threads = self._loader.io_threads, self._loader.decode_threads
        self._background_loader = self._loader if self.background_priority is ThreadPriority.NORMAL else \
            PageLoader(self.payloads, identity, io_threads=io_threads, decode_threads=decode_threads,
                       priority=self.background_priority, thread_name="chunkstore-background")
        self._pool = ThreadPoolExecutor(max_workers=self.num_workers, thread_name_prefix="chunkstore-write",
                                        initializer=lower_this_thread, initargs=(self.background_priority,))

    @functools.cached_property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype of a page; the first tensor operation imports torch. Raises ValueError
        when this torch lacks the store's dtype."""
        dtypes = torch_dtypes()
        if self.identity.kv_dtype not in dtypes:
            import torch

            raise ValueError(f"torch {torch.__version__} has no dtype {self.identity.kv_dtype}")
        return dtypes[self.identity.kv_dtype]

    # -- lifecycle -------------------------------------------------------------------------

    def _release_writer_lock(self) -> None:
        if self._writer_lock is not None:
            self._writer_lock.release()
            self._writer_lock = None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loader.close()
        self._background_loader.close()
        self._pool.shutdown(wait=True)
        try:
            self._index.close()  # writes the buffered counters, then disposes of the connections
        except DBAPIError as exc:  # a full disk: those counters are lost, the index stays consistent
            self._writes.failed("index flush at close", exc, num_pages=0)
        self._writes.flush_log()
        self.payloads.close()
        self._release_writer_lock()

    def __enter__(self) -> "ChunkStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- put -------------------------------------------------------------------------------

    def _check_page(self, page: PageRef, tensor: torch.Tensor) -> None:
        if page.num_tokens != self.identity.ids_per_page:
            raise ValueError(f"a page's key holds {self.identity.ids_per_page} ids ({self.identity.key_scheme}), "
                             f"got {page.num_tokens}")
        if tensor.dtype != self.torch_dtype:
            raise ValueError(f"page dtype {tensor.dtype}, store holds {self.torch_dtype}")
        if tuple(tensor.shape) != self.identity.page_shape:
            raise ValueError(f"page shape {tuple(tensor.shape)}, expected {self.identity.page_shape}")
        if page_key(page.parent_key, encode_tokens(page.token_ids)) != page.key:
            raise ValueError(f"key {page.key.hex()} is not the hash of its parent key and tokens")

    def _encode_and_stage(self, page: PageRef, raw: np.ndarray) -> tuple[Staged, int]:
        segments, size = encode_page(page, raw, self.identity, self.codec, self.zstd_level)
        return self.payloads.stage(page.key, segments), size

    @_mutation
    def put(self, pages: Sequence[PageRef], tensors: Sequence[torch.Tensor]) -> PutResult:
        """Store pages (one tensor of ``identity.page_shape`` each). Keys already stored are
        deduplicated (nothing written). Compression and file writes run in the worker pool; the
        index is updated under the writer lock. A page that cannot be written (disk full, over
        capacity or quota) is listed in ``failed`` and leaves nothing visible.
        Raises ValueError for a page of the wrong shape, dtype or token count, ReadOnlyStoreError.
        """
        if len(pages) != len(tensors):
            raise ValueError(f"{len(pages)} pages but {len(tensors)} tensors")
        for p, t in zip(pages, tensors):
            self._check_page(p, t)
        result = PutResult()
        try:  # (a shared tier's claim leaves the stored keys out itself: a round trip fewer)
            present = set() if self.shared else self._index.present([p.key for p in pages])
        except DBAPIError as exc:  # the index does not answer: nothing is written, nothing lost
            for p in pages:
                result.failed[p.key] = f"write failed: index unavailable: {exc.orig}"
            self._writes.failed("index lookup", exc, num_pages=len(pages))
            return result
        todo: dict[bytes, tuple[PageRef, np.ndarray]] = {}
        for p, t in zip(pages, page_arrays(tensors)):
            if p.key in present or p.key in todo:
                result.deduplicated.append(p.key)
                self._index.count_event(p.namespace, "dedup_hits")
            else:
                todo[p.key] = (p, t)
        if not self.shared:
            written = self._write_all(todo, self._encode_and_stage, result)
            if written:
                self._publish(todo, written, result)
            return result
        return self._put_shared(todo, result)

    def _put_shared(self, todo: dict[bytes, tuple[PageRef, np.ndarray]], result: PutResult) -> PutResult:
        """A shared tier's put, pipelined so that its index round trips overlap its uploads: the
        first keys, one per write worker, are claimed and their uploads started, the rest are
        claimed while those upload; the rows are committed in two steps, all but the last
        COMMIT_TAIL_PAGES pages while those still upload. Each step keeps the publish protocol: a
        key is claimed before it is uploaded, and its row goes in only after its upload (a key
        another writer claims is skipped before any work, as a duplicate)."""
        keys = list(todo)
        futures: dict[bytes, Future] = {}
        claimed: list[bytes] = []
        committed: list[bytes] = []
        quotas: dict[str, int | None] = {}  # each namespace's, read once for the put (both commits)
        try:
            parts = (keys[:self.num_workers], keys[self.num_workers:])
            for i, part in enumerate(parts):
                won = {k: todo[k] for k in part}
                if won and not self._claim(won, result):  # the index did not answer: those pages
                    for k in itertools.chain.from_iterable(parts[i + 1:]):  # failed, and so do the rest
                        result.failed[k] = result.failed[part[0]]
                        self._index.count_event(todo[k][0].namespace, "write_errors")
                    break
                claimed += won
                futures.update(self._submit(won, self._encode_and_upload))
            order = [k for k in keys if k in futures]  # chain order: parents commit before children
            split = max(len(order) - COMMIT_TAIL_PAGES, 0)
            for part in (order[:split], order[split:]):
                if written := self._collect({k: futures[k] for k in part}, todo, result):
                    committed += self._publish(todo, written, result, quotas)
        finally:
            for fut in futures.values():
                fut.cancel()  # (an unexpected error: what was uploaded has no row, an orphan swept later)
            if unclaim := [k for k in claimed if k not in committed]:
                self._release_claims(unclaim)
        return result

    def _write_all(self, todo, task, result: PutResult) -> dict[bytes, tuple[Staged, int]]:
        """Run ``task`` (encode and stage) for every page on the worker pool; returns what was
        written, with each failure listed in ``result``."""
        return self._collect(self._submit(todo, task), todo, result)

    def _submit(self, todo, task) -> dict[bytes, Future]:
        """``task(page, raw)`` for every page on the worker pool, a future per page (lanes.py:
        one submission per worker thread, not per page)."""
        return dict(zip(todo, submit_all(self._pool, self.num_workers, task, list(todo.values()))))

    def _collect(self, futures: dict[bytes, Future], todo, result: PutResult) -> dict[bytes, tuple[Staged, int]]:
        """Wait for the pages' tasks: what was written, with each failure listed in ``result``."""
        written: dict[bytes, tuple[Staged, int]] = {}
        try:
            for key, fut in futures.items():
                try:
                    written[key] = fut.result()
                except OSError as exc:
                    result.failed[key] = f"write failed: {exc}"
                    self._index.count_event(todo[key][0].namespace, "write_errors")
                    self._writes.failed("chunk file" if not self.shared else "upload", exc)
        except BaseException:  # an unexpected error: leave nothing of these pages staged
            for fut in futures.values():
                if not fut.cancel() and fut.exception() is None:
                    self.payloads.discard(fut.result()[0])
            raise
        return written

    def _encode_and_upload(self, page: PageRef, raw: np.ndarray) -> tuple[Staged, int]:
        """A shared tier's page, claimed: encoded, then uploaded write-once (not yet indexed)."""
        staged, size = self._encode_and_stage(page, raw)
        self.payloads.publish([staged])
        return staged, size

    def _publish(self, todo: dict[bytes, tuple[PageRef, np.ndarray]],
                 written: dict[bytes, tuple[Staged, int]], result: PutResult,
                 quotas: dict[str, int | None] | None = None) -> list[bytes]:
        """Make room, publish (a folder: rename; a shared tier's pages are uploaded already), then
        commit the rows, under the writer lock; returns the keys committed."""
        with self._index.write_lock:
            if not self.shared:  # (a shared tier's claims keep other writers off these keys)
                try:
                    again = self._index.present(list(written))
                except DBAPIError as exc:
                    self._fail_all(todo, written, result, "index lookup", exc)
                    return []
                for key in again:  # another thread stored it meanwhile
                    self._skip_stored(key, todo, written, result)
            return self._publish_claimed(todo, written, result, {} if quotas is None else quotas)

    def _skip_stored(self, key: bytes, todo, written, result: PutResult) -> None:
        self.payloads.discard(written.pop(key)[0])
        result.deduplicated.append(key)
        self._index.count_event(todo[key][0].namespace, "dedup_hits")

    def _claim(self, todo, result: PutResult) -> bool:
        """A shared tier: claim the pages' keys before anything is written (the publish protocol,
        index.claim); ``todo`` keeps the keys won. A key another writer claims is its to publish:
        this put skips it, as a duplicate. Returns False, with every page failed, when the index
        cannot be reached."""
        try:
            mine = self._index.claim(list(todo), self.writer_id, self.claim_ttl_s)
        except DBAPIError as exc:
            for k in list(todo):
                result.failed[k] = f"write failed: index unavailable: {exc.orig}"
                self._index.count_event(todo.pop(k)[0].namespace, "write_errors")
            self._writes.failed("claim", exc, num_pages=len(result.failed))
            return False
        for key in [k for k in todo if k not in mine]:
            result.deduplicated.append(key)
            self._index.count_event(todo.pop(key)[0].namespace, "dedup_hits")
        return True

    def _fail_all(self, todo, written, result: PutResult, step: str, exc: DBAPIError) -> None:
        """The index did not answer before anything was published: every written page fails."""
        num_pages = len(written)
        for k in list(written):
            self.payloads.discard(written.pop(k)[0])
            result.failed[k] = f"publish failed: index unavailable: {exc.orig}"
            self._index.count_event(todo[k][0].namespace, "write_errors")
        self._writes.failed(step, exc, num_pages=num_pages)

    def _release_claims(self, keys: Sequence[bytes]) -> None:
        try:
            self._index.release(keys, self.writer_id)
        except DBAPIError as exc:  # they lapse after claim_ttl_s
            self._writes.failed("claim release", exc, num_pages=0)

    def _publish_claimed(self, todo, written, result: PutResult, quotas: dict[str, int | None]) -> list[bytes]:
        """Evict to make room, upload, then commit the rows (payload first, then row); returns the
        keys committed. On failure nothing of the batch stays visible."""
        try:
            # Each namespace's quota, read once per put (on a shared tier: from the database).
            for ns in {todo[k][0].namespace for k in written} - quotas.keys():
                quotas[ns] = self._index.quota(ns)
            with self._index.evictor_lock() if self._bounded(quotas) else contextlib.nullcontext():
                return self._commit_within_room(todo, written, result, quotas)
        except DBAPIError as exc:  # the quota lookup or the evictor lock: no row of it was committed
            self._unpublish(todo, written, [k for k in written if k not in result.failed and k not in result.stored],
                            result, "evictor lock", exc)
            return [k for k in written if k in result.stored]

    def _bounded(self, quotas: dict[str, int | None]) -> bool:
        """Whether a shared tier's batch must hold the evictor lock from its room check to its row
        commit: a capacity or a namespace quota applies, and another server's put between the two
        would take the room this one found (each would fit alone; both would not)."""
        if not self.shared:
            return False
        if self.capacity_bytes is not None:
            return True
        return any(quota is not None for quota in quotas.values())

    def _commit_within_room(self, todo, written, result: PutResult, quotas: dict[str, int | None]) -> list[bytes]:
        step, admitted = "index commit", list(written)
        try:
            admitted = self._make_room(todo, written, result, quotas)  # evicting writes the index too
            if not admitted:
                return []
            now = time.time()
            rows = [ChunkRow(key=k, parent_key=todo[k][0].parent_key, namespace=todo[k][0].namespace,
                             num_tokens=self.identity.page_size, raw_bytes=self.identity.page_size_bytes,
                             stored_bytes=written[k][1], created_at=now, last_access_at=now)
                    for k in admitted]
            step = "publish"
            if not self.shared:  # (a shared tier's pages were uploaded as they were encoded)
                self.payloads.publish([written[k][0] for k in admitted], self._pool)
            step = "index commit"
            if self.shared:
                held = self._index.insert_claimed(rows, self.writer_id)  # the row replaces the claim
                for k in [k for k in admitted if k not in held]:
                    # The claim lapsed while this put ran, and another took it: the key is theirs
                    # now (its object may be theirs too, or being deleted), so it is left alone.
                    admitted.remove(k)
                    result.failed[k] = "publish failed: the claim lapsed before the row was committed"
                    self._index.count_event(todo[k][0].namespace, "write_errors")
            else:
                self._index.insert(rows)
        except (OSError, DBAPIError) as exc:
            self._unpublish(todo, written, admitted, result, step, exc)
            return []
        result.stored.extend(admitted)
        self._writes.succeeded()
        return admitted

    def _unpublish(self, todo, written, keys: Sequence[bytes], result: PutResult, step: str,
                   exc: BaseException) -> None:
        """Nothing of a failed batch may stay visible: no row of ``keys`` was committed, so their
        payloads (all new keys, checked under the writer lock, or claimed) are removed again and
        the pages failed."""
        for k in keys:
            self.payloads.discard(written[k][0])
            with contextlib.suppress(PayloadsUnavailable):  # left without a row: invisible,
                self.payloads.delete(k)  # and an orphan for verify --repair or the sweeper
            result.failed[k] = f"publish failed: {exc}"
            self._index.count_event(todo[k][0].namespace, "write_errors")
        self._writes.failed(step, exc, num_pages=len(keys))

    def _make_room(self, todo, written, result: PutResult, quotas: dict[str, int | None]) -> list[bytes]:
        """Evict to fit the written pages under quotas and capacity; returns the keys that fit.

        The stored parents of the batch are never evicted for it: the new pages extend them.
        """
        protect = {todo[k][0].parent_key for k in written}
        by_ns: dict[str, int] = {}
        for k, (_, size) in written.items():
            ns = todo[k][0].namespace
            by_ns[ns] = by_ns.get(ns, 0) + size
        rejected: dict[str, str] = {}
        for ns, need in by_ns.items():
            quota = quotas[ns]
            if quota is not None and not self._fit(need, quota, ns, protect):
                rejected[ns] = f"namespace quota of {quota} bytes"
        total = sum(need for ns, need in by_ns.items() if ns not in rejected)
        if self.capacity_bytes is not None and total and not self._fit(total, self.capacity_bytes, None, protect):
            for ns in by_ns:
                rejected.setdefault(ns, f"capacity of {self.capacity_bytes} bytes")
        admitted: list[bytes] = []
        for k, (staged, _) in written.items():
            ns = todo[k][0].namespace
            if ns in rejected:
                self.payloads.discard(staged)
                if self.shared:  # uploaded already, under this writer's claim: it goes again
                    with contextlib.suppress(PayloadsUnavailable):  # else an orphan, swept later
                        self.payloads.delete(k)
                result.failed[k] = f"no room within the {rejected[ns]} (the rest is pinned or in use)"
            else:
                admitted.append(k)
        return admitted

    def _fit(self, need: int, limit: int, namespace: str | None, protect: set[bytes]) -> bool:
        if need > limit:
            return False
        excess = self._index.stored_bytes(namespace) + need - limit
        if excess > 0:
            with self._index.evictor_lock():  # a shared tier: one evictor at a time, fleet-wide
                excess = self._index.stored_bytes(namespace) + need - limit
                if excess > 0:
                    selection = EvictionSelection(namespace=namespace, bytes_to_free=excess)
                    self._drop(self._plan(selection, protect).victims)
        return self._index.stored_bytes(namespace) + need <= limit

    # -- get / exists ----------------------------------------------------------------------

    def _present(self, keys: Sequence[bytes]) -> set[bytes]:
        """The stored keys among ``keys``; none while the index does not answer (a database that
        went away: a miss, logged at most once per interval, never an error to the caller)."""
        try:
            present = self._index.present(keys)
        except DBAPIError as exc:
            self._reads.failed("index lookup", exc, num_pages=len(keys))
            return set()
        self._reads.succeeded()
        return present

    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each key is stored (index only; no file is opened). False while the index does
        not answer."""
        present = self._present(keys)
        return [k in present for k in keys]

    def longest_prefix(self, keys: Sequence[bytes]) -> int:
        """How many leading keys of a chain are stored (0 while the index does not answer)."""
        present = self._present(keys)
        n = 0
        for k in keys:
            if k not in present:
                break
            n += 1
        return n

    def get(self, pages: Sequence[PageRef]) -> list[torch.Tensor | None]:
        """Load pages; each is a verified tensor of ``identity.page_shape``, or None for a miss."""
        import torch

        outs = [torch.empty(self.identity.page_shape, dtype=self.torch_dtype) for _ in pages]
        ok = self.get_into(pages, outs)
        return [t if hit else None for t, hit in zip(outs, ok)]

    def get_into(self, pages: Sequence[PageRef], outs: Sequence[torch.Tensor], *,
                 background: bool = False) -> list[bool]:
        """Load pages into caller-provided tensors (e.g. host pool slots); returns hit per page.
        ``background``: no request waits for this load yet (a prefetch for a queued one), so it
        runs at ``background_priority``.

        A destination whose page missed holds unspecified bytes. Missing files drop their row;
        corrupt files are quarantined. Never raises for a bad file.
        """
        if len(pages) != len(outs):
            raise ValueError(f"{len(pages)} pages but {len(outs)} destinations")
        for out in outs:
            if out.dtype != self.torch_dtype or tuple(out.shape) != self.identity.page_shape:
                raise ValueError(f"destination must be {self.torch_dtype} of shape {self.identity.page_shape}")
        present = self._present([p.key for p in pages])
        loader = self._background_loader if background else self._loader
        checks = loader.load([(i, p, outs[i]) for i, p in enumerate(pages) if p.key in present])
        hits: list[bool] = []
        missing: list[PageRef] = []
        corrupt: list[tuple[PageRef, str]] = []
        for i, p in enumerate(pages):
            check = checks.get(i)  # None: not in the index
            hits.append(check is not None and check.is_ok)
            if check is not None and check.status is FileStatus.MISSING:
                missing.append(p)
            elif check is not None and check.status is FileStatus.UNAVAILABLE:
                self._reads.failed("payload read", PayloadsUnavailable(check.text), num_pages=1)
            elif check is not None and check.is_bad:
                corrupt.append((p, check.text))
        hit_pages = [p for p, h in zip(pages, hits) if h]
        try:
            self._index.touch(p.key for p in hit_pages)  # may flush a full buffer to the index
        except DBAPIError as exc:  # a full disk: the access times are dropped, the read still counts
            self._writes.failed("index flush", exc, num_pages=0)
        for p, h in zip(pages, hits):
            self._index.count_event(p.namespace, "hits" if h else "misses")
        try:
            if missing and not self.read_only:
                self._drop_missing([p.key for p in missing])
            for p, why in corrupt:
                self._quarantine(p.key, p.namespace, why, p)
        except DBAPIError as exc:  # the index went away meanwhile: the next miss asks again
            self._reads.failed("index clean-up", exc, num_pages=0)
        return hits

    def verify_file(self, key: bytes, page: PageRef | None = None, out: np.ndarray | None = None,
                    row: ChunkRow | None = None) -> FileCheck:
        """Fully verify the file of ``key`` (and, given ``page`` or ``row``, that it holds what they
        say), decoding into ``out`` (a scratch buffer when None). Never raises for a bad file."""
        return self._loader.verify(key, page, out, row)

    def _quarantine(self, key: bytes, namespace: str, why: str, page: PageRef | None = None,
                    row: ChunkRow | None = None) -> bool:
        """Move a file that failed verification aside and drop its row; returns whether it did.

        Under the writer lock the file is checked again: a writer may have replaced it with a good
        one since it was read (evict, then put), and that one must stay.
        """
        if self.read_only:
            log.warning("chunk %s is corrupt (%s); read-only store, left in place", key.hex(), why)
            return False
        with self._index.write_lock:
            if self.shared:
                moved = self._quarantine_shared(key, page, row)
            else:
                check = self.verify_file(key, page, row=row)
                if check.is_ok or check.status is FileStatus.UNAVAILABLE:  # good now, or unknown
                    return False
                self._index.delete([key])
                moved = self.payloads.quarantine(key)
        if moved is None:
            return False
        self._index.count_event(namespace, "quarantined")
        log.warning("quarantined chunk %s (%s) to %s", key.hex(), why, moved)
        return True

    def _quarantine_shared(self, key: bytes, page: PageRef | None, row: ChunkRow | None) -> str | None:
        """A shared tier's quarantine: the object is checked again under a claim of this writer's
        (no other writer uploads the key while it moves), and only the row seen before the check
        goes (a chunk another server stored again since keeps its new row); an object with no row
        (an orphan) is claimed as a put would claim it. Returns where the object went, or None."""
        seen = self._index.rows([key]).get(key)
        if seen is None:
            if key not in self._index.claim([key], self.writer_id, self.claim_ttl_s):
                return None  # another writer's put, eviction or sweep holds it
        try:
            check = self.verify_file(key, page, row=row)
            if check.is_ok or check.status is FileStatus.UNAVAILABLE:  # good now, or unknown
                return None
            if seen is not None and not self._index.delete_unchanged({key: seen.created_at},
                                                                     (self.writer_id, self.claim_ttl_s)):
                return None
            return self.payloads.quarantine(key)
        finally:
            self._release_claims([key])

    def _drop_missing(self, keys: Sequence[bytes]) -> int:
        """Drop the rows of keys whose file is gone, checked again under the writer lock (the
        chunk may have been stored again since the read found no file)."""
        with self._index.write_lock:
            seen = self._index.rows(keys) if self.shared else {}
            try:
                gone = [k for k in keys if (not self.shared or k in seen) and not self.payloads.exists(k)]
            except PayloadsUnavailable:  # asked again on a later miss
                return 0
            if not gone:
                return 0
            if not self.shared:
                return self._index.delete(gone)
            # Only the rows seen before the look at their objects: a chunk another server stored
            # again since keeps its new row.
            return len(self._index.delete_unchanged({k: seen[k].created_at for k in gone}))

    # -- offline care (maintenance.py) -----------------------------------------------------

    @_mutation
    def quarantine(self, key: bytes, namespace: str, why: str, row: ChunkRow | None = None) -> bool:
        """Move the file of ``key`` aside and drop its row when it still fails verification
        (checked again under the writer lock); returns whether it did."""
        return self._quarantine(key, namespace, why, row=row)

    @_mutation
    def drop_missing(self, keys: Sequence[bytes]) -> int:
        """Drop the rows of ``keys`` whose file is gone (checked again under the writer lock);
        returns how many rows went."""
        return self._drop_missing(keys)

    @_mutation
    def adopt(self, rows: Sequence[ChunkRow]) -> int:
        """Index chunk files that have no row (``rows`` made from their verified headers; the file
        is there first, as in a put); keys already indexed are left as they are. Returns how many
        rows were new. Not counted against the capacity until then (files without a row are
        invisible). On a shared tier under the publish protocol: a key another writer claims
        (its put, an eviction, the sweeper) is left to it, and an object gone once claimed gets
        no row."""
        if not self.shared:
            return self._index.insert(rows)
        with self._index.write_lock:
            mine = self._index.claim([r.key for r in rows], self.writer_id, self.claim_ttl_s)
            try:
                there = [r for r in rows if r.key in mine and self.payloads.exists(r.key)]
                return len(self._index.insert_claimed(there, self.writer_id))
            finally:
                if mine:
                    self._release_claims(list(mine))

    @_mutation
    def remove_leftover_temps(self) -> int:
        """Remove the temp files of dead writers (this process's own may be puts in flight), under
        the writer lock; returns how many."""
        with self._index.write_lock:
            return self.payloads.remove_leftovers(keep_own=True)

    @_mutation
    def sweep(self, grace_s: float = SWEEP_GRACE_S) -> SweepResult:
        """A shared tier's clean-up, safe on any server at any time. Lapsed publish claims (a writer that died mid-upload or mid-eviction) are taken over
        and the objects of their keys that have no row deleted; then every object with no row and
        no claim, last written over ``grace_s`` ago (an upload whose row is about to be committed
        is younger), is claimed and deleted. A key is claimed before its object goes, so no writer
        uploads it meanwhile. Nothing to do for a store whose payloads only it writes.

        The listing's counts (BucketListing: the objects left, and of them those with neither row
        nor claim) go into the index, where every server's stats find them."""
        if not self.shared:
            return SweepResult()
        lapsed = objects = listed = orphans = 0
        # No lock beyond the claims: each removal holds its key's claim, and a sweep that ran beside
        # another finds their keys claimed or gone.
        while stale := self._index.lapsed_claims(limit=_DROP_BATCH):
            lapsed += len(stale)
            objects += self._delete_claimed([k for k, _ in stale])
            if len(stale) < _DROP_BATCH:
                break
        cutoff = time.time() - grace_s
        batch: list[bytes] = []
        for key in itertools.chain(self.payloads.keys(), [None]):
            if key is not None:
                batch.append(key)
            if batch and (key is None or len(batch) >= _DROP_BATCH):
                stored = self._index.present(batch)
                unclaimed = [k for k in batch if k not in stored and k not in self._index.claimed(batch)]
                old = [k for k in unclaimed if (t := self.payloads.modified_at(k)) is not None and t < cutoff]
                deleted = self._delete_claimed(old)
                objects += deleted
                listed += len(batch) - deleted
                orphans += len(unclaimed) - deleted
                batch = []
        listing = BucketListing(objects=listed, orphans=orphans, listed_at=time.time(),
                                listed_by=self._index.server_name)
        self._index.set_meta(BUCKET_LISTING_META, listing_text(listing))
        return SweepResult(lapsed_claims=lapsed, objects_deleted=objects, listing=listing)

    def lapsed_claims(self, now: float | None = None, limit: int = 1000) -> list[tuple[bytes, str]]:
        """A shared tier's publish claims past their expiry at ``now`` (default: now), as
        (key, writer): what dead or stalled writers left for the sweeper. Empty otherwise."""
        return self._index.lapsed_claims(now, limit) if self.shared else []

    def claimed_keys(self, keys: Sequence[bytes]) -> set[bytes]:
        """Those of ``keys`` a writer of a shared tier holds a claim on now, lapsed or not (a put,
        an eviction or a sweep in flight, or a dead writer's, the sweeper's): their objects may
        have no row yet, or no longer. Empty for a store of its own."""
        return self._index.claimed(keys) if self.shared else set()

    def _delete_claimed(self, keys: Sequence[bytes]) -> int:
        """Claim ``keys`` (wins only unclaimed or lapsed ones, and never a key with a row), delete
        the objects of those won, release the claims; returns how many objects went."""
        won = list(self._index.claim(keys, self.writer_id, self.claim_ttl_s)) if keys else []
        if won:
            self.payloads.delete_many(won)
            self._release_claims(won)
        return len(won)

    @_mutation
    def purge_quarantine(self) -> int:
        """Delete every quarantined payload (kept for a post-mortem until now); returns how many."""
        return self.payloads.purge_quarantine()

    @_mutation
    def checkpoint(self) -> None:
        """Fold the index's write-ahead log into the database file (SQLite's TRUNCATE checkpoint)."""
        self._index.checkpoint()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the writer lock for the ``with`` block: no put publishes and no row is deleted in
        this process meanwhile (what a check looks at again stays as it is). Re-entrant."""
        with self._index.write_lock:
            yield

    def map_workers(self, fn: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
        """``fn`` over ``items`` on the store's worker threads, results in order (maintenance
        verifies files in parallel; zstd, xxhash and file reads release the GIL)."""
        return list(self._pool.map(fn, items))

    # -- the index file's side tables (the management API's stats history) ------------------

    @contextlib.contextmanager
    def read_side_tables(self) -> Iterator[Connection]:
        """A read connection to the index file, for tables that other parts own there (they
        create them in their own migrations of the same alembic history; never the disk tier's
        tables, which only this store changes)."""
        with self._index.engine.connect() as conn:
            yield conn

    @_mutation
    @contextlib.contextmanager
    def write_side_tables(self) -> Iterator[Connection]:
        """A write transaction on the index file for another part's own tables (see
        ``read_side_tables``), under the writer lock; committed when the block ends."""
        with self._index.write_lock, self._index.engine.begin() as conn:
            yield conn

    # -- reading the index -----------------------------------------------------------------

    def num_chunks(self) -> int:
        """How many chunks are stored (rows of the index)."""
        return self._index.count()

    def stored_bytes(self, namespace: str | None = None) -> int:
        """The stored (compressed) bytes of every chunk, or of ``namespace``'s."""
        return self._index.stored_bytes(namespace)

    def chunk_rows(self, keys: Sequence[bytes]) -> dict[bytes, ChunkRow]:
        """The index rows of the stored keys among ``keys`` (access times still buffered are not
        seen). Opens no file."""
        return self._index.rows(keys)

    def iter_rows(self, batch_size: int = 1000) -> Iterator[ChunkRow]:
        """Every row in key order, a batch at a time (bounded memory)."""
        return self._index.iter_rows(batch_size)

    def list_chunks(self, query: ChunkQuery = ChunkQuery(), *, order: ChunkOrder = ChunkOrder.LAST_ACCESS,
                    descending: bool = True, limit: int = 100,
                    after: tuple[float, bytes] | None = None) -> list[ChunkRow]:
        """Up to ``limit`` rows matching ``query``, sorted by ``order`` then key, after the (sort
        value, key) ``after`` (keyset paging; ChunkIndex.list_chunks)."""
        return self._index.list_chunks(query, order=order, descending=descending, limit=limit, after=after)

    def count_chunks(self, query: ChunkQuery = ChunkQuery()) -> int:
        """How many rows match ``query``."""
        return self._index.count_chunks(query)

    def child_keys(self, key: bytes) -> list[bytes]:
        """The stored chunks that extend ``key`` by one page."""
        return self._index.child_keys(key)

    def namespace_usage(self) -> list[NamespaceUsage]:
        """Per namespace with chunks or a quota: chunks, raw and stored bytes, quota (kept by the
        index's triggers, so never drifting from the rows)."""
        return self._index.usage()

    def quota(self, namespace: str) -> int | None:
        """The quota of ``namespace`` in stored bytes, None when it has none."""
        return self._index.quota(namespace)

    # -- eviction, pins, quotas ------------------------------------------------------------

    def plan_eviction(self, selection: EvictionSelection) -> EvictionPlan:
        """What ``selection`` evicts now, in eviction order (chunkstore/disk/eviction.py), changing
        nothing: the same plan serves a dry run and ``evict``. Buffered access times are written
        first on a writable store (they decide the order). Raises ChunkNotStoredError (an unknown
        key), StrandedDescendantsError (a key alone that has stored descendants)."""
        return self._plan(selection)

    def _plan(self, selection: EvictionSelection, exclude: frozenset[bytes] | set[bytes] = frozenset()) -> EvictionPlan:
        if not self.read_only:
            self._index.flush()
        return plan_of(self._index, selection, generation=self._index.generation, exclude=exclude)

    @_mutation
    def evict(self, plan: EvictionPlan) -> EvictionPlan:
        """Carry out ``plan`` (row, then file, per chunk; counted as evictions) under the writer
        lock, and return what was evicted: ``plan`` itself while the index is as it was planned,
        else the plan of the same selection made again under the lock (a put, access or pin since
        may have changed the order or made a chunk unsafe to drop), so a stale plan never drops a
        pinned chunk or leaves a hole. Raises as ``plan_eviction`` and ReadOnlyStoreError."""
        with self._index.write_lock, self._index.evictor_lock():
            self._index.flush()  # buffered access times count as a change of the order
            # (a shared tier's other writers change it unseen: its plans are always made again)
            if self.shared or plan.generation != self._index.generation:
                plan = plan_of(self._index, plan.selection, generation=self._index.generation)
            for i in range(0, len(plan.victims), _DROP_BATCH):
                self._drop(plan.victims[i:i + _DROP_BATCH])
        return plan

    @_mutation
    def delete(self, keys: Sequence[bytes]) -> EvictResult:
        """Delete the stored chunks ``keys`` (row, then file; counted as evictions), under the writer
        lock; keys not stored are ignored. A set that would leave a hole is refused as a whole: a
        pinned chunk, or a stored chunk outside ``keys`` that extends one of them (it would become
        unreachable; give its subtree), raise ValueError and delete nothing. Raises
        ReadOnlyStoreError for a read-only store. Returns what was deleted (its keys in the order given)."""
        wanted = list(dict.fromkeys(keys))
        with self._index.write_lock:
            rows = self._index.rows(wanted)
            pinned = [k for k, r in rows.items() if r.pinned]
            if pinned:
                raise ValueError(f"{len(pinned)} of the chunks are pinned (e.g. {pinned[0].hex()}): unpin them first")
            for parent, children in self._index.children_of(list(rows)).items():
                outside = [c for c in children if c not in rows]
                if outside:
                    raise ValueError(f"chunk {parent.hex()} has stored descendants that are not being deleted "
                                     f"(e.g. {outside[0].hex()}); they would be left unreachable")
            victims = [rows[k] for k in wanted if k in rows]
            for i in range(0, len(victims), _DROP_BATCH):
                self._drop(victims[i:i + _DROP_BATCH])
        return EvictResult(len(victims), sum(v.stored_bytes for v in victims), tuple(v.key for v in victims))

    def _drop(self, victims: Sequence[ChunkRow | Victim]) -> None:
        if not victims:
            return
        keys = [v.key for v in victims]
        if not self.shared:
            self._index.delete(keys)  # row first, then the file
            for key in keys:
                self.payloads.delete(key)
        else:
            # Row first, then the object, with the keys claimed meanwhile so that no other writer
            # uploads one of them while its object is being deleted.
            self._index.delete_claiming(keys, self.writer_id, self.claim_ttl_s)
            try:
                self.payloads.delete_many(keys)
            except PayloadsUnavailable as exc:  # the claims lapse; the sweeper deletes the objects
                self._writes.failed("object delete", exc, num_pages=0)
            else:
                self._release_claims(keys)
        for v in victims:
            self._index.count_event(v.namespace, "evictions")

    @_mutation
    def delete_namespace(self, namespace: str) -> EvictResult:
        """Delete every chunk of ``namespace``, pinned ones included."""
        n = freed = 0
        with self._index.write_lock:
            while batch := self._index.keys_in_namespace(namespace, 1000):
                self._drop(batch)
                n += len(batch)
                freed += sum(v.stored_bytes for v in batch)
        return EvictResult(n, freed)

    @_mutation
    def pin(self, keys: Sequence[bytes]) -> int:
        """Keep ``keys`` from eviction; returns how many stored chunks were changed."""
        return self._index.set_pinned(keys, True)

    @_mutation
    def unpin(self, keys: Sequence[bytes]) -> int:
        return self._index.set_pinned(keys, False)

    @_mutation
    def set_quota(self, namespace: str, quota_bytes: int | None) -> None:
        """Bound the stored bytes of ``namespace`` (None removes the quota). Takes effect on the
        next put into that namespace, which evicts within it to fit."""
        if quota_bytes is not None and quota_bytes < 0:
            raise ValueError("quota_bytes must be >= 0")
        self._index.set_quota(namespace, quota_bytes)

    def flush(self) -> None:
        """Write buffered access times and counters to the index. Raises sqlalchemy's DBAPIError
        when that fails (a full disk; counted as a failed write, the counters stay buffered)."""
        try:
            self._index.flush()
        except DBAPIError as exc:
            self._writes.failed("index flush", exc, num_pages=0)
            raise

    # -- stats -----------------------------------------------------------------------------

    def stats(self) -> StoreStats:
        """The store's figures (the whole tier's, on a shared tier, with ``shared`` set: its claims,
        this server's read health and every server's counts, this one's first)."""
        stats = store_stats(self._index.counter_values(), self._index.usage(), self.capacity_bytes,
                            self._writes.health())
        if not self.shared:
            return stats
        claims, lapsed = self._index.claim_counts()
        servers = server_stats(self._index.server_counts(), self._index.server_name, time.time())
        shared = SharedTierStats(payload_store=self.payloads.shared_name, index=self._index.name,
                                 writer_id=self.writer_id, claims=claims, lapsed_claims=lapsed,
                                 read_health=self._reads.health(), server_name=self._index.server_name,
                                 servers=servers, local_copy=self.payloads.local_copy_stats(),
                                 bucket=listing_of(self._index.get_meta(BUCKET_LISTING_META)))
        return dataclasses.replace(stats, shared=shared)
