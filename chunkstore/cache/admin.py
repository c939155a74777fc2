"""What an operator does to a running TieredCache (the management API calls these): evict or clear a
memory tier (by count, or a selection: key, namespace, age), list what is resident, change the live
settings.

Invariants: ``CacheAdmin(cache)`` is an object over the cache's public methods and its tree (read
and split under ``tree.lock``), never its privates; residency changes only through
``TieredCache.evict_memory`` (the cache's own eviction rules: a copy the write policy keeps is
written down first, through the tier controller, or stays), so a locked page never goes; a dry run
changes nothing (not even the tree's shape); only ``LIVE_SETTINGS`` change while the cache runs,
validated as a whole first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chunkstore.cache.config import LIVE_SETTINGS
from chunkstore.cache.radix_types import RadixNode
from chunkstore.cache.stats import NamespaceLookups
from chunkstore.cache.tiers import Tier

if TYPE_CHECKING:
    from chunkstore.cache.config import CacheConfig
    from chunkstore.cache.tiered import TieredCache

__all__ = ["CacheAdmin", "DescendantsResidentError", "KeyNotResidentError", "LIVE_SETTINGS", "MemoryEviction",
           "MemorySelection", "NamespaceResidency", "ResidentPage"]


@dataclass(frozen=True, slots=True)
class NamespaceResidency:
    """The pages of one namespace that the tree holds in memory."""

    device_pages: int
    host_pages: int


@dataclass(frozen=True, slots=True)
class MemorySelection:
    """Which pages of a memory tier to evict: the page ``key`` (of ``namespace`` when given; with
    ``descendants``: also every page extending it), or the pages of ``namespace`` and/or last
    accessed more than ``older_than_s`` ago, at most ``num_pages`` of them (None: all), in the
    eviction policy's order, descendants first."""

    key: bytes | None = None
    descendants: bool = False
    namespace: str | None = None
    older_than_s: float | None = None
    num_pages: int | None = None

    def __post_init__(self) -> None:
        if self.key is not None and (self.older_than_s is not None or self.num_pages is not None):
            raise ValueError("key selects the pages itself: leave out older_than_s and num_pages")
        if self.descendants and self.key is None:
            raise ValueError("descendants needs a key")
        if self.key is None and self.namespace is None and self.older_than_s is None and self.num_pages is None:
            raise ValueError("select something: key, namespace, older_than_s or num_pages")
        if self.num_pages is not None and self.num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {self.num_pages}")
        if self.older_than_s is not None and not self.older_than_s >= 0:
            raise ValueError(f"older_than_s must be >= 0, got {self.older_than_s}")


@dataclass(frozen=True, slots=True)
class MemoryEviction:
    """What ``evict_selected`` did (or, a dry run, would do now)."""

    num_pages: int  # evicted; a dry run: the selected unlocked pages that can go now (at most)
    keys: tuple[bytes, ...]  # of the pages evicted (a dry run: of those that can go)
    locked_pages: int  # selected pages kept because requests or transfers lock them
    kept_pages: int  # selected, unlocked pages left: the write policy kept them, or num_pages was reached


@dataclass(frozen=True, slots=True)
class ResidentPage:
    """One page the tree holds in memory (the same key as its chunk on disk, if stored)."""

    key: bytes
    parent_key: bytes
    namespace: str
    num_tokens: int


class KeyNotResidentError(LookupError):
    """The page asked for is not held on that memory tier."""


class DescendantsResidentError(ValueError):
    """Evicting the page alone would leave pages extending it on the tier with no parent copy there."""


