"""The store's two seams for another backend: the payload store (the contract every PayloadStore
keeps, checked here against the folder tree, the fault wrapper around it and the object store on
moto's S3 server and on Ceph's RADOS Gateway) and the index URL. A store whose payloads or index live elsewhere behaves the
same from above."""

from __future__ import annotations

import errno
import os
import uuid

import pytest

from chunkstore import ChunkStore
from chunkstore.disk.files import ChunkFiles, Durability
from chunkstore.disk.index import DB_FILENAME, ChunkIndex, sqlite_path, sqlite_url
from chunkstore.disk.maintenance import rebuild, verify
from chunkstore.disk.objects import ObjectPayloads
from chunkstore.disk.payload_cache import CachedPayloads
from chunkstore.disk.payloads import PayloadStore, aligned_size
from tests.helpers.faults import FaultyPayloads
from chunkstore.testing.tensors import same_bytes

KEYS = [bytes([i]) * 32 for i in range(1, 5)]


@pytest.fixture(params=["folder", "faulty-folder", "objects-moto", "objects-radosgw", "objects-moto-local-copy"])
def payloads(request, tmp_path) -> PayloadStore:
    if request.param.startswith("objects"):
        s3 = request.getfixturevalue("radosgw" if request.param == "objects-radosgw" else "moto_s3")
        bucket = f"contract-{uuid.uuid4().hex[:12]}"
        s3.create_bucket(bucket)
        p = ObjectPayloads(s3.config(f"s3://{bucket}/fleet"))
        if request.param.endswith("local-copy"):
            p = CachedPayloads(p, tmp_path / "copies", 1 << 20)
    else:
        files = ChunkFiles(tmp_path / "payloads", Durability.NONE)
        p = files if request.param == "folder" else FaultyPayloads(files)
    p.create()
    return p


def stages_in_storage(payloads: PayloadStore) -> bool:
    """The folder tree stages in tmp/; the object store stages in memory (no leftovers possible)."""
    return not isinstance(payloads, (ObjectPayloads, CachedPayloads))


def _publish(payloads: PayloadStore, key: bytes, data: bytes) -> None:
    payloads.publish([payloads.stage(key, [data[:3], memoryview(data)[3:]])])


# ---- the contract ----------------------------------------------------------------------------


def test_a_staged_payload_is_invisible_until_published(payloads):
    staged = payloads.stage(KEYS[0], [b"header", b"planes"])
    assert not payloads.exists(KEYS[0]) and list(payloads.keys()) == []
    assert len(payloads.leftovers()) == stages_in_storage(payloads)
    assert payloads.leftovers(keep_own=True) == set()  # a put in flight is not a leftover
    payloads.publish([staged])
    assert payloads.exists(KEYS[0]) and list(payloads.keys()) == [KEYS[0]]
    assert bytes(payloads.read(KEYS[0], 100)) == b"headerplanes"
    assert payloads.leftovers() == set() and payloads.modified_at(KEYS[0]) is not None


def test_a_discarded_payload_leaves_nothing(payloads):
    staged = payloads.stage(KEYS[0], [b"never published"])
    payloads.discard(staged)
    payloads.discard(staged)  # idempotent
    assert payloads.leftovers() == set() and not payloads.exists(KEYS[0])


def test_reads_fill_the_callers_buffer_and_refuse_oversized_payloads(payloads):
    import mmap

    _publish(payloads, KEYS[0], b"x" * 5000)
    buf = mmap.mmap(-1, aligned_size(8000))
    for _ in range(2):  # (a local copy's second read is its own)
        view = payloads.read(KEYS[0], 8000, buffer=buf)
        assert bytes(view) == b"x" * 5000 and view.obj is buf
        view.release()
    with pytest.raises(OSError) as exc:
        payloads.read(KEYS[0], 4999)
    assert exc.value.errno == errno.EFBIG
    with pytest.raises(FileNotFoundError):
        payloads.read(KEYS[1], 8000)


def test_delete_quarantine_and_purge(payloads):
    for k in KEYS[:3]:
        _publish(payloads, k, k)
    assert payloads.delete(KEYS[0]) and not payloads.delete(KEYS[0])
    moved = payloads.quarantine(KEYS[1])
    assert moved is not None and payloads.quarantine(KEYS[1]) is None
    assert sorted(payloads.keys()) == [KEYS[2]] and not payloads.exists(KEYS[1])
    assert payloads.purge_quarantine() == 1 and payloads.purge_quarantine() == 0


