"""CPU pools start empty and are prefaulted in the background: memory gets mapped, written pages
keep their bytes, and closing stops the thread."""

from __future__ import annotations

import os
import sys
import threading

import pytest
import torch

from chunkstore.cache import CacheConfig, KVLayout, PagePool
from chunkstore.cache.tiered import TieredCache
from chunkstore.testing.tensors import bits
from tests.cache.test_pools import random_pages
from tests.helpers import TINY

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=64, dtype="bfloat16", page_size=64)  # 64 KiB pages
POOL_PAGES = 4096  # 256 MiB
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resident memory read from /proc")


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def prefault_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "chunkstore-prefault"]


def test_a_cpu_pool_becomes_resident_in_the_background():
    before = resident_bytes()
    pool = PagePool(LAYOUT, POOL_PAGES)
    try:
        assert pool.wait_prefaulted(timeout_s=60)
        assert resident_bytes() - before >= 0.9 * pool.capacity_bytes
    finally:
        pool.close()


def test_pages_written_while_it_runs_keep_their_bytes():
    pool = PagePool(LAYOUT, POOL_PAGES)
    try:
        slots = torch.tensor([0, 1, POOL_PAGES // 2, POOL_PAGES - 1])
        pages = random_pages(LAYOUT, len(slots), seed=5)
        pool.buffer[slots] = pages  # at once, while the prefault thread walks the buffer
        assert pool.wait_prefaulted(timeout_s=60)
        assert torch.equal(bits(pool.buffer[slots]), bits(pages))
    finally:
        pool.close()


def test_close_stops_the_thread_and_leaves_the_pool_usable():
    pool = PagePool(LAYOUT, POOL_PAGES)
    pool.close()
    pool.close()  # idempotent
    assert pool.wait_prefaulted(timeout_s=0)
    slots = pool.allocate(2)
    pool.buffer[slots] = random_pages(LAYOUT, 2)
    pool.free(slots)


def test_closing_a_cache_leaves_no_prefault_thread(tmp_path):
    config = CacheConfig(page_size=TINY.page_size, device_size="256MB", host_size="512MB", disk_path=tmp_path)
    cache = TieredCache.open(config, TINY)
    cache.close()  # at once: mapping 768 MB takes the thread a good part of a second
    assert prefault_threads() == []
