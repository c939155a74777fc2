"""CacheCounters' lookups by namespace: counted per namespace, bounded in how many namespaces they keep."""

from __future__ import annotations

import chunkstore.cache.stats as stats
from chunkstore.cache.stats import CacheCounters


def test_lookups_by_namespace(monkeypatch):
    monkeypatch.setattr(stats, "MAX_COUNTED_NAMESPACES", 2)
    c = CacheCounters()
    c.record_lookup(10, 4, 2, 0, "a")
    c.record_lookup(6, 0, 0, 3, "a")
    c.record_lookup(5, 0, 0, 0, "b")
    c.record_lookup(7, 7, 0, 0, "c")  # beyond the bound: the totals only
    c.record_lookup(1, 0, 0, 0)
    by = c.lookups_by_namespace()
    assert set(by) == {"a", "b"}
    assert (by["a"].lookups, by["a"].lookup_tokens, by["a"].hit_tokens, by["a"].hit_rate) == (2, 16, 9, 9 / 16)
    assert by["b"].hit_rate == 0.0
    snap = c.snapshot(page_size=4, device=None, host=None, disk=None, queue_depths={})
    assert snap.lookups == 5 and snap.lookup_tokens == 29
