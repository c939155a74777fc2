"""Chunk payloads in an S3 bucket (ObjectPayloads, on moto's S3 server, a child process the suite
starts): the store's contract tests that take the ``store`` fixture run again with their payloads
in a fresh bucket (under a SQLite index, and as a shared tier under PostgreSQL), then what only an object store has: a damaged object is quarantined in the
bucket, a bucket that stops answering is a miss that deletes nothing, a missing bucket is a clear
error at open, and payloads in a bucket under an index on PostgreSQL."""

from __future__ import annotations

import inspect
import re

import pytest

from chunkstore import ChunkStore
from chunkstore.disk.chunkfile import MAGIC
from chunkstore.disk.maintenance import rebuild, verify
from chunkstore.disk.objects import ObjectPayloads, ObjectStoreConfig, parse_object_url
from chunkstore.disk.payloads import PayloadsUnavailable
from chunkstore.testing.moto_s3 import MotoS3Server
from chunkstore.testing.tensors import same_bytes
from tests import test_store, test_store_delete

# The contract tests of the store fixture, collected here again (they then run on the fixture
# below); not those that open the folder a second time (they would find the folder tree) nor
# those that damage files through the folder tree's own paths.
FOLDER_TREE = re.compile(r"path_for|chunks_dir|tmp_dir|quarantine_dir|iter_chunk_paths")
for _module in (test_store, test_store_delete):
    for _name, _test in inspect.getmembers(_module, inspect.isfunction):
        source = inspect.getsource(_test)
        if (_name.startswith("test_") and "store" in inspect.signature(_test).parameters
                and "ChunkStore(" not in source and not FOLDER_TREE.search(source)):
            globals()[_name] = _test


@pytest.fixture(params=["sqlite-index", "shared-tier"])
def store(request, tmp_path, identity, moto_s3, bucket_url):
    """A store on a bucket, under its own SQLite index or (a shared tier) an index on PostgreSQL."""
    index_url = request.getfixturevalue("postgres_url") if request.param == "shared-tier" else None
    s = ChunkStore(tmp_path / "store", identity, payloads=ObjectPayloads(moto_s3.config(bucket_url)),
                   index_url=index_url)
    yield s
    s.close()


def _object_name(store: ChunkStore, key: bytes) -> tuple[str, str]:
    bucket, _ = parse_object_url(store.payloads.config.url)
    return bucket, store.payloads.path_for(key)


@pytest.mark.parametrize("url", ["http://bucket/x", "s3://", "s3://bucket?x=1", "/tmp/folder"])
def test_an_object_store_url_that_is_not_s3_is_refused(url):
    with pytest.raises(ValueError, match="s3://bucket"):
        parse_object_url(url)


def test_a_bucket_url_names_its_bucket_and_prefix():
    assert parse_object_url("s3://chunks") == ("chunks", "")
    assert parse_object_url("s3://chunks/fleet/a/") == ("chunks", "fleet/a")


def test_objects_hold_whole_chunk_files_under_the_prefix(store, chain, moto_s3):
    pages, tensors = chain
    assert store.put(pages, tensors).ok
    bucket, name = _object_name(store, pages[0].key)
    listed = moto_s3.client().list_objects_v2(Bucket=bucket)["Contents"]
    assert name.startswith("fleet/chunks/") and name in {o["Key"] for o in listed}
    assert len(listed) == len(pages)  # one object per chunk, nothing staged beside them
    body = moto_s3.client().get_object(Bucket=bucket, Key=name)["Body"].read()
    assert body.startswith(MAGIC) and len(body) == store.chunk_rows([pages[0].key])[pages[0].key].stored_bytes


def test_a_damaged_object_is_a_miss_and_is_quarantined_in_the_bucket(store, chain, moto_s3):
    pages, tensors = chain
    assert store.put(pages, tensors).ok
    bucket, name = _object_name(store, pages[3].key)
    body = bytearray(moto_s3.client().get_object(Bucket=bucket, Key=name)["Body"].read())
    body[-1] ^= 0xFF
    moto_s3.client().put_object(Bucket=bucket, Key=name, Body=bytes(body))
    got = store.get(pages)
    assert got[3] is None and all(same_bytes(g, t) for g, t in zip(got[:3], tensors[:3]))
    assert store.exists([pages[3].key]) == [False]
    quarantined = moto_s3.client().list_objects_v2(Bucket=bucket, Prefix="fleet/quarantine/")["Contents"]
    assert len(quarantined) == 1 and pages[3].key.hex() in quarantined[0]["Key"]
    assert store.put(pages[3:4], tensors[3:4]).ok  # stored again, good this time
    assert same_bytes(store.get(pages[3:4])[0], tensors[3])


