"""Every endpoint through a real server over a store on disk (StoreBackend): happy paths, 404s,
422s with clear messages, eviction reflected on disk, dry runs that change nothing, jobs with
progress and results, and a history that survives a restart."""

from __future__ import annotations

import threading
import time

import pytest

from chunkstore.api import StoreBackend, create_app
from chunkstore import ChunkStore
from tests.helpers.api import live_server, settings, wait_for
from tests.helpers import TINY


def chunk_files(root) -> set[str]:
    return {p.stem for p in (root / "chunks").rglob("*.kv")}


def test_stats_namespaces_and_config(store_server):
    with store_server.client() as c:
        stats = c.get("/stats").json()
        assert stats["backend"] == "store" and stats["hits"] is None
        assert [t["name"] for t in stats["tiers"]] == ["disk"]
        assert stats["disk"]["num_chunks"] == 10 and stats["disk"]["hits"] == 2
        names = {n["namespace"]: n for n in c.get("/namespaces").json()["items"]}
        assert set(names) == {"default", "other"} and names["default"]["hit_rate"] == 1.0
        assert names["default"]["device_pages"] is None  # no memory tiers offline
        config = c.get("/config").json()
        assert config["identity"]["model_id"] == TINY.model_id and config["cache"] is None
        assert config["store"]["path"] == str(store_server.root) and config["live_settings"] == ["disk_size"]
        assert "token" not in str(config["admin"]).replace("token_source", "").replace("token_file", "") \
            .replace("namespace_tokens", "").replace("reads_need_token", "")
        assert config["admin"]["namespace_tokens"] == ["other"]


def test_health_and_ready(store_server):
    with store_server.client(token=None) as c:
        assert c.get("/healthz").json()["status"] == "ok"
        assert c.get("/readyz").status_code == 200


def test_chunk_listing_filters_sorts_and_pages(store_server):
    pages = store_server.pages
    with store_server.client() as c:
        page = c.get("/chunks", params={"namespace": "default", "limit": 3, "sort": "created", "order": "asc"}).json()
        assert page["total"] == 8 and len(page["items"]) == 3 and page["next_cursor"]
        seen = [i["key"] for i in page["items"]]
        while page["next_cursor"]:
            page = c.get("/chunks", params={"namespace": "default", "limit": 3, "sort": "created", "order": "asc",
                                            "cursor": page["next_cursor"]}).json()
            seen += [i["key"] for i in page["items"]]
        assert sorted(seen) == sorted(p.key.hex() for p in pages) and len(set(seen)) == 8
        hot = c.get("/chunks", params={"sort": "hits", "limit": 2}).json()["items"]
        assert {i["key"] for i in hot} == {p.key.hex() for p in pages[:2]} and hot[0]["hit_count"] == 1
        assert c.get("/chunks", params={"pinned": True}).json()["total"] == 0
        sizes = [i["stored_bytes"] for i in c.get("/chunks", params={"sort": "size", "order": "asc"}).json()["items"]]
        assert sizes == sorted(sizes)
        small = c.get("/chunks", params={"max_size": sizes[0]}).json()["items"]
        assert all(i["stored_bytes"] <= sizes[0] for i in small) and small
        assert c.get("/chunks", params={"accessed_after": time.time() + 3600}).json()["total"] == 0
        assert c.get("/chunks", params={"accessed_before": time.time() + 3600}).json()["total"] == 10
        assert c.get("/chunks", params={"tier": "disk"}).json()["total"] == 10


def test_chunk_listing_rejects_bad_input_clearly(store_server):
    with store_server.client() as c:
        r = c.get("/chunks", params={"limit": 0})
        assert r.status_code == 422 and "limit" in r.json()["error"]["message"]
        r = c.get("/chunks", params={"sort": "colour"})
        assert r.status_code == 422 and "sort" in r.json()["error"]["message"]
        r = c.get("/chunks", params={"cursor": "not-a-cursor"})
        assert r.status_code == 422 and r.json()["error"]["param"] == "cursor"
        r = c.get("/chunks", params={"tier": "device"})
        assert r.status_code == 422 and "no memory tiers" in r.json()["error"]["message"]
        r = c.get("/chunks", params={"bogus": 1})
        assert r.status_code == 422 and "bogus" in r.json()["error"]["message"]


def test_chunk_detail_reads_the_file(store_server):
    p = store_server.pages[3]
    with store_server.client() as c:
        d = c.get(f"/chunks/{p.key.hex()}").json()
        assert d["token_ids"] == list(p.token_ids) and d["text"] is None  # no tokenizer offline
        assert d["file"]["status"] == "ok" and d["file"]["dtype"] == "bfloat16"
        assert d["file"]["shape"] == list(TINY.page_shape) and d["num_children"] == 1 and d["is_parent_stored"]
        assert d["tiers"] == ["disk"]
        assert c.get(f"/chunks/{'0' * 64}").status_code == 404
        r = c.get("/chunks/xyz")
        assert r.status_code == 422 and "key" in r.json()["error"]["message"]


