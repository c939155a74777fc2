"""Crash safety on a shared tier (the index in PostgreSQL, the payloads in a bucket on moto's S3
server): writer processes SIGKILLed at random points and at chosen ones, then checked from another
server's store (tests/test_crash.py's ideas, the tier's way).

A kill may lose the step in flight and leave objects without a row and claims behind; it must never
leave a row without its object, a corrupt object, or a page that loads with other bytes than were
written; the dead writer's claims lapse, and the sweeper (or the next writer of those keys) deals
with what it left. The writers are forked by tests/helpers/shared_soak.py's fork server.
"""

from __future__ import annotations

import dataclasses
import signal
import time

import pytest

from chunkstore.disk.index import ChunkIndex
from chunkstore.disk.maintenance import verify
from chunkstore.disk.page_io import encode_page, page_tensor_bytes
from chunkstore.testing import crash_soak as soak
from tests.helpers.shared import Bucket, wait_for
from tests.helpers.shared_soak import ForkServer, Tier, run_shared_cycles, soak_writer

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


@pytest.fixture(scope="module")
def fork_server(tmp_path_factory):
    server = ForkServer(tmp_path_factory.mktemp("shared-soak-io"))
    yield server
    server.close()


@pytest.fixture
def bucket(moto_s3, bucket_url) -> Bucket:
    return Bucket(moto_s3, bucket_url)


@pytest.fixture
def tier(postgres_url, bucket_url, moto_s3) -> Tier:
    return Tier.of(postgres_url, bucket_url, moto_s3)


def _seed(tmp_path, tier: Tier, steps: int) -> None:
    """A known-good soak tier: the soak's writer in this process, not killed."""
    assert soak_writer(str(tmp_path / "seeder"), dataclasses.asdict(tier), seed=3, max_steps=steps,
                       say=lambda line: None) == 0


def test_sigkill_cycles_on_a_shared_tier(tmp_path, fork_server, tier):
    """test_crash.py::test_sigkill_cycles_fork_server on the tier: ten soak writers killed at random
    points, each followed by the soak's checks and the tier's (claims lapse, the sweep leaves one
    object per row)."""
    _seed(tmp_path, tier, steps=30)
    r = run_shared_cycles(fork_server, tier, tmp_path, 10, rng_seed=20240601)
    assert r.failures == []
    assert r.cycles == 10
    assert r.checks.keys_checked == 10 * len(soak.all_pages())
    assert r.checks.rows_without_file == 0  # object first, row second: a kill cannot leave a dangling row
    assert r.checks.hits > 0 and r.checks.misses > 0


@pytest.mark.parametrize("then", ["sweep", "take-over"])
def test_a_writer_killed_after_its_uploads_leaves_nothing_visible(tmp_path, fork_server, tier, bucket, then):
    """test_crash.py::test_killed_writer_leaves_temps_that_open_removes on the tier: a writer killed
    with every object uploaded and no row committed leaves objects no reader sees and verify finds
    nothing wrong with the rows; once its claims lapse, the sweeper deletes the objects ("sweep") or
    the next writer of the keys takes them over and publishes ("take-over"), after which the tier
    verifies clean."""
    pages = soak.chain_for("default", (0, 1, 2))
    child = fork_server.start("stall", folder=str(tmp_path / "dying"), tier=dataclasses.asdict(tier),
                              digits=[0, 1, 2], claim_ttl_s=0.5)
    try:
        wait_for(lambda: len(bucket.keys()) == 3, what="the dying writer's uploads")
    finally:
        assert fork_server.kill(child) == -signal.SIGKILL, child.errors()
    with tier.open(tmp_path / "reader") as store:
        keys = [p.key for p in pages]
        assert store.exists(keys) == [False] * 3 and store.get(pages) == [None] * 3
        assert bucket.keys() == set(keys)  # the objects stay where they are...
        report = verify(store)  # ...whatever verify makes of them (claimed keys), no row is damaged
        assert (report.checked, report.corrupt, report.missing) == (0, 0, 0)
        wait_for(lambda: len(store.lapsed_claims()) == 3, what="the dead writer's claims to lapse")
        if then == "sweep":
            swept = store.sweep(grace_s=3600)  # lapsed claims: no grace needed
            assert (swept.lapsed_claims, swept.objects_deleted) == (3, 3)
            assert bucket.keys() == set()
        result = store.put(pages, [soak.expected_page(p.key) for p in pages])
        assert result.stored == keys  # the store works: the same pages are written and read back
        assert all(soak.same_bytes(t, soak.expected_page(p.key)) for p, t in zip(pages, store.get(pages)))
        assert bucket.keys() == set(keys) and store.lapsed_claims(now=time.time() + 3600) == []
        report = verify(store)
        assert (report.ok, report.damage) == (3, 0)


def test_kill_during_the_first_migration_on_postgresql(tmp_path, fork_server, tier):
    """test_crash.py::test_kill_during_first_migration on PostgreSQL: a writer SIGKILLed while its
    first open creates the index's tables leaves a database the next open migrates and uses."""
    child = fork_server.start("die_in_first_migration", folder=str(tmp_path / "first"),
                              tier=dataclasses.asdict(tier))
    assert fork_server.wait(child) == -signal.SIGKILL, child.errors()
    with tier.open(tmp_path / "next") as store:
        pages = soak.chain_for("default", (1,))
        assert store.put(pages, [soak.expected_page(pages[0].key)]).ok
        assert soak.same_bytes(store.get(pages)[0], soak.expected_page(pages[0].key))


def test_the_checker_catches_wrong_bytes_on_a_shared_tier(tmp_path, tier, bucket):
    """test_crash.py::test_checker_catches_wrong_bytes: the soak's checks can fail on the tier; a
    well-formed object holding other KV under a page's key is reported."""
    _seed(tmp_path, tier, steps=40)
    with tier.open(tmp_path / "checker") as store:
        assert soak.check_store(store) == []
        victim = next(p for p in soak.all_pages() if store.exists([p.key])[0])
        other_kv = page_tensor_bytes(soak.expected_page(victim.key) + 1)
        segments, _ = encode_page(victim, other_kv, store.identity, store.codec, store.zstd_level)
        bucket.write(victim.key, b"".join(bytes(s) for s in segments))
        problems = soak.check_store(store)
        assert any("WRONG BYTES" in p and victim.key.hex() in p for p in problems)


def test_the_checker_catches_lost_pages_on_a_shared_tier(tmp_path, tier, bucket):
    """test_crash.py::test_checker_catches_lost_pages: a page that had to survive and is gone (its
    row, then its object) is reported."""
    _seed(tmp_path, tier, steps=40)
    with tier.open(tmp_path / "checker") as store:
        victim = next(p for p in soak.all_pages() if store.exists([p.key])[0])
        index = ChunkIndex(tier.index_url)  # the row goes (as a lost write would leave it), then the object
        try:
            index.delete([victim.key])
        finally:
            index.close()
        bucket.delete(victim.key)
        problems = soak.check_store(store, must_survive={victim.key})
        assert any("gone" in p for p in problems)
