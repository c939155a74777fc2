"""GET /chunks?tier=device|host over a live cache: the pages a memory tier holds, with their disk rows
where stored and without disk figures where not; filters, paging, namespace tokens, no disk tier."""

from __future__ import annotations

from tests.helpers.api import TENANT, client, live_server, settings, warm
from tests.cache.test_tiered import keys_of, toks
from tests.helpers import TINY

A = toks(1, 2, 3, 4, 5)  # what tests.api.conftest.warm served, in "default"
B = toks(7, 8, 9)  # and in "other"


def test_memory_tier_listing(cache_server, live_cache):
    only_memory = keys_of(B, "other")
    live_cache.store.delete(only_memory)  # now held in memory only
    live_cache.store.pin([keys_of(A)[0]])
    with cache_server.client() as c:
        page = c.get("/chunks", params={"tier": "host"}).json()
        assert page["total"] == 8 and len(page["items"]) == 8 and page["next_cursor"] is None
        by_key = {i["key"]: i for i in page["items"]}
        assert set(by_key) == {k.hex() for k in keys_of(A) + only_memory}
        mem = by_key[only_memory[1].hex()]
        assert mem["stored_bytes"] is None and mem["created_at"] is None and mem["tiers"] == ["device", "host"]
        assert mem["parent_key"] == only_memory[0].hex() and mem["raw_bytes"] == TINY.page_size_bytes
        assert mem["namespace"] == "other" and mem["num_tokens"] == TINY.page_size and not mem["pinned"]
        assert by_key[keys_of(A)[0].hex()]["tiers"] == ["device", "host", "disk"]
        assert page["items"][-1]["stored_bytes"] is None  # newest first: pages without disk figures last

        pinned = c.get("/chunks", params={"tier": "device", "pinned": True}).json()
        assert [i["key"] for i in pinned["items"]] == [keys_of(A)[0].hex()]
        sized = c.get("/chunks", params={"tier": "device", "min_size": 1}).json()
        assert sized["total"] == 5  # pages with no disk row have no stored size
        assert c.get("/chunks", params={"tier": "device", "namespace": "other"}).json()["total"] == 3

        seen, cursor = [], None
        while True:
            params = {"tier": "host", "limit": 3, "sort": "size", "order": "asc"}
            if cursor:
                params["cursor"] = cursor
            r = c.get("/chunks", params=params).json()
            seen += [i["key"] for i in r["items"]]
            cursor = r["next_cursor"]
            if cursor is None:
                break
        assert sorted(seen) == sorted(by_key) and len(seen) == 8
        assert c.get("/chunks").json()["total"] == 5  # the disk tier

    live_cache.admin.evict("device", 8)
    with cache_server.client() as c:
        assert c.get("/chunks", params={"tier": "device"}).json()["total"] == 0
    with cache_server.client(TENANT) as c:
        items = c.get("/chunks", params={"tier": "host"}).json()["items"]
        assert {i["namespace"] for i in items} == {"other"} and len(items) == 3
        assert c.get("/chunks", params={"tier": "host", "namespace": "default"}).status_code == 403


def test_memory_listing_without_a_disk_tier(tmp_path):
    from chunkstore.api import CacheBackend, create_app
    from chunkstore.cache.tiered import TieredCache
    from tests.cache.test_tiered import make_config

    with TieredCache.open(make_config(tmp_path, use_disk=False), TINY) as cache:
        warm(cache)
        with live_server(create_app(CacheBackend(cache), settings())) as url, client(url) as c:
            page = c.get("/chunks", params={"tier": "device"}).json()
            assert page["total"] == 8 and all(i["stored_bytes"] is None for i in page["items"])
            assert c.get("/chunks", params={"tier": "disk"}).status_code == 409


def test_memory_listing_offline_is_422(store_server):
    with store_server.client() as c:
        r = c.get("/chunks", params={"tier": "device"})
        assert r.status_code == 422 and "no memory tiers" in r.json()["error"]["message"]
