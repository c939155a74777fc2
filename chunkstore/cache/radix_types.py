"""The radix tree's value types: nodes, lock handles, and the typed results of its calls.

Invariants: a node's residency is read from its own data (``device_slots`` / ``host_slots`` /
``persisted``), never from flags beside them; results hold copies of slot lists, never views of a
node's slots (which the tree may later split or replace). The tree itself is in radix.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from chunkstore.cache.tiers import MEMORY_TIERS, Tier
from chunkstore.disk.keys import PageRef

TokenIds = Sequence[int] | torch.Tensor
Slots = torch.Tensor | Sequence[int]


__all__ = ["MEMORY_TIERS", "Tier"]  # re-exported: the tree's tiers are the cache's (tiers.py)


class RadixNode:
    """A run of whole pages. Residency is read from the data, never kept in flags beside it."""

    __slots__ = (
        "id", "namespace", "token_ids", "keys", "parent_key", "device_slots", "host_slots",
        "persisted", "lock_ref", "last_access", "hit_count", "parent", "children", "below",
    )

    def __init__(
        self, node_id: int, namespace: str, token_ids: tuple[int, ...], keys: tuple[bytes, ...],
        parent_key: bytes, parent: RadixNode | None, last_access: int,
    ) -> None:
        self.id = node_id  # creation order; 0 for roots
        self.namespace = namespace
        self.token_ids = token_ids  # len(keys) * page_size ids
        self.keys = keys  # keys[i] = H(keys[i-1] or parent_key, page i): the store's chunk keys
        self.parent_key = parent_key  # key of the page before the first (a root: the namespace root key)
        self.device_slots: torch.Tensor | None = None  # int64, one per page
        self.host_slots: torch.Tensor | None = None
        self.persisted = False  # acknowledged on disk: a hint, the store stays the authority
        self.lock_ref = 0
        self.last_access = last_access  # the tree's logical clock (one tick per insert or match)
        self.hit_count = 0
        self.parent = parent  # None for a root and for a node removed from the tree
        self.children: dict[tuple[int, ...], RadixNode] = {}  # by the first page's token ids
        # per memory tier: children holding that tier in their subtree (EvictionCandidates)
        self.below: dict[Tier, int] = {Tier.DEVICE: 0, Tier.HOST: 0}

    @property
    def num_pages(self) -> int:
        return len(self.keys)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def is_root(self) -> bool:
        return not self.keys

    @property
    def on_device(self) -> bool:
        return self.device_slots is not None

    @property
    def on_host(self) -> bool:
        return self.host_slots is not None

    @property
    def has_copy(self) -> bool:
        return self.device_slots is not None or self.host_slots is not None or self.persisted

    @property
    def is_locked(self) -> bool:
        return self.lock_ref > 0

    @property
    def last_key(self) -> bytes:
        """The key of the last page (for a root: the namespace's root key)."""
        return self.keys[-1] if self.keys else self.parent_key

    def slots(self, tier: Tier) -> torch.Tensor | None:
        """The node's slots on a memory tier, or None. Raises ValueError for the disk tier."""
        if tier is Tier.DEVICE:
            return self.device_slots
        if tier is Tier.HOST:
            return self.host_slots
        raise ValueError(f"the {tier.value} tier has no slots (found by key in the store)")

    def set_slots(self, tier: Tier, slots: torch.Tensor | None) -> None:
        """Only for RadixTree, which keeps its counters in step."""
        if tier is Tier.DEVICE:
            self.device_slots = slots
        elif tier is Tier.HOST:
            self.host_slots = slots
        else:
            raise ValueError(f"the {tier.value} tier has no slots (found by key in the store)")

    def holds(self, tier: Tier) -> bool:
        """Whether the node has a copy on ``tier`` (the disk tier: acknowledged as persisted)."""
        if tier is Tier.DEVICE:
            return self.device_slots is not None
        if tier is Tier.HOST:
            return self.host_slots is not None
        return self.persisted

    def pages(self) -> list[PageRef]:
        return _pages_of(self.token_ids, self.keys, self.parent_key, self.namespace)

    def __repr__(self) -> str:
        where = "".join(c for c, on in (("D", self.on_device), ("H", self.on_host), ("P", self.persisted)) if on)
        return (f"RadixNode(id={self.id}, ns={self.namespace!r}, pages={self.num_pages}, at={where or '-'}, "
                f"lock_ref={self.lock_ref}, children={len(self.children)})")


def _pages_of(tokens: tuple[int, ...], keys: tuple[bytes, ...], parent_key: bytes, namespace: str) -> list[PageRef]:
    size = len(tokens) // len(keys) if keys else 0
    parents = (parent_key, *keys[:-1])
    return [PageRef(k, p, tokens[i * size : (i + 1) * size], namespace) for i, (k, p) in enumerate(zip(keys, parents))]


@dataclass(slots=True, eq=False)
class LockHandle:
    """A lock from ``match_prefix`` or ``lock_node``; give it back exactly once with ``unlock``."""

    node: RadixNode | None  # None: nothing was locked (an empty match)
    is_released: bool = False


@dataclass(frozen=True, slots=True)
class MatchResult:
    """The longest tree-resident prefix of a request: device pages first, then host pages.

    The disk part is not here: the cache continues the chain from ``last_key`` (``chain_pages(...,
    parent_key=last_key)`` over the tokens after ``num_tokens``) and asks ``store.longest_prefix``.
    ``last_node``/``last_node_pages`` hold until the tree next changes; ``handle`` until ``unlock``.
    """

    namespace: str
    page_size: int
    root_key: bytes  # parent of the first page
    token_ids: tuple[int, ...]  # of the matched pages
    keys: tuple[bytes, ...]  # one per matched page
    device_slots: torch.Tensor  # int64, one per leading device page (a new tensor, the caller's)
    host_slots: torch.Tensor  # int64, one per following host page
    last_key: bytes  # key of the last matched page; root_key when nothing matched
    last_node: RadixNode | None  # node holding the last matched page
    last_node_pages: int  # how many of last_node's pages matched (its first ones)
    handle: LockHandle | None  # None for peek_prefix

    @property
    def num_device_pages(self) -> int:
        return len(self.device_slots)

    @property
    def num_host_pages(self) -> int:
        return len(self.host_slots)

    @property
    def num_pages(self) -> int:
        return len(self.keys)

    @property
    def num_device_tokens(self) -> int:
        return self.num_device_pages * self.page_size

    @property
    def num_host_tokens(self) -> int:
        return self.num_host_pages * self.page_size

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def pages(self) -> list[PageRef]:
        """PageRefs of every matched page, built on demand (a match does not pay for them)."""
        return _pages_of(self.token_ids, self.keys, self.root_key, self.namespace)

    def device_pages(self) -> list[PageRef]:
        return self.pages()[: self.num_device_pages]

    def host_pages(self) -> list[PageRef]:
        return self.pages()[self.num_device_pages :]


@dataclass(frozen=True, slots=True)
class InsertResult:
    """What an insert did. The caller frees ``unneeded_*_slots``: those pages already had a copy there."""

    namespace: str
    num_pages: int  # full pages of the request (a trailing partial page is ignored)
    num_new_pages: int  # pages that were not in the tree at all
    keys: tuple[bytes, ...]  # the chained key of every full page
    unneeded_device_slots: torch.Tensor  # int64
    unneeded_host_slots: torch.Tensor  # int64
    last_node: RadixNode | None  # node holding the last page (None when num_pages == 0)
    last_node_pages: int  # how many of last_node's pages the request covers


@dataclass(frozen=True, slots=True)
class RadixStats:
    """The tree's counters, in pages (times page_size for tokens)."""

    page_size: int
    num_namespaces: int
    num_nodes: int  # roots not counted
    device_pages: int
    host_pages: int
    persisted_pages: int
    locked_device_pages: int
    locked_host_pages: int
    evictable_device_pages: int
    evictable_host_pages: int


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """A new tensor, never a view of a node's slots (which the tree may later split or replace)."""
    if not parts:
        return torch.empty(0, dtype=torch.int64)
    return parts[0].clone() if len(parts) == 1 else torch.cat(parts)


def _as_tokens(token_ids: TokenIds) -> tuple[int, ...]:
    if isinstance(token_ids, tuple):
        return token_ids
    if hasattr(token_ids, "tolist"):  # torch or numpy: one C-level conversion, no per-token loop
        return tuple(token_ids.tolist())
    return tuple(token_ids)


def _as_slots(slots: Slots | None, num_pages: int, name: str) -> torch.Tensor | None:
    if slots is None:
        return None
    if not isinstance(slots, torch.Tensor):
        slots = torch.as_tensor(list(slots), dtype=torch.int64)
    if slots.dtype != torch.int64 or slots.dim() != 1:
        raise TypeError(f"{name} must be a 1-D int64 tensor, got {slots.dtype} of shape {tuple(slots.shape)}")
    if len(slots) != num_pages:
        raise ValueError(f"{name} has {len(slots)} slots for {num_pages} pages (one per full page)")
    return slots.to("cpu")  # the tree keeps slot numbers on the CPU, whatever device they came from
