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
from sqlalchemy import event

from chunkstore import ChunkStore, chain_pages
from chunkstore.disk import eviction as planner
from chunkstore.disk.eviction import ChunkNotStoredError, EvictionSelection, ScanSizes, StrandedDescendantsError
from chunkstore.disk.index import ChunkIndex, sqlite_url
from chunkstore.disk.maintenance import evict_bytes
from tests.helpers import TINY, eviction, kv_pages
from tests.helpers.eviction import (assert_plan_is_the_rule, check_a_stale_plan_is_planned_again, drawn_selection,
                                    fill_branches, make_rows, model_plan)

P = TINY.page_size


def set_access_times(root, times: dict[bytes, float]) -> None:
    """Give chunks distinct access times through an index of the test's own on the store's file."""
    eviction.set_access_times(sqlite_url(root), times)


def build(root, seed: int) -> ChunkStore:
    """Branching prefixes in two namespaces, each chunk with its own access time, one pinned."""
    return fill_branches(ChunkStore(root, TINY), seed, lambda times: set_access_times(root, times))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), share=st.floats(0.05, 1.0), ns=st.sampled_from([None, "a"]),
       max_chunks=st.sampled_from([None, 3]), by_age=st.booleans())
def test_a_plan_is_what_the_rule_takes_and_changes_nothing(tmp_path_factory, seed, share, ns, max_chunks, by_age):
    store = build(tmp_path_factory.mktemp("s"), seed)
    try:
        rows = {r.key: r for r in store.iter_rows()}
        selection = drawn_selection(store, rows, share, ns, max_chunks, by_age)
        plan = assert_plan_is_the_rule(store, rows, selection)
        done = store.evict(plan)
        assert done is plan  # nothing changed in between: exactly the plan
        assert not any(store.exists(list(plan.keys)))
        assert not any(store.payloads.path_for(k).exists() for k in plan.keys)
        assert store.stats().evictions == plan.num_chunks
    finally:
        store.close()


def test_a_stale_plan_is_made_again_under_the_writer_lock(tmp_path):
    with ChunkStore(tmp_path / "s", TINY) as store:
        check_a_stale_plan_is_planned_again(store, store)


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


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_plan_read_in_small_batches_and_counted_in_parallel_is_the_rule(tmp_path, request, backend):
    """The planner's scan in batches of a few rows (so parents arrive before, among and after their
    children, access-time ties split across batches) and its children counted on other
    connections from the first chunks on: every plan is what the model takes, whatever the sizes."""
    url = request.getfixturevalue("postgres_url") if backend == "postgresql" else sqlite_url(tmp_path)
    rng = random.Random(5)
    index = ChunkIndex(url)
    try:
        for seed in range(3):
            rows = make_rows(seed, 150)
            index.insert(rows)
            by_key = {r.key: r for r in rows}
            for _ in range(12):
                ns = rng.choice([None, "a", "b"])
                times = sorted(r.last_access_at for r in rows)
                selection = rng.choice([
                    EvictionSelection(namespace=ns, max_chunks=rng.choice([None, 1, 7, 40])),
                    EvictionSelection(namespace=ns, accessed_before=rng.choice(times)),
                    EvictionSelection(namespace=ns, bytes_to_free=rng.randint(0, 40_000))])
                sizes = ScanSizes(first_rows=rng.randint(1, 4), max_rows=rng.randint(4, 16),
                                  parallel_from=rng.choice([0, 3, 10_000]), in_flight=rng.randint(1, 3))
                plan = planner.plan(index, selection, generation=0, scan=sizes)
                assert list(plan.keys) == model_plan(by_key, selection), (selection, sizes)
            index.delete([r.key for r in rows])
    finally:
        index.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_plan_of_whole_chains_reads_their_rows_in_a_few_queries(tmp_path, request, backend):
    """Planning reads the rows in one scan by last access, in batches that grow, and never asks
    for a parent again: at millions of rows a round trip per chunk made a plan of 1% of them take
    minutes (86 queries here), and reading each batch's lineage after its leaves took 6."""
    opened: list[ChunkIndex] = []

    def recording_index(*args, **kwargs) -> ChunkIndex:
        opened.append(ChunkIndex(*args, **kwargs))
        return opened[-1]

    url = request.getfixturevalue("postgres_url") if backend == "postgresql" else None
    chains = [chain_pages(TINY, [10_000 * (c + 1) + i for i in range(P * 8)]) for c in range(12)]
    with ChunkStore(tmp_path / "s", TINY, index_url=url, index_factory=recording_index) as store:
        for c, pages in enumerate(chains):
            store.put(pages, kv_pages(TINY, len(pages), seed=c))
        statements: list[str] = []

        def listener(conn, cursor, sql, params, context, executemany) -> None:
            if sql.lstrip().startswith(("SELECT", "WITH")):  # (not the counters a flush writes meanwhile)
                statements.append(sql)

        event.listen(opened[0].engine, "before_cursor_execute", listener)
        try:
            plan = store.plan_eviction(EvictionSelection())
        finally:
            event.remove(opened[0].engine, "before_cursor_execute", listener)
    assert sorted(plan.keys) == sorted(p.key for pages in chains for p in pages)
    order = {key: i for i, key in enumerate(plan.keys)}
    for pages in chains:  # descendants first, along every chain
        assert [order[p.key] for p in pages] == sorted((order[p.key] for p in pages), reverse=True)
    assert len(statements) == 1, statements  # the 96 rows, in the first batch
