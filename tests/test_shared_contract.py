"""The store's contracts for corruption, repair and rebuild, concurrency, eviction and quotas, on a
shared tier: the index in PostgreSQL, the payloads in an S3 bucket (moto's server), several
servers' stores (each with its own folder) on the one tier.

The folder tree's own suites (tests/test_corruption.py, test_rebuild.py, test_concurrency.py,
test_store_eviction.py) damage files through ``path_for``, open the SQLite index beside the store
or open the folder a second time, so none of their tests runs unchanged on a bucket; each idea
that matters on a shared tier is checked here the tier's way: objects are damaged, copied and
deleted through the bucket's own client (tests/helpers/shared.py), rows through a ChunkIndex of
the test's own on the database, and races are set up through the fault seams
(tests/helpers/faults.py). The crash tests are in tests/test_shared_crash.py.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chunkstore import ChunkStore, chain_pages
from chunkstore.cli import main
from chunkstore.disk.codec import Codec
from chunkstore.disk.eviction import ChunkNotStoredError, EvictionSelection, StrandedDescendantsError
from chunkstore.disk.index import ChunkIndex, IndexMissingError, drop_index
from chunkstore.disk.keys import PageRef
from chunkstore.disk.maintenance import check_file, evict_bytes, rebuild, verify
from chunkstore.disk.page_io import max_payload_bytes
from chunkstore.disk.store import StoreBusyError
from chunkstore.testing import crash_soak as soak
from tests.helpers.faults import FaultyPayloads, IndexFaults, faulty_index
from chunkstore.testing.tensors import same_bytes
from tests.helpers import TINY, kv_pages
from tests.helpers.races import (checked_read, guarded, lose_the_read_race, one_page, race_a_damaged_read, random_chain,
                                 read_buffers, run_threads, store_again_meanwhile)
from tests.helpers.shared import Bucket, InsertGate, Servers, fresh_tier, hooked_index, set_access_times
from tests.helpers.corruption import (assert_quarantined_once, fill, forged_chunk, payload_offset, read_past_the_damage,
                                      warnings_about)
from tests.helpers.eviction import (assert_plan_is_the_rule, check_a_stale_plan_is_planned_again, drawn_selection,
                                    fill_branches, model_plan)

VICTIM = 3  # a page in the middle of the chain: damaging it must not hide its neighbours


@pytest.fixture
def bucket(moto_s3, bucket_url) -> Bucket:
    return Bucket(moto_s3, bucket_url)


@pytest.fixture
def servers(tmp_path, identity, postgres_url, bucket):
    """Servers(...).open(name, **kwargs): the store of server ``name`` on this test's shared tier."""
    opened = Servers(tmp_path, identity, postgres_url, bucket)
    yield opened
    opened.close()


@pytest.fixture
def store(servers) -> ChunkStore:
    return servers.open("a")


# -- corrupt objects (tests/test_corruption.py, through the bucket) ---------------------------

@pytest.fixture
def filled(store, identity):
    """Six pages of one chain and two of another namespace, stored on the tier."""
    return fill(store, identity)


# Each damage gets (bucket, store, pages, tensors) and replaces the object of pages[VICTIM].
Damage = Callable[[Bucket, ChunkStore, list[PageRef], list[torch.Tensor]], None]


def _rewritten(change: Callable[[bytes], bytes]) -> Damage:
    def damage(bucket, store, pages, tensors):
        key = pages[VICTIM].key
        bucket.write(key, change(bucket.read(key)))
    return damage


def _flipped(at: Callable[[bytes], int]) -> Damage:
    def change(data: bytes) -> bytes:
        out = bytearray(data)
        out[at(data)] ^= 0x10
        return bytes(out)
    return _rewritten(change)


def _in_payload(fraction: float) -> Callable[[bytes], int]:
    def at(data: bytes) -> int:
        start = payload_offset(data)
        return min(len(data) - 1, start + int((len(data) - start) * fraction))
    return at


def _swapped(bucket, store, pages, tensors):
    bucket.write(pages[VICTIM].key, bucket.read(pages[VICTIM + 1].key))


def _forged(field: str) -> Damage:
    """A header that passes its own checksum but lies about the page."""
    def damage(bucket, store, pages, tensors):
        bucket.write(pages[VICTIM].key, forged_chunk(store, pages, tensors, VICTIM, field))
    return damage


def _oversized(bucket, store, pages, tensors):
    data = bucket.read(pages[VICTIM].key)
    bucket.write(pages[VICTIM].key, data + b"\0" * (max_payload_bytes(store.identity) + 1 - len(data)))


def _garbage(bucket, store, pages, tensors):
    size = len(bucket.read(pages[VICTIM].key))
    bucket.write(pages[VICTIM].key, random.Random(VICTIM).randbytes(size))


