"""A shared tier: several stores (one per server, each with its own folder) on one index in
PostgreSQL and one bucket (moto's S3 server here; the end-to-end tests run on radosgw). The
publish protocol (claim, conditional upload, row), eviction across writers, the sweeper, and the
index claimed by the shared payloads."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from sqlalchemy.exc import OperationalError

from chunkstore import ChunkStore, ModelMismatchError, chain_pages
from chunkstore.disk.index import ChunkIndex, LockStats
from chunkstore.disk.maintenance import gc, verify
from chunkstore.disk.objects import ObjectPayloads
from chunkstore.disk.payloads import PayloadsUnavailable
from chunkstore.disk.results import BucketListing, listing_of, listing_text
from chunkstore.disk.shared_protocol import COMMIT_TAIL_PAGES
from tests.helpers.faults import FaultyPayloads, IndexFaults, faulty_index
from chunkstore.testing.tensors import same_bytes
from tests.helpers import kv_pages


@pytest.fixture
def open_server(tmp_path, identity, moto_s3, bucket_url, postgres_url):
    """open_server(name, **kwargs): a store of server ``name`` on the shared tier."""
    opened: list[ChunkStore] = []

    def open_one(name: str, **kwargs) -> ChunkStore:
        kwargs.setdefault("payloads", ObjectPayloads(moto_s3.config(bucket_url)))
        store = ChunkStore(tmp_path / name, identity, index_url=postgres_url, **kwargs)
        opened.append(store)
        return store

    open_one.s3, open_one.bucket_url = moto_s3, bucket_url
    yield open_one
    for store in opened:
        store.close()


def _objects(moto_s3, bucket_url: str, sub: str = "chunks/") -> list[str]:
    bucket = bucket_url.removeprefix("s3://").split("/")[0]
    listed = moto_s3.client().list_objects_v2(Bucket=bucket, Prefix=f"fleet/{sub}")
    return [o["Key"] for o in listed.get("Contents", [])]


def test_what_one_server_stores_another_serves(open_server, chain):
    pages, tensors = chain
    a, b = open_server("a"), open_server("b")
    assert a.shared and b.shared and a.writer_id != b.writer_id
    assert a.put(pages, tensors).ok
    assert b.longest_prefix([p.key for p in pages]) == len(pages)
    assert all(same_bytes(g, t) for g, t in zip(b.get(pages), tensors))
    result = b.put(pages, tensors)  # already there: nothing written twice
    assert result.stored == [] and len(result.deduplicated) == len(pages)
    stats = b.stats()  # the whole tier's rows, and what only a shared tier has
    assert stats.num_chunks == len(pages) and stats.shared.writer_id == b.writer_id
    assert stats.shared.payload_store == a.payloads.shared_name and stats.shared.index.startswith("postgresql")
    assert (stats.shared.claims, stats.shared.lapsed_claims) == (0, 0) and not stats.shared.read_health.degraded


def test_tenants_stay_apart_across_servers(open_server, identity):
    tokens = list(range(identity.page_size * 3))
    mine, theirs = chain_pages(identity, tokens, namespace="tenant-a"), chain_pages(identity, tokens, namespace="tenant-b")
    a, b = open_server("a"), open_server("b")
    assert a.put(mine, kv_pages(identity, 3)).ok
    assert b.get(theirs) == [None] * 3 and b.longest_prefix([p.key for p in theirs]) == 0


def _stalled_put(store: ChunkStore, pages, tensors) -> tuple[threading.Thread, dict]:
    """``store.put`` in a thread that uploads, then waits before its rows (the store was opened with
    a FaultyIndex holding inserts); returns the thread and where its result will be."""
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(result=store.put(pages, tensors)), daemon=True)
    thread.start()
    return thread, out


def _wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_key_claimed_by_a_live_writer_is_left_to_it_and_taken_over_once_lapsed(open_server, chain, moto_s3,
                                                                                   bucket_url):
    pages, tensors = chain
    faults = IndexFaults(hold_inserts=threading.Event())
    a = open_server("a", claim_ttl_s=1.0, index_factory=faulty_index(faults))
    b = open_server("b")
    thread, out = _stalled_put(a, pages[:1], tensors[:1])
    _wait_for(lambda: len(_objects(moto_s3, bucket_url)) == 1)  # a uploaded; its row waits
    result = b.put(pages[:1], tensors[:1])
    assert result.stored == [] and result.deduplicated == [pages[0].key]  # a's claim: a's to publish
    assert b.get(pages[:1]) == [None]  # an object without a row is invisible
    time.sleep(1.1)  # a's claim lapses
    assert b.put(pages[:1], tensors[:1]).stored == [pages[0].key]  # taken over; a's object was whole
    faults.hold_inserts.set()
    thread.join(10)
    assert "claim lapsed" in out["result"].failed[pages[0].key]  # a commits no row for b's key
    assert b.num_chunks() == 1 and same_bytes(a.get(pages[:1])[0], tensors[0])


def test_verify_beside_a_put_in_flight_finds_no_orphan_and_adopts_nothing(open_server, chain, moto_s3, bucket_url):
    pages, tensors = chain
    faults = IndexFaults(hold_inserts=threading.Event())
    a = open_server("a", index_factory=faulty_index(faults))
    checker = open_server("checker")
    thread, out = _stalled_put(a, pages[:3], tensors[:3])
    _wait_for(lambda: len(_objects(moto_s3, bucket_url)) == 3)  # uploaded; the rows wait under a's claims
    assert verify(checker).orphans == 0
    repaired = verify(checker, repair=True)
    assert (repaired.orphans, repaired.adopted) == (0, 0) and checker.num_chunks() == 0
    faults.hold_inserts.set()
    thread.join(10)
    assert out["result"].stored == [p.key for p in pages[:3]]  # a's put commits its own rows
    assert verify(checker).ok == 3


def test_two_servers_racing_to_publish_the_same_pages_store_each_once(open_server, identity):
    pages = chain_pages(identity, list(range(identity.page_size * 24)))
    tensors = kv_pages(identity, len(pages))
    stores = [open_server(name) for name in ("a", "b", "c")]
    results, start = {}, threading.Barrier(len(stores))

    def race(store: ChunkStore) -> None:
        start.wait()
        results[store.writer_id] = store.put(pages, tensors)

    threads = [threading.Thread(target=race, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stored = [k for r in results.values() for k in r.stored]
    assert sorted(stored) == sorted(p.key for p in pages)  # every page once, by one writer
    assert all(not r.failed for r in results.values())
    assert stores[0].num_chunks() == len(pages) and verify(stores[1]).ok == len(pages)


def test_eviction_across_servers_deletes_rows_then_objects(open_server, identity, moto_s3, bucket_url):
    first = chain_pages(identity, list(range(identity.page_size * 6)))
    second = chain_pages(identity, list(range(1000, 1000 + identity.page_size * 6)))
    a = open_server("a")
    assert a.put(first, kv_pages(identity, 6)).ok
    per_page = a.stored_bytes() // 6
    b = open_server("b", capacity_bytes=per_page * 8)  # the whole tier's capacity, as b sees it
    assert b.put(second, kv_pages(identity, 6)).ok
    assert b.num_chunks() <= 8 and b.longest_prefix([p.key for p in second]) == 6
    kept = a.exists([p.key for p in first])
    assert kept[:sum(kept)] == [True] * sum(kept) and sum(kept) <= 2  # leaf first: the prefix stays
    assert len(_objects(moto_s3, bucket_url)) == b.num_chunks()  # no object outlives its row
    assert a.lapsed_claims(now=time.time() + 3600) == []  # the evictor released its claims


def test_a_bounded_put_that_must_evict_makes_room_for_the_next_ones(open_server, identity):
    """The fleet's bounded puts pass one evictor lock: a put that must evict frees room for more
    puts than its own (a sixteenth of the capacity here), so the next ones plan and delete
    nothing under the lock, and the tier never holds more than its capacity."""
    a = open_server("a")
    for c in range(16):
        assert a.put(chain_pages(identity, list(range(c * 100, c * 100 + identity.page_size * 4))),
                     kv_pages(identity, 4)).ok
    capacity = a.stored_bytes()  # full: 64 pages
    per_page = capacity // 64
    b = open_server("b", capacity_bytes=capacity)

    def put_one(first_token: int) -> None:
        assert b.put(chain_pages(identity, list(range(first_token, first_token + identity.page_size))),
                     kv_pages(identity, 1)).ok
        assert b.stored_bytes() <= capacity

    put_one(10_000)
    evicted = b.stats().evictions
    assert evicted >= 1 + 3  # its own page's room, and about four pages' more (a sixteenth of 64)
    assert capacity - b.stored_bytes() >= 3 * per_page
    for first in (20_000, 30_000, 40_000):
        put_one(first)
    assert b.stats().evictions == evicted  # they found room: no plan, no delete


def _wait_for_a_lock_wait(index: ChunkIndex, what: str) -> None:
    """Until a session of ``index``'s database waits for an advisory lock (a put of another server)."""
    deadline = time.monotonic() + 30
    with index.engine.connect() as conn:
        while not conn.exec_driver_sql("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                       "AND wait_event_type = 'Lock' AND wait_event = 'advisory'").scalar():
            assert time.monotonic() < deadline, f"the put never waited for the {what}"
            time.sleep(0.02)
            conn.rollback()


def test_a_servers_passes_through_the_fleets_locks_are_counted(open_server, identity, postgres_url):
    """What a fleet's lock utilisation is read from (each server's stats and /metrics): an
    unbounded put takes neither lock; a bounded put that finds room takes the room lock for its
    row commit and not the evictor lock; one that must evict takes both; and the time each waited
    while another server held the lock is counted."""
    a = open_server("a")
    assert a.put(chain_pages(identity, list(range(identity.page_size * 2))), kv_pages(identity, 2)).ok
    assert a.stats().shared.evictor_lock == LockStats() == a.stats().shared.room_lock  # unbounded: never taken
    b = open_server("b", capacity_bytes=100 * a.stored_bytes())

    def put_one(first_token: int) -> None:
        assert b.put(chain_pages(identity, list(range(first_token, first_token + identity.page_size))),
                     kv_pages(identity, 1)).ok

    put_one(1000)
    room = b.stats().shared.room_lock
    assert room.acquired == 1 and room.held_s > 0 and room.waited_s >= 0
    assert b.stats().shared.evictor_lock == LockStats()  # it found room
    other = ChunkIndex(postgres_url)  # another server, committing within the capacity
    try:
        with other.engine.begin() as conn:
            other.dialect.lock_room(conn, 30.0)
            waiting = threading.Thread(target=put_one, args=(2000,))
            waiting.start()
            _wait_for_a_lock_wait(other, "room lock")
            time.sleep(0.5)
        waiting.join(timeout=30)
        after = b.stats().shared.room_lock
        assert after.acquired == 2 and after.waited_s - room.waited_s >= 0.5 and after.held_s > room.held_s
        assert b.room_lock_stats() == after  # the same counts, without a statement

        full = b.stored_bytes()
        c = open_server("c", capacity_bytes=full)  # full: its put must evict
        with other.evictor_lock():
            evicting = chain_pages(identity, list(range(3000, 3000 + identity.page_size)))
            waiting = threading.Thread(target=lambda: c.put(evicting, kv_pages(identity, 1)))
            waiting.start()
            _wait_for_a_lock_wait(other, "evictor lock")
            time.sleep(0.5)
        waiting.join(timeout=30)
    finally:
        other.close()
    evictor = c.stats().shared.evictor_lock
    assert evictor.acquired >= 1 and evictor.waited_s >= 0.5 and evictor.held_s > 0
    assert c.room_lock_stats().acquired >= 2  # its commit that found no room, and the one after its eviction
    assert c.evictor_lock_stats() == evictor
    assert c.stored_bytes() <= full


def test_a_bounded_put_that_finds_room_does_not_wait_for_another_servers_eviction(open_server, identity,
                                                                                   postgres_url):
    """The fleet's bounded puts no longer queue behind one lock: while another server holds the
    evictor lock (an eviction of many rows), a put within the capacity that finds room commits."""
    a = open_server("a")
    assert a.put(chain_pages(identity, list(range(identity.page_size * 2))), kv_pages(identity, 2)).ok
    capacity = 100 * a.stored_bytes()
    b = open_server("b", capacity_bytes=capacity)
    other = ChunkIndex(postgres_url)
    try:
        with other.evictor_lock():
            began = time.monotonic()
            pages = chain_pages(identity, list(range(1000, 1000 + identity.page_size * 2)))
            result = b.put(pages, kv_pages(identity, 2))
            took_s = time.monotonic() - began
    finally:
        other.close()
    assert result.ok and len(result.stored) == 2, result.failed
    assert took_s < 10  # (waiting for the lock would have taken its 30 s timeout, and failed)
    assert b.evictor_lock_stats() == LockStats() and b.room_lock_stats().acquired >= 1
    assert b.stored_bytes() <= capacity


def _a_full_tier_and_a_bounded_server(open_server, identity, moto_s3, bucket_url, **kwargs):
    """Server a's six pages on the tier; server b, bounded to eight pages of the whole tier, with
    payloads whose deletes a test can hook; and the six pages b is to put (two of a's must go)."""
    first = chain_pages(identity, list(range(identity.page_size * 6)))
    second = chain_pages(identity, list(range(1000, 1000 + identity.page_size * 6)))
    a = open_server("a")
    assert a.put(first, kv_pages(identity, 6)).ok
    payloads = FaultyPayloads(ObjectPayloads(moto_s3.config(bucket_url)))
    b = open_server("b", capacity_bytes=a.stored_bytes() // 6 * 8, payloads=payloads, **kwargs)
    return a, b, payloads, second


def test_a_bounded_put_deletes_what_it_evicted_after_letting_go_of_the_evictor_lock(
        open_server, identity, moto_s3, bucket_url, postgres_url):
    """The fleet has one evictor lock; a put that held it through the bucket's deletes made every
    other bounded put in the fleet wait for them."""
    a, b, payloads, second = _a_full_tier_and_a_bounded_server(open_server, identity, moto_s3, bucket_url)
    other = ChunkIndex(postgres_url)  # another server's connection to the index
    lock_taken: list[bool] = []

    def another_evictor_tries_the_lock(key) -> None:
        try:
            with other.evictor_lock(timeout_s=0.5):
                lock_taken.append(True)
        except OperationalError:
            lock_taken.append(False)

    payloads.hook("delete", another_evictor_tries_the_lock)
    try:
        assert b.put(second, kv_pages(identity, 6)).ok
    finally:
        payloads.clear()
        other.close()
    assert lock_taken and all(lock_taken)  # every delete ran with the lock free for another server
    assert len(_objects(moto_s3, bucket_url)) == b.num_chunks() <= 8  # no object outlives its row
    assert a.lapsed_claims(now=time.time() + 3600) == []  # and the claims went with the objects


def test_a_bucket_that_refuses_the_deletes_after_a_bounded_put_leaves_orphans_the_sweeper_takes(
        open_server, identity, moto_s3, bucket_url):
    """The objects a put evicted go after its rows are committed: when the bucket refuses those
    deletes, the put still stands, no row points at a deleted object, and the evicted objects stay
    claimed until the claims lapse, then the sweeper deletes them."""
    a, b, payloads, second = _a_full_tier_and_a_bounded_server(open_server, identity, moto_s3, bucket_url,
                                                               claim_ttl_s=0.5)

    def refuse(key) -> None:
        raise PayloadsUnavailable("the bucket refuses deletes")

    payloads.hook("delete", refuse)
    try:
        assert b.put(second, kv_pages(identity, 6)).ok
    finally:
        payloads.clear()
    assert b.longest_prefix([p.key for p in second]) == 6
    evicted = 12 - b.num_chunks()
    assert evicted > 0 and len(_objects(moto_s3, bucket_url)) == 12  # rows gone, objects still there
    assert all(same_bytes(g, t) for g, t in zip(b.get(second), kv_pages(identity, 6)))
    time.sleep(0.6)
    swept = a.sweep(grace_s=3600)
    assert (swept.lapsed_claims, swept.objects_deleted) == (evicted, evicted)
    assert len(_objects(moto_s3, bucket_url)) == b.num_chunks()


def test_the_sweeper_removes_what_dead_writers_left(open_server, chain, moto_s3, bucket_url):
    pages, tensors = chain
    faults = IndexFaults(hold_inserts=threading.Event())
    dying = open_server("dying", claim_ttl_s=0.5, index_factory=faulty_index(faults))
    sweeper = open_server("sweeper")
    assert sweeper.put(pages[5:6], tensors[5:6]).ok
    # A writer that uploads four pages, then stalls before their rows (it dies there for the tier).
    thread, out = _stalled_put(dying, pages[:4], tensors[:4])
    _wait_for(lambda: len(_objects(moto_s3, bucket_url)) == 5)
    time.sleep(0.6)
    assert len(sweeper.lapsed_claims()) == 4
    assert sweeper.stats().shared.bucket is None  # no sweep has listed the bucket yet
    swept = sweeper.sweep(grace_s=3600)
    assert (swept.lapsed_claims, swept.objects_deleted) == (4, 4)
    assert _objects(moto_s3, bucket_url) == [sweeper.payloads.path_for(pages[5].key)]
    assert (swept.listing.objects, swept.listing.orphans) == (1, 0)
    assert sweeper.lapsed_claims(now=time.time() + 3600) == []
    faults.hold_inserts.set()  # the stalled writer wakes: its claims were taken, it commits nothing
    thread.join(10)
    assert set(out["result"].failed) == {p.key for p in pages[:4]} and sweeper.num_chunks() == 1
    # An orphan: an object with neither row nor claim. Young, it may be a put in flight; old, it goes.
    sweeper.payloads.publish([sweeper.payloads.stage(pages[4].key, [b"orphan"])])
    assert gc(sweeper).swept_objects == 0
    # The listing is kept in the index: every server shows it, with the orphan left.
    listing = dying.stats().shared.bucket
    assert (listing.objects, listing.orphans, listing.listed_by) == (2, 1, sweeper.stats().shared.server_name)
    swept = sweeper.sweep(grace_s=0)
    assert swept.objects_deleted == 1 and (swept.listing.objects, swept.listing.orphans) == (1, 0)
    assert dying.stats().shared.bucket == swept.listing
    assert _objects(moto_s3, bucket_url) == [sweeper.payloads.path_for(pages[5].key)]
    assert same_bytes(sweeper.get(pages[5:6])[0], tensors[5])


def test_the_shared_index_is_claimed_by_its_bucket(tmp_path, identity, moto_s3, bucket_url, postgres_url):
    with ChunkStore(tmp_path / "a", identity, index_url=postgres_url,
                    payloads=ObjectPayloads(moto_s3.config(bucket_url))):
        pass
    with pytest.raises(ModelMismatchError, match="belongs to a shared tier"):
        ChunkStore(tmp_path / "folder", identity, index_url=postgres_url)
    other = bucket_url.rsplit("/", 1)[0] + "/another-prefix"
    with pytest.raises(ModelMismatchError, match="payload_store"):
        ChunkStore(tmp_path / "b", identity, index_url=postgres_url, payloads=ObjectPayloads(moto_s3.config(other)))


WRITER = textwrap.dedent("""
    import sys
    from chunkstore import ChunkStore, chain_pages
    from chunkstore.disk.objects import ObjectPayloads, ObjectStoreConfig
    from tests.helpers import TINY, kv_pages

    folder, index_url, bucket_url, endpoint = sys.argv[1:5]
    config = ObjectStoreConfig(bucket_url, endpoint_url=endpoint, region="us-east-1",
                               access_key_id="chunkstore-test", secret_access_key="chunkstore-test-secret")
    store = ChunkStore(folder, TINY, index_url=index_url, payloads=ObjectPayloads(config), claim_ttl_s=1.0)
    print("ready", flush=True)
    for i in range(10_000):  # killed long before the end
        pages = chain_pages(TINY, list(range(i * 1000, i * 1000 + TINY.page_size * 8)))
        store.put(pages, kv_pages(TINY, len(pages)))
""")


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
def test_a_writer_killed_mid_publish_never_shows_a_partial_chunk(tmp_path, open_server, moto_s3, bucket_url,
                                                                postgres_url):
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "dead"), postgres_url, bucket_url,
                              moto_s3.endpoint_url], stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout.readline().strip() == b"ready"
        time.sleep(2.0)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    reader = open_server("reader")
    assert reader.num_chunks() > 0
    report = verify(reader)
    assert report.ok == reader.num_chunks() and report.missing == report.corrupt == 0  # every row's object whole
    time.sleep(1.1)  # the dead writer's claims lapse
    swept = reader.sweep(grace_s=0)
    assert reader.lapsed_claims(now=time.time() + 3600) == []
    assert len(_objects(moto_s3, bucket_url)) == reader.num_chunks()  # nothing it uploaded is left unindexed
    assert swept.objects_deleted <= swept.lapsed_claims + 1


