"""Eviction for the radix tree: the policies (one priority function each), the candidate sets, one heap loop.

Invariants: a policy is an ``EvictionPolicy`` member (anything else is an error listing the valid
names); a priority is a tuple, smaller evicts first; a node is a candidate of a tier iff it holds a
copy there and no node below it does (descendants go first), kept incrementally; the loop re-checks
every node it pops and stops once the pages asked for are reached (overshoot < one node's pages).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from chunkstore.cache.policies import PolicyEnum

from chunkstore.cache.tiers import MEMORY_TIERS, Tier

if TYPE_CHECKING:
    from chunkstore.cache.radix_types import RadixNode


class EvictionPolicy(PolicyEnum):
    """Which unlocked leaves go first when a tier is full; ``parse`` lists the valid names on error."""

    LRU = "lru"  # least recently matched or inserted
    LFU = "lfu"  # fewest hits, then least recently used

    def priority(self, node: RadixNode) -> tuple:
        """Smaller evicts first."""
        return _PRIORITIES[self](node)


def lru_priority(node: RadixNode) -> tuple:
    return (node.last_access,)


def lfu_priority(node: RadixNode) -> tuple:
    return (node.hit_count, node.last_access)


_PRIORITIES: dict[EvictionPolicy, Callable[[RadixNode], tuple]] = {
    EvictionPolicy.LRU: lru_priority,
    EvictionPolicy.LFU: lfu_priority,
}


class EvictionCandidates:
    """Per memory tier: the nodes that hold a copy there with no copy below them.

    Each node keeps ``below[t]``: how many of its children hold tier t themselves or somewhere under
    them. A change of one node's residency walks up only while an ancestor's answer to "does my
    subtree hold tier t?" flips, so candidates cost O(candidates) to list, never a walk of the tree.
    """

    def __init__(self) -> None:
        self._sets: dict[Tier, set[RadixNode]] = {tier: set() for tier in MEMORY_TIERS}

    def of(self, t: Tier) -> set[RadixNode]:
        return self._sets[t]

    def held_changed(self, node: RadixNode, t: Tier) -> None:
        """Call after ``node`` gained or lost its copy on tier t (not for a change of slots only)."""
        is_held = node.holds(t)
        members = self._sets[t]
        if is_held and node.below[t] == 0:
            members.add(node)
        else:
            members.discard(node)
        if node.below[t]:
            return  # its subtree held the tier before and still does: no ancestor's view changes
        step = 1 if is_held else -1
        n = node.parent
        while n is not None:
            n.below[t] += step
            if n.holds(t):
                if n.below[t] == 0:
                    members.add(n)
                else:
                    members.discard(n)
                return
            if n.below[t] != (1 if is_held else 0):
                return  # n's subtree held the tier before and still does (or still does not)
            n = n.parent

    @staticmethod
    def split(upper: RadixNode, lower: RadixNode) -> None:
        """``upper`` was cut from the top of ``lower``, holds what it holds and has it as its only child.

        So ``upper`` is a candidate of no tier, ``lower`` keeps its membership, and no ancestor changes.
        """
        for t in MEMORY_TIERS:
            upper.below[t] = 1 if (lower.holds(t) or lower.below[t]) else 0


def evict_by_priority(
    candidates: Iterable[RadixNode],
    policy: EvictionPolicy,
    num_pages: int,
    is_candidate: Callable[[RadixNode], bool],
    evict_one: Callable[[RadixNode], tuple[int, RadixNode | None]],
) -> int:
    """Evict nodes in ``policy`` order until ``num_pages`` pages are gone or none is left.

    ``evict_one(node)`` evicts one node and returns (pages evicted, the nearest ancestor holding the
    same tier, which may have become a candidate, or None); 0 pages means the node was kept.
    Candidates are re-checked when popped, so a callback that changes the tree meanwhile cannot make
    the loop take a node it should not. Ties go to the older node (smaller id), so the order is
    deterministic. Returns the pages evicted.
    """
    priority = _PRIORITIES[policy]
    heap = [(priority(node), node.id, node) for node in candidates]
    heapq.heapify(heap)
    evicted = 0
    while heap and evicted < num_pages:
        _, _, node = heapq.heappop(heap)
        if not is_candidate(node):
            continue
        num_evicted, parent = evict_one(node)
        evicted += num_evicted
        if parent is not None and is_candidate(parent):
            heapq.heappush(heap, (priority(parent), parent.id, parent))
    return evicted
