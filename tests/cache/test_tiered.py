"""TieredCache scenarios on real pools, trees and SQLite/zstd chunk stores in tmp_path.

Every page's KV is random bits seeded from its chunk key, so a page that comes back in another
page's place, or half-written, is caught. Covered: the device -> host -> disk -> host -> device
round trip, warm start, the write policies, the prefetch policies, the host share of disk loads, no
disk tier, eviction invariants, failing disks (corrupt, deleted, unwritable chunks), the stats, and
concurrent requests. Slow transfers are simulated by stalling a real component (the store's read
threads, or a pool's allocator lock), never by mocks; no assertion depends on timing.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from contextlib import contextmanager

import pytest
import torch

from chunkstore.cache import CacheConfig, KVLayout, PoolExhaustedError
from chunkstore.cache.tiered import PrefixHit, TieredCache
from chunkstore.cache.tiers import Tier
from chunkstore.disk.files import ChunkFiles
from chunkstore.disk.keys import DEFAULT_NAMESPACE, chain_pages
from chunkstore.disk.store import ChunkStore, store_root
from tests.helpers.faults import FaultyPayloads
from chunkstore.testing.tensors import bits
from tests.helpers import TINY

P = TINY.page_size
LAYOUT = KVLayout.from_identity(TINY)
PAGE_BYTES = LAYOUT.page_size_bytes
SETTLE_S = 30.0  # generous bound on waiting for the controller: only a hang ever reaches it


# ---- helpers (also used by test_tiered_state.py and test_tiered_cuda.py) ------------------------

def toks(*page_ids: int, extra: int = 0) -> list[int]:
    """Whole pages (page id p -> tokens 1000p .. 1000p+3), then ``extra`` tokens of a partial page."""
    return [1000 * p + j for p in page_ids for j in range(P)] + [999_999] * extra


@functools.lru_cache(maxsize=4096)
def page_kv(key: bytes) -> torch.Tensor:
    """The KV of the page with chunk ``key``: random bits seeded from the key (CPU)."""
    g = torch.Generator().manual_seed(int.from_bytes(key[:8], "little") >> 1)
    raw = torch.randint(0, 256, (PAGE_BYTES,), dtype=torch.uint8, generator=g)
    return raw.view(LAYOUT.torch_dtype).reshape(LAYOUT.page_shape)


def keys_of(tokens, ns: str = DEFAULT_NAMESPACE) -> list[bytes]:
    return [p.key for p in chain_pages(TINY, tokens, ns)]


def expected(keys) -> torch.Tensor:
    return torch.stack([page_kv(k) for k in keys]) if keys else torch.empty((0, *LAYOUT.page_shape))


def bad_pages(cache: TieredCache, hit: PrefixHit, tokens, ns: str = DEFAULT_NAMESPACE) -> list[int]:
    """Indexes of the hit's pages whose device bytes are not the KV of that page of ``tokens``."""
    keys = keys_of(tokens, ns)[: hit.num_pages]
    if not keys:
        return []
    got, want = bits(cache.device_pool.read(hit.device_slots)), bits(expected(keys))
    return [i for i in range(len(keys)) if not torch.equal(got[i], want[i])]


def assert_hit(cache: TieredCache, hit: PrefixHit, tokens, ns: str = DEFAULT_NAMESPACE) -> None:
    assert hit.num_tokens <= len(tokens) and hit.num_tokens % P == 0
    assert hit.device_tokens + hit.host_tokens + hit.disk_tokens == hit.num_tokens
    assert bad_pages(cache, hit, tokens, ns) == [], "a hit returned wrong bytes"


def compute(cache: TieredCache, keys) -> torch.Tensor:
    """Device slots holding the KV of ``keys``, as the engine's forward pass would leave them."""
    slots = cache.allocate_device(len(keys))
    if len(keys):
        cache.device_pool.write(slots, expected(keys).to(cache.device_pool.device))
    return slots


def serve(cache: TieredCache, tokens, ns: str = DEFAULT_NAMESPACE, *, hold: bool = False,
          prefetch: bool = False) -> PrefixHit:
    """One request through the engine's cycle: (prefetch,) match, check the hit's bytes, compute
    the rest into fresh slots, insert, release (unless ``hold``)."""
    if prefetch:
        cache.prefetch(tokens, ns)
    hit = cache.match(tokens, ns)
    try:
        assert_hit(cache, hit, tokens, ns)
        new = compute(cache, keys_of(tokens, ns)[hit.num_pages:])
    except BaseException:
        cache.release(hit)
        raise
    cache.insert(tokens, torch.cat([hit.device_slots, new]), ns)
    if not hold:
        cache.release(hit)
    return hit


def lookup(cache: TieredCache, tokens, ns: str = DEFAULT_NAMESPACE) -> PrefixHit:
    """Match, check the bytes, release; returns the (released) hit."""
    hit = cache.match(tokens, ns)
    try:
        assert_hit(cache, hit, tokens, ns)
    finally:
        cache.release(hit)
    return hit


def settle(cache: TieredCache) -> None:
    assert cache.wait_idle(SETTLE_S), "the tier controller (or the prefetch refresher) never became idle"


def force_evict(cache: TieredCache, tier: str, num_pages: int) -> None:
    """Make ``tier`` evict at least ``num_pages`` pages by the cache's own rules, as a request
    needing that room would (the eviction a full pool runs: ``evict_memory``)."""
    cache.evict_memory(Tier.parse_memory(tier), num_pages)


def tree_pages(cache: TieredCache, tier: str) -> int:
    s = cache.tree.stats()
    return s.device_pages if tier == "device" else s.host_pages


