"""Background copies run at the background priority, the request path's at its own (Linux)."""

from __future__ import annotations

import sys
import threading

import pytest

from chunkstore import ChunkStore
from chunkstore.cache import CacheConfig
from chunkstore.cache.tiered import TieredCache
from chunkstore.priority import ThreadPriority, lower_this_thread, thread_priority
from tests.helpers import TINY, kv_pages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's")


def _priorities(prefix: str) -> set[tuple[str, int]]:
    return {thread_priority(t.native_id) for t in threading.enumerate() if t.name.startswith(prefix)}


@pytest.mark.parametrize("priority, expected", [("normal", ("other", 0)), ("low", ("other", 19)),
                                                ("idle", ("idle", 0))])
def test_a_thread_lowers_only_itself(priority, expected):
    seen = {}

    def body():
        seen["ok"] = lower_this_thread(ThreadPriority.parse(priority))
        seen["now"] = thread_priority(threading.get_native_id())

    before = thread_priority(threading.get_native_id())
    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == {"ok": True, "now": expected}
    assert thread_priority(threading.get_native_id()) == before  # the caller's stays


def test_the_stores_writes_and_background_reads_run_at_its_background_priority(tmp_path):
    from chunkstore.disk.keys import chain_pages

    pages = chain_pages(TINY, list(range(TINY.page_size * 4)))
    with ChunkStore(tmp_path, TINY, background_priority="idle", num_workers=2) as store:
        assert store.put(pages, kv_pages(TINY, len(pages))).ok
        assert _priorities("chunkstore-write") == {("idle", 0)}
        assert store.get(pages[:1])[0] is not None
        assert _priorities("chunkstore-read") | _priorities("chunkstore-decode") == {("other", 0)}
        outs = store.get(pages[1:2])
        assert store.get_into(pages[1:2], outs, background=True) == [True]
        assert _priorities("chunkstore-background-read") | _priorities("chunkstore-background-decode") == {("idle", 0)}


def test_the_cache_runs_backups_and_persists_at_the_background_priority(tmp_path):
    config = CacheConfig(page_size=TINY.page_size, device_size="8pages", host_size="16pages",
                         disk_path=tmp_path / "disk", background_priority="low")
    with TieredCache.open(config, TINY) as cache:
        assert cache.store.background_priority is ThreadPriority.LOW
        for name in ("chunkstore-device_to_host", "chunkstore-host_to_disk"):
            assert _priorities(name) == {("other", 19)}, name
        for name in ("chunkstore-disk_to_host", "chunkstore-host_to_device"):
            assert _priorities(name) == {("other", 0)}, name


def test_an_unknown_priority_is_refused_with_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match="normal, low, idle"):
        CacheConfig(background_priority="lowest")
    with pytest.raises(ValueError, match="normal, low, idle"):
        ChunkStore(tmp_path, TINY, background_priority="realtime")