DAMAGES: dict[str, Damage] = {
    "header-magic": _flipped(lambda data: 0),
    "header-version": _flipped(lambda data: 8),
    "header-length": _flipped(lambda data: 10),
    "header-key": _flipped(lambda data: 20),
    "header-tokens": _flipped(lambda data: payload_offset(data) - 60),
    "header-checksum": _flipped(lambda data: payload_offset(data) - 1),
    "payload-first": _flipped(_in_payload(0.0)),
    "payload-middle": _flipped(_in_payload(0.5)),
    "payload-last": _flipped(_in_payload(1.0)),
    "truncated-by-one": _rewritten(lambda data: data[:-1]),
    "truncated-at-header": _rewritten(lambda data: data[:payload_offset(data)]),
    "truncated-in-header": _rewritten(lambda data: data[:10]),
    "empty": _rewritten(lambda data: b""),
    "swapped": _swapped,
    "forged-tokens": _forged("tokens"),
    "forged-parent": _forged("parent"),
    "forged-namespace": _forged("namespace"),
    "forged-other-key": _forged("consistent"),
    "oversized": _oversized,
    "trailing-bytes": _rewritten(lambda data: data + b"\0" * 100),
    "garbage": _garbage,
}


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
@pytest.mark.parametrize("kind", list(DAMAGES))
def test_a_damaged_object_is_a_miss_and_quarantined_in_the_bucket_once(filled, bucket, kind, caplog):
    """test_corruption.py::test_corrupt_file_is_a_miss_and_quarantined, for every kind of damage."""
    store, pages, tensors = filled
    victim = pages[VICTIM]
    DAMAGES[kind](bucket, store, pages, tensors)
    before = read_past_the_damage(store, pages, tensors, VICTIM, caplog)
    assert victim.key not in bucket.keys() and not store.payloads.exists(victim.key)
    assert [n.startswith(victim.key.hex()) for n in bucket.quarantined()] == [True]
    assert_quarantined_once(store, pages, VICTIM, before, caplog)
    assert store.lapsed_claims(now=time.time() + 3600) == []  # the quarantine's claim was released


@pytest.mark.parametrize("kind", ["payload-middle", "swapped", "forged-other-key", "garbage"])
def test_a_damaged_object_is_a_miss_for_get_into(filled, bucket, kind):
    """test_corruption.py::test_corrupt_file_is_a_miss_for_get_into."""
    store, pages, tensors = filled
    DAMAGES[kind](bucket, store, pages, tensors)
    outs = [torch.zeros(store.identity.page_shape, dtype=store.torch_dtype) for _ in pages]
    hits = store.get_into(pages, outs)
    assert hits == [i != VICTIM for i in range(len(pages))]
    assert all(same_bytes(o, t) for o, t, h in zip(outs, tensors, hits) if h)


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
@pytest.mark.parametrize("kind", list(DAMAGES))
def test_verify_reports_a_damaged_object_changing_nothing_and_repair_quarantines_it(filled, bucket, kind, caplog):
    """test_corruption.py::test_verify_reports_without_changing_anything, then
    ::test_verify_repair_quarantines on the same damage (one tier set up for both)."""
    store, pages, tensors = filled
    victim = pages[VICTIM]
    DAMAGES[kind](bucket, store, pages, tensors)
    damaged = bucket.read(victim.key)
    before = store.stats()
    report = verify(store)
    assert (report.checked, report.ok, report.corrupt, report.missing) == (8, 7, 1, 0)
    assert report.quarantined == report.rows_dropped == report.adopted == report.orphans == 0
    assert bucket.read(victim.key) == damaged and bucket.quarantined() == []
    assert store.exists([victim.key]) == [True]
    after = store.stats()
    assert (after.num_chunks, after.quarantined) == (before.num_chunks, before.quarantined)

    with caplog.at_level(logging.WARNING):
        report = verify(store, repair=True)
    assert (report.corrupt, report.quarantined) == (1, 1)
    assert store.exists([victim.key]) == [False] and victim.key not in bucket.keys()
    assert [n.startswith(victim.key.hex()) for n in bucket.quarantined()] == [True]
    assert store.stats().quarantined == 1
    assert len(warnings_about(caplog, victim.key)) == 1
    got = store.get(pages)
    assert [t is None for t in got] == [i == VICTIM for i in range(len(pages))]
    clean = verify(store)
    assert (clean.corrupt, clean.missing, clean.ok, clean.orphans) == (0, 0, 7, 0)


def test_a_read_only_store_leaves_the_damaged_object_in_place(filled, bucket, servers, caplog):
    """test_corruption.py::test_read_only_store_leaves_the_corrupt_file_in_place."""
    store, pages, tensors = filled
    DAMAGES["payload-middle"](bucket, store, pages, tensors)
    ro = servers.open("a", read_only=True)  # beside the writer, on its folder
    with caplog.at_level(logging.WARNING):
        got = ro.get(pages)
    assert got[VICTIM] is None
    assert pages[VICTIM].key in bucket.keys() and bucket.quarantined() == []
    assert store.exists([pages[VICTIM].key]) == [True]
    assert len(warnings_about(caplog, pages[VICTIM].key)) == 1


def test_a_damaged_object_found_by_another_server_is_quarantined_for_the_whole_tier(filled, bucket, servers):
    """What one server finds damaged is a miss for every server: the row goes tier-wide."""
    store, pages, tensors = filled
    other = servers.open("b")
    DAMAGES["payload-last"](bucket, store, pages, tensors)
    assert other.get(pages[VICTIM:VICTIM + 1]) == [None]
    assert store.exists([pages[VICTIM].key]) == [False] and len(bucket.quarantined()) == 1
    assert store.put(pages[VICTIM:VICTIM + 1], tensors[VICTIM:VICTIM + 1]).stored == [pages[VICTIM].key]
    assert same_bytes(other.get(pages[VICTIM:VICTIM + 1])[0], tensors[VICTIM])


# -- a lost index, repair and rebuild (tests/test_rebuild.py, from the bucket) ----------------