def assert_tree_bytes(cache: TieredCache) -> None:
    """Every device and host copy the tree holds is the KV of its page."""
    with cache.tree.lock:
        nodes = [(n.keys, n.device_slots, n.host_slots) for n in cache.tree.iter_nodes()]
    for keys, dev, host in nodes:
        want = bits(expected(keys))
        if dev is not None:
            assert torch.equal(bits(cache.device_pool.read(dev)), want), "a device copy holds wrong bytes"
        if host is not None:
            assert torch.equal(bits(cache.host_pool.read(host)), want), "a host copy holds wrong bytes"


def assert_consistent(cache: TieredCache) -> None:
    """Once idle with no request in progress: every allocated slot is the tree's, nothing is
    locked, no pool is over capacity, and device residency is closed upwards (a node's device
    copy implies its parent's: descendants are evicted first)."""
    settle(cache)
    s = cache.stats()
    for usage in (s.device, s.host):
        assert usage.used_pages == usage.cached_pages <= usage.capacity_pages
        assert usage.locked_pages == 0
    assert cache.device_pool.num_used == tree_pages(cache, "device")
    assert cache.host_pool.num_used == tree_pages(cache, "host")
    with cache.tree.lock:
        for node in cache.tree.iter_nodes():
            if node.device_slots is not None and not node.parent.is_root:
                assert node.parent.device_slots is not None, f"{node} is on device, its parent is not"
    assert_tree_bytes(cache)


def make_config(tmp_path, **overrides) -> CacheConfig:
    settings = {"page_size": P, "device_size": "8pages", "host_size": "16pages", "disk_path": tmp_path / "disk"}
    settings.update(overrides)
    return CacheConfig(**settings)


@contextmanager
def open_cache(config: CacheConfig, **kwargs):
    cache = TieredCache(config, TINY, **kwargs) if "store" in kwargs else TieredCache.open(config, TINY, **kwargs)
    try:
        yield cache
    finally:
        cache.close()


@contextmanager
def open_faulty_cache(config: CacheConfig, **kwargs):
    """A cache whose store reaches its payloads through FaultyPayloads (the real folder tree, with
    faults and stalls on cue: ``cache.store.payloads``)."""
    root = store_root(config.disk_path, TINY)
    store = ChunkStore(root, TINY, capacity_bytes=config.disk_capacity_bytes(KVLayout.from_identity(TINY)),
                       payloads=FaultyPayloads(ChunkFiles(root)))
    try:
        with open_cache(config, store=store, **kwargs) as cache:
            yield cache
    finally:
        store.close()


@contextmanager
def stalled_disk_reads(cache: TieredCache):
    """Hold every payload read of the cache's store (one of ``open_faulty_cache``): disk -> host
    loads wait until the block ends."""
    with cache.store.payloads.held("read", timeout_s=SETTLE_S):
        yield


@contextmanager
def stalled_pool(pool):
    """Hold a pool's allocator lock (``PagePool.lock``, public for this): a transfer that touches
    the pool waits until the block ends."""
    with pool.lock:
        yield


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + SETTLE_S
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.001)


