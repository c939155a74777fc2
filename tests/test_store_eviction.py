"""ChunkStore.plan_eviction / evict, the one eviction planner and executor: a plan is what a plain
model of the rule takes (least recently used unpinned leaf first, ties by key), it changes nothing,
the store carries out exactly the plan while nothing changed and plans again under its writer lock
when something did; by key, pinned chunks and their ancestors stay; capacity eviction in a put
takes the same order (tests/test_store.py)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chunkstore import ChunkStore, chain_pages
from chunkstore.disk.eviction import ChunkNotStoredError, EvictionSelection, StrandedDescendantsError
from chunkstore.disk.index import ChunkIndex, ChunkRow, sqlite_url
from chunkstore.disk.maintenance import evict_bytes
from tests.helpers import TINY, kv_pages

P = TINY.page_size


def set_access_times(root, times: dict[bytes, float]) -> None:
    """Give chunks distinct access times through an index of the test's own on the store's file."""
    index = ChunkIndex(sqlite_url(root))
    try:
        for key, t in times.items():
            index.touch([key], now=t)
        index.flush()
    finally:
        index.close()


def build(root, seed: int) -> ChunkStore:
    """Branching prefixes in two namespaces, each chunk with its own access time, one pinned."""
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
    set_access_times(root, {key: 2e9 + i for i, key in enumerate(rng.sample(keys, len(keys)))})
    store.pin([keys[rng.randrange(len(keys))]])
    return store


def model_plan(rows: dict[bytes, ChunkRow], selection: EvictionSelection) -> list[bytes]:
    """The rule, written out plainly: take the least recently used unpinned chunk that no remaining
    chunk extends, again and again, until the selection is satisfied."""
    left = dict(rows)
    taken: list[bytes] = []
    freed = 0
    while True:
        parents = {r.parent_key for r in left.values()}
        leaves = [r for k, r in left.items() if k not in parents and not r.pinned
                  and (selection.namespace is None or r.namespace == selection.namespace)]
        if not leaves:
            return taken
        if selection.bytes_to_free is not None and freed >= selection.bytes_to_free:
            return taken
        first = min(leaves, key=lambda r: (r.last_access_at, r.key))
        if selection.accessed_before is not None and first.last_access_at >= selection.accessed_before:
            return taken
        if selection.max_chunks is not None and len(taken) >= selection.max_chunks:
            return taken
        taken.append(first.key)
        freed += first.stored_bytes
        del left[first.key]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), share=st.floats(0.05, 1.0), ns=st.sampled_from([None, "a"]),
       max_chunks=st.sampled_from([None, 3]), by_age=st.booleans())
def test_a_plan_is_what_the_rule_takes_and_changes_nothing(tmp_path_factory, seed, share, ns, max_chunks, by_age):
    store = build(tmp_path_factory.mktemp("s"), seed)
    try:
        rows = {r.key: r for r in store.iter_rows()}
        if by_age:
            times = sorted(r.last_access_at for r in rows.values())
            selection = EvictionSelection(namespace=ns, accessed_before=times[int(share * (len(times) - 1))],
                                          max_chunks=max_chunks)
        else:
            selection = EvictionSelection(namespace=ns, bytes_to_free=int(share * store.stored_bytes(ns)),
                                          max_chunks=max_chunks)
        plan = store.plan_eviction(selection)
        assert list(plan.keys) == model_plan(rows, selection)
        assert {r.key: r for r in store.iter_rows()} == rows  # a plan changes nothing
        done = store.evict(plan)
        assert done is plan  # nothing changed in between: exactly the plan
        assert not any(store.exists(list(plan.keys)))
        assert not any(store.payloads.path_for(k).exists() for k in plan.keys)
        assert store.stats().evictions == plan.num_chunks
    finally:
        store.close()


def test_a_stale_plan_is_made_again_under_the_writer_lock(tmp_path):
    pages = chain_pages(TINY, list(range(P * 4)))
    with ChunkStore(tmp_path / "s", TINY) as store:
        store.put(pages[:3], kv_pages(TINY, 3))
        plan = store.plan_eviction(EvictionSelection(bytes_to_free=1))
        assert plan.keys == (pages[2].key,)
        store.put(pages[3:], kv_pages(TINY, 1, seed=4))  # the planned leaf is a parent now
        done = store.evict(plan)
        assert done.keys == (pages[3].key,)  # never the parent: no hole
        assert store.longest_prefix([p.key for p in pages]) == 3
        store.pin([pages[2].key])
        plan = store.plan_eviction(EvictionSelection(bytes_to_free=1))
        assert plan.keys == ()
        store.unpin([pages[2].key])
        assert store.evict(plan).keys == (pages[2].key,)  # the unpin changed the store: planned again


def test_key_selection_keeps_pinned_chunks_and_their_ancestors(tmp_path):
    pages = chain_pages(TINY, list(range(P * 6)))
    with ChunkStore(tmp_path / "s", TINY) as store:
        store.put(pages, kv_pages(TINY, 6))
        store.pin([pages[4].key])
        with pytest.raises(StrandedDescendantsError, match="descendants"):
            store.plan_eviction(EvictionSelection(key=pages[1].key))
        plan = store.plan_eviction(EvictionSelection(key=pages[1].key, descendants=True))
        assert plan.keys == (pages[5].key,) and plan.skipped_pinned == 4
        partial = store.plan_eviction(EvictionSelection(key=pages[0].key, descendants=True, max_chunks=2))
        assert not partial.is_complete and partial.keys == (pages[5].key,)
        with pytest.raises(ChunkNotStoredError):
            store.plan_eviction(EvictionSelection(key=b"\0" * 32))
        store.unpin([pages[4].key])
        done = store.evict(store.plan_eviction(EvictionSelection(key=pages[3].key, descendants=True)))
        assert done.keys == (pages[5].key, pages[4].key, pages[3].key)
        assert store.longest_prefix([p.key for p in pages]) == 3
        assert store.stats().evictions == 3


def test_max_chunks_cuts_a_plan_short(tmp_path):
    store = build(tmp_path / "s", 5)
    try:
        plan = store.plan_eviction(EvictionSelection(namespace="b", max_chunks=2))
        assert plan.num_chunks == 2 and not plan.is_complete
        whole = store.plan_eviction(EvictionSelection(namespace="b"))
        assert whole.is_complete and whole.keys[:2] == plan.keys
        assert all(not v.pinned and v.namespace == "b" for v in whole.victims)
    finally:
        store.close()


def test_a_selection_that_mixes_key_with_the_others_is_refused():
    with pytest.raises(ValueError, match="key selects"):
        EvictionSelection(key=b"\1" * 32, bytes_to_free=10)
    with pytest.raises(ValueError, match="descendants needs a key"):
        EvictionSelection(descendants=True)


def test_bulk_eviction_follows_the_plan_order(tmp_path):
    store = build(tmp_path / "s", 11)
    try:
        rows = {r.key: r for r in store.iter_rows()}
        want = store.stored_bytes() // 2
        expected = model_plan(rows, EvictionSelection(bytes_to_free=want))
        assert list(evict_bytes(store, want).keys) == expected
    finally:
        store.close()