@pytest.fixture
def saved(servers, identity):
    """A shared tier of 8 + 3 chunks in two namespaces, written by server "a" (closed again)."""
    pages = chain_pages(identity, list(range(identity.page_size * 8)))
    other = chain_pages(identity, list(range(100, 100 + identity.page_size * 3)), namespace="other")
    tensors = kv_pages(identity, 8, seed=3) + kv_pages(identity, 3, seed=4)
    with servers.open("a") as s:
        assert s.put(pages, tensors[:8]).ok and s.put(other, tensors[8:]).ok
    return pages + other, tensors


def _drop_rows(index_url: str, keys: list[bytes]) -> int:
    """Delete index rows and leave their objects (a writer that died between its upload and its
    row), through an index of the test's own on the tier's database."""
    index = ChunkIndex(index_url)
    try:
        return index.delete(keys)
    finally:
        index.close()


def _assert_all_load(store: ChunkStore, pages: list[PageRef], tensors: list[torch.Tensor]) -> None:
    for p, t, want in zip(pages, store.get(pages), tensors):
        assert t is not None and same_bytes(t, want), p.key.hex()


@pytest.fixture
def cli(servers, bucket, monkeypatch, capsys):
    """cli(command, *argv) -> (exit code, stdout, stderr): `chunkstore COMMAND` on server a's folder
    and the tier (--index-url, --object-store; the bucket's endpoint and keys from AWS_*)."""
    for name, value in bucket.s3.aws_env().items():
        monkeypatch.setenv(name, value)

    def run(command: str, *argv: str) -> tuple[int, str, str]:
        code = main([command, "--disk-path", str(servers.folder("a")), "--index-url", servers.index_url,
                     "--object-store", bucket.url, *argv])
        out, err = capsys.readouterr()
        return code, out, err
    return run


def _damage_two(bucket: Bucket, pages: list[PageRef]) -> set[bytes]:
    """A payload bit flip in one object and another chunk's object copied over a third: the
    damaged keys (the copied-from chunk stays valid)."""
    data = bytearray(bucket.read(pages[2].key))
    data[-3] ^= 0x01
    bucket.write(pages[2].key, bytes(data))
    bucket.write(pages[5].key, bucket.read(pages[9].key))
    return {pages[2].key, pages[5].key}


