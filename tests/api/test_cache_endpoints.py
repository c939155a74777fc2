"""The API over a live TieredCache (CacheBackend, as `chunkstore serve` mounts it): memory tiers in
the stats, eviction and clearing reflected in the cache, flush, chunk tiers and decoded text,
live configuration, and ``api.mount`` inside another app."""

from __future__ import annotations

import re

from fastapi import FastAPI

from chunkstore.api import CacheBackend, create_app, mount
from chunkstore.cache.radix_policy import EvictionPolicy
from tests.helpers.api import client, live_server, settings, warm
from tests.cache.test_tiered import assert_consistent, keys_of, lookup, settle, toks
from tests.helpers import TINY

PAGE_BYTES = TINY.page_size_bytes


def test_stats_show_every_tier(cache_server):
    with cache_server.client() as c:
        s = c.get("/stats").json()
    assert s["backend"] == "cache"
    tiers = {t["name"]: t for t in s["tiers"]}
    assert set(tiers) == {"device", "host", "disk"}
    assert tiers["device"]["capacity_bytes"] == 8 * PAGE_BYTES and tiers["device"]["cached_bytes"] == 8 * PAGE_BYTES
    assert tiers["host"]["used_bytes"] == 8 * PAGE_BYTES and tiers["disk"]["num_chunks"] == 8
    assert s["hits"]["lookups"] == 2 and set(s["hits"]["hit_tokens"]) == {"device", "host", "disk"}
    assert s["paths"]["host_to_disk"]["num_pages"] == 8 and set(s["queue_depths"]) == set(s["paths"])
    assert s["disk"]["num_chunks"] == 8


def test_evict_memory_tiers_through_the_api(cache_server, live_cache):
    with cache_server.client() as c:
        dry = c.post("/evict", json={"tier": "device", "bytes_to_free": 3 * PAGE_BYTES, "dry_run": True}).json()
        assert dry["num_pages"] == 3 and live_cache.stats().device.cached_pages == 8
        done = c.post("/evict", json={"tier": "device", "bytes_to_free": 3 * PAGE_BYTES}).json()
        assert done["num_pages"] >= 3 and done["num_bytes"] == done["num_pages"] * PAGE_BYTES
        assert live_cache.stats().device.cached_pages == 8 - done["num_pages"]
        assert live_cache.stats().evicted_pages["device"] == done["num_pages"]
        r = c.post("/evict", json={"tier": "host", "fraction": 1.0}).json()
        assert r["num_pages"] == 8 and live_cache.stats().host.cached_pages == 0
        assert c.get("/stats").json()["evicted_pages"]["host"] == 8
    assert_consistent(live_cache)
    assert lookup(live_cache, toks(1, 2, 3, 4, 5)).num_pages == 5  # from the device and from disk


def test_disk_eviction_reaches_the_live_cache(cache_server, live_cache):
    a = toks(1, 2, 3, 4, 5)
    with cache_server.client() as c:
        r = c.post("/evict", json={"key": keys_of(a)[2].hex(), "descendants": True}).json()
        assert r["num_chunks"] == 3
        assert c.get(f"/chunks/{keys_of(a)[2].hex()}").status_code == 404
    assert live_cache.store.longest_prefix(keys_of(a)) == 2
    assert lookup(live_cache, a).num_pages == 5  # memory copies stay: evicting disk evicts disk only
    live_cache.admin.clear("device")
    live_cache.admin.clear("host")  # a host page leaves only once on disk: the three are written again
    assert live_cache.store.longest_prefix(keys_of(a)) == 5
    assert_consistent(live_cache)


def test_namespace_token_cannot_touch_memory_tiers(cache_server):
    with cache_server.client(token="tenant-secret-token") as c:
        r = c.post("/evict", json={"tier": "device", "bytes_to_free": 1})
        assert r.status_code == 403 and "shared" in r.json()["error"]["message"]
        items = c.get("/namespaces").json()["items"]
        assert [(n["namespace"], n["device_pages"], n["host_pages"]) for n in items] == [("other", 3, 3)]


def test_clear_all_and_flush(cache_server, live_cache):
    with cache_server.client() as c:
        r = c.post("/flush", json={"timeout_s": 30}).json()
        assert r == {"backend": "cache", "persisted_pages": 8, "failed_pages": 0}
        r = c.post("/clear", json={"tier": "all", "confirm": True}).json()
        assert r["removed"] == {"device": 8, "host": 8, "disk": 8}
        assert r["remaining"] == {"device": 0, "host": 0, "disk": 0}
    assert_consistent(live_cache)
    assert lookup(live_cache, toks(1, 2, 3)).num_pages == 0


def test_chunks_show_their_tiers_and_text(cache_server, live_cache):
    a = toks(1, 2, 3, 4, 5)
    assert live_cache.admin.evict("device", 1) == 5  # the least recently used node: the whole of `a`
    with cache_server.client() as c:
        on_device = c.get("/chunks", params={"tier": "device"}).json()
        assert on_device["total"] == 3 and {i["namespace"] for i in on_device["items"]} == {"other"}
        assert all(i["tiers"] == ["device", "host", "disk"] for i in on_device["items"])
        assert c.get("/chunks", params={"tier": "host", "namespace": "default"}).json()["total"] == 5
        detail = c.get(f"/chunks/{keys_of(a)[0].hex()}").json()
        assert detail["tiers"] == ["host", "disk"] and detail["text"] == " ".join(f"t{i}" for i in a[:4])
        assert detail["token_ids"] == a[:4]
        nss = {n["namespace"]: (n["device_pages"], n["host_pages"]) for n in c.get("/namespaces").json()["items"]}
        assert nss == {"default": (0, 5), "other": (3, 3)}


