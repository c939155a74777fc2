"""Unit tests of the radix tree (chunkstore/cache/radix.py): matching, insert, split, locks, eviction, keys."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from chunkstore.cache.radix import RadixNode, RadixTree
from chunkstore.cache.radix_policy import EvictionPolicy
from chunkstore.disk.identity import ModelIdentity
from chunkstore.disk.keys import DEFAULT_NAMESPACE, chain_pages, root_key

IDENT = ModelIdentity("radix-test", "bfloat16", num_layers=2, num_kv_heads=2, head_dim=8, page_size=4)
P = IDENT.page_size


def toks(*pages: int, extra: int = 0) -> list[int]:
    """Whole pages whose tokens are all ``page`` (page 7 -> 7 7 7 7), then ``extra`` odd tokens."""
    return [p for p in pages for _ in range(P)] + [999] * extra


def slots(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def as_list(t: torch.Tensor | None) -> list[int] | None:
    return None if t is None else t.tolist()


def dump(tree: RadixTree) -> list[tuple]:
    """Shape and residency of the tree (not locks, hits or access times)."""
    return [
        (n.namespace, tree.prefix_tokens(n), n.keys, n.parent_key, as_list(n.device_slots),
         as_list(n.host_slots), n.persisted, sorted(n.children))
        for n in tree.iter_nodes()
    ]


@pytest.fixture
def tree() -> RadixTree:
    return RadixTree(IDENT)


def test_match_on_empty_tree(tree):
    m = tree.match_prefix(toks(1, 2, 3))
    assert m.num_pages == m.num_tokens == m.num_device_tokens == m.num_host_tokens == 0
    assert m.device_slots.dtype == torch.int64 and len(m.device_slots) == len(m.host_slots) == 0
    assert m.last_key == m.root_key == root_key(IDENT, DEFAULT_NAMESPACE)
    assert m.last_node is None and m.handle is not None and m.handle.node is None
    tree.unlock(m.handle)
    assert tree.namespaces() == [] and dump(tree) == []  # the lookup created no root


def test_partial_page_ignored(tree):
    r = tree.insert(toks(1, 2, extra=3), device_slots=slots(10, 11))
    assert r.num_pages == 2 and r.num_new_pages == 2
    with pytest.raises(ValueError, match="one per full page"):
        tree.insert(toks(1, 2, extra=3), device_slots=slots(10, 11, 12))
    m = tree.match_prefix(toks(1, 2, extra=3))
    assert m.num_device_tokens == 2 * P and m.device_slots.tolist() == [10, 11]
    assert m.token_ids == tuple(toks(1, 2))
    tree.unlock(m.handle)
    assert tree.insert(toks(extra=3), device_slots=slots()).num_pages == 0  # under one page: nothing


def test_match_ending_mid_node_does_not_split(tree):
    tree.insert(toks(1, 2, 3, 4), device_slots=slots(0, 1, 2, 3))
    before = dump(tree)
    ends_inside = tree.match_prefix(toks(1, 2, extra=2))
    diverges = tree.match_prefix(toks(1, 2, 9, 4))
    for m in (ends_inside, diverges):
        assert m.num_device_pages == 2 and m.device_slots.tolist() == [0, 1]
        assert m.last_node_pages == 2 and m.last_node.num_pages == 4
        assert m.last_key == m.last_node.keys[1]
    assert dump(tree) == before and tree.stats().num_nodes == 1
    node = ends_inside.last_node
    assert node.lock_ref == 2 and node.hit_count == 2
    tree.unlock(ends_inside.handle)
    tree.unlock(diverges.handle)
    peek = tree.peek_prefix(toks(1, 2, 3, 4))
    assert peek.handle is None and peek.num_device_pages == 4
    assert node.lock_ref == 0 and node.hit_count == 2 and dump(tree) == before  # peek changed nothing


def test_insert_dedup_returns_unneeded_slots(tree):
    tree.insert(toks(1, 2, 3, 4), device_slots=slots(0, 1, 2, 3))
    r = tree.insert(toks(1, 2, 3, 4), device_slots=slots(10, 11, 12, 13))
    assert r.unneeded_device_slots.tolist() == [10, 11, 12, 13] and r.num_new_pages == 0
    r = tree.insert(toks(1, 2, 3, 4), device_slots=slots(0, 1, 2, 3))
    assert r.unneeded_device_slots.tolist() == []  # the slots the pages already hold are not "unneeded"
    r = tree.insert(toks(1, 2, 7, 8), device_slots=slots(20, 21, 22, 23))
    assert r.unneeded_device_slots.tolist() == [20, 21] and r.num_new_pages == 2
    assert r.last_node.device_slots.tolist() == [22, 23]
    assert tree.stats().device_pages == 6 and tree.stats().num_nodes == 3  # split at the divergence


def test_insert_fills_missing_residency(tree):
    r = tree.insert(toks(1, 2, 3, 4), host_slots=slots(40, 41, 42, 43))
    node = r.last_node
    tree.set_host_slots(node, None)  # persisted=False, no device: the node goes away
    assert dump(tree) == []
    tree.insert(toks(1, 2, 3, 4), device_slots=slots(0, 1, 2, 3), host_slots=slots(40, 41, 42, 43))
    node = tree.match_prefix(toks(1)).last_node
    tree.set_device_slots(node, None)  # lost its device copy, keeps the host one
    r = tree.insert(toks(1, 2, 3, 4), device_slots=slots(30, 31, 32, 33), host_slots=slots(50, 51, 52, 53))
    assert r.unneeded_device_slots.tolist() == [] and r.unneeded_host_slots.tolist() == [50, 51, 52, 53]
    assert node.device_slots.tolist() == [30, 31, 32, 33]


def test_insert_filling_part_of_a_node_splits_it(tree):
    tree.insert(toks(1, 2, 3, 4), host_slots=slots(40, 41, 42, 43))
    r = tree.insert(toks(1, 2), device_slots=slots(0, 1))
    assert r.unneeded_device_slots.tolist() == [] and r.last_node.num_pages == 2
    m = tree.match_prefix(toks(1, 2, 3, 4))
    assert m.device_slots.tolist() == [0, 1] and m.host_slots.tolist() == [42, 43]
    assert m.num_device_tokens == 2 * P and m.num_host_tokens == 2 * P
    tree.unlock(m.handle)
    before = dump(tree)
    r = tree.insert(toks(1, 2, 3), host_slots=slots(60, 61, 62))  # all present: dedup, no split
    assert r.unneeded_host_slots.tolist() == [60, 61, 62] and r.last_node_pages == 1 and dump(tree) == before


def test_split_keeps_keys_and_slots_aligned(tree):
    r = tree.insert(toks(1, 2, 3, 4, 5), device_slots=slots(0, 1, 2, 3, 4), host_slots=slots(9, 8, 7, 6, 5))
    node = r.last_node
    pages_before, stats_before = node.pages(), tree.stats()
    upper = tree.split(node, 2)
    assert node.parent is upper and upper.num_pages == 2 and node.num_pages == 3
    assert upper.pages() + node.pages() == pages_before
    assert node.parent_key == upper.keys[-1] and upper.parent_key == root_key(IDENT, DEFAULT_NAMESPACE)
    assert upper.device_slots.tolist() + node.device_slots.tolist() == [0, 1, 2, 3, 4]
    assert upper.host_slots.tolist() + node.host_slots.tolist() == [9, 8, 7, 6, 5]
    assert tree.stats() == dataclasses.replace(stats_before, num_nodes=stats_before.num_nodes + 1)
    handle = tree.lock_node(node)  # a split of a locked node keeps both halves locked
    lower = tree.split(node, 1).children[tuple(toks(4))]
    assert lower is node and node.parent.lock_ref == upper.lock_ref == node.lock_ref == 1
    tree.unlock(handle)
    assert upper.lock_ref == node.parent.lock_ref == node.lock_ref == 0 and tree.stats().locked_device_pages == 0
    for bad in (0, 2, -1):
        with pytest.raises(ValueError, match="split point"):
            tree.split(node, bad)
    with pytest.raises(ValueError, match="root"):
        tree.split(tree.root(), 1)


def test_namespaces_are_isolated(tree):
    a = tree.insert(toks(1, 2), "alice", device_slots=slots(0, 1))
    b = tree.insert(toks(1, 2), "bob", device_slots=slots(2, 3))
    assert a.last_node is not b.last_node and set(a.keys).isdisjoint(b.keys)
    assert tree.namespaces() == ["alice", "bob"]
    m = tree.match_prefix(toks(1, 2), "carol")
    assert m.num_pages == 0 and m.last_key == root_key(IDENT, "carol")
    mb = tree.match_prefix(toks(1, 2), "bob")
    assert mb.device_slots.tolist() == [2, 3] and a.last_node.lock_ref == 0
    tree.unlock(mb.handle)
    tree.set_device_slots(a.last_node, None)
    assert tree.namespaces() == ["bob"] and [n.namespace for n in tree.iter_nodes()] == ["bob"]
    with pytest.raises(TypeError, match="namespace"):
        tree.insert(toks(1), 7, device_slots=slots(0))


def test_lock_unlock_refcounts_up_to_the_root(tree):
    tree.insert(toks(1, 2), device_slots=slots(0, 1))
    tree.insert(toks(1, 2, 3), device_slots=slots(0, 1, 2))
    tree.insert(toks(1, 2, 3, 4, 5), host_slots=slots(10, 11, 12, 13, 14))
    a, b, c = list(tree.iter_nodes())
    assert (a.num_pages, b.num_pages, c.num_pages) == (2, 1, 2) and c.parent is b and b.parent is a
    deep = tree.match_prefix(toks(1, 2, 3, 4, 5))
    assert deep.device_slots.tolist() == [0, 1, 2] and deep.host_slots.tolist() == [13, 14]
    shallow = tree.match_prefix(toks(1, 2))
    assert (a.lock_ref, b.lock_ref, c.lock_ref, tree.root().lock_ref) == (2, 1, 1, 0)
    s = tree.stats()
    locked = (s.locked_device_pages, s.locked_host_pages, s.evictable_device_pages, s.evictable_host_pages)
    assert locked == (3, 2, 0, 3)  # a lock keeps host copies only where there is no device copy (c)
    tree.unlock(deep.handle)
    assert (a.lock_ref, b.lock_ref, c.lock_ref) == (1, 0, 0)
    assert tree.stats().locked_device_pages == 2 and tree.stats().locked_host_pages == 0
    tree.unlock(shallow.handle)
    assert (a.lock_ref, b.lock_ref, c.lock_ref) == (0, 0, 0) and tree.stats().evictable_host_pages == 5
    with pytest.raises(ValueError, match="already released"):
        tree.unlock(shallow.handle)
    handle = tree.lock_node(b)
    assert (a.lock_ref, b.lock_ref, c.lock_ref) == (1, 1, 0)
    tree.unlock(handle)


def test_locked_nodes_are_never_evicted(tree):
    tree.insert(toks(1, 2), device_slots=slots(0, 1))
    tree.insert(toks(3, 4), device_slots=slots(2, 3))
    m = tree.match_prefix(toks(1, 2))
    seen: list[RadixNode] = []
    assert tree.evict_device(100, on_evict=seen.append) == 2
    assert [n.token_ids for n in seen] == [tuple(toks(3, 4))]
    assert m.last_node.device_slots.tolist() == [0, 1] and tree.evictable_device_leaves() == []
    tree.set_device_slots(m.last_node, None)  # a locked node keeps its place without a copy...
    assert m.last_node.parent is not None and tree.stats().num_nodes == 1
    tree.unlock(m.handle)  # ...and goes with its last lock
    assert m.last_node.parent is None and tree.stats().num_nodes == 0 and tree.namespaces() == []


def test_a_locked_ancestor_stays_when_its_descendants_go(tree):
    tree.insert(toks(1, 2, 3), device_slots=slots(0, 1, 2), host_slots=slots(3, 4, 5))
    upper = tree.split(tree.peek_prefix(toks(1)).last_node, 1)
    handle = tree.lock_node(upper)
    assert tree.evict_device(100) == 2
    assert upper.device_slots.tolist() == [0] and upper.host_slots.tolist() == [3]
    tree.set_device_slots(upper, None)  # a locked node's residency changes move the locked counters too
    s = tree.stats()
    assert (s.locked_device_pages, s.locked_host_pages, s.device_pages, s.evictable_host_pages) == (0, 1, 0, 2)
    assert tree.evict_host(100) == 2 and upper.host_slots.tolist() == [3] and not upper.children
    tree.set_device_slots(upper, slots(7))  # on the device again: its host copy is a spare
    s = tree.stats()
    assert (s.locked_device_pages, s.locked_host_pages, s.evictable_device_pages, s.evictable_host_pages) == \
        (1, 0, 0, 1)
    tree.unlock(handle)
    assert tree.stats().evictable_device_pages == 1 and tree.stats().locked_host_pages == 0


def test_a_lock_keeps_the_device_copy_and_a_host_copy_only_when_it_is_the_only_one(tree):
    # The holder of a hit reads its device pages; the host copy of a locked page that is on the
    # device too is a spare, and keeping it would fill the host pool with the running requests'
    # prefixes (leaving no room to prefetch for the queued ones).
    tree.insert(toks(1, 2), device_slots=slots(0, 1), host_slots=slots(5, 6))
    tree.insert(toks(3), host_slots=slots(7))
    both, host_only = tree.match_prefix(toks(1, 2)), tree.match_prefix(toks(3))
    assert [n.token_ids for n in tree.evictable_host_leaves()] == [tuple(toks(1, 2))]
    assert tree.evictable_device_leaves() == []
    seen: list[RadixNode] = []
    assert tree.evict_host(100, on_evict=seen.append) == 2 and seen == [both.last_node]
    assert both.last_node.device_slots.tolist() == [0, 1] and both.last_node.host_slots is None
    assert host_only.last_node.host_slots.tolist() == [7]
    assert tree.evict_device(100) == 0 and tree.evict_host(100) == 0
    s = tree.stats()
    assert (s.locked_device_pages, s.locked_host_pages, s.evictable_host_pages) == (2, 1, 0)
    tree.unlock(both.handle)
    tree.unlock(host_only.handle)
    assert tree.evict_device(100) == 2 and tree.evict_host(100) == 1 and tree.stats().num_nodes == 0


def test_descendants_are_evicted_before_ancestors(tree):
    tree.insert(toks(1, 2, 3), device_slots=slots(0, 1, 2))
    tree.insert(toks(1, 2, 5), device_slots=slots(0, 1, 5))
    tree.insert(toks(1, 6), device_slots=slots(0, 6))
    for n in tree.iter_nodes():
        n.last_access = -n.num_tokens if n.children else 100  # by LRU alone the ancestors would go first
    order: list[tuple[int, ...]] = []

    def on_evict(node: RadixNode) -> None:
        below = list(_subtree(node))[1:]
        assert node.device_slots is not None and not any(d.on_device for d in below)
        order.append(tree.prefix_tokens(node))

    assert tree.evict_device(100, on_evict=on_evict) == 5
    assert order.index(tuple(toks(1, 2))) > max(order.index(tuple(toks(1, 2, 3))), order.index(tuple(toks(1, 2, 5))))
    assert order[-1] == tuple(toks(1)) and dump(tree) == []


def _subtree(node: RadixNode):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(n.children.values())


def test_lru_and_lfu_orders(tree):
    for page, slot in ((1, 0), (2, 1), (3, 2)):
        tree.insert(toks(page), device_slots=slots(slot))
    for page in (1, 1, 1, 2):  # page 1: three hits, then page 2: one, the latest; page 3: none
        tree.unlock(tree.match_prefix(toks(page)).handle)

    def order(policy) -> list[int]:
        return [n.token_ids[0] for n in tree.evictable_device_leaves(policy)]

    assert order(EvictionPolicy.LRU) == [3, 1, 2]
    assert order(EvictionPolicy.LFU) == [3, 2, 1]
    evicted: list[int] = []
    assert tree.evict_device(2, "LFU", on_evict=lambda n: evicted.append(n.token_ids[0])) == 2
    assert evicted == [3, 2]


def test_eviction_policy_parse_lists_valid_values():
    assert EvictionPolicy.parse(" LFU ") is EvictionPolicy.LFU and EvictionPolicy.parse("lru") is EvictionPolicy.LRU
    with pytest.raises(ValueError, match="lru, lfu"):
        EvictionPolicy.parse("mru")
    with pytest.raises(ValueError, match="lru, lfu"):
        RadixTree(IDENT, policy="fifo")
    assert RadixTree(IDENT, policy="lfu").policy is EvictionPolicy.LFU


def test_eviction_stops_within_one_node(tree):
    for page in range(4):
        tree.insert(toks(page, 10, 11), device_slots=slots(3 * page, 3 * page + 1, 3 * page + 2))
    assert tree.evict_device(0) == 0
    assert tree.evict_device(4) == 6 and tree.stats().device_pages == 6
    assert tree.evict_device(1) == 3 and tree.evict_device(100) == 3 and tree.stats().device_pages == 0


def test_on_evict_sees_the_slots_and_may_refuse(tree):
    tree.insert(toks(1, 2), device_slots=slots(5, 6), host_slots=slots(7, 8))

    def refuse(node: RadixNode) -> None:
        assert node.device_slots.tolist() == [5, 6]
        raise RuntimeError("backup failed")

    with pytest.raises(RuntimeError):
        tree.evict_device(1, on_evict=refuse)
    node = tree.match_prefix(toks(1, 2)).last_node
    assert node.device_slots.tolist() == [5, 6] and tree.stats().device_pages == 2


def test_nodes_removed_only_when_no_copy_anywhere(tree):
    r = tree.insert(toks(1, 2), device_slots=slots(0, 1), host_slots=slots(2, 3), persisted=True)
    node = r.last_node
    assert tree.set_device_slots(node, None).tolist() == [0, 1] and node.parent is not None
    tree.evict_host(10)
    assert node.parent is not None and node.persisted and not node.on_host
    s = tree.stats()
    assert (s.device_pages, s.host_pages, s.persisted_pages, s.num_nodes) == (0, 0, 2, 1)
    m = tree.match_prefix(toks(1, 2))
    assert m.num_pages == 0 and m.last_key == root_key(IDENT, DEFAULT_NAMESPACE)  # the disk part is the cache's
    tree.mark_persisted(node, False)
    assert node.parent is None and dump(tree) == [] and tree.stats().persisted_pages == 0
    with pytest.raises(ValueError, match="no longer in the tree"):
        tree.set_device_slots(node, slots(0, 1))


def test_an_empty_node_with_children_stays_as_the_path(tree):
    tree.insert(toks(1, 2), host_slots=slots(0, 1))
    leaf = tree.insert(toks(1, 2, 3), device_slots=slots(9, 9, 2)).last_node
    upper = leaf.parent
    tree.set_host_slots(upper, None)
    tree.set_device_slots(upper, None)
    assert upper.parent is not None and not upper.has_copy  # its child still holds a copy
    m = tree.match_prefix(toks(1, 2, 3))
    assert m.num_pages == 0  # a gap: pages after it are useless until the gap is filled again
    tree.unlock(m.handle)
    tree.evict_device(1)
    assert dump(tree) == [] and tree.namespaces() == []


def test_match_reports_device_then_host_and_stops_at_a_gap(tree):
    tree.insert(toks(1, 2, 3, 4), device_slots=slots(0, 1, 2, 3), host_slots=slots(10, 11, 12, 13))
    node = tree.peek_prefix(toks(1)).last_node
    first, second, third = tree.split(node, 1), tree.split(node, 1), tree.split(node, 1)
    tree.set_device_slots(third, None)
    tree.set_device_slots(second, None)  # device: pages 1 and 4; host: pages 1-4
    tree.set_host_slots(node, None)  # page 4 on device only, after host-only pages: not usable
    m = tree.match_prefix(toks(1, 2, 3, 4))
    assert m.device_slots.tolist() == [0] and m.host_slots.tolist() == [11, 12]
    assert m.num_pages == 3 and m.last_node is third and m.last_node_pages == 1
    assert (first.lock_ref, second.lock_ref, third.lock_ref, node.lock_ref) == (1, 1, 1, 0)
    assert [p.key for p in m.device_pages()] == list(m.keys[:1]) and len(m.host_pages()) == 2


def test_chunk_keys_equal_chain_pages(tree):
    g = torch.Generator().manual_seed(3)
    base = torch.randint(0, 50_000, (9 * P,), generator=g)
    branch = torch.cat([base[: 5 * P], torch.randint(0, 50_000, (3 * P + 2,), generator=g)])
    tree.insert(base, "ns", device_slots=torch.arange(9))  # a tensor of token ids works too
    r = tree.insert(branch, "ns", host_slots=torch.arange(8))
    assert list(r.keys) == [p.key for p in chain_pages(IDENT, branch.tolist(), "ns")]
    for tokens in (base, branch):
        m = tree.match_prefix(tokens.tolist(), "ns")
        expected = chain_pages(IDENT, tokens.tolist(), "ns")
        assert m.pages() == expected[: m.num_pages] and m.num_pages == len(expected)
        tree.unlock(m.handle)
    for node in tree.iter_nodes():
        full = chain_pages(IDENT, tree.prefix_tokens(node), "ns")
        assert node.pages() == full[-node.num_pages :]
    request = base[: 6 * P].tolist() + [1] * (2 * P)
    m = tree.match_prefix(request, "ns")
    rest = chain_pages(IDENT, request[m.num_tokens :], "ns", parent_key=m.last_key)  # how the cache goes on to disk
    assert m.num_pages == 6 and rest == chain_pages(IDENT, request, "ns")[6:]


def test_insert_rejects_bad_input_before_changing_anything(tree):
    tree.insert(toks(1, 2), host_slots=slots(0, 1))
    before = dump(tree)
    with pytest.raises(TypeError, match="int64"):
        tree.insert(toks(1, 2), device_slots=torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="needs a copy"):
        tree.insert(toks(1, 2))
    with pytest.raises(ValueError):
        tree.insert(toks(1, 2) + [-1] * P, device_slots=slots(5, 6, 7))  # the new page's id is invalid
    with pytest.raises(ValueError):
        tree.set_host_slots(tree.root(), slots())
    assert dump(tree) == before


def test_results_do_not_alias_the_tree(tree):
    given = slots(0, 1)
    tree.insert(toks(1, 2), device_slots=given)
    given[0] = 77
    m = tree.match_prefix(toks(1, 2))
    m.device_slots[1] = 88
    assert m.last_node.device_slots.tolist() == [0, 1]