def test_a_page_without_room_leaves_no_object_and_no_claim(open_server, chain, moto_s3, bucket_url):
    pages, tensors = chain
    a = open_server("a", capacity_bytes=1)  # room for no page at all
    result = a.put(pages[:3], tensors[:3])
    assert set(result.failed) == {p.key for p in pages[:3]} and "no room" in result.failed[pages[0].key]
    assert _objects(moto_s3, bucket_url) == []  # uploaded as encoded, deleted again when refused
    assert a.lapsed_claims(now=time.time() + 3600) == [] and a.num_chunks() == 0


def test_an_upload_that_fails_leaves_no_row_and_no_claim(open_server, chain):
    pages, tensors = chain
    payloads = FaultyPayloads(ObjectPayloads(open_server.s3.config(open_server.bucket_url)))
    a = open_server("a", payloads=payloads)
    payloads.fail("publish", key=pages[2].key, times=1)
    result = a.put(pages[:4], tensors[:4])
    assert list(result.failed) == [pages[2].key] and result.stored == [p.key for p in pages[:2]] + [pages[3].key]
    assert a.exists([p.key for p in pages[:4]]) == [True, True, False, True]
    assert a.lapsed_claims(now=time.time() + 3600) == []
    assert a.put(pages[2:3], tensors[2:3]).stored == [pages[2].key]  # the next try publishes it


