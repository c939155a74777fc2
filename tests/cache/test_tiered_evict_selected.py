"""TieredCache.evict_selected: memory-tier eviction by key (and descendants), namespace and age, on real
pools, trees and stores; dry runs change nothing, locked pages never go, the cache stays consistent."""

from __future__ import annotations

import pytest

from chunkstore.cache.admin import DescendantsResidentError, KeyNotResidentError, MemorySelection
from tests.cache.test_tiered import assert_consistent, keys_of, lookup, make_config, open_cache, serve, settle, toks


def shape(cache):
    """Everything a dry run must leave alone: nodes, their pages and residency, the pools."""
    with cache.tree.lock:
        nodes = [(n.id, n.keys, n.on_device, n.on_host, n.persisted, n.last_access)
                 for n in cache.tree.iter_nodes()]
    return nodes, cache.device_pool.num_used, cache.host_pool.num_used, cache.stats().evicted_pages


def test_by_key_with_descendants_keeps_the_pages_before_it(tmp_path):
    with open_cache(make_config(tmp_path)) as cache:
        a = toks(1, 2, 3, 4)
        serve(cache, a)
        serve(cache, toks(1, 2, 5))  # a branch after page 2
        settle(cache)
        keys = keys_of(a)
        before = shape(cache)
        dry = cache.admin.evict_selected("device", MemorySelection(key=keys[1], descendants=True), dry_run=True)
        assert dry.num_pages == 4 and set(dry.keys) == {*keys[1:], keys_of(toks(1, 2, 5))[2]}
        assert shape(cache) == before  # no split, no eviction
        done = cache.admin.evict_selected("device", MemorySelection(key=keys[1], descendants=True))
        assert done.num_pages == 4 and set(done.keys) == set(dry.keys) and done.locked_pages == done.kept_pages == 0
        assert cache.admin.resident_keys("device") == {keys[0]}
        assert cache.stats().evicted_pages["device"] == 4
        assert_consistent(cache)
        hit = lookup(cache, a)
        assert hit.num_pages == 4 and hit.device_tokens == len(a) // 4  # the rest from host


def test_by_key_alone(tmp_path):
    with open_cache(make_config(tmp_path)) as cache:
        a = toks(1, 2, 3)
        serve(cache, a)
        settle(cache)
        keys = keys_of(a)
        with pytest.raises(DescendantsResidentError, match="2 descendant pages"):
            cache.admin.evict_selected("device", MemorySelection(key=keys[0]))
        with pytest.raises(KeyNotResidentError):
            cache.admin.evict_selected("device", MemorySelection(key=b"\x01" * 32))
        with pytest.raises(KeyNotResidentError):
            cache.admin.evict_selected("device", MemorySelection(key=keys[2], namespace="other"))
        done = cache.admin.evict_selected("device", MemorySelection(key=keys[2]))
        assert done.num_pages == 1 and done.keys == (keys[2],)
        assert cache.admin.resident_keys("device") == set(keys[:2])
        with pytest.raises(KeyNotResidentError, match="device"):
            cache.admin.evict_selected("device", MemorySelection(key=keys[2]))
        assert_consistent(cache)


def test_by_namespace(tmp_path):
    with open_cache(make_config(tmp_path)) as cache:
        serve(cache, toks(1, 2, 3))
        serve(cache, toks(5, 6), "other")
        settle(cache)
        before = shape(cache)
        assert cache.admin.evict_selected("host", MemorySelection(namespace="other"), dry_run=True).num_pages == 2
        assert shape(cache) == before
        done = cache.admin.evict_selected("host", MemorySelection(namespace="other"))
        assert done.num_pages == 2 and set(done.keys) == set(keys_of(toks(5, 6), "other"))
        assert cache.admin.resident_keys("host", "other") == set() and len(cache.admin.resident_keys("host", "default")) == 3
        assert cache.store.longest_prefix(keys_of(toks(5, 6), "other")) == 2  # on disk before it left host
        assert_consistent(cache)
        assert lookup(cache, toks(5, 6), "other").num_pages == 2


def test_by_namespace_at_most_num_pages(tmp_path):
    with open_cache(make_config(tmp_path)) as cache:
        serve(cache, toks(1, 2))
        serve(cache, toks(3, 4))
        settle(cache)
        done = cache.admin.evict_selected("device", MemorySelection(namespace="default", num_pages=1))
        assert done.num_pages == 2 and done.kept_pages == 2  # one whole node: the oldest
        assert cache.admin.resident_keys("device") == set(keys_of(toks(3, 4)))
        assert_consistent(cache)


def test_by_age(tmp_path):
    clock = [1000.0]
    with open_cache(make_config(tmp_path)) as cache:
        cache.tree.clock_s = lambda: clock[0]  # the tree's clock seam: age it without waiting
        serve(cache, toks(1, 2))
        clock[0] += 120
        serve(cache, toks(3, 4))
        settle(cache)
        assert cache.admin.evict_selected("device", MemorySelection(older_than_s=600)).num_pages == 0
        dry = cache.admin.evict_selected("device", MemorySelection(older_than_s=60), dry_run=True)
        assert set(dry.keys) == set(keys_of(toks(1, 2)))
        done = cache.admin.evict_selected("device", MemorySelection(older_than_s=60))
        assert set(done.keys) == set(keys_of(toks(1, 2)))
        assert cache.admin.resident_keys("device") == set(keys_of(toks(3, 4)))
        assert_consistent(cache)


def test_locked_pages_never_go(tmp_path):
    with open_cache(make_config(tmp_path)) as cache:
        a = toks(1, 2)
        serve(cache, a)
        settle(cache)
        hit = cache.match(a)
        try:
            dry = cache.admin.evict_selected("device", MemorySelection(namespace="default"), dry_run=True)
            assert dry.num_pages == 0 and dry.locked_pages == 2
            done = cache.admin.evict_selected("device", MemorySelection(key=keys_of(a)[0], descendants=True))
            assert done.num_pages == 0 and done.locked_pages == 2
            assert cache.admin.resident_keys("device") == set(keys_of(a))
        finally:
            cache.release(hit)
        assert cache.admin.evict_selected("device", MemorySelection(namespace="default")).num_pages == 2
        assert_consistent(cache)


def test_selection_is_checked():
    with pytest.raises(ValueError, match="select something"):
        MemorySelection()
    with pytest.raises(ValueError, match="descendants needs a key"):
        MemorySelection(descendants=True, namespace="x")
    with pytest.raises(ValueError, match="key selects"):
        MemorySelection(key=b"\x00" * 32, older_than_s=1)


def test_tick_samples_give_a_conservative_clock(tmp_path):
    clock = [50.0]
    with open_cache(make_config(tmp_path)) as cache:
        cache.tree.clock_s = lambda: clock[0]  # the tree's clock seam: age it without waiting
        serve(cache, toks(1))
        clock[0] += 0.5
        serve(cache, toks(2))  # within the second: not sampled
        clock[0] += 10
        with cache.tree.lock:
            assert cache.tree.clock_before(100) == 0
            c = cache.tree.clock_before(5)
            ages = {n.keys[0]: n.last_access < c for n in cache.tree.iter_nodes()}
        assert ages == {keys_of(toks(1))[0]: True, keys_of(toks(2))[0]: True}
