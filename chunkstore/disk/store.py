"""ChunkStore: the disk tier's coordinator (batch put / get / exists, eviction, pins, quotas, stats).

Invariants: the index is private (``_index``): every other part, the API, CLI, maintenance and
benchmarks included, calls the store's methods; a key is present iff its index row exists, and a
row exists only after its payload was published (payload, then row; deleting: row, then payload);
every read verifies the payload (checksums, key, parent, tokens, layout) and a bad one is
quarantined and reported as a miss, never returned; a read-only store refuses every mutating
method (MUTATING_METHODS) through one guard (read_only.py); one process writes a store at a time
(an exclusive lock file), one thread at a time within it; every failed write is counted, logged
rate-limited, and marks the store degraded until a write succeeds; closing never raises for a
full disk (what could not be written is reported, the index is closed).
torch is imported only by what moves tensors (put, get, get_into, ``torch_dtype``): opening a store
and its offline care (stats, verify, gc, evict; maintenance.py) never load it.
Files in the data folder are 0600 and folders 0700 (files.py, store_folder.py).
Two seams stand for another backend: the index is reached through its URL (``index_url``: a SQLite
file in the store's folder by default) and the payloads through a PayloadStore (``payloads``: the
folder tree of files.py by default). The store chooses, once, the protocol its payloads need, and
is the only place that knows whether its tier is shared: FolderProtocol (protocol.py) when only it
writes them, SharedProtocol (shared_protocol.py, sweep.py) when other servers do. It also chooses,
once, whether it is sealed (keyring.py: with a master key every chunk is sealed and named by its
namespace's keys; store_sealing.py: list, shred, rotate). The other
parts: index_reads.py (the read view of the index), store_eviction.py (evict, delete, pins,
quotas), store_folder.py (store.json, the lock, ``store_root``, the index's claim), page_io.py
(pages to payloads and back, verified), eviction.py (the plans), results.py (what it returns).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
from sqlalchemy.exc import DBAPIError

from chunkstore.disk.codec import Codec
from chunkstore.disk.file_check import FileCheck, FileStatus
from chunkstore.disk.files import ChunkFiles, Durability, make_private_dir
from chunkstore.disk.identity import ModelIdentity
from chunkstore.disk.index import COUNTER_FLUSH_S, ChunkIndex, ChunkRow, LockStats, drop_index, sqlite_url
from chunkstore.disk.index_reads import IndexReads
from chunkstore.disk.read_only import mutation as _mutation
from chunkstore.disk.keyring import Sealing, carry_seal_state, open_sealing
from chunkstore.disk.keys import PageRef, encode_tokens, page_key
from chunkstore.disk.namespaces import check_namespace
from chunkstore.disk.page_io import PageLoader, page_arrays, torch_dtypes
from chunkstore.disk.payloads import PayloadStore, PayloadsUnavailable
from chunkstore.disk.protocol import FolderProtocol, StoreProtocol
from chunkstore.disk.results import (STORE_WIDE, EvictResult, NamespaceStats, PutResult, ReadOnlyStoreError,
                                     StoreStats, SweepResult, store_stats)
from chunkstore.disk.shared_protocol import CLAIM_TTL_S, SHARED_WRITE_WORKERS, SWEEP_GRACE_S, SharedProtocol
from chunkstore.disk.store_folder import (MODELS_DIRNAME, PRIVATE_MARKER, STORE_FILENAME, StoreBusyError, WriterLock,
                                          check_identity, claim_index, make_private_once, read_identity, store_root,
                                          warn_if_not_private)
from chunkstore.disk.seal_keys import KeyProvider
from chunkstore.disk.security_events import SecurityEvents
from chunkstore.disk.store_eviction import EvictionOps
from chunkstore.disk.store_namespaces import NamespaceChecks
from chunkstore.disk.store_options import StoreOptions
from chunkstore.disk.store_sealing import SealOps
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

# The public methods of ChunkStore, each in one of two lists (tests/test_store_read_only.py checks
# the class against them, so a new method cannot skip the read-only guard): a mutation refuses a
# read-only store (read_only.py), with ReadOnlyStoreError and changing nothing; the rest read, or
# write only the access times and counters that a read-only store keeps in memory (flush, close).
MUTATING_METHODS = (
    "put", "evict", "delete", "delete_namespace", "pin", "unpin", "set_quota",
    "adopt", "quarantine", "sweep", "drop_missing", "remove_leftover_temps", "purge_quarantine", "checkpoint",
    "shred_namespace", "rotate_seal_key",
)
READING_METHODS = (
    "close", "exists", "longest_prefix", "get", "get_into", "verify_file", "plan_eviction", "flush", "stats",
    "num_chunks", "stored_bytes", "chunk_rows", "iter_rows", "list_chunks", "count_chunks", "child_keys",
    "namespace_usage", "quota", "exclusive", "map_workers", "lapsed_claims", "claimed_keys",
    "namespace_keys", "evictor_lock_stats", "room_lock_stats",
)


def _check_namespaces(pages: Sequence[PageRef]) -> None:
    """Raise NamespaceError (a ValueError) when a page's namespace cannot be one (namespaces.py)."""
    for namespace in {p.namespace for p in pages}:
        check_namespace(namespace)


