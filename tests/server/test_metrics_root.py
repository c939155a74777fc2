"""`GET /metrics` at the root of `chunkstore serve` (where Prometheus looks on SGLang and vLLM servers):
the management API's registry, the same names and values as `/api/v1/metrics`, under the same auth
rule (with API keys, cache-wide figures need the admin token: 401 without one, 403 for a tenant's key).
Real uvicorn on loopback, the tiny model."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from chunkstore.engine import Engine
from chunkstore.server.settings import ServerSettings
from tests.helpers.server import STORY, Served, cache_config

ALICE, ADMIN = "alice-key-0123", "admin-token-metrics-4567"
# Figures that move between two scrapes by themselves: the clock, and the scrapes' own latencies.
_MOVING = ("chunkstore_uptime_seconds", "chunkstore_admin_request_duration_seconds")


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """(sample name, labels) -> value of a Prometheus text exposition, the moving figures left out."""
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith(_MOVING):
            continue
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_root_metrics_are_the_management_apis(served):
    reply = served.client.post("/v1/completions", json={"prompt": "metrics: " + STORY, "max_tokens": 4})
    assert reply.status_code == 200, reply.text
    served.client.post("/v1/completions", json={"prompt": "metrics: " + STORY, "max_tokens": 4})  # a hit
    served.engine.flush()  # the write-through's background copies done: the figures hold still
    root, api = served.client.get("/metrics"), served.client.get("/api/v1/metrics")
    assert root.status_code == api.status_code == 200
    assert root.headers["content-type"] == api.headers["content-type"]
    assert root.headers["content-type"].startswith("text/plain")
    at_root, at_api = samples(root.text), samples(api.text)
    assert at_root == at_api
    assert at_root[("chunkstore_requests_total", ())] >= 2 and at_root[("chunkstore_lookups_total", ())] >= 2
    assert at_root[("chunkstore_hit_tokens_total", (("tier", "device"),))] > 0
    again = served.client.get("/metrics").text  # both scrapes above are in the one registry's latencies
    scrapes = [s.value for f in text_string_to_metric_families(again) for s in f.samples
               if s.name == "chunkstore_admin_request_duration_seconds_count" and s.labels["route"] == "/metrics"]
    assert scrapes and scrapes[0] >= 2


def test_only_the_exact_path_is_aliased(served):
    assert served.client.get("/metricsx").status_code == 404
    assert served.client.get("/metrics/x").status_code == 404
    assert served.client.post("/metrics").status_code == served.client.post("/api/v1/metrics").status_code == 405
    assert served.client.head("/metrics").status_code == served.client.head("/api/v1/metrics").status_code


@pytest.fixture(scope="module")
def keyed(tiny, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CHUNKSTORE_ADMIN_TOKEN", ADMIN)
        settings = ServerSettings(api_key=(f"alice={ALICE}",))
        with Served(Engine(tiny, cache_config(tmp_path_factory.mktemp("keyed-metrics"))), settings) as s:
            yield s


@pytest.mark.parametrize("headers, status", [
    ({}, 401),  # tenants exist: reads need a token
    ({"Authorization": "Bearer wrong-token"}, 401),
    ({"Authorization": f"Bearer {ALICE}"}, 403),  # a tenant's key: cache-wide figures include other tenants
    ({"Authorization": f"Bearer {ADMIN}"}, 200),
])
def test_root_metrics_follow_the_admin_rule_with_api_keys(keyed, headers, status):
    root, api = keyed.client.get("/metrics", headers=headers), keyed.client.get("/api/v1/metrics", headers=headers)
    assert root.status_code == api.status_code == status, (root.text, api.text)
    if status == 200:
        assert samples(root.text) == samples(api.text) and "chunkstore_lookups_total" in root.text
    else:
        assert root.json() == api.json() and "chunkstore_" not in root.text