def test_pin_and_unpin(store_server):
    key = store_server.pages[7].key.hex()
    with store_server.client() as c:
        assert c.post(f"/chunks/{key}/pin").json()["pinned"] is True
        assert c.get("/chunks", params={"pinned": True}).json()["total"] == 1
        r = c.post("/evict", json={"key": key})
        assert r.status_code == 200 and r.json()["num_chunks"] == 0 and r.json()["skipped_pinned"] == 1
        assert c.post(f"/chunks/{key}/unpin").json()["pinned"] is False
        assert c.post(f"/chunks/{'1' * 64}/pin").status_code == 404


def test_quota(store_server):
    with store_server.client() as c:
        r = c.put("/namespaces/default/quota", json={"quota_bytes": 5000})
        assert r.status_code == 200 and r.json()["quota_bytes"] == 5000
        r = c.put("/namespaces/default/quota", json={"quota_bytes": -1})
        assert r.status_code == 422 and "quota_bytes" in r.json()["error"]["message"]
        assert c.put("/namespaces/default/quota", json={"quota_bytes": None}).json()["quota_bytes"] is None
    with ChunkStore(store_server.root, TINY, read_only=True) as s:
        assert s.quota("default") is None


def test_a_namespace_is_one_path_segment(store_server):
    """A namespace holds no '/' (the one rule every layer keeps), so a path of more segments, '/'
    escaped or not, names no namespace; a segment that breaks the rule is refused by name; nothing
    is set by either."""
    with store_server.client() as c:
        for path in ("/namespaces/team%2Fa/quota", "/namespaces/team/b/quota"):
            assert c.put(path, json={"quota_bytes": 7000}).json()["error"]["code"] == "not_found"
        r = c.put("/namespaces/team%01a/quota", json={"quota_bytes": 7000})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
        assert c.put("/namespaces/team-a/quota", json={"quota_bytes": 7000}).json()["namespace"] == "team-a"
    with ChunkStore(store_server.root, TINY, read_only=True) as s:
        assert s.quota("team-a") == 7000
        assert (s.quota("team"), s.quota("b")) == (None, None)


def test_dry_run_changes_nothing_and_eviction_reaches_the_disk(store_server):
    root = store_server.root
    before = chunk_files(root)
    with store_server.client() as c:
        dry = c.post("/evict", json={"bytes_to_free": 2000, "dry_run": True}).json()
        assert dry["dry_run"] and dry["num_chunks"] >= 2 and dry["num_bytes"] >= 2000
        assert chunk_files(root) == before
        assert c.get("/stats").json()["disk"]["num_chunks"] == 10
        done = c.post("/evict", json={"bytes_to_free": 2000}).json()
        assert done["keys"] == dry["keys"]  # the dry run said exactly what went
    assert chunk_files(root) == before - set(done["keys"])
    # least recently used and leaf-first: the unread tail of the default chain goes first
    tail = {p.key.hex() for p in store_server.pages[2:]} | {p.key.hex() for p in store_server.other}
    assert set(done["keys"]) <= tail


def test_evict_by_namespace_key_age_and_fraction(store_server):
    pages = store_server.pages
    with store_server.client() as c:
        r = c.post("/evict", json={"key": pages[5].key.hex()})
        assert r.status_code == 409 and "descendants" in r.json()["error"]["message"]
        r = c.post("/evict", json={"key": pages[5].key.hex(), "descendants": True}).json()
        assert set(r["keys"]) == {p.key.hex() for p in pages[5:]}
        assert r["keys"][0] == pages[7].key.hex()  # deepest first
        r = c.post("/evict", json={"namespace": "other"}).json()
        assert r["num_chunks"] == 2
        assert c.post("/evict", json={"older_than_s": 3600}).json()["num_chunks"] == 0
        r = c.post("/evict", json={"fraction": 0.5, "dry_run": True}).json()
        assert 0 < r["num_chunks"] < 5
        assert c.post("/evict", json={"older_than_s": 0}).json()["num_chunks"] == 5
        assert c.post("/evict", json={"key": "0" * 64}).status_code == 404
    assert chunk_files(store_server.root) == set()


