"""One Tier enum for the whole cache: parsing, the wire format, and its use in stats and the admin
operations (which reach the cache through its public methods only)."""

from __future__ import annotations

import ast
import inspect
import json

import pytest

from chunkstore.cache import admin
from chunkstore.cache.ops import TransferPath
from chunkstore.cache.stats import HIT_TIERS
from chunkstore.cache.tiers import MEMORY_TIERS, Tier
from tests.cache.test_tiered import make_config, open_cache, serve, settle, toks


def test_tiers_parse_by_name_and_serialise_as_their_names():
    assert [Tier.parse(n) for n in ("device", " HOST ", "disk")] == [Tier.DEVICE, Tier.HOST, Tier.DISK]
    assert json.dumps({Tier.DEVICE: 1, "x": [Tier.DISK]}) == '{"device": 1, "x": ["disk"]}'
    assert f"{Tier.HOST}" == "host" and Tier.HOST == "host"
    assert MEMORY_TIERS == (Tier.DEVICE, Tier.HOST) and HIT_TIERS == (Tier.DEVICE, Tier.HOST, Tier.DISK)


@pytest.mark.parametrize("name", ["disk", "gpu", "", None])
def test_only_memory_tiers_parse_as_memory_tiers(name):
    with pytest.raises(ValueError, match="valid values: device, host"):
        Tier.parse_memory(name)


def test_transfer_paths_name_their_tiers():
    assert {(p.source, p.destination) for p in TransferPath} == {
        (Tier.DEVICE, Tier.HOST), (Tier.HOST, Tier.DISK), (Tier.DISK, Tier.HOST), (Tier.HOST, Tier.DEVICE)}


def test_stats_are_keyed_by_tier_and_dump_plain_names(tmp_path):
    with open_cache(make_config(tmp_path)) as cache:
        serve(cache, toks(1, 2))
        serve(cache, toks(1, 2))
        settle(cache)  # the write-through backup's lock is given back
        assert cache.admin.evict(Tier.DEVICE, 1) >= 1
        s = cache.stats()
        assert set(s.hit_tokens) == set(HIT_TIERS) and s.hit_tokens[Tier.DEVICE] == s.hit_tokens["device"] > 0
        assert set(s.evicted_pages) == set(MEMORY_TIERS) and s.evicted_pages[Tier.DEVICE] >= 1
        dumped = json.loads(json.dumps(s.as_dict()))
        assert set(dumped["hit_tokens"]) == {"device", "host", "disk"}
        assert all(type(k) is str for k in s.as_dict()["evicted_pages"])


def test_the_admin_operations_refuse_the_disk_tier(tmp_path):
    with open_cache(make_config(tmp_path)) as cache:
        for call in (lambda: cache.admin.evict("disk", 1), lambda: cache.admin.clear(Tier.DISK),
                     lambda: cache.admin.resident_keys("disk"), lambda: cache.evict_memory(Tier.DISK, 1)):
            with pytest.raises(ValueError, match="valid values: device, host"):
                call()


def test_the_admin_operations_use_only_the_caches_public_names():
    """CacheAdmin is an object over TieredCache's public methods: no ``self.cache._x``."""
    tree = ast.parse(inspect.getsource(admin))
    private = [node.attr for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
               and isinstance(node.value, ast.Attribute) and node.value.attr in ("cache", "tree")]
    assert private == []
