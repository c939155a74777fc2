"""A shared tier's local copy (CachedPayloads, payload_cache.py): a store on a bucket (moto's S3
server) with copies of what it read kept in a folder of its own. What it reads again comes from
the copy; a copy that is torn or damaged is dropped and the bucket read instead (the good object
is never quarantined for it); a bad object is quarantined and its copy dropped; deletes drop
copies; the copies stay within their capacity, least recently read first; a copy that cannot be
written leaves the read a hit; verification reads the bucket; the copies survive a restart; and
``CacheConfig`` builds it only with a bucket and a size."""

from __future__ import annotations

import errno
import os

import pytest

from chunkstore import ChunkStore
from chunkstore.cache.config import CacheConfig
from chunkstore.disk.file_check import FileStatus
from chunkstore.disk.objects import ObjectPayloads, parse_object_url
from chunkstore.disk.payload_cache import DIGEST_SIZE_BYTES, ENTRIES_FILENAME, LOCAL_COPY_FOLDER, CachedPayloads
from chunkstore.disk.store_spec import StoreSpec
from chunkstore.testing.tensors import same_bytes
from tests.helpers import TINY

CAPACITY_BYTES = 1 << 30


@pytest.fixture
def open_store(tmp_path, identity, moto_s3, bucket_url):
    """Opens the store at tmp_path/store on the test's bucket, with a local copy (capacity as given)."""
    opened: list[ChunkStore] = []

    def open_(capacity_bytes: int = CAPACITY_BYTES, **kwargs) -> ChunkStore:
        payloads = CachedPayloads(ObjectPayloads(moto_s3.config(bucket_url)), tmp_path / "store" / LOCAL_COPY_FOLDER,
                                  capacity_bytes)
        store = ChunkStore(tmp_path / "store", identity, payloads=payloads, **kwargs)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


def _object(store: ChunkStore, key: bytes) -> tuple[str, str]:
    bucket, _ = parse_object_url(store.payloads.source.config.url)
    return bucket, store.payloads.source.path_for(key)


def _copy_path(store: ChunkStore, key: bytes):
    return store.payloads.copies.path_for(key)


def test_a_page_read_again_comes_from_the_local_copy(open_store, chain, moto_s3):
    pages, tensors = chain
    store = open_store()
    assert store.put(pages, tensors).ok
    assert not any(_copy_path(store, p.key).exists() for p in pages)  # writes go to the bucket only
    assert all(same_bytes(g, t) for g, t in zip(store.get(pages), tensors))
    first = store.payloads.local_copy_stats()
    assert (first.misses, first.fills, first.hits, first.entries) == (len(pages), len(pages), 0, len(pages))
    copy = _copy_path(store, pages[0].key).read_bytes()
    bucket, name = _object(store, pages[0].key)
    assert copy[:-DIGEST_SIZE_BYTES] == moto_s3.client().get_object(Bucket=bucket, Key=name)["Body"].read()
    for p in pages:  # the bucket loses the objects behind the store's back: the copies still serve
        moto_s3.client().delete_object(Bucket=bucket, Key=_object(store, p.key)[1])
    assert all(same_bytes(g, t) for g, t in zip(store.get(pages), tensors))
    assert store.payloads.local_copy_stats().hits == len(pages)


def test_a_torn_copy_is_dropped_and_the_bucket_read_instead(open_store, chain, moto_s3):
    pages, tensors = chain
    store = open_store()
    assert store.put(pages[:3], tensors[:3]).ok
    store.get(pages[:3])
    torn, flipped = _copy_path(store, pages[0].key), _copy_path(store, pages[1].key)
    torn.write_bytes(torn.read_bytes()[:100])  # as a crash before the page cache reached the disk
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a bad block
    flipped.write_bytes(bytes(data))
    assert all(same_bytes(g, t) for g, t in zip(store.get(pages[:3]), tensors[:3]))
    stats = store.payloads.local_copy_stats()
    assert stats.dropped == 2 and stats.hits == 1
    bucket, _ = _object(store, pages[0].key)
    assert "Contents" not in moto_s3.client().list_objects_v2(Bucket=bucket, Prefix="fleet/quarantine/")
    assert store.exists([p.key for p in pages[:3]]) == [True] * 3
    assert all(same_bytes(g, t) for g, t in zip(store.get(pages[:3]), tensors[:3]))
    assert store.payloads.local_copy_stats().hits == 4  # both copied again from the bucket, good now