def in_thread(fn):
    """Start ``fn`` on a thread; returns (thread, result dict with 'value' or 'error')."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # reported by the test, not lost in the thread
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def outcome(out: dict):
    """The value an ``in_thread`` function returned, or its exception raised here."""
    if "error" in out:
        raise out["error"]
    return out["value"]


def persist_run(tmp_path, prefixes, ns: str = DEFAULT_NAMESPACE, **overrides) -> None:
    """A first run that serves ``prefixes`` and closes with a flush: they are on disk after it."""
    with open_cache(make_config(tmp_path, **overrides)) as cache:
        for tokens in prefixes:
            serve(cache, tokens, ns)
        result = cache.flush()
        assert result.failed_pages == 0
        cache.close(flush=True)


# ---- round trip and warm start ------------------------------------------------------------------

@pytest.mark.parametrize("compression,ns", [("auto", DEFAULT_NAMESPACE), ("none", "tenant-a"),
                                            ("zstd", DEFAULT_NAMESPACE), ("zstd_split", "tenant-b")])
def test_device_host_disk_host_device_round_trip_is_bit_identical(tmp_path, compression, ns):
    tokens = toks(1, 2, 3, 4, 5, 6, extra=2)
    with open_cache(make_config(tmp_path, compression=compression)) as cache:
        first = serve(cache, tokens, ns)
        assert first.num_tokens == 0
        settle(cache)  # write-through: backed up to host and persisted
        keys = keys_of(tokens, ns)
        assert cache.store.exists(keys) == [True] * 6
        assert cache.tree.stats().persisted_pages == 6 and tree_pages(cache, "host") == 6
        assert cache.peek(tokens, ns) == (24, 0, 0)  # a page on device and host counts as device

        force_evict(cache, "device", 6)
        assert cache.peek(tokens, ns) == (0, 24, 0)
        assert_tree_bytes(cache)
        force_evict(cache, "host", 6)
        assert tree_pages(cache, "device") == tree_pages(cache, "host") == 0
        assert cache.peek(tokens, ns) == (0, 0, 24)

        hit = cache.match(tokens, ns)
        try:
            assert (hit.num_tokens, hit.device_tokens, hit.host_tokens, hit.disk_tokens) == (24, 0, 0, 24)
            assert_hit(cache, hit, tokens, ns)
        finally:
            cache.release(hit)
        assert tree_pages(cache, "host") == 6  # the host copies stay (disk_load_host_share 1)
        assert_consistent(cache)
        assert cache.peek(tokens, "another-namespace") == (0, 0, 0)  # namespaces never share pages


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_warm_start_finds_every_persisted_prefix(tmp_path, policy):
    prefixes = {
        DEFAULT_NAMESPACE: [toks(1, 2, 3, 4), toks(1, 2, 5, 6, 7, extra=1), toks(8, 9)],
        "other": [toks(1, 2, 3), toks(10, 11, 12)],
    }
    config = make_config(tmp_path, device_size="20pages", host_size="20pages", write_policy=policy)
    with open_cache(config) as cache:
        for ns, group in prefixes.items():
            for tokens in group:
                serve(cache, tokens, ns)
        result = cache.flush()
        assert (result.persisted_pages, result.failed_pages) == (15, 0)
        cache.close(flush=True)

    with open_cache(config) as cache:
        assert cache.tree.stats().num_nodes == 0
        for ns, group in prefixes.items():
            for tokens in group:
                full = len(tokens) // P * P
                assert cache.peek(tokens, ns)[2] == full
        for ns, group in prefixes.items():
            for tokens in reversed(group):
                hit = lookup(cache, tokens, ns)
                assert hit.num_tokens == len(tokens) // P * P
        assert cache.stats().hit_tokens["disk"] > 0
        assert_consistent(cache)


def host_resident(cache: TieredCache, tokens) -> bool:
    """Whether the node ending at ``tokens`` (whole pages) has a host copy."""
    with cache.tree.lock:
        for node in cache.tree.iter_nodes():
            if node.keys[-1] == chain_pages(TINY, tokens)[-1].key:
                return node.host_slots is not None
    raise AssertionError("no such node")


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_flush_writes_pages_that_find_host_room_only_once_earlier_pages_are_on_disk(tmp_path, policy):
    """A device page whose backup finds the host full of pages still being written gets its host
    copy, and its disk copy, in a later round of the same flush."""
    gate = threading.Event()
    config = make_config(tmp_path, device_size="8pages", host_size="8pages", write_policy=policy)
    with open_cache(config) as cache:
        real_write = cache.store.payloads.os_write

        def gated_write(fd, data):  # the store's write seam: writes wait for the gate
            gate.wait(SETTLE_S)
            return real_write(fd, data)

        cache.store.payloads.os_write = gated_write
        try:
            first, second, third = toks(1, 2, 3, 4), toks(5, 6, 7, 8), toks(9, 10, 11, 12)
            serve(cache, first)
            serve(cache, second)
            if policy == "write_through":  # the first two are copied to host and wait to be written
                wait_until(lambda: cache.host_pool.num_used == 8, "both host copies")
            else:  # write-back: the device evicts the first into host, unwritten, to make room
                serve(cache, third)
                flushing, out = in_thread(cache.flush)  # ...and its first round writes and backs up
                time.sleep(0.2)
            if policy == "write_through":
                serve(cache, third)  # the host holds the first two, still being written: no room
                assert host_resident(cache, third) is False, "the third prefix found host room early"
                flushing, out = in_thread(cache.flush)
                time.sleep(0.2)  # the flush's first round is waiting for the gated writes
            gate.set()
            flushing.join(SETTLE_S)
            result = outcome(out)
        finally:
            cache.store.payloads.os_write = real_write
        assert result.failed_pages == 0
        assert all(all(cache.store.exists(keys_of(t))) for t in (first, second, third))



# ---- write policies -----------------------------------------------------------------------------

def test_write_through_backs_up_and_persists_every_new_page(tmp_path):
    with open_cache(make_config(tmp_path)) as cache:
        tokens = toks(1, 2, 3, 4)
        serve(cache, tokens)
        settle(cache)
        s = cache.stats()
        assert s.host.cached_pages == 4 and cache.tree.stats().persisted_pages == 4
        assert cache.store.exists(keys_of(tokens)) == [True] * 4
        assert s.paths["device_to_host"].num_pages == s.paths["host_to_disk"].num_pages == 4
        serve(cache, toks(1, 2, 3, 4, 5))  # only the new page is written
        settle(cache)
        s = cache.stats()
        assert s.paths["host_to_disk"].num_pages == 5 and s.disk.num_chunks == 5
        assert_consistent(cache)


def test_write_through_selective_waits_for_the_threshold(tmp_path):
    config = make_config(tmp_path, write_policy="write_through_selective", write_through_threshold=2)
    with open_cache(config) as cache:
        tokens = toks(1, 2, 3)
        serve(cache, tokens, prefetch=True)
        settle(cache)
        assert cache.stats().host.cached_pages == 0 and cache.stats().disk.num_chunks == 0
        serve(cache, tokens, prefetch=True)  # one hit (a prefetch is not one)
        settle(cache)
        assert cache.stats().host.cached_pages == 0 and cache.stats().disk.num_chunks == 0
        serve(cache, tokens, prefetch=True)  # the second hit
        settle(cache)
        assert cache.stats().host.cached_pages == 3
        assert cache.store.exists(keys_of(tokens)) == [True] * 3
        assert_consistent(cache)


def test_one_request_counts_one_hit(tmp_path):
    """A prefetched request whose prefix is part on device, part on host counts one hit on each
    node it used, however often the cache looks again (prefetch, load-back)."""
    with open_cache(make_config(tmp_path)) as cache:
        for n in (2, 4, 6):  # three nodes of two pages
            serve(cache, toks(*range(1, n + 1)))
        settle(cache)
        force_evict(cache, "device", 4)
        force_evict(cache, "host", 2)  # the deepest node is on disk only
        tokens = toks(1, 2, 3, 4, 5, 6)
        assert cache.prefetch(tokens) == 2
        settle(cache)
        before = [n.hit_count for n in cache.tree.iter_nodes()]
        hit = lookup(cache, tokens)
        assert (hit.device_tokens, hit.host_tokens, hit.disk_tokens) == (8, 16, 0)
        assert [n.hit_count for n in cache.tree.iter_nodes()] == [count + 1 for count in before]


def test_each_lookup_of_the_disk_tier_is_timed(tmp_path):
    """Every time the cache asks the disk tier's index (a match past the memory tiers, a peek), it
    counts the lookup's wall time (``CacheStats.disk_lookup``); a match the memory tiers answer
    whole does not ask."""
    with open_cache(make_config(tmp_path)) as cache:
        assert cache.stats().disk_lookup.count == 0
        tokens = toks(1, 2, 3)
        serve(cache, tokens)  # an empty cache: the disk tier is asked, and misses
        asked = cache.stats().disk_lookup.count
        assert asked >= 1
        lookup(cache, tokens)  # all on device: nothing to ask the disk
        assert cache.stats().disk_lookup.count == asked
        cache.peek(toks(1, 2, 3, 4, 5))
        timed = cache.stats().disk_lookup
        assert timed.count == asked + 1 and timed.total > 0


def test_write_back_writes_only_on_eviction_and_loses_nothing(tmp_path):
    config = make_config(tmp_path, write_policy="write_back", device_size="4pages", host_size="8pages")
    prefixes = [toks(i, i, i, i) for i in (1, 2, 3, 4)]
    with open_cache(config) as cache:
        serve(cache, prefixes[0])
        settle(cache)
        assert tree_pages(cache, "host") == 0 and cache.stats().disk.num_chunks == 0
        serve(cache, prefixes[1])  # evicts the first from the device: backed up to host
        settle(cache)
        assert cache.peek(prefixes[0]) == (0, 16, 0) and cache.stats().disk.num_chunks == 0
        serve(cache, prefixes[2])
        serve(cache, prefixes[3])  # the host is full: its oldest page goes down to disk
        settle(cache)
        assert cache.store.exists(keys_of(prefixes[0])) == [True] * 4
        assert cache.stats().disk.num_chunks == 4
        assert cache.peek(prefixes[0]) == (0, 0, 16)
        assert cache.peek(prefixes[1]) == (0, 16, 0) and cache.peek(prefixes[2]) == (0, 16, 0)
        assert cache.peek(prefixes[3]) == (16, 0, 0)
        s = cache.stats()
        assert s.paths["device_to_host"].num_pages == 12  # eviction copies count as transfers
        assert s.paths["host_to_disk"].num_pages == 4
        for _ in range(2):
            for tokens in prefixes:
                assert lookup(cache, tokens).num_tokens == 16
        assert_consistent(cache)


# ---- prefetch policies --------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["best_effort", "wait_complete", "timeout"])
def test_a_disk_hit_without_prefetch_is_loaded_at_once(tmp_path, policy):
    tokens = toks(1, 2, 3, 4, 5)
    persist_run(tmp_path, [tokens])
    config = make_config(tmp_path, prefetch_policy=policy, prefetch_timeout_s=SETTLE_S)
    with open_cache(config) as cache:
        hit = lookup(cache, tokens)
        assert (hit.num_tokens, hit.disk_tokens) == (20, 20)
        assert cache.stats().paths["disk_to_host"].num_pages == 5


@pytest.mark.timeout(60)
@pytest.mark.parametrize("policy", ["best_effort", "timeout"])
def test_a_match_does_not_wait_for_a_stalled_prefetch(tmp_path, policy):
    tokens = toks(1, 2, 3, 4)
    persist_run(tmp_path, [tokens])
    config = make_config(tmp_path, prefetch_policy=policy, prefetch_timeout_s=0.05)
    with open_faulty_cache(config) as cache:
        with stalled_disk_reads(cache):
            assert cache.prefetch(tokens) == 4
            assert cache.stats().queue_depths["disk_to_host"] == 1
            t, out = in_thread(lambda: cache.match(tokens))
            t.join(SETTLE_S)
            assert not t.is_alive(), "match waited for a prefetch that cannot finish"
            hit = outcome(out)
            assert hit.num_tokens == 0  # nothing has landed: the request recomputes
            cache.release(hit)
            assert cache.stats().queue_depths["disk_to_host"] == 1
        settle(cache)
        hit = lookup(cache, tokens)  # the prefetch landed since
        assert (hit.num_tokens, hit.host_tokens) == (16, 16)
        assert_consistent(cache)


@pytest.mark.timeout(60)
def test_wait_complete_waits_for_the_prefetch(tmp_path):
    tokens = toks(1, 2, 3, 4)
    persist_run(tmp_path, [tokens])
    with open_faulty_cache(make_config(tmp_path, prefetch_policy="wait_complete")) as cache:
        with stalled_disk_reads(cache):
            cache.prefetch(tokens)
            t, out = in_thread(lambda: lookup(cache, tokens))
            t.join(0.3)
            assert t.is_alive(), "wait_complete returned before the prefetch landed"
        t.join(SETTLE_S)
        assert not t.is_alive()
        hit = outcome(out)
        assert hit.num_tokens == 16 and hit.host_tokens + hit.disk_tokens == 16
        assert_consistent(cache)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("policy, wait, waits", [("best_effort", True, True), ("wait_complete", False, False)])
def test_the_caller_can_override_the_wait_for_a_prefetch(tmp_path, policy, wait, waits):
    """An idle engine waits for a prefetch in flight whatever the policy; a busy one may not."""
    tokens = toks(1, 2, 3, 4)
    persist_run(tmp_path, [tokens])
    with open_faulty_cache(make_config(tmp_path, prefetch_policy=policy)) as cache:
        with stalled_disk_reads(cache):
            assert cache.prefetch(tokens) == 4
            t, out = in_thread(lambda: cache.match(tokens, wait_for_prefetch=wait))
            t.join(0.3 if waits else SETTLE_S)
            assert t.is_alive() == waits
        t.join(SETTLE_S)
        hit = outcome(out)
        assert hit.num_tokens == (16 if waits else 0)
        assert_hit(cache, hit, tokens)
        cache.release(hit)
        settle(cache)
        assert_consistent(cache)


def test_insert_from_page_adds_only_the_pages_after_the_hit(tmp_path):
    with open_cache(make_config(tmp_path, use_disk=False)) as cache:
        first, longer = toks(1, 2), toks(1, 2, 3, 4, extra=2)
        serve(cache, first)
        hit = cache.match(longer)
        assert hit.num_pages == 2
        new = compute(cache, keys_of(longer)[2:])
        cache.insert(longer, new, from_page=hit.num_pages)  # no slots for the hit's pages
        cache.release(hit)
        assert cache.peek(longer)[0] == 16
        assert lookup(cache, longer).num_tokens == 16
        orphan = compute(cache, keys_of(toks(7, 8, 9))[2:])
        with pytest.raises(ValueError, match="must be in the tree"):
            cache.insert(toks(7, 8, 9), orphan, from_page=2)  # nothing of 7 8 is in the tree
        cache.free_device(orphan)  # a refused insert takes no slot
        assert_consistent(cache)


@pytest.mark.parametrize("share,host_pages", [(0.0, 0), (1.0, 6)])
def test_disk_load_host_share(tmp_path, share, host_pages):
    tokens = toks(1, 2, 3, 4, 5, 6)
    persist_run(tmp_path, [tokens])
    with open_cache(make_config(tmp_path, disk_load_host_share=share)) as cache:
        hit = lookup(cache, tokens)
        assert (hit.num_tokens, hit.disk_tokens) == (24, 24)
        assert_consistent(cache)
        assert tree_pages(cache, "host") == cache.host_pool.num_used == host_pages
        assert cache.store.exists(keys_of(tokens)) == [True] * 6  # freed from host, still on disk
        force_evict(cache, "device", 6)
        hit = lookup(cache, tokens)
        assert hit.num_tokens == 24
        assert (hit.host_tokens, hit.disk_tokens) == ((24, 0) if share else (0, 24))
        assert_consistent(cache)


# ---- no disk tier -------------------------------------------------------------------------------

def test_without_a_disk_tier(tmp_path):
    config = make_config(tmp_path, use_disk=False)
    with open_cache(config) as cache:
        assert cache.store is None and cache.stats().disk is None
        tokens = toks(1, 2, 3)
        serve(cache, tokens)
        assert cache.prefetch(tokens) == 0
        settle(cache)
        assert cache.stats().paths["host_to_disk"].num_ops == 0
        force_evict(cache, "device", 3)
        hit = lookup(cache, tokens)
        assert (hit.num_tokens, hit.host_tokens) == (12, 12)
        force_evict(cache, "device", 3)
        force_evict(cache, "host", 3)  # the last copy: gone, with nothing below to keep it
        assert cache.peek(tokens) == (0, 0, 0) and cache.tree.stats().num_nodes == 0
        serve(cache, tokens)
        assert cache.flush().failed_pages == 3  # nothing can be written down
        assert json.dumps(cache.stats().as_dict())
        cache.close(flush=True)
    assert not (tmp_path / "disk").exists()


# ---- eviction -----------------------------------------------------------------------------------

def test_locked_pages_are_never_evicted(tmp_path):
    with open_cache(make_config(tmp_path, use_disk=False)) as cache:
        a, b, c = toks(1, 2, 3, 4), toks(5, 6, 7, 8), toks(9, 10, 11, 12)
        serve(cache, a)
        held_a = serve(cache, a, hold=True)
        assert held_a.num_tokens == 16
        serve(cache, b)
        serve(cache, c)  # the device is full: b goes, the locked a stays
        assert cache.peek(a)[0] == 16 and cache.peek(b)[0] == 0
        assert_hit(cache, held_a, a)
        held_c = serve(cache, c, hold=True)
        settle(cache)
        with pytest.raises(PoolExhaustedError, match=r"0 free and the rest are locked by requests in progress"):
            cache.allocate_device(1)
        with pytest.raises(PoolExhaustedError, match=r"9 device pages asked; the device pool holds 8"):
            cache.allocate_device(9)
        assert_hit(cache, held_a, a)
        assert_hit(cache, held_c, c)
        cache.release(held_a)
        with pytest.raises(ValueError, match="already released"):
            cache.release(held_a)
        slots = cache.allocate_device(4)  # a is unlocked now: it can go
        assert cache.peek(a)[0] == 0 and cache.peek(c)[0] == 16
        cache.free_device(slots)
        cache.release(held_c)
        assert_consistent(cache)


def test_a_hit_locks_only_the_pages_it_returns(tmp_path):
    """A match ending inside a node locks those pages, not the node's rest: the request that
    diverges there must be able to evict the rest to make room for its own pages."""
    with open_cache(make_config(tmp_path, device_size="6pages", use_disk=False)) as cache:
        serve(cache, toks(0, 1, 2, 3))
        hit = serve(cache, toks(0, 9, 10, 11))  # one page shared; three new ones need the rest
        assert hit.num_tokens == P
        assert cache.peek(toks(0, 9, 10, 11))[0] == 4 * P
        assert_consistent(cache)


def test_a_closed_controller_fails_its_ops_and_frees_what_they_held(tmp_path):
    config = make_config(tmp_path)
    with open_cache(config) as cache:
        serve(cache, toks(1, 2, 3, 4))
        cache.flush()
    with open_cache(config) as cache:
        cache.controller.close()  # as if a close() on another thread got this far
        hit = cache.match(toks(1, 2, 3, 4))  # the prefetch fails at once: a miss, nothing held
        assert hit.num_tokens == 0
        cache.release(hit)
        assert cache.host_pool.num_used == 0 and cache.device_pool.num_used == 0
        assert cache.stats().paths["disk_to_host"].failed_pages == 4


def test_descendants_are_evicted_before_ancestors(tmp_path):
    with open_cache(make_config(tmp_path, use_disk=False)) as cache:
        serve(cache, toks(1, 2, 3, 4))
        serve(cache, toks(1, 2, 5))  # splits the first node: a parent (1 2) with two children
        settle(cache)  # no backup in flight locks a node
        with cache.tree.lock:
            nodes = {cache.tree.prefix_tokens(n): n for n in cache.tree.iter_nodes()}
        parent, old_child, new_child = (nodes[tuple(toks(*ids))] for ids in ((1, 2), (1, 2, 3, 4), (1, 2, 5)))
        # By LRU alone the parent would go second: as recent as the new child, and older (smaller id).
        assert old_child.last_access < parent.last_access == new_child.last_access
        assert parent.id < new_child.id
        force_evict(cache, "device", 1)
        assert cache.peek(toks(1, 2, 3, 4))[0] == 8 and cache.peek(toks(1, 2, 5))[0] == 12
        force_evict(cache, "device", 1)
        assert cache.peek(toks(1, 2, 5))[0] == 8  # the child went, not its older-ranked parent
        force_evict(cache, "device", 1)
        assert cache.tree.stats().device_pages == 0
        assert cache.stats().evicted_pages["device"] == 5
        assert_consistent(cache)


@pytest.mark.timeout(60)
def test_a_split_during_a_load_back_leaves_every_page_in_place(tmp_path):
    """Request x loads a host node back; before its copy lands, request y's shorter match splits
    that node. x's pages must land in the right (now two) nodes, and no slot may leak."""
    config = make_config(tmp_path, use_disk=False, write_policy="write_back")
    with open_cache(config) as cache:
        a = toks(1, 2, 3, 4)
        serve(cache, a)
        force_evict(cache, "device", 4)  # a is one host-only node of four pages
        assert cache.peek(a) == (0, 16, 0) and cache.tree.stats().num_nodes == 1

        def depth() -> int:
            return cache.controller.queue_depths()["host_to_device"]

        with stalled_pool(cache.host_pool):  # load-backs wait to read the host pages
            x, x_out = in_thread(lambda: cache.match(a))
            wait_until(lambda: depth() == 1, "x's load-back is queued")
            y, y_out = in_thread(lambda: cache.match(toks(1, 2, 9)))
            wait_until(lambda: depth() == 2, "y's load-back is queued")
            assert cache.tree.stats().num_nodes == 2  # y split the node x is loading
        for t in (x, y):
            t.join(SETTLE_S)
            assert not t.is_alive()
        hits = [(outcome(x_out), a), (outcome(y_out), toks(1, 2, 9))]
        try:
            for hit, tokens in hits:
                assert_hit(cache, hit, tokens)
            assert hits[0][0].num_tokens == 16 and hits[1][0].num_tokens == 8
        finally:
            for hit, _ in hits:
                cache.release(hit)
        assert_consistent(cache)
        assert lookup(cache, a).num_tokens == 16