def test_a_lost_index_is_refused_and_the_cli_rebuilds_exactly_the_valid_objects(saved, servers, bucket, cli):
    """test_rebuild.py: test_stats_fails_cleanly_without_a_usable_index, ..._with_a_deleted_index_
    suggests_rebuild, test_read_only_open_does_not_create_an_index and
    test_cli_rebuild_restores_exactly_the_valid_chunks, with the tables dropped from the database."""
    pages, tensors = saved
    before = {p.key for p in pages}
    bad = _damage_two(bucket, pages)
    drop_index(servers.index_url)
    code, out, err = cli("stats", "--json")
    assert code == 2 and out == "" and err.startswith("chunkstore: error:") and "Traceback" not in err
    assert "rebuild" in err and "db upgrade" not in err
    with pytest.raises(IndexMissingError):  # the read-only stats made no tables
        ChunkIndex(servers.index_url, read_only=True)
    with pytest.raises(IndexMissingError, match="rebuild"):  # an empty index would hide every object
        servers.open("b")
    code, out, err = cli("rebuild", "--json")
    assert code == 0, err
    assert json.loads(out) == {"scanned": 11, "indexed": 9, "quarantined": 2}
    assert sorted(n[:64] for n in bucket.quarantined()) == sorted(k.hex() for k in bad)
    assert bucket.keys() == before - bad
    with servers.open("b") as s:
        assert {r.key for r in s.iter_rows()} == before - bad
        good = [(p, t) for p, t in zip(pages, tensors) if p.key not in bad]
        _assert_all_load(s, [p for p, _ in good], [t for _, t in good])
    code, out, _ = cli("stats", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["num_chunks"] == 9
    assert {n["namespace"]: n["num_chunks"] for n in doc["namespaces"]} == {"default": 6, "other": 3}
    code, out, _ = cli("verify", "--json")
    assert code == 0 and json.loads(out)["ok"] == 9


def test_rebuild_from_the_bucket_twice_restores_every_row(saved, servers):
    """test_rebuild.py::test_rebuild_via_maintenance and ::test_rebuild_twice_is_a_no_op."""
    pages, tensors = saved
    for _ in range(2):
        with servers.open("a", reset_index=True) as s:
            report = rebuild(s)
            assert (report.scanned, report.indexed, report.quarantined) == (11, 11, 0)
            rows = s.chunk_rows([p.key for p in pages])
            assert set(rows) == {p.key for p in pages}
            assert all(rows[p.key].parent_key == p.parent_key and rows[p.key].namespace == p.namespace
                       for p in pages)
            assert s.longest_prefix([p.key for p in pages[:8]]) == 8
    with servers.open("b") as s:  # another server serves what was rebuilt
        _assert_all_load(s, pages, tensors)


def test_an_object_without_a_row_is_invisible_reported_and_adopted_by_repair(saved, servers, bucket):
    """test_rebuild.py::test_file_without_a_row_is_adopted_by_repair."""
    pages, tensors = saved
    s = servers.open("a")
    assert _drop_rows(servers.index_url, [pages[7].key, pages[10].key]) == 2
    assert s.exists([pages[7].key, pages[10].key]) == [False, False]
    assert s.get([pages[7]]) == [None]  # invisible, and the object is left alone
    assert pages[7].key in bucket.keys()
    report = verify(s)  # without repair orphans are reported, and nothing is adopted or changed
    assert (report.orphans, report.adopted, report.damage) == (2, 0, 2)
    assert s.exists([pages[7].key]) == [False]
    report = verify(servers.open("b"), repair=True)  # any server of the tier may repair it
    assert (report.orphans, report.adopted, report.quarantined) == (2, 2, 0)
    assert {r.key for r in s.iter_rows()} == {p.key for p in pages}
    assert s.chunk_rows([pages[10].key])[pages[10].key].namespace == "other"
    assert s.stats().num_chunks == 11
    _assert_all_load(s, pages, tensors)


def test_an_orphan_object_that_fails_verification_is_quarantined_by_repair(saved, servers, bucket):
    """test_rebuild.py::test_orphan_that_fails_verification_is_quarantined_by_repair."""
    pages, _ = saved
    s = servers.open("a")
    _drop_rows(servers.index_url, [pages[4].key])
    bucket.write(pages[4].key, b"not a chunk")
    report = verify(s, repair=True)
    assert (report.orphans, report.adopted, report.quarantined) == (1, 0, 1)
    assert pages[4].key not in bucket.keys() and len(bucket.quarantined()) == 1
    assert s.exists([pages[4].key]) == [False]
    assert s.lapsed_claims(now=time.time() + 3600) == []


def test_a_row_without_its_object_is_reported_then_dropped(saved, servers, bucket):
    """test_rebuild.py::test_row_without_a_file_is_reported_then_dropped (and, for a get,
    ::test_row_without_a_file_is_dropped_on_get: nothing is quarantined)."""
    pages, tensors = saved
    bucket.delete(pages[3].key)
    s = servers.open("a")
    report = verify(s)
    assert (report.missing, report.rows_dropped, report.damage) == (1, 0, 1)
    assert s.exists([pages[3].key]) == [True]  # reported, not changed
    report = verify(s, repair=True)
    assert (report.missing, report.rows_dropped) == (1, 1)
    assert s.exists([pages[3].key]) == [False]
    assert s.longest_prefix([p.key for p in pages[:8]]) == 3
    clean = verify(s)
    assert (clean.checked, clean.ok, clean.missing) == (10, 10, 0)
    assert s.stats().quarantined == 0 and bucket.quarantined() == []
    rest = [(p, t) for i, (p, t) in enumerate(zip(pages, tensors)) if i != 3]
    _assert_all_load(s, [p for p, _ in rest], [t for _, t in rest])


# -- concurrency (tests/test_concurrency.py, across servers) ----------------------------------

WRITER_STEPS, READER_STEPS = 30, 40


def test_writers_and_readers_on_two_servers_see_whole_pages_only(tmp_path, postgres_url, bucket):
    """test_concurrency.py::test_writers_and_readers_on_the_same_keys, on two servers of one tier:
    a writer (put, evict, delete a namespace) and a reader (get, get_into, exists) on each, on the
    same keys, a fixed number of steps each; the tier's capacity keeps eviction running. Every
    read is a miss or exactly the page's bytes; afterwards every row's object verifies, no claim
    is left and the soak's checks pass on a fresh store."""
    capacity = 32 << 10
    servers = Servers(tmp_path, soak.SOAK_IDENTITY, postgres_url, bucket)
    try:
        a, b = (servers.open(name, capacity_bytes=capacity, num_workers=2) for name in ("a", "b"))
        expected = {p.key: soak.expected_page(p.key) for p in soak.all_pages()}
        errors: list[str] = []
        counts = {"stored": 0, "no_room": 0, "hits": 0, "misses": 0, "evicted": 0}
        lock = threading.Lock()

        @guarded(errors)
        def writer(store: ChunkStore, rng: random.Random) -> None:
            for _ in range(WRITER_STEPS):
                r = rng.random()
                if r < 0.05:
                    store.delete_namespace(soak.NAMESPACES[1])
                elif r < 0.15:
                    n = evict_bytes(store, rng.randint(1, 4096)).num_chunks
                    with lock:
                        counts["evicted"] += n
                else:
                    pages = random_chain(rng)
                    result = store.put(pages, [expected[p.key] for p in pages])
                    # A page may find no room while the other server's rows fill the tier (both
                    # made room before either committed); any other failure is a bug.
                    if other := {k: why for k, why in result.failed.items() if not why.startswith("no room")}:
                        raise AssertionError(f"put failed: {other}")
                    with lock:
                        counts["stored"] += len(result.stored)
                        counts["no_room"] += len(result.failed)

        @guarded(errors)
        def reader(store: ChunkStore, rng: random.Random) -> None:
            outs = read_buffers()
            for _ in range(READER_STEPS):
                got = checked_read(store, rng, expected, outs)
                with lock:
                    counts["hits"] += sum(t is not None for t in got)
                    counts["misses"] += sum(t is None for t in got)

        threads = [threading.Thread(target=writer, args=(a, 1)), threading.Thread(target=writer, args=(b, 2)),
                   threading.Thread(target=reader, args=(a, 101)), threading.Thread(target=reader, args=(b, 102))]
        run_threads(threads, 240)
        assert errors == []
        assert counts["stored"] > 0 and counts["hits"] + counts["misses"] > 0
        report = verify(a)
        assert (report.corrupt, report.missing) == (0, 0)
        assert a.lapsed_claims(now=time.time() + 3600) == []  # every claim released
        assert set(a.payloads.keys()) >= {r.key for r in a.iter_rows()}
        servers.close()
        with servers.open("c", capacity_bytes=capacity) as again:
            assert soak.check_store(again) == []
    finally:
        servers.close()


@pytest.fixture
def soak_servers(tmp_path, postgres_url, bucket):
    opened = Servers(tmp_path, soak.SOAK_IDENTITY, postgres_url, bucket)
    yield opened
    opened.close()


def _reader_and_restorer(soak_servers: Servers, restorer: str) -> tuple[ChunkStore, FaultyPayloads, ChunkStore]:
    payloads = FaultyPayloads(soak_servers.bucket.payloads())
    reader = soak_servers.open("a", payloads=payloads, num_workers=2)
    return reader, payloads, reader if restorer == "same-server" else soak_servers.open("b", num_workers=2)


@pytest.mark.parametrize("restorer", ["same-server", "another-server"])
def test_a_read_racing_evict_and_restore_keeps_the_restored_chunk(soak_servers, restorer):
    """test_concurrency.py::test_a_read_racing_evict_and_restore_keeps_the_restored_chunk, with the
    eviction and the put again on this server or on another one of the tier."""
    reader, payloads, other = _reader_and_restorer(soak_servers, restorer)
    page, want = one_page(0)
    assert reader.put([page], [want]).ok
    # Between this reader's index lookup and its GET: a writer evicts the chunk and stores it
    # again. The GET fails in the gap, so the reader sees no object.
    lose_the_read_race(payloads, page, lambda: store_again_meanwhile(other, page, want))
    assert reader.get([page]) == [None]  # losing the race may cost this read
    payloads.clear()
    assert reader.exists([page.key]) == [True]  # the chunk stored meanwhile stays
    assert reader.payloads.exists(page.key)
    assert soak.same_bytes(reader.get([page])[0], want)


@pytest.mark.parametrize("restorer", ["same-server", "another-server"])
def test_a_damaged_read_racing_evict_and_restore_keeps_the_restored_chunk(soak_servers, bucket, restorer):
    """test_concurrency.py::test_a_corrupt_read_racing_evict_and_restore_keeps_the_restored_chunk:
    the reader's quarantine looks again and leaves the good object stored meanwhile."""
    reader, payloads, other = _reader_and_restorer(soak_servers, restorer)
    page, want = one_page(1)
    assert reader.put([page], [want]).ok
    bucket.write(page.key, b"rot" + bucket.read(page.key)[3:])
    # The reader reads the damaged object; a writer replaces it meanwhile.
    race_a_damaged_read(payloads, page, lambda: store_again_meanwhile(other, page, want))
    assert reader.get([page]) == [None]
    payloads.clear()
    assert reader.exists([page.key]) == [True] and bucket.quarantined() == []
    assert soak.same_bytes(reader.get([page])[0], want)


def test_two_puts_of_one_key_on_one_server_store_it_once(soak_servers, bucket):
    """test_concurrency.py::test_concurrent_puts_of_one_key_do_not_share_a_temp_file, the tier's
    way: while one put uploads the key, another put of it on the same server finds it claimed and
    skips it (a duplicate); the first commits it; neither fails and the object verifies."""
    payloads = FaultyPayloads(bucket.payloads())
    store = soak_servers.open("a", payloads=payloads, num_workers=2)
    page, want = one_page(2)
    uploading, resume = threading.Event(), threading.Event()
    results = {}

    def hold_the_first_upload(key):
        if not uploading.is_set():
            uploading.set()
            assert resume.wait(30)

    payloads.hook("publish", hold_the_first_upload)
    first = threading.Thread(target=lambda: results.setdefault("first", store.put([page], [want])))
    first.start()
    try:
        assert uploading.wait(30)
        second = store.put([page], [want])
    finally:
        resume.set()
        first.join(60)
    assert second.deduplicated == [page.key] and not second.failed and second.stored == []
    assert results["first"].stored == [page.key] and not results["first"].failed
    assert check_file(store, page.key).is_ok and bucket.keys() == {page.key}
    assert store.lapsed_claims(now=time.time() + 3600) == []


def test_one_writer_per_folder_and_many_on_the_tier(soak_servers):
    """test_concurrency.py::test_second_writer_in_the_same_process_is_refused: a server's folder
    keeps its lock on a shared tier (a second writer of that folder is refused), while a server
    with its own folder writes the same tier beside it."""
    first = soak_servers.open("a")
    with pytest.raises(StoreBusyError):
        soak_servers.open("a")
    page, want = one_page(0)
    beside = soak_servers.open("b")
    assert beside.put([page], [want]).stored == [page.key]
    assert first.exists([page.key]) == [True]
    first.close()
    assert soak_servers.open("a").exists([page.key]) == [True]  # closing released the folder


# -- eviction plans (tests/test_store_eviction.py, on the tier's shared rows) -----------------

P = TINY.page_size


def build_shared(servers: Servers, seed: int) -> ChunkStore:
    """test_store_eviction.py's build on a shared tier: branching prefixes in two namespaces, each
    chunk with its own access time, one pinned."""
    return fill_branches(servers.open("a"), seed, lambda times: set_access_times(servers.index_url, times))


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), share=st.floats(0.05, 1.0), ns=st.sampled_from([None, "a"]),
       max_chunks=st.sampled_from([None, 3]), by_age=st.booleans())
