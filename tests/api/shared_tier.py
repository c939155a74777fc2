"""A shared tier for the management API's and the dashboard's tests: an index on a real PostgreSQL
server and payloads in a bucket on moto's S3 server (the suite's ``postgres_url``, ``moto_s3`` and
``bucket_url`` fixtures), servers' stores on it (each counting under its own name), and the API's
backend over it, as `chunkstore admin --index-url ... --object-store ...` opens it."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

from sqlalchemy import create_engine, insert

from chunkstore import ChunkStore, PageRef, chain_pages
from chunkstore.api import StoreBackend
from chunkstore.disk.index import ChunkIndex
from chunkstore.disk.objects import ObjectPayloads, parse_object_url
from chunkstore.disk.schema import server_counters
from tests.helpers import TINY, kv_pages


@dataclass
class Tier:
    """A shared tier: its database, its bucket, and the S3 server holding the bucket."""

    index_url: str
    bucket_url: str
    s3: object
    root: object  # a folder for the servers' own folders

    def store(self, name: str, **kwargs) -> ChunkStore:
        """Server ``name``'s store on the tier (its counts go under ``name``)."""
        return ChunkStore(self.root / name, TINY, index_url=self.index_url,
                          payloads=ObjectPayloads(self.s3.config(self.bucket_url)),
                          index_factory=functools.partial(ChunkIndex, server_name=name), **kwargs)

    def backend(self, name: str = "admin") -> StoreBackend:
        """`chunkstore admin --index-url ... --object-store ...` over the tier, from its own folder
        (made first, as a server's first start makes it; its counts go under this process's name)."""
        config = self.s3.config(self.bucket_url)
        ChunkStore(self.root / name, TINY, index_url=self.index_url, payloads=ObjectPayloads(config)).close()
        return StoreBackend(self.root / name, index_url=self.index_url, object_store=config)

    def objects(self, sub: str = "chunks/") -> list[str]:
        bucket, prefix = parse_object_url(self.bucket_url)
        listed = self.s3.client().list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/{sub}")
        return [o["Key"] for o in listed.get("Contents", [])]

    def damage(self, store: ChunkStore, key: bytes) -> None:
        """Flip a byte of ``key``'s object behind the tier's back."""
        bucket, _ = parse_object_url(self.bucket_url)
        name = store.payloads.path_for(key)
        body = bytearray(self.s3.client().get_object(Bucket=bucket, Key=name)["Body"].read())
        body[-1] ^= 0xFF
        self.s3.client().put_object(Bucket=bucket, Key=name, Body=bytes(body))


def pages_of(n: int, namespace: str = "default", offset: int = 0) -> list[PageRef]:
    return chain_pages(TINY, [offset + i for i in range(TINY.page_size * n)], namespace=namespace)


def fill_tier(tier: Tier) -> tuple[list[PageRef], list[PageRef]]:
    """Server a publishes six pages and reads them; server b publishes two of another namespace,
    reads a's first three and misses two it never stored."""
    pages, other = pages_of(6), pages_of(2, namespace="other", offset=7)
    with tier.store("server-a") as a:
        assert a.put(pages, kv_pages(TINY, 6)).ok
        assert all(t is not None for t in a.get(pages))
    with tier.store("server-b") as b:
        assert b.put(other, kv_pages(TINY, 2, seed=1)).ok
        assert b.put(pages[:1], kv_pages(TINY, 1)).deduplicated == [pages[0].key]
        assert all(t is not None for t in b.get(pages[:3]))
        assert b.get(pages_of(2, offset=50)) == [None, None]
    return pages, other


def add_gone_server(tier: Tier, name: str = "gone:1", age_s: float = 3600.0) -> None:
    """The row of a server that stopped writing its counts ``age_s`` ago (it died, say)."""
    engine = create_engine(tier.index_url)
    try:
        with engine.begin() as conn:
            gone = time.time() - age_s
            conn.execute(insert(server_counters).values(server=name, hits=5, misses=5, published=1, dedup_hits=0,
                                                        write_errors=0, first_seen_at=gone - 60, last_seen_at=gone))
    finally:
        engine.dispose()


def add_lapsed_claim(tier: Tier, key: bytes) -> None:
    """What a writer that uploaded ``key``'s object, then died before its row, leaves: a lapsed claim
    and an object without a row."""
    with tier.store("dead") as writer:
        index = ChunkIndex(tier.index_url, server_name="dead")
        try:
            assert index.claim([key], "dead:1:0", ttl_s=1.0, now=time.time() - 60) == {key}
        finally:
            index.close()
        writer.payloads.publish([writer.payloads.stage(key, [b"an upload with no row"])])
