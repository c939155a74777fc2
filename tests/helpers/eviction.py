"""Helpers of the eviction and index tests (tests/test_store_eviction.py, tests/test_shared_contract.py,
tests/test_index_browse.py): a store filled with branching prefixes, a forest of rows, chunks'
access times set through an index of the test's own, a plain model of the eviction rule and the
selections the property tests draw."""

from __future__ import annotations

import random
from collections.abc import Callable

from chunkstore import ChunkStore, chain_pages
from chunkstore.disk.eviction import EvictionSelection
from chunkstore.disk.index import ChunkIndex, ChunkRow
from tests.helpers import TINY, kv_pages

P = TINY.page_size
ROOT = b"\xff" * 32  # the parent of a forest's first rows (not stored)


def make_rows(seed: int, n: int) -> list[ChunkRow]:
    """A forest: each row extends an earlier one of its namespace or starts at the root; access
    times drawn from 51 values (so many ties), one row in five pinned."""
    rng = random.Random(seed)
    rows: list[ChunkRow] = []
    for _ in range(n):
        ns = rng.choice(["a", "b", "c"])
        earlier = [r.key for r in rows if r.namespace == ns]
        parent = rng.choice(earlier) if earlier and rng.random() < 0.7 else ROOT
        rows.append(ChunkRow(key=rng.randbytes(32), parent_key=parent, namespace=ns, num_tokens=4,
                             raw_bytes=1024, stored_bytes=rng.randint(500, 520), created_at=float(rng.randint(0, 50)),
                             last_access_at=float(rng.randint(0, 50)), hit_count=rng.randint(0, 5),
                             pinned=rng.random() < 0.2))
    return rows


def set_access_times(index_url: str, times: dict[bytes, float]) -> None:
    """Give chunks distinct access times through an index of the test's own on ``index_url``."""
    index = ChunkIndex(index_url)
    try:
        for key, t in times.items():
            index.touch([key], now=t)
        index.flush()
    finally:
        index.close()


def fill_branches(store: ChunkStore, seed: int, touch: Callable[[dict[bytes, float]], None]) -> ChunkStore:
    """Branching prefixes in two namespaces on ``store`` (of TINY), each chunk with its own access
    time (given through ``touch``), one pinned."""
    rng = random.Random(seed)
    keys = []
    for branch in range(6):
        ns = "a" if branch % 2 else "b"
        tokens = list(range(P * 2)) + [10_000 * (branch + 1) + i for i in range(P * rng.randint(1, 3))]
        pages = chain_pages(TINY, tokens, ns)
        store.put(pages, kv_pages(TINY, len(pages), seed=branch))
        keys += [p.key for p in pages]
    keys = list(dict.fromkeys(keys))
    touch({key: 2e9 + i for i, key in enumerate(rng.sample(keys, len(keys)))})
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


def drawn_selection(store: ChunkStore, rows: dict[bytes, ChunkRow], share: float, ns: str | None,
                    max_chunks: int | None, by_age: bool) -> EvictionSelection:
    """The selection a property test's draw names: by age (the access time ``share`` of the way
    through the rows') or by bytes (``share`` of the namespace's stored bytes)."""
    if by_age:
        times = sorted(r.last_access_at for r in rows.values())
        return EvictionSelection(namespace=ns, accessed_before=times[int(share * (len(times) - 1))],
                                 max_chunks=max_chunks)
    return EvictionSelection(namespace=ns, bytes_to_free=int(share * store.stored_bytes(ns)), max_chunks=max_chunks)


def assert_plan_is_the_rule(store: ChunkStore, rows: dict[bytes, ChunkRow], selection: EvictionSelection):
    """Plan ``selection`` on ``store`` (whose rows are ``rows``): the plan must be what model_plan
    takes, and planning must change no row. Returns the plan."""
    plan = store.plan_eviction(selection)
    assert list(plan.keys) == model_plan(rows, selection)
    assert {r.key: r for r in store.iter_rows()} == rows  # a plan changes nothing
    return plan


def check_a_stale_plan_is_planned_again(planner: ChunkStore, changer: ChunkStore) -> None:
    """``planner`` plans an eviction, then ``changer`` (the same store, or another server's on the
    same tier) changes what it planned: the planned leaf becomes a parent, then a pin and an unpin.
    Each evict of the stale plan plans again: never a parent (no hole), and again after the unpin."""
    pages = chain_pages(TINY, list(range(P * 4)))
    planner.put(pages[:3], kv_pages(TINY, 3))
    plan = planner.plan_eviction(EvictionSelection(bytes_to_free=1))
    assert plan.keys == (pages[2].key,)
    changer.put(pages[3:], kv_pages(TINY, 1, seed=4))  # the planned leaf is a parent now
    done = planner.evict(plan)
    assert done.keys == (pages[3].key,)  # never the parent: no hole
    assert changer.longest_prefix([p.key for p in pages]) == 3
    changer.pin([pages[2].key])
    plan = planner.plan_eviction(EvictionSelection(bytes_to_free=1))
    assert plan.keys == ()
    changer.unpin([pages[2].key])
    assert planner.evict(plan).keys == (pages[2].key,)  # the unpin changed the store: planned again
