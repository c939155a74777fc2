"""The management API mounted in `chunkstore serve`'s app: the app that owns a path checks its Host
header and its body size, once, by its own rules, and answers in its own error envelope. A real engine
on uvicorn (loopback), with the admin API's settings from the environment as `chunkstore serve` reads them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chunkstore.engine import Engine
from chunkstore.server.settings import ServerSettings
from tests.helpers.server import Served, cache_config

ADMIN_TOKEN = "admin-token-for-tests"
SERVER_LIMIT_BYTES = 4096  # below the admin API's 64 KiB, so the two limits can be told apart
ADMIN_LIMIT_BYTES = 64 * 1024


@pytest.fixture
def mounted(tiny, tmp_path, monkeypatch) -> Iterator[Served]:
    monkeypatch.setenv("CHUNKSTORE_ADMIN_ALLOWED_HOSTS", "cache.example, Other.Example")
    monkeypatch.setenv("CHUNKSTORE_ADMIN_TOKEN", ADMIN_TOKEN)
    settings = ServerSettings(host="127.0.0.1", max_body_bytes=SERVER_LIMIT_BYTES)
    with Served(Engine(tiny, cache_config(tmp_path)), settings) as served:
        yield served


def test_admin_allowed_hosts_admit_a_name_for_the_api(mounted):
    """Before: the server's loopback Host check ran first and refused every name the admin API allows."""
    for host in ("cache.example", "cache.example:8000", "OTHER.example"):
        r = mounted.client.get("/api/v1/healthz", headers={"Host": host})
        assert r.status_code == 200, (host, r.text)
        assert mounted.client.get("/metrics", headers={"Host": host}).status_code == 200, host  # the API's alias
    # the server's own routes keep the server's rule: loopback names only
    r = mounted.client.get("/v1/models", headers={"Host": "cache.example"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host"
    assert r.json()["error"]["type"] == "invalid_request_error"  # OpenAI's envelope
    # a name nobody allows: refused by the API in the API's envelope (one check: not the server's)
    r = mounted.client.get("/api/v1/healthz", headers={"Host": "evil.example"})
    assert r.status_code == 400 and r.json()["error"] == {
        "code": "bad_host", "message": r.json()["error"]["message"], "param": "Host"}
    for host in ("localhost:1", "app.localhost", "127.0.0.2", "[::1]:80"):  # one loopback rule for both apps
        assert mounted.client.get("/api/v1/healthz", headers={"Host": host}).status_code == 200, host
        assert mounted.client.get("/health", headers={"Host": host}).status_code == 200, host


def test_each_route_gets_the_body_limit_of_its_app(mounted):
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
    # over the server's limit, under the API's: the API's route takes it (before: the server's 413)
    body = '{"bytes_to_free": 1, "tier": "device", "padding": "%s"}' % ("x" * 2 * SERVER_LIMIT_BYTES)
    r = mounted.client.post("/api/v1/evict", content=body, headers=auth)
    assert r.status_code == 422 and "type" not in r.json()["error"], r.text  # validated by the API, not cut off
    # over the API's limit: the API's 413, in its envelope
    big = '{"namespace": "%s"}' % ("x" * (ADMIN_LIMIT_BYTES + 1))
    r = mounted.client.post("/api/v1/evict", content=big, headers=auth)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large" and "type" not in r.json()["error"]
    assert f"{ADMIN_LIMIT_BYTES} bytes" in r.json()["error"]["message"]
    # the server's routes keep the server's limit, in OpenAI's envelope
    r = mounted.client.post("/v1/completions", json={"prompt": "x" * 2 * SERVER_LIMIT_BYTES, "max_tokens": 1})
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"
    assert f"{SERVER_LIMIT_BYTES} bytes (the server's --max-body-bytes)" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: the API's limit while reading, not the server's
        for _ in range(2 * SERVER_LIMIT_BYTES // 1024):
            yield b" " * 1024
        yield body.encode()
    r = mounted.client.post("/api/v1/evict", content=chunks(), headers=auth)
    assert r.status_code == 422 and "type" not in r.json()["error"], r.text  # read whole, then validated


def test_server_alone_has_no_api_and_no_metrics(tiny, tmp_path):
    """chunkstore.server builds its app without the management API unless the composition root mounts it."""
    from chunkstore.server.app import create_app

    engine = Engine(tiny, cache_config(tmp_path))
    try:
        from fastapi.testclient import TestClient

        with TestClient(create_app(engine, ServerSettings()), base_url="http://127.0.0.1") as client:
            assert client.get("/health").status_code == 200
            for path in ("/api/v1/healthz", "/metrics", "/"):
                assert client.get(path).status_code == 404, path
            assert client.get("/health", headers={"Host": "evil.example"}).status_code == 400
    finally:
        engine.close()