@pytest.mark.parametrize("body,needle", [
    ({}, "say what to evict"),
    ({"bytes_to_free": 1, "fraction": 0.5}, "not both"),
    ({"tier": "device", "bytes_to_free": 1}, "no memory tiers"),
    ({"tier": "host", "namespace": "x", "bytes_to_free": 1}, "no memory tiers"),
    ({"tier": "host", "key": "ab" * 32, "older_than_s": 5}, "key selects"),
    ({"tier": "moon", "bytes_to_free": 1}, "tier"),
    ({"descendants": True}, "descendants needs a key"),
    ({"key": "ab"}, "key"),
    ({"bytes_to_free": 0}, "bytes_to_free"),
    ({"fraction": 1.5}, "fraction"),
    ({"bytes_to_free": 1, "colour": "red"}, "colour"),
])
def test_evict_rejects_bad_input_clearly(store_server, body, needle):
    with store_server.client() as c:
        r = c.post("/evict", json=body)
    assert r.status_code == 422, r.text
    assert needle in r.json()["error"]["message"]


def test_clear_needs_confirmation(store_server):
    with store_server.client() as c:
        r = c.post("/clear", json={"tier": "disk"})
        assert r.status_code == 422 and "confirm" in r.json()["error"]["message"]
        r = c.post("/clear", json={"tier": "all", "confirm": True}).json()
        assert r == {"removed": {"disk": 10}, "remaining": {"disk": 0}}
        r = c.post("/clear", json={"tier": "host", "confirm": True})
        assert r.status_code == 422
    assert chunk_files(store_server.root) == set()


def test_flush(store_server):
    with store_server.client() as c:
        assert c.post("/flush").json() == {"backend": "store", "persisted_pages": 0, "failed_pages": 0}
        assert c.post("/flush", json={"timeout_s": -1}).status_code == 422


def job_done(c, job_id: str) -> dict:
    return wait_for(lambda: (j := c.get(f"/jobs/{job_id}").json())["state"] != "running" and j, what=job_id)


def test_jobs_report_progress_and_results(store_server):
    root = store_server.root
    victim = store_server.pages[4].key.hex()
    path = root / "chunks" / victim[:2] / victim[2:4] / f"{victim}.kv"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))
    (root / "tmp" / "tmp-deadbeef-1-2").write_bytes(b"partial")
    with store_server.client() as c:
        job = c.post("/jobs/verify").json()
        assert job["kind"] == "verify" and job["state"] == "running"
        job = job_done(c, job["id"])
        assert job["state"] == "succeeded" and job["progress"]["done"] == job["progress"]["total"] == 10
        assert job["progress"]["fraction"] == 1.0
        assert job["result"]["corrupt"] == 1 and job["result"]["quarantined"] == 0
        job = job_done(c, c.post("/jobs/verify", json={"repair": True}).json()["id"])
        assert job["result"]["quarantined"] == 1 and job["result"]["temps_removed"] == 1
        job = job_done(c, c.post("/jobs/gc", json={"purge_quarantine": True, "disk_size_bytes": 3000}).json()["id"])
        assert job["result"]["quarantine_purged"] == 1 and job["result"]["evicted_chunks"] > 0
        assert c.get("/stats").json()["disk"]["stored_bytes"] <= 3000
        job = job_done(c, c.post("/jobs/rebuild").json()["id"])
        assert job["state"] == "succeeded" and job["result"]["indexed"] == job["progress"]["done"] > 0
        assert [j["kind"] for j in c.get("/jobs").json()["items"]] == ["verify", "verify", "gc", "rebuild"]
        assert c.get("/jobs/nope-1-1").status_code == 404
        assert c.post("/jobs/verify", json={"repair": "yes please"}).status_code == 422


def test_one_job_of_a_kind_at_a_time(store_server):
    gate, running = threading.Event(), threading.Semaphore(0)

    def hold(_) -> None:
        running.release()
        gate.wait(20)

    with store_server.backend.using_store() as store:  # occupy the threads verify reads with
        blocker = threading.Thread(target=store.map_workers, args=(hold, range(store.num_workers)), daemon=True)
        blocker.start()
        for _ in range(store.num_workers):
            assert running.acquire(timeout=10)
    try:
        with store_server.client() as c:
            first = c.post("/jobs/verify")
            assert first.status_code == 202
            second = c.post("/jobs/verify")
            assert second.status_code == 409 and "already running" in second.json()["error"]["message"]
            assert c.post("/jobs/rebuild").status_code == 409  # a rebuild runs alone
            assert c.post("/jobs/gc").status_code == 202  # another kind may run beside it
            gate.set()
            assert job_done(c, first.json()["id"])["state"] == "succeeded"
            assert c.post("/jobs/verify").status_code == 202
    finally:
        gate.set()
        blocker.join(30)


