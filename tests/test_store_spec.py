"""The one door to a store: StoreSpec is valid from construction, open_store opens what it names,
and every caller above the disk tier opens its store there (the cache through TieredCache.open)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chunkstore.cache.config import CacheConfig
from chunkstore.cache.tiered import TieredCache
from chunkstore.disk import (DEFAULT_LOCAL_COPY_BYTES, ChunkFiles, Codec, Durability, StoreSpec, chain_pages,
                             open_store, store_root)
from chunkstore.disk.files import Durability as FilesDurability
from chunkstore.integrations.settings import store_fields
from chunkstore.priority import ThreadPriority
from tests.helpers import TINY, kv_pages

REPO = Path(__file__).resolve().parent.parent


def test_a_spec_refuses_what_it_cannot_open(tmp_path):
    with pytest.raises(ValueError, match="capacity_bytes"):
        StoreSpec(tmp_path, capacity_bytes=0)
    with pytest.raises(ValueError, match="local_copy_bytes"):
        StoreSpec(tmp_path, local_copy_bytes=-1)
    with pytest.raises(ValueError, match="postgresql"):
        StoreSpec(tmp_path, index_url="mysql://somewhere/db")
    with pytest.raises(ValueError, match="s3://"):
        StoreSpec(tmp_path, object_store="gs://bucket")
    with pytest.raises(ValueError, match="fsync"):
        StoreSpec(tmp_path, durability="sometimes")
    spec = StoreSpec(str(tmp_path), durability="none", background_priority="idle")
    assert spec.folder == tmp_path and spec.durability is FilesDurability.NONE
    assert spec.background_priority is ThreadPriority.IDLE
    with pytest.raises(AttributeError):
        spec.read_only = True  # frozen


def test_open_store_opens_what_the_spec_names_and_reads_the_identity_of_an_existing_store(tmp_path):
    spec = StoreSpec(tmp_path / "store", capacity_bytes=10**9, codec=Codec.NONE, durability=Durability.NONE)
    with pytest.raises(FileNotFoundError, match="no chunk store"):
        open_store(spec)  # no identity given, and no store.json to read one from
    pages = chain_pages(TINY, list(range(TINY.page_size * 3)))
    with open_store(spec, TINY) as store:
        assert store.capacity_bytes == 10**9 and store.codec is Codec.NONE and not store.read_only
        assert isinstance(store.payloads, ChunkFiles)
        assert store.put(pages, kv_pages(TINY, 3)).ok
    reader = StoreSpec(tmp_path / "store", read_only=True)
    with open_store(reader) as store:  # the identity from its store.json
        assert store.identity == TINY and store.read_only and store.longest_prefix([p.key for p in pages]) == 3


def test_the_cache_settings_and_the_engine_settings_name_the_same_store(tmp_path):
    config = CacheConfig(page_size=TINY.page_size, disk_path=tmp_path, disk_size="2GB", compression="none",
                         background_priority="low")
    spec = config.store_spec(TINY)
    assert spec == StoreSpec(store_root(tmp_path, TINY), capacity_bytes=2 * 10**9, codec=Codec.NONE,
                             local_copy_bytes=DEFAULT_LOCAL_COPY_BYTES, background_priority=ThreadPriority.LOW)
    assert CacheConfig(use_disk=False).store_spec(TINY) is None
    assert CacheConfig().local_copy_bytes == DEFAULT_LOCAL_COPY_BYTES  # one default, in bytes
    fields = store_fields({"disk_path": str(tmp_path), "disk_size": "2GB", "local_cache_size": "0"})
    assert fields["disk_size_bytes"] == spec.capacity_bytes and fields["local_cache_bytes"] == 0


def test_an_engine_rank_that_reads_opens_only_where_the_store_is(tmp_path):
    from types import SimpleNamespace

    from chunkstore.integrations.settings import store_spec

    settings = SimpleNamespace(disk_path=tmp_path, index_url=None, object_store="s3://bucket/prefix",
                               local_cache_bytes=10**9, disk_size_bytes=10**9, compression=Codec.NONE,
                               durability=Durability.NONE, background_priority=ThreadPriority.LOW, seal_key=None)
    writer = store_spec(settings, TINY)
    assert writer.keeps_local_copy and writer.capacity_bytes == 10**9 and writer.codec is Codec.NONE
    reader = store_spec(settings, TINY, read_only=True)
    assert reader == StoreSpec(store_root(tmp_path, TINY), object_store="s3://bucket/prefix", read_only=True)
    assert not reader.keeps_local_copy


def test_a_cache_with_a_disk_tier_gets_its_store_built(tmp_path):
    config = CacheConfig(page_size=TINY.page_size, device_size="4pages", host_size="8pages", disk_path=tmp_path)
    with pytest.raises(ValueError, match=r"TieredCache\.open"):
        TieredCache(config, TINY)  # no store: it is not the cache's to open
    with TieredCache.open(config, TINY) as cache:
        assert cache.store is not None and cache.store.root == store_root(tmp_path, TINY)
        store = cache.store
    assert store._closed  # the cache opened it, so the cache closed it
    with open_store(config.store_spec(TINY), TINY) as store:
        with TieredCache(config, TINY, store=store) as cache:
            assert cache.store is store
        assert not store._closed  # the caller's, left open


def test_the_page_size_is_the_identitys_and_checked_once_where_the_settings_meet_it(tmp_path):
    config = CacheConfig(page_size=TINY.page_size * 2, device_size="4pages", host_size="8pages", use_disk=False)
    with pytest.raises(ValueError, match="page_size"):
        TieredCache(config, TINY)
    with TieredCache.open(CacheConfig(page_size=TINY.page_size, device_size="4pages", host_size="8pages",
                                      use_disk=False), TINY) as cache:
        assert cache.page_size == cache.tree.page_size == TINY.page_size
        assert "page_size" not in vars(cache) and "page_size" not in vars(cache.tree)  # derived, not copied


def test_no_caller_above_the_disk_tier_constructs_a_store_itself():
    """Every command, the composition root, the cache, the API and the integrations go through
    open_store (benchmarks and test support may build stores with their own knobs)."""
    callers = [REPO / "chunkstore" / name for name in ("cli.py", "serve.py")]
    for package in ("server", "engine", "cache", "api", "integrations"):
        callers += (REPO / "chunkstore" / package).rglob("*.py")
    offenders = [str(p.relative_to(REPO)) for p in callers if re.search(r"\bChunkStore\(", p.read_text())]
    assert offenders == []


def test_settings_that_do_not_fit_the_model_leave_no_store_behind(tmp_path):
    config = CacheConfig(page_size=TINY.page_size, device_size="1B", disk_path=tmp_path / "data")
    with pytest.raises(ValueError, match="holds no page"):
        TieredCache.open(config, TINY)
    assert not (tmp_path / "data").exists()