def default_num_workers(shared: bool = False) -> int:
    """Threads that compress and write: two per core, as writes block in fsync; a shared tier's at
    least SHARED_WRITE_WORKERS, as its uploads wait on the network."""
    folder = max(4, 2 * (os.cpu_count() or 2))
    return max(folder, SHARED_WRITE_WORKERS) if shared else folder


class ChunkStore(NamespaceChecks, IndexReads, EvictionOps, SealOps):
    """A persistent, content-addressed store of KV pages under ``path``.

    Thread-safe. ``capacity_bytes`` bounds the stored (compressed) bytes; None means unbounded.
    Raises ModelMismatchError when ``path`` holds another model's store (unless
    ``allow_other_models``: keys bind the identity, so models never share chunks),
    StoreBusyError when another process is writing it, and ValueError naming an option it cannot
    use and the value given (store_options.py), before anything opens. Every method that takes a
    namespace refuses one that cannot be (namespaces.py; store_namespaces.py for the inherited
    ones). ``direct_reads`` reads chunk files around
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
    ``durability`` and ``direct_reads``, which a PayloadStore passed in brings its own of);
    ``seal_key`` the master key of a sealed store (seal_keys.py; None: unsealed; opening refuses a
    sealed store without its key, another key, or a key for unsealed chunks: SealKeyError). The
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
        seal_key: KeyProvider | None = None,
    ):
        # Every option checked before anything opens (store_options.py: its name and value if not).
        options = StoreOptions(capacity_bytes, codec, zstd_level, durability, num_workers, io_threads, decode_threads,
                               failure_log_interval_s, claim_ttl_s, background_priority)
        capacity_bytes, codec, durability = options.capacity_bytes, options.codec, options.durability
        self.background_priority = options.background_priority
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
        self._security = SecurityEvents(self.root, failure_log_interval_s)
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
            # Where the index is (a SQLAlchemy URL): the management API keeps its own tables there.
            self.index_url = url
            if not read_only:
                self.payloads.create()
                self.payloads.remove_leftovers()
                if reset_index:  # the payloads stay; `maintenance.rebuild` re-indexes them
                    carried = carry_seal_state(url)  # (a sealed store's keys live in its index)
                    drop_index(url)
            # A writer that finds payloads but no index must not start an empty one (that would
            # hide every chunk): it asks for `chunkstore rebuild` instead.
            self._index = index_factory(url, read_only=read_only,
                                        must_exist=not reset_index and self.payloads.has_any())
            claim_index(self._index, self.root, identity, read_only=read_only,
                        allow_other_models=allow_other_models, shared_name=self.payloads.shared_name)
            if reset_index and not read_only:
                carried.restore(self._index)
            # Sealed or not, chosen once (keyring.py): how pages are named and stored.
            self.sealing: Sealing = open_sealing(self._index, seal_key, identity, read_only=read_only,
                                                 where=self.payloads.shared_name or str(self.root))
            if read_only:
                warn_if_not_private(self.root)
            else:
                make_private_once(self.root, self.payloads)
        except BaseException:
            self._release_writer_lock()
            raise
        self.num_workers = num_workers or default_num_workers(self.shared)
        self._loader = PageLoader(self.payloads, identity, io_threads=io_threads, decode_threads=decode_threads,
                                  sealing=self.sealing)
        self.io_threads, self.decode_threads = self._loader.io_threads, self._loader.decode_threads
        self._background_loader = self._loader if self.background_priority is ThreadPriority.NORMAL else \
            PageLoader(self.payloads, identity, io_threads=io_threads, decode_threads=decode_threads,
                       priority=self.background_priority, thread_name="chunkstore-background", sealing=self.sealing)
        self._pool = ThreadPoolExecutor(max_workers=self.num_workers, thread_name_prefix="chunkstore-write",
                                        initializer=lower_this_thread, initargs=(self.background_priority,))
        # The one place that knows whether the tier is shared: how pages are published and go.
        self._protocol: StoreProtocol = SharedProtocol(self) if self.shared else FolderProtocol(self)
        # A writer that only serves hits makes no write that would carry its buffered counts and
        # access times: they are written every COUNTER_FLUSH_S, so another process sees them.
        self._stop_flusher = threading.Event()
        self._flusher: threading.Thread | None = None
        if not read_only:
            self._flusher = threading.Thread(target=self._flush_loop, name="chunkstore-flush", daemon=True)
            self._flusher.start()

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

    def _flush_loop(self) -> None:
        while not self._stop_flusher.wait(COUNTER_FLUSH_S):
            try:
                self._index.flush_if_due()
            except DBAPIError as exc:  # a full disk, a database gone: the counts stay buffered
                self._writes.failed("index flush", exc, num_pages=0)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_flusher.set()
        if self._flusher is not None:
            self._flusher.join()
        self._loader.close()
        self._background_loader.close()
        self._pool.shutdown(wait=True)
        try:
            self._index.close()  # writes the buffered counters, then disposes of the connections
        except DBAPIError as exc:  # a full disk: those counters are lost, the index stays consistent
            self._writes.failed("index flush at close", exc, num_pages=0)
        self._writes.flush_log()
        self._security.flush_log()
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

    @_mutation
    def put(self, pages: Sequence[PageRef], tensors: Sequence[torch.Tensor]) -> PutResult:
        """Store pages (one tensor of ``identity.page_shape`` each). Keys already stored are
        deduplicated (nothing written). Compression and payload writes run in the worker pool; the
        index is updated under the writer lock (protocol.py, shared_protocol.py). A page that
        cannot be written (disk full, over capacity or quota) is listed in ``failed`` and leaves
        nothing visible. The result names pages by their keys as given (a sealed store stores
        them under names of its own: ``sealing``; a page whose namespace has no usable seal key
        fails). Raises ValueError for a page of the wrong shape, dtype or token count, or of a
        namespace that cannot be one (namespaces.py), ReadOnlyStoreError.
        """
        if len(pages) != len(tensors):
            raise ValueError(f"{len(pages)} pages but {len(tensors)} tensors")
        _check_namespaces(pages)
        for p, t in zip(pages, tensors):
            self._check_page(p, t)
        arrays = page_arrays(tensors)
        if not self.sealing.is_sealed:
            return self._protocol.put(pages, arrays, pages, PutResult())
        stored = self._stored_pages(pages, create=True)
        keyed = [i for i, s in enumerate(stored) if s is not None]
        result = self._protocol.put([stored[i] for i in keyed], [arrays[i] for i in keyed], [pages[i] for i in keyed],
                                    PutResult())
        given = {stored[i].key: pages[i].key for i in keyed}
        failed = {p.key: "write failed: no usable seal key for its namespace (see the log)"
                  for p, s in zip(pages, stored) if s is None}
        for p in (p for p, s in zip(pages, stored) if s is None):
            self._index.count_event(p.namespace, "write_errors")
        return PutResult(stored=[given[k] for k in result.stored], deduplicated=[given[k] for k in result.deduplicated],
                         failed={**failed, **{given[k]: why for k, why in result.failed.items()}})

    def _stored_pages(self, pages: Sequence[PageRef], create: bool = False) -> list[PageRef | None]:
        """The pages as the store keeps them (``sealing.stored_pages``); None for each while the
        index does not answer (a read's miss, a put's failed page; logged as a read failure)."""
        try:
            return self.sealing.stored_pages(pages, create)
        except DBAPIError as exc:
            self._reads.failed("seal key lookup", exc, num_pages=len(pages))
            return [None] * len(pages)

    def _names(self, namespace: str | None, keys: Sequence[bytes]) -> list[bytes | None]:
        try:
            return self.sealing.names(namespace, keys)
        except DBAPIError as exc:
            self._reads.failed("seal key lookup", exc, num_pages=len(keys))
            return [None] * len(keys)

    # -- get / exists ----------------------------------------------------------------------

    def _present(self, keys: Sequence[bytes | None]) -> set[bytes]:
        """The stored keys among ``keys``; none while the index does not answer (a database that
        went away: a miss, logged at most once per interval, never an error to the caller)."""
        try:
            present = self._index.present([k for k in keys if k is not None])
        except DBAPIError as exc:
            self._reads.failed("index lookup", exc, num_pages=len(keys))
            return set()
        self._reads.succeeded()
        return present

    def exists(self, keys: Sequence[bytes], namespace: str | None = None) -> list[bool]:
        """Whether each key is stored (index only; no file is opened). False while the index does
        not answer. ``keys`` are keys as the index holds them (its rows'), or, given their
        ``namespace``, chain keys as ``chain_pages`` makes them: the same in an unsealed store,
        named by the namespace's naming key in a sealed one. Raises ValueError (NamespaceError) for a
        namespace that cannot be one."""
        if namespace is not None:
            check_namespace(namespace)
        names = self._names(namespace, keys)
        present = self._present(names)
        return [k in present for k in names]

    def longest_prefix(self, keys: Sequence[bytes], namespace: str | None = None) -> int:
        """How many leading keys of a chain are stored (0 while the index does not answer); the keys
        and ``namespace`` as for ``exists``."""
        if namespace is not None:
            check_namespace(namespace)
        names = self._names(namespace, keys)
        present = self._present(names)
        n = 0
        for k in names:
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
        corrupt files are quarantined, and in a sealed store a chunk that does not authenticate
        is also counted and logged as a security event. Never raises for a bad file; raises
        ValueError for destinations that do not fit and pages of a namespace that cannot be one.
        """
        if len(pages) != len(outs):
            raise ValueError(f"{len(pages)} pages but {len(outs)} destinations")
        _check_namespaces(pages)
        for out in outs:
            if out.dtype != self.torch_dtype or tuple(out.shape) != self.identity.page_shape:
                raise ValueError(f"destination must be {self.torch_dtype} of shape {self.identity.page_shape}")
        names = [s.key if s is not None else None for s in self._stored_pages(pages)]
        present = self._present(names)
        loader = self._background_loader if background else self._loader
        checks = loader.load([(i, names[i], p, outs[i]) for i, p in enumerate(pages) if names[i] in present])
        hits: list[bool] = []
        missing: list[bytes] = []
        corrupt: list[tuple[bytes, PageRef, FileCheck]] = []
        for i, p in enumerate(pages):
            check = checks.get(i)  # None: not in the index
            hits.append(check is not None and check.is_ok)
            if check is not None and check.status is FileStatus.MISSING:
                missing.append(names[i])
            elif check is not None and check.status is FileStatus.UNAVAILABLE:
                self._reads.failed("payload read", PayloadsUnavailable(check.text), num_pages=1)
            elif check is not None and check.is_bad:
                corrupt.append((names[i], p, check))
        try:
            self._index.touch(n for n, h in zip(names, hits) if h)  # may flush a full buffer to the index
        except DBAPIError as exc:  # a full disk: the access times are dropped, the read still counts
            self._writes.failed("index flush", exc, num_pages=0)
        for p, h in zip(pages, hits):
            self._index.count_event(p.namespace, "hits" if h else "misses")
        try:
            if missing and not self.read_only:
                self._protocol.drop_missing(missing)
            for name, p, check in corrupt:
                if check.is_unauthentic:
                    self._index.count_event(p.namespace, "auth_failures")
                    self._security.failed_authentication(name, p.namespace, check.text)
                self._quarantine(name, p.namespace, check.text, p)
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
            moved = self._protocol.quarantine(key, page, row)
        if moved is None:
            return False
        self._index.count_event(namespace, "quarantined")
        log.warning("quarantined chunk %s (%s) to %s", key.hex(), why, moved)
        return True

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
        return self._protocol.drop_missing(keys)

    @_mutation
    def adopt(self, rows: Sequence[ChunkRow]) -> int:
        """Index chunk files that have no row (``rows`` made from their verified headers; the file
        is there first, as in a put); keys already indexed are left as they are. Returns how many
        rows were new. Not counted against the capacity until then (files without a row are
        invisible). On a shared tier under the publish protocol: a key another writer claims
        (its put, an eviction, the sweeper) is left to it, and an object gone once claimed gets
        no row."""
        return self._protocol.adopt(rows)

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
        return self._protocol.sweep(grace_s)

    def lapsed_claims(self, now: float | None = None, limit: int = 1000) -> list[tuple[bytes, str]]:
        """A shared tier's publish claims past their expiry at ``now`` (default: now), as
        (key, writer): what dead or stalled writers left for the sweeper. Empty otherwise."""
        return self._protocol.lapsed_claims(now, limit)

    def claimed_keys(self, keys: Sequence[bytes]) -> set[bytes]:
        """Those of ``keys`` a writer of a shared tier holds a claim on now, lapsed or not (a put,
        an eviction or a sweep in flight, or a dead writer's, the sweeper's): their objects may
        have no row yet, or no longer. Empty for a store of its own."""
        return self._protocol.claimed_keys(keys)

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
        this server's read health and every server's counts, this one's first; shared_protocol.py)."""
        stats = store_stats(self._index.counter_values(), self._index.usage(), self.capacity_bytes,
                            self._writes.health())
        if self.sealing.is_sealed:
            stats = dataclasses.replace(stats, sealed=True, sealing_work=self.sealing.work())
        return self._protocol.stats(stats)

    def evictor_lock_stats(self) -> LockStats:
        """This process's passes through the index's evictor lock since it opened (``stats``
        shows them on a shared tier): no statement, so a caller may ask around each put."""
        return self._index.evictor_lock_stats()

    def room_lock_stats(self) -> LockStats:
        """This process's passes through the index's room lock since it opened (a bounded put's
        row commit within a capacity takes it; ``stats`` shows them on a shared tier)."""
        return self._index.room_lock_stats()
