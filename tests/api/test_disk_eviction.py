"""The disk eviction planner against the store's own eviction: the same chunks go, in the same
order, and a plan changes nothing; by key, pinned chunks and their ancestors stay."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chunkstore.api import disk_eviction
from chunkstore.api.backend.base import BackendError
from chunkstore.api.disk_eviction import DiskSelection
from chunkstore import ChunkStore, chain_pages
from tests.conftest import TINY, kv_pages

P = TINY.page_size


def build(root, seed: int):
    """Branching prefixes in two namespaces, each chunk with its own access time, some pinned."""
    rng = random.Random(seed)
    store = ChunkStore(root, TINY)
    keys = []
    for branch in range(6):
        ns = "a" if branch % 2 else "b"
        shared = list(range(P * 2))
        tokens = shared + [10_000 * (branch + 1) + i for i in range(P * rng.randint(1, 3))]
        pages = chain_pages(TINY, tokens, ns)
        store.put(pages, kv_pages(TINY, len(pages), seed=branch))
        keys += [p.key for p in pages]
    keys = list(dict.fromkeys(keys))
    for i, key in enumerate(rng.sample(keys, len(keys))):
        store.index.touch([key], now=2e9 + i)  # distinct times: the order is fully determined
    store.pin([keys[rng.randrange(len(keys))]])
    store.flush()
    return store


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), share=st.floats(0.05, 1.0), ns=st.sampled_from([None, "a"]))
def test_plan_is_what_the_store_evicts(tmp_path_factory, seed, share, ns):
    store = build(tmp_path_factory.mktemp("s"), seed)
    try:
        want = int(share * store.index.stored_bytes(ns))
        before = store.index.count()
        plan = disk_eviction.evict(store, DiskSelection(namespace=ns, bytes_to_free=want), max_chunks=10_000,
                                   dry_run=True)
        assert store.index.count() == before  # a plan changes nothing
        done = store.evict(want, namespace=ns)
        assert [v.key for v in plan.victims] == list(done.keys)
        assert plan.stored_bytes == done.stored_bytes
    finally:
        store.close()


def test_age_selection_stops_at_the_first_recent_leaf(tmp_path):
    store = build(tmp_path / "s", 3)
    try:
        rows = store.index.leaves(None, None, 1000)
        cutoff = sorted(r.last_access_at for r in rows)[2]
        plan = disk_eviction.plan(store.index, DiskSelection(accessed_before=cutoff), 10_000)
        assert plan.victims and all(v.last_access_at < cutoff for v in plan.victims)
        executed = disk_eviction.evict(store, DiskSelection(accessed_before=cutoff), max_chunks=10_000, dry_run=False)
        assert [v.key for v in executed.victims] == [v.key for v in plan.victims]
        assert not store.index.present([v.key for v in plan.victims])
        assert not any(store.files.path_for(v.key).exists() for v in plan.victims)
    finally:
        store.close()


def test_key_selection_keeps_pinned_chunks_and_their_ancestors(tmp_path):
    pages = chain_pages(TINY, list(range(P * 6)))
    with ChunkStore(tmp_path / "s", TINY) as store:
        store.put(pages, kv_pages(TINY, 6))
        store.pin([pages[4].key])
        with pytest.raises(BackendError, match="descendants"):
            disk_eviction.plan(store.index, DiskSelection(key=pages[1].key), 100)
        plan = disk_eviction.plan(store.index, DiskSelection(key=pages[1].key, descendants=True), 100)
        assert [v.key for v in plan.victims] == [pages[5].key] and plan.skipped_pinned == 4
        partial = disk_eviction.plan(store.index, DiskSelection(key=pages[0].key, descendants=True), 2)
        assert not partial.is_complete and [v.key for v in partial.victims] == [pages[5].key]
        with pytest.raises(disk_eviction.ChunkNotFoundError):
            disk_eviction.plan(store.index, DiskSelection(key=b"\0" * 32), 100)
        store.unpin([pages[4].key])
        done = disk_eviction.evict(store, DiskSelection(key=pages[3].key, descendants=True), max_chunks=100,
                                   dry_run=False)
        assert [v.key for v in done.victims] == [pages[5].key, pages[4].key, pages[3].key]
        assert store.longest_prefix([p.key for p in pages]) == 3
        assert store.stats().evictions == 3


def test_max_chunks_cuts_a_plan_short(tmp_path):
    store = build(tmp_path / "s", 5)
    try:
        plan = disk_eviction.plan(store.index, DiskSelection(namespace="b"), 2)
        assert len(plan.victims) == 2 and not plan.is_complete
        whole = disk_eviction.plan(store.index, DiskSelection(namespace="b"), 10_000)
        assert whole.is_complete and [v.key for v in whole.victims[:2]] == [v.key for v in plan.victims]
        assert all(not v.pinned for v in whole.victims)
    finally:
        store.close()