def test_a_plan_is_what_the_rule_takes_and_changes_nothing(tmp_path_factory, postgres_server, moto_s3, seed, share,
                                                          ns, max_chunks, by_age):
    """test_store_eviction.py::test_a_plan_is_what_the_rule_takes_and_changes_nothing; a shared
    tier's evict always plans again under the evictor lock, which here takes the same keys."""
    with fresh_tier(tmp_path_factory.mktemp("tier"), TINY, postgres_server, moto_s3) as servers:
        store = build_shared(servers, seed)
        rows = {r.key: r for r in store.iter_rows()}
        selection = drawn_selection(store, rows, share, ns, max_chunks, by_age)
        plan = assert_plan_is_the_rule(store, rows, selection)
        done = store.evict(plan)
        assert done.keys == plan.keys  # nothing changed in between: the plan's keys
        assert not any(store.exists(list(plan.keys)))
        assert not set(plan.keys) & servers.bucket.keys()  # rows, then objects
        assert store.stats().evictions == plan.num_chunks
        assert store.lapsed_claims(now=time.time() + 3600) == []


def test_a_plan_made_stale_by_another_server_is_made_again_under_the_evictor_lock(servers):
    """test_store_eviction.py::test_a_stale_plan_is_made_again_under_the_writer_lock, with the
    changes made by another server (which the planner's own write generation never sees)."""
    check_a_stale_plan_is_planned_again(servers.open("a"), servers.open("b"))


