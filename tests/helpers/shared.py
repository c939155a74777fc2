"""Helpers of the shared tier's contract tests (tests/test_shared_contract.py, tests/test_shared_crash.py).

- ``Bucket``: a tier's bucket reached through the S3 server's own client, to read, damage, copy and
  delete objects behind the tier's back (as an operator, a bad copy or a failing disk would).
- ``Servers``: the stores of several "servers" on one tier (each its own folder; one index in
  PostgreSQL, one bucket); ``fresh_tier``: a tier of its own (database and bucket) per call.
- ``set_access_times``: rows' access times through an index of the test's own on the database.
- Seams for races: ``InsertGate`` (an ``IndexFaults.hold_inserts`` that says when a writer waits
  before its rows) and ``hooked_index`` (an ``index_factory`` that calls the test before its row
  deletes).
- ``wait_for``: a bounded wait (never a timing assertion).

Fixtures stay in the test modules; these are plain classes and functions:

    bucket = Bucket(moto_s3, bucket_url)
    servers = Servers(tmp_path, identity, postgres_url, bucket)
    a, b = servers.open("a"), servers.open("b")
    bucket.write(key, bucket.read(key)[:-1])   # a truncated object
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from chunkstore import ChunkStore, ModelIdentity
from chunkstore.disk.index import ChunkIndex
from chunkstore.disk.objects import (CHUNKS_PREFIX, OBJECT_SUFFIX, QUARANTINE_PREFIX, ObjectPayloads, ObjectStoreConfig,
                                     parse_object_url)
from chunkstore.disk.payloads import PayloadStore
from chunkstore.testing.s3 import S3Endpoint
from tests.helpers.eviction import set_access_times  # noqa: F401  (one of this module's helpers)


class Bucket:
    """``url`` (s3://bucket/prefix) on the S3 server ``s3``, reached with its boto3 client: the
    objects of a tier as they are in the bucket, whatever the store thinks of them."""

    def __init__(self, s3: S3Endpoint, url: str):
        self.s3, self.url = s3, url
        self.name, prefix = parse_object_url(url)
        self.prefix = f"{prefix}/" if prefix else ""
        self._client = s3.client()

    def config(self, **overrides) -> ObjectStoreConfig:
        return self.s3.config(self.url, **overrides)

    def payloads(self, **overrides) -> ObjectPayloads:
        """A fresh ObjectPayloads on this bucket (each store gets its own client)."""
        return ObjectPayloads(self.config(**overrides))

    def object_name(self, key: bytes) -> str:
        """The object of ``key`` (the layout of chunkstore/disk/objects.py: one object per chunk)."""
        return f"{self.prefix}{CHUNKS_PREFIX}{key.hex()}{OBJECT_SUFFIX}"

    def read(self, key: bytes) -> bytes:
        return self._client.get_object(Bucket=self.name, Key=self.object_name(key))["Body"].read()

    def write(self, key: bytes, data: bytes) -> None:
        """Replace the object of ``key`` behind the store's back (S3 has no partial writes: what a
        damaged disk or a bad copy would leave is written whole)."""
        self._client.put_object(Bucket=self.name, Key=self.object_name(key), Body=data)

    def delete(self, key: bytes) -> None:
        self._client.delete_object(Bucket=self.name, Key=self.object_name(key))

    def names(self, sub: str = CHUNKS_PREFIX) -> list[str]:
        """The object names under ``prefix/sub`` (every page of the listing)."""
        names: list[str] = []
        for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.name,
                                                                             Prefix=f"{self.prefix}{sub}"):
            names += [o["Key"] for o in page.get("Contents", [])]
        return names

    def keys(self) -> set[bytes]:
        """The keys that have an object under chunks/."""
        start = len(f"{self.prefix}{CHUNKS_PREFIX}")
        return {bytes.fromhex(n[start:start + 64]) for n in self.names()}

    def quarantined(self) -> list[str]:
        """The names of the objects in quarantine/ (file name only: ``<key hex>-<ns>.kv``)."""
        return [n.rsplit("/", 1)[-1] for n in self.names(QUARANTINE_PREFIX)]


class Servers:
    """Opens the stores of several servers on one shared tier: server ``name`` has its own folder
    under ``root``, the index is ``index_url`` (PostgreSQL), the payloads ``bucket``. ``close``
    closes every store opened (each once)."""

    def __init__(self, root: Path, identity: ModelIdentity, index_url: str, bucket: Bucket):
        self.root, self.identity, self.index_url, self.bucket = Path(root), identity, index_url, bucket
        self._opened: list[ChunkStore] = []

    def folder(self, name: str) -> Path:
        return self.root / name

    def open(self, name: str = "a", *, payloads: PayloadStore | None = None, **kwargs) -> ChunkStore:
        store = ChunkStore(self.folder(name), self.identity, index_url=self.index_url,
                           payloads=payloads if payloads is not None else self.bucket.payloads(), **kwargs)
        self._opened.append(store)
        return store

    def close(self) -> None:
        for store in self._opened:
            store.close()  # closing twice is a no-op
        self._opened.clear()


def wait_for(predicate: Callable[[], bool], timeout_s: float = 30.0, what: str = "a condition") -> None:
    """Poll ``predicate`` until it holds; fail after ``timeout_s`` (a bound against hanging, not a
    timing assertion: the tests never say how soon)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@contextlib.contextmanager
def fresh_tier(root: Path, identity: ModelIdentity, postgres_server, s3: S3Endpoint) -> Iterator[Servers]:
    """A tier of its own (a new database on ``postgres_server``, a new bucket on ``s3``), for a test
    that needs several (one per hypothesis example); the database is dropped afterwards."""
    name = uuid.uuid4().hex[:16]
    url = postgres_server.create_database(f"test_{name}")
    s3.create_bucket(f"test-{name}")
    servers = Servers(root, identity, url, Bucket(s3, f"s3://test-{name}/fleet"))
    try:
        yield servers
    finally:
        servers.close()
        postgres_server.drop_database(f"test_{name}")


class InsertGate(threading.Event):
    """``IndexFaults(hold_inserts=InsertGate())``: a writer's row inserts wait until ``set``, and
    ``reached`` is set once one waits (its uploads are done, its room was made, its rows are next)."""

    def __init__(self) -> None:
        super().__init__()
        self.reached = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.reached.set()
        return super().wait(timeout)


def hooked_index(before: dict[str, Callable[[Sequence[bytes]], None]]) -> type[ChunkIndex]:
    """An ``index_factory``: the real index, calling ``before[name](keys)`` before its row deletes
    (``delete``: a read's row delete after it found an object missing or damaged, ``delete`` or
    ``delete_unchanged``; ``delete_claiming``: an eviction), so that a test acts between what a store looked at and what it deletes."""

    class HookedIndex(ChunkIndex):
        def delete(self, keys):
            if hook := before.get("delete"):
                hook(keys)
            return super().delete(keys)

        def delete_unchanged(self, seen, claim_for=None):
            if hook := before.get("delete"):
                hook(list(seen))
            return super().delete_unchanged(seen, claim_for)

        def delete_claiming(self, keys, writer, ttl_s, now=None):
            if hook := before.get("delete_claiming"):
                hook(keys)
            return super().delete_claiming(keys, writer, ttl_s, now)

    return HookedIndex