def test_a_deleted_object_is_a_miss_and_its_row_goes(store, chain, moto_s3):
    pages, tensors = chain
    assert store.put(pages, tensors).ok
    bucket, name = _object_name(store, pages[5].key)
    moto_s3.client().delete_object(Bucket=bucket, Key=name)
    assert store.get(pages[5:6]) == [None] and store.exists([pages[5].key]) == [False]


def test_verify_and_rebuild_from_the_bucket_alone(tmp_path, identity, chain, moto_s3, bucket_url):
    pages, tensors = chain

    def open_store(**kwargs):
        return ChunkStore(tmp_path / "store", identity, payloads=ObjectPayloads(moto_s3.config(bucket_url)), **kwargs)

    with open_store() as s:
        assert s.put(pages, tensors).ok
    with open_store(read_only=True) as s:
        assert verify(s).ok == len(pages)
    with open_store(reset_index=True) as s:
        assert rebuild(s).indexed == len(pages)
        assert all(same_bytes(g, t) for g, t in zip(s.get(pages), tensors))


def test_a_bucket_that_stops_answering_is_a_miss_that_deletes_nothing(tmp_path, identity, chain):
    pages, tensors = chain
    with MotoS3Server() as s3:
        s3.create_bucket("outage")
        config = s3.config("s3://outage", max_retries=0, connect_timeout_s=0.5, retry_timeout_s=0.5)
        with ChunkStore(tmp_path / "store", identity, payloads=ObjectPayloads(config)) as store:
            assert store.put(pages[:5], tensors[:5]).ok
            s3.stop()
            assert store.get(pages[:5]) == [None] * 5  # no exception, no wrong data
            assert store.exists([p.key for p in pages[:5]]) == [True] * 5  # nothing concluded, nothing dropped
            result = store.put(pages[5:], tensors[5:])
            assert set(result.failed) == {p.key for p in pages[5:]}
            assert all("unavailable" in why for why in result.failed.values())
            assert store.exists([p.key for p in pages[5:]]) == [False] * 5
            with pytest.raises(PayloadsUnavailable, match="could not be read"):
                verify(store, repair=True)
            assert store.num_chunks() == 5  # the repair stopped before it changed anything


def test_a_missing_bucket_is_a_clear_error_at_open(tmp_path, identity, moto_s3):
    with pytest.raises(FileNotFoundError, match="no bucket 'never-made'.*create it first"):
        ChunkStore(tmp_path / "store", identity, payloads=ObjectPayloads(moto_s3.config("s3://never-made")))


def test_an_unreachable_endpoint_is_a_clear_error_at_open(tmp_path, identity):
    config = ObjectStoreConfig("s3://chunks", endpoint_url="http://127.0.0.1:9", region="us-east-1",
                               access_key_id="k", secret_access_key="s", max_retries=0, retry_timeout_s=0.5)
    with pytest.raises(PayloadsUnavailable, match="object store s3://chunks at http://127.0.0.1:9 unavailable"):
        ChunkStore(tmp_path / "store", identity, payloads=ObjectPayloads(config))


def test_payloads_in_a_bucket_under_an_index_on_postgresql(tmp_path, identity, chain, moto_s3, bucket_url,
                                                           postgres_url):
    pages, tensors = chain

    def open_store(**kwargs):
        return ChunkStore(tmp_path / "store", identity, index_url=postgres_url,
                          payloads=ObjectPayloads(moto_s3.config(bucket_url)), **kwargs)

    with open_store() as s:
        assert s.put(pages, tensors).ok
    with open_store() as s:  # reopened: the rows and the objects of the first open
        assert all(same_bytes(g, t) for g, t in zip(s.get(pages), tensors))
        assert verify(s).ok == len(pages)
