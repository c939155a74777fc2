"""A live cache whose disk writes fail (a real store, its write(2) failing with ENOSPC through
ChunkFiles.os_write): GET /stats, /events and /metrics report the failures and the degraded store,
/readyz stays ready (serving from memory goes on), and all clears once a write succeeds."""

from __future__ import annotations

import errno
import json

from chunkstore.api import CacheBackend, create_app
from tests.helpers.api import client, live_server, settings, warm


def _no_space(fd, data):
    raise OSError(errno.ENOSPC, "No space left on device")


def _metric(body: str, name: str) -> float:
    lines = [line for line in body.splitlines() if line.startswith(name + " ")]
    assert len(lines) == 1, f"{name} not in the scrape"
    return float(lines[0].split()[1])


def test_failed_writes_show_in_stats_metrics_and_events_and_readyz_stays_ready(live_cache):
    store = live_cache.store
    real_write, store.payloads.os_write = store.payloads.os_write, _no_space
    warm(live_cache)
    assert live_cache.flush().failed_pages > 0
    with live_server(create_app(CacheBackend(live_cache), settings())) as url, client(url) as c:
        disk = c.get("/stats").json()["disk"]
        health = disk["write_health"]
        assert health["degraded"] and health["failures"] >= 1 and health["failed_pages"] >= 1
        assert health["last_error"] == "chunk file: [ENOSPC] No space left on device"
        assert health["last_error_at"] is not None and disk["write_errors"] == health["failed_pages"]
        body = c.get("/metrics").text
        assert _metric(body, "chunkstore_disk_degraded") == 1.0
        assert _metric(body, "chunkstore_disk_write_failures_total") == health["failures"]
        assert _metric(body, "chunkstore_disk_last_write_failure_timestamp_seconds") == health["last_error_at"]
        with c.stream("GET", "/events", params={"max_events": 1}) as r:
            data = next(line for line in r.iter_lines() if line.startswith("data: "))
        assert json.loads(data.removeprefix("data: "))["disk"]["write_health"]["degraded"]
        assert c.get("/readyz").status_code == 200

        store.payloads.os_write = real_write  # space is back
        assert live_cache.flush().failed_pages == 0
        health = c.get("/stats").json()["disk"]["write_health"]
        assert not health["degraded"] and health["last_ok_at"] >= health["last_error_at"]
        assert _metric(c.get("/metrics").text, "chunkstore_disk_degraded") == 0.0
