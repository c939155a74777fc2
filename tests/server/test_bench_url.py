"""`chunkstore bench multiturn --url` against a real `chunkstore serve` app on loopback (the tiny
model): the chat history it builds is one the server's cache hits, so the measured hit rate is the
workload's ideal (nothing is evicted at this size), and the per-tier split is the server's own.
Timing is never asserted."""

from __future__ import annotations

import argparse
import json

import pytest

from chunkstore.bench import multiturn as bench
from tests.server.conftest import PAGE_SIZE


def test_url_mode_against_chunkstore_serve(served, tmp_path):
    out = tmp_path / "url.json"
    argv = ["--url", served.url, "--configs", "no-cache,server", "--num-clients", "3", "--num-rounds", "3",
            "--request-length", "40", "--output-length", "3", "--page-size", str(PAGE_SIZE),
            "--request-rate", "inf", "--no-progress", "--json", str(out)]
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert bench.run(parser.parse_args(argv)) == 0
    runs = {r["name"]: r for r in json.loads(out.read_text())["runs"]}
    assert runs["no-cache"]["hit_rate"] == 0.0  # a fresh namespace per request
    server = runs["server"]
    assert server["completion_tokens"] == 3 * 3 * 3 and server["num_requests"] == 9
    assert 0 < server["hit_rate"] == pytest.approx(server["ideal_hit_rate"])
    assert server["hit_rate_by_tier"]["device"] == pytest.approx(server["hit_rate"])
    assert 0 < server["ttft_avg_s"] <= server["latency_avg_s"]