class CacheAdmin:
    """The operator's operations on one running ``cache`` (also reachable as ``cache.admin``).

    Thread-safe: every operation takes the cache's tree lock (an RLock, so the cache's own
    ``evict_memory`` inside one is fine). Tier arguments take a ``Tier`` or its name; anything but
    a memory tier raises ValueError listing ``device, host``.
    """

    def __init__(self, cache: TieredCache) -> None:
        self.cache = cache
        self.tree = cache.tree

    def evict(self, tier: Tier | str, num_pages: int) -> int:
        """Evict at least ``num_pages`` unlocked pages from the ``device`` or ``host`` tier now (fewer
        when fewer are evictable; overshoots by less than one node), by the rules of a full pool:
        the eviction policy's order, descendants first, and a copy the write policy keeps is
        written down first or stays (a host page leaves only once the store holds it). Takes the
        tree's lock (for the length of a store put when a host page must be written down first).
        Returns the pages evicted, also counted in ``stats().evicted_pages``. Raises ValueError for
        another tier (the list of valid ones) or a negative count."""
        tier = Tier.parse_memory(tier)
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        return self.cache.evict_memory(tier, num_pages)

    def evict_selected(self, tier: Tier | str, selection: MemorySelection, *, dry_run: bool = False) -> MemoryEviction:
        """Evict the ``selection``'s unlocked pages from the ``device`` or ``host`` tier by the rules
        of ``evict`` (policy order, descendants first, the write policy's copies written down first
        or kept); a page whose descendants on the tier are not selected stays. By key, the node
        holding it is split at the key first (a split changes no residency), so the pages before it
        stay. ``dry_run``: changes nothing (no split either) and counts the selected unlocked pages
        whose selected subtree can go. Takes the tree's lock (for the length of store puts when host
        pages must be written down first). Raises ValueError for another tier, KeyNotResidentError
        for a key not on that tier, DescendantsResidentError for a key whose page has descendants on
        the tier without ``descendants``."""
        tier = Tier.parse_memory(tier)
        with self.tree.lock:
            nodes, first = self._select_nodes(tier, selection)
            if dry_run:
                return self._plan(tier, selection, nodes, first)
            for node, start in list(first.items()):  # by key: cut the pages before it off the node
                if start:
                    self.tree.split(node, start)
            evicted_keys: list[bytes] = []
            budget = selection.num_pages if selection.num_pages is not None else sum(n.num_pages for n in nodes)
            evicted = self.cache.evict_memory(tier, budget, selected=set(nodes),
                                              on_evicted=lambda node: evicted_keys.extend(node.keys))
            left = [n for n in nodes if n.holds(tier) and n.parent is not None]
            locked = sum(n.num_pages for n in left if n.is_locked)
            kept = sum(n.num_pages for n in left if not n.is_locked)
        return MemoryEviction(evicted, tuple(evicted_keys), locked, kept)

    def _plan(self, tier: Tier, selection: MemorySelection, nodes: list[RadixNode],
              first: dict[RadixNode, int]) -> MemoryEviction:
        """What ``evict_selected`` would take now (under the lock; changes nothing)."""
        selected = set(nodes)
        # A node can go once every node below it on the tier has: with locks reaching every
        # ancestor, that is "unlocked, and no unselected node below it holds the tier".
        blocked = {n for n in self.tree.iter_nodes() if n.holds(tier) and n not in selected}
        kept_above = set()
        for n in blocked:
            up = n.parent
            while up is not None and up not in kept_above:
                kept_above.add(up)
                up = up.parent
        can_go = [n for n in nodes if not n.is_locked and n not in kept_above]
        pages = [(n, first.get(n, 0)) for n in can_go]
        budget = math.inf if selection.num_pages is None else selection.num_pages
        keys: list[bytes] = []
        for n, start in sorted(pages, key=lambda p: (self.tree.policy.priority(p[0]), p[0].id)):
            if len(keys) >= budget:
                break
            keys.extend(n.keys[start:])
        locked = sum(n.num_pages - first.get(n, 0) for n in nodes if n.is_locked)
        total = sum(n.num_pages - first.get(n, 0) for n in nodes)
        return MemoryEviction(len(keys), tuple(keys), locked, total - locked - len(keys))

    def _select_nodes(self, tier: Tier, selection: MemorySelection) -> tuple[list[RadixNode], dict[RadixNode, int]]:
        """The nodes holding ``tier`` that the selection names, and (by key) the first selected page
        of the key's node. Raises as ``evict_selected``."""
        if selection.key is not None:
            found = self.tree.find_key(selection.key, selection.namespace)
            if found is None or not found[0].holds(tier):
                raise KeyNotResidentError(f"page {selection.key.hex()} is not on the {tier.value} tier")
            node, start = found
            below = [n for n in _subtree(node) if n is not node and n.holds(tier)]
            if not selection.descendants and (start < node.num_pages - 1 or below):
                num = node.num_pages - 1 - start + sum(n.num_pages for n in below)
                raise DescendantsResidentError(
                    f"page {selection.key.hex()} has {num} descendant pages on the {tier.value} tier, which "
                    f"must go first: evict it with its descendants")
            return [node, *below], {node: start}
        clock = self.tree.clock_before(selection.older_than_s) if selection.older_than_s is not None else None
        nodes = [n for n in self.tree.iter_nodes(selection.namespace)
                 if n.holds(tier) and (clock is None or n.last_access < clock)]
        return nodes, {}

    def clear(self, tier: Tier | str) -> int:
        """Evict every unlocked page of the ``device`` or ``host`` tier, as ``evict`` (pages locked
        by requests or transfers stay); clearing the host ends every prefetch hold first. Returns
        the pages evicted."""
        tier = Tier.parse_memory(tier)
        with self.tree.lock:
            if tier is Tier.HOST:
                self.cache.release_prefetch_holds()  # pages kept for queued requests go too: they load again
            tree = self.tree.stats()
            return self.evict(tier, tree.device_pages if tier is Tier.DEVICE else tree.host_pages)

    def resident_keys(self, tier: Tier | str, namespace: str | None = None) -> set[bytes]:
        """The chunk keys of the pages the tree holds on the ``device`` or ``host`` tier (of one
        namespace, or all). Changes nothing; walks the tree under its lock (O(nodes)). Raises
        ValueError for another tier."""
        tier = Tier.parse_memory(tier)
        with self.tree.lock:
            return {k for node in self.tree.iter_nodes(namespace) if node.holds(tier) for k in node.keys}

    def resident_pages(self, tier: Tier | str, namespace: str | None = None) -> list[ResidentPage]:
        """The pages the tree holds on the ``device`` or ``host`` tier (of one namespace, or all),
        parents before children. Changes nothing; walks the tree under its lock (O(nodes + pages)).
        Raises ValueError for another tier."""
        tier = Tier.parse_memory(tier)
        size = self.tree.page_size
        with self.tree.lock:
            return [ResidentPage(k, node.keys[i - 1] if i else node.parent_key, node.namespace, size)
                    for node in self.tree.iter_nodes(namespace) if node.holds(tier)
                    for i, k in enumerate(node.keys)]

    def lookups_by_namespace(self) -> dict[str, NamespaceLookups]:
        """Per namespace, its lookups, looked-up tokens and hit tokens since the cache started (the
        first ``MAX_COUNTED_NAMESPACES`` namespaces seen). Changes nothing; thread-safe."""
        return self.cache.counters.lookups_by_namespace()

    def residency_by_namespace(self) -> dict[str, NamespaceResidency]:
        """Per namespace, the pages the tree holds on each memory tier. Changes nothing; O(nodes)."""
        with self.tree.lock:
            counts: dict[str, list[int]] = {}
            for node in self.tree.iter_nodes():
                c = counts.setdefault(node.namespace, [0, 0])
                c[0] += node.num_pages if node.device_slots is not None else 0
                c[1] += node.num_pages if node.host_slots is not None else 0
        return {ns: NamespaceResidency(d, h) for ns, (d, h) in sorted(counts.items())}

    def reconfigure(self, **changes) -> CacheConfig:
        """Change settings while the cache runs; only ``LIVE_SETTINGS`` (each is read afresh where
        it is used; ``disk_size`` sets the store's capacity, which its next put evicts down to).
        Validates the whole new config first and changes nothing on error. Returns the new config.
        Raises ValueError (pydantic's ValidationError is one) for another setting, a bad value, or
        ``disk_size`` without a disk tier."""
        fixed = sorted(set(changes) - set(LIVE_SETTINGS))
        if fixed:
            raise ValueError(f"{', '.join(fixed)} cannot change while the cache runs (restart with the new "
                             f"value); live settings: {', '.join(LIVE_SETTINGS)}")
        if "disk_size" in changes and self.cache.store is None:
            raise ValueError("disk_size: this cache has no disk tier")
        config = self.cache.config
        new = type(config)(**{**config.model_dump(), **changes})
        self.cache.apply_live_config(new)
        return new


def _subtree(node: RadixNode) -> list[RadixNode]:
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.children.values())
    return out
