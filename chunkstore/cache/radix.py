"""A page-granular radix tree over token prefixes, one tree per namespace (SGLang's radix cache, tiered).

Invariants: a node holds whole pages with one chained chunk key per page (the disk tier's keys);
where its pages live is read from its data (``device_slots`` / ``host_slots`` / ``persisted``), the
same for all its pages; lookups never change the tree's shape or residency; a locked node (and so
every ancestor) is never evicted or removed; an unlocked node with no copy anywhere is removed unless
it has children; counters change incrementally and always equal a recount. See docs/RADIX.md.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator

import torch

from chunkstore.cache.radix_policy import EvictionCandidates, EvictionPolicy, evict_by_priority
from chunkstore.cache.radix_types import (
    MEMORY_TIERS, InsertResult, LockHandle, MatchResult, RadixNode, RadixStats, Slots, Tier, TokenIds,
    _as_slots, _as_tokens, _cat,
)
from chunkstore.disk.identity import ModelIdentity
from chunkstore.disk.keys import DEFAULT_NAMESPACE, chain_keys, encode_tokens, root_key

# When the logical clock was read, sampled at most once a second (a day of samples, then the oldest
# go): enough to tell which nodes were last accessed longer ago than a duration (``clock_before``).
_TICK_SAMPLE_S = 1.0
_MAX_TICK_SAMPLES = 86_400


def _is_kept(node: RadixNode, tier: Tier) -> bool:
    """Whether a lock keeps ``node``'s copy on the memory tier ``tier`` from eviction. A lock keeps what its
    holder reads: the device copy, and the host copy only while the node has no device copy (a
    load-back in flight, a prefetch's anchor). Once on the device too, the host copy is a spare
    that host eviction may take (a load-back sets the device slots only after its copy landed)."""
    return node.lock_ref > 0 and node.holds(tier) and (tier is Tier.DEVICE or node.device_slots is None)


class RadixTree:
    """Radix tree of whole pages, one root per namespace; see docs/RADIX.md.

    Not thread-safe: the owner (the cache) holds ``self.lock`` around every call and around its use
    of the nodes and results it gets back. The tree itself never takes it.
    """

    @property
    def page_size(self) -> int:
        return self.identity.page_size  # the identity owns it (the keys bind it)

    def __init__(self, identity: ModelIdentity, policy: EvictionPolicy | str = EvictionPolicy.LRU, *,
                 clock_s: Callable[[], float] = time.monotonic) -> None:
        self.identity = identity
        # Seconds on a monotonic clock, sampled as the logical clock ticks (clock_before): passed in
        # (or set) by tests that age the tree without waiting.
        self.clock_s = clock_s
        self.policy = EvictionPolicy.parse(policy)
        self.lock = threading.RLock()
        self._roots: dict[str, RadixNode] = {}
        self._root_keys: dict[str, bytes] = {}
        self._ids = itertools.count(1)
        self._clock = 0
        self._tick_times: deque[tuple[int, float]] = deque(maxlen=_MAX_TICK_SAMPLES)  # (clock, monotonic s)
        self._num_nodes = 0
        self._pages: dict[Tier, int] = dict.fromkeys(MEMORY_TIERS, 0)
        self._locked_pages: dict[Tier, int] = dict.fromkeys(MEMORY_TIERS, 0)
        self._persisted_pages = 0
        self._candidates = EvictionCandidates()

    # ---- lookups: they never change shape or residency -------------------------------------------

    def match_prefix(self, token_ids: TokenIds, namespace: str = DEFAULT_NAMESPACE) -> MatchResult:
        """The longest prefix of whole pages on device, then on host; locks it.

        Locks the last returned node and its ancestors (``result.handle``, give it back with
        ``unlock``); records an access and a hit on the returned nodes. A match ending inside a node
        does not split it. Raises TypeError for a namespace that is not a string.
        """
        return self._match(token_ids, namespace, is_peek=False)

    def peek_prefix(self, token_ids: TokenIds, namespace: str = DEFAULT_NAMESPACE) -> MatchResult:
        """As ``match_prefix``, but changes nothing at all: no lock, no hit, no access time."""
        return self._match(token_ids, namespace, is_peek=True)

    def _match(self, token_ids: TokenIds, namespace: str, is_peek: bool) -> MatchResult:
        tokens = _as_tokens(token_ids)
        size = self.page_size
        root = self._roots.get(namespace)
        rkey = root.parent_key if root is not None else self._root_key(namespace)
        device_parts: list[torch.Tensor] = []
        host_parts: list[torch.Tensor] = []
        used: list[tuple[RadixNode, int]] = []
        keys: tuple[bytes, ...] = ()
        for node, k in self._walk(root, tokens, len(tokens) - len(tokens) % size):
            whole = k == node.num_pages
            if not host_parts and node.device_slots is not None:
                device_parts.append(node.device_slots if whole else node.device_slots[:k])
            elif node.host_slots is not None:
                host_parts.append(node.host_slots if whole else node.host_slots[:k])
            else:
                break
            used.append((node, k))
            keys += node.keys if whole else node.keys[:k]
        last_node, last_pages = used[-1] if used else (None, 0)
        handle = None
        if not is_peek:
            if used:
                self._tick()
                for node, _ in used:
                    node.last_access = self._clock
                    node.hit_count += 1
            handle = self.lock_node(last_node) if last_node is not None else LockHandle(None)
        return MatchResult(
            namespace=namespace, page_size=size, root_key=rkey, token_ids=tokens[: len(keys) * size], keys=keys,
            device_slots=_cat(device_parts), host_slots=_cat(host_parts), last_key=keys[-1] if keys else rkey,
            last_node=last_node, last_node_pages=last_pages, handle=handle,
        )

    def _walk(self, root: RadixNode | None, tokens: tuple[int, ...], usable: int) -> list[tuple[RadixNode, int]]:
        """(node, pages matched) along tokens[:usable]; only the last node may match partly."""
        size = self.page_size
        path: list[tuple[RadixNode, int]] = []
        node, pos = root, 0
        while node is not None and pos < usable:
            child = node.children.get(tokens[pos : pos + size])
            if child is None:
                break
            ct, n = child.token_ids, len(child.token_ids)
            if usable - pos >= n and tokens[pos : pos + n] == ct:  # compare whole runs, not tokens
                k = child.num_pages
            else:
                limit, k = min(n, usable - pos) // size, 1  # the first page is known to match
                while k < limit and tokens[pos + k * size : pos + (k + 1) * size] == ct[k * size : (k + 1) * size]:
                    k += 1
            path.append((child, k))
            pos += k * size
            node = child if k == child.num_pages else None
        return path

    def _tick(self) -> None:
        self._clock += 1
        now = self.clock_s()
        if not self._tick_times or now - self._tick_times[-1][1] >= _TICK_SAMPLE_S:
            self._tick_times.append((self._clock, now))

    def clock_before(self, age_s: float) -> int:
        """A clock value such that every node whose ``last_access`` is below it was last accessed more
        than ``age_s`` seconds ago (conservative by up to a second: a recent node never qualifies);
        0 when no access is known to be that old. Changes nothing."""
        # Ticks after the sample (c, t) and before the next sample came within a second of t.
        samples = self._tick_times
        i = bisect.bisect_right([t for _, t in samples], self.clock_s() - age_s - _TICK_SAMPLE_S)
        if i == 0:
            return 0
        return samples[i][0] if i < len(samples) else self._clock + 1

    def find_key(self, key: bytes, namespace: str | None = None) -> tuple[RadixNode, int] | None:
        """The node holding the page ``key`` and the page's index in it, or None. O(pages); changes nothing."""
        for node in self.iter_nodes(namespace):
            if key in node.keys:
                return node, node.keys.index(key)
        return None

    def _root_key(self, namespace: str) -> bytes:
        if not isinstance(namespace, str):
            raise TypeError(f"namespace must be a string, got {type(namespace).__name__}")
        key = self._root_keys.get(namespace)
        if key is None:
            key = self._root_keys[namespace] = root_key(self.identity, namespace)
        return key

    # ---- insert and split ------------------------------------------------------------------------

    def insert(
        self, token_ids: TokenIds, namespace: str = DEFAULT_NAMESPACE,
        device_slots: Slots | None = None, host_slots: Slots | None = None, *, persisted: bool = False,
        from_page: int = 0,
    ) -> InsertResult:
        """Add the whole pages of ``token_ids``, with one slot per page on each tier given.

        Pages already present keep their copies and the given slots for them come back as unneeded
        (except a slot equal to the one the page holds); a page without a copy on a tier gets the
        given one. Splits a node where the request diverges inside it, or ends inside it and fills
        something in. With ``from_page``, the slots (and ``persisted``) are for the pages from that
        one on, and the pages before it must already be in the tree: they are left as they are
        (split off where a node straddles ``from_page``). Locks nothing. Raises TypeError/ValueError
        (before any change) for bad token ids, slots of the wrong type or length, no copy at all, or
        pages before ``from_page`` that are not in the tree.
        """
        tokens = _as_tokens(token_ids)
        size = self.page_size
        num_pages = len(tokens) // size
        tokens = tokens[: num_pages * size]
        if not 0 <= from_page <= num_pages:
            raise ValueError(f"from_page must be in [0, {num_pages}], got {from_page}")
        dev = _as_slots(device_slots, num_pages - from_page, "device_slots")
        host = _as_slots(host_slots, num_pages - from_page, "host_slots")
        if dev is None and host is None and not persisted:
            raise ValueError("insert needs a copy: device_slots, host_slots or persisted=True")
        rkey = self._root_key(namespace)
        root = self._roots.get(namespace)
        path = self._walk(root, tokens, len(tokens))
        num_old = sum(k for _, k in path)
        if num_old < from_page:
            raise ValueError(f"pages before from_page={from_page} must be in the tree; {num_old} are")
        new_bytes = encode_tokens(tokens[num_old * size :])  # checks the new ids before anything changes
        if num_pages == 0:
            return InsertResult(namespace, 0, 0, (), _cat([]), _cat([]), None, 0)
        if from_page:  # index the slots by page of the request; the padding is never read
            pad = torch.full((from_page,), -1, dtype=torch.int64)
            dev = None if dev is None else torch.cat([pad, dev])
            host = None if host is None else torch.cat([pad, host])
        self._tick()
        if root is None:
            root = self._roots[namespace] = RadixNode(0, namespace, (), (), rkey, None, self._clock)
        unneeded: dict[Tier, list[torch.Tensor]] = {tier: [] for tier in MEMORY_TIERS}
        keys: tuple[bytes, ...] = ()
        node, page, last_pages = root, 0, 0
        for child, k in path:
            if page < from_page < page + k:  # the pages before from_page are not this insert's
                upper = self.split(child, from_page - page)
                upper.last_access = self._clock
                keys += upper.keys
                page, k = from_page, k - upper.num_pages
            if page + k <= from_page:
                if k < child.num_pages and page + k < num_pages:  # new pages go after page k, not the node's end
                    child = self.split(child, k)
                child.last_access = self._clock
                keys += child.keys if k == child.num_pages else child.keys[:k]
                node, page, last_pages = child, page + k, k
                continue
            if k < child.num_pages and (page + k < num_pages or self._fills(child, dev, host, persisted)):
                child = self.split(child, k)
            self._fill(child, page, k, dev, host, persisted, unneeded)
            child.last_access = self._clock
            keys += child.keys if k == child.num_pages else child.keys[:k]
            node, page, last_pages = child, page + k, k
        if num_old < num_pages:
            node = self._add_leaf(node, tokens[page * size :], new_bytes, page, dev, host, persisted)
            keys += node.keys
            last_pages = node.num_pages
        return InsertResult(
            namespace=namespace, num_pages=num_pages, num_new_pages=num_pages - num_old, keys=keys,
            unneeded_device_slots=_cat(unneeded[Tier.DEVICE]), unneeded_host_slots=_cat(unneeded[Tier.HOST]),
            last_node=node, last_node_pages=last_pages,
        )

    @staticmethod
    def _fills(node: RadixNode, dev: torch.Tensor | None, host: torch.Tensor | None, persisted: bool) -> bool:
        return ((dev is not None and node.device_slots is None) or (host is not None and node.host_slots is None)
                or (persisted and not node.persisted))

    def _fill(
        self, node: RadixNode, page: int, k: int, dev: torch.Tensor | None, host: torch.Tensor | None,
        persisted: bool, unneeded: dict[Tier, list[torch.Tensor]],
    ) -> None:
        for tier, given in ((Tier.DEVICE, dev), (Tier.HOST, host)):
            if given is None:
                continue
            offered = given[page : page + k]
            held = node.slots(tier)
            if held is None:
                self._set_slots(node, tier, offered.clone())  # k == num_pages here: a fill splits first
            elif not torch.equal(offered, held[:k]):  # the usual case: the match's own slots back
                unneeded[tier].append(offered[offered != held[:k]])
        if persisted and not node.persisted:
            self._set_persisted(node, True)

    def _add_leaf(
        self, parent: RadixNode, tokens: tuple[int, ...], token_bytes: bytes, page: int,
        dev: torch.Tensor | None, host: torch.Tensor | None, persisted: bool,
    ) -> RadixNode:
        keys = chain_keys(parent.last_key, token_bytes, self.page_size)
        leaf = RadixNode(next(self._ids), parent.namespace, tokens, tuple(keys), parent.last_key, parent, self._clock)
        parent.children[tokens[: self.page_size]] = leaf
        self._num_nodes += 1
        if dev is not None:
            self._set_slots(leaf, Tier.DEVICE, dev[page:].clone())
        if host is not None:
            self._set_slots(leaf, Tier.HOST, host[page:].clone())
        if persisted:
            self._set_persisted(leaf, True)
        return leaf

    def split(self, node: RadixNode, num_pages: int) -> RadixNode:
        """Cut ``node`` after its first ``num_pages`` pages; returns the new upper node (its parent).

        ``node`` keeps its identity (so lock handles on it stay valid) and its last pages; the upper
        node copies its residency, lock count, access time and hits, so keys and slots stay aligned
        and no counter changes. Raises ValueError unless 0 < num_pages < node.num_pages, or for a root
        or a removed node.
        """
        self._check_attached(node)
        if not 0 < num_pages < node.num_pages:
            raise ValueError(f"split point must be in (0, {node.num_pages}), got {num_pages}")
        cut, size = num_pages * self.page_size, self.page_size
        upper = RadixNode(next(self._ids), node.namespace, node.token_ids[:cut], node.keys[:num_pages],
                          node.parent_key, node.parent, node.last_access)
        upper.hit_count, upper.lock_ref, upper.persisted = node.hit_count, node.lock_ref, node.persisted
        if node.device_slots is not None:
            upper.device_slots, node.device_slots = node.device_slots[:num_pages], node.device_slots[num_pages:]
        if node.host_slots is not None:
            upper.host_slots, node.host_slots = node.host_slots[:num_pages], node.host_slots[num_pages:]
        node.token_ids, node.keys, node.parent_key = node.token_ids[cut:], node.keys[num_pages:], upper.keys[-1]
        node.parent.children[upper.token_ids[:size]] = upper
        node.parent = upper
        upper.children[node.token_ids[:size]] = node
        self._candidates.split(upper, node)
        self._num_nodes += 1
        return upper

    # ---- locks -----------------------------------------------------------------------------------

    def lock_node(self, node: RadixNode) -> LockHandle:
        """Lock ``node`` and its ancestors against eviction and removal; returns the handle to unlock.

        Raises ValueError for a node no longer in the tree. Locking a root locks nothing.
        """
        if node.is_root:
            return LockHandle(None)
        self._check_attached(node)
        n = node
        while n.parent is not None:  # roots are never evicted: no need to count them
            n.lock_ref += 1
            if n.lock_ref == 1:
                self._count_locked(n, +1)
            n = n.parent
        return LockHandle(node)

    def unlock(self, handle: LockHandle) -> None:
        """Give back a lock; nodes it kept that hold no copy and have no children are removed now.

        Raises ValueError for a handle already given back.
        """
        if handle.is_released:
            raise ValueError("lock handle already released")
        handle.is_released = True
        n = handle.node
        while n is not None and n.parent is not None:
            if n.lock_ref == 1:
                self._count_locked(n, -1)
            n.lock_ref -= 1
            n = n.parent
        if handle.node is not None:
            self._prune(handle.node)

    def _count_locked(self, node: RadixNode, sign: int) -> None:
        for tier in MEMORY_TIERS:
            if _is_kept(node, tier):
                self._locked_pages[tier] += sign * node.num_pages

    # ---- residency: the tier controller's acknowledgements ---------------------------------------

    def set_device_slots(self, node: RadixNode, slots: Slots | None) -> torch.Tensor | None:
        """Give ``node`` device slots (one per page) or take them away (None); returns the previous ones.

        The caller frees the previous slots. A node left with no copy anywhere is removed (with its
        empty childless ancestors) unless it is locked (then at its unlock) or has children. Raises
        ValueError for a root, a removed node or a wrong length, TypeError for a wrong dtype.
        """
        return self._set_residency(node, Tier.DEVICE, slots)

    def set_host_slots(self, node: RadixNode, slots: Slots | None) -> torch.Tensor | None:
        """As ``set_device_slots``, for the host tier."""
        return self._set_residency(node, Tier.HOST, slots)

    def mark_persisted(self, node: RadixNode, persisted: bool = True) -> None:
        """Record that the node's pages are on disk (or, with False, no longer known to be there)."""
        self._check_attached(node)
        if node.persisted != persisted:
            self._set_persisted(node, persisted)
        if not persisted:
            self._prune(node)

    def _set_residency(self, node: RadixNode, tier: Tier, slots: Slots | None) -> torch.Tensor | None:
        self._check_attached(node)
        checked = _as_slots(slots, node.num_pages, f"{tier.value}_slots")
        previous = self._set_slots(node, tier, None if checked is None else checked.clone())
        if checked is None:
            self._prune(node)
        return previous

    def _check_attached(self, node: RadixNode) -> None:
        if node.is_root or node.parent is None:
            raise ValueError(f"{node!r} is a root or no longer in the tree")

    def _set_persisted(self, node: RadixNode, persisted: bool) -> None:
        node.persisted = persisted
        self._persisted_pages += node.num_pages if persisted else -node.num_pages

    def _set_slots(self, node: RadixNode, tier: Tier, slots: torch.Tensor | None) -> torch.Tensor | None:
        """The one place slots change: keeps the counters and the eviction candidates in step."""
        previous = node.slots(tier)
        if (previous is None) == (slots is None):
            node.set_slots(tier, slots)  # new slots for a copy it keeps: no counter changes
            return previous
        if node.lock_ref:  # a device copy coming or going changes what a lock keeps on the host
            self._count_locked(node, -1)
        node.set_slots(tier, slots)
        if node.lock_ref:
            self._count_locked(node, +1)
        self._pages[tier] += (1 if slots is not None else -1) * node.num_pages
        self._candidates.held_changed(node, tier)
        return previous

    def _prune(self, node: RadixNode) -> None:
        """Remove ``node``, then its ancestors, while each is unlocked, childless and holds no copy."""
        while node.parent is not None and not node.lock_ref and not node.children and not node.has_copy:
            parent = node.parent
            del parent.children[node.token_ids[: self.page_size]]
            node.parent = None
            self._num_nodes -= 1
            node = parent
        if node.is_root and not node.children:
            self._roots.pop(node.namespace, None)

    # ---- eviction --------------------------------------------------------------------------------

    def evictable_device_leaves(self, policy: EvictionPolicy | str | None = None) -> list[RadixNode]:
        """Unlocked nodes on device with no device copy below them, in eviction order."""
        return self._evictable(Tier.DEVICE, policy)

    def evictable_host_leaves(self, policy: EvictionPolicy | str | None = None) -> list[RadixNode]:
        """Unlocked nodes on host with no host copy below them, in eviction order."""
        return self._evictable(Tier.HOST, policy)

    def _evictable(self, tier: Tier, policy: EvictionPolicy | str | None) -> list[RadixNode]:
        chosen = self.policy if policy is None else EvictionPolicy.parse(policy)
        nodes = [n for n in self._candidates.of(tier) if not _is_kept(n, tier)]
        return sorted(nodes, key=lambda n: (chosen.priority(n), n.id))

    def evict_device(
        self, num_pages: int, policy: EvictionPolicy | str | None = None,
        on_evict: Callable[[RadixNode], None] | None = None,
    ) -> int:
        """Drop the device copies of at least ``num_pages`` pages (fewer if no more are evictable).

        Takes unlocked nodes with no device copy below them, lowest ``policy`` priority first (the
        tree's policy by default); calls ``on_evict(node)`` while the node still holds its slots (the
        controller backs them up or frees them there), then clears them and removes nodes left with
        no copy. ``on_evict`` returning False keeps that node's copy (it is skipped). Overshoots by
        less than one node's pages; returns the pages evicted. If ``on_evict`` raises, that node
        keeps its slots and the error propagates.
        """
        return self._evict(Tier.DEVICE, num_pages, policy, on_evict)

    def evict_host(
        self, num_pages: int, policy: EvictionPolicy | str | None = None,
        on_evict: Callable[[RadixNode], None] | None = None,
    ) -> int:
        """As ``evict_device``, for host copies (the controller persists first where it must)."""
        return self._evict(Tier.HOST, num_pages, policy, on_evict)

    def evict_selected(
        self, tier: Tier, num_pages: int, selected: Collection[RadixNode] | Callable[[RadixNode], bool],
        policy: EvictionPolicy | str | None = None, on_evict: Callable[[RadixNode], None] | None = None,
    ) -> int:
        """As ``evict_device`` / ``evict_host``, taking only ``selected`` nodes (a collection, or a
        predicate): a selected node goes only once every node below it on that tier has gone, so
        one with an unselected or locked descendant there stays."""
        is_selected = selected.__contains__ if isinstance(selected, Collection) else selected
        return self._evict(tier, num_pages, policy, on_evict, is_selected)

    def _evict(
        self, tier: Tier, num_pages: int, policy: EvictionPolicy | str | None,
        on_evict: Callable[[RadixNode], None] | None, is_selected: Callable[[RadixNode], bool] | None = None,
    ) -> int:
        chosen = self.policy if policy is None else EvictionPolicy.parse(policy)
        t = Tier.parse_memory(tier)
        if num_pages <= 0:
            return 0

        def is_candidate(node: RadixNode) -> bool:
            return (node.parent is not None and not _is_kept(node, t) and node.holds(t) and not node.below[t]
                    and (is_selected is None or is_selected(node)))

        def evict_one(node: RadixNode) -> tuple[int, RadixNode | None]:
            if on_evict is not None and on_evict(node) is False:
                return 0, None  # the controller keeps this copy (it could not be backed up)
            num_node_pages = node.num_pages
            if node.holds(t):
                self._set_slots(node, t, None)
            up = node.parent  # found before pruning: a removed node forgets its parent
            while up is not None and not up.holds(t):
                up = up.parent
            self._prune(node)
            return num_node_pages, up

        candidates = [n for n in self._candidates.of(t)
                      if not _is_kept(n, t) and (is_selected is None or is_selected(n))]
        return evict_by_priority(candidates, chosen, num_pages, is_candidate, evict_one)

    # ---- walking and counters --------------------------------------------------------------------

    def namespaces(self) -> list[str]:
        """Namespaces holding at least one node."""
        return sorted(self._roots)

    def root(self, namespace: str = DEFAULT_NAMESPACE) -> RadixNode | None:
        return self._roots.get(namespace)

    def iter_nodes(self, namespace: str | None = None) -> Iterator[RadixNode]:
        """Every non-root node, parents before children, of one namespace or (None) of all."""
        if namespace is None:
            roots = [self._roots[ns] for ns in sorted(self._roots)]
        else:
            roots = [self._roots[namespace]] if namespace in self._roots else []
        stack = [child for r in reversed(roots) for child in reversed(list(r.children.values()))]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(list(node.children.values())))

    def prefix_tokens(self, node: RadixNode) -> tuple[int, ...]:
        """Every token from the root to the end of ``node``."""
        parts: list[tuple[int, ...]] = []
        while node.parent is not None:
            parts.append(node.token_ids)
            node = node.parent
        return tuple(itertools.chain.from_iterable(reversed(parts)))

    def stats(self) -> RadixStats:
        """The counters as kept incrementally (O(1)); take ``lock`` for a snapshot consistent with others."""
        return RadixStats(
            page_size=self.page_size, num_namespaces=len(self._roots), num_nodes=self._num_nodes,
            device_pages=self._pages[Tier.DEVICE], host_pages=self._pages[Tier.HOST],
            persisted_pages=self._persisted_pages,
            locked_device_pages=self._locked_pages[Tier.DEVICE], locked_host_pages=self._locked_pages[Tier.HOST],
            evictable_device_pages=self._pages[Tier.DEVICE] - self._locked_pages[Tier.DEVICE],
            evictable_host_pages=self._pages[Tier.HOST] - self._locked_pages[Tier.HOST],
        )
