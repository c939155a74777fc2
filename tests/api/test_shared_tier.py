"""The management API over a shared tier (an index on a real PostgreSQL server, payloads in a bucket
on moto's S3 server): GET /stats shows the tier and every server's counts (each server a store
whose index counts under its own name), and the verify, gc and rebuild jobs run against the tier:
verify finds (and repairs) a damaged object, gc sweeps a dead writer's lapsed claim and its
object, rebuild indexes the bucket again."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator

import pytest

from chunkstore import PageRef
from chunkstore.api import StoreBackend, create_app
from chunkstore.disk.index import display_url
from chunkstore.disk.results import SERVER_STALE_S
from tests.api.shared_tier import Tier, add_gone_server, add_lapsed_claim, fill_tier, pages_of
from tests.helpers.api import TENANT, client, live_server, settings, wait_for


@pytest.fixture
def tier(tmp_path, moto_s3, bucket_url, postgres_url) -> Tier:
    return Tier(postgres_url, bucket_url, moto_s3, tmp_path)


@pytest.fixture
def served(tier) -> Iterator[tuple[Tier, StoreBackend, str, list[PageRef], list[PageRef]]]:
    pages, other = fill_tier(tier)
    backend = tier.backend()
    app = create_app(backend, settings())
    try:
        with live_server(app) as url:
            yield tier, backend, url, pages, other
    finally:
        backend.close()


def job_done(c, job_id: str) -> dict:
    job = wait_for(lambda: (j := c.get(f"/jobs/{job_id}").json())["state"] != "running" and j, what=job_id)
    assert job["state"] == "succeeded", job
    return job


def test_stats_show_the_shared_tier_and_every_servers_counts(served):
    tier, backend, url, pages, other = served
    with client(url) as c:
        st = c.get("/stats").json()
    disk = st["disk"]
    assert disk["num_chunks"] == len(pages) + len(other)  # the whole tier's rows
    shared = disk["shared_tier"]
    assert shared["payload_store"] == tier.bucket_url and shared["index"] == display_url(tier.index_url)
    assert shared["claims"] == shared["lapsed_claims"] == 0 and not shared["read_health"]["degraded"]
    assert shared["stale_after_s"] == SERVER_STALE_S
    servers = {s["server"]: s for s in shared["servers"]}
    me = shared["servers"][0]  # this server first
    assert me["is_self"] and me["server"] == shared["server_name"] and not me["is_stale"]
    assert shared["writer_id"].startswith(shared["server_name"].rsplit(":", 1)[0])  # host, as host:pid
    a, b = servers["server-a"], servers["server-b"]
    assert (a["published"], a["hits"], a["misses"], a["dedup_hits"]) == (6, 6, 0, 0)
    assert (b["published"], b["hits"], b["misses"], b["dedup_hits"]) == (2, 3, 2, 1)
    assert a["hit_rate"] == 1.0 and b["hit_rate"] == pytest.approx(0.6)
    for s in (a, b):  # written when each closed: seen, not stale
        assert not s["is_self"] and not s["is_stale"] and s["first_seen_at"] <= s["last_seen_at"] <= time.time()
    # The tier-wide counters are the servers' sums (the admin server has read nothing yet).
    assert disk["hits"] == a["hits"] + b["hits"] and disk["misses"] == a["misses"] + b["misses"]
    assert me["hit_rate"] is None and me["published"] == 0
    assert shared["evictor_lock"] == {"acquired": 0, "waited_s": 0.0, "held_s": 0.0}  # it has evicted nothing
    assert shared["room_lock"] == {"acquired": 0, "waited_s": 0.0, "held_s": 0.0}  # nor committed within a capacity


def test_an_eviction_through_the_evictor_lock_shows_in_stats_and_metrics(served):
    """What an operator watches on a bounded tier: each server's time holding the fleet's one
    evictor lock, in /stats and as counters in /metrics (their rate over the fleet: its use)."""
    tier, backend, url, pages, other = served
    with client(url) as c:
        assert c.post("/evict", json={"bytes_to_free": 1}).json()["num_chunks"] >= 1
        lock = c.get("/stats").json()["disk"]["shared_tier"]["evictor_lock"]
        metrics = c.get("/metrics").text
    assert lock["acquired"] >= 1 and lock["held_s"] > 0 and lock["waited_s"] >= 0
    held = [line for line in metrics.splitlines() if line.startswith("chunkstore_evictor_lock_held_seconds_total ")]
    assert len(held) == 1 and float(held[0].split()[1]) == pytest.approx(lock["held_s"])
    assert f"chunkstore_evictor_lock_acquired_total {float(lock['acquired'])}" in metrics
    assert "chunkstore_room_lock_acquired_total 0.0" in metrics  # (no put within a capacity: the other lock)


def test_this_servers_reads_count_at_once_and_a_server_gone_quiet_is_stale(served):
    tier, backend, url, pages, _ = served
    with backend.using_store() as store:
        assert all(t is not None for t in store.get(pages[:2]))  # counted, not yet written: shown
    add_gone_server(tier)  # a server that stopped writing its counts an hour ago
    with client(url) as c:
        servers = c.get("/stats").json()["disk"]["shared_tier"]["servers"]
    me = servers[0]
    assert me["is_self"] and (me["hits"], me["misses"]) == (2, 0) and me["hit_rate"] == 1.0
    gone_row = next(s for s in servers if s["server"] == "gone:1")
    assert gone_row["is_stale"] and gone_row["hit_rate"] == 0.5
    assert [s["server"] for s in servers[1:]][-1] == "gone:1"  # the most recently seen first
    with client(url) as c:  # a flush writes this server's row (and moves its last_seen_at)
        assert c.post("/flush").status_code == 200
        me = c.get("/stats").json()["disk"]["shared_tier"]["servers"][0]
    assert me["first_seen_at"] is not None and me["hits"] == 2


def test_a_namespace_token_sees_no_shared_tier_figures(served):
    _, _, url, _, other = served
    with client(url, token=TENANT) as c:
        st = c.get("/stats").json()
    assert st["namespace"] == "other" and st["disk"]["num_chunks"] == len(other)
    assert st["disk"]["shared_tier"] is None


def test_verify_finds_a_damaged_object_and_repair_quarantines_it_in_the_bucket(served):
    tier, backend, url, pages, other = served
    with backend.using_store() as store:
        tier.damage(store, pages[4].key)
    with client(url) as c:
        job = job_done(c, c.post("/jobs/verify").json()["id"])
        total = len(pages) + len(other)
        assert job["progress"]["done"] == job["progress"]["total"] == total
        r = job["result"]
        assert (r["checked"], r["ok"], r["corrupt"], r["missing"], r["orphans"]) == (total, total - 1, 1, 0, 0)
        assert r["quarantined"] == 0 and len(tier.objects("quarantine/")) == 0  # a verify changes nothing
        job = job_done(c, c.post("/jobs/verify", json={"repair": True}).json()["id"])
        assert job["result"]["corrupt"] == 1 and job["result"]["quarantined"] == 1
        quarantined = tier.objects("quarantine/")
        assert len(quarantined) == 1 and pages[4].key.hex() in quarantined[0]
        assert c.get(f"/chunks/{pages[4].key.hex()}").status_code == 404  # its row went
        assert c.get("/stats").json()["disk"]["quarantined"] == 1
        job = job_done(c, c.post("/jobs/verify").json()["id"])  # clean now
        assert job["result"]["corrupt"] == 0 and job["result"]["ok"] == total - 1


def test_gc_sweeps_a_dead_writers_lapsed_claim_and_its_object(served):
    tier, backend, url, pages, other = served
    add_lapsed_claim(tier, pages_of(1, offset=90)[0].key)  # a writer that uploaded, then died before its row
    assert len(tier.objects()) == len(pages) + len(other) + 1
    with client(url) as c:
        shared = c.get("/stats").json()["disk"]["shared_tier"]
        assert (shared["claims"], shared["lapsed_claims"]) == (1, 1)
        assert shared["bucket"] is None  # objects are counted only by a sweep's listing
        began = time.time()
        job = job_done(c, c.post("/jobs/gc").json()["id"])
        r = job["result"]
        assert (r["lapsed_claims"], r["swept_objects"], r["evicted_chunks"]) == (1, 1, 0)
        shared = c.get("/stats").json()["disk"]["shared_tier"]
        assert (shared["claims"], shared["lapsed_claims"]) == (0, 0)
        assert len(tier.objects()) == len(pages) + len(other)  # the rows' objects all stay
        bucket = shared["bucket"]  # the listing as the sweep left the bucket: one object per row
        assert (bucket["objects"], bucket["orphans"]) == (len(pages) + len(other), 0)
        assert began <= bucket["listed_at"] <= time.time() and bucket["listed_by"] == shared["server_name"]
        # Evicting down to a size through gc deletes rows, then objects, across the whole tier.
        stored = c.get("/stats").json()["disk"]["stored_bytes"]
        job = job_done(c, c.post("/jobs/gc", json={"disk_size_bytes": stored // 2}).json()["id"])
        evicted = job["result"]["evicted_chunks"]
        assert evicted > 0 and c.get("/stats").json()["disk"]["stored_bytes"] <= stored // 2
        assert len(tier.objects()) == len(pages) + len(other) - evicted
        assert c.get("/stats").json()["disk"]["shared_tier"]["claims"] == 0  # the evictor released its claims


def test_rebuild_indexes_the_bucket_again(served):
    tier, backend, url, pages, other = served
    with backend.using_store() as store:
        tier.damage(store, other[1].key)
    with client(url) as c:
        assert c.post("/flush").status_code == 200
        wait_for(lambda: c.get("/stats/history").json()["samples"], what="a history sample")
        sampled = len(c.get("/stats/history").json()["samples"])
        job = job_done(c, c.post("/jobs/rebuild").json()["id"])
        r = job["result"]
        total = len(pages) + len(other)
        assert (r["scanned"], r["indexed"], r["quarantined"]) == (total, total - 1, 1)
        st = c.get("/stats").json()
        assert st["disk"]["num_chunks"] == total - 1 and st["disk"]["shared_tier"]["payload_store"] == tier.bucket_url
        listed = c.get("/chunks", params={"limit": 100}).json()
        assert listed["total"] == total - 1 and other[1].key.hex() not in {i["key"] for i in listed["items"]}
        assert len(c.get("/stats/history").json()["samples"]) >= sampled  # carried over the rebuild
        assert len(tier.objects("quarantine/")) == 1
        # Counters start afresh with the index; the rebuild's rows count as this server's.
        servers = c.get("/stats").json()["disk"]["shared_tier"]["servers"]
        assert servers[0]["is_self"] and servers[0]["published"] == total - 1
        assert {s["server"] for s in servers} == {servers[0]["server"]}
    with tier.store("server-c") as store:  # another server reads what the rebuild indexed
        assert all(t is not None for t in store.get(pages))


def test_admin_cli_flags_name_the_shared_tier(tmp_path, postgres_url):
    from chunkstore.api import cli

    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    args = p.parse_args(["--disk-path", str(tmp_path / "nothing"), "--index-url", postgres_url,
                         "--object-store", "s3://bucket/prefix"])
    assert (args.index_url, args.object_store) == (postgres_url, "s3://bucket/prefix")
    assert cli.run(args) == 2  # no store there: a clear error, not a traceback