ALL = 1000  # a max_chunks over every chunk of these tests (see the LIMIT test below)


def test_key_selection_keeps_pinned_chunks_and_their_ancestors(servers):
    """test_store_eviction.py::test_key_selection_keeps_pinned_chunks_and_their_ancestors, with the
    pin set by another server (every selection bounded by max_chunks: an unbounded one fails on
    PostgreSQL, test_a_key_selection_without_max_chunks_plans_on_postgresql)."""
    pages = chain_pages(TINY, list(range(P * 6)))
    store, other = servers.open("a"), servers.open("b")
    store.put(pages, kv_pages(TINY, 6))
    other.pin([pages[4].key])
    with pytest.raises(StrandedDescendantsError, match="descendants"):
        store.plan_eviction(EvictionSelection(key=pages[1].key, max_chunks=ALL))
    plan = store.plan_eviction(EvictionSelection(key=pages[1].key, descendants=True, max_chunks=ALL))
    assert plan.keys == (pages[5].key,) and plan.skipped_pinned == 4 and plan.is_complete
    partial = store.plan_eviction(EvictionSelection(key=pages[0].key, descendants=True, max_chunks=2))
    assert not partial.is_complete and partial.keys == (pages[5].key,)
    with pytest.raises(ChunkNotStoredError):
        store.plan_eviction(EvictionSelection(key=b"\0" * 32, max_chunks=ALL))
    other.unpin([pages[4].key])
    done = store.evict(store.plan_eviction(EvictionSelection(key=pages[3].key, descendants=True, max_chunks=ALL)))
    assert done.keys == (pages[5].key, pages[4].key, pages[3].key)
    assert other.longest_prefix([p.key for p in pages]) == 3
    assert store.stats().evictions == 3
    assert servers.bucket.keys() == {p.key for p in pages[:3]}


def test_a_key_selection_without_max_chunks_plans_on_postgresql(servers):
    """A key and its descendants, selected without max_chunks (the API's and `chunkstore evict`'s
    usual call), plan on a PostgreSQL index as on SQLite."""
    pages = chain_pages(TINY, list(range(P * 3)))
    store = servers.open("a")
    store.put(pages, kv_pages(TINY, 3))
    plan = store.plan_eviction(EvictionSelection(key=pages[1].key, descendants=True))
    assert plan.keys == (pages[2].key, pages[1].key)


def test_max_chunks_cuts_a_plan_short(servers):
    """test_store_eviction.py::test_max_chunks_cuts_a_plan_short."""
    store = build_shared(servers, 5)
    plan = store.plan_eviction(EvictionSelection(namespace="b", max_chunks=2))
    assert plan.num_chunks == 2 and not plan.is_complete
    whole = store.plan_eviction(EvictionSelection(namespace="b"))
    assert whole.is_complete and whole.keys[:2] == plan.keys
    assert all(not v.pinned and v.namespace == "b" for v in whole.victims)


def test_bulk_eviction_follows_the_plan_order(servers):
    """test_store_eviction.py::test_bulk_eviction_follows_the_plan_order, from another server."""
    store = build_shared(servers, 11)
    rows = {r.key: r for r in store.iter_rows()}
    want = store.stored_bytes() // 2
    expected = model_plan(rows, EvictionSelection(bytes_to_free=want))
    assert list(evict_bytes(servers.open("b"), want).keys) == expected


# -- capacity and quotas across servers -------------------------------------------------------

def _single_pages(namespace: str, n: int, first: int = 0) -> list[PageRef]:
    """``n`` one-page chains (no page extends another, so any of them may be evicted)."""
    return [chain_pages(TINY, [1000 * (first + i) + t for t in range(P)], namespace)[0] for i in range(n)]


def _page_bytes(store: ChunkStore, pages: list[PageRef]) -> int:
    """The stored size of each of ``pages`` (stored uncompressed, so all the same)."""
    sizes = {r.stored_bytes for r in store.chunk_rows([p.key for p in pages]).values()}
    assert len(sizes) == 1, sizes
    return sizes.pop()