def _long_chain(identity, num_pages: int):
    pages = chain_pages(identity, list(range(identity.page_size * num_pages)))
    return pages, kv_pages(identity, len(pages))


def test_a_long_put_commits_in_two_steps_and_keeps_the_first_when_the_second_fails(open_server, identity):
    """A put's rows go in two commits (the first while its last uploads run): a database that goes
    away between them leaves the first committed and nothing of the rest (no row, no object, no
    claim); the next put publishes the rest."""
    pages, tensors = _long_chain(identity, COMMIT_TAIL_PAGES + 16)
    keys = [p.key for p in pages]
    faults = IndexFaults(inserts_left=1)
    a = open_server("a", index_factory=faulty_index(faults))
    result = a.put(pages, tensors)
    assert result.stored == keys[:16] and list(result.failed) == keys[16:]
    assert a.exists(keys) == [True] * 16 + [False] * COMMIT_TAIL_PAGES
    assert len(_objects(open_server.s3, open_server.bucket_url)) == 16  # the rest's objects went again
    assert a.lapsed_claims(now=time.time() + 3600) == []
    faults.inserts_left = None
    again = a.put(pages, tensors)
    assert again.stored == keys[16:] and again.deduplicated == keys[:16] and not again.failed
    assert verify(a).ok == len(keys)


