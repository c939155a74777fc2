"""What an operator does to a running TieredCache (the management API calls these): evict or clear a
memory tier, list what is resident, change the live settings.

Invariants: these are methods of TieredCache (a base class, for one idea per file) and keep its
invariants: they change residency only through the tree's eviction with the cache's own
``on_evict`` rules (a copy the write policy keeps is written down first or stays), under the
tree's lock; only ``LIVE_SETTINGS`` change while the cache runs, validated as a whole first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from chunkstore.cache.radix_policy import EvictionPolicy
from chunkstore.cache.radix_types import Tier

if TYPE_CHECKING:
    from chunkstore.cache.config import CacheConfig

# Settings that ``reconfigure`` may change while the cache runs: each is read afresh at every use.
LIVE_SETTINGS = ("eviction_policy", "prefetch_policy", "prefetch_timeout_s", "write_through_threshold",
                 "disk_load_host_share", "disk_size")


@dataclass(frozen=True, slots=True)
class NamespaceResidency:
    """The pages of one namespace that the tree holds in memory."""

    device_pages: int
    host_pages: int


class CacheAdministration:
    """The operator's methods of TieredCache (mixed in; they use its tree, pools, store and lock)."""

    @property
    def is_closed(self) -> bool:
        return self._is_closed

    def evict(self, tier: Tier | str, num_pages: int) -> int:
        """Evict at least ``num_pages`` unlocked pages from the ``device`` or ``host`` tier now (fewer
        when fewer are evictable; overshoots by less than one node), by the rules of a full pool:
        the eviction policy's order, descendants first, and a copy the write policy keeps is
        written down first or stays (a host page leaves only once the store holds it). Takes the
        tree's lock (for the length of a store put when a host page must be written down first).
        Returns the pages evicted, also counted in ``stats().evicted_pages``. Raises ValueError for
        another tier (the list of valid ones) or a negative count."""
        tier = Tier.parse(tier)
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        with self._lock:
            if tier is Tier.DEVICE:
                evicted = self.tree.evict_device(num_pages, on_evict=self._evict_device_node)
            else:
                evicted = self.tree.evict_host(num_pages, on_evict=self._evict_host_node)
            self.counters.record_eviction(tier.value, evicted)
        return evicted

    def clear(self, tier: Tier | str) -> int:
        """Evict every unlocked page of the ``device`` or ``host`` tier, as ``evict`` (pages locked
        by requests or transfers stay). Returns the pages evicted."""
        tier = Tier.parse(tier)
        with self._lock:
            tree = self.tree.stats()
            return self.evict(tier, tree.device_pages if tier is Tier.DEVICE else tree.host_pages)

    def resident_keys(self, tier: Tier | str, namespace: str | None = None) -> set[bytes]:
        """The chunk keys of the pages the tree holds on the ``device`` or ``host`` tier (of one
        namespace, or all). Changes nothing; walks the tree under its lock (O(nodes)). Raises
        ValueError for another tier."""
        tier = Tier.parse(tier)
        with self._lock:
            return {k for node in self.tree.iter_nodes(namespace) if node.slots(tier) is not None
                    for k in node.keys}

    def residency_by_namespace(self) -> dict[str, NamespaceResidency]:
        """Per namespace, the pages the tree holds on each memory tier. Changes nothing; O(nodes)."""
        with self._lock:
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
        if "disk_size" in changes and self.store is None:
            raise ValueError("disk_size: this cache has no disk tier")
        new = type(self.config)(**{**self.config.model_dump(), **changes})
        with self._lock:
            self.config = new
            self.tree.policy = EvictionPolicy.parse(new.eviction_policy)
            if "disk_size" in changes:
                self.store.capacity_bytes = new.disk_capacity_bytes(self.layout)
        return new