def test_a_disk_continuation_diverging_inside_a_node_is_loaded_in_its_place(tmp_path):
    """The tree holds (1 2 5 6) as one node; (1 2 3 4) is on disk. Loading (3 4) must split the
    node after (1 2), not hang the pages under (5 6)."""
    persist_run(tmp_path, [toks(1, 2, 3, 4)])
    with open_cache(make_config(tmp_path)) as cache:
        other = toks(1, 2, 5, 6)
        cache.insert(other, compute(cache, keys_of(other)))  # computed without a lookup
        settle(cache)
        assert cache.tree.stats().num_nodes == 1
        hit = lookup(cache, toks(1, 2, 3, 4))
        assert (hit.num_tokens, hit.device_tokens, hit.disk_tokens) == (16, 8, 8)
        assert cache.peek(toks(1, 2, 5, 6, 3, 4)) == (16, 0, 0)  # (3 4) does not follow (5 6)
        assert lookup(cache, toks(1, 2, 5, 6, 3, 4)).num_tokens == 16
        assert_consistent(cache)


# ---- failures fail closed -----------------------------------------------------------------------

def _damage(path, how: str) -> None:
    if how == "deleted":
        path.unlink()
    elif how == "truncated":
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)
    else:  # one flipped byte near the end of the payload
        data = bytearray(path.read_bytes())
        data[-7] ^= 0x5A
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["corrupt", "deleted", "truncated"])
def test_a_damaged_chunk_is_a_miss_never_wrong_bytes(tmp_path, how):
    tokens = toks(1, 2, 3, 4, 5, 6)
    persist_run(tmp_path, [tokens])
    config = make_config(tmp_path)
    with open_cache(config) as cache:
        _damage(cache.store.payloads.path_for(keys_of(tokens)[3]), how)
        hit = lookup(cache, tokens)
        assert (hit.num_tokens, hit.disk_tokens) == (12, 12)  # up to the damaged page only
        assert cache.store.exists(keys_of(tokens)) == [True, True, True, False, True, True]
        if how != "deleted":
            assert cache.stats().disk.quarantined == 1
        assert_consistent(cache)
        serve(cache, tokens)  # recomputed and written again
        settle(cache)
        assert cache.store.exists(keys_of(tokens)) == [True] * 6
    with open_cache(config) as cache:
        assert lookup(cache, tokens).num_tokens == 24


