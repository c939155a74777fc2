"""PATCH /config refuses nonsense with 422 and a message naming the field: sizes that hold no page,
values that are not finite or out of range, booleans and strings where numbers are expected; a
refused PATCH changes nothing and keeps nothing in the data folder."""

from __future__ import annotations

import pytest

from chunkstore.api import CacheBackend, StoreBackend, create_app
from chunkstore.api.overrides import FILE_NAME
from chunkstore.cache.tiered import TieredCache
from tests.helpers.api import client, fill_store, live_server, settings
from tests.cache.test_tiered import make_config
from tests.helpers import TINY

PAGE_GB = TINY.page_size_bytes / 1e9

REFUSED = [
    ({"disk_size": 5e-324}, "disk_size", "holds no page"),
    ({"disk_size": PAGE_GB / 2}, "disk_size", "holds no page"),
    ({"disk_size": 0}, "disk_size", "greater than 0"),
    ({"disk_size": -1.0}, "disk_size", "greater than 0"),
    ({"disk_size": True}, "disk_size", "a number of GB"),
    ({"disk_size": "10GB"}, "disk_size", "a number of GB"),
    ({"disk_size": "0.5"}, "disk_size", "a number of GB"),
    ({"disk_size": 1e300}, "disk_size", "less than or equal"),
    ({"prefetch_timeout_s": False}, "prefetch_timeout_s", "a number of seconds"),
    ({"prefetch_timeout_s": "3"}, "prefetch_timeout_s", "a number of seconds"),
    ({"write_through_threshold": True}, "write_through_threshold", "a number of hits"),
    ({"write_through_threshold": 2.5}, "write_through_threshold", "integer"),
    ({"disk_load_host_share": 1.5}, "disk_load_host_share", "less than or equal to 1"),
    ({"disk_load_host_share": -0.1}, "disk_load_host_share", "greater than or equal to 0"),
    ({"disk_load_host_share": True}, "disk_load_host_share", "a fraction"),
]
# JSON has no NaN or Infinity, but Python's parser reads these literals: they must be refused too.
REFUSED_RAW = [
    (b'{"disk_size": NaN}', "disk_size"),
    (b'{"disk_size": Infinity}', "disk_size"),
    (b'{"prefetch_timeout_s": -Infinity}', "prefetch_timeout_s"),
    (b'{"disk_load_host_share": NaN}', "disk_load_host_share"),
]


def _assert_refused(r, field: str, words: str | None = None) -> None:
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == field and error["message"].startswith(field + ":"), error
    if words is not None:
        assert words in error["message"], error


@pytest.fixture
def cache_api(tmp_path):
    with TieredCache.open(make_config(tmp_path), TINY) as cache:
        with live_server(create_app(CacheBackend(cache), settings())) as url, client(url) as c:
            yield cache, c


def test_nonsense_is_refused_and_nothing_changes_or_is_kept(cache_api):
    cache, c = cache_api
    before = c.get("/config").json()
    for body, field, words in REFUSED:
        _assert_refused(c.patch("/config", json=body), field, words)
    for raw, field in REFUSED_RAW:
        _assert_refused(c.patch("/config", content=raw, headers={"Content-Type": "application/json"}), field)
    assert c.get("/config").json() == before
    assert cache.config.disk_size is None and cache.store.capacity_bytes is None
    assert not (cache.store.root / FILE_NAME).exists()


def test_a_refused_field_refuses_the_whole_patch(cache_api):
    cache, c = cache_api
    _assert_refused(c.patch("/config", json={"eviction_policy": "lfu", "disk_size": True}), "disk_size")
    assert cache.config.eviction_policy == "lru" and not (cache.store.root / FILE_NAME).exists()


def test_sensible_values_still_apply(cache_api):
    cache, c = cache_api
    r = c.patch("/config", json={"disk_size": 2 * PAGE_GB, "prefetch_timeout_s": 2, "write_through_threshold": 3,
                                 "disk_load_host_share": 0})
    assert r.status_code == 200, r.text
    assert cache.store.capacity_bytes == int(2 * PAGE_GB * 1e9) >= TINY.page_size_bytes
    assert r.json()["persisted"]["settings"]["write_through_threshold"] == 3


def test_the_offline_store_refuses_a_size_below_one_page(tmp_path):
    root = tmp_path / "store"
    fill_store(root)
    backend = StoreBackend(root)
    try:
        with live_server(create_app(backend, settings())) as url, client(url) as c:
            _assert_refused(c.patch("/config", json={"disk_size": 5e-324}), "disk_size", "holds no page")
            _assert_refused(c.patch("/config", json={"disk_size": True}), "disk_size", "a number of GB")
        with backend.using_store() as store:
            assert store.capacity_bytes is None
        assert not (root / FILE_NAME).exists()
    finally:
        backend.close()


@pytest.mark.parametrize("method,path,body,field", [
    ("POST", "/evict", {"bytes_to_free": True, "dry_run": True}, "bytes_to_free"),
    ("POST", "/evict", {"bytes_to_free": "10", "dry_run": True}, "bytes_to_free"),
    ("POST", "/evict", {"older_than_s": True, "dry_run": True}, "older_than_s"),
    ("POST", "/evict", {"namespace": "default", "dry_run": "yes"}, "dry_run"),
    ("PUT", "/namespaces/default/quota", {"quota_bytes": True}, "quota_bytes"),
    ("POST", "/flush", {"timeout_s": True}, "timeout_s"),
    ("POST", "/clear", {"tier": "disk", "confirm": 1}, "confirm"),
    ("POST", "/jobs/gc", {"disk_size_bytes": False}, "disk_size_bytes"),
    ("POST", "/jobs/verify", {"repair": "true"}, "repair"),
])
@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
def test_every_body_takes_numbers_and_booleans_as_json_types_only(store_server, method, path, body, field):
    with store_server.client() as c:
        r = c.request(method, path, json=body)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["param"] == field
        assert c.get("/namespaces").json()["items"][0]["quota_bytes"] is None  # nothing changed
        assert c.get("/stats").json()["disk"]["num_chunks"] == 10
