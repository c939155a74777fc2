"""ObjectPayloads: chunk payloads as objects in an S3-compatible bucket (AWS S3, Ceph RGW, MinIO),
the second PayloadStore beside the folder tree (files.py).

Layout under ``s3://bucket/prefix``: ``chunks/<key hex>.kv`` (one object per chunk: the whole
chunk file, header and payload together, so an object is never half of a chunk) and
``quarantine/<key hex>-<time ns>.kv`` (payloads that failed verification, kept for a post-mortem).

Invariants:
- Write-once: a payload is staged in memory and published with one conditional PUT
  (``If-None-Match: *``). S3 PUTs are atomic, so a key holds a whole object or none; an object
  already there (a dead writer's, under the same content key) is left as it is and counts as
  published: every read verifies it, so a bad one is a miss, never wrong data.
- Nothing is staged in the bucket, so a dead writer leaves no leftovers here; what it published
  without a row is an orphan for the sweeper (the index names only what a writer committed).
- A bucket that cannot be reached (network, credentials, a stopped server) raises
  ``PayloadsUnavailable``, never FileNotFoundError: the store then misses and deletes nothing.
  Only the server's own "no such key" is FileNotFoundError. Requests are bounded
  (``timeout_s``, ``connect_timeout_s``, ``max_retries``), so an outage costs a request seconds at
  most, not the client library's minutes of retries.
- Reads never allocate past ``max_size_bytes``: the object's size is checked from the response
  headers before its body is read, and the body streams into the caller's buffer.

The client is obstore (Rust's object_store crate): it releases the GIL for the whole request, so
parallel GETs and PUTs from the store's thread pools run in parallel, and it speaks conditional
PUTs (``mode="create"``) natively.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from urllib.parse import urlsplit

from chunkstore.disk.payloads import PayloadStore, PayloadsUnavailable, Staged, read_buffer

CHUNKS_PREFIX = "chunks/"
QUARANTINE_PREFIX = "quarantine/"
OBJECT_SUFFIX = ".kv"
KEY_HEX_CHARS = 64
INSTALL_HINT = "the object store needs obstore: pip install 'chunkstore[fleet]'"
DELETE_BATCH = 1000  # S3's DeleteObjects takes up to 1,000 keys


@dataclass(frozen=True, slots=True)
class ObjectStoreConfig:
    """Where and how to reach a bucket. Unset fields come from the usual AWS variables
    (AWS_ENDPOINT_URL, AWS_REGION / AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    AWS_SESSION_TOKEN), read by the client."""

    url: str  # s3://bucket or s3://bucket/prefix
    endpoint_url: str | None = None  # e.g. http://127.0.0.1:7480 for RGW or MinIO; None: AWS
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    timeout_s: float = 30.0  # one request, body included
    connect_timeout_s: float = 2.0
    max_retries: int = 2  # per request, on connection errors and 5xx answers
    retry_timeout_s: float = 5.0  # no retry starts later than this after the first try

    @property
    def bucket(self) -> str:
        return parse_object_url(self.url)[0]

    @property
    def prefix(self) -> str:
        return parse_object_url(self.url)[1]


def parse_object_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of ``s3://bucket[/prefix]``; the prefix has no leading or trailing slash.
    Raises ValueError for another scheme or a URL without a bucket."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise ValueError(f"object store URL {url!r} is not s3://bucket[/prefix]")
    if parts.query or parts.fragment:
        raise ValueError(f"object store URL {url!r} has a query or fragment; give s3://bucket[/prefix]")
    return parts.netloc, parts.path.strip("/")


def display_object_url(config: ObjectStoreConfig) -> str:
    where = f" at {config.endpoint_url}" if config.endpoint_url else ""
    return f"{config.url}{where}"


def _obstore():
    try:
        import obstore
        import obstore.exceptions
        import obstore.store
    except ImportError as exc:  # pragma: no cover - dev installs have it
        raise ImportError(INSTALL_HINT) from exc
    return obstore


class ObjectPayloads(PayloadStore):
    """The payloads of one store in ``config.url``'s bucket (see the module's invariants).
    Thread-safe: obstore's store is shared by every thread."""

    def __init__(self, config: ObjectStoreConfig):
        self.config = config
        self.location = display_object_url(config)
        self.shared_name = config.url  # every server names the bucket so, whatever its endpoint
        bucket, prefix = parse_object_url(config.url)
        self._prefix = f"{prefix}/" if prefix else ""
        self._ob = _obstore()
        self._errors = self._ob.exceptions
        self._store = self._open(bucket)
        self._local = threading.local()

    def _open(self, bucket: str):
        try:
            return self._ob.store.S3Store(bucket, **self.store_options())
        except self._errors.BaseError as exc:
            raise ValueError(f"cannot configure the object store {self.location}: {exc}") from exc

    def store_options(self) -> dict:
        """The keyword arguments of obstore's S3Store for this config (the benchmark's raw
        requests use the same client settings)."""
        cfg = self.config
        kwargs: dict[str, object] = {}
        if cfg.endpoint_url or os.environ.get("AWS_ENDPOINT_URL"):
            endpoint = cfg.endpoint_url or os.environ["AWS_ENDPOINT_URL"]
            kwargs.update(endpoint=endpoint, virtual_hosted_style_request=False)
        if cfg.region:
            kwargs["region"] = cfg.region
        if cfg.access_key_id:
            kwargs["access_key_id"] = cfg.access_key_id
        if cfg.secret_access_key:
            kwargs["secret_access_key"] = cfg.secret_access_key
        client = {"timeout": f"{cfg.timeout_s}s", "connect_timeout": f"{cfg.connect_timeout_s}s",
                  "allow_http": str(kwargs.get("endpoint", "")).startswith("http://")}
        retry = {"max_retries": cfg.max_retries, "retry_timeout": _timedelta(cfg.retry_timeout_s)}
        return {"client_options": client, "retry_config": retry, **kwargs}

    # -- names -----------------------------------------------------------------------------

    def path_for(self, key: bytes) -> str:
        """The object name of ``key``'s payload (relative to the bucket, prefix included)."""
        return f"{self._prefix}{CHUNKS_PREFIX}{key.hex()}{OBJECT_SUFFIX}"

    def _relative(self, name: str) -> str:
        return name[len(self._prefix):] if name.startswith(self._prefix) else name

    def key_from_name(self, name: str) -> bytes | None:
        rest = self._relative(name)
        if not (rest.startswith(CHUNKS_PREFIX) and rest.endswith(OBJECT_SUFFIX)):
            return None
        hex_key = rest[len(CHUNKS_PREFIX):-len(OBJECT_SUFFIX)]
        if len(hex_key) != KEY_HEX_CHARS:
            return None
        try:
            return bytes.fromhex(hex_key)
        except ValueError:
            return None

    def _unavailable(self, what: str, exc: BaseException) -> PayloadsUnavailable:
        error = PayloadsUnavailable(errno.EIO, f"object store {self.location} unavailable ({what}): "
                                               f"{first_line(exc)}")
        error.no_such_bucket = "NoSuchBucket" in str(exc)
        return error

    # -- lifecycle -------------------------------------------------------------------------

    def create(self) -> None:
        """Check that the bucket answers (one listing of at most one object): a missing bucket or
        bad credentials fail the open with a clear error, not the first put. Buckets are made by
        their operator (their region, policy and lifecycle are not ours to choose)."""
        try:
            self._first(CHUNKS_PREFIX)
        except PayloadsUnavailable as exc:
            if not getattr(exc, "no_such_bucket", False):
                raise
            raise FileNotFoundError(errno.ENOENT, f"no bucket {self.config.bucket!r} at "
                                    f"{self.config.endpoint_url or 'AWS S3'}; create it first") from None

    def make_private(self) -> int:
        return 0  # who may read a bucket is its policy's business, set by its operator

    def has_any(self) -> bool:
        return self._first(CHUNKS_PREFIX) is not None

    def _first(self, sub_prefix: str) -> str | None:
        with self._answers("list", sub_prefix):
            for batch in self._ob.list(self._store, f"{self._prefix}{sub_prefix}", chunk_size=1):
                for meta in batch:
                    return meta["path"]
        return None

    # -- writing ---------------------------------------------------------------------------

    def stage(self, key: bytes, segments: Sequence[bytes | memoryview]) -> Staged:
        """Join the payload in memory (nothing goes to the bucket before ``publish``)."""
        return Staged(key, b"".join(segments))

    def publish(self, staged: Sequence[Staged], executor: Executor | None = None) -> None:
        """One conditional PUT per payload (in parallel on ``executor``). An object already under
        the key stays (see the module's invariants). Raises PayloadsUnavailable (an OSError) when
        any PUT fails; the caller then deletes the keys."""
        if executor is None or len(staged) < 2:
            for item in staged:
                self._put(item)
        else:
            list(executor.map(self._put, staged))

    def _put(self, item: Staged) -> None:
        name = self.path_for(item.key)
        try:
            with self._answers("put", name):
                try:
                    self._ob.put(self._store, name, item.handle, mode="create", use_multipart=False)
                except (self._errors.AlreadyExistsError, self._errors.PreconditionError):
                    return  # there already (412 is a failed precondition to some clients)
        except FileNotFoundError as exc:  # a 404 for a PUT: the bucket is gone
            raise self._unavailable("put", exc) from exc

    def discard(self, staged: Staged) -> None:
        return None  # only in memory

    # -- reading ---------------------------------------------------------------------------

    def read(self, key: bytes, max_size_bytes: int, buffer: mmap.mmap | None = None) -> memoryview:
        """The whole object of ``key`` streamed into ``buffer`` (or a per-thread buffer valid until
        this thread's next read). Raises FileNotFoundError for no such object, OSError(EFBIG) for
        one over ``max_size_bytes`` (checked before its body is read), PayloadsUnavailable."""
        with self._answers("get", self.path_for(key)):
            result = self._ob.get(self._store, self.path_for(key))
            size = int(result.meta["size"])
        if size > max_size_bytes:
            raise OSError(errno.EFBIG, f"object of {size} bytes exceeds {max_size_bytes}")
        view = self._buffer(size, buffer)
        got = 0
        with self._answers("get", self.path_for(key)):
            for part in result.stream(min_chunk_size=1 << 20):
                part = memoryview(part)
                if got + len(part) > size:
                    raise OSError(errno.EFBIG, f"object {key.hex()} sent more than its {size} bytes")
                view[got:got + len(part)] = part
                got += len(part)
        return view[:got]

    @contextlib.contextmanager
    def _answers(self, what: str, name: str) -> Iterator[None]:
        """The client's errors as the interface's: the server's "no such key" is FileNotFoundError,
        anything else it raises (no answer, an error answer) is PayloadsUnavailable."""
        try:
            yield
        except FileNotFoundError as exc:  # obstore raises the built-in for a 404
            raise FileNotFoundError(errno.ENOENT, f"no object {name}") from exc
        except PayloadsUnavailable:
            raise
        except OSError as exc:
            if exc.errno == errno.EFBIG:
                raise
            raise self._unavailable(what, exc) from exc
        except self._errors.BaseError as exc:
            raise self._unavailable(what, exc) from exc

    def _buffer(self, size: int, buffer: mmap.mmap | None) -> memoryview:
        return read_buffer(self._local, size, buffer)

    def _head(self, name: str) -> dict | None:
        try:
            with self._answers("head", name):
                return self._ob.head(self._store, name)
        except FileNotFoundError:
            return None

    def exists(self, key: bytes) -> bool:
        return self._head(self.path_for(key)) is not None

    def modified_at(self, key: bytes) -> float | None:
        meta = self._head(self.path_for(key))
        return None if meta is None else meta["last_modified"].timestamp()

    def keys(self) -> Iterator[bytes]:
        """Every published key (a listing of chunks/, in pages of 1,000)."""
        for name in self._names(CHUNKS_PREFIX):
            if (key := self.key_from_name(name)) is not None:
                yield key

    def _names(self, sub_prefix: str) -> Iterator[str]:
        with self._answers("list", sub_prefix):
            for batch in self._ob.list(self._store, f"{self._prefix}{sub_prefix}", chunk_size=1000):
                for meta in batch:
                    yield meta["path"]

    # -- removing --------------------------------------------------------------------------

    def delete(self, key: bytes) -> bool:
        """Remove ``key``'s object; returns whether there was one (a HEAD first: S3 answers a
        DELETE of nothing as a success)."""
        name = self.path_for(key)
        if self._head(name) is None:
            return False
        self._delete([name])
        return True

    def delete_many(self, keys: Sequence[bytes]) -> None:
        """Remove the objects of ``keys`` (absent ones included) in batched DeleteObjects calls."""
        names = [self.path_for(k) for k in keys]
        for i in range(0, len(names), DELETE_BATCH):
            self._delete(names[i:i + DELETE_BATCH])

    def _delete(self, names: Sequence[str]) -> None:
        try:
            with self._answers("delete", names[0]):
                self._ob.delete(self._store, list(names) if len(names) > 1 else names[0])
        except FileNotFoundError:
            return

    def quarantine(self, key: bytes) -> str | None:
        """Copy ``key``'s object to quarantine/, then delete it; returns the new name, None when it
        was already gone."""
        src = self.path_for(key)
        dest = f"{self._prefix}{QUARANTINE_PREFIX}{key.hex()}-{time.time_ns()}{OBJECT_SUFFIX}"
        try:
            with self._answers("copy", src):
                self._ob.copy(self._store, src, dest)
        except FileNotFoundError:
            return None
        self._delete([src])
        return f"s3://{self.config.bucket}/{dest}"

    def purge_quarantine(self) -> int:
        names = list(self._names(QUARANTINE_PREFIX))
        for i in range(0, len(names), DELETE_BATCH):
            self._delete(names[i:i + DELETE_BATCH])
        return len(names)

    def leftovers(self, keep_own: bool = False) -> set[str]:
        return set()  # staged payloads live in the writer's memory only

    def remove_leftovers(self, keep_own: bool = False) -> int:
        return 0


def first_line(exc: BaseException) -> str:
    """The client's message without its debug dump (which repeats the request at length)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _timedelta(seconds: float):
    from datetime import timedelta

    return timedelta(seconds=seconds)
