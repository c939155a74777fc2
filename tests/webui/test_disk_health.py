"""The overview's disk badge in a real browser: a live cache over a real store whose writes fail
(write(2) raising ENOSPC through ChunkFiles.os_write) shows "degraded" with the reason, and the
badge turns back to OK from the live figures once a write succeeds."""

from __future__ import annotations

import errno

from chunkstore.api import AdminSettings, CacheBackend, create_app
from chunkstore.cache.tiered import TieredCache
from tests.helpers.api import warm
from tests.cache.test_tiered import make_config
from tests.helpers import TINY
from tests.helpers.server import LiveServer
from tests.helpers.webui import TOKEN, Dashboard


def _no_space(fd, data):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_the_overview_shows_the_disk_degraded_while_writes_fail(browser, tmp_path):
    with TieredCache.open(make_config(tmp_path), TINY) as cache:
        files = cache.store.payloads
        real_write, files.os_write = files.os_write, _no_space
        warm(cache)
        assert cache.flush().failed_pages > 0
        app = create_app(CacheBackend(cache), AdminSettings(token=TOKEN, events_interval_s=0.2))
        with LiveServer(app) as live:
            d = Dashboard(browser, live.url).open("overview")
            try:
                page = d.page
                page.wait_for_selector("#disk-health[data-state=degraded]")
                assert page.inner_text("#disk-health") == "Disk degraded: writes failing"
                note = page.inner_text("#disk-write-warning")
                assert "chunk file: [ENOSPC] No space left on device" in note and "memory only" in note
                files.os_write = real_write  # space is back: the next write succeeds
                assert cache.flush().failed_pages == 0
                page.wait_for_selector("#disk-health[data-state=ok]")  # from the live figures
                assert page.inner_text("#disk-health") == "Disk writes OK"
                assert page.is_hidden("#disk-write-warning")
                assert not d.errors, d.errors
            finally:
                d.close()