def test_a_bad_object_is_quarantined_and_its_copy_dropped(open_store, chain, moto_s3):
    pages, tensors = chain
    store = open_store()
    assert store.put(pages[:2], tensors[:2]).ok
    bucket, name = _object(store, pages[1].key)
    body = bytearray(moto_s3.client().get_object(Bucket=bucket, Key=name)["Body"].read())
    body[-1] ^= 0xFF
    moto_s3.client().put_object(Bucket=bucket, Key=name, Body=bytes(body))
    got = store.get(pages[:2])
    assert same_bytes(got[0], tensors[0]) and got[1] is None
    assert store.exists([pages[1].key]) == [False] and not _copy_path(store, pages[1].key).exists()
    assert len(moto_s3.client().list_objects_v2(Bucket=bucket, Prefix="fleet/quarantine/")["Contents"]) == 1


def test_deletes_drop_the_copies(open_store, chain):
    pages, tensors = chain
    store = open_store()
    assert store.put(pages, tensors).ok
    store.get(pages)
    result = store.delete([p.key for p in pages[6:]])
    assert result.num_chunks == 4
    assert [_copy_path(store, p.key).exists() for p in pages] == [True] * 6 + [False] * 4
    assert store.payloads.local_copy_stats().entries == 6


def test_the_copies_stay_within_their_capacity_least_recently_read_first(open_store, chain):
    pages, tensors = chain
    store = open_store()
    assert store.put(pages, tensors).ok
    store.get(pages[:1])
    copy_bytes = _copy_path(store, pages[0].key).stat().st_size
    store.close()
    store = open_store(capacity_bytes=int(3.5 * copy_bytes))
    for i in range(4):  # one page at a time: the read order is the age order
        store.get(pages[i:i + 1])
    store.get(pages[1:2])  # read again: now younger than pages 2 and 3
    store.get(pages[4:5])  # a fifth copy: the two oldest (pages 0 and 2) go
    assert [_copy_path(store, p.key).exists() for p in pages[:5]] == [False, True, False, True, True]
    stats = store.payloads.local_copy_stats()
    assert stats.size_bytes <= stats.capacity_bytes and stats.entries == 3 and stats.evicted == 2
    assert all(same_bytes(g, t) for g, t in zip(store.get(pages[:5]), tensors[:5]))  # misses go to the bucket