def _unwritable(tmp_path, how: str) -> dict:
    if how == "full":
        return {"disk_size": 1e-9}  # a one-byte store: no chunk fits
    return {}


def _lock_chunks_folder(cache: TieredCache, how: str) -> None:
    chunks = cache.store.payloads.chunks_dir
    if how == "read_only":
        os.chmod(chunks, 0o555)
    elif how == "not_a_folder":  # every publish fails, whoever runs the test (root included)
        chunks.rmdir()
        chunks.write_bytes(b"")


UNWRITABLE = [
    "full",
    "not_a_folder",
    pytest.param("read_only", marks=pytest.mark.skipif(
        os.geteuid() == 0, reason="root writes into read-only folders")),
]


@pytest.mark.parametrize("how", UNWRITABLE)
def test_an_unwritable_disk_never_marks_a_page_persisted(tmp_path, how):
    config = make_config(tmp_path, **_unwritable(tmp_path, how))
    with open_cache(config) as cache:
        _lock_chunks_folder(cache, how)
        tokens = toks(1, 2, 3, 4)
        serve(cache, tokens)
        settle(cache)
        s = cache.stats()
        assert s.paths["host_to_disk"].failed_pages == 4 and s.paths["host_to_disk"].num_pages == 0
        assert cache.tree.stats().persisted_pages == 0 and s.disk.num_chunks == 0
        assert cache.store.exists(keys_of(tokens)) == [False] * 4
        result = cache.flush()
        assert (result.persisted_pages, result.failed_pages) == (0, 4)
        assert lookup(cache, tokens).num_tokens == 16  # still served from memory
        assert_consistent(cache)