def test_leftovers_of_a_dead_writer_are_removed(payloads):
    if not stages_in_storage(payloads):
        pytest.skip("nothing is staged in an object store")
    payloads.stage(KEYS[0], [b"mine, in flight"])
    dead = ChunkFiles(payloads.location).tmp_dir / f"tmp-{KEYS[1].hex()}-999999999-0"
    dead.write_bytes(b"left by a crashed writer")
    assert payloads.remove_leftovers(keep_own=True) == 1
    assert len(payloads.leftovers()) == 1  # this process's own stays
    assert payloads.remove_leftovers() == 1 and payloads.leftovers() == set()


def test_payloads_are_private(payloads):
    if not isinstance(getattr(payloads, "inner", payloads), ChunkFiles):
        pytest.skip("a bucket's policy decides who reads it")
    _publish(payloads, KEYS[0], b"token ids are prompt bytes")
    path = ChunkFiles(payloads.location).path_for(KEYS[0])
    assert os.stat(path).st_mode & 0o777 == 0o600


# ---- a store over its seams ------------------------------------------------------------------


def test_a_store_whose_payloads_and_index_live_elsewhere(tmp_path, identity, chain):
    pages, tensors = chain
    root, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    elsewhere.mkdir()
    index_url = sqlite_url(elsewhere)

    def open_store(**kwargs):
        return ChunkStore(root, identity, payloads=ChunkFiles(elsewhere / "payloads"), index_url=index_url, **kwargs)

    with open_store() as store:
        assert store.put(pages, tensors).ok
        assert all(same_bytes(g, t) for g, t in zip(store.get(pages), tensors))
    assert not (root / "chunks").exists() or not any((root / "chunks").iterdir())
    assert not (root / DB_FILENAME).exists() and (elsewhere / DB_FILENAME).is_file()
    with open_store(read_only=True) as store:
        assert store.num_chunks() == len(pages) and verify(store).ok == len(pages)
    with open_store(reset_index=True) as store:  # rebuilt from the payloads alone
        assert rebuild(store).indexed == len(pages)
        assert all(same_bytes(g, t) for g, t in zip(store.get(pages), tensors))


def test_a_failed_publish_leaves_nothing_visible(tmp_path, identity, chain):
    pages, tensors = chain
    payloads = FaultyPayloads(ChunkFiles(tmp_path))
    with ChunkStore(tmp_path, identity, payloads=payloads) as store:
        payloads.fail("publish", key=pages[4].key, times=1)
        result = store.put(pages, tensors)
        assert set(result.failed) == {p.key for p in pages} and "publish failed" in result.failed[pages[0].key]
        assert store.exists([p.key for p in pages]) == [False] * len(pages)
        assert list(payloads.keys()) == [] and payloads.leftovers() == set()
        assert store.stats().write_health.degraded
        assert store.put(pages, tensors).ok  # the next try succeeds
        assert all(same_bytes(g, t) for g, t in zip(store.get(pages), tensors))


def test_a_failed_stage_fails_that_page_alone(tmp_path, identity, chain):
    pages, tensors = chain
    payloads = FaultyPayloads(ChunkFiles(tmp_path))
    with ChunkStore(tmp_path, identity, payloads=payloads) as store:
        payloads.fail("stage", key=pages[-1].key)
        result = store.put(pages, tensors)
        assert list(result.failed) == [pages[-1].key] and "No space left" in result.failed[pages[-1].key]
        assert store.exists([p.key for p in pages]) == [True] * (len(pages) - 1) + [False]


def test_sqlite_path_refuses_another_database():
    with pytest.raises(ValueError, match="is not a SQLite file"):
        sqlite_path("postgresql://db.example/chunks")


@pytest.mark.parametrize("url, why", [
    ("sqlite://", "names no database file"),
    ("sqlite:///:memory:", "names no database file"),
    ("not a url", "not a database URL"),
])
def test_an_index_url_that_names_no_sqlite_file_is_refused(tmp_path, identity, url, why):
    with pytest.raises(ValueError, match=why):
        sqlite_path(url)
    with pytest.raises(ValueError, match=why):
        ChunkStore(tmp_path / "store", identity, index_url=url)
    ChunkStore(tmp_path / "store", identity).close()  # the refusal released the writer lock


def test_the_default_index_url_is_the_stores_folder(tmp_path):
    index = ChunkIndex(sqlite_url(tmp_path))
    try:
        assert index.path == tmp_path / DB_FILENAME and index.path.is_file()
    finally:
        index.close()
