"""TieredCache's administration methods (evict, clear, resident_keys, residency_by_namespace,
reconfigure, is_closed) on real pools, trees and stores: they follow the eviction rules, keep the
cache consistent and change only what they say."""

from __future__ import annotations

import pytest

from chunkstore.cache import EvictionPolicy, PrefetchPolicy, WritePolicy
from tests.cache.test_tiered import (
    assert_consistent, keys_of, lookup, make_config, open_cache, serve, settle, toks, tree_pages,
)


def test_evict_device_keeps_lower_copies(tmp_path):
    with open_cache(make_config(tmp_path)) as cache:
        tokens = toks(1, 2, 3, 4)
        serve(cache, tokens)
        settle(cache)
        assert tree_pages(cache, "device") == 4
        assert cache.admin.evict("device", 2) >= 2
        assert cache.stats().evicted_pages["device"] >= 2
        assert_consistent(cache)
        hit = lookup(cache, tokens)  # the pages come back from host memory
        assert hit.num_pages == 4 and hit.host_tokens > 0


def test_evict_host_writes_down_first_and_disk_serves_it(tmp_path):
    with open_cache(make_config(tmp_path, write_policy="write_back")) as cache:
        tokens = toks(1, 2, 3)
        serve(cache, tokens)
        settle(cache)
        assert cache.admin.evict("device", 3) == 3  # write-back: backed up to host on the way out
        assert tree_pages(cache, "host") == 3
        assert cache.admin.evict("host", 3) == 3  # and written to disk before the host copy goes
        assert cache.store.longest_prefix(keys_of(tokens)) == 3
        assert_consistent(cache)
        assert lookup(cache, tokens).disk_tokens == len(tokens)


def test_evict_skips_locked_pages(tmp_path):
    with open_cache(make_config(tmp_path)) as cache:
        tokens = toks(1, 2)
        serve(cache, tokens)
        settle(cache)
        hit = cache.match(tokens)
        try:
            assert cache.admin.evict("device", 10) == 0
            assert cache.admin.clear("device") == 0
        finally:
            cache.release(hit)
        assert cache.admin.clear("device") == 2
        assert_consistent(cache)


def test_clear_empties_a_tier(tmp_path):
    with open_cache(make_config(tmp_path)) as cache:
        serve(cache, toks(1, 2, 3))
        serve(cache, toks(5, 6), "other")
        settle(cache)
        assert cache.admin.clear("host") == 5
        assert cache.admin.clear("device") == 5
        s = cache.stats()
        assert s.device.cached_pages == s.host.cached_pages == 0
        assert_consistent(cache)
        assert lookup(cache, toks(1, 2, 3)).disk_tokens == 12  # still on disk


def test_evict_rejects_other_tiers_and_negative_counts(tmp_path):
    with open_cache(make_config(tmp_path)) as cache:
        with pytest.raises(ValueError, match="device, host"):
            cache.admin.evict("disk", 1)
        with pytest.raises(ValueError, match=">= 0"):
            cache.admin.evict("device", -1)
        with pytest.raises(ValueError, match="device, host"):
            cache.admin.resident_keys("gpu")


def test_resident_keys_and_residency_by_namespace(tmp_path):
    with open_cache(make_config(tmp_path)) as cache:
        a, b = toks(1, 2, 3), toks(4, 5)
        serve(cache, a)
        serve(cache, b, "other")
        settle(cache)
        assert cache.admin.resident_keys("device") == set(keys_of(a)) | set(keys_of(b, "other"))
        assert cache.admin.resident_keys("host", "other") == set(keys_of(b, "other"))
        residency = cache.admin.residency_by_namespace()
        assert {ns: (r.device_pages, r.host_pages) for ns, r in residency.items()} == \
            {"default": (3, 3), "other": (2, 2)}
        cache.admin.evict("device", 10)
        assert cache.admin.resident_keys("device") == set()
        assert cache.admin.residency_by_namespace()["default"].device_pages == 0


def test_reconfigure_live_settings(tmp_path):
    with open_cache(make_config(tmp_path, disk_size=1.0)) as cache:
        new = cache.admin.reconfigure(eviction_policy="lfu", prefetch_policy="timeout", prefetch_timeout_s=0.5,
                                disk_size=0.001)
        assert cache.config is new and new.eviction_policy is EvictionPolicy.LFU
        assert cache.tree.policy is EvictionPolicy.LFU and new.prefetch_policy is PrefetchPolicy.TIMEOUT
        assert cache.store.capacity_bytes == 1_000_000
        cache.admin.reconfigure(disk_size=None)
        assert cache.store.capacity_bytes is None
        before = cache.config
        with pytest.raises(ValueError, match="cannot change while the cache runs"):
            cache.admin.reconfigure(page_size=8)
        with pytest.raises(ValueError, match="write_policy cannot change"):
            cache.admin.reconfigure(write_policy=WritePolicy.WRITE_BACK)
        with pytest.raises(ValueError, match="valid values"):
            cache.admin.reconfigure(eviction_policy="fifo")
        with pytest.raises(ValueError):
            cache.admin.reconfigure(disk_load_host_share=2.0)
        assert cache.config is before  # nothing changed on error
        serve(cache, toks(1, 2))
        assert_consistent(cache)


def test_reconfigure_disk_size_needs_a_disk_tier(tmp_path):
    with open_cache(make_config(tmp_path, use_disk=False)) as cache:
        with pytest.raises(ValueError, match="no disk tier"):
            cache.admin.reconfigure(disk_size=1.0)


def test_is_closed(tmp_path):
    with open_cache(make_config(tmp_path)) as cache:
        assert not cache.is_closed
    assert cache.is_closed