def test_live_config(cache_server, live_cache):
    with cache_server.client() as c:
        config = c.get("/config").json()
        assert config["cache"]["eviction_policy"] == "lru" and config["cache"]["page_size"] == TINY.page_size
        assert "eviction_policy" in config["live_settings"]
        r = c.patch("/config", json={"eviction_policy": "lfu", "disk_load_host_share": 0.5})
        assert r.status_code == 200 and r.json()["cache"]["eviction_policy"] == "lfu"
        assert live_cache.tree.policy is EvictionPolicy.LFU and live_cache.config.disk_load_host_share == 0.5
        r = c.patch("/config", json={"write_policy": "write_back"})
        assert r.status_code == 422 and "write_policy cannot change" in r.json()["error"]["message"]
        r = c.patch("/config", json={"eviction_policy": "random"})
        assert r.status_code == 422 and "eviction_policy" in r.json()["error"]["message"]
        r = c.patch("/config", json={"disk_size": 0.001})
        assert r.status_code == 200 and r.json()["store"]["capacity_bytes"] == 1_000_000


def test_rebuild_is_refused_on_a_live_cache(cache_server):
    with cache_server.client() as c:
        r = c.post("/jobs/rebuild")
        assert r.status_code == 409 and "offline" in r.json()["error"]["message"]
        job = c.post("/jobs/verify").json()
        assert job["state"] in ("running", "succeeded")


def test_metrics_of_a_live_cache(cache_server):
    with cache_server.client() as c:
        body = c.get("/metrics").text
    for line in ('chunkstore_hit_tokens_total{tier="device"}', 'chunkstore_transfer_bytes_total{path="host_to_disk"}',
                 'chunkstore_tier_used_bytes{tier="host"}', "chunkstore_lookups_total 2.0",
                 'chunkstore_queue_depth{path="disk_to_host"}'):
        assert line in body, line
    asked = re.search(r"^chunkstore_disk_lookup_seconds_count (\S+)$", body, re.MULTILINE)
    assert asked is not None and float(asked.group(1)) >= 1  # each lookup of the disk tier's index, timed


def test_history_of_a_live_cache(cache_server):
    from tests.helpers.api import wait_for

    with cache_server.client() as c:
        samples = wait_for(lambda: c.get("/stats/history").json()["samples"], what="a sample")
    assert samples[-1]["device_used_bytes"] == 8 * PAGE_BYTES and samples[-1]["lookups"] == 2
    assert samples[-1]["bytes_host_to_disk"] == 8 * PAGE_BYTES


def test_no_disk_tier(tmp_path):
    from chunkstore.cache.tiered import TieredCache
    from tests.cache.test_tiered import make_config

    with TieredCache.open(make_config(tmp_path, use_disk=False), TINY) as cache:
        warm(cache)
        app = create_app(CacheBackend(cache), settings())
        with live_server(app) as url, client(url) as c:
            s = c.get("/stats").json()
            assert [t["name"] for t in s["tiers"]] == ["device", "host"] and s["disk"] is None
            assert c.get("/chunks").status_code == 409
            assert [n["namespace"] for n in c.get("/namespaces").json()["items"]] == ["default", "other"]
            evicted = c.post("/evict", json={"tier": "device", "fraction": 0.5}).json()["num_pages"]
            assert evicted >= 4  # whole nodes: at least what was asked
            assert c.post("/clear", json={"tier": "all", "confirm": True}).json()["removed"] == \
                {"device": 8 - evicted, "host": 8}
            assert c.get("/stats/history").json() == {"interval_s": 0.1, "max_rows": 17280, "is_recording": False,
                                                       "server": "", "samples": []}


def test_mount_inside_a_server(tmp_path, live_cache):
    """As `chunkstore serve` will: its own routes, errors and Host handling stay its own, the admin
    API answers under /api/v1, and the admin lifespan (the history sampler) runs inside the parent's."""
    import httpx

    from tests.helpers.api import wait_for

    warm(live_cache)
    parent = FastAPI()

    @parent.get("/v1/models")
    def models():
        return {"data": []}

    admin = mount(parent, CacheBackend(live_cache), settings())
    with live_server(parent) as url:
        assert httpx.get(url + "/v1/models", headers={"Host": "cache.example"}).json() == {"data": []}
        missing = httpx.get(url + "/v2/nothing")
        assert missing.status_code == 404 and "error" not in missing.json()  # the parent's own 404
        with client(url) as c:
            assert c.get("/stats").json()["backend"] == "cache"
            assert c.get("/openapi.json").json()["info"]["title"] == "chunkstore admin"
            assert c.get("/nothing").json()["error"]["code"] == "not_found"
        with client(url, Host="cache.example") as c:
            assert c.get("/stats").status_code == 400  # the admin API's Host check
        assert "/api/v1/stats" not in httpx.get(url + "/openapi.json").json()["paths"]
        wait_for(lambda: admin.state.admin.sampler.num_samples > 0, what="the mounted app's sampler")
    assert not admin.state.admin.sampler.is_recording  # stopped with the parent
    settle(live_cache)
