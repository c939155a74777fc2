"""API keys over HTTP: 401 without a valid key, /health open, namespaces fixed per key (tenants isolated),
the management API closed to callers without a token once keys exist (a tenant's key reads its own
namespace there), /flush_cache POST only and confined to the caller's namespace, and no admin token
equal to a tenant's key."""

from __future__ import annotations

import subprocess
import sys

import pytest

from chunkstore.engine import Engine
from chunkstore.server.auth import KeyRing
from chunkstore.server.settings import ServerSettings, Tenant
from tests.helpers.api import assert_every_route_needs_a_token
from tests.helpers.server import PAGE_SIZE, REPO, STORY, Served, cache_config

ALICE, BOB, PLAIN = "alice-key-0123", "bob-key-4567", "unnamed-key-89ab"


@pytest.fixture(scope="module")
def keyed(tiny, tmp_path_factory):
    settings = ServerSettings(api_key=(f"alice={ALICE}", f"bob={BOB}", PLAIN))
    with Served(Engine(tiny, cache_config(tmp_path_factory.mktemp("keyed"))), settings) as s:
        yield s


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("method,path,body", [
    ("GET", "/v1/models", None),
    ("POST", "/v1/completions", {"prompt": "x"}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ("POST", "/generate", {"text": "x"}),
    ("POST", "/flush_cache", None),
    ("GET", "/get_model_info", None),
])
def test_every_route_but_health_needs_the_key(keyed, method, path, body):
    for headers in ({}, bearer("wrong-key"), {"Authorization": f"Basic {ALICE}"}, bearer(ALICE + "x")):
        reply = keyed.client.request(method, path, json=body, headers=headers)
        assert reply.status_code == 401, (path, headers)
        error = reply.json()["error"]
        assert error["type"] == "authentication_error" and error["code"] in ("missing_api_key", "invalid_api_key")
        assert reply.headers["www-authenticate"] == "Bearer"
    small = {"max_tokens": 1} if path.startswith("/v1/c") else {}
    ok = keyed.client.request(method, path, json={**body, **small} if body else None, headers=bearer(ALICE))
    assert ok.status_code == 200, ok.text


def test_health_needs_no_key(keyed):
    assert keyed.client.get("/health").status_code == 200


def test_tenants_are_isolated_whatever_they_ask_for(keyed):
    body = {"prompt": "tenants: " + STORY, "max_tokens": 4, "temperature": 0}

    def cached(key: str, **extra) -> int:
        reply = keyed.client.post("/v1/completions", json={**body, **extra.pop("json", {})}, headers={
            **bearer(key), **extra.pop("headers", {})})
        assert reply.status_code == 200, reply.text
        return reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached(ALICE) == 0
    assert cached(ALICE, json={"user": "someone"}) > 0  # the key fixes the namespace; user is ignored
    # Bob asks for Alice's namespace both ways and still misses: the server decides.
    assert cached(BOB, json={"user": "alice"}, headers={"X-Chunkstore-Namespace": "alice"}) == 0
    assert cached(BOB) > 0
    assert cached(PLAIN, headers={"X-Chunkstore-Namespace": "alice"}) == 0
    generate = keyed.client.post("/generate", json={"text": body["prompt"], "sampling_params": {"max_new_tokens": 1}},
                                 headers={**bearer(ALICE), "X-Chunkstore-Namespace": "bob"})
    assert generate.json()["meta_info"]["cached_tokens"] > 0  # Alice's namespace, not Bob's


def test_key_ring_compares_digests():
    tenants = (Tenant.parse(f"alice={ALICE}"), Tenant.parse(PLAIN))
    ring = KeyRing(tenants)
    assert ring.identify(ALICE) is tenants[0] and ring.identify(PLAIN) is tenants[1]
    assert ring.identify("alice") is None and ring.identify("") is None
    assert ALICE not in repr(tenants[0]) and tenants[0].namespace == "alice"
    assert tenants[1].namespace.startswith("key-") and PLAIN not in tenants[1].namespace
    assert not KeyRing(()).is_enabled and KeyRing(()).authenticate(None).tenant is None


def test_with_keys_the_management_api_needs_a_token_on_every_route(keyed):
    cached = keyed.client.post("/v1/completions", json={"prompt": "admin api: " + STORY, "max_tokens": 1},
                               headers=bearer(ALICE))
    assert cached.status_code == 200
    assert_every_route_needs_a_token(keyed.url, "ab" * 32, hidden=("alice", "bob", STORY[:20]))


def test_a_tenant_key_reads_its_own_namespace_in_the_management_api(keyed):
    prompt = "tenant reads: " + STORY
    assert keyed.client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1},
                             headers=bearer(ALICE)).status_code == 200
    keyed.engine.flush()  # on disk, so GET /chunks (the disk tier's) lists it
    api = {**bearer(ALICE)}
    listing = keyed.client.get("/api/v1/chunks", headers=api).json()
    assert listing["total"] > 0 and {c["namespace"] for c in listing["items"]} == {"alice"}
    assert [n["namespace"] for n in keyed.client.get("/api/v1/namespaces", headers=api).json()["items"]] == ["alice"]
    assert keyed.client.get("/api/v1/chunks", params={"namespace": "bob"}, headers=api).status_code == 403
    first = min(listing["items"], key=lambda c: c["created_at"])
    detail = keyed.client.get(f"/api/v1/chunks/{first['key']}", headers=api).json()
    assert detail["token_ids"] and detail["text"] and detail["is_content_hidden"] is False
    assert keyed.client.get(f"/api/v1/chunks/{first['key']}", headers=bearer(BOB)).status_code == 403
    assert keyed.client.post("/api/v1/clear", json={"tier": "disk", "confirm": True}, headers=api).status_code == 403


def test_flush_cache_takes_post_only(keyed):
    reply = keyed.client.get("/flush_cache", headers=bearer(ALICE))
    assert reply.status_code == 405 and reply.json()["error"]["code"] == "method_not_allowed"


def test_a_tenants_flush_empties_only_its_own_memory(keyed):
    def tiers(key: str, prompt: str) -> dict[str, int]:
        reply = keyed.client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1, "temperature": 0},
                                  headers=bearer(key))
        assert reply.status_code == 200, reply.text
        return reply.json()["usage"]["cached_tokens_details"]

    alice, bob = "flush, alice: " + STORY, "flush, bob: " + STORY
    tiers(ALICE, alice), tiers(BOB, bob)
    flushed = keyed.client.post("/flush_cache", headers=bearer(BOB))
    assert flushed.status_code == 200, flushed.text
    assert tiers(ALICE, alice)["disk"] == 0  # Alice's pages stayed in memory
    from_bob = tiers(BOB, bob)
    assert from_bob["disk"] >= PAGE_SIZE and from_bob["device"] == from_bob["host"] == 0  # Bob's went to disk


@pytest.mark.slow
def test_serve_refuses_an_admin_token_equal_to_a_tenant_key(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "CHUNKSTORE_API_KEY": f"alice={ALICE}",
           "CHUNKSTORE_ADMIN_TOKEN": ALICE}
    done = subprocess.run([sys.executable, "-m", "chunkstore.cli", "serve", "--port", "0", "--disk-path",
                           str(tmp_path / "data")], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "admin token is also the token (or API key) of namespace 'alice'" in done.stderr
    assert ALICE not in done.stderr + done.stdout and "Traceback" not in done.stderr