def test_a_claim_refused_mid_put_fails_the_rest_and_publishes_what_it_claimed(open_server, identity):
    """The first keys, one per write worker, are claimed alone (their uploads start at once); when
    the claim of the rest is refused those pages fail, uploaded nowhere, and the first ones are
    published."""
    faults = IndexFaults(claims_left=1)
    a = open_server("a", index_factory=faulty_index(faults))
    head = a.num_workers
    pages, tensors = _long_chain(identity, head + 8)
    keys = [p.key for p in pages]
    result = a.put(pages, tensors)
    assert result.stored == keys[:head] and list(result.failed) == keys[head:]
    assert all("index unavailable" in why for why in result.failed.values())
    assert len(_objects(open_server.s3, open_server.bucket_url)) == head
    assert a.lapsed_claims(now=time.time() + 3600) == []


def test_a_claim_leaves_stored_keys_out_and_a_row_found_at_commit_is_not_counted_published(open_server, chain):
    """The claim statement skips keys that have a row; a key whose row another writer committed
    while this one held a claim on it (the claim's snapshot did not show it) keeps that row, and
    is not counted as published by this writer."""
    pages, tensors = chain
    indexes: dict[str, ChunkIndex] = {}

    def recorded(name: str):
        def factory(url, **kwargs) -> ChunkIndex:
            indexes[name] = ChunkIndex(url, **kwargs)
            return indexes[name]
        return factory

    a, b = open_server("a", index_factory=recorded("a")), open_server("b", index_factory=recorded("b"))
    assert a.put(pages[:1], tensors[:1]).stored == [pages[0].key]
    assert indexes["b"].claim([pages[0].key, pages[1].key], b.writer_id, 60.0) == {pages[1].key}
    row = a.chunk_rows([pages[0].key])[pages[0].key]
    late = dataclasses.replace(row, key=pages[1].key, parent_key=pages[0].key, created_at=1.0)
    indexes["a"].insert([late])  # another writer's row for pages[1] lands while b holds its claim

    def published() -> int:
        return {c.server: c.published for c in indexes["b"].server_counts()}.get(indexes["b"].server_name, 0)

    before = published()
    assert indexes["b"].insert_claimed([dataclasses.replace(late, created_at=2.0)], b.writer_id) == {pages[1].key}
    assert a.chunk_rows([pages[1].key])[pages[1].key].created_at == 1.0  # the first row stays
    assert published() == before


def test_a_bucket_listing_row_that_does_not_parse_is_shown_as_none():
    """The listing is a figure kept as JSON in store_meta: a row another version or a person wrote
    badly shows no listing (the next sweep writes it again) instead of failing the stats."""
    listing = BucketListing(objects=3, orphans=1, listed_at=1.5, listed_by="host:1")
    assert listing_of(listing_text(listing)) == listing
    for bad in (None, "", "{", "[]", '{"objects": 3}', '{"objects": "x", "orphans": 0, "listed_at": 1, "listed_by": "h"}'):
        assert listing_of(bad) is None, bad