def test_a_quota_set_on_one_server_bounds_the_puts_of_another(servers):
    """A namespace quota is the tier's: set on server a, server b's puts evict within it (least
    recently used first) to fit, and other namespaces are left alone."""
    a, b = servers.open("a", codec=Codec.NONE), servers.open("b", codec=Codec.NONE)
    others = _single_pages("r", 2, first=100)
    assert b.put(others, kv_pages(TINY, 2)).ok
    size = _page_bytes(b, others)
    a.set_quota("q", 3 * size)
    pages = _single_pages("q", 6)
    tensors = kv_pages(TINY, 6, seed=1)
    assert b.put(pages[:3], tensors[:3]).ok
    assert a.put(pages[3:5], tensors[3:5]).ok  # a evicts two of b's (least recently used)
    assert b.stored_bytes("q") == 3 * size
    assert sum(a.exists([p.key for p in pages[:3]])) == 1 and a.exists([p.key for p in pages[3:5]]) == [True] * 2
    assert b.put(pages[5:], tensors[5:]).ok
    assert a.stored_bytes("q") == 3 * size and b.exists([pages[5].key]) == [True]
    assert a.exists([p.key for p in others]) == [True, True]
    assert servers.bucket.keys() == {r.key for r in a.iter_rows()}


def test_a_quota_set_on_one_server_bounds_another_that_put_in_the_namespace_before(servers):
    """A quota set on server a binds server b's next puts even though b has put into (and so asked
    for the quota of) that namespace before."""
    a, b = servers.open("a", codec=Codec.NONE), servers.open("b", codec=Codec.NONE)
    pages = _single_pages("q", 5)
    tensors = kv_pages(TINY, 5)
    assert b.put(pages[:1], tensors[:1]).ok  # b has asked for q's quota once: none then
    size = _page_bytes(b, pages[:1])
    a.set_quota("q", 2 * size)
    for i in range(1, 5):  # one page a put: each fits by evicting the least recently used
        assert b.put(pages[i:i + 1], tensors[i:i + 1]).stored == [pages[i].key]
        assert b.stored_bytes("q") <= 2 * size


def _bounded_tier(servers, bound: str, pages: int) -> tuple[ChunkStore, int, dict]:
    """A probe server, the stored size of one page (measured, then deleted), and the options that
    bound the tier to ``pages`` such pages: a capacity, or a quota on namespace "q" (set here)."""
    probe = servers.open("probe", codec=Codec.NONE)
    sample = _single_pages("q", 1, first=900)
    assert probe.put(sample, kv_pages(TINY, 1)).ok
    size = _page_bytes(probe, sample)
    probe.delete([sample[0].key])
    if bound == "quota":
        probe.set_quota("q", pages * size)
        return probe, size, {}
    return probe, size, {"capacity_bytes": pages * size}


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
@pytest.mark.parametrize("bound", ["capacity", "quota"])
def test_concurrent_puts_of_two_servers_keep_the_tier_within_its_bound(servers, bound):
    """Two servers put four pages each on a tier with room for six: server a's put has made its
    room and waits before its rows (an InsertGate on its index) while server b's put runs; then a
    commits. The tier must never hold more than its bound."""
    gate = InsertGate()
    _, size, limit = _bounded_tier(servers, bound, 6)
    a = servers.open("a", codec=Codec.NONE, index_factory=faulty_index(IndexFaults(hold_inserts=gate)), **limit)
    b = servers.open("b", codec=Codec.NONE, **limit)
    pages = _single_pages("q", 8)
    tensors = kv_pages(TINY, 8)
    out: dict = {}
    first = threading.Thread(target=lambda: out.update(a=a.put(pages[:4], tensors[:4])))
    first.start()
    try:
        assert gate.reached.wait(30)  # a's room is made, its rows are next
        out["b"] = b.put(pages[4:], tensors[4:])
    finally:
        gate.set()
        first.join(60)
    assert b.stored_bytes("q") <= 6 * size, (len(out["a"].stored), len(out["b"].stored))


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
@pytest.mark.parametrize("bound", ["capacity", "quota"])
def test_many_servers_bounded_puts_at_once_never_overfill_the_tier(servers, bound, postgres_url):
    """Four servers put twelve one-page chains each, all at once, into room for five pages (each
    server in a namespace of its own under a capacity, so that only the room lock orders their
    commits; all in one under a quota): most of their row commits find room without the evictor
    lock, and the rest evict and commit again. A watcher reading the tier's usage from the
    database meanwhile never sees it over the bound, every page is stored or fails for want of
    room, and afterwards every row has its object and no claim is left."""
    probe, size, limit = _bounded_tier(servers, bound, 5)
    fleet = [servers.open(name, codec=Codec.NONE, **limit) for name in "abcd"]
    watcher = ChunkIndex(postgres_url)
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(watcher.stored_bytes("q" if bound == "quota" else None))

    results: dict[str, list] = {}

    def put_all(i: int, store: ChunkStore) -> None:
        pages = _single_pages("q" if bound == "quota" else f"q{i}", 12, first=100 * (i + 1))
        tensors = kv_pages(TINY, 12, seed=i)
        results[store.writer_id] = [store.put(pages[j:j + 1], tensors[j:j + 1]) for j in range(12)]

    threads = [threading.Thread(target=put_all, args=(i, s)) for i, s in enumerate(fleet)]
    watching = threading.Thread(target=watch)
    watching.start()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        done.set()
        watching.join(30)
        watcher.close()
    assert len(seen) > 10 and max(seen) <= 5 * size
    outcomes = [r for rs in results.values() for r in rs]
    assert len(outcomes) == 48
    for r in outcomes:
        assert all("no room" in why for why in r.failed.values()), r.failed
    assert sum(len(r.stored) for r in outcomes) >= 24  # most found room or made it
    rows = {r.key for r in probe.iter_rows()}
    assert servers.bucket.keys() == rows and len(rows) <= 5
    assert probe.lapsed_claims(now=time.time() + 3600) == []  # every claim released
    room = [s.room_lock_stats() for s in fleet]
    if bound == "capacity":
        assert all(r.acquired >= 12 for r in room)  # each commit passes the room lock
    else:
        assert all(r.acquired == 0 for r in room)  # a quota alone: the namespace's usage row orders them