def test_history_survives_a_restart(tmp_path):
    from tests.helpers.api import fill_store

    root = tmp_path / "store"
    fill_store(root)
    first: list[dict] = []
    for run in range(2):
        backend = StoreBackend(root)
        try:
            with live_server(create_app(backend, settings())) as url:
                from tests.helpers.api import client

                with client(url) as c:
                    samples = wait_for(lambda: len(s := c.get("/stats/history").json()["samples"]) >= 3 and s,
                                       what="three history samples")
                    assert c.get("/stats/history").json()["is_recording"]
                    if run == 0:
                        first = samples
                    else:
                        kept = {s["sampled_at"] for s in samples}
                        assert {s["sampled_at"] for s in first} <= kept
                        assert samples[0]["disk_chunks"] == 10 and samples[0]["device_used_bytes"] is None
                        last_two = c.get("/stats/history", params={"limit": 2}).json()["samples"]
                        assert len(last_two) == 2 and last_two[0]["sampled_at"] < last_two[1]["sampled_at"]
                        newest = c.get("/stats/history", params={"since": first[-1]["sampled_at"]}).json()["samples"]
                        assert newest[0]["sampled_at"] == first[-1]["sampled_at"]
        finally:
            backend.close()


def test_history_is_bounded(tmp_path):
    from tests.helpers.api import fill_store

    root = tmp_path / "store"
    fill_store(root)
    backend = StoreBackend(root)
    try:
        app = create_app(backend, settings(history_max_rows=3, history_interval_s=3600))
        sampler = app.state.admin.sampler
        for _ in range(7):
            assert sampler.sample_now()
        with backend.using_store() as store:
            assert len(app.state.admin.history.read(store)) == 3
    finally:
        backend.close()


def test_metrics_and_events(store_server):
    with store_server.client() as c:
        c.get("/stats")
        text = c.get("/metrics")
        assert text.headers["content-type"].startswith("text/plain")
        body = text.text
        for name in ("chunkstore_disk_stored_bytes", "chunkstore_disk_hits_total", "chunkstore_uptime_seconds",
                     "chunkstore_admin_request_duration_seconds_bucket"):
            assert name in body
        assert all(line.startswith(("#", "chunkstore_")) for line in body.splitlines() if line)
        job = c.post("/jobs/verify").json()
        with c.stream("GET", "/events", params={"interval_s": 0.05, "max_events": 4}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            text = "".join(r.iter_text())
        events = [block.split("\n")[0] for block in text.strip().split("\n\n")]
        assert events.count("event: stats") == 4 and events[-1] == "event: end"
        assert "event: job" in events and job["id"] in text and '"reason": "max_events"' in text


def test_events_end_at_their_time_limit(tmp_path):
    from tests.helpers.api import client, fill_store

    root = tmp_path / "store"
    fill_store(root)
    backend = StoreBackend(root)
    try:
        with live_server(create_app(backend, settings(events_max_s=0.3))) as url, client(url) as c:
            start = time.monotonic()
            text = c.get("/events", params={"interval_s": 0.05, "max_events": 100000}).text
            assert time.monotonic() - start < 5
            assert '"reason": "max_duration"' in text
            start = time.monotonic()  # a long interval does not outlive the stream either
            text = c.get("/events", params={"interval_s": 3600, "max_events": 5}).text
            assert time.monotonic() - start < 5 and text.count("event: stats") == 1
            assert '"reason": "max_duration"' in text
    finally:
        backend.close()


def test_config_patch_offline(store_server):
    with store_server.client() as c:
        r = c.patch("/config", json={"disk_size": 0.000003})
        assert r.status_code == 200 and r.json()["store"]["capacity_bytes"] == 3000
        r = c.patch("/config", json={"eviction_policy": "lfu"})
        assert r.status_code == 422 and "offline" in r.json()["error"]["message"]
        r = c.patch("/config", json={"page_size": 8})
        assert r.status_code == 422 and "cannot change" in r.json()["error"]["message"]
        r = c.patch("/config", json={"disk_size": -1})
        assert r.status_code == 422 and "disk_size" in r.json()["error"]["message"]


def test_read_only_store(tmp_path):
    from tests.helpers.api import client, fill_store

    root = tmp_path / "store"
    fill_store(root)
    with ChunkStore(root, TINY):  # another process would hold the writer lock like this
        backend = StoreBackend(root, read_only=True)
        try:
            with live_server(create_app(backend, settings())) as url, client(url) as c:
                assert c.get("/stats").json()["disk"]["read_only"] is True
                assert c.get("/chunks").json()["total"] == 10
                assert c.post("/evict", json={"bytes_to_free": 1, "dry_run": True}).status_code == 200
                r = c.post("/evict", json={"bytes_to_free": 1})
                assert r.status_code == 409 and "read-only" in r.json()["error"]["message"]
                assert c.post("/jobs/rebuild").status_code == 409
                assert c.get("/stats/history").json()["is_recording"] is False
        finally:
            backend.close()