@pytest.mark.parametrize("how", UNWRITABLE)
def test_write_back_keeps_host_copies_that_could_not_be_written(tmp_path, how):
    config = make_config(tmp_path, write_policy="write_back", device_size="4pages", host_size="4pages",
                         **_unwritable(tmp_path, how))
    with open_cache(config) as cache:
        _lock_chunks_folder(cache, how)
        a, b, c = toks(1, 2, 3, 4), toks(5, 6, 7, 8), toks(9, 10, 11, 12)
        serve(cache, a)
        serve(cache, b)  # a is backed up to host
        assert cache.peek(a) == (0, 16, 0)
        with pytest.raises(PoolExhaustedError):
            serve(cache, c)  # b cannot go to host: a, its only other copy failing to reach disk, stays
        assert cache.peek(a) == (0, 16, 0) and cache.peek(b) == (16, 0, 0)
        assert cache.tree.stats().persisted_pages == 0 and cache.stats().disk.num_chunks == 0
        assert cache.stats().paths["host_to_disk"].failed_pages >= 4
        assert lookup(cache, b).num_tokens == 16
        assert_consistent(cache)  # includes the bytes of a's host copy
        assert cache.flush().failed_pages == 8


def test_a_page_the_store_evicted_is_written_again_before_its_host_copy_goes(tmp_path):
    """``persisted`` is a hint: a bounded store may evict the chunk since. The last copy in memory
    is only freed once the store really holds the page."""
    with open_cache(make_config(tmp_path / "probe", compression="none")) as probe:
        serve(probe, toks(1))
        settle(probe)
        chunk_bytes = probe.stats().disk.stored_bytes
    config = make_config(tmp_path, compression="none", disk_size=3.5 * chunk_bytes / 1e9)  # three chunks
    with open_cache(config) as cache:
        a, b = toks(1, 2), toks(3, 4)
        serve(cache, a)
        settle(cache)
        serve(cache, b)  # the store makes room for b by evicting a's last page
        settle(cache)
        assert cache.store.exists(keys_of(a)) == [True, False]
        assert cache.tree.stats().persisted_pages == 4  # the tree's hint is stale
        assert cache.stats().disk.evictions == 1
        force_evict(cache, "device", 8)
        force_evict(cache, "host", 2)  # a, the least recently used, leaves host memory
        assert cache.peek(a) == (0, 0, 8) and cache.store.exists(keys_of(a)) == [True, True]
        hit = lookup(cache, a)
        assert (hit.num_tokens, hit.disk_tokens) == (8, 8)
        assert lookup(cache, b).num_tokens == 8
        assert_consistent(cache)