# -- races between servers that the folder tree's writer lock rules out ----------------------

def test_verify_beside_another_servers_put_in_flight_reports_no_damage(servers, chain):
    """Verify never counts a put in flight as damage (docs/ARCHITECTURE.md, Offline care): on a
    shared tier, another server's put between its uploads and its rows (its keys claimed) is not an
    orphan, though this server's writer lock does not cover it."""
    pages, tensors = chain
    gate = InsertGate()
    writer = servers.open("a", index_factory=faulty_index(IndexFaults(hold_inserts=gate)))
    checker = servers.open("b")
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(result=writer.put(pages[:2], tensors[:2])))
    thread.start()
    try:
        assert gate.reached.wait(30)  # uploaded, rows next
        report = verify(checker)
        repaired = verify(checker, repair=True)  # nor does a repair adopt it
    finally:
        gate.set()
        thread.join(60)
    assert out["result"].stored == [p.key for p in pages[:2]]
    assert (report.orphans, report.damage) == (0, 0)
    assert (repaired.orphans, repaired.adopted) == (0, 0)


def test_repair_beside_an_eviction_on_another_server_leaves_no_row_without_its_object(servers, bucket, chain):
    """verify --repair on server b while server a evicts (a's rows deleted under its claims, its
    objects not yet): b adopts none of them, and afterwards every row of the tier has its object."""
    pages, tensors = chain
    payloads = FaultyPayloads(bucket.payloads())
    evictor, repairer = servers.open("a", payloads=payloads), servers.open("b")
    assert evictor.put(pages[:3], tensors[:3]).ok
    repaired = []

    def repair_meanwhile(key):  # the evictor's rows are gone and its claims held; the objects are next
        if not repaired:
            repaired.append(verify(repairer, repair=True))

    payloads.hook("delete", repair_meanwhile)
    assert evict_bytes(evictor, 1).keys == (pages[2].key,)
    assert repaired[0].adopted == 0
    assert pages[2].key not in bucket.keys()
    report = verify(repairer)
    assert (report.ok, report.missing) == (2, 0)


def test_repair_racing_the_sweeper_on_another_server_leaves_no_row_without_its_object(servers, bucket, chain):
    """An orphan object (no row, no claim, past the sweeper's grace): server b's repair reads it to
    adopt it while server a's sweep claims and deletes it. Afterwards every row has its object."""
    pages, tensors = chain
    payloads = FaultyPayloads(bucket.payloads())
    sweeper, repairer = servers.open("a"), servers.open("b", payloads=payloads)
    assert sweeper.put(pages[:2], tensors[:2]).ok
    assert _drop_rows(servers.index_url, [pages[1].key]) == 1  # its object is an orphan now
    swept = []

    def sweep_meanwhile(read, key, max_size_bytes, buffer):
        data = bytes(read(key, max_size_bytes, buffer))  # the repair has read the orphan whole...
        if key == pages[1].key and not swept:
            swept.append(sweeper.sweep(grace_s=0))  # ...and the sweeper deletes it meanwhile
        return memoryview(data)

    payloads.read_through(sweep_meanwhile)
    repaired = verify(repairer, repair=True)
    payloads.clear()
    assert swept and swept[0].objects_deleted == 1
    report = verify(repairer)
    assert report.missing == 0, (repaired, swept)


@pytest.mark.parametrize("found", ["missing", "damaged"])
def test_a_chunk_another_server_stores_again_while_a_read_drops_it_stays(servers, bucket, found):
    """test_concurrency.py's evict-and-restore races, with the other server's put landing between
    the reader's look at the object (under its writer lock) and its row delete."""
    page, want = chain_pages(TINY, list(range(P)))[0], kv_pages(TINY, 1)[0]
    restorer = servers.open("b")
    restored = []

    def store_again(keys):  # the reader has looked at the object; its row delete is next
        if page.key in keys and not restored:
            restored.append(True)
            store_again_meanwhile(restorer, page, want)  # the bad chunk goes and comes back whole

    reader = servers.open("a", index_factory=hooked_index({"delete": store_again}))
    assert restorer.put([page], [want]).ok
    if found == "missing":
        bucket.delete(page.key)
    else:
        bucket.write(page.key, b"rot" + bucket.read(page.key)[3:])
    assert reader.get([page]) == [None]
    assert restored, "the race was not run"
    assert restorer.exists([page.key]) == [True]  # stored again meanwhile: it stays
    assert same_bytes(reader.get([page])[0], want)
