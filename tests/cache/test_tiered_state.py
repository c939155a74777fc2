"""TieredCache against a plain dict model, driven by a hypothesis state machine.

The model maps (namespace, page ids) of every prefix the engine computed to its page keys; a page's
KV is random bits seeded from its key, so a page returned in another's place is caught. The cache
is small (8 device pages, 12 host pages) and its disk is a real store in a temporary folder. Rules:
serve (the engine cycle, prefetched or not), insert without a lookup, lookup, hold a hit, release
it, force device or host evictions, prefetch, flush, restart (close with a flush, reopen on the
same disk). After every step, once the controller is idle: every copy the tree holds has the bytes
of its page, the pools hold exactly the tree's slots, device residency is closed upwards, held hits
keep their bytes, and no hit ever returns a page that was not computed. After a restart every
prefix computed is on disk in full (write-back always; write-through while no backup was skipped;
write_through_selective may drop unhit pages by design).
"""

from __future__ import annotations

import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from chunkstore.cache import CacheConfig, PoolExhaustedError
from chunkstore.cache.tiered import PrefixHit, TieredCache
from tests.cache.test_tiered import (
    P, assert_hit, assert_tree_bytes, compute, force_evict, keys_of, serve, settle, toks, tree_pages,
)
from tests.helpers import TINY

NAMESPACES = ("a", "b")
MAX_HELD = 2

namespaces = st.sampled_from(NAMESPACES)
page_ids = st.lists(st.integers(0, 2), min_size=1, max_size=4)  # three pages per level: shared paths