# ---- stats --------------------------------------------------------------------------------------

def test_stats_count_hits_per_tier_bytes_per_path_and_evictions(tmp_path):
    with open_cache(make_config(tmp_path)) as cache:
        for n in (2, 4, 6):  # three nodes of two pages
            serve(cache, toks(*range(1, n + 1)))
        settle(cache)
        force_evict(cache, "device", 4)  # the two deepest nodes leave the device
        force_evict(cache, "host", 2)  # the deepest leaves host memory: on disk only
        tokens = toks(1, 2, 3, 4, 5, 6, extra=3)
        assert cache.peek(tokens) == (8, 8, 8)
        before = cache.stats()
        hit = lookup(cache, tokens)
        assert (hit.device_tokens, hit.host_tokens, hit.disk_tokens) == (8, 8, 8)
        settle(cache)
        after = cache.stats()
        assert after.lookups - before.lookups == 1
        assert after.lookup_tokens - before.lookup_tokens == 27
        assert {t: after.hit_tokens[t] - before.hit_tokens[t] for t in after.hit_tokens} == \
            {"device": 8, "host": 8, "disk": 8}
        moved = {name: (after.paths[name].num_pages - before.paths[name].num_pages,
                        after.paths[name].num_bytes - before.paths[name].num_bytes) for name in after.paths}
        assert moved == {"disk_to_host": (2, 2 * PAGE_BYTES), "host_to_device": (4, 4 * PAGE_BYTES),
                         "device_to_host": (0, 0), "host_to_disk": (0, 0)}
        assert after.evicted_pages == {"device": 4, "host": 2}
        assert after.paths["device_to_host"].num_bytes == 6 * PAGE_BYTES
        assert after.paths["host_to_disk"].num_bytes == 6 * PAGE_BYTES
        assert after.queue_depths == {"device_to_host": 0, "host_to_disk": 0, "disk_to_host": 0,
                                      "host_to_device": 0}
        assert after.device.used_bytes == after.device.used_pages * PAGE_BYTES
        assert after.disk.num_chunks == 6 and after.disk.capacity_bytes is None
        data = json.loads(json.dumps(after.as_dict()))
        assert data["hit_tokens"] == after.hit_tokens and data["device"]["capacity_bytes"] == 8 * PAGE_BYTES
        assert data["hit_rate"] == pytest.approx(after.hit_rate)
        assert set(data["paths"]["host_to_device"]) >= {"num_ops", "num_pages", "num_bytes", "gbps"}


