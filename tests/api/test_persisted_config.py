"""PATCH /config keeps its changes in the data folder (atomically, mode 0600) and the next start applies
them below explicit flags and environment variables; persist=false, read-only stores, no disk tier
and unusable files."""

from __future__ import annotations

import json
import stat

from chunkstore.api import CacheBackend, StoreBackend, create_app
from chunkstore.api.overrides import FILE_NAME
from chunkstore.cache.radix_policy import EvictionPolicy
from chunkstore.cache.tiered import TieredCache
from tests.helpers.api import client, fill_store, live_server, settings
from tests.cache.test_tiered import make_config
from tests.helpers import TINY


def test_kept_and_applied_at_the_next_start(tmp_path, monkeypatch):
    with TieredCache.open(make_config(tmp_path), TINY) as cache:
        with live_server(create_app(CacheBackend(cache), settings())) as url, client(url) as c:
            r = c.patch("/config", json={"eviction_policy": "lfu", "disk_size": 0.002, "prefetch_timeout_s": 3})
            assert r.status_code == 200, r.text
            kept = r.json()["persisted"]
            assert kept["settings"] == {"eviction_policy": "lfu", "disk_size": 0.002, "prefetch_timeout_s": 3.0}
            assert kept["is_writable"] and kept["shadowed"] == []
            assert c.patch("/config", json={"disk_size": None}).json()["persisted"]["settings"]["disk_size"] is None
        path = cache.store.root / FILE_NAME
        assert kept["file"] == str(path) and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []

    with TieredCache.open(make_config(tmp_path), TINY) as cache:  # a restart: defaults below the kept settings
        assert cache.config.eviction_policy == "lru"
        create_app(CacheBackend(cache), settings())
        assert cache.tree.policy is EvictionPolicy.LFU and cache.config.prefetch_timeout_s == 3.0
        assert cache.config.disk_size is None and cache.store.capacity_bytes is None

    monkeypatch.setenv("CHUNKSTORE_PREFETCH_TIMEOUT_S", "7")  # explicit settings win
    with TieredCache.open(make_config(tmp_path, eviction_policy="lru"), TINY) as cache:
        app = create_app(CacheBackend(cache), settings())
        assert cache.tree.policy is EvictionPolicy.LRU and cache.config.prefetch_timeout_s == 7.0
        with live_server(app) as url, client(url) as c:
            assert c.get("/config").json()["persisted"]["shadowed"] == ["eviction_policy", "prefetch_timeout_s"]


def test_persist_false_changes_this_process_only(tmp_path):
    with TieredCache.open(make_config(tmp_path), TINY) as cache:
        with live_server(create_app(CacheBackend(cache), settings())) as url, client(url) as c:
            r = c.patch("/config", params={"persist": "false"}, json={"eviction_policy": "lfu"})
            assert r.status_code == 200 and r.json()["persisted"]["settings"] == {}
        assert not (cache.store.root / FILE_NAME).exists() and cache.tree.policy is EvictionPolicy.LFU


def test_a_bad_file_or_value_is_skipped(tmp_path, caplog):
    root = tmp_path / "disk"
    with TieredCache.open(make_config(tmp_path), TINY):
        pass
    (root / FILE_NAME).write_text("{not json")
    with TieredCache.open(make_config(tmp_path), TINY) as cache:
        create_app(CacheBackend(cache), settings())
        assert cache.tree.policy is EvictionPolicy.LRU
    assert "ignoring the persisted settings" in caplog.text
    (root / FILE_NAME).write_text(json.dumps({"version": 1, "settings": {
        "eviction_policy": "random", "page_size": 8, "prefetch_timeout_s": 2, "disk_size": 5e-324}}))
    with TieredCache.open(make_config(tmp_path), TINY) as cache:
        create_app(CacheBackend(cache), settings())
        assert cache.tree.policy is EvictionPolicy.LRU and cache.config.page_size == TINY.page_size
        assert cache.config.prefetch_timeout_s == 2.0  # the good one still applies
        assert cache.config.disk_size is None  # a size that holds no page, kept before PATCH refused it
    assert "eviction_policy='random' not applied" in caplog.text and "page_size=8 not applied" in caplog.text
    assert "disk_size=5e-324 not applied" in caplog.text


def test_offline_store_keeps_disk_size(tmp_path):
    root = tmp_path / "store"
    fill_store(root)
    backend = StoreBackend(root)
    try:
        with live_server(create_app(backend, settings())) as url, client(url) as c:
            r = c.patch("/config", json={"disk_size": 0.003})
            assert r.status_code == 200 and r.json()["persisted"]["settings"] == {"disk_size": 0.003}
    finally:
        backend.close()
    backend = StoreBackend(root)
    try:
        create_app(backend, settings())
        with backend.using_store() as store:
            assert store.capacity_bytes == 3_000_000
    finally:
        backend.close()
    backend = StoreBackend(root, read_only=True)
    try:
        with live_server(create_app(backend, settings())) as url, client(url) as c:
            config = c.get("/config").json()["persisted"]
            assert config["settings"] == {"disk_size": 0.003} and not config["is_writable"]
            r = c.patch("/config", json={"disk_size": 1.0})
            assert r.status_code == 409 and "persist=false" in r.json()["error"]["message"]
    finally:
        backend.close()


def test_no_disk_tier(tmp_path):
    with TieredCache.open(make_config(tmp_path, use_disk=False), TINY) as cache:
        with live_server(create_app(CacheBackend(cache), settings())) as url, client(url) as c:
            assert c.get("/config").json()["persisted"] == {"file": None, "settings": {}, "shadowed": [],
                                                            "is_writable": False}
            assert c.patch("/config", json={"eviction_policy": "lfu"}).status_code == 409
            assert c.patch("/config", params={"persist": False}, json={"eviction_policy": "lfu"}).status_code == 200
