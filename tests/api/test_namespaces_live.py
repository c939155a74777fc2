"""GET /namespaces over a live cache: per-namespace token hit rates from the cache's lookup counters;
offline they are null."""

from __future__ import annotations

from tests.helpers.api import TENANT
from tests.cache.test_tiered import lookup, toks
from tests.helpers import TINY

P = TINY.page_size


def test_token_hit_rate_per_namespace(cache_server, live_cache):
    lookup(live_cache, toks(1, 2, 3, 4, 5))  # served once by warm(): all of it cached now
    lookup(live_cache, toks(1, 2, 6), "fresh")  # a namespace with no pages at all
    with cache_server.client() as c:
        ns = {n["namespace"]: n for n in c.get("/namespaces").json()["items"]}
    assert set(ns) == {"default", "other", "fresh"}
    d = ns["default"]
    assert (d["lookups"], d["lookup_tokens"], d["hit_tokens"]) == (2, 10 * P, 5 * P)
    assert d["token_hit_rate"] == 0.5
    assert (ns["other"]["lookups"], ns["other"]["hit_tokens"], ns["other"]["token_hit_rate"]) == (1, 0, 0.0)
    assert ns["fresh"]["lookups"] == 1 and ns["fresh"]["num_chunks"] == 0 and ns["fresh"]["device_pages"] == 0
    with cache_server.client(TENANT) as c:
        items = c.get("/namespaces").json()["items"]
    assert [n["namespace"] for n in items] == ["other"] and items[0]["lookups"] == 1


def test_no_token_hit_rate_offline(store_server):
    with store_server.client() as c:
        items = c.get("/namespaces").json()["items"]
    assert items and all(n["lookups"] is None and n["token_hit_rate"] is None for n in items)