def test_write_back_eviction_copies_are_counted(tmp_path):
    config = make_config(tmp_path, write_policy="write_back", device_size="4pages", host_size="4pages")
    with open_cache(config) as cache:
        serve(cache, toks(1, 2, 3, 4))
        force_evict(cache, "device", 4)
        force_evict(cache, "host", 4)
        s = cache.stats()
        assert (s.paths["device_to_host"].num_pages, s.paths["device_to_host"].num_bytes) == (4, 4 * PAGE_BYTES)
        assert (s.paths["host_to_disk"].num_pages, s.paths["host_to_disk"].num_bytes) == (4, 4 * PAGE_BYTES)
        assert s.evicted_pages == {"device": 4, "host": 4}


# ---- concurrency --------------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_concurrent_requests_on_overlapping_prefixes(tmp_path, policy):
    """Four engine threads on a tree of shared prefixes, pools far smaller than the working set."""
    num_threads, num_requests, max_pages = 4, 40, 6
    # A request locks its hit's nodes (up to max_pages, whole nodes) and allocates up to
    # max_pages - 1 more: room for all at once, and still far less than the ~120 distinct pages.
    device_pages = num_threads * (2 * max_pages - 1) + 2
    config = make_config(tmp_path, write_policy=policy, device_size=f"{device_pages}pages",
                         host_size=f"{device_pages + 16}pages")
    errors: list[BaseException] = []
    hits: list[int] = []

    def engine(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        try:
            for _ in range(num_requests):
                length = int(torch.randint(2, max_pages + 1, (1,), generator=g))
                ids = [0] + torch.randint(1, 3, (length - 1,), generator=g).tolist()
                tokens = toks(*ids, extra=int(torch.randint(0, P, (1,), generator=g)))
                ns = DEFAULT_NAMESPACE if seed % 2 else "tenant"
                hit = serve(cache, tokens, ns, prefetch=bool(torch.randint(0, 2, (1,), generator=g)))
                hits.append(hit.num_tokens)
        except BaseException as exc:
            errors.append(exc)

    with open_cache(config) as cache:
        threads = [threading.Thread(target=engine, args=(seed,), daemon=True) for seed in range(num_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(SETTLE_S)
        assert not any(t.is_alive() for t in threads), "deadlock: an engine thread never finished"
        if errors:
            raise errors[0]
        assert len(hits) == num_threads * num_requests and sum(hits) > 0
        assert_consistent(cache)
        s = cache.stats()
        assert s.evicted_pages["device"] > 0
        assert s.hit_tokens["device"] + s.hit_tokens["host"] + s.hit_tokens["disk"] == sum(hits)
        cache.close(flush=True)
    with open_cache(config) as cache:  # and everything written is whole after a restart
        for ns in (DEFAULT_NAMESPACE, "tenant"):
            for ids in ([0, 1, 1], [0, 2, 2], [0, 1, 2, 1], [0, 2, 1, 2, 1, 2]):
                found = sum(cache.peek(toks(*ids), ns))
                assert lookup(cache, toks(*ids), ns).num_tokens == found


def test_a_failing_disk_lookup_leaves_no_lock_behind(tmp_path):
    with open_cache(make_config(tmp_path)) as cache:
        serve(cache, toks(1, 2))

        def failing(keys, namespace=None):  # a fault injected into the real store: its index cannot be read
            raise OSError("the index is unreadable")

        cache.store.longest_prefix = failing
        try:
            with pytest.raises(OSError, match="unreadable"):
                cache.match(toks(1, 2, 3, 4))  # the tree part is locked first, then the disk fails
        finally:
            del cache.store.longest_prefix
        assert_consistent(cache)  # settled: nothing locked, every slot the tree's