def common_pages(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class TieredMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = tempfile.mkdtemp(prefix="tiered-state-")
        self.cache: TieredCache | None = None
        self.config: CacheConfig | None = None
        self.model: dict[tuple[str, tuple[int, ...]], list[bytes]] = {}  # computed prefixes -> page keys
        self.held: list[tuple[PrefixHit, list[int], str]] = []
        self.may_have_lost = False  # a page the policy need not keep was dropped

    # -- helpers ------------------------------------------------------------------------------------

    def check_no_phantom(self, hit: PrefixHit, ns: str, ids: tuple[int, ...]) -> None:
        known = max((common_pages(ids, done) for (n, done) in self.model if n == ns), default=0)
        assert hit.num_pages <= known, "a hit returned pages that were never computed"

    def is_lossless(self) -> bool:
        policy = self.config.write_policy.value
        if policy == "write_through_selective" or (policy == "write_through" and self.cache.stats().backups_skipped):
            self.may_have_lost = True
        return not self.may_have_lost

    def pick(self, index: int) -> tuple[str, tuple[int, ...]]:
        served = sorted(self.model)
        return served[index % len(served)]

    # -- rules --------------------------------------------------------------------------------------

    @initialize(policy=st.sampled_from(["write_through", "write_through_selective", "write_back"]),
                share=st.sampled_from([0.0, 1.0]), eviction=st.sampled_from(["lru", "lfu"]),
                prefetch=st.sampled_from(["best_effort", "wait_complete"]))
    def start(self, policy, share, eviction, prefetch):
        self.config = CacheConfig(
            page_size=P, device_size="8pages", host_size="12pages", disk_path=self.folder, write_policy=policy,
            write_through_threshold=2, disk_load_host_share=share, eviction_policy=eviction,
            prefetch_policy=prefetch)
        self.cache = TieredCache.open(self.config, TINY)

    @rule(ns=namespaces, ids=page_ids, extra=st.integers(0, P - 1), prefetch=st.booleans())
    def serve(self, ns, ids, extra, prefetch):
        tokens = toks(*ids, extra=extra)
        try:
            hit = serve(self.cache, tokens, ns, prefetch=prefetch)
        except PoolExhaustedError:
            # Room for any one request: its hit locks at most 4 pages (whole nodes), it needs at most 3.
            assert self.held, "no room on the device although no other request holds a page"
            return
        self.check_no_phantom(hit, ns, tuple(ids))
        self.model[(ns, tuple(ids))] = keys_of(tokens, ns)

    @rule(ns=namespaces, ids=page_ids)
    def insert_without_lookup(self, ns, ids):
        """The engine computed the prefix without asking (its lookup found nothing in time)."""
        tokens = toks(*ids)
        try:
            slots = compute(self.cache, keys_of(tokens, ns))
        except PoolExhaustedError:
            assert self.held, "no room on the device although no request holds a page"
            return
        self.cache.insert(tokens, slots, ns)
        self.model[(ns, tuple(ids))] = keys_of(tokens, ns)

    def _lookup(self, ns: str, ids: tuple[int, ...], hold: bool) -> None:
        tokens = toks(*ids)
        hit = self.cache.match(tokens, ns)
        try:
            assert_hit(self.cache, hit, tokens, ns)
            self.check_no_phantom(hit, ns, ids)
        except BaseException:
            self.cache.release(hit)
            raise
        if hold:
            self.held.append((hit, tokens, ns))
        else:
            self.cache.release(hit)

    @rule(ns=namespaces, ids=page_ids)
    def lookup(self, ns, ids):
        self._lookup(ns, tuple(ids), hold=False)

    @precondition(lambda self: self.model)
    @rule(index=st.integers(0, 1000), cut=st.integers(0, 3), hold=st.booleans())
    def lookup_computed(self, index, cut, hold):
        ns, ids = self.pick(index)
        self._lookup(ns, ids[: max(1, len(ids) - cut)], hold=hold and len(self.held) < MAX_HELD)

    @precondition(lambda self: self.held)
    @rule(index=st.integers(0, 1000))
    def release(self, index):
        hit, tokens, ns = self.held.pop(index % len(self.held))
        try:
            assert_hit(self.cache, hit, tokens, ns)  # locked pages kept their slots and bytes
        finally:
            self.cache.release(hit)

    @rule(tier=st.sampled_from(["device", "host"]), num_pages=st.integers(1, 8))
    def evict(self, tier, num_pages):
        force_evict(self.cache, tier, num_pages)

    @rule(ns=namespaces, ids=page_ids)
    def prefetch(self, ns, ids):
        self.cache.prefetch(toks(*ids), ns)

    @rule()
    def flush(self):
        result = self.cache.flush()
        if not self.held and self.is_lossless():
            assert result.failed_pages == 0

    @rule()
    def restart(self):
        while self.held:
            self.release(0)
        is_lossless = self.is_lossless()
        assert self.cache.flush().failed_pages == 0 or not is_lossless
        self.cache.close(flush=True)
        self.cache = TieredCache.open(self.config, TINY)
        if is_lossless:
            for ns, ids in sorted(self.model):
                assert self.cache.peek(toks(*ids), ns) == (0, 0, len(ids) * P), f"{ns} {ids} lost"
        for ns, ids in sorted(self.model):  # each loads what it finds: prefixes diverging in loaded nodes
            hit = self.cache.match(toks(*ids), ns)
            try:
                assert_hit(self.cache, hit, toks(*ids), ns)
                assert hit.num_pages == len(ids) or not is_lossless, f"{ns} {ids}: {hit.num_pages} pages found"
            finally:
                self.cache.release(hit)

    # -- invariants ---------------------------------------------------------------------------------

    @invariant()
    def pools_hold_exactly_the_trees_pages_with_the_right_bytes(self):
        if self.cache is None:
            return
        cache = self.cache
        settle(cache)
        s = cache.stats()
        assert cache.device_pool.num_used == tree_pages(cache, "device") == s.device.cached_pages
        assert cache.host_pool.num_used == tree_pages(cache, "host") == s.host.cached_pages
        assert s.device.used_pages <= s.device.capacity_pages and s.host.used_pages <= s.host.capacity_pages
        if not self.held:
            assert s.device.locked_pages == s.host.locked_pages == 0
        with cache.tree.lock:
            for node in cache.tree.iter_nodes():
                if node.device_slots is not None and not node.parent.is_root:
                    assert node.parent.device_slots is not None, "an ancestor left the device first"
        assert_tree_bytes(cache)
        for hit, tokens, ns in self.held:
            assert_hit(cache, hit, tokens, ns)

    def teardown(self):
        try:
            if self.cache is not None:
                for hit, _, _ in self.held:
                    self.cache.release(hit)
                self.cache.close()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


TieredMachine.TestCase.settings = settings(
    max_examples=50, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestTieredMachine = pytest.mark.slow(TieredMachine.TestCase)  # several seconds: CI runs it, the fast subset does not
