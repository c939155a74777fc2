"""POST /evict on the memory tiers by key (and descendants), namespace and age, through a real server
over a live cache: dry runs change nothing, locked pages are reported and stay, errors are 404/409/403/422."""

from __future__ import annotations

from tests.helpers.api import TENANT
from tests.cache.test_tiered import assert_consistent, keys_of, toks
from tests.helpers import TINY

PAGE_BYTES = TINY.page_size_bytes
A = toks(1, 2, 3, 4, 5)  # what tests.api.conftest.warm served, in "default"
B = toks(7, 8, 9)  # and in "other"


def residency(cache):
    return cache.admin.resident_keys("device"), cache.admin.resident_keys("host"), cache.stats().evicted_pages


def test_by_key_with_descendants(cache_server, live_cache):
    keys = keys_of(A)
    with cache_server.client() as c:
        before = residency(live_cache)
        body = {"tier": "device", "key": keys[2].hex(), "descendants": True}
        dry = c.post("/evict", json={**body, "dry_run": True}).json()
        assert dry["num_pages"] == 3 and set(dry["keys"]) == {k.hex() for k in keys[2:]}
        assert residency(live_cache) == before
        done = c.post("/evict", json=body).json()
        assert done["num_pages"] == 3 and done["num_bytes"] == 3 * PAGE_BYTES and done["skipped_locked"] == 0
        assert done["is_complete"] and set(done["keys"]) == set(dry["keys"])
        assert live_cache.admin.resident_keys("device", "default") == set(keys[:2])
        assert c.get("/stats").json()["evicted_pages"]["device"] == 3
    assert_consistent(live_cache)


def test_by_key_errors(cache_server, live_cache):
    keys = keys_of(A)
    with cache_server.client() as c:
        r = c.post("/evict", json={"tier": "host", "key": keys[0].hex()})
        assert r.status_code == 409 and "descendant pages" in r.json()["error"]["message"]
        r = c.post("/evict", json={"tier": "host", "key": "ab" * 32})
        assert r.status_code == 404 and r.json()["error"]["param"] == "key"
        r = c.post("/evict", json={"tier": "host", "key": keys[0].hex(), "namespace": "other", "descendants": True})
        assert r.status_code == 404
        r = c.post("/evict", json={"tier": "device", "key": keys[0].hex(), "bytes_to_free": 1})
        assert r.status_code == 422 and "key selects" in r.json()["error"]["message"]
    with cache_server.client(TENANT) as c:
        r = c.post("/evict", json={"tier": "device", "namespace": "other"})
        assert r.status_code == 403
    with cache_server.client(None) as c:
        assert c.post("/evict", json={"tier": "device", "namespace": "other"}).status_code == 401
    assert len(live_cache.admin.resident_keys("host")) == 8  # nothing changed


def test_by_namespace_and_fraction_of_it(cache_server, live_cache):
    other = set(keys_of(B, "other"))
    with cache_server.client() as c:
        half = c.post("/evict", json={"tier": "device", "namespace": "other", "fraction": 0.5, "dry_run": True})
        assert half.json()["num_pages"] == 3  # at least 2 pages asked: one whole node goes
        done = c.post("/evict", json={"tier": "host", "namespace": "other"}).json()
        assert done["num_pages"] == 3 and set(done["keys"]) == {k.hex() for k in other}
        assert live_cache.admin.resident_keys("host", "other") == set()
        assert len(live_cache.admin.resident_keys("host", "default")) == 5
        ns = {n["namespace"]: n for n in c.get("/namespaces").json()["items"]}
        assert ns["other"]["host_pages"] == 0 and ns["other"]["device_pages"] == 3
    assert_consistent(live_cache)


def test_by_age(cache_server, live_cache, monkeypatch):
    real = live_cache.tree.clock_s
    monkeypatch.setattr(live_cache.tree, "clock_s", lambda: real() + 3600)  # everything was served an hour ago
    with cache_server.client() as c:
        assert c.post("/evict", json={"tier": "device", "older_than_s": 7200}).json()["num_pages"] == 0
        dry = c.post("/evict", json={"tier": "device", "older_than_s": 60, "dry_run": True}).json()
        assert dry["num_pages"] == 8 and len(live_cache.admin.resident_keys("device")) == 8
        done = c.post("/evict", json={"tier": "device", "older_than_s": 60, "namespace": "default"}).json()
        assert done["num_pages"] == 5 and live_cache.admin.resident_keys("device") == set(keys_of(B, "other"))
    assert_consistent(live_cache)


def test_locked_pages_are_reported_and_stay(cache_server, live_cache):
    hit = live_cache.match(A)
    try:
        with cache_server.client() as c:
            r = c.post("/evict", json={"tier": "device", "namespace": "default"}).json()
            assert r["num_pages"] == 0 and r["skipped_locked"] == 5 and r["is_complete"]  # nothing else to take
            r = c.post("/evict", json={"tier": "device", "fraction": 1.0}).json()
            assert r["num_pages"] == 3 and r["skipped_locked"] == 5  # only the other namespace's
    finally:
        live_cache.release(hit)
    assert live_cache.admin.resident_keys("device") == set(keys_of(A))
    assert_consistent(live_cache)
