"""The radix tree against a plain dict model, driven by a hypothesis state machine.

The model maps (namespace, prefix as a tuple of page ids) to that prefix's last page's residency:
its device slot, its host slot, whether it is persisted. Every slot handed to the tree is a fresh
number, so a page that comes back with another page's slot is caught. Rules: insert, match (random
or of an inserted prefix; locking, unlocking at once, or peeking), lock, unlock, evict_device,
evict_host, set or drop a tier's slots, punch a gap (drop a tier on a node whose child keeps it),
mark or unmark persisted, split. After every step: residency equals the model, counters equal a
recount, lock counts equal the live handles, eviction candidates are exactly the unlocked lowest
copies, no childless unlocked node lacks a copy, and every key is the chain's.
"""

from __future__ import annotations

import dataclasses

import torch
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from chunkstore.cache.radix import LockHandle, RadixNode, RadixTree
from chunkstore.cache.radix_policy import EvictionPolicy
from chunkstore.disk.identity import ModelIdentity
from chunkstore.disk.keys import chain_pages

IDENT = ModelIdentity("radix-state", "float16", num_layers=1, num_kv_heads=1, head_dim=4, page_size=2)
P = IDENT.page_size
NAMESPACES = ("a", "b")

page_ids = st.lists(st.integers(0, 2).map(lambda i: i // 2), max_size=6)  # pages 0 (mostly) and 1: deep shared paths
namespaces = st.sampled_from(NAMESPACES)


@dataclasses.dataclass
class Page:
    device: int | None = None
    host: int | None = None
    persisted: bool = False

    def has_copy(self) -> bool:
        return self.device is not None or self.host is not None or self.persisted


def tokens_of(pages: tuple[int, ...], extra: int = 0) -> list[int]:
    return [p for p in pages for _ in range(P)] + [7] * extra  # page p is (p, p); 7 starts no page


def pages_of(tree: RadixTree, node: RadixNode) -> list[tuple[int, ...]]:
    """The model keys (prefixes) of each of the node's pages."""
    ids = tuple(tree.prefix_tokens(node)[::P])
    first = len(ids) - node.num_pages
    return [ids[: first + i + 1] for i in range(node.num_pages)]


def kept_by_lock(node: RadixNode, tier: str) -> bool:
    """The model's rule: a lock keeps a node's device copy, and its host copy only while the node
    has no device copy (a host copy beside a device one is a spare)."""
    return node.lock_ref > 0 and (tier == "device" or node.device_slots is None)


def subtree(node: RadixNode):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(n.children.values())


class RadixMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tree = RadixTree(IDENT)
        self.model: dict[tuple[str, tuple[int, ...]], Page] = {}
        self.handles: list[LockHandle] = []
        self.next_slot = 0
        self.inserted: list[tuple[str, tuple[int, ...]]] = []  # so that matches often find something

    # -- helpers ------------------------------------------------------------------------------------

    def fresh(self, n: int) -> list[int]:
        self.next_slot += n
        return list(range(self.next_slot - n, self.next_slot))

    def page(self, ns: str, prefix: tuple[int, ...]) -> Page:
        return self.model.setdefault((ns, prefix), Page())

    def tidy(self) -> None:
        self.model = {k: v for k, v in self.model.items() if v.has_copy()}

    def nodes(self) -> list[RadixNode]:
        return sorted(self.tree.iter_nodes(), key=lambda n: n.id)

    def pick(self, index: int) -> RadixNode | None:
        """A node inside a path for even ``index`` (when there is one): clearing a tier there makes
        the gaps (a copy below a node without one) that random changes rarely reach."""
        nodes = self.nodes()
        inner = [n for n in nodes if n.children]
        choice = inner if inner and index % 2 == 0 else nodes
        return choice[index // 2 % len(choice)] if choice else None

    def model_pages(self, node: RadixNode) -> list[Page]:
        return [self.page(node.namespace, prefix) for prefix in pages_of(self.tree, node)]

    # -- rules --------------------------------------------------------------------------------------

    @initialize(ns=namespaces, ids=st.lists(st.integers(0, 1), min_size=6, max_size=6))
    def start(self, ns, ids):
        """A path of three nodes to begin with: gaps, splits and locks need depth."""
        for n in (2, 4, 6):
            self.insert(ns, ids[:n], 0, True, True, False)

    @rule(ns=namespaces, ids=page_ids, extra=st.integers(0, P - 1), device=st.booleans(),
          host=st.booleans(), persisted=st.booleans())
    def insert(self, ns, ids, extra, device, host, persisted):
        if not (device or host or persisted):
            device = True
        n = len(ids)
        dev, hst = (self.fresh(n) if device else None), (self.fresh(n) if host else None)
        result = self.tree.insert(tokens_of(tuple(ids), extra), ns, device_slots=dev, host_slots=hst,
                                  persisted=persisted)
        unneeded_dev, unneeded_host = [], []
        for i in range(n):
            page = self.page(ns, tuple(ids[: i + 1]))
            if dev is not None:
                if page.device is None:
                    page.device = dev[i]
                else:
                    unneeded_dev.append(dev[i])
            if hst is not None:
                if page.host is None:
                    page.host = hst[i]
                else:
                    unneeded_host.append(hst[i])
            page.persisted |= persisted
        self.tidy()
        self.inserted.append((ns, tuple(ids)))
        assert result.num_pages == n
        assert result.unneeded_device_slots.tolist() == unneeded_dev
        assert result.unneeded_host_slots.tolist() == unneeded_host
        assert list(result.keys) == [p.key for p in chain_pages(IDENT, tokens_of(tuple(ids)), ns)]

    @rule(ns=namespaces, ids=page_ids, extra=st.integers(0, P - 1), keep=st.booleans(), peek=st.booleans())
    def match(self, ns, ids, extra, keep, peek):
        expected_dev, expected_host = [], []
        for i in range(len(ids)):
            page = self.model.get((ns, tuple(ids[: i + 1])))
            if page is not None and not expected_host and page.device is not None:
                expected_dev.append(page.device)
            elif page is not None and page.host is not None:
                expected_host.append(page.host)
            else:
                break
        tokens = tokens_of(tuple(ids), extra)
        m = self.tree.peek_prefix(tokens, ns) if peek else self.tree.match_prefix(tokens, ns)
        assert m.device_slots.tolist() == expected_dev
        assert m.host_slots.tolist() == expected_host
        num = len(expected_dev) + len(expected_host)
        assert m.num_tokens == num * P and m.num_pages == num
        chain = chain_pages(IDENT, tokens_of(tuple(ids[:num])), ns)
        assert list(m.keys) == [p.key for p in chain]
        assert m.last_key == (chain[-1].key if chain else m.root_key)
        if peek:
            assert m.handle is None
        elif keep:
            self.handles.append(m.handle)
        else:
            self.tree.unlock(m.handle)

    @precondition(lambda self: self.inserted)
    @rule(index=st.integers(0, 100), cut=st.integers(0, 6), tail=page_ids, keep=st.booleans())
    def match_inserted(self, index, cut, tail, keep):
        ns, ids = self.inserted[index % len(self.inserted)]
        self.match(ns, list(ids[: len(ids) - cut]) + tail[: cut and len(tail)], 0, keep, False)

    @precondition(lambda self: self.handles)
    @rule(index=st.integers(0, 100))
    def unlock(self, index):
        self.tree.unlock(self.handles.pop(index % len(self.handles)))

    @rule(index=st.integers(0, 100))
    def lock(self, index):
        node = self.pick(index)
        if node is not None:
            self.handles.append(self.tree.lock_node(node))

    def _evict(self, tier: str, num_pages: int, policy: EvictionPolicy) -> None:
        seen: list[tuple[RadixNode, list[tuple[int, ...]], list[int]]] = []

        def on_evict(node: RadixNode) -> None:
            slots = node.device_slots if tier == "device" else node.host_slots
            assert slots is not None and not kept_by_lock(node, tier)
            below = list(subtree(node))[1:]
            assert all((d.device_slots if tier == "device" else d.host_slots) is None for d in below)
            seen.append((node, pages_of(self.tree, node), slots.tolist()))

        evict = self.tree.evict_device if tier == "device" else self.tree.evict_host
        evicted = evict(num_pages, policy, on_evict)
        assert evicted == sum(len(slots) for _, _, slots in seen)
        if num_pages <= 0:
            assert evicted == 0
        elif evicted >= num_pages:
            assert evicted - len(seen[-1][2]) < num_pages  # overshoot below one node's pages
        else:  # a copy no lock keeps stays only above one a lock keeps (on the host: a page of a
            # locked node has a spare host copy while a host-only page below it is kept)
            attr = f"{tier}_slots"
            for n in self.tree.iter_nodes():
                if getattr(n, attr) is not None and not kept_by_lock(n, tier):
                    assert any(getattr(d, attr) is not None and kept_by_lock(d, tier) for d in list(subtree(n))[1:])
        for node, prefixes, slots in seen:
            for prefix, slot in zip(prefixes, slots):
                page = self.model[(node.namespace, prefix)]
                assert getattr(page, tier) == slot
                setattr(page, tier, None)
        self.tidy()

    @rule(num_pages=st.integers(-1, 8), policy=st.sampled_from(EvictionPolicy))
    def evict_device(self, num_pages, policy):
        self._evict("device", num_pages, policy)

    @rule(num_pages=st.integers(-1, 8), policy=st.sampled_from(EvictionPolicy))
    def evict_host(self, num_pages, policy):
        self._evict("host", num_pages, policy)

    @rule(index=st.integers(0, 100), tier=st.sampled_from(["device", "host"]), clear=st.booleans())
    def set_slots(self, index, tier, clear):
        node = self.pick(index)
        if node is not None:
            self._set(node, tier, clear)

    def _set(self, node: RadixNode, tier: str, clear: bool) -> None:
        pages = self.model_pages(node)
        new = None if clear else self.fresh(node.num_pages)
        setter = self.tree.set_device_slots if tier == "device" else self.tree.set_host_slots
        previous = setter(node, None if new is None else torch.tensor(new, dtype=torch.int64))
        old = [getattr(p, tier) for p in pages]
        assert (previous.tolist() if previous is not None else [None] * len(pages)) == old
        for p, slot in zip(pages, new or [None] * len(pages)):
            setattr(p, tier, slot)
        self.tidy()

    @rule(index=st.integers(0, 100), tier=st.sampled_from(["device", "host"]))
    def punch_gap(self, index, tier):
        """Clear a tier on a node whose child keeps it: a copy below a node without one."""
        attr = f"{tier}_slots"
        nodes = [n for n in self.nodes() if getattr(n, attr) is not None
                 and any(getattr(c, attr) is not None for c in n.children.values())]
        if nodes:
            self._set(nodes[index % len(nodes)], tier, clear=True)

    @rule(index=st.integers(0, 100), persisted=st.booleans())
    def mark_persisted(self, index, persisted):
        node = self.pick(index)
        if node is None:
            return
        pages = self.model_pages(node)
        self.tree.mark_persisted(node, persisted)
        for p in pages:
            p.persisted = persisted
        self.tidy()

    @rule(index=st.integers(0, 100), at=st.integers(1, 5))
    def split(self, index, at):
        node = self.pick(index)
        if node is not None and at < node.num_pages:
            upper = self.tree.split(node, at)
            assert upper.num_pages == at and node.parent is upper

    # -- invariants ---------------------------------------------------------------------------------

    @invariant()
    def residency_matches_the_model(self):
        seen: dict[tuple[str, tuple[int, ...]], Page] = {}
        for node in self.tree.iter_nodes():
            dev = node.device_slots.tolist() if node.device_slots is not None else [None] * node.num_pages
            hst = node.host_slots.tolist() if node.host_slots is not None else [None] * node.num_pages
            for prefix, d, h in zip(pages_of(self.tree, node), dev, hst):
                page = Page(d, h, node.persisted)
                if page.has_copy():
                    seen[(node.namespace, prefix)] = page
        assert seen == self.model

    @invariant()
    def counters_equal_a_recount(self):
        nodes = list(self.tree.iter_nodes())
        tiers = ("device_slots", "host_slots")
        pages = {t: sum(n.num_pages for n in nodes if getattr(n, t) is not None) for t in tiers}
        locked = {t: sum(n.num_pages for n in nodes if getattr(n, t) is not None and kept_by_lock(n, t[:-6]))
                  for t in tiers}
        s = self.tree.stats()
        assert s.num_nodes == len(nodes) and s.num_namespaces == len(self.tree.namespaces())
        assert (s.device_pages, s.host_pages) == (pages["device_slots"], pages["host_slots"])
        assert (s.locked_device_pages, s.locked_host_pages) == (locked["device_slots"], locked["host_slots"])
        assert s.evictable_device_pages == pages["device_slots"] - locked["device_slots"]
        assert s.evictable_host_pages == pages["host_slots"] - locked["host_slots"]
        assert s.persisted_pages == sum(n.num_pages for n in nodes if n.persisted)

    @invariant()
    def locks_count_the_live_handles(self):
        expected: dict[int, int] = {}
        for handle in self.handles:
            n = handle.node
            assert n is None or n.parent is not None  # a locked node keeps its place
            while n is not None and n.parent is not None:
                expected[n.id] = expected.get(n.id, 0) + 1
                n = n.parent
        assert {n.id: n.lock_ref for n in self.tree.iter_nodes() if n.lock_ref} == expected

    @invariant()
    def no_node_without_a_copy_unless_it_is_a_path_or_locked(self):
        for node in self.tree.iter_nodes():
            assert node.has_copy or node.children or node.lock_ref, node
        for ns in self.tree.namespaces():
            assert self.tree.root(ns).children

    @invariant()
    def eviction_candidates_are_the_unlocked_lowest_copies(self):
        for attr, listed in (("device_slots", self.tree.evictable_device_leaves()),
                             ("host_slots", self.tree.evictable_host_leaves())):
            expected = {
                n.id for n in self.tree.iter_nodes()
                if getattr(n, attr) is not None and not kept_by_lock(n, attr[:-6])
                and all(getattr(d, attr) is None for d in list(subtree(n))[1:])
            }
            assert sorted(n.id for n in listed) == sorted(expected)

    @invariant()
    def keys_are_the_chain(self):
        for node in self.tree.iter_nodes():
            chain = chain_pages(IDENT, self.tree.prefix_tokens(node), node.namespace)
            assert node.keys == tuple(p.key for p in chain[-node.num_pages :])
            assert node.parent_key == node.parent.last_key and node.pages() == chain[-node.num_pages :]


RadixMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow],
)
TestRadixMachine = pytest.mark.slow(RadixMachine.TestCase)  # several seconds: CI runs it, the fast subset does not
