"""TieredCache: the device pool, the host pool and the chunk store behind one radix tree (HiCache + disk).

Invariants: every tree change happens under ``tree.lock``, and nothing waits for the controller
while holding it (acks take it); every copy between tiers is the controller's (an eviction's own
copy runs on the evicting thread with ``run_now``), and its ``InFlight`` registry is the only
record of work in flight; a slot is owned by exactly one of: the free list, the tree, an
in-flight operation, or the caller it was allocated for; a page is marked present on a tier only
after its bytes landed there (acks, never submissions, set residency); a transfer that reads
tree-held pages keeps them in place until its ack (a lock, or for a persist, host evictions that
skip its pages); eviction never drops a copy the policy keeps
(write-back backs up before a device eviction; a host page leaves only once it is on disk, where a
disk tier exists) and, when it cannot keep it, leaves it in place instead.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

import torch

from chunkstore.cache.admin import CacheAdmin
from chunkstore.cache.config import LIVE_SETTINGS, CacheConfig
from chunkstore.cache.controller import DEFAULT_PREFETCH_BATCH_PAGES, TierController
from chunkstore.cache.layout import KVLayout
from chunkstore.cache.ops import (
    Ack,
    BackupOp,
    LoadBackOp,
    PersistOp,
    PrefetchOp,
    TransferPath,
)
from chunkstore.cache.policies import PrefetchPolicy, WritePolicy
from chunkstore.cache.prefetch_holds import PrefetchHolds, PrefetchRefresher
from chunkstore.cache.pools import DevicePool, HostPool, PoolExhaustedError
from chunkstore.cache.radix import RadixTree
from chunkstore.cache.radix_policy import EvictionPolicy
from chunkstore.cache.radix_types import (
    InsertResult,
    LockHandle,
    MatchResult,
    RadixNode,
    TokenIds,
    _as_tokens,
)
from chunkstore.cache.stats import CacheCounters, CacheStats, DiskUsage, TierUsage
from chunkstore.cache.tiers import Tier
from chunkstore.disk.identity import ModelIdentity
from chunkstore.disk.keys import DEFAULT_NAMESPACE, PageRef, chain_pages
from chunkstore.disk.store import ChunkStore
from chunkstore.disk.store_spec import open_store

log = logging.getLogger(__name__)

_ALLOCATE_WAIT_S = 30.0  # longest wait for in-flight transfers to release pages before giving up
_LOAD_BACK_WAIT_S = 1.0  # longest a load-back waits for write-through copies to unlock device pages



@dataclass(eq=False)
class PrefixHit:
    """The usable cached prefix of a request, on the device, locked until ``TieredCache.release``.

    ``device_slots`` hold the KV of the first ``num_tokens`` tokens (whole pages). The ``*_tokens``
    counts say where those tokens were found before load-back. On CUDA, ``ready`` is an event the
    compute stream must wait on before reading slots that were loaded back (already waited on by
    ``match`` for the caller's current stream).
    """

    namespace: str
    page_size: int
    device_slots: torch.Tensor
    device_tokens: int
    host_tokens: int
    disk_tokens: int
    handle: LockHandle | None
    ready: "torch.cuda.Event | None" = None

    @property
    def num_pages(self) -> int:
        return len(self.device_slots)

    @property
    def num_tokens(self) -> int:
        return self.num_pages * self.page_size


@dataclass(frozen=True, slots=True)
class FlushResult:
    persisted_pages: int  # pages on disk after the flush that the tree holds in memory
    failed_pages: int  # pages the policy keeps that could not be written down


class TieredCache:
    """A three-tier KV cache over token prefixes, per namespace.

    The engine's cycle: ``match`` (loads what host and disk hold onto the device, returns the usable
    prefix, locked), ``allocate_device`` for the rest, compute into those slots, ``insert`` the full
    pages, ``release`` the hit, ``free_device`` any slot not inserted (a trailing partial page).
    ``prefetch`` may be called early (when a request is queued) to overlap disk reads with compute.
    The operator's operations (evict, clear, list, reconfigure) are ``admin``, a ``CacheAdmin`` over
    the public methods here. Thread-safe. Raises ValueError when ``identity`` does not match
    ``config.page_size``.
    """

    def __init__(self, config: CacheConfig, identity: ModelIdentity, *, device: torch.device | str | None = None,
                 store: ChunkStore | None = None, owns_store: bool = False,
                 prefetch_batch_pages: int = DEFAULT_PREFETCH_BATCH_PAGES) -> None:
        self.layout = self._check(config, identity)
        if config.use_disk and store is None:
            raise ValueError("config.use_disk needs the disk tier's store: open the cache with "
                             "TieredCache.open(config, identity), or pass store=open_store(config.store_spec(identity))")
        self.config, self.identity = config, identity
        self.device_pool = DevicePool(self.layout, config.device_pages(self.layout), device)
        self.host_pool = HostPool(self.layout, config.host_pages(self.layout))
        self.tree = RadixTree(identity, config.eviction_policy)
        self._lock = self.tree.lock
        self.store = store if config.use_disk else None
        self._owns_store = owns_store and self.store is not None
        self.counters = CacheCounters()
        self._holds = PrefetchHolds(int(self.host_pool.capacity_pages * config.prefetch_host_share),
                                    config.prefetch_hold_s)
        self._is_closed = False
        self.controller = TierController(self.device_pool, self.host_pool, self.store, self._apply_ack,
                                         prefetch_batch_pages=prefetch_batch_pages,
                                         background_priority=config.background_priority)
        self._in_flight = self.controller.in_flight  # the one record of copies in flight (the controller's)
        self._refresher = PrefetchRefresher(self._prefetch_next_in_line) if self.store is not None else None
        self.admin = CacheAdmin(self)  # the management API's operations, over the public methods here

    @property
    def page_size(self) -> int:
        return self.identity.page_size  # the identity owns it (the keys bind it)

    @staticmethod
    def _check(config: CacheConfig, identity: ModelIdentity) -> KVLayout:
        """The layout of ``identity``'s pages; ValueError when the settings do not fit it (another
        page size, pools that hold no page or a host pool smaller than the device pool)."""
        if identity.page_size != config.page_size:
            raise ValueError(f"identity has {identity.page_size} tokens per page, config page_size is "
                             f"{config.page_size}")
        layout = KVLayout.from_identity(identity)
        config.host_pages(layout)  # (and the device pool's)
        return layout

    @classmethod
    def open(cls, config: CacheConfig, identity: ModelIdentity, *, device: torch.device | str | None = None,
             prefetch_batch_pages: int = DEFAULT_PREFETCH_BATCH_PAGES) -> "TieredCache":
        """The cache with the disk tier ``config`` names, opened through the one door
        (``config.store_spec``, ``open_store``) and closed with the cache. Raises what
        ``open_store`` raises; the store is closed again when the cache cannot be built."""
        cls._check(config, identity)  # before the store opens: a bad setting leaves no new folder behind
        spec = config.store_spec(identity)
        store = open_store(spec, identity) if spec is not None else None
        try:
            return cls(config, identity, device=device, store=store, owns_store=True,
                       prefetch_batch_pages=prefetch_batch_pages)
        except BaseException:
            if store is not None:
                store.close()
            raise

    @property
    def is_closed(self) -> bool:
        return self._is_closed

    # ---- lookups ---------------------------------------------------------------------------------

    def match(self, token_ids: TokenIds, namespace: str = DEFAULT_NAMESPACE, *,
              wait_for_prefetch: bool | None = None) -> PrefixHit:
        """The longest cached prefix of whole pages, brought to the device and locked.

        Pages found on disk are loaded into host memory, then host pages are copied to the device
        as far as device room allows (waiting a little for transfers that hold device pages).
        ``wait_for_prefetch`` overrides the prefetch policy for a prefetch already in flight: True
        waits for all of it (a caller with nothing else to do should), False takes what has
        landed. Counts the lookup in the stats. Raises TypeError for a non-string namespace.
        """
        tokens = _as_tokens(token_ids)
        with self._lock:
            first = self._lock_exactly(self.tree.match_prefix(tokens, namespace))
        disk_pages = 0
        if self.store is not None and len(tokens) - first.num_tokens >= self.page_size:
            try:
                disk_pages = self._fetch_from_disk(tokens, namespace, first, wait_for_prefetch)
            except BaseException:  # e.g. the store's index failing: no lock may stay behind
                self.tree_unlock(first.handle)
                raise
        if first.num_host_pages == 0 and disk_pages == 0:
            hit = self._hit(first, first.device_slots)  # the common case: all on device, or nothing
        else:
            try:
                hit = self._load_back(tokens, namespace)
            finally:
                self.tree_unlock(first.handle)
        used = hit.num_tokens
        hit.device_tokens = min(used, first.num_device_tokens)
        hit.host_tokens = min(used - hit.device_tokens, first.num_host_tokens)
        hit.disk_tokens = used - hit.device_tokens - hit.host_tokens
        self.counters.record_lookup(len(tokens), hit.device_tokens, hit.host_tokens, hit.disk_tokens, namespace)
        if self.config.write_policy is WritePolicy.WRITE_THROUGH_SELECTIVE and hit.handle.node is not None:
            ready = self._caller_event()
            with self._lock:
                self._write_through(hit.handle.node, ready)
        if self.store is not None:
            self._consume_prefetch(tokens, namespace)
        return hit

    def peek(self, token_ids: TokenIds, namespace: str = DEFAULT_NAMESPACE) -> tuple[int, int, int]:
        """(device, host, disk) tokens of the cached prefix, changing nothing and loading nothing."""
        tokens = _as_tokens(token_ids)
        with self._lock:
            m = self.tree.peek_prefix(tokens, namespace)
        disk = 0
        if self.store is not None and len(tokens) - m.num_tokens >= self.page_size:
            pages = chain_pages(self.identity, tokens[m.num_tokens:], namespace, parent_key=m.last_key)
            disk = self._disk_prefix(pages, namespace) * self.page_size
        return m.num_device_tokens, m.num_host_tokens, disk

    def _disk_prefix(self, pages: list[PageRef], namespace: str) -> int:
        """How many of ``pages`` (a chain) the disk tier holds from the first, the lookup timed."""
        began = time.perf_counter()
        try:
            return self.store.longest_prefix([p.key for p in pages], namespace)
        finally:
            self.counters.record_disk_lookup(time.perf_counter() - began)

    def release(self, hit: PrefixHit) -> None:
        """Give back the lock of a ``match``. Raises ValueError when given back twice."""
        if hit.handle is not None:
            self.tree_unlock(hit.handle)

    def tree_unlock(self, handle: LockHandle | None) -> None:
        if handle is not None:
            with self._lock:
                self.tree.unlock(handle)

    def _relock(self, tokens: tuple[int, ...], namespace: str) -> MatchResult:
        """The prefix again, locked, but not counted as a hit: a request's hits are counted once, by
        its first match, however often the cache looks again (under the lock)."""
        m = self.tree.peek_prefix(tokens, namespace)
        m = self._split_at_end(m)
        handle = self.tree.lock_node(m.last_node) if m.last_node is not None else LockHandle(None)
        return dataclasses.replace(m, handle=handle)

    def _split_at_end(self, m: MatchResult) -> MatchResult:
        """``m`` with its last node cut where the match ended (under the lock), so that a lock on it
        covers the matched pages only: locking pages after them could starve the request of room."""
        node = m.last_node
        if node is None or m.last_node_pages == node.num_pages:
            return m
        upper = self.tree.split(node, m.last_node_pages)
        return dataclasses.replace(m, last_node=upper, last_node_pages=upper.num_pages)

    def _lock_exactly(self, m: MatchResult) -> MatchResult:
        """A match whose lock covers exactly its pages (moves the lock of ``match_prefix``)."""
        trimmed = self._split_at_end(m)
        if trimmed is m:
            return m
        handle = self.tree.lock_node(trimmed.last_node)
        self.tree.unlock(m.handle)
        return dataclasses.replace(trimmed, handle=handle)

    def _hit(self, m: MatchResult, device_slots: torch.Tensor, ready=None) -> PrefixHit:
        return PrefixHit(m.namespace, self.page_size, device_slots, 0, 0, 0, m.handle, ready)

    # ---- disk -> host ----------------------------------------------------------------------------

    def prefetch(self, token_ids: TokenIds, namespace: str = DEFAULT_NAMESPACE) -> int:
        """Start loading the on-disk part of a queued request's prefix into host memory; returns the
        pages this call started loading (0: nothing to do now, or a load already in flight). Does
        not wait. The pages are kept for the request (see prefetch_holds.py) and the request stays
        pending, prefetched for again after later matches, until a match of its tokens. No-op
        without a disk tier."""
        if self.store is None:
            return 0
        tokens = _as_tokens(token_ids)
        with self._lock:
            self._holds.expire()
            self._holds.add_pending(tokens, namespace)
        return self._prefetch_speculative(tokens, namespace)

    def _prefetch_speculative(self, tokens: tuple[int, ...], namespace: str) -> int:
        with self._lock:
            m = self._relock(tokens, namespace)
            path = list(self._path(m.last_node))[::-1]  # root first: the prefix's start matters most
            resident = [k for node in path if node.host_slots is not None for k in node.keys]
            if resident:  # host copies it would read back on its match: kept from going down meanwhile
                self._holds.hold_resident(resident, tokens[:m.num_tokens], namespace)
        try:
            op, is_new = self._start_prefetch(tokens, namespace, m, speculative=True)
            return op.num_pages if op is not None and is_new else 0
        finally:
            self.tree_unlock(m.handle)

    def _consume_prefetch(self, tokens: tuple[int, ...], namespace: str) -> None:
        """A request started: its held prefetch pages become evictable again (the match locked what
        it uses), and the refresher prefetches for the requests next in line."""
        with self._lock:
            self._holds.consume(tokens, namespace)
            self._holds.expire()
        self._refresher.wake()

    def _prefetch_next_in_line(self) -> None:
        with self._lock:
            next_in_line = self._holds.next_in_line()
        for pending in next_in_line:
            if self._is_closed:
                return
            self._prefetch_speculative(pending.tokens, pending.namespace)

    def _fetch_from_disk(self, tokens: tuple[int, ...], namespace: str, m: MatchResult,
                         wait_for_prefetch: bool | None = None) -> int:
        """Load the disk part after ``m`` into host memory per the prefetch policy; returns its pages."""
        op, is_new = self._start_prefetch(tokens, namespace, m)
        if op is None:
            return 0
        policy = self.config.prefetch_policy
        if not is_new and wait_for_prefetch is not None:
            if wait_for_prefetch:
                op.done.wait()
        elif policy is PrefetchPolicy.WAIT_COMPLETE or (policy is PrefetchPolicy.BEST_EFFORT and is_new):
            op.done.wait()  # best effort: a load this call started has nothing to overlap with
        elif policy is PrefetchPolicy.TIMEOUT:
            op.done.wait(max(0.0, op.submitted_at + self.config.prefetch_timeout_s - time.perf_counter()))
        if not is_new and op.done.is_set():  # an earlier prefetch landed: the request may go further
            with self._lock:
                again = self._relock(tokens, namespace)
            try:
                if len(tokens) - again.num_tokens >= self.page_size:
                    return op.num_pages + self._fetch_from_disk(tokens, namespace, again, wait_for_prefetch)
            finally:
                self.tree_unlock(again.handle)
        return op.num_pages

    def _start_prefetch(self, tokens: tuple[int, ...], namespace: str, m: MatchResult, *,
                        speculative: bool = False) -> tuple[PrefetchOp | None, bool]:
        """The prefetch covering the pages after ``m`` (in flight already, or started now), and
        whether it is new. None when nothing after ``m`` is on disk or the host has no room.
        A ``speculative`` one (for a queued request) takes at most the holds' room and keeps its
        pages until the request starts; a request's own load may take back held pages of the
        requests behind it."""
        pages = chain_pages(self.identity, tokens[m.num_tokens:], namespace, parent_key=m.last_key)
        if not pages:
            return None, False
        with self._lock:
            running = self._in_flight.op_for(TransferPath.DISK_TO_HOST, pages[0].key)
            room = self._holds.room() if speculative else len(pages)
        if running is not None:
            return running, False
        if room == 0:
            return None, False
        num_pages = self._disk_prefix(pages, namespace)
        if num_pages == 0:
            return None, False
        with self._lock:
            running = self._in_flight.op_for(TransferPath.DISK_TO_HOST, pages[0].key)
            if running is not None:
                return running, False
            if speculative:
                num_pages = min(num_pages, self._holds.room())  # the rest after a request ahead starts
                slots = self._allocate_host(num_pages, partial=True) if num_pages else None
            else:
                slots = self._allocate_host_over_holds(num_pages, partial=True)
            if slots is None or len(slots) == 0:
                return None, False
            num_pages = len(slots)
            end = (m.num_pages + num_pages) * self.page_size
            anchor = self.tree.lock_node(m.last_node) if m.last_node is not None else None
            op = PrefetchOp(keys=tuple(p.key for p in pages[:num_pages]), namespace=namespace,
                            token_ids=tokens[:end], from_page=m.num_pages, pages=tuple(pages[:num_pages]),
                            host_slots=slots, anchor=anchor)
            if speculative:
                self._holds.started(op)
                op.speculative = True  # no request waits for it yet: read at the background priority
            self.controller.submit(op)  # in flight from here on: a second look finds it, under the lock
        return op, True

    # ---- host -> device --------------------------------------------------------------------------

    def _load_back(self, tokens: tuple[int, ...], namespace: str) -> PrefixHit:
        """Match again and copy the host part to the device, as far as room allows; the returned
        hit holds the match's lock (which also keeps the host pages read by the copy in place)."""
        deadline = time.monotonic() + _LOAD_BACK_WAIT_S
        while True:
            with self._lock:
                m = self._relock(tokens, namespace)
                nodes = self._host_run(m)
                slots = self._allocate_device(m.num_host_pages, partial=True)
                is_short = len(slots) < m.num_host_pages
                if is_short and self._is_device_backup_pending() and time.monotonic() < deadline:
                    self.device_pool.free(slots)  # try again once backups have unlocked their pages
                    self.tree.unlock(m.handle)
                else:
                    op = self._plan_load_back(m, nodes, slots)
                    break
            self.controller.wait_idle(0.01)
        if op is None:
            return self._hit(m, m.device_slots)
        if self.device_pool.device.type == "cpu":
            self.controller.run_now(op)  # a memcpy the caller waits for: no worker round trip
        else:
            self.controller.submit(op)
            op.done.wait()
        if op.event is not None and self.config.disk_load_host_share < 1.0:
            op.event.synchronize()  # host copies may be freed below: the copy must have read them
        with self._lock:
            if op.error is not None:
                self.device_pool.free(slots)
                return self._hit(m, m.device_slots)
            # Another request may have split these nodes while the lock was free; splits keep the
            # last node and put new ones above it, so the pages are found again from there.
            nodes = self._covering(nodes[-1], op.keys)
            offset, kept_share = 0, self._disk_host_share(nodes)
            for node in nodes:
                part = slots[offset:offset + node.num_pages]
                offset += node.num_pages
                if node.device_slots is None:
                    self.tree.set_device_slots(node, part)
                else:  # another request loaded it meanwhile: use its copy
                    self.device_pool.free(part)
                if node not in kept_share and node.lock_ref <= 1 and not self._is_persisting(node):
                    # no other request or write reads the host copy
                    self.host_pool.free(self.tree.set_host_slots(node, None))
            loaded = torch.cat([m.device_slots, *(node.device_slots for node in nodes)])
        if op.event is not None:
            torch.cuda.current_stream(self.device_pool.device).wait_event(op.event)
        return self._hit(m, loaded, op.event)

    def _plan_load_back(self, m: MatchResult, nodes: list[RadixNode], slots: torch.Tensor) -> LoadBackOp | None:
        """The copy of the first ``len(slots)`` host pages of ``m`` (under the lock): ``nodes`` is
        trimmed in place to whole nodes covering them (the last one split to fit); None, with the
        slots freed, when no page fits."""
        num_pages = len(slots)
        while nodes and sum(n.num_pages for n in nodes) > num_pages:
            last = nodes.pop()
            kept = num_pages - sum(n.num_pages for n in nodes)
            if kept > 0:
                nodes.append(self.tree.split(last, kept))
        if not nodes:
            if num_pages:
                self.device_pool.free(slots)
            return None
        return LoadBackOp(keys=tuple(k for n in nodes for k in n.keys), host_slots=m.host_slots[:num_pages],
                          device_slots=slots, ready=self._caller_event())

    def _host_run(self, m: MatchResult) -> list[RadixNode]:
        """The nodes of ``m``'s host part, in order; the last is split where the match ended."""
        node = m.last_node
        if node is None or m.num_host_pages == 0:
            return []
        if m.last_node_pages < node.num_pages:
            node = self.tree.split(node, m.last_node_pages)
        run: list[RadixNode] = []
        while node is not None and not node.is_root and node.device_slots is None and node.host_slots is not None:
            run.append(node)
            node = node.parent
        run.reverse()
        return run

    def _disk_host_share(self, nodes: list[RadixNode]) -> set[RadixNode]:
        """Nodes that keep their host copy after load-back: all but the disk-loaded pages beyond the
        configured share (the share keeps the first of them, the most shared prefix)."""
        share = self.config.disk_load_host_share
        if share >= 1.0 or self.store is None:
            return set(nodes)
        kept, budget = set(), None
        for node in nodes:
            if not node.persisted:
                kept.add(node)
                continue
            if budget is None:
                budget = share * sum(n.num_pages for n in nodes if n.persisted)
            if node.num_pages <= budget:
                kept.add(node)
                budget -= node.num_pages
        return kept

    # ---- insert and write policies ---------------------------------------------------------------

    def allocate_device(self, num_pages: int) -> torch.Tensor:
        """``num_pages`` device slots for the caller to compute into, evicting as needed (and waiting
        for in-flight transfers to unlock pages). Raises PoolExhaustedError when they cannot be had."""
        deadline = time.monotonic() + _ALLOCATE_WAIT_S
        while True:
            with self._lock:
                slots = self._allocate_device(num_pages, partial=False)
            if slots is not None:
                return slots
            if num_pages > self.device_pool.capacity_pages:
                raise PoolExhaustedError(f"{num_pages} device pages asked; the device pool holds "
                                         f"{self.device_pool.capacity_pages}")
            remaining_s = deadline - time.monotonic()
            if self.controller.num_pending == 0 or remaining_s <= 0:  # nothing in flight will free pages
                raise PoolExhaustedError(
                    f"{num_pages} device pages asked; {self.device_pool.num_free} free and the rest are "
                    f"locked by requests in progress (device pool: {self.device_pool.capacity_pages} pages)")
            self.controller.wait_idle(min(0.05, remaining_s))

    def free_device(self, slots: torch.Tensor) -> None:
        """Give back device slots from ``allocate_device`` that were not inserted."""
        self.device_pool.free(slots)

    def insert(self, token_ids: TokenIds, device_slots: torch.Tensor, namespace: str = DEFAULT_NAMESPACE,
               *, from_page: int = 0) -> InsertResult:
        """Add the full pages of ``token_ids`` whose KV is in ``device_slots`` (one per full page,
        the hit's slots first). The tree takes the slots of new pages; slots of pages it already held
        are freed. With ``from_page``, the slots are for the pages from that one on and the pages
        before it must be in the tree (e.g. locked by the request's hit, or by an earlier insert
        still covered by its lock). Starts write-through per the write policy. Raises as
        ``RadixTree.insert``."""
        tokens = _as_tokens(token_ids)
        ready = self._caller_event()
        with self._lock:
            result = self.tree.insert(tokens, namespace, device_slots=device_slots, from_page=from_page)
            if len(result.unneeded_device_slots):
                self.device_pool.free(result.unneeded_device_slots)
            if result.last_node is not None and self.config.write_policy is WritePolicy.WRITE_THROUGH:
                self._write_through(result.last_node, ready)
        return result

    def _is_device_backup_pending(self) -> bool:
        return self.controller.queue_depths()[TransferPath.DEVICE_TO_HOST.value] > 0

    def _caller_event(self) -> "torch.cuda.Event | None":
        """On CUDA, an event after the work queued so far on the caller's stream (the compute that
        wrote or still reads device pages): copies on the controller's streams wait on it."""
        if self.device_pool.device.type != "cuda":
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device_pool.device))
        return event

    def _path(self, node: RadixNode) -> Iterator[RadixNode]:
        while node is not None and not node.is_root:
            yield node
            node = node.parent

    def _write_through(self, last: RadixNode, ready=None) -> None:
        """Back up the device-only nodes from ``last`` up (hot enough ones, under selective)."""
        threshold = (self.config.write_through_threshold
                     if self.config.write_policy is WritePolicy.WRITE_THROUGH_SELECTIVE else 0)
        for node in list(self._path(last)):
            if node.device_slots is not None and node.host_slots is None and node.hit_count >= threshold:
                if not self._backup(node, ready):
                    break

    def _backup(self, node: RadixNode, ready=None) -> bool:
        """Submit a device->host copy of ``node`` (under the lock); False when the host has no room."""
        if self._in_flight.covers(TransferPath.DEVICE_TO_HOST, node.keys[0]):
            return True
        host = self._allocate_host_over_holds(node.num_pages, partial=False)
        if host is None:
            self.counters.record_backup_skipped()
            return False
        op = BackupOp(keys=node.keys, device_slots=node.device_slots.clone(), host_slots=host,
                      anchor=self.tree.lock_node(node), ready=ready)
        self.controller.submit(op)
        return True

    def _persist(self, node: RadixNode) -> bool:
        """Submit a host->disk write of ``node`` (under the lock); True when one is submitted or
        already in flight, False when there is nothing to write or no store."""
        if self.store is None or node.persisted:
            return False
        if self._is_persisting(node):
            return True
        # Not locked: a lock would pin the node's device copy (and its ancestors') for a whole fsync.
        # Its host copy, which the write reads, stays because every host eviction skips pages a
        # persist in flight covers, and a node with a copy is never removed from the tree.
        op = PersistOp(keys=node.keys, pages=tuple(node.pages()), host_slots=node.host_slots.clone(), node=node)
        self.controller.submit(op)
        return True

    def _is_persisting(self, node: RadixNode) -> bool:
        """Whether a host->disk write in flight reads the node's host copy (its first page's: a
        persist covers whole nodes, and a split keeps the keys of both parts in the op)."""
        return self._in_flight.covers(TransferPath.HOST_TO_DISK, node.keys[0])

    # ---- acknowledgements (on the controller's threads) ------------------------------------------

    def _apply_ack(self, ack: Ack) -> None:
        self.counters.record_ack(ack)
        op = ack.op
        if op.is_applied_by_caller:
            return  # a load-back or an eviction's copy: the thread that runs it applies it
        with self._lock:
            if isinstance(op, PrefetchOp):
                self._apply_prefetch(ack, op)
            elif isinstance(op, BackupOp):
                self._apply_backup(ack, op)
            elif isinstance(op, PersistOp):
                self._apply_persist(ack, op)

    def _covering(self, last: RadixNode, keys: tuple[bytes, ...]) -> list[RadixNode]:
        """The nodes holding ``keys``, ending with ``last`` (the locked node that held the last of
        them when the op began; splits since then put new nodes above it, never below)."""
        nodes, count = [], 0
        for node in self._path(last):
            nodes.append(node)
            count += node.num_pages
            if count >= len(keys):
                break
        nodes.reverse()
        if tuple(k for n in nodes for k in n.keys) != keys:
            raise RuntimeError("the pages of an operation are no longer where it began")  # a bug: fail loud
        return nodes

    def _apply_backup(self, ack: Ack, op: BackupOp) -> None:
        try:
            nodes = self._covering(op.anchor.node, op.keys)
            if ack.num_ok < op.num_pages:
                self.host_pool.free(op.host_slots)
                return
            offset = 0
            for node in nodes:
                part = op.host_slots[offset:offset + node.num_pages]
                offset += node.num_pages
                if node.host_slots is None:
                    self.tree.set_host_slots(node, part)
                else:  # a load filled it meanwhile
                    self.host_pool.free(part[part != node.host_slots])
            if self.store is not None and self.config.write_policy is not WritePolicy.WRITE_BACK:
                for node in nodes:
                    self._persist(node)
        finally:
            self.tree.unlock(op.anchor)

    def _apply_persist(self, ack: Ack, op: PersistOp) -> None:
        ok = dict(zip(op.keys, ack.ok))
        for node in self._covering(op.node, op.keys):
            if all(ok[k] for k in node.keys):
                self.tree.mark_persisted(node)

    def _apply_prefetch(self, ack: Ack, op: PrefetchOp) -> None:
        good = ack.num_leading_ok if op.num_loaded_pages == ack.start_page else 0
        first, size = ack.start_page, self.page_size
        try:
            if good:
                begin = op.from_page + first
                result = self.tree.insert(op.token_ids[:(begin + good) * size], op.namespace,
                                          host_slots=op.host_slots[first:first + good], persisted=True,
                                          from_page=begin)
                if len(result.unneeded_host_slots):
                    self.host_pool.free(result.unneeded_host_slots)
                new_anchor = self.tree.lock_node(result.last_node)
                if op.anchor is not None:
                    self.tree.unlock(op.anchor)
                op.anchor = new_anchor
                op.num_loaded_pages += good
            rest = op.host_slots[first + good:first + len(ack.ok)]
            if len(rest):
                self.host_pool.free(rest)
        finally:
            if ack.is_last:  # the controller drops the op from its in-flight registry after this
                self._holds.finished(op)  # its pages are kept for the queued request it is for
                if op.anchor is not None:
                    self.tree.unlock(op.anchor)
                    op.anchor = None

    # ---- allocation and eviction (under the lock) ------------------------------------------------

    def evict_memory(self, tier: Tier, num_pages: int, *, selected: Collection[RadixNode] | None = None,
                     on_evicted: Callable[[RadixNode], None] | None = None) -> int:
        """Evict at least ``num_pages`` unlocked pages of a memory tier (of the ``selected`` nodes
        only, when given) by the rules of a full pool: the policy's order, descendants first, and
        a copy the write policy keeps is written down first through the tier controller (on this
        thread) or stays. ``on_evicted(node)`` is called for each node whose copy went, before its
        slots are cleared. Takes the tree's lock (for the length of a store put when a host page
        must be written down first). Counts the pages in ``stats().evicted_pages`` and returns them.
        Raises ValueError for the disk tier (the store evicts its own chunks)."""
        tier = Tier.parse_memory(tier)
        rule = self._evict_device_node if tier is Tier.DEVICE else self._evict_host_node

        def on_evict(node: RadixNode) -> bool:
            if not rule(node):
                return False
            if on_evicted is not None:
                on_evicted(node)
            return True

        with self._lock:
            if selected is None:
                evicted = self.tree.evict_device(num_pages, on_evict=on_evict) if tier is Tier.DEVICE \
                    else self.tree.evict_host(num_pages, on_evict=on_evict)
            else:
                evicted = self.tree.evict_selected(tier, num_pages, selected, on_evict=on_evict)
            self.counters.record_eviction(tier, evicted)
        return evicted

    def release_prefetch_holds(self) -> None:
        """End every prefetch hold: the pages kept for queued requests become evictable (they are
        loaded again at the requests' matches). Takes the tree's lock."""
        with self._lock:
            self._holds.release_all()

    def apply_live_config(self, new: CacheConfig) -> None:
        """Adopt ``new``, which may differ from ``config`` in ``LIVE_SETTINGS`` only (CacheAdmin's
        ``reconfigure`` builds and validates it): the eviction policy and the store's capacity
        follow it at once, the rest at their next use. Takes the tree's lock. Raises ValueError,
        changing nothing, when another setting differs."""
        old = self.config.model_dump(exclude=set(LIVE_SETTINGS))
        fixed = sorted(k for k, v in new.model_dump(exclude=set(LIVE_SETTINGS)).items() if old.get(k) != v)
        if fixed:
            raise ValueError(f"{', '.join(fixed)} cannot change while the cache runs")
        capacity_bytes = new.disk_capacity_bytes(self.layout)
        with self._lock:
            self.config = new
            self.tree.policy = EvictionPolicy.parse(new.eviction_policy)
            if self.store is not None and self.store.capacity_bytes != capacity_bytes:
                self.store.capacity_bytes = capacity_bytes

    def _allocate_device(self, num_pages: int, *, partial: bool) -> torch.Tensor | None:
        return self._allocate(self.device_pool, self.tree.evict_device, self._evict_device_node, Tier.DEVICE,
                              num_pages, partial)

    def _allocate_host(self, num_pages: int, *, partial: bool) -> torch.Tensor | None:
        return self._allocate(self.host_pool, self.tree.evict_host, self._evict_host_node, Tier.HOST,
                              num_pages, partial)

    def _allocate_host_over_holds(self, num_pages: int, *, partial: bool) -> torch.Tensor | None:
        """Host slots for what is needed now (the running request's disk load, a copy of computed
        pages): evictable pages go first; when that is not enough, prefetch holds are given back,
        newest first, and eviction runs again. A page with no copy below can be lost and a
        running request would recompute; a held page is only read again later."""
        slots = self._allocate_host(num_pages, partial=partial)
        got = 0 if slots is None else len(slots)
        if got == num_pages or not self._holds.release_newest(num_pages - got):
            return slots
        if not partial:
            return self._allocate_host(num_pages, partial=False)
        return torch.cat([slots, self._allocate_host(num_pages - got, partial=True)])

    def _allocate(self, pool, evict, on_evict, tier: Tier, num_pages: int, partial: bool) -> torch.Tensor | None:
        if num_pages > pool.num_free:
            self.counters.record_eviction(tier, evict(num_pages - pool.num_free, on_evict=on_evict))
        if partial:
            return pool.allocate(min(num_pages, pool.num_free))
        return pool.allocate(num_pages) if pool.can_allocate(num_pages) else None

    def _evict_device_node(self, node: RadixNode) -> bool:
        """Free a node's device copy, backing it up first under write-back (a copy the controller
        runs on this thread, under the lock); False keeps it (no host room, or the copy failed)."""
        if node.host_slots is None and self.config.write_policy is WritePolicy.WRITE_BACK \
                and not self._is_on_disk(node):
            host = self._allocate_host_over_holds(node.num_pages, partial=False)
            if host is None:
                return False  # no room above the disk either: keep it rather than lose it
            op = BackupOp(keys=node.keys, is_applied_by_caller=True, device_slots=node.device_slots.clone(),
                          host_slots=host, ready=self._caller_event())
            self.controller.run_now(op)
            if op.num_failed_pages:
                self.host_pool.free(host)
                return False  # the device copy is the only one: keep it
            self.tree.set_host_slots(node, host)
        self.device_pool.free(node.device_slots)
        return True

    def _evict_host_node(self, node: RadixNode) -> bool:
        """Free a node's host copy once it is on disk (the controller writes it down first, on this
        thread, under the lock); False keeps it."""
        if self._is_persisting(node):
            return False  # a write of it is reading the host copy now (persists hold no lock)
        if self._holds.is_held(node.keys):
            return False  # prefetched for a queued request that has not started
        if self.store is not None and not self._is_on_disk(node):
            op = PersistOp(keys=node.keys, is_applied_by_caller=True, pages=tuple(node.pages()),
                           host_slots=node.host_slots.clone(), node=node)
            self.controller.run_now(op)  # a failed write is logged and counted there, and keeps the copy
            if op.num_failed_pages:
                return False
            self.tree.mark_persisted(node)
        self.host_pool.free(node.host_slots)
        return True

    def _is_on_disk(self, node: RadixNode) -> bool:
        """Persisted, and still in the store (the marker is a hint; the store may have evicted it)."""
        return self.store is not None and node.persisted and all(self.store.exists(node.keys, node.namespace))

    # ---- flush, stats, close ---------------------------------------------------------------------

    def flush(self, timeout_s: float | None = None) -> FlushResult:
        """Write every page the tree holds in memory down to disk (for a planned restart) and wait.

        Device-only pages are backed up to host first. In rounds: a device page may find no host
        room until the host pages before it are on disk (a host page leaves only once the store
        holds it), so each round backs up and writes what it can, waits, and another follows while
        the last one put more pages on disk. Returns what is on disk and what could not be written
        (no disk tier: nothing is written and every page counts as failed)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        least_failed = least_device_only = None  # the fewest seen: a round must lower one to be followed
        while True:
            with self._lock:
                submitted = False
                for node in list(self.tree.iter_nodes()):
                    if node.device_slots is not None and node.host_slots is None:
                        submitted |= self._backup(node)
                    elif node.host_slots is not None and not self._is_on_disk(node):
                        if node.persisted:  # the store evicted it since: write it again
                            self.tree.mark_persisted(node, False)
                        submitted |= self._persist(node)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            idle = self.controller.wait_idle(left)
            result, device_only = self._flush_result()
            if not submitted or not idle or result.failed_pages == 0 or not (
                    least_failed is None or result.failed_pages < least_failed or device_only < least_device_only):
                return result
            least_failed = result.failed_pages if least_failed is None else min(least_failed, result.failed_pages)
            least_device_only = device_only if least_device_only is None else min(least_device_only, device_only)

    def _flush_result(self) -> tuple[FlushResult, int]:
        """What is on disk and what is not, and the pages of the latter with no host copy yet."""
        with self._lock:
            persisted = failed = device_only = 0
            for node in self.tree.iter_nodes():
                if node.device_slots is None and node.host_slots is None:
                    continue
                if node.persisted:
                    persisted += node.num_pages
                else:
                    failed += node.num_pages
                    device_only += node.num_pages if node.host_slots is None else 0
        return FlushResult(persisted, failed), device_only

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until no transfer and no prefetch for queued requests is running or asked for;
        False on timeout. Never call it while holding the tree's lock."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if self._refresher is not None and not self._refresher.wait_idle(timeout_s):
            return False
        return self.controller.wait_idle(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def stats(self) -> CacheStats:
        """A consistent snapshot of the tiers and the counters."""
        with self._lock:
            tree = self.tree.stats()
            page_bytes = self.layout.page_size_bytes
            device = TierUsage(self.device_pool.capacity_pages, self.device_pool.num_used, tree.device_pages,
                               tree.evictable_device_pages, tree.locked_device_pages, page_bytes)
            host = TierUsage(self.host_pool.capacity_pages, self.host_pool.num_used, tree.host_pages,
                             tree.evictable_host_pages, tree.locked_host_pages, page_bytes)
        disk = None
        if self.store is not None:
            s = self.store.stats()
            disk = DiskUsage(s.num_chunks, s.raw_bytes, s.stored_bytes, s.capacity_bytes, s.compression_ratio,
                             s.quarantined, s.evictions, s.write_errors, s.write_health.degraded)
        return self.counters.snapshot(page_size=self.page_size, device=device, host=host, disk=disk,
                                      queue_depths=self.controller.queue_depths())

    def wait_prefaulted(self, timeout_s: float | None = None) -> bool:
        """Wait until the CPU pools' memory is mapped (pools.py: they start empty and are
        prefaulted in the background); benchmarks call it to time the steady state. True when done."""
        return all(pool.wait_prefaulted(timeout_s) for pool in (self.device_pool, self.host_pool))

    def close(self, *, flush: bool = False) -> None:
        """Finish the transfers in flight (and, with ``flush``, write everything down first), stop
        the threads and close the store this cache opened. Idempotent. Pages that cannot be written
        (a full disk) are logged with the store's last error, and the close goes on: they are lost."""
        if self._is_closed:
            return
        if flush and self.store is not None:
            self._report_unwritten(self.flush())
        self._is_closed = True
        if self._refresher is not None:
            self._refresher.close()
        self.controller.wait_idle()
        self.controller.close()
        self.device_pool.close()
        self.host_pool.close()
        if self._owns_store:
            self.store.close()

    def _report_unwritten(self, result: FlushResult) -> None:
        if result.failed_pages:
            health = self.store.stats().write_health
            log.error("closing: %d page(s) could not be written to disk (%d written); the last failed write: %s",
                      result.failed_pages, result.persisted_pages, health.last_error or "none recorded")

    def __enter__(self) -> "TieredCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
