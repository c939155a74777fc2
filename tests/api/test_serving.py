"""Serving figures through the API of a real `chunkstore serve` app (the tiny engine on uvicorn): /stats,
/stats/history, /events and /metrics show the requests, tokens and latencies the engine served; the
offline backend has none."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from chunkstore.engine import Engine, load_model
from chunkstore.serve import create_app as create_server
from chunkstore.server.settings import ServerSettings
from tests.helpers.api import live_server, wait_for
from tests.helpers.server import cache_config

BODY = {"prompt": "The cache keeps the keys and values of every prefix it has seen. " * 2, "max_tokens": 4,
        "temperature": 0.0}


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


@pytest.fixture
def server(tiny, tmp_path, monkeypatch) -> Iterator[str]:
    monkeypatch.setenv("CHUNKSTORE_ADMIN_HISTORY_INTERVAL_S", "0.1")
    engine = Engine(tiny, cache_config(tmp_path))
    try:
        with live_server(create_server(engine, ServerSettings())) as url:
            yield url
    finally:
        engine.close()


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
def test_serving_figures_everywhere(server):
    with httpx.Client(base_url=server, timeout=60) as http:
        before = http.get("/api/v1/stats").json()["serving"]
        assert before["requests_total"] == 0 and before["ttft_avg_s"] is None
        results = [http.post("/v1/completions", json=BODY).json() for _ in range(2)]
        s = http.get("/api/v1/stats").json()["serving"]
        assert (s["requests_total"], s["requests_failed"], s["requests_active"]) == (2, 0, 0)
        assert s["completion_tokens_total"] == sum(r["usage"]["completion_tokens"] for r in results) == 8
        assert s["prompt_tokens_total"] == sum(r["usage"]["prompt_tokens"] for r in results)
        assert s["cached_tokens_total"] > 0  # the second prompt came from the cache
        assert s["ttft_count"] == 2 and s["ttft_avg_s"] == pytest.approx(s["ttft_sum_s"] / 2)
        assert s["latency_sum_s"] >= s["ttft_sum_s"] > 0

        samples = wait_for(lambda: [x for x in http.get("/api/v1/stats/history").json()["samples"]
                                    if x["requests_total"] == 2], what="a sample after the requests")
        assert samples[-1]["completion_tokens_total"] == 8 and samples[-1]["ttft_count"] == 2
        assert samples[-1]["ttft_sum_s"] == pytest.approx(s["ttft_sum_s"])

        with http.stream("GET", "/api/v1/events", params={"max_events": 1}) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert json.loads(lines[0][6:])["serving"]["requests_total"] == 2

        metrics = http.get("/api/v1/metrics").text
    for line in ("chunkstore_requests_total 2.0", "chunkstore_requests_failed_total 0.0",
                 "chunkstore_completion_tokens_total 8.0", "chunkstore_requests_active 0.0",
                 'chunkstore_ttft_seconds_bucket{le="+Inf"} 2.0', "chunkstore_ttft_seconds_count 2.0",
                 'chunkstore_request_latency_seconds_bucket{le="+Inf"} 2.0',
                 "chunkstore_request_latency_seconds_count 2.0", 'chunkstore_transfer_seconds_bucket{le="+Inf",path='):
        assert line in metrics, line
    assert "chunkstore_transfer_seconds_total" not in metrics  # the histogram's _sum is that figure


def test_no_serving_figures_offline(store_server):
    with store_server.client() as c:
        assert c.get("/stats").json()["serving"] is None
        samples = wait_for(lambda: c.get("/stats/history").json()["samples"], what="a sample")
        assert samples[-1]["requests_total"] is None and samples[-1]["ttft_sum_s"] is None
        assert "chunkstore_ttft_seconds" not in c.get("/metrics").text


def test_no_serving_figures_for_a_namespace_token(cache_server):
    from tests.helpers.api import TENANT

    with cache_server.client(TENANT) as c:
        assert c.get("/stats").json()["serving"] is None


def test_history_from_before_migration_0003_reads_as_null(tmp_path):
    """Samples written by an index whose stats history the disk tier's revision 0002 made (before
    the serving figures and the server key) are adopted by the API's own migration: they read
    with null serving figures, under the key ''."""
    from sqlalchemy import create_engine, text

    from chunkstore import ChunkStore
    from chunkstore.api.history import HistoryTable
    from chunkstore.api.history_schema import STATS_HISTORY_FIGURES  # the figures 0002 made
    from tests.helpers import TINY

    root = tmp_path / "store"
    with ChunkStore(root, TINY):
        pass
    engine = create_engine(f"sqlite:///{root / 'index.db'}")
    with engine.begin() as conn:  # the table as revision 0002 made it
        figures = ", ".join(f"{name} INTEGER" for name in STATS_HISTORY_FIGURES)
        conn.execute(text(f"CREATE TABLE stats_history (id INTEGER NOT NULL PRIMARY KEY, sampled_at FLOAT NOT NULL, "
                          f"uptime_s FLOAT NOT NULL, {figures})"))
        conn.execute(text("CREATE INDEX ix_stats_history_sampled_at ON stats_history (sampled_at)"))
        conn.execute(text("INSERT INTO stats_history (sampled_at, uptime_s, lookups) VALUES (1.0, 2.0, 3)"))
    engine.dispose()
    with ChunkStore(root, TINY) as store:
        table = HistoryTable(10)
        assert table.read(store) == []  # not the API's yet
        table.prepare(store)
        rows = table.read(store, every_server=True)
        table.close()
    assert len(rows) == 1 and rows[0]["lookups"] == 3 and rows[0]["server"] == ""
    assert rows[0]["requests_total"] is None and rows[0]["ttft_sum_s"] is None

