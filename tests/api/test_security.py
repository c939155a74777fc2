"""Security of the management API through a real server: tokens (401), namespace tokens (403),
the Host check (400), the body limit (413), reads beyond loopback, the generated token file, no
cookies, and the audit log of destructive calls."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from chunkstore.api import AdminSettings, StoreBackend, create_app
from chunkstore.api.security import TokenRing, allowed_host_names, is_loopback, load_or_create_token
from tests.helpers.api import ADMIN, TENANT, client, fill_store, live_server, settings

WRITES = [  # (method, path, json body)
    ("POST", "/evict", {"bytes_to_free": 1}),
    ("POST", "/flush", None),
    ("POST", "/clear", {"tier": "disk", "confirm": True}),
    ("POST", "/jobs/verify", None),
    ("POST", "/jobs/rebuild", None),
    ("POST", "/jobs/gc", None),
    ("PUT", "/namespaces/default/quota", {"quota_bytes": 1}),
    ("PATCH", "/config", {"disk_size": 1.0}),
]
READS = ["/stats", "/stats/history", "/chunks", "/namespaces", "/config", "/jobs", "/metrics", "/events?max_events=1"]


@pytest.mark.parametrize("method,path,body", WRITES)
def test_writes_need_a_token(store_server, method, path, body):
    with store_server.client(token=None) as c:
        r = c.request(method, path, json=body)
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == "Bearer"
    assert ADMIN not in r.text
    with store_server.client(token="wrong") as c:
        assert c.request(method, path, json=body).status_code == 401
    with store_server.client(token=None, Authorization=f"Basic {ADMIN}") as c:
        assert c.request(method, path, json=body).status_code == 401


def test_pin_needs_a_token(store_server):
    key = store_server.pages[0].key.hex()
    with store_server.client(token=None) as c:
        assert c.post(f"/chunks/{key}/pin").status_code == 401
        assert c.post(f"/chunks/{key}/unpin").status_code == 401


def test_reads_on_loopback_without_tenants_need_no_token_but_reject_a_bad_one(tmp_path):
    root = tmp_path / "store"
    fill_store(root)
    backend = StoreBackend(root)
    try:
        with live_server(create_app(backend, settings(namespace_tokens=()))) as url:
            with client(url, token=None) as c:
                for path in READS:
                    assert c.get(path).status_code == 200, path
                assert c.get("/config").json()["admin"]["reads_need_token"] is False
            with client(url, token="wrong") as c:
                assert c.get("/stats").status_code == 401
    finally:
        backend.close()


def test_reads_on_loopback_with_tenants_need_a_token(store_server):
    with store_server.client(token=None) as c:
        for path in READS:
            r = c.get(path)
            assert r.status_code == 401, path
            assert "namespace tokens" in r.json()["error"]["message"]
    with store_server.client() as c:
        assert c.get("/config").json()["admin"]["reads_need_token"] is True


def test_reads_need_a_token_beyond_loopback(tmp_path):
    root = tmp_path / "store"
    fill_store(root)
    backend = StoreBackend(root)
    try:
        app = create_app(backend, settings(host="0.0.0.0", allowed_hosts=("127.0.0.1",)))
        with live_server(app) as url:
            with client(url, token=None) as c:
                for path in READS:
                    r = c.get(path)
                    assert r.status_code == 401, path
                    assert "beyond loopback" in r.json()["error"]["message"]
                assert c.get("/healthz").status_code == 200  # probes say nothing about tenants
            with client(url) as c:
                assert c.get("/stats").status_code == 200
                assert c.get("/config").json()["admin"]["reads_need_token"] is True
    finally:
        backend.close()


@pytest.mark.parametrize("method,path,body", WRITES)
def test_namespace_tokens_cannot_administer(store_server, method, path, body):
    if path == "/evict":
        body = {"bytes_to_free": 1, "tier": "device"}  # memory tiers are shared
    with store_server.client(token=TENANT) as c:
        r = c.request(method, path, json=body)
    assert r.status_code == 403, r.text


def test_namespace_tokens_see_only_their_namespace(store_server):
    mine, theirs = store_server.other[0].key.hex(), store_server.pages[0].key.hex()
    with store_server.client(token=TENANT) as c:
        stats = c.get("/stats").json()
        assert stats["namespace"] == "other" and stats["disk"]["num_chunks"] == 2 and stats["hits"] is None
        assert [n["namespace"] for n in c.get("/namespaces").json()["items"]] == ["other"]
        listing = c.get("/chunks").json()
        assert listing["total"] == 2 and {i["namespace"] for i in listing["items"]} == {"other"}
        assert c.get("/chunks", params={"namespace": "default"}).status_code == 403
        assert c.get(f"/chunks/{mine}").status_code == 200
        assert c.get(f"/chunks/{theirs}").status_code == 403
        assert c.post(f"/chunks/{theirs}/pin").status_code == 403
        assert c.post(f"/chunks/{mine}/pin").json()["pinned"] is True
        for path in ("/stats/history", "/metrics", "/config", "/jobs", "/events?max_events=1"):
            assert c.get(path).status_code == 403, path
        assert c.post("/evict", json={"namespace": "default"}).status_code == 403
        assert c.post("/evict", json={"key": theirs}).status_code == 403
        r = c.post("/evict", json={"bytes_to_free": 10**9}).json()  # confined to its namespace
        assert r["num_chunks"] == 1  # its other chunk is pinned, so only the leaf... and the pinned root stays
    with store_server.client() as c:
        assert c.get("/stats").json()["disk"]["num_chunks"] == 9


def test_foreign_host_header_is_refused(store_server):
    for host in ("evil.example", "evil.example:80", "127.0.0.1.evil.example", ""):
        with store_server.client(Host=host) as c:
            r = c.get("/stats")
            assert r.status_code == 400, host
            assert r.json()["error"]["code"] == "bad_host"
            assert c.post("/evict", json={"bytes_to_free": 1}).status_code == 400
    for host in ("localhost:1234", "127.0.0.1", "[::1]:80"):
        with store_server.client(Host=host) as c:
            assert c.get("/healthz").status_code == 200, host


def test_allowed_host_names():
    assert allowed_host_names(AdminSettings(token="x")) == {"localhost", "127.0.0.1", "::1"}
    names = allowed_host_names(AdminSettings(token="x", host="10.1.2.3", allowed_hosts=("Cache.Example",)))
    assert {"10.1.2.3", "cache.example"} <= names
    assert "0.0.0.0" not in allowed_host_names(AdminSettings(token="x", host="0.0.0.0"))
    assert is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1") and not is_loopback("example.org")


def test_oversized_bodies_get_413(store_server):
    big = "x" * (70 * 1024)
    with store_server.client() as c:
        r = c.post("/evict", content=f'{{"namespace": "{big}"}}', headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"

        def chunks():  # no Content-Length: the limit is enforced while reading
            for _ in range(80):
                yield b" " * 1024
            yield b"{}"
        r = c.post("/evict", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        assert c.get("/stats").status_code == 200


def test_no_cookies_and_no_caching(store_server):
    with store_server.client() as c:
        r = c.get("/stats", headers={"Cookie": f"token={ADMIN}"})
        assert "set-cookie" not in r.headers and r.headers["cache-control"] == "no-store"
    with store_server.client(token=None, Cookie=f"Authorization=Bearer {ADMIN}") as c:
        assert c.post("/flush").status_code == 401  # a cookie is never a credential


def test_token_ring_compares_every_token():
    ring = TokenRing("admin", [("a", "tok-a"), ("b", "tok-b")])
    assert ring.identify("admin").role.value == "admin"
    assert ring.identify("tok-b").namespace == "b"
    assert ring.identify("tok-") is None and ring.identify("") is None


def test_generated_token_file(tmp_path, capsys):
    root = tmp_path / "store"
    fill_store(root)
    path = root / "admin-token"
    backend = StoreBackend(root)
    try:
        app = create_app(backend, AdminSettings(history_interval_s=3600))
        assert app.state.admin.token.source.value == "generated"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        token = path.read_text().strip()
        assert len(token) >= 32
        again = create_app(backend, AdminSettings(history_interval_s=3600))
        assert again.state.admin.token.source.value == "file"
        with live_server(again) as url:
            with client(url, token=token) as c:
                assert c.post("/flush").status_code == 200
            with client(url, token=None) as c:
                r = c.post("/flush")
                assert r.status_code == 401 and str(path) in r.json()["error"]["message"]
                assert token not in r.text
    finally:
        backend.close()
    os.chmod(path, 0o644)
    assert load_or_create_token(path) == (token, False)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_settings_refuse_duplicate_tokens():
    with pytest.raises(ValueError, match="twice"):
        AdminSettings(token="same", namespace_tokens=("a=same",))
    with pytest.raises(ValueError, match="NAMESPACE=TOKEN"):
        AdminSettings(token="x", namespace_tokens=("nonamespace",))
    s = AdminSettings(token="x", namespace_tokens="a=1, b=2")  # as the environment gives it
    assert s.namespace_token_pairs == [("a", "1"), ("b", "2")]


def test_destructive_calls_are_logged(store_server, caplog):
    with caplog.at_level(logging.INFO, logger="chunkstore.api.audit"), store_server.client() as c:
        c.post("/evict", json={"bytes_to_free": 1500})
        c.post("/evict", json={"bytes_to_free": 1500, "dry_run": True})
        c.post("/clear", json={"tier": "disk", "confirm": True})
    records = [r for r in caplog.records if r.name == "chunkstore.api.audit"]
    assert len(records) == 2 and all(r.levelno == logging.WARNING for r in records)
    assert "/api/v1/evict" in records[0].getMessage() and '"bytes_to_free": 1500' in records[0].getMessage()
    assert '"tier": "disk"' in records[1].getMessage() and "by admin" in records[1].getMessage()
    assert ADMIN not in caplog.text


@pytest.mark.parametrize("content", [b'{"bytes_to_free": 1', b'{"namespace": "\xff"}', b"[" * 200 + b"]" * 200])
def test_tokens_are_checked_before_a_body_is_read(store_server, content):
    """A caller without a valid token learns nothing from the body it sent: 401 comes first."""
    json_type = {"Content-Type": "application/json"}
    for path in ("/evict", "/clear", "/jobs/gc", "/namespaces/default/quota", "/config"):
        method = {"/namespaces/default/quota": "PUT", "/config": "PATCH"}.get(path, "POST")
        with store_server.client(token=None) as c:
            r = c.request(method, path, content=content, headers=json_type)
            assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key", (path, r.text)
            assert r.headers["www-authenticate"] == "Bearer" and r.headers["cache-control"] == "no-store"
        with store_server.client(token="wrong") as c:
            r = c.request(method, path, content=content, headers=json_type)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
        with store_server.client() as c:
            r = c.request(method, path, content=content, headers=json_type)
            assert r.status_code == 400, (path, r.text)
            assert r.json()["error"]["code"] in ("invalid_json", "invalid_encoding", "too_deep")


def test_a_namespace_token_gets_403_for_what_it_may_not_do_once_its_body_is_read(store_server):
    with store_server.client(token=TENANT) as c:
        assert c.patch("/config", json={"disk_size": 1.0}).status_code == 403
        r = c.patch("/config", content=b"{", headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_405_names_every_method_of_the_path(store_server):
    with store_server.client() as c:
        for method, path, allow in (("OPTIONS", "/config", "GET, PATCH"), ("PUT", "/config", "GET, PATCH"),
                                    ("GET", "/jobs/gc", "POST"), ("GET", "/evict", "POST"),
                                    ("DELETE", "/namespaces/default/quota", "PUT"),
                                    ("POST", "/namespaces/default", "DELETE")):
            r = c.request(method, path, json={"bytes_to_free": 1})
            assert r.status_code == 405 and r.headers["allow"] == allow, (method, path, r.headers, r.text)
            assert r.json()["error"]["code"] == "method_not_allowed"