def test_a_copy_that_cannot_be_written_leaves_the_read_a_hit(open_store, chain):
    pages, tensors = chain
    store = open_store()
    assert store.put(pages[:3], tensors[:3]).ok

    def full_disk(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    store.payloads.copies.os_write = full_disk
    assert all(same_bytes(g, t) for g, t in zip(store.get(pages[:3]), tensors[:3]))
    stats = store.payloads.local_copy_stats()
    assert (stats.fill_failures, stats.fills, stats.entries, stats.size_bytes) == (3, 0, 0, 0)
    assert store.payloads.copies.leftovers() == set()  # no temp file left behind


def test_verification_reads_the_bucket_not_the_copy(open_store, chain, moto_s3):
    pages, tensors = chain
    store = open_store()
    assert store.put(pages[:1], tensors[:1]).ok
    store.get(pages[:1])  # a good copy now
    bucket, name = _object(store, pages[0].key)
    moto_s3.client().delete_object(Bucket=bucket, Key=name)
    assert store.verify_file(pages[0].key, pages[0]).status is FileStatus.MISSING


def test_the_copies_survive_a_restart_and_are_private(open_store, chain):
    pages, tensors = chain
    store = open_store()
    assert store.put(pages, tensors).ok
    store.get(pages)
    store.close()
    store = open_store()
    assert store.payloads.local_copy_stats().entries == len(pages)
    assert all(same_bytes(g, t) for g, t in zip(store.get(pages), tensors))
    assert store.payloads.local_copy_stats().hits == len(pages)
    folder = store.payloads.folder
    assert os.stat(folder).st_mode & 0o777 == 0o700
    assert os.stat(folder / ENTRIES_FILENAME).st_mode & 0o777 == 0o600
    assert os.stat(_copy_path(store, pages[0].key)).st_mode & 0o777 == 0o600


def test_an_entries_file_that_cannot_be_read_empties_the_copies(open_store, chain, tmp_path):
    pages, tensors = chain
    store = open_store()
    assert store.put(pages, tensors).ok
    store.get(pages)
    store.close()
    entries = tmp_path / "store" / LOCAL_COPY_FOLDER / ENTRIES_FILENAME
    for suffix in ("-wal", "-shm"):
        entries.with_name(entries.name + suffix).unlink(missing_ok=True)
    entries.write_bytes(b"not a database" * 100)
    store = open_store()
    assert store.payloads.local_copy_stats().entries == 0
    assert not _copy_path(store, pages[0].key).exists()
    assert all(same_bytes(g, t) for g, t in zip(store.get(pages), tensors))  # from the bucket, copied again
    assert store.payloads.local_copy_stats().fills == len(pages)


def test_the_settings_build_a_local_copy_only_with_a_bucket_and_a_size(tmp_path, bucket_url):
    assert CacheConfig(disk_path=tmp_path).store_spec(TINY).payloads() is None  # the folder tree
    spec = CacheConfig(disk_path=tmp_path, object_store=bucket_url, local_cache_size="2GB").store_spec(TINY)
    with_copy = spec.payloads()
    assert isinstance(with_copy, CachedPayloads) and with_copy.capacity_bytes == 2 * 10**9
    assert with_copy.folder == spec.folder / LOCAL_COPY_FOLDER and with_copy.shared_name == bucket_url
    assert isinstance(CacheConfig(object_store=bucket_url, local_cache_size=0).store_spec(TINY).payloads(),
                      ObjectPayloads)
    assert isinstance(StoreSpec(tmp_path, object_store=bucket_url, local_copy_bytes=10**9, read_only=True).payloads(),
                      ObjectPayloads)  # a reader keeps no copy
    with pytest.raises(ValueError, match="local_cache_size"):
        CacheConfig(local_cache_size=-1)
    with pytest.raises(ValueError, match="local_copy_bytes"):
        StoreSpec(tmp_path, local_copy_bytes=-1)
    with pytest.raises(ValueError, match="capacity_bytes"):
        CachedPayloads(with_copy.source, tmp_path / "x", 0)


def test_a_forged_copy_with_a_valid_digest_is_dropped_and_the_bucket_read_again(open_store, chain, tmp_path):
    """Someone who can write the server's folder replaces a sealed chunk's local copy with another
    page's body and a digest that matches it: the read is a miss and a security event, the good
    object in the bucket stays, and the copy goes, so the next read is a hit from the bucket."""
    import xxhash

    from chunkstore.disk import FileKeyProvider, write_key_file

    write_key_file(tmp_path / "seal.key")
    pages, tensors = chain
    store = open_store(seal_key=FileKeyProvider(tmp_path / "seal.key"))
    assert store.put(pages, tensors).ok
    assert all(t is not None for t in store.get(pages))  # now in the local copy
    names = [p.key for p in store.sealing.stored_pages(pages)]
    other = _copy_path(store, names[1]).read_bytes()[:-DIGEST_SIZE_BYTES]
    _copy_path(store, names[0]).write_bytes(other + xxhash.xxh3_128_digest(other))
    assert store.get(pages[:1]) == [None]
    assert store.stats().auth_failures == 1 and store.num_chunks() == len(pages)  # nothing of record dropped
    assert not _copy_path(store, names[0]).exists()
    assert same_bytes(store.get(pages[:1])[0], tensors[0])
